// test_planner_kernel_rates.cpp: the planner's kernel-rate table (common/planner/planner_kernel_rates.h): the
// log-space interpolation between published points and its clamps, the grouped experts' factor read
// from DeepGEMM's published rows (nearest shape, padding to the M block, never above the dense rate),
// and a published shape's prediction pricing its routed experts at that factor (the table's removal
// changes the compute by exactly the experts' share).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "planner/model_shape.h"
#include "planner/planner.h"
#include "planner/planner_kernel_rates.h"

TEST(KernelRates, InterpolationIsLinearInLogSpaceAndClampsOutside) {
  const std::vector<std::pair<double, double>> points = {{256, 0.5}, {1024, 0.8}, {4096, 0.9}};
  EXPECT_DOUBLE_EQ(interpolate_log(points, 256), 0.5);
  EXPECT_DOUBLE_EQ(interpolate_log(points, 1024), 0.8);
  EXPECT_NEAR(interpolate_log(points, 512), std::sqrt(0.5 * 0.8), 1e-12);  // the log midpoint
  EXPECT_NEAR(interpolate_log(points, 2048), std::sqrt(0.8 * 0.9), 1e-12);
  EXPECT_DOUBLE_EQ(interpolate_log(points, 16), 0.5);      // below the first point: its value
  EXPECT_DOUBLE_EQ(interpolate_log(points, 1e6), 0.9);     // above the last
  EXPECT_DOUBLE_EQ(interpolate_log({{100, 0.7}}, 5), 0.7);
}

TEST(KernelRates, GroupedFactorReadsDeepGemmsRowsAgainstItsDenseProduct) {
  GroupedRateTable t;
  for (const char* gpu : {"A100", "H100", "H800", "H200"}) {
    ASSERT_TRUE(find_grouped_rate_table(gpu, &t)) << gpu;
    EXPECT_EQ(t.gpu, gpu);
    EXPECT_EQ(t.measured_on, "H800") << "only DeepGEMM's H800 rows are published";
  }
  EXPECT_FALSE(find_grouped_rate_table("B200", &t));
  ASSERT_TRUE(find_grouped_rate_table("H800", &t));
  // At a measured point: its TFLOP/s over the dense product's of the same (N, K) (1,304 at M 4,096).
  EXPECT_NEAR(grouped_expert_factor(t, 256, 4096, 7168), 932.0 / 1304, 1e-12);
  EXPECT_NEAR(grouped_expert_factor(t, 1024, 4096, 7168), 1233.0 / 1304, 1e-12);
  // Between 256 and 512 rows, in log space; 362 rows pad to 384 (three blocks of 128).
  const double mid = std::sqrt(256.0 * 512);
  EXPECT_NEAR(grouped_expert_factor(t, mid, 4096, 7168), std::sqrt(932.0 / 1304 * 1040.0 / 1304) * mid / 384, 1e-12);
  // Under the smallest measured point: its value, times the M block's padding.
  EXPECT_NEAR(grouped_expert_factor(t, 128, 4096, 7168), 932.0 / 1304, 1e-12);
  EXPECT_NEAR(grouped_expert_factor(t, 64, 4096, 7168), 932.0 / 1304 / 2, 1e-12);
  // The nearest measured shape: GPT-OSS's SwiGLU up product (2 x 2,880 by 2,880) reads 7168 x 2048's.
  EXPECT_NEAR(grouped_expert_factor(t, 512, 5760, 2880), 916.0 / 1025, 1e-12);
  // Never above the dense rate (7168 x 2048 at 4,096 rows publishes 1,093 against 1,025).
  EXPECT_DOUBLE_EQ(grouped_expert_factor(t, 4096, 7168, 2048), 1.0);
}

TEST(KernelRates, APublishedShapesExpertsArePricedAtTheGroupedRate) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("gpt-oss-120b", &in));
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  in.gpus = 8, in.batch = 8, in.efficiency = 0.5;
  PlanConfig c;
  c.dp = 8, c.micro_batch = 1, c.micro_batches = 1, c.zero = 1;
  const PlanResult with = evaluate_plan(in, c, true);
  ASSERT_EQ(with.invalid, "");
  const ModelShape& s = in.shape;
  // One sequence a rank, no EP: each of the 128 experts takes T x top-4 / 128 rows.
  const double rows = double(s.T) * s.top_k / s.experts;
  EXPECT_DOUBLE_EQ(with.expert_rows, rows);
  GroupedRateTable t;
  ASSERT_TRUE(find_grouped_rate_table("H100", &t));
  const double up = grouped_expert_factor(t, rows, 2.0 * s.expert_ffn, s.C);
  const double down = grouped_expert_factor(t, rows, s.C, s.expert_ffn);
  const double factor = 1 / (2.0 / 3 / up + 1.0 / 3 / down);
  EXPECT_NEAR(with.expert_rate_factor, factor, 1e-12);
  EXPECT_LT(factor, 0.9);

  // Without the table (a GPU it has no row for) the experts run at the dense rate: the compute falls
  // by the routed products' three passes at 1 / factor - 1 of their dense time.
  in.cluster.gpu = "";
  const PlanResult without = evaluate_plan(in, c, true);
  ASSERT_EQ(without.invalid, "");
  EXPECT_DOUBLE_EQ(without.expert_rate_factor, 1.0);
  const double routed_s = double(s.T) * s.moe_layers() * 2.0 * s.top_k * mlp_params(s, s.expert_ffn) /
                          (in.cluster.peak_flops * in.efficiency);
  EXPECT_NEAR(with.compute_s - without.compute_s, 3 * routed_s * (1 / factor - 1), 1e-9 * with.compute_s);
  EXPECT_GT(with.step_s, without.step_s);
}
