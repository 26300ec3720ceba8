// test_planner_cpu_rates.cpp: the two terms `make plan-check` measures for a chapters' model on CPU
// ranks (common/planner/planner_cpu_rates.h). The products are timed by class of rows (ops.h: a
// product of N rows adds 2 N C OC FLOPs to class floor(log2 N)), and the planner prices each product
// at its class's rate: the dense ones on a micro-batch's B T rows, an expert's on its share of the
// routed rows. The ring's hops are laid on chapter 10's steps as RingAttention sends them: forward each
// beside the attention on the block it sends; backward the block and the accumulator sent at the end
// of the step before share the rank's sending lane during a step; the last accumulator meets no
// compute. And the work besides the products counts the backward's scratch once a block. Expected values
// are computed here from those descriptions, not with the planner's code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "comm/comm.h"  // modelled_ms's alpha-beta, written out below
#include "ops/ops.h"
#include "pipeline/pipeline.h"  // balanced_partition, parts_of_rank
#include "planner/planner.h"
#include "planner/planner_cpu_rates.h"

namespace {

PlanInputs emulated(const std::string& preset, int gpus) {
  PlanInputs in;
  EXPECT_TRUE(find_plan_model(preset, &in.model));
  EXPECT_TRUE(find_cluster("emulated", &in.cluster));
  in.gpus = gpus, in.batch = 8, in.efficiency = 1;
  in.cluster.peak_flops = 1e10;
  in.cluster.elementwise_rate = 1e30;  // the work besides the products costs nothing here
  return in;
}

PlanConfig one_config(int dp, int pp, int micro_batch, int micro_batches) {
  PlanConfig c;
  c.dp = dp, c.pp = pp, c.micro_batch = micro_batch, c.micro_batches = micro_batches;
  return c;
}

}  // namespace

TEST(ProductRates, AProductTakesItsRowsClassOrTheNearestMeasured) {
  ProductRates r;
  std::string why;
  ASSERT_TRUE(parse_product_rates("512:6e10,128:5e10", &r, &why)) << why;
  EXPECT_EQ(r.at(512), 6e10);
  EXPECT_EQ(r.at(1023), 6e10);  // the class of 512 holds 512..1023 rows
  EXPECT_EQ(r.at(4096), 6e10);  // above every class: the highest
  EXPECT_EQ(r.at(128), 5e10);
  EXPECT_EQ(r.at(255), 5e10);
  EXPECT_EQ(r.at(256), 5e10);  // between 128's and 512's classes, one apart from each: the lower
  EXPECT_EQ(r.at(1), 5e10);
  for (const char* bad : {"512", "512:0", "0:1e10", "512:x", "512:1e10,600:2e10", "", "512:1e10,"}) {
    ProductRates unused;
    EXPECT_FALSE(parse_product_rates(bad, &unused, &why)) << bad;
  }
}

TEST(ProductRates, EachProductIsCountedInTheClassOfItsRows) {
  const int C = 16, OC = 8;
  for (int N : {1, 100, 300}) {
    std::vector<float> inp(size_t(N) * C, 0.5f), weight(size_t(OC) * C, 0.25f), out(size_t(N) * OC), dinp(inp.size()),
        dweight(weight.size()), dout(out.size(), 1.0f);
    const MatmulByRows before = cpu_matmul_by_rows();
    matmul_forward(make_view(out.data(), {N, OC}), make_view(inp.data(), {N, C}), make_view(weight.data(), {OC, C}),
                   Tensor{});
    matmul_backward(make_view(dinp.data(), {N, C}), make_view(dweight.data(), {OC, C}), Tensor{},
                    make_view(dout.data(), {N, OC}), make_view(inp.data(), {N, C}), make_view(weight.data(), {OC, C}));
    const MatmulByRows after = cpu_matmul_by_rows();
    const int b = int(std::floor(std::log2(double(N))));
    EXPECT_EQ(matmul_row_class(N), b);
    for (int k = 0; k < kMatmulRowClasses; k++) {
      // forward, the input's gradient, the weight's: 2 N C OC FLOPs each
      EXPECT_EQ(after.flops[k] - before.flops[k], k == b ? 3 * 2.0 * N * C * OC : 0.0) << "N " << N << " class " << k;
      EXPECT_GE(after.ms[k], before.ms[k]);
    }
  }
}

