// test_expert_parallel.cpp: chapter 11 end to end, through the real trainer binary. On EP 2, EP 4 and
// DP 2 x EP 2, with the capacity unlimited and with a capacity factor that drops assignments, it
// trains to the same losses and final parameters as one rank of 11 with the same global batch, and
// drops the same assignments of every expert at every step. The all-to-all bytes each rank counted
// equal the bytes its routing implies, and each group's gradient bytes their formula; the activations
// and the exchange's buffers measured equal their formulas at the step's routing counts. One rank of 11
// is one rank of 01 on the same MoE preset; checkpoints go between 11's grids and 01. Bad input is
// refused with a message, on every rank, before the work.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "training_harness.h"

namespace {

constexpr double kTolerance = 1e-5;  // fp32, relative
constexpr int kSteps = 3;

struct EpCase {
  int ranks, ep;
  std::string capacity;  // --capacity-factor
  std::string name;
  int grad_accum = 1;
};

void PrintTo(const EpCase& c, std::ostream* out) {
  *out << c.ranks << " ranks, --ep " << c.ep << ", --capacity-factor " << c.capacity << ", --grad-accum "
       << c.grad_accum;
}

struct TrainedRun {
  std::string jsonl, checkpoint;
};

// 11 on `ranks` ranks, kSteps steps of moe-tiny, saving the final weights.
TrainedRun run_11(int ranks, const std::string& flags) {
  const std::string dir = temp_dir();
  TrainedRun run{dir + "/run.jsonl", dir + "/final.bin"};
  const RunResult result = run_trainer("11_expert_parallel", ranks,
                                       "--preset moe-tiny --steps " + std::to_string(kSteps) + " " + flags +
                                           " --json " + run.jsonl + " --save " + run.checkpoint);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return run;
}

class ExpertParallelEquivalence : public testing::TestWithParam<EpCase> {};

// What expert parallelism can get wrong, each silently: rows sent to the wrong rank's expert, or
// regrouped in another order than the one they came in; a capacity claimed in each rank's own
// order (a different token dropped); an expert's gradient averaged over the world instead of the
// ranks that hold it (ep times too small), or not divided by ep (too large); a balance loss from
// this rank's counts alone; a gradient norm that counts each expert shard once per replica.
TEST_P(ExpertParallelEquivalence, SameTrainingAsOneRankAndTheSameTokensDropped) {
  const EpCase c = GetParam();
  const std::string flags = "--capacity-factor " + c.capacity + " --grad-accum " + std::to_string(c.grad_accum);
  const TrainedRun one = run_11(1, flags);
  const TrainedRun grid = run_11(c.ranks, flags + " --ep " + std::to_string(c.ep));
  const LossCurve reference = read_losses(one.jsonl), got = read_losses(grid.jsonl);
  ASSERT_EQ(int(got.losses.size()), kSteps);
  EXPECT_LE(max_relative_difference(got, reference), kTolerance);
  EXPECT_LE(relative_l2_difference(checkpoint_params(grid.checkpoint), checkpoint_params(one.checkpoint)), kTolerance);
  EXPECT_EQ(expert_counts(grid.jsonl, "routed"), expert_counts(one.jsonl, "routed"));
  const std::vector<double> dropped = expert_counts(grid.jsonl, "dropped");
  EXPECT_EQ(dropped, expert_counts(one.jsonl, "dropped"));
  double total_dropped = 0;
  for (double d : dropped) total_dropped += d;
  if (c.capacity != "0") EXPECT_GT(total_dropped, 0) << "the capacity factor should drop some assignments";
  else EXPECT_EQ(total_dropped, 0);

  // Bytes: what rank 0 counted equals what its routing implies (computed here from every rank's
  // counts, not from the exchange's); each group's gradient bytes their formula.
  const std::string run = read_record(grid.jsonl, "run");
  ASSERT_EQ(number_field(run, "ep"), c.ep) << run;
  ASSERT_EQ(number_field(run, "grad_accum"), c.grad_accum) << run;
  const int L = int(number_field(run, "L")), E = int(number_field(run, "experts")), C = int(number_field(run, "C"));
  ASSERT_EQ(int(read_records(grid.jsonl, "routing").size()), kSteps * c.grad_accum * L);
  for (const std::string& record : read_records(grid.jsonl, "experts")) {
    const int step = int(number_field(record, "step"));
    EXPECT_GT(number_field(record, "a2a_sent_bytes"), 0) << record;
    EXPECT_EQ(number_field(record, "a2a_sent_bytes"), a2a_bytes_from_routing(grid.jsonl, step, /*rank=*/0, c.ep, E, C)) << record;
    EXPECT_EQ(number_field(record, "a2a_predicted_bytes"), number_field(record, "a2a_sent_bytes")) << record;
    // Per micro-batch and layer: counts, dispatch, combine, and the two of backward.
    EXPECT_EQ(number_field(record, "a2a_calls"), 5 * L * c.grad_accum) << record;
    EXPECT_EQ(number_field(record, "world_all_reduce_bytes"), number_field(record, "world_all_reduce_theory"))
        << record;
    EXPECT_EQ(number_field(record, "expert_dp_all_reduce_bytes"), number_field(record, "expert_dp_all_reduce_theory"))
        << record;
  }
  // Expert parameters per rank fall as 1/ep.
  const std::string one_mem = read_record(one.jsonl, "memory_ep"), mem = read_record(grid.jsonl, "memory_ep");
  EXPECT_EQ(number_field(mem, "expert_params_bytes") * c.ep, number_field(one_mem, "expert_params_bytes")) << mem;
  EXPECT_EQ(number_field(mem, "expert_params_bytes"), number_field(mem, "expert_params_theory")) << mem;
  EXPECT_EQ(number_field(mem, "non_expert_params_bytes"), number_field(one_mem, "non_expert_params_bytes")) << mem;
  // Activations (docs/theory.md, 14): the step's peak equals the arena plus the MoE layers' bytes at
  // the rows rank 0's experts ran, exactly, on one rank and on the grid; never above the bound.
  for (const TrainedRun* run : {&one, &grid}) {
    const std::string theory = read_record(run->jsonl, "theory");
    // The data-parallel group's bytes: every gradient but the experts' and, every micro-batch, every
    // layer's routing counts (ExpertTheory), exactly.
    EXPECT_EQ(number_field(theory, "measured_comm_bytes"), number_field(theory, "theory_comm_bytes")) << theory;
    EXPECT_EQ(number_field(theory, "measured_activations_bytes"), number_field(theory, "theory_activations_bytes"))
        << theory;
    EXPECT_LE(number_field(theory, "measured_activations_bytes"),
              number_field(theory, "theory_activations_at_most_bytes"))
        << theory;
    // The exchange's buffers (the transient row): 4 x 4C x the most rows of a layer, exactly; the
    // forecast's bound above them.
    EXPECT_GT(number_field(theory, "measured_transient_bytes"), 0) << theory;
    EXPECT_EQ(number_field(theory, "measured_transient_bytes"), number_field(theory, "theory_transient_bytes"))
        << theory;
    EXPECT_LE(number_field(theory, "measured_transient_bytes"), number_field(theory, "theory_transient_bytes_at_most"))
        << theory;
  }
}

// With --grad-accum the capacity and the balance loss are per micro-batch: the reference is one rank
// with the same --grad-accum, whose micro-batch m holds the same sequences as the grid's.
INSTANTIATE_TEST_SUITE_P(Grids, ExpertParallelEquivalence,
                         testing::Values(EpCase{2, 2, "0", "ep2"}, EpCase{4, 4, "0", "ep4"},
                                         EpCase{4, 2, "0", "dp2_ep2"}, EpCase{2, 2, "1.0", "ep2_capacity"},
                                         EpCase{4, 4, "1.0", "ep4_capacity"}, EpCase{4, 2, "1.0", "dp2_ep2_capacity"},
                                         EpCase{2, 2, "1.0", "ep2_capacity_accum", 2},
                                         EpCase{4, 2, "1.0", "dp2_ep2_capacity_accum", 2}),
                         [](const testing::TestParamInfo<EpCase>& info) { return info.param.name; });

// One rank of 11 without the balance loss is one rank of 01 on the same MoE preset: the chapter adds
// only the distribution.
TEST(ExpertParallel, OneRankIsOneRankOf01) {
  const TrainedRun eleven = run_11(1, "--aux-loss-coef 0");
  const std::string dir = temp_dir();
  const RunResult r = run_trainer("01_vanilla_dp", 1, "--preset moe-tiny --steps " + std::to_string(kSteps) +
                                                          " --json " + dir + "/01.jsonl --save " + dir + "/01.bin");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(max_relative_difference(read_losses(eleven.jsonl), read_losses(dir + "/01.jsonl")), kTolerance);
  EXPECT_LE(relative_l2_difference(checkpoint_params(eleven.checkpoint), checkpoint_params(dir + "/01.bin")),
            kTolerance);
  // 01 does not report its routing: its activations' theory is the bound, exact on one rank without a capacity.
  const std::string theory = read_record(dir + "/01.jsonl", "theory");
  EXPECT_EQ(number_field(theory, "measured_activations_bytes"), number_field(theory, "theory_activations_bytes"))
      << theory;
  // 01 has no expert exchange: no communication buffers, none forecast.
  EXPECT_EQ(number_field(theory, "measured_transient_bytes"), 0) << theory;
  EXPECT_EQ(number_field(theory, "theory_transient_bytes_at_most"), 0) << theory;
}

// Gradient accumulation trains on the whole batch: without a capacity or a balance loss, one rank of
// 11 with --grad-accum 2 is 01 without it (each micro-batch its own routing changes nothing then).
TEST(ExpertParallel, GradAccumTrainsOnTheWholeBatch) {
  const TrainedRun accumulated = run_11(1, "--aux-loss-coef 0 --grad-accum 2");
  const std::string dir = temp_dir();
  const RunResult r = run_trainer("01_vanilla_dp", 1, "--preset moe-tiny --steps " + std::to_string(kSteps) +
                                                          " --json " + dir + "/01.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(max_relative_difference(read_losses(accumulated.jsonl), read_losses(dir + "/01.jsonl")), kTolerance);
}

// The summary's peak is the run's, at least every step's: the routing changes each step's peak, and
// on this run the last step's is not the largest (step 6's is).
TEST(ExpertParallel, SummaryPeakIsTheRunsPeak) {
  const std::string dir = temp_dir();
  const RunResult r = run_trainer("11_expert_parallel", 2, "--ep 2 --capacity-factor 1.0 --steps 8 --json " + dir +
                                                               "/run.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string summary = read_record(dir + "/run.jsonl", "summary");
  double largest = 0;
  for (const std::string& step : read_records(dir + "/run.jsonl", "step"))
    largest = std::max(largest, number_field(step, "mem_total"));
  EXPECT_GE(number_field(summary, "peak_mem_bytes"), largest) << summary;
}

// Each wait in the trace names the op it waits for, as the op's own span on the communication track
// does: the exchange's waits once said "wait all_to_all" beside spans named all_to_all_v, so a reader
// found no all_to_all where the rank waited for one.
TEST(ExpertParallel, EveryWaitInTheTraceNamesAnOpOnTheCommunicationTrack) {
  const std::string dir = temp_dir();
  const RunResult r = run_trainer("11_expert_parallel", 2, "--ep 2 --steps 2 --trace " + dir + "/trace.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir + "/trace.json");
  std::stringstream text;
  text << in.rdbuf();
  const std::string trace = text.str();
  // A span: rank (pid), track (tid), name, and where it has one, the op's issue (a wait's: the op's).
  static const std::regex span(
      "\\{\"ph\":\"X\",\"pid\":([0-9]+),\"tid\":([0-9]+),[^{}]*\"name\":\"([^\"]*)\",\"args\":\\{[^{}]*\"issued_ms\":([-0-9.]+)");
  std::map<std::pair<std::string, std::string>, std::set<std::string>> ops;  // (rank, issued) -> names, tracks 1 and 3
  std::vector<std::array<std::string, 3>> waits;  // (rank, issued, the name waited for)
  for (auto it = std::sregex_iterator(trace.begin(), trace.end(), span); it != std::sregex_iterator(); ++it) {
    const std::string rank = (*it)[1], track = (*it)[2], name = (*it)[3], issued = (*it)[4];
    if (track == "1" || track == "3") ops[{rank, issued}].insert(name);
    if (track == "2" && name.rfind("wait ", 0) == 0) waits.push_back({rank, issued, name.substr(5)});
  }
  int exchange_waits = 0, matched = 0;
  for (const auto& [rank, issued, name] : waits) {
    const auto op = ops.find({rank, issued});
    if (op == ops.end()) continue;  // done at issue (one rank's share): no span on the track
    matched++;
    EXPECT_TRUE(op->second.count(name)) << "rank " << rank << " waits for '" << name << "' issued at " << issued
                                        << " ms, whose span on the communication track is named '"
                                        << *op->second.begin() << "'";
    exchange_waits += name.rfind("all_to_all", 0) == 0;
  }
  EXPECT_GT(matched, 10);
  EXPECT_GT(exchange_waits, 0) << "no wait for the experts' exchange in the trace";
}

// The run record names the experts and how they train.
TEST(ExpertParallel, RunRecordCarriesTheExperts) {
  const TrainedRun run = run_11(2, "--ep 2 --capacity-factor 1.5 --aux-loss-coef 0.02");
  const std::string record = read_record(run.jsonl, "run");
  EXPECT_EQ(number_field(record, "ep"), 2) << record;
  EXPECT_EQ(number_field(record, "experts"), 4) << record;
  EXPECT_EQ(number_field(record, "top_k"), 2) << record;
  EXPECT_EQ(number_field(record, "capacity_factor"), 1.5) << record;
  EXPECT_EQ(number_field(record, "aux_loss_coef"), 0.02) << record;
}

// A checkpoint keeps the capacity factor and the balance-loss coefficient (and, with either, the
// --grad-accum): a resume without the flags continues the same trajectory; with other values, or in
// a chapter that trains neither (01), it is refused, naming the flag and the checkpoint's value.
TEST(ExpertParallel, CheckpointsKeepTheMoESettings) {
  const std::string dir = temp_dir();
  const std::string common = "--preset moe-tiny --steps 4 --capacity-factor 1.0 --aux-loss-coef 0.05";
  const RunResult full = run_trainer("11_expert_parallel", 1, common + " --json " + dir + "/full.jsonl --save-every 2 "
                                                                  "--save " + dir + "/ck_{step}.bin");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const std::string half = dir + "/ck_2.bin";
  const RunResult resumed = run_trainer("11_expert_parallel", 2, "--ep 2 --resume " + half + " --json " + dir + "/resumed.jsonl");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const LossCurve all = read_losses(dir + "/full.jsonl"), rest = read_losses(dir + "/resumed.jsonl");
  ASSERT_EQ(rest.losses.size(), 2u) << resumed.output;
  EXPECT_NEAR(rest.losses[0], all.losses[2], kTolerance * all.losses[2]);
  EXPECT_NEAR(rest.losses[1], all.losses[3], kTolerance * all.losses[3]);
  struct Refusal {
    std::string chapter, flags, says;
  };
  const std::vector<Refusal> refusals = {
      {"11_expert_parallel", "--aux-loss-coef 0.01", "--aux-loss-coef 0.01 differs from the 0.05"},
      {"11_expert_parallel", "--capacity-factor 2", "--capacity-factor 2 differs from the 1"},
      {"11_expert_parallel", "--grad-accum 2", "--grad-accum 2 differs from the 1"},
      {"01_vanilla_dp", "--preset moe-tiny", "--aux-loss-coef 0.05"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.chapter + " " + r.flags);
    const RunResult result = run_trainer(r.chapter, 1, r.flags + " --resume " + half, 60);
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find(r.says), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("step 2"), std::string::npos) << "refused after the work began: " << result.output;
  }
}

// Checkpoints hold every expert whatever the grid: DP 2 x EP 2 saves half-way, EP 2 and one rank
// resume it; one rank of 01 saves, DP 2 x EP 2 resumes it.
TEST(ExpertParallel, CheckpointsCrossGrids) {
  expect_checkpoints_cross_grids({"11_expert_parallel", 4, "--ep 2 --aux-loss-coef 0"},
                                 {{"11_expert_parallel", 2, "--ep 2 --aux-loss-coef 0"},
                                  {"11_expert_parallel", 1, "--aux-loss-coef 0"}},
                                 {"11_expert_parallel", 4, "--ep 2 --aux-loss-coef 0"}, "--preset moe-tiny", 4,
                                 kTolerance);
}

// Each refusal: non-zero exit within seconds, the message naming what is wrong, no internal error.
TEST(ExpertParallel, BadInputIsRefusedOnEveryRankBeforeTheWork) {
  struct Refusal {
    std::string chapter;
    int ranks;
    std::string flags, says;
  };
  const std::vector<Refusal> refusals = {
      {"11_expert_parallel", 3, "--ep 3", "--ep 3 must divide the 4 experts of --preset moe-tiny"},
      // 12 refuses it alike (the expert dimension's refusal, common/parallel/dimension_expert.cpp), naming the
      // values that would work on its grid: it was an internal error of the parameter layout.
      {"12_5d_parallel", 6, "--preset moe-tiny --ep 3 --batch 12",
       "pass --ep 1 or 2, which divide both the experts and the 6 ranks"},
      {"12_5d_parallel", 8, "--preset moe-tiny --ep 8 --batch 16 --micro-batches 1",
       "pass --ep 1, 2 or 4, which divide both the experts and the 8 ranks"},
      {"11_expert_parallel", 3, "--ep 2", "do not divide into expert-parallel groups of --ep 2"},
      {"11_expert_parallel", 2, "--ep 0", "--ep must be >= 1"},
      {"11_expert_parallel", 2, "--ep 2 --preset tiny", "has no experts"},
      {"11_expert_parallel", 2, "--ep 2 --capacity-factor 0.001", "at least --capacity-factor 0.00"},
      {"11_expert_parallel", 2, "--ep 2 --capacity-factor -1", "--capacity-factor must be >= 0"},
      {"11_expert_parallel", 1, "--recompute full", "--recompute full would route"},
      {"11_expert_parallel", 1, "--device cuda", "cuda"},
      {"03_bucket_dp", 2, "--preset moe-tiny", "only 11_expert_parallel and 12_5d_parallel"},
      {"07_tensor_parallel", 2, "--preset moe-tiny --tp 2", "is a mixture of experts"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.chapter + " on " + std::to_string(r.ranks) + " ranks: " + r.flags);
    const RunResult result = run_trainer(r.chapter, r.ranks, r.flags + " --steps 2", 60);
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.exit_code, 124) << "timed out: " << result.output;
    EXPECT_NE(result.output.find(r.says), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("internal error"), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("step 0"), std::string::npos) << "refused after the work began: " << result.output;
  }
}

}  // namespace
