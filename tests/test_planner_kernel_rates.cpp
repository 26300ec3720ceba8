// test_planner_kernel_rates.cpp: the planner's kernel-rate table (common/planner/planner_kernel_rates.h): the
// log-space interpolation between published points and its clamps, the grouped experts' factor read
// from DeepGEMM's published rows (nearest shape, padding to the M block, never above the dense rate),
// a published shape's prediction pricing its routed experts at that factor; the dense products'
// ceiling and depth curve, flash attention's published bars, and a published shape's products priced
// by their depths.
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

  // Without the tables (a GPU they have no row for) the experts run at the dense rate and every product
  // at peak x efficiency: no share of the tables is reported, and the compute only falls (every table's
  // share and the grouped factor are at most 1).
  in.cluster.gpu = "";
  const PlanResult without = evaluate_plan(in, c, true);
  ASSERT_EQ(without.invalid, "");
  EXPECT_DOUBLE_EQ(without.expert_rate_factor, 1.0);
  EXPECT_DOUBLE_EQ(without.product_share, 0.0);
  EXPECT_GT(with.product_share, 0.0);
  EXPECT_LT(without.compute_s, with.compute_s);
}

TEST(KernelRates, DenseProductsReadTheCeilingAndFallWithTheContractionDepth) {
  DenseRateTable t;
  EXPECT_FALSE(find_dense_rate_table("B200", &t));
  ASSERT_TRUE(find_dense_rate_table("A100", &t));
  EXPECT_NEAR(t.ceiling(), 267.9 / 312, 1e-12);
  ASSERT_TRUE(find_dense_rate_table("H200", &t));
  EXPECT_NEAR(t.ceiling(), 821.0 / 989, 1e-12);
  ASSERT_TRUE(find_dense_rate_table("H800", &t));
  EXPECT_NEAR(t.ceiling(), 792.1 / 989, 1e-12);  // the H100's measurement: the same chip
  ASSERT_TRUE(find_dense_rate_table("H100", &t));
  const double ceiling = 792.1 / 989;
  // At the ceiling's own depth (2,816) and deeper: the ceiling.
  EXPECT_NEAR(dense_product_efficiency(t, 2816), ceiling, 1e-12);
  EXPECT_NEAR(dense_product_efficiency(t, 16384), ceiling, 1e-12);
  EXPECT_NEAR(dense_product_efficiency(t, 1e6), ceiling, 1e-12);
  // Shallower: DeepGEMM's rows (M 4,096) relative to the ceiling's depth, read in log space.
  const double w = std::log(2816.0 / 2048) / std::log(7168.0 / 2048);
  const double at_2816 = std::exp((1 - w) * std::log(1025.0 / 1358) + w * std::log(1304.0 / 1358));
  EXPECT_NEAR(dense_product_efficiency(t, 2048), ceiling * (1025.0 / 1358) / at_2816, 1e-12);
  EXPECT_NEAR(dense_product_efficiency(t, 512), ceiling * (590.0 / 1358) / at_2816, 1e-12);
  EXPECT_NEAR(dense_product_efficiency(t, 64), ceiling * (590.0 / 1358) / at_2816, 1e-12);  // clamped
  EXPECT_LT(dense_product_efficiency(t, 1024), dense_product_efficiency(t, 1536));
}

