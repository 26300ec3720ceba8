// test_3d_parallel.cpp: chapter 09 end to end, through the real trainer binary. On TP 2 x PP 2,
// DP 2 x TP 2 x PP 2 (8 ranks), with sequence parallelism, ZeRO-1, the interleaved and zb-h1
// schedules, each recomputation and chapter 00's collectives (--collectives ring and ours), it
// trains to the same losses, gradient norms and final parameters as one rank of 01 with the same
// global batch. Every figure theory predicts equals the measurement: memory per category,
// activations and point-to-point bytes per stage, the TP group's collectives and bytes, the DP
// group's, the embedding group's. Checkpoints stay layout-free: 09's resume in 01, 07 and 08, and
// 01's in 09. The model's recomputation alone: test_recompute.cpp.
// 08's flags (--zero2) run here too; the tied wte's two copies stay equal on every grid (DP 4 x TP 2
// x PP 2 with ZeRO-1 at 16 ranks); the header and the run record name every dimension of the grid.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "parallel/buckets.h"
#include "model/param_layout.h"
#include "pipeline/pipeline.h"
#include "parallel/shards.h"
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
  if (pipeline.find("\"schedule\":\"zb-v\"") == std::string::npos &&
      pipeline.find("\"schedule\":\"dualpipev\"") == std::string::npos) {  // a V: one wte, no group
    EXPECT_GT(number_field(pipeline, "measured_embedding_bytes"), 0) << pipeline;
  }
  EXPECT_EQ(number_field(pipeline, "measured_embedding_bytes"), number_field(pipeline, "theory_embedding_bytes"))
      << pipeline;
  // dualpipev runs its F&B pairs at once (their TP collectives from two lanes): every stage reports them.
  const std::vector<std::string> pairs = read_records(jsonl, "pipeline_pairs");
  EXPECT_EQ(pairs.size(), c.flags.find("dualpipev") != std::string::npos ? 2u : 0u) << c.flags;
  for (const std::string& stage : pairs) EXPECT_GT(number_field(stage, "pairs"), 0) << stage;
}

