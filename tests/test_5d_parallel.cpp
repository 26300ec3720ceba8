// test_5d_parallel.cpp: chapter 12 end to end, through the real trainer binary. Each grid trains to
// one rank's losses and final parameters: 01's for a dense preset, 11's (one rank, the same
// micro-batches) for moe-tiny, whose routed and dropped assignments per layer and expert must equal
// one rank's too. The grids are those where composition goes wrong silently: CP's ring over TP's
// heads, CP's T/cp rows down a pipeline, EP folded over TP ranks that route their own rows under SP,
// routing kept per micro-batch in flight, capacity claimed in the global token order across CP's
// interleaved positions, and all five at 16 ranks with ZeRO-1 and recomputation.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "training_harness.h"

namespace {

constexpr double kTolerance = 1e-5;  // fp32, relative

struct FiveDCase {
  int ranks;
  std::string preset;
  std::string flags;
  std::string name;
  int micro_batches = 2;  // 12's --micro-batches (the reference's --grad-accum for a MoE preset)
};

void PrintTo(const FiveDCase& c, std::ostream* out) { *out << c.ranks << " ranks, " << c.preset << ", " << c.flags; }

// Every rank's bytes in every group of the grid (and its expert parameters) equal their formulas.
void expect_groups_match_theory(const std::string& jsonl, int ranks, const std::vector<std::string>& names) {
  const std::string groups = read_record(jsonl, "groups");
  ASSERT_FALSE(groups.empty()) << "no groups record in " << jsonl;
  for (int q = 0; q < ranks; q++)
    for (const std::string& name : names) {
      const std::string key = "rank" + std::to_string(q) + "_" + name;
      const double measured = number_field(groups, key), theory = number_field(groups, key + "_theory");
      EXPECT_NEAR(measured, theory, 1e-9 * theory + 0.5) << key << " in " << groups;
    }
}

// Each pipeline stage's activations (T/cp positions, this rank's heads and rows, the schedule's
// micro-batches in flight, a MoE model's routing replayed in the schedule's order) and point-to-point
// bytes equal their formulas; so does this rank's activation peak in the theory table.
void expect_activations_match_theory(const std::string& jsonl) {
  const std::string theory = read_record(jsonl, "theory");
  EXPECT_EQ(number_field(theory, "measured_activations_bytes"), number_field(theory, "theory_activations_bytes"))
      << theory;
  for (const std::string& stage : read_records(jsonl, "pipeline_stage")) {
    EXPECT_EQ(number_field(stage, "measured_activations_bytes"), number_field(stage, "theory_activations_bytes"))
        << stage;
    EXPECT_EQ(number_field(stage, "measured_p2p_bytes"), number_field(stage, "theory_p2p_bytes")) << stage;
  }
}

class DenseGrid : public testing::TestWithParam<FiveDCase> {};
class MoEGrid : public testing::TestWithParam<FiveDCase> {};

TEST_P(DenseGrid, TrainsLikeOneRankOf01) {
  const FiveDCase c = GetParam();
  const std::string jsonl = expect_trains_like_one_rank_of_01(
      "12_5d_parallel", c.ranks, c.flags + " --micro-batches " + std::to_string(c.micro_batches), c.preset, "", 10,
      kTolerance);
  // Memory by category, activations on T/cp positions of this rank's heads, TP bytes at T/cp, DP x CP bytes:
  // each its formula.
  expect_theory_matches(jsonl, /*param_bytes=*/4);
  expect_groups_match_theory(jsonl, c.ranks, {"tp", "cp", "dp_cp"});
  expect_activations_match_theory(jsonl);
}

struct Trained {
  std::string jsonl, checkpoint;
};

Trained train(const std::string& chapter, int ranks, const std::string& flags) {
  const std::string dir = temp_dir();
  Trained run{dir + "/run.jsonl", dir + "/final.bin"};
  const RunResult result = run_trainer(chapter, ranks, "--steps 3 " + flags + " --json " + run.jsonl +
                                                           " --save " + run.checkpoint);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return run;
}

TEST_P(MoEGrid, TrainsLikeOneRankOf11WithTheSameTokensDropped) {
  const FiveDCase c = GetParam();
  std::string moe_flags;  // the capacity and the balance loss, for both runs
  for (const std::string flag : {"--capacity-factor", "--aux-loss-coef"}) {
    const size_t at = c.flags.find(flag);
    if (at == std::string::npos) continue;
    const size_t value_end = c.flags.find(' ', c.flags.find(' ', at) + 1);
    moe_flags += " " + c.flags.substr(at, value_end == std::string::npos ? std::string::npos : value_end - at);
  }
  const std::string preset = "--preset " + c.preset + " ";
  const Trained one = train("11_expert_parallel", 1, preset + "--grad-accum " + std::to_string(c.micro_batches) + moe_flags);
  const Trained grid =
      train("12_5d_parallel", c.ranks, preset + c.flags + " --micro-batches " + std::to_string(c.micro_batches));
  const LossCurve reference = read_losses(one.jsonl), got = read_losses(grid.jsonl);
  ASSERT_EQ(got.losses.size(), 3u);
  EXPECT_LE(max_relative_difference(got, reference), kTolerance);
  EXPECT_LE(relative_l2_difference(checkpoint_params(grid.checkpoint), checkpoint_params(one.checkpoint)), kTolerance);
  EXPECT_EQ(expert_counts(grid.jsonl, "routed"), expert_counts(one.jsonl, "routed"));
  const std::vector<double> dropped = expert_counts(grid.jsonl, "dropped");
  EXPECT_EQ(dropped, expert_counts(one.jsonl, "dropped"));
  expect_groups_match_theory(grid.jsonl, c.ranks, {"tp", "cp", "dp_cp", "expert_dp", "ep", "expert_params"});
  expect_activations_match_theory(grid.jsonl);
  if (moe_flags.find("--capacity-factor") != std::string::npos) {
    double total = 0;
    for (double d : dropped) total += d;
    EXPECT_GT(total, 0) << "the capacity factor should drop some assignments";
  }
}

std::vector<FiveDCase> dense_cases() {
  return {
      {4, "tall", "--tp 2 --cp 2", "tp2_cp2"},
      {4, "tall", "--tp 2 --cp 2 --sequence-parallel --recompute selective", "tp2_cp2_sp_selective"},
      {4, "tall", "--cp 2 --pp 2 --schedule interleaved", "cp2_pp2_interleaved", 4},
      {16, "tall", "--cp 2 --tp 2 --pp 2 --zero1 --recompute selective", "dp2_cp2_tp2_pp2_zero1_selective"},
      // Chapter 00's collectives under all of it: the ring's own sums, a pipeline's sends beside them.
      {8, "tall", "--cp 2 --tp 2 --pp 2 --collectives ring", "cp2_tp2_pp2_our_ring"},
  };
}

std::vector<FiveDCase> moe_cases() {
  return {
      {4, "moe-tiny", "--tp 2 --pp 2 --ep 2 --sequence-parallel --recompute selective", "moe_tp2_pp2_ep2_sp_selective"},
      {4, "moe-tiny", "--cp 2 --ep 2 --capacity-factor 1.0 --recompute selective", "moe_cp2_ep2_capacity_selective"},
      {8, "moe-tiny", "--cp 2 --tp 2 --pp 2 --ep 4 --sequence-parallel --capacity-factor 1.0 --aux-loss-coef 0.01",
       "moe_cp2_tp2_pp2_ep4_capacity"},
      // The V schedules (08): the embedding and the head on rank 0, experts in every stage.
      {4, "moe-small", "--tp 2 --pp 2 --ep 2 --sequence-parallel --schedule zb-v", "moe_tp2_pp2_ep2_zbv", 4},
      {4, "moe-small", "--tp 2 --pp 2 --ep 2 --sequence-parallel --schedule dualpipev --capacity-factor 1.0",
       "moe_tp2_pp2_ep2_dualpipev_capacity", 4},
  };
}

std::string name_of(const testing::TestParamInfo<FiveDCase>& info) { return info.param.name; }
INSTANTIATE_TEST_SUITE_P(Grids, DenseGrid, testing::ValuesIn(dense_cases()), name_of);
INSTANTIATE_TEST_SUITE_P(Grids, MoEGrid, testing::ValuesIn(moe_cases()), name_of);

// Checkpoints stay layout-free: 12's resume in 01 and 07-10, and on another grid of 12; 01's resume in 12.
TEST(FiveDCheckpoints, ResumeAcrossGridsAndChapters) {
  expect_checkpoints_cross_grids({"12_5d_parallel", 4, "--tp 2 --cp 2 --sequence-parallel"},
                                 {{"01_vanilla_dp", 1, ""},
                                  {"07_tensor_parallel", 2, "--tp 2"},
                                  {"08_pipeline", 2, "--pp 2 --schedule zb-v"},
                                  {"09_3d_parallel", 4, "--tp 2 --pp 2"},
                                  {"10_context_parallel", 2, "--cp 2"},
                                  {"12_5d_parallel", 4, "--cp 2 --pp 2"}},
                                 {"12_5d_parallel", 4, "--cp 2 --tp 2"}, "--preset tall", 8, kTolerance);
}

// And theirs resume in 12: 07-10's on a grid of all their dimensions at once.
TEST(FiveDCheckpoints, ResumesTheOtherChapters) {
  expect_resumes_checkpoints_of({"12_5d_parallel", 8, "--cp 2 --tp 2 --pp 2 --schedule dualpipev --micro-batches 4"},
                                {{"07_tensor_parallel", 2, "--tp 2 --sequence-parallel"},
                                 {"08_pipeline", 2, "--pp 2 --schedule interleaved"},
                                 {"09_3d_parallel", 4, "--tp 2 --pp 2 --zero1"},
                                 {"10_context_parallel", 2, "--cp 2 --cp-split contiguous"}},
                                "--preset tall", 8, kTolerance);
}

// A mixture of experts' checkpoints move between 11 and 12 both ways, whatever the grid.
TEST(FiveDCheckpoints, MixtureOfExpertsBetween11And12) {
  // (The balance loss spans a micro-batch: both sides split the batch into the same two.)
  expect_resumes_checkpoints_of({"12_5d_parallel", 4, "--tp 2 --pp 2 --ep 2 --sequence-parallel --micro-batches 2"},
                                {{"11_expert_parallel", 2, "--ep 2 --grad-accum 2"}}, "--preset moe-tiny", 6, kTolerance);
  expect_resumes_checkpoints_of({"11_expert_parallel", 2, "--ep 2 --grad-accum 2"},
                                {{"12_5d_parallel", 4, "--cp 2 --pp 2 --ep 2 --micro-batches 2"}}, "--preset moe-tiny", 6,
                                kTolerance);
}

// A grid that does not fit is refused on every rank at once, naming the flag and what would fit.
struct Refusal {
  int ranks;
  std::string args, expected;
};

TEST(FiveDRefusals, EachNamesTheFlagWithinSeconds) {
  const std::vector<Refusal> refusals = {
      {4, "--preset tall --tp 2 --cp 3", "--cp"},
      {4, "--preset moe-tiny --tp 2 --ep 2", "--sequence-parallel"},
      {4, "--preset moe-tiny --ep 3", "--ep"},
      {4, "--preset tall --ep 2", "MoE --preset"},
      {4, "--preset moe-tiny --cp 2 --ep 2 --zero1", "--zero1"},
      {4, "--preset tall --cp 2 --cp-split diagonal", "--cp-split"},
      // Accepted, they would be ignored: each is refused where it does nothing.
      {4, "--preset tall --tp 2 --capacity-factor 1.0", "--capacity-factor sets a mixture of experts' routing"},
      {4, "--preset tall --tp 2 --aux-loss-coef 0.1", "--aux-loss-coef sets a mixture of experts' routing"},
      {2, "--preset tall --cp-split contiguous", "at --cp 1 one rank holds them all"},
  };
  for (const Refusal& r : refusals) {
    const RunResult result = run_trainer("12_5d_parallel", r.ranks, "--steps 1 " + r.args, 60);
    EXPECT_NE(result.exit_code, 0) << r.args << "\n" << result.output;
    EXPECT_NE(result.output.find(r.expected), std::string::npos) << r.args << "\n" << result.output;
    EXPECT_LT(result.seconds, 10) << r.args;
  }
}

}  // namespace
