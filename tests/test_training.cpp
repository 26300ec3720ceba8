// test_training.cpp: the project's central truth, end to end through the real trainer binaries:
// every chapter on 2 and 4 ranks trains to the same losses (relative difference <= 1e-5) and the
// same final parameters as one rank of 01 with the same global batch, with and without gradient
// accumulation. Also: resuming a checkpoint continues bit-exactly, measured memory and bytes agree
// with theory, every ZeRO collective is balanced, exposed communication stays within the time
// communication was in flight (zero at one rank), 02 keeps part of it hidden under chapter 00's
// collectives, the presets' default learning rates train without a loss spike, and the banner says
// what the emulated link models. Bad input and stops: test_run_guards.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "test_util.h"
#include "training_harness.h"

namespace {

// Ten steps: the warm-up (a tenth of them) and the cosine decay both run, the loss falls by more than
// 1 (the check below asks 0.5), and a difference between the grids has nine updates to grow through.
constexpr int kSteps = 10;
constexpr int kHalfway = kSteps / 2;  // where the checkpoint tests save and resume
// The odd preset (15 wide) learns slower: its loss falls by 0.5 only after more than 10 steps.
constexpr int kOddSteps = 20;
constexpr double kLossTolerance = 1e-5;  // fp32, relative, per step

const std::vector<std::string> kChapters = {"01_vanilla_dp", "02_overlap_dp", "03_bucket_dp",
                                            "04_zero1",      "05_zero2",      "06_zero3"};

struct Case {
  std::string chapter;
  int ranks;
  int grad_accum;
  std::string preset = "tiny";
  std::string extra = "";  // chapter-specific flags
  std::string name = "";
  std::string batch = "";  // a global batch other than the preset's (the baseline then uses it too)
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.chapter.substr(0, 2) + "_n" + std::to_string(c.ranks) + "_k" + std::to_string(c.grad_accum) + "_" +
         c.preset + c.name;
}

class RankEquivalence : public testing::TestWithParam<Case> {};

TEST_P(RankEquivalence, SameLossesAndParametersAsOneRankOf01) {
  const Case c = GetParam();
  expect_trains_like_one_rank_of_01(c.chapter, c.ranks, "--grad-accum " + std::to_string(c.grad_accum) + " " + c.extra,
                                    c.preset, c.batch, c.preset == "odd" ? kOddSteps : kSteps, kLossTolerance);
}

std::vector<Case> equivalence_cases() {
  std::vector<Case> cases;
  for (const std::string& chapter : kChapters)
    for (int ranks : {2, 4})
      for (int k : {1, 2}) cases.push_back({chapter, ranks, k});
  cases.push_back({"01_vanilla_dp", 1, 4});
  // Shards that cut through tensors: 9945 parameters divide by neither 2 nor 4.
  for (const char* chapter : {"04_zero1", "05_zero2", "06_zero3"})
    for (int ranks : {2, 4}) cases.push_back({chapter, ranks, 1, "odd"});
  // Buckets of many sizes give the same result, one smaller than the largest tensor (wte, 64 KB).
  for (const char* mb : {"0.01", "0.05", "1"}) {
    std::string name = std::string("_bucket") + (mb[1] == '.' ? mb + 2 : mb);
    cases.push_back({"03_bucket_dp", 2, 1, "tiny", std::string("--bucket-mb ") + mb, name});
    cases.push_back({"04_zero1", 4, 1, "tiny", std::string("--bucket-mb ") + mb, name});
  }
  cases.push_back({"06_zero3", 2, 2, "tiny", "--no-prefetch", "_noprefetch"});
  // Tensor parallelism on every grid, with and without sequence parallelism: the group's ranks hold
  // slices, yet compute 01's model. TP 3 with sequence parallelism takes a batch of 9, whose 9 x 17
  // positions split over 3 ranks.
  const std::string tp = "07_tensor_parallel";
  for (const char* sp : {"", " --sequence-parallel"}) {
    const std::string name = *sp ? "_sp" : "";
    cases.push_back({tp, 2, *sp ? 2 : 1, "tiny", std::string("--tp 2") + sp, "_tp2" + name});
    cases.push_back({tp, 4, 1, "tiny", std::string("--tp 4") + sp, "_tp4" + name});
    cases.push_back({tp, 4, 1, "tiny", std::string("--tp 2") + sp, "_dp2_tp2" + name});
    cases.push_back({tp, 4, 1, "tiny", std::string("--tp 2 --tp-overlap") + sp, "_dp2_tp2_overlap" + name});
    cases.push_back({tp, 3, 1, "odd", std::string("--tp 3") + sp, "_tp3" + name, *sp ? "9" : ""});
    cases.push_back({tp, 4, 1, "tiny", std::string("--tp 2 --zero1 --bucket-mb 0.01") + sp, "_dp2_tp2_zero1" + name});
  }
  cases.push_back({tp, 2, 2, "tiny", "--tp 2 --tp-overlap", "_tp2_overlap"});
  // Recomputation belongs to the model: any chapter takes it, and computes the same. ZeRO-3 gathers
  // a layer again before its backward, which full recomputation's replay runs inside.
  cases.push_back({"06_zero3", 2, 2, "tiny", "--recompute full", "_recompute_full"});
  cases.push_back({"02_overlap_dp", 2, 1, "tiny", "--recompute selective", "_recompute_selective"});
  cases.push_back({tp, 2, 1, "tiny", "--tp 2 --sequence-parallel --recompute full", "_tp2_sp_recompute_full"});
  // Chapter 00's collectives, built from send and receive, under the chapters' gradient traffic: an
  // all-reduce (01), reduce-scatters and all-gathers of ZeRO's uneven pieces (04 on the odd preset),
  // and tensor parallelism's activations (07); by size, and each algorithm forced, 3 ranks folded.
  cases.push_back({"01_vanilla_dp", 2, 1, "tiny", "--collectives ours", "_ours"});
  cases.push_back({"01_vanilla_dp", 4, 2, "tiny", "--collectives binomial-tree", "_tree"});
  cases.push_back({"04_zero1", 4, 1, "odd", "--collectives ours", "_ours"});
  cases.push_back({"04_zero1", 2, 1, "tiny", "--collectives halving-doubling", "_halving"});
  cases.push_back({"05_zero2", 3, 1, "odd", "--collectives recursive-doubling", "_doubling", "9"});
  cases.push_back({tp, 2, 1, "tiny", "--tp 2 --sequence-parallel --collectives ours", "_tp2_sp_ours"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Chapters, RankEquivalence, testing::ValuesIn(equivalence_cases()), case_name);

// no_sync: with --grad-accum K, 02 and 03 launch no collective before the last micro-batch.
TEST(NoSync, OverlapChaptersLaunchNothingBeforeTheLastMicroBatch) {
  for (const char* chapter : {"02_overlap_dp", "03_bucket_dp", "05_zero2"}) {
    for (int k : {2, 4}) {
      std::string dir = temp_dir();
      RunResult r = run_trainer(chapter, 2, "--steps 3 --grad-accum " + std::to_string(k) + " --json " + dir + "/r.jsonl");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      std::ifstream in(dir + "/r.jsonl");
      std::string line;
      int steps = 0;
      while (std::getline(in, line)) {
        if (line.find("\"type\":\"step\"") == std::string::npos) continue;
        steps++;
        const double early = number_field(line, "launched_before_last_micro");
        if (std::string(chapter) == "05_zero2")
          EXPECT_GT(early, 0) << "ZeRO-2 must reduce-scatter every micro-batch; the counter saw nothing";
        else
          EXPECT_EQ(early, 0) << chapter << " launched collectives before the last micro-batch (k=" << k << ")";
      }
      EXPECT_EQ(steps, 3);
    }
  }
}

TEST(Checkpoint, ResumeContinuesBitExactly) {
  std::string dir = temp_dir();
  std::string common = "--steps " + std::to_string(kSteps);
  const std::string save = " --save " + dir + "/ck_{step}.bin --save-every " + std::to_string(kHalfway);
  const std::string resume = " --resume " + dir + "/ck_" + std::to_string(kHalfway) + ".bin";
  RunResult full = run_trainer("01_vanilla_dp", 2, common + " --json " + dir + "/full.jsonl" + save);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  RunResult resumed = run_trainer("01_vanilla_dp", 2, common + resume + " --json " + dir + "/resumed.jsonl");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  LossCurve a = read_losses(dir + "/full.jsonl"), b = read_losses(dir + "/resumed.jsonl");
  ASSERT_EQ(int(a.losses.size()), kSteps);
  ASSERT_EQ(int(b.losses.size()), kSteps - kHalfway);
  for (int i = 0; i < kSteps - kHalfway; i++) {
    EXPECT_EQ(b.steps[i], kHalfway + i);
    EXPECT_EQ(b.losses[i], a.losses[kHalfway + i]) << "step " << kHalfway + i;  // bit-exact
  }
  // The final parameters too.
  RunResult again = run_trainer("01_vanilla_dp", 2, common + resume + " --save " + dir + "/end.bin");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(checkpoint_params(dir + "/end.bin"), checkpoint_params(dir + "/ck_" + std::to_string(kSteps) + ".bin"));
}

// A checkpoint holds full tensors, never a rank-dependent layout: one saved by a ZeRO chapter on 4
// ranks resumes on 2 ranks, and in 01 on 1 rank, continuing the same losses.
TEST(Checkpoint, ShardedSaveResumesOnOtherRankCountsAndChapters) {
  for (const char* chapter : {"04_zero1", "05_zero2", "06_zero3"}) {
    SCOPED_TRACE(chapter);
    std::string dir = temp_dir();
    std::string common = "--steps " + std::to_string(kSteps);
    const std::string save = " --save " + dir + "/ck_{step}.bin --save-every " + std::to_string(kHalfway);
    const std::string resume = " --resume " + dir + "/ck_" + std::to_string(kHalfway) + ".bin";
    RunResult full = run_trainer(chapter, 4, common + " --json " + dir + "/full.jsonl" + save);
    ASSERT_EQ(full.exit_code, 0) << full.output;
    LossCurve reference = read_losses(dir + "/full.jsonl");
    ASSERT_EQ(int(reference.losses.size()), kSteps);
    reference.steps.erase(reference.steps.begin(), reference.steps.begin() + kHalfway);
    reference.losses.erase(reference.losses.begin(), reference.losses.begin() + kHalfway);
    for (auto [into, ranks] : std::vector<std::pair<std::string, int>>{{chapter, 2}, {"01_vanilla_dp", 1}}) {
      RunResult resumed = run_trainer(into, ranks, common + resume + " --json " + dir + "/r.jsonl");
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      EXPECT_LE(max_relative_difference(read_losses(dir + "/r.jsonl"), reference), kLossTolerance)
          << "resumed in " << into << " on " << ranks << " ranks";
    }
  }
}

// Tensor parallelism saves the whole model's tensors too: a DP 2 x TP 2 checkpoint resumes in 01 on
// one rank, in ZeRO-3 on two, and on another grid (TP 4 with sequence parallelism); and 01's resumes
// under tensor parallelism (TP 2).
TEST(Checkpoint, TensorParallelSaveResumesOnAnyGridAndChapter) {
  expect_checkpoints_cross_grids({"07_tensor_parallel", 4, "--tp 2"},
                                 {{"01_vanilla_dp", 1, ""},
                                  {"06_zero3", 2, ""},
                                  {"07_tensor_parallel", 4, "--tp 4 --sequence-parallel"}},
                                 {"07_tensor_parallel", 2, ""}, "", kSteps, kLossTolerance);
}

// A run of three steps with its JSON lines, made once per binary: the tests that check different
// things of one configuration (theory, balance, the groups) read the same run instead of each
// running it again.
struct ThreeStepRun {
  RunResult result;
  std::string jsonl;
};
const ThreeStepRun& three_step_run(const std::string& chapter, int ranks, const std::string& preset,
                                   const std::string& flags) {
  static std::map<std::string, ThreeStepRun> runs;
  const std::string key = chapter + " " + std::to_string(ranks) + " " + preset + flags;
  auto found = runs.find(key);
  if (found != runs.end()) return found->second;
  ThreeStepRun run;
  run.jsonl = temp_dir() + "/run.jsonl";
  run.result = run_trainer(chapter, ranks, "--steps 3 --preset " + preset + " --json " + run.jsonl + flags);
  return runs[key] = run;
}

// Measured parameter, gradient and optimizer bytes equal docs/theory.md's formula up to padding, and the
// communicator's byte counters equal the theory for the chapter, at 1, 2 and 4 ranks; under tensor
// parallelism, also the TP group's bytes and its calls of each collective. The wide preset,
// whose embedding outweighs its blocks as GPT-2's does, checks the transient buffers' bound where the
// embedding's reduce-scatter is the largest.
TEST(Theory, MeasuredMemoryAndBytesMatchTheFormulas) {
  struct Run {
    std::string chapter, preset;
    int ranks;
    std::string flags = "";
  };
  std::vector<Run> runs;
  for (const std::string& chapter : kChapters)
    for (int ranks : {1, 2, 4}) runs.push_back({chapter, "tiny", ranks});
  for (const char* chapter : {"05_zero2", "06_zero3"})
    for (int ranks : {2, 4}) runs.push_back({chapter, "wide", ranks});
  for (const char* recompute : {" --recompute selective", " --recompute full"})
    runs.push_back({"06_zero3", "tiny", 2, recompute});
  // Tensor parallelism: parameters, activations and the TP group's bytes and calls per collective.
  // At TP 1, 2 and 4, with and without sequence parallelism, and on DP x TP grids.
  const std::vector<std::pair<int, std::string>> grids = {
      {1, ""},
      {2, " --tp 1"},
      {2, " --tp 2"},
      {2, " --tp 2 --sequence-parallel --tp-overlap"},
      {4, " --tp 4"},
      {4, " --tp 4 --sequence-parallel"},
      {4, " --tp 2 --zero1"},
      {4, " --tp 2 --sequence-parallel --grad-accum 2"},
      {2, " --tp 2 --recompute full"},  // the replay's collectives are counted too
      {2, " --tp 2 --sequence-parallel --recompute full --grad-accum 2"},
      {2, " --tp 2 --sequence-parallel --recompute selective"}};
  for (const auto& [ranks, flags] : grids) runs.push_back({"07_tensor_parallel", "tiny", ranks, flags});
  // Chapter 00's collectives move the same bytes (the ring's, and at 2 ranks doubling's equal them),
  // and their scratch stays within its bound.
  runs.push_back({"01_vanilla_dp", "tiny", 2, " --collectives ours"});
  runs.push_back({"04_zero1", "tiny", 4, " --collectives ours"});
  // Each algorithm's own bytes, call by call, on rank 0 (docs/theory.md, section 15, "Which one
  // runs"): ours sends 02's tensors and 03's small buckets by doubling (4/3 of the ring's at 4
  // ranks), the tree's rank 0 sends to each child, and at 3 ranks the folded pair's even rank sends
  // its whole vector in (halving-doubling's all-reduce and reduce-scatter) and only its segment in
  // doubling's all-gather.
  runs.push_back({"02_overlap_dp", "tiny", 4, " --collectives ours"});
  runs.push_back({"02_overlap_dp", "tiny", 4, " --collectives binomial-tree"});
  runs.push_back({"02_overlap_dp", "tiny", 3, " --collectives halving-doubling --batch 9"});
  runs.push_back({"02_overlap_dp", "tiny", 2, " --collectives recursive-doubling"});
  runs.push_back({"02_overlap_dp", "tiny", 3, " --collectives ring --batch 9"});
  runs.push_back({"03_bucket_dp", "tiny", 4, " --collectives ours --bucket-mb 0.01"});  // 6 of 10 by doubling
  runs.push_back({"01_vanilla_dp", "tiny", 3, " --collectives binomial-tree --batch 9"});
  runs.push_back({"04_zero1", "tiny", 3, " --collectives halving-doubling --batch 9"});
  runs.push_back({"05_zero2", "tiny", 3, " --collectives recursive-doubling --batch 9"});
  runs.push_back({"06_zero3", "tiny", 4, " --collectives ours"});
  runs.push_back({"06_zero3", "tiny", 3, " --collectives halving-doubling --batch 9"});
  runs.push_back({"07_tensor_parallel", "tiny", 4, " --tp 2 --collectives ours --bucket-mb 0.05"});  // DP's buckets
  runs.push_back({"07_tensor_parallel", "tiny", 2, " --tp 2 --collectives ring"});
  // TP's own rows and the buckets of 08 and 12 under the same rule, where it differs from the ring's
  // formula: at TP 4 the loss's rows and (under SP) each tensor held whole go by doubling, in a
  // recipe's bf16 too; 08's buckets over a DP group of 3 (rank 0 folds its vector in, once); 12's
  // buckets over DP x CP = 4 and its TP 4, in the table and in every rank's group row.
  runs.push_back({"07_tensor_parallel", "tiny", 4, " --tp 4 --collectives ours"});
  runs.push_back({"07_tensor_parallel", "tiny", 4, " --tp 4 --sequence-parallel --collectives ours --precision bf16"});
  runs.push_back({"08_pipeline", "tall", 6, " --pp 2 --batch 12 --collectives ours"});
  runs.push_back({"12_5d_parallel", "tall", 4, " --cp 2 --collectives ours"});
  runs.push_back({"12_5d_parallel", "tall", 4, " --tp 4 --collectives ours"});
  // ZeRO's reduce-scatters and gathers by a named algorithm over a DP group of 3, where a folded rank
  // sends its own share: 12's ZeRO-1 rows, and ZeRO-2's rule down a pipeline (08's table, 12's groups).
  runs.push_back({"12_5d_parallel", "tall", 6, " --pp 2 --batch 12 --zero1 --collectives halving-doubling"});
  runs.push_back({"12_5d_parallel", "tall", 6, " --pp 2 --batch 12 --zero2 --micro-batches 2 --collectives recursive-doubling"});
  // A mixture of experts' gradient all-reduces and routing counts' gathers go by chapter 00's
  // algorithms too (the all-to-alls stay the library's). 11's world all-reduces, bucket run by bucket
  // run: under ours its small runs go by doubling (256 B over the ring's formula on rank 0), under
  // doubling all of them (a third over). 12 at EP 2: groups of 2, where every algorithm sends the
  // ring's bytes; its experts' all-reduces over 4 replicas by doubling (a third over), and over 3,
  // where rank 0 folds in and ranks 2 and 3 send more, with the counts' gathers by doubling.
  runs.push_back({"11_expert_parallel", "moe-tiny", 4, " --ep 2 --collectives ours"});
  runs.push_back({"11_expert_parallel", "moe-tiny", 4, " --ep 2 --collectives recursive-doubling"});
  runs.push_back({"12_5d_parallel", "moe-tiny", 4, " --ep 2 --collectives ours"});
  runs.push_back({"12_5d_parallel", "moe-tiny", 4, " --ep 1 --collectives recursive-doubling"});
  runs.push_back({"12_5d_parallel", "moe-tiny", 6, " --ep 2 --batch 12 --collectives recursive-doubling"});
  for (const Run& run : runs) {
    SCOPED_TRACE(run.chapter + " on " + std::to_string(run.ranks) + " ranks, preset " + run.preset + run.flags);
    const ThreeStepRun& r = three_step_run(run.chapter, run.ranks, run.preset, run.flags);
    ASSERT_EQ(r.result.exit_code, 0) << r.result.output;
    expect_theory_matches(r.jsonl, /*param_bytes=*/4);
    // 12's rows of every rank and group ("rank1_tp" beside "rank1_tp_theory"), a MoE model's two too.
    const std::string groups = read_record(r.jsonl, "groups");
    for (int q = 0; q < run.ranks && !groups.empty(); q++)
      for (const char* name : {"tp", "cp", "dp_cp", "expert_dp", "ep"}) {
        const std::string key = "rank" + std::to_string(q) + "_" + name;
        const bool expert_group = std::string(name) == "expert_dp" || std::string(name) == "ep";
        if (expert_group && groups.find("\"" + key + "\"") == std::string::npos) continue;  // a dense model's
        EXPECT_NEAR(number_field(groups, key), number_field(groups, key + "_theory"), 0.5) << key << " in " << groups;
      }
    // 11's two gradient rows, every step: the world's all-reduces and the experts' over their group.
    for (const std::string& experts : read_records(r.jsonl, "experts")) {
      if (experts.find("\"world_all_reduce_bytes\"") == std::string::npos) continue;  // 12's: routing alone
      for (const char* row : {"world_all_reduce", "expert_dp_all_reduce"})
        EXPECT_EQ(number_field(experts, std::string(row) + "_bytes"), number_field(experts, std::string(row) + "_theory"))
            << row << " in " << experts;
    }
  }
}

// Chapters 01-06 split the batch alone: their grid (ProcessGrid(world)) splits no group off the
// world, so a step counts the world's communication only, and the header names no grid.
TEST(DataParallelAlone, TheWorldIsTheOneGroup) {
  for (const std::string& chapter : kChapters) {
    SCOPED_TRACE(chapter);
    const ThreeStepRun& r = three_step_run(chapter, 2, "tiny", "");
    ASSERT_EQ(r.result.exit_code, 0) << r.result.output;
    EXPECT_EQ(r.result.output.find("grid:"), std::string::npos) << r.result.output;
    const std::string step = read_record(r.jsonl, "step");
    ASSERT_FALSE(step.empty());
    for (const char* group : {"\"dp_", "\"tp_", "\"pp_", "\"cp_", "\"ep_", "\"expert_dp_"})
      EXPECT_EQ(step.find(group), std::string::npos) << group << " in " << step;
  }
}

// Every ZeRO collective is balanced: in every reduce-scatter and all-gather, each rank sends and
// receives (N-1)/N of the payload. The counters record the largest share of any one call on each
// rank, and the step record holds the largest over the ranks: at most (N-1)/N means every rank's
// every call had exactly its share (the shares of one call add up to the payload's). A chapter that
// went back to owning one contiguous slice of the buffer (the variable-count collectives, a layer
// gathered from its one or two owners) fails here: its owners receive or send up to N-1 shares.
TEST(Balance, EveryZeroCollectiveSendsAndReceivesItsShare) {
  for (const char* chapter : {"04_zero1", "05_zero2", "06_zero3"}) {
    for (int ranks : {2, 4}) {
      SCOPED_TRACE(std::string(chapter) + " on " + std::to_string(ranks) + " ranks");
      const ThreeStepRun& r = three_step_run(chapter, ranks, "tiny", "");
      ASSERT_EQ(r.result.exit_code, 0) << r.result.output;
      const double share = double(ranks - 1) / ranks;
      const std::vector<std::string> steps = read_records(r.jsonl, "step");
      ASSERT_EQ(steps.size(), 3u);
      for (const std::string& step : steps) {
        for (const char* kind : {"reduce_scatter", "all_gather"}) {
          ASSERT_GT(number_field(step, std::string("calls_") + kind), 0) << kind << " in " << step;
          EXPECT_NEAR(number_field(step, std::string("max_sent_share_") + kind), share, 1e-9) << kind;
          EXPECT_NEAR(number_field(step, std::string("max_received_share_") + kind), share, 1e-9) << kind;
        }
      }
    }
  }
}

// Exposed communication is the part of communication the trainer waited for: never more than the
// time communication was in flight, and nothing at one rank, where there is no one to talk to.
TEST(ExposedCommunication, NeverExceedsTheTotalAndIsZeroAtOneRank) {
  for (const std::string& chapter : kChapters) {
    SCOPED_TRACE(chapter);
    const std::string dir = temp_dir();
    RunResult one = run_trainer(chapter, 1, "--steps 3 --link-gbps 1 --json " + dir + "/one.jsonl");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    for (const std::string& step : read_records(dir + "/one.jsonl", "step")) {
      EXPECT_EQ(number_field(step, "exposed_comm_ms"), 0.0) << step;
      EXPECT_EQ(number_field(step, "comm_ms"), 0.0) << step;
    }
    RunResult two = run_trainer(chapter, 2, "--steps 3 --link-gbps 1 --link-latency-us 20 --json " + dir + "/two.jsonl");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    for (const std::string& step : read_records(dir + "/two.jsonl", "step")) {
      EXPECT_GT(number_field(step, "comm_ms"), 0.0) << step;
      EXPECT_LE(number_field(step, "exposed_comm_ms"), number_field(step, "comm_ms")) << step;
    }
  }
}

// Chapter 00's collectives keep 02's overlap: each all-reduce runs on the communicator's worker while
// backward goes on, so part of the communication is hidden, as under the library. On the small preset
// over a 1 Gbit/s link the ring's share left exposed measured 0.23-0.45 on 2 busy cores (the
// library's about 0.1); run to completion at issue, as they once were, 0.76-0.94: all but the
// reductions between the messages, and whatever moments the caller lost its core between two of
// them. A busy machine can starve the worker for a run, so up to 4 runs, and one under 0.6 passes.
TEST(ExposedCommunication, ChapterZerosCollectivesOverlapBackwardIn02) {
  double exposed = 0, total = 0;
  for (int run = 0; run < 4; run++) {
    const std::string dir = temp_dir();
    RunResult r = run_trainer("02_overlap_dp", 2,
                              "--preset small --steps 6 --link-gbps 1 --collectives ring --json " + dir + "/run.jsonl");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string summary = read_record(dir + "/run.jsonl", "summary");
    exposed = number_field(summary, "exposed_comm_ms");
    total = number_field(summary, "comm_ms");
    ASSERT_GT(total, 0) << summary;
    if (exposed < 0.6 * total) break;
  }
  EXPECT_LT(exposed, 0.6 * total) << "the last of 4 runs left " << exposed << " ms of " << total
                                  << " ms of communication exposed";
}

// The default learning rates (model_config.cpp) are meant to be the largest that train without a
// spike: a learner who runs a preset as it is must not see its loss jump. At 1 rank over the first
// steps, no step's loss exceeds the previous one's by more than 10%, nor the first step's. (small at
// twice its rate, 2e-3, jumps 1.9x in one step and fails here.)
struct PresetRun {
  std::string preset;
  int steps;
};

void PrintTo(const PresetRun& p, std::ostream* os) { *os << p.preset << ", " << p.steps << " steps"; }

class DefaultLearningRate : public testing::TestWithParam<PresetRun> {};

TEST_P(DefaultLearningRate, TrainsWithoutALossSpike) {
  const PresetRun p = GetParam();
    const LossCurve& curve = one_rank_of_01(p.preset, "", p.steps).losses;
  ASSERT_EQ(int(curve.losses.size()), p.steps);
  for (size_t i = 1; i < curve.losses.size(); i++) {
    EXPECT_LE(curve.losses[i], 1.10 * curve.losses[i - 1]) << "a spike at step " << curve.steps[i];
    EXPECT_LE(curve.losses[i], curve.losses[0]) << "above the first step's loss at step " << curve.steps[i];
  }
}

// deep is make compare's default; it takes about 5 s on one core.
INSTANTIATE_TEST_SUITE_P(Presets, DefaultLearningRate,
                         testing::Values(PresetRun{"tiny", 20}, PresetRun{"small", 30}, PresetRun{"deep", 30}),
                         [](const testing::TestParamInfo<PresetRun>& info) { return info.param.preset; });

// The banner names what the emulated link models: a link of latency alone has unlimited bandwidth
// (not "0 Gbit/s", a link that would carry nothing), and numbers print as given (not "2e+03").
TEST(EmulatedLink, TheBannerSaysWhatIsModelled) {
  const struct {
    std::string chapter, flags, line;
  } cases[] = {
      {"01_vanilla_dp", "--link-latency-us 2000", "emulated link: unlimited bandwidth, 2000 us latency"},
      {"01_vanilla_dp", "--link-gbps 0.5 --link-latency-us 50", "emulated link: 0.5 Gbit/s, 50 us latency"},
      {"01_vanilla_dp", "--link-gbps 2000", "emulated link: 2000 Gbit/s, 0 us latency"},
      {"07_tensor_parallel", "--link-gbps 0.5 --tp-link-gbps 0 --tp-link-latency-us 10",
       "tensor-parallel group's emulated link: unlimited bandwidth, 10 us latency"},
      {"07_tensor_parallel", "--link-gbps 0.5 --tp-link-gbps 0 --tp-link-latency-us 0",
       "tensor-parallel group's emulated link: none"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.chapter + " " + c.flags);
    RunResult r = run_trainer(c.chapter, 2, "--steps 2 " + c.flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.line), std::string::npos) << "expected '" << c.line << "' in:\n" << r.output;
  }
  // No link, no banner.
  RunResult none = run_trainer("01_vanilla_dp", 2, "--steps 2");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_EQ(none.output.find("emulated link"), std::string::npos) << none.output;
}

}  // namespace