TEST(KernelRates, AttentionReadsThePublishedBarsByHeadSizeAndSequence) {
  AttentionRateTable t;
  EXPECT_FALSE(find_attention_rate_table("A100", "fa2", &t)) << "no per-shape A100 figures transcribed";
  EXPECT_FALSE(find_attention_rate_table("H100", "fa4", &t));
  ASSERT_TRUE(find_attention_rate_table("H100", "fa2", &t));
  // The causal panel (the default) and the unmasked one.
  EXPECT_NEAR(attention_kernel_efficiency(t, 128, 8192), 333.0 / 989, 1e-12);
  EXPECT_NEAR(attention_kernel_efficiency(t, 128, 8192, false), 370.0 / 989, 1e-12);
  EXPECT_NEAR(attention_kernel_efficiency(t, 128, 131072), 335.0 / 989, 1e-12);  // past 16K: the last bar
  EXPECT_NEAR(attention_kernel_efficiency(t, 64, 2048), 262.0 / 989, 1e-12);
  EXPECT_NEAR(attention_kernel_efficiency(t, 64, 2048, false), 318.0 / 989, 1e-12);
  EXPECT_NEAR(attention_kernel_efficiency(t, 128, std::sqrt(1024.0 * 2048)), std::sqrt(260.0 * 298) / 989, 1e-12);
  // Head size 256 has one panel: read for both.
  EXPECT_NEAR(attention_kernel_efficiency(t, 256, 16384, false), 298.0 / 989, 1e-12);
  // Between head sizes, in log space: 192 (DeepSeek-V3's 128 + 64 rotary) between 128 and 256.
  const double w = std::log(192.0 / 128) / std::log(2.0);
  EXPECT_NEAR(attention_kernel_efficiency(t, 192, 4096),
              std::exp((1 - w) * std::log(319.0 / 989) + w * std::log(293.0 / 989)), 1e-12);
  ASSERT_TRUE(find_attention_rate_table("H800", "cudnn", &t));
  EXPECT_NEAR(attention_kernel_efficiency(t, 128, 2048), 484.0 / 989, 1e-12);
  ASSERT_TRUE(find_attention_rate_table("H200", "fa3", &t));
  EXPECT_NEAR(attention_kernel_efficiency(t, 256, 16384), 642.0 / 989, 1e-12);
}

// A published dense shape's products, priced pass by pass: the forward at its depth K, the input
// gradient at N, the weight gradient at the rows; the FLOP-weighted share the prediction reports is
// the formula's over the layers' four products and the head.
TEST(KernelRates, APublishedShapesProductsArePricedByTheirDepths) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("mcore-1.7b", &in));
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  in.gpus = 8, in.batch = 8, in.efficiency = 0.6;
  PlanConfig c;
  c.dp = 8, c.micro_batch = 1, c.micro_batches = 1, c.zero = 1;
  const PlanResult r = evaluate_plan(in, c, true);
  ASSERT_EQ(r.invalid, "");
  const ModelShape& s = in.shape;
  DenseRateTable t;
  ASSERT_TRUE(find_dense_rate_table("H100", &t));
  const double rows = s.T, C = s.C;
  double flops = 0, weighted = 0;
  auto product = [&](double n, double k, double times) {
    const double f = 2 * n * k * times;
    flops += 3 * f;
    weighted += f * (dense_product_efficiency(t, k) + dense_product_efficiency(t, n) + dense_product_efficiency(t, rows));
  };
  product(3 * C, C, s.L);                  // Q, K, V
  product(C, C, s.L);                      // the output projection
  product(double(s.ffn), C, s.L);          // the MLP's up
  product(C, double(s.ffn), s.L);          // and down
  product(double(s.V), C, 1);              // the head
  EXPECT_NEAR(r.product_share, weighted / flops, 1e-12);
  EXPECT_LT(r.product_share, t.ceiling());  // C = 2,048 is shallower than the ceiling's 2,816
}

// The chapters' models on a GPU cluster: their FLOPs at the share of the dense table their products
// reach (dense_product_share, the FLOP-weighted mean over the three passes' depths), so the compute is
// exactly the table-less compute over that share; it is 1 where the GPU has no table.
TEST(KernelRates, AChaptersModelOnAGpuClusterRunsAtItsProductsShare) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("gpt2", &in));
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  in.gpus = 2, in.batch = 8, in.efficiency = 0.6;
  PlanConfig c;
  c.tp = 2, c.micro_batch = 8, c.micro_batches = 1;
  const PlanResult with = evaluate_plan(in, c, true);
  ASSERT_EQ(with.invalid, "");
  const double share = dense_product_share(shape_of(in.model), "H100", 2, 8.0 * in.model.T);
  EXPECT_GT(share, 0.3);
  EXPECT_LT(share, 792.1 / 989);  // GPT-2's C = 768 is far shallower than the ceiling's depth
  EXPECT_DOUBLE_EQ(dense_product_share(shape_of(in.model), "", 2, 8.0 * in.model.T), 1.0);
  in.cluster.gpu = "";
  const PlanResult without = evaluate_plan(in, c, true);
  EXPECT_NEAR(with.compute_s * share, without.compute_s, 1e-12 * without.compute_s);
}

