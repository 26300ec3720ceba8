// test_3d_parallel.cpp: chapter 09 end to end, through the real trainer binary. On TP 2 x PP 2,
// DP 2 x TP 2 x PP 2 (8 ranks), with sequence parallelism, ZeRO-1, the interleaved and zb-h1
// schedules and each recomputation, it trains to the same losses, gradient norms and final
// parameters as one rank of 01 with the same global batch. Every figure theory predicts equals the
// measurement: memory per category, activations and point-to-point bytes per stage, the TP group's
// collectives and bytes, the DP group's, the embedding group's. Checkpoints stay layout-free: 09's
// resume in 01, 07 and 08, and 01's in 09. The model's recomputation alone: test_recompute.cpp.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "training_harness.h"

namespace {

constexpr double kTolerance = 1e-5;  // fp32, relative

struct GridCase {
  int ranks;
  std::string preset;
  int steps;
  std::string flags;
  std::string name;
};

void PrintTo(const GridCase& c, std::ostream* out) { *out << c.ranks << " ranks, " << c.preset << ", " << c.flags; }

class ThreeDEquivalence : public testing::TestWithParam<GridCase> {};

// What composition can get wrong, each silently: a TP rank sending another TP rank's rows down the
// pipeline (SP); the tensors held whole summed over TP on some micro-batches only, or after the
// data-parallel reduction started; wte's vocabulary slices summed over the wrong embedding group; a
// gradient norm that counts the tensors held whole t times, wte twice, or a DP replica d times.
TEST_P(ThreeDEquivalence, SameTrainingAsOneRankOf01AndEveryFigureIsItsFormula) {
  const GridCase c = GetParam();
  const std::string jsonl =
      expect_trains_like_one_rank_of_01("09_3d_parallel", c.ranks, c.flags, c.preset, "", c.steps, kTolerance);
  expect_theory_matches(jsonl, /*param_bytes=*/4);
  const std::string theory = read_record(jsonl, "theory");
  if (c.flags.find("--tp 2") != std::string::npos) {
    EXPECT_GT(number_field(theory, "measured_tp_comm_bytes"), 0) << theory;
  }
  const std::vector<std::string> stages = read_records(jsonl, "pipeline_stage");
  ASSERT_EQ(stages.size(), 2u);
  for (const std::string& stage : stages) {
    EXPECT_EQ(number_field(stage, "measured_activations_bytes"), number_field(stage, "theory_activations_bytes"))
        << stage;
    EXPECT_GT(number_field(stage, "measured_p2p_bytes"), 0) << stage;
    EXPECT_EQ(number_field(stage, "measured_p2p_bytes"), number_field(stage, "theory_p2p_bytes")) << stage;
  }
  const std::string pipeline = read_record(jsonl, "pipeline");
  EXPECT_NE(pipeline.find("\"wte_copies_equal\":true"), std::string::npos) << pipeline;
  EXPECT_GT(number_field(pipeline, "measured_embedding_bytes"), 0) << pipeline;
  EXPECT_EQ(number_field(pipeline, "measured_embedding_bytes"), number_field(pipeline, "theory_embedding_bytes"))
      << pipeline;
}

std::vector<GridCase> grid_cases() {
  return {
      {4, "tall", 10, "--tp 2 --pp 2", "tp2_pp2"},
      {4, "tall", 10, "--tp 2 --pp 2 --sequence-parallel --tp-overlap --recompute full", "tp2_pp2_sp_full"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule interleaved --recompute selective", "tp2_pp2_interleaved_selective"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule afab --sequence-parallel --recompute selective", "tp2_pp2_afab_sp"},
      {4, "tall", 10, "--tp 1 --pp 2 --schedule zb-h1 --recompute selective", "dp2_pp2_zbh1_selective"},
      // 8 ranks on a busy machine: the tiny preset (a block a stage), few steps.
      {8, "tiny", 4, "--tp 2 --pp 2 --zero1 --sequence-parallel --bucket-mb 0.01", "dp2_tp2_pp2_zero1_sp"},
  };
}

INSTANTIATE_TEST_SUITE_P(Grids, ThreeDEquivalence, testing::ValuesIn(grid_cases()),
                         [](const testing::TestParamInfo<GridCase>& info) { return info.param.name; });

// Recomputation at the same grid: the same losses as without it (expect_trains_like_one_rank_of_01
// above proves that), less activation memory on every stage, by the formula, in the order none >
// selective > full.
TEST(ThreeDRecompute, EachModeHoldsLessOnEveryStage) {
  std::vector<double> previous;
  for (const char* mode : {"none", "selective", "full"}) {
    SCOPED_TRACE(mode);
    const std::string dir = temp_dir();
    RunResult r = run_trainer("09_3d_parallel", 4,
                              "--preset tall --steps 2 --tp 2 --pp 2 --sequence-parallel --recompute " +
                                  std::string(mode) + " --json " + dir + "/run.jsonl");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::string> stages = read_records(dir + "/run.jsonl", "pipeline_stage");
    ASSERT_EQ(stages.size(), 2u);
    std::vector<double> held;
    for (const std::string& stage : stages) {
      held.push_back(number_field(stage, "measured_activations_bytes"));
      EXPECT_EQ(held.back(), number_field(stage, "theory_activations_bytes")) << stage;
    }
    for (size_t s = 0; s < previous.size(); s++) EXPECT_LT(held[s], previous[s]) << "stage " << s;
    previous = held;
    if (std::string(mode) != "none") {
      EXPECT_NE(r.output.find("recompute " + std::string(mode) + ": + "), std::string::npos) << r.output;
    }
  }
}

// Combinations the chapter refuses, each with a message naming the flags, before any work.
TEST(ThreeDGuards, RefusedCombinationsNameTheirFlags) {
  struct Refused {
    int ranks;
    std::string flags, message;
  };
  for (const Refused& c : std::vector<Refused>{
           {4, "--tp 2 --pp 2 --schedule zb-h1", "--schedule zb-h1 with --tp 2"},
           {2, "--tp 1 --pp 2 --schedule zb-h1 --recompute full", "--recompute full keeps no product's input"},
           {4, "--tp 3 --pp 1", "--tp 3"},
           {2, "--tp 1 --pp 2 --recompute half", "--recompute half: choose none, selective or full"}}) {
    SCOPED_TRACE(c.flags);
    RunResult r = run_trainer("09_3d_parallel", c.ranks, "--preset tall --steps 2 " + c.flags, 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step    0"), std::string::npos) << r.output;
  }
}

// A checkpoint holds full tensors: one saved by TP 2 x PP 2 resumes in 01 on one rank, in 07 on a
// TP group and in 08 on a pipeline, continuing the same losses; and 01's resumes on 09's grid.
TEST(ThreeDCheckpoint, SavedOnAnyGridResumesInAnyChapter) {
  expect_checkpoints_cross_grids({"09_3d_parallel", 4, "--tp 2 --pp 2 --sequence-parallel"},
                                 {{"01_vanilla_dp", 1, ""},
                                  {"07_tensor_parallel", 2, "--tp 2"},
                                  {"08_pipeline", 2, "--schedule interleaved"}},
                                 {"09_3d_parallel", 4, "--tp 2 --pp 2 --recompute full"}, "--preset tall", 8,
                                 kTolerance);
}

}  // namespace