// moe-small at --ep 2 on 2 ranks, B 4 a rank: the dense products (attention's, the router, the head) on
// 4 T = 512 rows, each expert on the rows of both ranks routed to it, 4 T k ep / E = 256 balanced; with
// the work besides the products free, the step's compute is the two sums at their classes' rates.
TEST(ProductRates, ThePlannerPricesDenseAndExpertProductsAtTheirRowsRates) {
  PlanInputs in = emulated("moe-small", 2);
  const GPT2Config& m = in.model;
  PlanConfig c = one_config(2, 1, 4, 1);
  c.ep = 2;
  const double dense_rate = 4e10, expert_rate = 6e10, tokens = 4.0 * m.T;
  std::string why;
  ASSERT_TRUE(parse_product_rates("512:4e10,256:6e10,64:1e9", &in.product_rates, &why)) << why;
  for (double load : {1.0, 1.38}) {  // 1.38 x 256 = 353 rows: the same class
    in.expert_load = load;
    const PlanResult r = evaluate_plan(in, c);
    ASSERT_EQ(r.invalid, "");
    const double C = m.C;
    // per token, forward: q k v 6C^2, the projection 2C^2, the router 2 C E a block; the head 2 C V
    const double dense = m.L * (8 * C * C + 2 * C * m.experts) + 2 * C * m.V;
    const double experts = m.L * load * m.top_k * 16 * C * C;  // k experts' two products of C x 4C
    const double expected = 3 * tokens * (dense / dense_rate + experts / expert_rate);
    EXPECT_NEAR(r.compute_s, expected, 1e-6 * expected) << "load " << load;
  }
  // Without rates by rows every product runs at peak x efficiency, as before.
  in.product_rates = ProductRates{};
  in.expert_load = 1;
  const double C = m.C;
  const double all = m.L * (8 * C * C + 2 * C * m.experts + m.top_k * 16 * C * C) + 2 * C * m.V;
  EXPECT_NEAR(evaluate_plan(in, c).compute_s, 3 * tokens * all / 1e10, 1e-6 * 3 * tokens * all / 1e10);
}

// A pipeline's micro-batch is shorter than a data-parallel rank's batch: pp 2 with m 4 runs B 2, 256
// rows, and takes the class of 256; DP's B 4 the class of 512.
TEST(ProductRates, APipelinesMicroBatchTakesTheRateOfItsRows) {
  PlanInputs in = emulated("small", 2);
  std::string why;
  ASSERT_TRUE(parse_product_rates("512:4e10,256:2e10", &in.product_rates, &why)) << why;
  const double dp = evaluate_plan(in, one_config(2, 1, 4, 1)).compute_s;
  in.product_rates = ProductRates{};
  in.cluster.peak_flops = 4e10;
  EXPECT_NEAR(dp, evaluate_plan(in, one_config(2, 1, 4, 1)).compute_s, 1e-12);
  ASSERT_TRUE(parse_product_rates("512:4e10,256:2e10", &in.product_rates, &why)) << why;
  const double pipeline = evaluate_plan(in, one_config(1, 2, 2, 4)).compute_s;
  in.product_rates = ProductRates{};
  in.cluster.peak_flops = 2e10;
  EXPECT_NEAR(pipeline, evaluate_plan(in, one_config(1, 2, 2, 4)).compute_s, 1e-12);
}

// The ring's steps as chapter 10's RingAttention runs them (hop h, a step's attention f forward and g
// backward), listed step by step for cp 2 and 4.
TEST(RingOverlap, TheHopsExposedAreWhatTheAttentionOnTheirStepDoesNotHide) {
  const double h = 10, f = 3, g = 7.5;
  // cp 2. Forward: step 0 sends its block while computing with it; step 1 sends nothing. Backward:
  // step 0 sends the block; step 1 sends nothing during its compute, then its accumulator, which the
  // peer waits for with nothing left to compute.
  RingExposure two = ring_exposed(2, h, f, g);
  EXPECT_DOUBLE_EQ(two.forward, h - f);
  EXPECT_DOUBLE_EQ(two.backward, (h - g) + h);
  // cp 4. Forward: steps 0, 1, 2 each send a block. Backward, messages on the lane during each step:
  // step 0 the block; 1 the block; 2 the block and step 1's accumulator; 3 step 2's accumulator; then
  // step 3's accumulator, exposed.
  RingExposure four = ring_exposed(4, h, f, g);
  EXPECT_DOUBLE_EQ(four.forward, 3 * (h - f));
  EXPECT_DOUBLE_EQ(four.backward, (h - g) + (h - g) + (2 * h - g) + (h - g) + h);
  // Attention longer than a hop hides every hop but the last accumulator.
  EXPECT_DOUBLE_EQ(ring_exposed(4, h, 11, 25).forward, 0);
  EXPECT_DOUBLE_EQ(ring_exposed(4, h, 11, 25).backward, h);
  // Free attention hides nothing: 3 (cp - 1) hops, the ring's messages.
  EXPECT_DOUBLE_EQ(ring_exposed(4, h, 0, 0).forward + ring_exposed(4, h, 0, 0).backward, 9 * h);
  EXPECT_DOUBLE_EQ(ring_exposed(1, h, 0, 0).backward, 0);
}

