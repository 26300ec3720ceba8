// test_pipeline_costs.cpp: one set of measured pass times carried to other partitions and schedules
// (common/pipeline/pipeline_costs.h), which make schedules' ideal panels simulate every schedule with. The
// costs land where the blocks go, the totals are the measured ones, a partition carried onto itself
// is unchanged, and the four schedules simulated with the same costs order as the theory says:
// zb-h1 and interleaved shorter than 1f1b, which equals afab.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "pipeline/pipeline.h"
#include "pipeline/pipeline_costs.h"

namespace {

GPT2Config deep() {
  GPT2Config cfg;
  EXPECT_TRUE(find_preset("deep", &cfg));
  return cfg;
}

double sum(const std::vector<double>& x) { return std::accumulate(x.begin(), x.end(), 0.0); }

PipelineShape shape_of(int p, int m, int v) {
  PipelineShape shape;
  shape.stages = p, shape.micro_batches = m, shape.chunks = v;
  return shape;
}

// Four stages measured unequally (the head's stage slower), B and W apart as zb-h1's run times them.
const std::vector<PassCosts> kMeasured = {{1.0, 1.1, 0.9}, {1.2, 1.3, 1.0}, {1.1, 1.2, 1.0}, {1.6, 1.8, 1.3}};

}  // namespace

TEST(PipelineCosts, ThePartitionItWasMeasuredOnGetsTheMeasuredCosts) {
  const GPT2Config cfg = deep();
  const std::vector<int> blocks = balanced_partition(cfg, 4);
  const ActionCosts zb = carry_costs(cfg, blocks, kMeasured, blocks, shape_of(4, 8, 1), Schedule::ZBH1);
  const ActionCosts whole = carry_costs(cfg, blocks, kMeasured, blocks, shape_of(4, 8, 1), Schedule::OneFOneB);
  for (int s = 0; s < 4; s++) {
    EXPECT_NEAR(zb.forward[s], kMeasured[s].forward, 1e-12);
    EXPECT_NEAR(zb.backward[s], kMeasured[s].backward, 1e-12);
    EXPECT_NEAR(zb.weight[s], kMeasured[s].weight, 1e-12);
    // Without the split, B is the whole backward and there is no W.
    EXPECT_NEAR(whole.backward[s], kMeasured[s].backward + kMeasured[s].weight, 1e-12);
    EXPECT_EQ(whole.weight[s], 0.0);
  }
}

TEST(PipelineCosts, AnotherPartitionKeepsTheTotalsAndFollowsTheBlocks) {
  const GPT2Config cfg = deep();
  const std::vector<int> measured = balanced_partition(cfg, 4), interleaved = balanced_partition(cfg, 8);
  const ActionCosts costs = carry_costs(cfg, measured, kMeasured, interleaved, shape_of(4, 8, 2), Schedule::Interleaved);
  double f = 0, b = 0;
  for (const PassCosts& c : kMeasured) f += c.forward, b += c.backward + c.weight;
  ASSERT_EQ(costs.forward.size(), 8u);
  EXPECT_NEAR(sum(costs.forward), f, 1e-9);
  EXPECT_NEAR(sum(costs.backward), b, 1e-9);
  EXPECT_NEAR(sum(costs.weight), 0.0, 1e-12);
  // Virtual stage 0 holds the first blocks of measured stage 0 (which holds `measured[0]` blocks of
  // equal FLOPs and the embedding, which has none): its share of stage 0's forward, block by block.
  ASSERT_LE(interleaved[0], measured[0]);
  EXPECT_NEAR(costs.forward[0], kMeasured[0].forward * interleaved[0] / measured[0], 1e-12);
}

// As make schedules does it: the measured run's passes summed over its stages (one measured stage
// holding every block), spread over each schedule's stages by their FLOPs.
TEST(PipelineCosts, TheSchedulesOnTheSameCostsOrderAsTheTheorySays) {
  const GPT2Config cfg = deep();
  PassCosts whole;
  for (const PassCosts& c : kMeasured) whole.forward += c.forward, whole.backward += c.backward, whole.weight += c.weight;
  auto step = [&](Schedule schedule, int v) {
    const PipelineShape shape = shape_of(4, 8, v);
    const ActionCosts costs = carry_costs(cfg, {cfg.L}, {whole}, balanced_partition(cfg, 4 * v), shape, schedule);
    const Simulation sim = simulate(schedule, shape, costs);
    EXPECT_EQ(sim.deadlock, "");
    return sim.makespan;
  };
  const double afab = step(Schedule::AFAB, 1), one = step(Schedule::OneFOneB, 1);
  const double interleaved = step(Schedule::Interleaved, 2), zb = step(Schedule::ZBH1, 1);
  EXPECT_NEAR(afab, one, 1e-9 * one);  // the same bubble, (p-1)/(m+p-1): only the memory differs
  EXPECT_LT(zb, one);                  // W fills the bubble
  EXPECT_LT(interleaved, one);         // v chunks: a bubble v times smaller
  // Every schedule does the same work: the passes sum to the measured total.
  double work = 0;
  for (const PassCosts& c : kMeasured) work += 8 * (c.forward + c.backward + c.weight);
  for (double makespan : {afab, one, interleaved, zb}) EXPECT_GT(makespan, work / 4);
}

TEST(PipelineCosts, MismatchedInputsAreRefused) {
  const GPT2Config cfg = deep();
  const std::vector<int> blocks = balanced_partition(cfg, 4);
  // One entry short, and a partition that does not hold the model's blocks.
  EXPECT_DEATH(carry_costs(cfg, blocks, {kMeasured[0], kMeasured[1], kMeasured[2]}, blocks, shape_of(4, 8, 1),
                           Schedule::OneFOneB), "one PassCosts per measured virtual stage");
  EXPECT_DEATH(carry_costs(cfg, {3, 3, 3, 2}, kMeasured, blocks, shape_of(4, 8, 1), Schedule::OneFOneB),
               "does not hold the model's L blocks");
}
