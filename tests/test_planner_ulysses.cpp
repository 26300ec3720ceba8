// test_planner_ulysses.cpp: the planner's sixth dimension, Ulysses (common/planner/planner_ulysses.h;
// docs/theory.md, section 13b). On chapter 10's grids its memory is the chapters' own account of the
// arena on T/(u cp) positions, the ring's blocks and the exchange's buffers (ring_attention.h,
// ulysses_attention.h); its bytes and its time are the formulas, computed here; a published shape's
// search considers u only where the heads split whole inside a node; and the command line refuses a u
// that does not split the heads, naming --ulysses.
#include <gtest/gtest.h>

#include <string>

#include "parallel/theory.h"            // activation_bytes
#include "ops/ring_attention.h"         // ring_buffer_bytes
#include "parallel/ulysses_attention.h"  // ulysses_buffer_bytes: the chapters' account of the exchange's buffers
#include "planner/plan_published.h"     // one_command
#include "planner/planner.h"
#include "training_harness.h"  // run_command

namespace {

PlanInputs emulated(const std::string& preset, int gpus, int batch) {
  PlanInputs in;
  EXPECT_TRUE(set_plan_model(preset, &in));
  EXPECT_TRUE(find_cluster("emulated", &in.cluster));
  in.gpus = gpus, in.batch = batch, in.efficiency = 1;
  return in;
}

PlanConfig context_grid(int dp, int cp, int u, int B, Recompute rc = Recompute::None) {
  PlanConfig c{dp, 1, 1, Schedule::OneFOneB, 1, B, 1, 0, rc, false};
  c.cp = cp, c.ulysses = u;
  return c;
}

// One all-to-all of S bytes over u ranks on the link: (u-1) (alpha + S/(u beta)), seconds.
double all_to_all_s(const LinkModel& link, double S, int u) {
  return (u - 1) * (link.latency_us * 1e-6 + S / u * 8 / (link.gbps * 1e9));
}

}  // namespace

// Chapter 10 at --cp 1 --ulysses 2 and --cp 2 --ulysses 2 (USP), and with full recomputation: the
// activations are the arena on n = T/(u cp) positions with a log-sum-exp, the ring's blocks of those
// positions, and 14 B n C x 4 of the exchange; the bytes (4 passes + 8) (u-1)/u L K B n C x 4; the time
// each exchange's all-to-all on the link, nothing hidden.
TEST(PlannerUlysses, ChapterTensGridsAreTheChaptersAccountAndTheFormulas) {
  for (const auto& [gpus, cp, u, rc] : std::vector<std::tuple<int, int, int, Recompute>>{
           {2, 1, 2, Recompute::None}, {4, 2, 2, Recompute::None}, {2, 1, 2, Recompute::Full}, {4, 1, 4, Recompute::None}}) {
    SCOPED_TRACE("cp " + std::to_string(cp) + " u " + std::to_string(u) + " recompute " + recompute_name(rc));
    PlanInputs in = emulated("small", gpus, 8);
    in.cluster.inter_node = LinkModel{5, 5};
    const PlanConfig c = context_grid(gpus / (cp * u), cp, u, 8 / (gpus / (cp * u)), rc);
    const PlanResult r = evaluate_plan(in, c);
    ASSERT_EQ(r.invalid, "");
    const GPT2Config& m = in.model;
    GPT2Config held = m;
    held.T = m.T / (cp * u);
    held.recompute = rc;
    const int B = c.micro_batch;
    EXPECT_DOUBLE_EQ(r.memory.activations, activation_bytes(held, B, DType::F32, true) +
                                               ring_buffer_bytes(cp, B, held.T, m.C, m.NH) +
                                               ulysses_buffer_bytes(B, held.T, m.C));
    const double passes = rc == Recompute::Full ? 2 : 1;
    const double position_bytes = double(m.L) * c.micro_batches * B * held.T * m.C * 4;
    EXPECT_DOUBLE_EQ(r.ulysses_bytes, (4 * passes + 8) * (u - 1) / u * position_bytes);
    const double S = double(B) * held.T * m.C * 4;  // one part's send buffer
    const LinkModel& link = in.cluster.inter_node;
    const double per_block = passes * (all_to_all_s(link, 3 * S, u) + all_to_all_s(link, S, u)) +
                             2 * all_to_all_s(link, 3 * S, u) + 2 * all_to_all_s(link, S, u);
    EXPECT_NEAR(r.ulysses_s, m.L * c.micro_batches * per_block, 1e-9 * r.ulysses_s);
    EXPECT_GE(r.cp_s, r.ulysses_s);
    EXPECT_NE(one_command(in, c).find(" --ulysses " + std::to_string(u)), std::string::npos);
  }
  // u that does not split the heads (small: 4) or a place's positions is refused, naming the flag.
  PlanInputs in = emulated("small", 3, 9);
  EXPECT_NE(evaluate_plan(in, context_grid(1, 1, 3, 9)).invalid.find("--ulysses 3"), std::string::npos);
}

