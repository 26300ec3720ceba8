// test_pipeline.cpp: chapter 08 end to end, through the real trainer binary: every schedule on 2 and
// 4 stages, with as many micro-batches as stages and twice as many, on pipelines with data
// parallelism over each stage (03's all-reduce, ZeRO-1, ZeRO-2's rule), with messages matched by
// tag (MPI) and by call order (the lists NCCL runs, the V's included), under chapter 00's collectives
// (--collectives ring and ours) as under the library's, trains to the same losses,
// gradient norms and final parameters as one rank of 01 with the same global batch; the tied wte's
// two copies stay equal, bit for bit; activations, point-to-point, embedding-group and data-parallel
// bytes equal their formulas on every stage; checkpoints stay layout-free. The schedules themselves,
// without the model: test_pipeline_schedule.cpp; the stages against the whole model: test_model.cpp;
// bad input and a stage that dies: test_run_guards.cpp.
//
// The `tall` preset (8 blocks of the tiny width) is there for these tests: tiny's 2 blocks cannot
// make 4 stages, let alone 4 stages of 2 chunks.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "training_harness.h"

namespace {

// Ten steps, as 09's equivalence runs on the same preset: the warm-up and the decay both run, and the
// loss falls by more than the 0.5 the check asks.
constexpr int kSteps = 10;
constexpr double kTolerance = 1e-5;  // fp32, relative
const std::string kPreset = "tall";

struct PipelineCase {
  int ranks;
  std::string flags;
  std::string name;
};

// What a failing case prints of its parameter.
void PrintTo(const PipelineCase& c, std::ostream* out) { *out << c.ranks << " ranks, " << c.flags; }

class PipelineEquivalence : public testing::TestWithParam<PipelineCase> {};

// The pitfalls this catches, each silent: a loss scaled by 1/m more than once (or per stage); a
// micro-batch that reads another's tokens in its backward (1f1b, interleaved and zb-h1 hold several
// in flight); wte's two gradients not summed before the data-parallel reduction, or a stage's
// reduction started before its last weight pass (zb-h1 with DP); messages matched to the wrong
// micro-batch or chunk; a gradient norm that counts the tied wte twice.
TEST_P(PipelineEquivalence, SameTrainingAsOneRankOf01) {
  const PipelineCase c = GetParam();
  const std::string jsonl =
      expect_trains_like_one_rank_of_01("08_pipeline", c.ranks, c.flags, kPreset, "", kSteps, kTolerance);
  const std::string pipeline = read_record(jsonl, "pipeline");
  ASSERT_FALSE(pipeline.empty()) << "no pipeline record";
  EXPECT_NE(pipeline.find("\"wte_copies_equal\":true"), std::string::npos)
      << "the tied wte's copies on the first and last stage differ after " << kSteps << " steps: " << pipeline;
  // dualpipev runs its F&B pairs at once unless told otherwise, or matched by call order (a pair's
  // receives would go out with the sends before it): then every stage reports them.
  const std::vector<std::string> pairs = read_records(jsonl, "pipeline_pairs");
  const bool overlapped = c.flags.find("dualpipev") != std::string::npos &&
                          c.flags.find("--fb-overlap off") == std::string::npos &&
                          c.flags.find("call-order") == std::string::npos;
  EXPECT_EQ(!pairs.empty(), overlapped) << c.flags;
  for (const std::string& stage : pairs) EXPECT_GT(number_field(stage, "pairs"), 0) << stage;
}

std::vector<PipelineCase> pipeline_cases() {
  std::vector<PipelineCase> cases;
  for (const char* schedule : {"afab", "1f1b", "interleaved", "zb-h1"})
    for (int p : {2, 4})
      for (int m : {p, 2 * p}) {
        std::string name = schedule;
        if (name == "zb-h1") name = "zbh1";
        cases.push_back({p, std::string("--schedule ") + schedule + " --micro-batches " + std::to_string(m),
                         name + "_p" + std::to_string(p) + "_m" + std::to_string(m)});
      }
  // The lists NCCL runs (matched by call order: the round-robin schedules' receives right before
  // their passes, a V's in the global order of its timeline, the turn at rank p-1 a copy), here over
  // MPI with one tag, so that a message paired with the wrong receive trains wrong: the same training.
  for (const char* schedule : {"afab", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"})
    for (int p : {2, 4}) {
      std::string name = schedule;
      if (name == "zb-h1") name = "zbh1";
      if (name == "zb-v") name = "zbv";
      cases.push_back({p, std::string("--p2p-matching call-order --schedule ") + schedule,
                       name + "_p" + std::to_string(p) + "_call_order"});
    }
  cases.push_back({4, "--pp 2 --schedule zb-h1 --p2p-matching call-order", "dp2_pp2_zbh1_call_order"});
  // zb-v with fewer micro-batches than its order is written for (2p-1): passes left out; dualpipev
  // with 4p: a steady state of several F&B pairs.
  cases.push_back({4, "--schedule zb-v --micro-batches 4 --p2p-matching call-order", "zbv_p4_m4_call_order"});
  cases.push_back(
      {2, "--schedule dualpipev --micro-batches 8 --p2p-matching call-order", "dualpipev_p2_m8_call_order"});
  // One stage of two chunks: the embedding's chunk and the head's share the rank's one wte.
  cases.push_back({1, "--schedule interleaved", "interleaved_p1"});
  cases.push_back({2, "--pp 1 --schedule interleaved --micro-batches 2", "dp2_interleaved_p1"});
  // Four chunks a rank, one block each.
  cases.push_back({2, "--schedule interleaved --virtual-stages 4 --micro-batches 4", "interleaved_p2_v4"});
  // A partition of the user's, uneven.
  cases.push_back({2, "--partition 3,5", "partition_3_5"});
  // Data parallelism over each stage: 03's all-reduce, ZeRO-1, ZeRO-2's rule; zb-h1's weight passes.
  cases.push_back({4, "--pp 2", "dp2_pp2"});
  cases.push_back({4, "--pp 2 --schedule zb-h1", "dp2_pp2_zbh1"});
  cases.push_back({4, "--pp 2 --schedule interleaved --bucket-mb 0.01", "dp2_pp2_interleaved"});
  cases.push_back({4, "--pp 2 --zero1 --bucket-mb 0.01", "dp2_pp2_zero1"});
  cases.push_back({4, "--pp 2 --zero2 --schedule afab", "dp2_pp2_zero2"});
  // zb-v: two chunks a rank in a V, the embedding and the loss both on rank 0 (one wte), the turn at
  // rank p-1 a copy; m = 2p-1 and more (what its order is written for), fewer, and with DP 2 and
  // ZeRO-1; one stage, both arms on one rank.
  cases.push_back({2, "--schedule zb-v --micro-batches 4", "zbv_p2_m4"});
  cases.push_back({4, "--schedule zb-v --micro-batches 8", "zbv_p4_m8"});
  cases.push_back({4, "--schedule zb-v --micro-batches 4", "zbv_p4_m4"});
  cases.push_back({4, "--pp 2 --schedule zb-v --bucket-mb 0.01", "dp2_pp2_zbv"});
  cases.push_back({4, "--pp 2 --schedule zb-v --zero1", "dp2_pp2_zbv_zero1"});
  cases.push_back({1, "--schedule zb-v --micro-batches 2", "zbv_p1"});
  // dualpipev: the same V, its steady state pairing one chunk's forward with the other's backward.
  cases.push_back({2, "--schedule dualpipev --micro-batches 4", "dualpipev_p2_m4"});
  cases.push_back({4, "--schedule dualpipev --micro-batches 8", "dualpipev_p4_m8"});
  cases.push_back({4, "--pp 2 --schedule dualpipev --bucket-mb 0.01", "dp2_pp2_dualpipev"});
  cases.push_back({4, "--pp 2 --schedule dualpipev --zero1", "dp2_pp2_dualpipev_zero1"});
  cases.push_back({1, "--schedule dualpipev --micro-batches 2", "dualpipev_p1"});
  // Its pairs one pass after the other (the default runs them at once, on two threads).
  cases.push_back({4, "--schedule dualpipev --micro-batches 8 --fb-overlap off", "dualpipev_p4_m8_sequenced"});
  // Chapter 00's collectives, which run on a worker thread of each group's communicator while the
  // stage goes on exchanging activations: the embedding group's sum of wte's two gradients (PP 2),
  // and with it the data-parallel buckets (DP 2 x PP 2). Run at issue, a stage waited in one for a
  // peer that waited for its activations.
  for (const char* collectives : {"ring", "ours"}) {
    const std::string flag = std::string(" --collectives ") + collectives;
    cases.push_back({2, "--schedule 1f1b" + flag, std::string("1f1b_p2_") + collectives});
    cases.push_back({2, "--schedule interleaved" + flag, std::string("interleaved_p2_") + collectives});
    cases.push_back({4, "--pp 2 --bucket-mb 0.01" + flag, std::string("dp2_pp2_") + collectives});
    // The backward lane of dualpipev's pairs hands the data-parallel buckets to the group's worker.
    cases.push_back({4, "--pp 2 --schedule dualpipev --bucket-mb 0.01" + flag, std::string("dp2_pp2_dualpipev_") + collectives});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineEquivalence, testing::ValuesIn(pipeline_cases()),
                         [](const testing::TestParamInfo<PipelineCase>& info) { return info.param.name; });

// On every stage: the activations held and the message buffers equal the formula for the schedule's
// count of micro-batches in flight, and the point-to-point bytes theirs; the memory per category and the data-parallel bytes
// equal the theory record's formulas; the embedding group sums wte once a step.
TEST(PipelineTheory, ActivationsAndBytesOfEveryStageAreTheFormulas) {
  struct Run {
    int ranks;
    std::string flags;
  };
  const std::vector<Run> runs = {{4, "--schedule afab"},
                                 {4, "--schedule 1f1b"},
                                 {4, "--schedule interleaved"},
                                 {4, "--schedule zb-h1"},
                                 {4, "--schedule zb-v"},
                                 {4, "--schedule dualpipev"},
                                 {4, "--schedule dualpipev --p2p-matching call-order"},
                                 {2, "--schedule 1f1b --micro-batches 8"},
                                 {4, "--pp 2"},
                                 {4, "--pp 2 --zero1"},
                                 {4, "--pp 2 --zero2 --micro-batches 2"}};
  for (const Run& run : runs) {
    SCOPED_TRACE(std::to_string(run.ranks) + " ranks, " + run.flags);
    const std::string dir = temp_dir();
    RunResult r = run_trainer("08_pipeline", run.ranks,
                              "--preset " + kPreset + " --steps 3 --json " + dir + "/run.jsonl " + run.flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(": embedding + block"), std::string::npos) << r.output;
    expect_theory_matches(dir + "/run.jsonl", /*param_bytes=*/4);
    const std::vector<std::string> stages = read_records(dir + "/run.jsonl", "pipeline_stage");
    ASSERT_FALSE(stages.empty());
    for (const std::string& stage : stages) {
      EXPECT_EQ(number_field(stage, "measured_activations_bytes"), number_field(stage, "theory_activations_bytes"))
          << stage;
      EXPECT_GT(number_field(stage, "measured_p2p_bytes"), 0) << stage;
      EXPECT_EQ(number_field(stage, "measured_p2p_bytes"), number_field(stage, "theory_p2p_bytes")) << stage;
      EXPECT_EQ(number_field(stage, "measured_message_buffer_bytes"), number_field(stage, "theory_message_buffer_bytes"))
          << stage;
    }
    const std::string pipeline = read_record(dir + "/run.jsonl", "pipeline");
    if (run.flags.find("zb-v") == std::string::npos && run.flags.find("dualpipev") == std::string::npos) {
      // (a V's wte is rank 0's alone: no group to sum over)
      EXPECT_GT(number_field(pipeline, "measured_embedding_bytes"), 0) << pipeline;
    }
    EXPECT_EQ(number_field(pipeline, "measured_embedding_bytes"), number_field(pipeline, "theory_embedding_bytes"))
        << pipeline;
  }
}

// A stage's message buffers (the inputs and gradients it receives, the gradients it sends a copy of)
// are one per micro-batch in flight, the formula's count: with the micro-batch size fixed, four
// times the micro-batches hold the same buffers on every stage under 1f1b, where one buffer per
// micro-batch of the step held four times as many (the receives wait for a free buffer instead,
// under MPI's tags and NCCL's call order alike).
TEST(PipelineTheory, MessageBuffersAreTheMicroBatchesInFlightNotAllOfTheStep) {
  for (const std::string matching : {"tag", "call-order"}) {
    SCOPED_TRACE(matching);
    auto buffers = [&](int micro_batches) {
      const std::string dir = temp_dir();
      const std::string m = std::to_string(micro_batches);
      RunResult r = run_trainer("08_pipeline", 2,
                                "--preset " + kPreset + " --schedule 1f1b --steps 2 --batch " + m +
                                    " --micro-batches " + m + " --p2p-matching " + matching + " --json " + dir +
                                    "/run.jsonl");
      EXPECT_EQ(r.exit_code, 0) << r.output;
      // In messages: stage 0 sends one a micro-batch (its output), so its p2p bytes over m are one.
      std::vector<double> per_stage;
      double message = 0;
      for (const std::string& stage : read_records(dir + "/run.jsonl", "pipeline_stage")) {
        EXPECT_EQ(number_field(stage, "measured_message_buffer_bytes"),
                  number_field(stage, "theory_message_buffer_bytes"))
            << stage;
        if (per_stage.empty()) message = number_field(stage, "measured_p2p_bytes") / micro_batches;
        per_stage.push_back(number_field(stage, "measured_message_buffer_bytes") / message);
      }
      return per_stage;
    };
    // 1f1b on 2 stages: stage 0 holds 2 micro-batches, each with the gradient it receives; stage 1
    // one, with its input received and the input's gradient sent.
    const std::vector<double> two = {2, 2};
    EXPECT_EQ(buffers(2), two);
    EXPECT_EQ(buffers(8), two);
  }
}

// The same with messages of 64 KB (deep's stream, 2 sequences a micro-batch), beyond MPI's eager size
// (MPI then moves a message only once its receive is posted; the small ones above it may copy ahead):
// on 4 stages with 8 micro-batches, a receive that waits for a free buffer must never leave a send,
// and the rank behind it, waiting for ever. Under the two schedules whose lists interleave the most;
// every stage holds fewer buffers than micro-batches, so receives do wait.
TEST(PipelineTheory, ReceivesThatWaitForABufferNeverHoldUpTheStep) {
  for (const std::string schedule : {"interleaved", "zb-h1"}) {
    SCOPED_TRACE(schedule);
    const std::string dir = temp_dir();
    RunResult r = run_trainer("08_pipeline", 4,
                              "--preset deep --batch 16 --micro-batches 8 --steps 2 --p2p-matching tag --schedule " +
                                  schedule + " --json " + dir + "/run.jsonl",
                              120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const std::string& stage : read_records(dir + "/run.jsonl", "pipeline_stage")) {
      EXPECT_EQ(number_field(stage, "measured_message_buffer_bytes"), number_field(stage, "theory_message_buffer_bytes"))
          << stage;
      EXPECT_LT(number_field(stage, "theory_micro_batches_held"), 8 * (schedule == "interleaved" ? 2 : 1)) << stage;
    }
  }
}

// ZeRO-2's rule over a pipeline reduce-scatters every micro-batch's gradients: its data-parallel
// bytes grow with m, while ZeRO-1's do not (the reason pipeline frameworks refuse ZeRO-2).
TEST(PipelineTheory, ZeroTwoBytesGrowWithTheMicroBatchesAndZeroOnesDoNot) {
  auto dp_bytes = [](const std::string& flags) {
    const std::string dir = temp_dir();
    RunResult r = run_trainer("08_pipeline", 4,
                              "--preset " + kPreset + " --batch 16 --steps 2 --pp 2 --json " + dir + "/run.jsonl " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return number_field(read_record(dir + "/run.jsonl", "theory"), "measured_comm_bytes");
  };
  const double zero1_m2 = dp_bytes("--zero1 --micro-batches 2"), zero1_m8 = dp_bytes("--zero1 --micro-batches 8");
  const double zero2_m2 = dp_bytes("--zero2 --micro-batches 2"), zero2_m8 = dp_bytes("--zero2 --micro-batches 8");
  EXPECT_GT(zero1_m2, 0);
  EXPECT_EQ(zero1_m2, zero1_m8);
  EXPECT_GT(zero2_m2, zero1_m2);
  EXPECT_GT(zero2_m8, 2.5 * zero2_m2);
}

// A checkpoint holds full tensors: one saved by a DP 2 x PP 2 pipeline resumes in 01 on one rank and
// in 08 on four stages, continuing the same losses; and 01's resumes in a pipeline.
TEST(PipelineCheckpoint, SavedOnAnyGridResumesInAnyChapter) {
  expect_checkpoints_cross_grids({"08_pipeline", 4, "--pp 2"},
                                 {{"01_vanilla_dp", 1, ""},
                                  {"08_pipeline", 4, "--pp 4 --schedule interleaved"},
                                  {"07_tensor_parallel", 2, "--tp 2"}},
                                 {"08_pipeline", 2, "--schedule zb-h1"}, "--preset " + kPreset, kSteps, kTolerance);
}

// A V's stages hold other blocks than a round-robin's (rank 0 both ends and the one wte, rank p-1 the
// turn): its checkpoint is still the model's, whatever the placement, in and out.
TEST(PipelineCheckpoint, AVsCheckpointMovesToAndFromTheOtherSchedules) {
  expect_checkpoints_cross_grids({"08_pipeline", 4, "--schedule zb-v"},
                                 {{"01_vanilla_dp", 1, ""},
                                  {"08_pipeline", 2, "--schedule 1f1b"},
                                  {"08_pipeline", 2, "--schedule dualpipev"}},
                                 {"08_pipeline", 4, "--pp 2 --schedule zb-v"}, "--preset " + kPreset, kSteps, kTolerance);
}

}  // namespace