// Attention under CP: a rank's diagonal blocks (1/cp of its work) run the causal kernel, the rest the
// unmasked one, each at the keys one call sees (the ring's T/cp); without CP the causal kernel at T.
TEST(KernelRates, AttentionUnderCpMixesTheCausalAndUnmaskedPanels) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("llama3-8b", &in));
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  in.attention_kernel = "fa2", in.efficiency = 0.6;
  in.gpus = 8, in.batch = 8;
  set_sequence_length(&in, 8192);
  PlanConfig c;
  c.dp = 8, c.micro_batch = 1, c.micro_batches = 1, c.zero = 3, c.recompute = Recompute::Full;
  PlanResult r = evaluate_plan(in, c, true);
  ASSERT_EQ(r.invalid, "");
  EXPECT_NEAR(r.attention_share, 333.0 / 989, 1e-12);  // causal, 8K keys
  set_sequence_length(&in, 4 * 16384);
  in.batch = 4;
  c.dp = 4, c.cp = 2;
  r = evaluate_plan(in, c, true);
  ASSERT_EQ(r.invalid, "");
  AttentionRateTable t;
  ASSERT_TRUE(find_attention_rate_table("H100", "fa2", &t));
  const double causal = attention_kernel_efficiency(t, 128, 32768, true);
  const double unmasked = attention_kernel_efficiency(t, 128, 32768, false);
  EXPECT_NEAR(r.attention_share, 1 / (0.5 / causal + 0.5 / unmasked), 1e-12);
  EXPECT_GT(r.attention_share, causal);
}

// Attention's backward at the FA3 paper's backward bars: its rate against the forward's unmasked one
// (the causal forward times that), clamped to the measured head sizes; a published shape's backward
// is 2.5 x the forward's FLOPs at that rate.
TEST(KernelRates, AttentionsBackwardReadsThePublishedBackwardBars) {
  AttentionRateTable t;
  ASSERT_TRUE(find_attention_rate_table("H100", "fa2", &t));
  EXPECT_NEAR(attention_backward_factor(t, 128, 8192), 318.0 / 370, 1e-12);
  EXPECT_NEAR(attention_backward_factor(t, 64, 512), 198.0 / 282, 1e-12);
  EXPECT_NEAR(attention_backward_factor(t, 256, 16384), 322.0 / 370, 1e-12);  // 256: 128's bars
  ASSERT_TRUE(find_attention_rate_table("H100", "cudnn", &t));
  EXPECT_NEAR(attention_backward_factor(t, 128, 131072), 516.0 / 595, 1e-12);  // past 16K: the last bars

  PlanInputs in;
  ASSERT_TRUE(set_plan_model("llama3-8b", &in));
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  in.attention_kernel = "fa2", in.efficiency = 0.6;
  in.gpus = 8, in.batch = 8;
  set_sequence_length(&in, 8192);
  PlanConfig c;
  c.dp = 8, c.micro_batch = 1, c.micro_batches = 1, c.zero = 3;
  const PlanResult table = evaluate_plan(in, c, true);
  ASSERT_TRUE(find_attention_rate_table("H100", "fa2", &t));
  const double forward_rate = 989e12 * 0.6 * attention_kernel_efficiency(t, 128, 8192);
  in.attention_efficiency = 0.6 * attention_kernel_efficiency(t, 128, 8192);  // the same forward, backward at it
  const PlanResult flat = evaluate_plan(in, c, true);
  double flops = 0;
  for (int l = 0; l < in.shape.L; l++) flops += 8192.0 * layer_attention_flops(in.shape, l);
  const double factor = attention_backward_factor(t, 128, 8192);
  EXPECT_NEAR(table.compute_s - flat.compute_s, 2.5 * flops / forward_rate * (1 / factor - 1), 1e-9 * table.compute_s);
}