// The planner's CP term for chapter 10's cp 2 on the slow emulated link: a hop is 2 B n C fp32 values
// at 0.5 Gb/s after 50 us; a step's attention is half the rank's causal pairs, B NH n T/2 pairs at 4 hs
// FLOPs forward (10 backward), at the attention kernel's rate.
TEST(RingOverlap, ThePlannersContextTermHidesTheHopsBehindTheAttentionAtItsRate) {
  PlanInputs in = emulated("small", 2);
  in.cluster.inter_node = LinkModel{0.5, 50};
  const GPT2Config& m = in.model;
  PlanConfig c = one_config(1, 1, 8, 1);
  c.cp = 2;
  const double n = m.T / 2.0, B = 8;
  const double hop = 50e-6 + 2 * B * n * m.C * 4 * 8 / 0.5e9;
  for (double attention_rate : {1e8, 1e9, 1e12}) {
    in.attention_rate = attention_rate;
    const PlanResult r = evaluate_plan(in, c);
    ASSERT_EQ(r.invalid, "");
    const double pairs = B * m.NH * n * m.T / 2, hs = double(m.C) / m.NH;
    const double f = pairs * 4 * hs / 2 / attention_rate, g = pairs * 10 * hs / 2 / attention_rate;
    const double per_block = std::max(0.0, hop - f) + std::max(0.0, hop - g) + hop;
    EXPECT_NEAR(r.cp_s, m.L * per_block, 1e-9) << "attention at " << attention_rate;
  }
  // Without a measured rate the attention is timed at the products' (peak x efficiency).
  in.attention_rate = 0;
  const double at_peak = evaluate_plan(in, c).cp_s;
  in.attention_rate = 1e10;
  EXPECT_DOUBLE_EQ(at_peak, evaluate_plan(in, c).cp_s);
}

// The work besides the products, on a CPU cluster: activation bytes at the elementwise rate, with the
// backward's scratch (the arena with no slot) counted once for every block, since each block's backward
// writes it. A pipeline's rank runs its blocks in m passes (v chunks each): counted once a pass, it
// was charged m v scratches for data parallelism's one, 1.22 times the bytes for the same blocks and
// sequences at pp 2 and m 4. Here a rank of pp 2 (m 4, B 2) is charged what its chunks hold, and about
// what a rank of dp 2 (B 4, every block) is: both run L/2 blocks' worth of 8 sequences.
TEST(ElementwiseWork, TheBackwardsScratchIsWorkOnceABlock) {
  PlanInputs in = emulated("small", 2);
  in.cluster.peak_flops = 1e30, in.cluster.elementwise_rate = 1;  // compute_s is the bytes
  const GPT2Config& m = in.model;
  auto work = [&](int B, const ModelPart& part) {
    ModelPart none = part;
    none.slots = 0;
    const int blocks = std::min(part.last(m), m.L) - (std::max(part.first_unit, 1) - 1);
    return activation_bytes(m, B, DType::F32, false, {}, part) +
           (blocks - 1) * activation_bytes(m, B, DType::F32, false, {}, none);
  };
  const double dp = evaluate_plan(in, one_config(2, 1, 4, 1)).compute_s;
  EXPECT_NEAR(dp, work(4, ModelPart{}), 1e-9 * dp);
  for (Schedule s : {Schedule::OneFOneB, Schedule::Interleaved}) {
    const int v = s == Schedule::Interleaved ? 2 : 1;
    PlanConfig c = one_config(1, 2, 2, 4);
    c.schedule = s, c.virtual_stages = v;
    double slowest = 0;
    for (int rank = 0; rank < 2; rank++) {
      double rank_work = 0;
      for (ModelPart part : parts_of_rank(m, balanced_partition(m, 2 * v), 2, rank)) {
        part.slots = 1;
        rank_work += 4 * work(2, part);
      }
      slowest = std::max(slowest, rank_work);
    }
    const PlanResult r = evaluate_plan(in, c);
    ASSERT_EQ(r.invalid, "");
    EXPECT_NEAR(r.compute_s, slowest, 1e-9 * slowest) << schedule_name(s);
    EXPECT_LT(r.compute_s / dp, 1.12) << schedule_name(s) << ": the same blocks and sequences as a rank of dp 2";
    EXPECT_GT(r.compute_s / dp, 0.9) << schedule_name(s);
  }
}