// A published shape: the bytes of DeepSpeed-Ulysses' exchange (q, k, v to heads and the output back,
// the gradients the other way), with grouped-query attention's key/value heads; and the search tries
// u only where NH/(t u) is whole and t u fits in a node.
TEST(PlannerUlysses, APublishedShapesSearchConsidersUlyssesWhereTheHeadsSplit) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("llama3-8b", &in));
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  set_sequence_length(&in, 65536);
  in.gpus = 8, in.batch = 8, in.efficiency = 0.6;
  PlanConfig c{1, 2, 1, Schedule::OneFOneB, 1, 1, 8, 3, Recompute::Full, true};
  c.ulysses = 4;
  const PlanResult r = evaluate_plan(in, c);
  ASSERT_EQ(r.invalid, "");
  const ModelShape& s = in.shape;
  const double tokens = 65536.0 / 4, hd = s.hd();
  // A TP rank holds NH/2 = 16 query heads and KV/2 = 4 key/value heads: one of each a Ulysses rank.
  const double qkv = 4 * tokens * (16.0 / 4 + 2 * 1) * hd * 2, out = tokens * 16 * hd * 2;
  EXPECT_NEAR(r.ulysses_bytes, 8 * s.L * 3 * (qkv + out) * 3 / 4, 1e-9 * r.ulysses_bytes);
  EXPECT_GT(r.ulysses_s, 0);
  SearchSpace space;
  space.zero = {3};
  space.recompute = {Recompute::Full};
  space.micro_batch = {1};
  bool any = false;
  for (const PlanResult& p : search_plans(in, space)) {
    if (p.config.ulysses == 1) continue;
    any = true;
    EXPECT_EQ(s.NH % (p.config.tp * p.config.ulysses), 0) << p.config.describe();
    EXPECT_LE(p.config.tp * p.config.ulysses, in.cluster.gpus_per_node) << p.config.describe();
  }
  EXPECT_TRUE(any);
}

TEST(PlanFlags, UlyssesIsAFlagRefusedWhereItDoesNotSplitTheHeads) {
  RunResult r = run_command("./09_3d_parallel/plan --one --model small --cluster emulated --gpus 4 --batch 8 --cp 2 "
                            "--ulysses 2",
                            60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dp 1 tp 1 pp 1 cp 2 u 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Ulysses 2 (x ring 2): each rank holds T/(u cp) = 32 positions"), std::string::npos) << r.output;
  r = run_command("./09_3d_parallel/plan --one --model small --cluster emulated --gpus 3 --batch 9 --ulysses 3", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--ulysses 3: the 4 heads over tp 1 do not split into 3 whole groups"), std::string::npos)
      << r.output;
  r = run_command("./09_3d_parallel/plan --model small --cluster emulated --gpus 2 --batch 8 --ulysses 0", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--ulysses must be positive"), std::string::npos) << r.output;
}

// The exchanges' packing and unpacking are memcpy: on a cluster that gives its memory bandwidth they
// add, per block and micro-batch, (2 x 4 + 1) forward and (2 x 8 + 3) backward values a position and
// channel, read and written, at that bandwidth; nothing at the elementwise rate (plan-check's ulysses2
// came out +27% to +123% when they were priced as activation bytes).
TEST(PlannerUlysses, TheExchangesCopiesRunAtTheMemoryBandwidth) {
  PlanInputs in = emulated("small", 2, 8);
  in.cluster.inter_node = LinkModel{5, 5};
  in.cluster.peak_flops = 1e10, in.cluster.elementwise_rate = 1e8;
  const PlanConfig c = context_grid(1, 1, 2, 8);
  const PlanResult without = evaluate_plan(in, c);
  in.cluster.memory_bandwidth = 5e9;
  const PlanResult with = evaluate_plan(in, c);
  ASSERT_EQ(with.invalid, "");
  const GPT2Config& m = in.model;
  const double values = 8.0 * m.T / 2 * m.C;  // B n C a block
  // forward 4 parts packed and unpacked, each read and written, and the output zero-filled: 2 x 2 x 4 + 1;
  // backward 8 parts so, and q, k, v's gradients zero-filled: 2 x 2 x 8 + 3
  const double bytes = m.L * values * 4 * ((2 * 2 * 4 + 1) + (2 * 2 * 8 + 3));
  EXPECT_NEAR(with.compute_s - without.compute_s, bytes / 5e9, 1e-9);
}