std::vector<GridCase> grid_cases() {
  return {
      {4, "tall", 10, "--tp 2 --pp 2", "tp2_pp2"},
      {4, "tall", 10, "--tp 2 --pp 2 --sequence-parallel --tp-overlap --recompute full", "tp2_pp2_sp_full"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule interleaved --recompute selective", "tp2_pp2_interleaved_selective"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule afab --sequence-parallel --recompute selective", "tp2_pp2_afab_sp"},
      {4, "tall", 10, "--tp 1 --pp 2 --schedule zb-h1 --recompute selective", "dp2_pp2_zbh1_selective"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule zb-h1", "tp2_pp2_zbh1"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule zb-h1 --sequence-parallel --tp-overlap", "tp2_pp2_zbh1_sp"},
      // A V of tensor-parallel stages: rank 0's two chunks hold the embedding's and the head's wte slice.
      {4, "tall", 10, "--tp 2 --pp 2 --schedule zb-v --sequence-parallel", "tp2_pp2_zbv_sp"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule dualpipev --recompute selective", "tp2_pp2_dualpipev_selective"},
      // The same V's lists for NCCL (matched by call order), run over MPI with one tag: 09 passes
      // --p2p-matching to 08's executor, the messages between TP-sharded stages in the V's order.
      {4, "tall", 10, "--tp 2 --pp 2 --schedule zb-v --sequence-parallel --p2p-matching call-order",
       "tp2_pp2_zbv_sp_call_order"},
      // dualpipev's pairs at once (its default): both lanes' TP collectives, each on its own copy of the
      // TP group, the sums of the tensors held whole from the backward lane; and under chapter 00's.
      {4, "tall", 10, "--tp 2 --pp 2 --schedule dualpipev --sequence-parallel --tp-overlap", "tp2_pp2_dualpipev_sp"},
      {4, "tall", 10, "--tp 2 --pp 2 --schedule dualpipev --sequence-parallel --collectives ours",
       "tp2_pp2_dualpipev_sp_ours"},
      // Chapter 00's collectives on every group at once (TP's sums, the embedding group's, DP's
      // buckets), each on its communicator's worker while the stages exchange activations.
      {4, "tall", 10, "--tp 2 --pp 2 --collectives ring", "tp2_pp2_ring"},
      {4, "tall", 10, "--tp 2 --pp 2 --sequence-parallel --collectives ours", "tp2_pp2_sp_ours"},
      {4, "tall", 10, "--tp 1 --pp 2 --collectives ours", "dp2_pp2_ours"},
      // 8 ranks on a busy machine: the tiny preset (a block a stage), few steps.
      {8, "tiny", 4, "--tp 2 --pp 2 --zero1 --sequence-parallel --bucket-mb 0.01", "dp2_tp2_pp2_zero1_sp"},
      // 08's --zero2, composed with TP's sums under sequence parallelism.
      {8, "tiny", 4, "--tp 2 --pp 2 --zero2 --sequence-parallel --bucket-mb 0.01", "dp2_tp2_pp2_zero2_sp"},
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

// The header names every dimension of 09's grid, sizes of 1 included, and the run record carries
// every chapter's grid sizes (dp, cp, tp, pp, ep): once "grid: 1 data-parallel x 2 pipeline stages"
// on TP 2 x PP 2, and 11's record "dp":2 with no ep.
TEST(ThreeDHeader, NamesEveryDimensionOfTheGrid) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer("09_3d_parallel", 4, "--preset tall --steps 1 --tp 2 --pp 2 --json " + dir + "/run.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("grid: 1 data-parallel x 2 tensor-parallel x 2 pipeline stages |"), std::string::npos)
      << r.output;
  const std::string run = read_record(dir + "/run.jsonl", "run");
  for (const char* field : {"\"dp\":1", "\"cp\":1", "\"tp\":2", "\"pp\":2", "\"ep\":1"})
    EXPECT_NE(run.find(field), std::string::npos) << field << " in " << run;
  RunResult single = run_trainer("09_3d_parallel", 2, "--preset tall --steps 1 --tp 2 --pp 1");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  EXPECT_NE(single.output.find("grid: 1 data-parallel x 2 tensor-parallel x 1 pipeline stage |"), std::string::npos)
      << single.output;
  RunResult experts = run_trainer("11_expert_parallel", 2, "--steps 1 --ep 2 --json " + dir + "/moe.jsonl");
  ASSERT_EQ(experts.exit_code, 0) << experts.output;
  EXPECT_NE(read_record(dir + "/moe.jsonl", "run").find("\"ep\":2"), std::string::npos)
      << read_record(dir + "/moe.jsonl", "run");
}

// The tied wte's two copies are updated alike only if their gradients are reduced alike: equal after
// the embedding group's sum, each then travels in its stage's data-parallel bucket and shard pieces,
// which must have one shape on both stages (MPI then sums every element in the same order). Before,
// wte shared a bucket with wpe on the first stage and with blocks on the last, and at DP 4 under
// ZeRO-1 the copies came out DIFFERENT.
TEST(ThreeDTiedEmbedding, BothCopiesTravelInBucketsOfOneShape) {
  GPT2Config model;
  ASSERT_TRUE(find_preset("tall", &model));
  for (int dp : {1, 2, 3, 4})
    for (int t : {1, 2})
      for (int p : {2, 4})
        for (BucketCut cut : {BucketCut::AtTensors, BucketCut::AtLayers}) {
          SCOPED_TRACE("dp " + std::to_string(dp) + " tp " + std::to_string(t) + " pp " + std::to_string(p));
          const std::vector<int> blocks = balanced_partition(model, p);
          std::vector<FlatRange> wte_bucket;
          std::vector<std::vector<FlatRange>> pieces(2);
          for (int stage : {0, p - 1}) {
            const ParamLayout layout =
                build_gpt2_layout(model, dp, TensorParallelism{t, 0, false}, parts_of_rank(model, blocks, p, stage));
            const int wte = layout.find("wte");
            const GradientBuckets buckets(layout, 4096, 4, cut);
            const int b = buckets.bucket_of(wte);
            EXPECT_EQ(buckets.begin(b), layout.params[wte].offset);
            // Where ZeRO-2's theory takes it to end (dimension_data.cpp, from the layout alone).
            EXPECT_EQ(buckets.end(b), layout.tied_wte_end);
            wte_bucket.push_back(buckets.range(b));
            if (cut != BucketCut::AtLayers) continue;  // (ZeRO's buckets: whole layers, each divides by dp)
            const ShardPlan plan(buckets.ranges_in_flat_order(), dp, 0);
            const int i = plan.range_index(buckets.begin(b));
            for (int q = 0; q < dp; q++) pieces[stage == 0 ? 0 : 1].push_back(plan.piece(i, q));
          }
          EXPECT_EQ(wte_bucket[0].begin, wte_bucket[1].begin);
          EXPECT_EQ(wte_bucket[0].end, wte_bucket[1].end);
          ASSERT_EQ(pieces[0].size(), pieces[1].size());
          for (size_t q = 0; q < pieces[0].size(); q++) {
            EXPECT_EQ(pieces[0][q].begin, pieces[1][q].begin);
            EXPECT_EQ(pieces[0][q].end, pieces[1][q].end);
          }
        }
}

// The reported grid, at 16 ranks: DP 4 x TP 2 x PP 2 with ZeRO-1, a tiny model, two steps.
TEST(ThreeDTiedEmbedding, BothCopiesStayEqualAtDataParallelFourUnderZeroOne) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer("09_3d_parallel", 16,
                            "--preset tiny --tp 2 --pp 2 --zero1 --batch 16 --steps 2 --json " + dir + "/run.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("grid: 4 data-parallel x 2 tensor-parallel x 2 pipeline stages"), std::string::npos)
      << r.output;
  const std::string pipeline = read_record(dir + "/run.jsonl", "pipeline");
  EXPECT_NE(pipeline.find("\"wte_copies_equal\":true"), std::string::npos) << pipeline;
}

// Combinations the chapter refuses, each with a message naming the flags, before any work.
TEST(ThreeDGuards, RefusedCombinationsNameTheirFlags) {
  struct Refused {
    int ranks;
    std::string flags, message;
  };
  for (const Refused& c : std::vector<Refused>{
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
