// test_ulysses.cpp: Ulysses sequence parallelism (common/parallel/ulysses_attention.h) end to end, through the
// real trainer binaries. In chapter 10 alone (--cp 1) and inside the ring (--cp 2, USP), on 2 and 4
// ranks, and in chapter 12 with TP and full recomputation, the ring, PP with ZeRO-1 and dualpipev's
// pairs at once, and DP with EP, it
// trains to the same losses, gradient norms and final parameters as one rank (of 01; of 11 for the MoE
// grid); every rank's bytes sent in its all-to-alls equal docs/theory.md's formula (section 13b),
// computed here from the shapes; the ring beside it carries 1/u of its blocks' channels; the
// activations, the exchange's buffers included, equal their formula; and its checkpoints resume on
// other grids and chapters. Its refusals: test_refusals.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>

#include "base/metrics.h"  // format_bytes: the table's figures
#include "training_harness.h"

namespace {

constexpr double kTolerance = 1e-5;  // fp32, relative

struct UlyssesCase {
  std::string chapter;
  int ranks;
  std::string flags;
  std::string name;
  int u, cp, dp;  // the grid: dp x cp x u ranks
  int tp = 1, pp = 1;
  std::string preset = "tiny";
  int micro_batches = 2;  // 12's --micro-batches
  int steps = 4;          // enough for the loss to fall by 0.5 (tall's: 10)
};

void PrintTo(const UlyssesCase& c, std::ostream* out) { *out << c.chapter << " on " << c.ranks << " ranks, " << c.flags; }

class UlyssesEquivalence : public testing::TestWithParam<UlyssesCase> {};

// The figures of docs/ulysses.md's equivalence table: the largest relative difference of a step's
// loss, and the final parameters' relative L2 difference, against one rank of 01.
void print_equivalence(const UlyssesCase& c, const std::string& flags, const std::string& jsonl) {
  const Baseline& base = one_rank_of_01(c.preset, "", c.steps);
  const std::string ckpt = jsonl.substr(0, jsonl.size() - std::string("run.jsonl").size()) + "run.ckpt";
  std::printf("equivalence | %s | %d | %s | loss %.2g | params %.2g\n", c.chapter.c_str(), c.ranks, flags.c_str(),
              max_relative_difference(read_losses(jsonl), base.losses),
              relative_l2_difference(checkpoint_params(ckpt), base.params));
}

// What Ulysses can get wrong, each silently: a head's channels taken from another head's place in q,
// k or v; the positions gathered out of order (the causal mask compares them); a log-sum-exp read
// back in the wrong layout by the backward; the gradients traded back to the wrong rank's positions.
TEST_P(UlyssesEquivalence, TrainsLikeOneRankAndSendsItsFormulasBytes) {
  const UlyssesCase c = GetParam();
  const std::string jsonl = expect_trains_like_one_rank_of_01(c.chapter, c.ranks, c.flags, "tiny", "", c.steps, kTolerance);
  expect_theory_matches(jsonl, /*param_bytes=*/4);
  print_equivalence(c, c.flags, jsonl);

  // tiny: L 2, C 64, NH 4, T 64, a global batch of 8; K micro-batches of 8 / (dp K) sequences.
  const int L = 2 / c.pp, C = 64 / c.tp, K = c.flags.find("--grad-accum 2") != std::string::npos ? 2 : 1;
  const int T = 64 / (c.u * c.cp), B = 8 / (c.dp * K);
  const int passes = c.flags.find("--recompute full") != std::string::npos ? 2 : 1;
  const double value = 4, share = double(c.u - 1) / c.u;  // fp32; an exchange sends all but the own 1/u
  const double forward = passes * (3 + 1) * share * L * K * B * T * C * value;  // q, k, v out; the output back
  const double backward = (5 + 3) * share * L * K * B * T * C * value;  // q, k, v, out, dout out; dq, dk, dv back
  const std::string ulysses = read_record(jsonl, "ulysses");
  ASSERT_FALSE(ulysses.empty()) << "no ulysses record in " << jsonl;
  EXPECT_EQ(number_field(ulysses, "ulysses"), c.u);
  EXPECT_DOUBLE_EQ(number_field(ulysses, "theory_forward_bytes"), forward) << ulysses;
  EXPECT_DOUBLE_EQ(number_field(ulysses, "theory_backward_bytes"), backward) << ulysses;
  // The same in the theory table, from the Ulysses group's counters over the step.
  const std::string theory = read_record(jsonl, "theory");
  EXPECT_DOUBLE_EQ(number_field(theory, "measured_ulysses_bytes"), forward + backward) << theory;
  EXPECT_DOUBLE_EQ(number_field(theory, "theory_ulysses_bytes"), forward + backward) << theory;
  for (int q = 0; q < c.ranks; q++) {
    const std::string k = "rank" + std::to_string(q) + "_";
    EXPECT_DOUBLE_EQ(number_field(ulysses, k + "forward_bytes"), forward) << "rank " << q << ": " << ulysses;
    EXPECT_DOUBLE_EQ(number_field(ulysses, k + "backward_bytes"), backward) << "rank " << q << ": " << ulysses;
    EXPECT_EQ(number_field(ulysses, k + "exchanges"), double(L * K * (2 * passes + 4))) << ulysses;
  }
  // The ring around it moves blocks of the ring place's T/cp positions on C/u channels: 2(cp-1)/cp of
  // K and V forward, twice that backward.
  const std::string ring = read_record(jsonl, "ring");
  ASSERT_FALSE(ring.empty()) << "no ring record in " << jsonl;
  const double kv = double(L) * K * B * 64 * (C / c.u) * value;
  EXPECT_DOUBLE_EQ(number_field(ring, "theory_forward_bytes"), passes * 2.0 * (c.cp - 1) / c.cp * kv) << ring;
  for (int q = 0; q < c.ranks; q++) {
    const std::string k = "rank" + std::to_string(q) + "_";
    EXPECT_EQ(number_field(ring, k + "forward_bytes"), number_field(ring, "theory_forward_bytes")) << ring;
    EXPECT_EQ(number_field(ring, k + "backward_bytes"), number_field(ring, "theory_backward_bytes")) << ring;
  }
}

std::vector<UlyssesCase> cases() {
  return {
      {"10_context_parallel", 2, "--cp 1 --ulysses 2", "ch10_u2", 2, 1, 1},
      {"10_context_parallel", 4, "--cp 2 --ulysses 2 --grad-accum 2", "ch10_u2_ring2_accum", 2, 2, 1},
  };
}

INSTANTIATE_TEST_SUITE_P(Grids, UlyssesEquivalence, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<UlyssesCase>& info) { return info.param.name; });

// Ulysses' bytes per rank and step by docs/theory.md's formula (section 13b), computed here: on a rank's
// T/(u cp) positions of the preset (`tiny` and `moe-tiny`: L 2, C 64, T 64; `tall`: L 8, C 32, T 32;
// each a batch of 8), its L' blocks and C/t channels, m micro-batches of 8 / (dp m) sequences.
double ulysses_bytes(const UlyssesCase& c, int m, bool full_recompute) {
  const bool tall = c.preset == "tall";
  const double share = double(c.u - 1) / c.u, passes = full_recompute ? 2 : 1;
  const double L = (tall ? 8 : 2) / c.pp, B = 8 / (c.dp * m), T = (tall ? 32 : 64) / (c.u * c.cp),
               C = (tall ? 32 : 64) / c.tp;
  return (4 * passes + 8) * share * L * m * B * T * C * 4;
}

// Chapter 12: Ulysses composed with TP (NH/(t u) heads a rank) and full recomputation, the ring, PP
// with ZeRO-1 and dualpipev's pairs at once (a Ulysses group and a ring per lane), and DP with EP: the
// same training as one rank (01's; 11's for a MoE preset, with the same tokens routed), and every
// group's bytes, Ulysses' included, their formulas.
class UlyssesIn12 : public testing::TestWithParam<UlyssesCase> {};

TEST_P(UlyssesIn12, TrainsLikeOneRankAndEveryGroupSendsItsFormulasBytes) {
  const UlyssesCase c = GetParam();
  const int m = c.micro_batches;
  const std::string flags = c.flags + " --micro-batches " + std::to_string(m);
  std::string jsonl;
  if (c.preset != "moe-tiny") {
    jsonl = expect_trains_like_one_rank_of_01(c.chapter, c.ranks, flags, c.preset, "", c.steps, kTolerance);
    print_equivalence(c, flags, jsonl);
  } else {  // against one rank of 11 with the same micro-batches: the same losses, parameters and routing
    const std::string dir = temp_dir();
    RunResult one = run_trainer("11_expert_parallel", 1, "--preset moe-tiny --steps 3 --grad-accum 2 --json " + dir +
                                                             "/one.jsonl --save " + dir + "/one.bin");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    RunResult grid = run_trainer(c.chapter, c.ranks, "--preset moe-tiny --steps 3 " + flags + " --json " + dir +
                                                         "/run.jsonl --save " + dir + "/run.bin");
    ASSERT_EQ(grid.exit_code, 0) << grid.output;
    jsonl = dir + "/run.jsonl";
    EXPECT_LE(max_relative_difference(read_losses(jsonl), read_losses(dir + "/one.jsonl")), kTolerance);
    EXPECT_LE(relative_l2_difference(checkpoint_params(dir + "/run.bin"), checkpoint_params(dir + "/one.bin")), kTolerance);
    EXPECT_EQ(expert_counts(jsonl, "routed"), expert_counts(dir + "/one.jsonl", "routed"));
    std::printf("equivalence | %s | %d | %s | loss %.2g | params %.2g (against 11)\n", c.chapter.c_str(), c.ranks,
                flags.c_str(), max_relative_difference(read_losses(jsonl), read_losses(dir + "/one.jsonl")),
                relative_l2_difference(checkpoint_params(dir + "/run.bin"), checkpoint_params(dir + "/one.bin")));
  }
  expect_theory_matches(jsonl, /*param_bytes=*/4);
  if (c.flags.find("dualpipev") != std::string::npos) {  // its pairs ran at once: a Ulysses group per lane
    EXPECT_FALSE(read_records(jsonl, "pipeline_pairs").empty()) << jsonl;
  }
  const std::string groups = read_record(jsonl, "groups");
  ASSERT_FALSE(groups.empty()) << "no groups record in " << jsonl;
  const double ulysses = ulysses_bytes(c, m, c.flags.find("--recompute full") != std::string::npos);
  const std::string theory = read_record(jsonl, "theory");  // rank 0's, in the theory table
  EXPECT_DOUBLE_EQ(number_field(theory, "measured_ulysses_bytes"), ulysses) << theory;
  EXPECT_DOUBLE_EQ(number_field(theory, "theory_ulysses_bytes"), ulysses) << theory;
  for (int q = 0; q < c.ranks; q++) {
    const std::string k = "rank" + std::to_string(q) + "_";
    EXPECT_DOUBLE_EQ(number_field(groups, k + "ulysses"), ulysses) << groups;
    EXPECT_DOUBLE_EQ(number_field(groups, k + "ulysses_theory"), ulysses) << groups;
    for (const char* name : {"tp", "cp", "dp_cp"})
      EXPECT_NEAR(number_field(groups, k + name), number_field(groups, k + name + "_theory"),
                  1e-9 * number_field(groups, k + name + "_theory") + 0.5) << name << " in " << groups;
  }
}

std::vector<UlyssesCase> cases_12() {
  return {
      {"12_5d_parallel", 4, "--tp 2 --ulysses 2 --recompute full", "tp2_u2_full", 2, 1, 1, 2},
      {"12_5d_parallel", 4, "--cp 2 --ulysses 2", "cp2_u2", 2, 2, 1},
      {"12_5d_parallel", 4, "--pp 2 --ulysses 2 --zero1 --schedule dualpipev", "pp2_u2_zero1_dualpipev", 2, 1, 1, 1, 2,
       "tall", 4, 10},
      {"12_5d_parallel", 4, "--ep 2 --ulysses 2", "dp2_u2_ep2_moe", 2, 1, 2, 1, 1, "moe-tiny"},
  };
}

INSTANTIATE_TEST_SUITE_P(Grids, UlyssesIn12, testing::ValuesIn(cases_12()),
                         [](const testing::TestParamInfo<UlyssesCase>& info) { return info.param.name; });

// At u = 4 (4 ranks, alone, with full recomputation: the forward's exchanges twice), without the
// comparison with one rank: the activations' formula, computed here: the exchange's buffers are 14 B T C
// fp32 values on the T positions a rank holds (q, k, v and their gradients in the head layout, the
// output and its gradient, a send and a receive buffer of q, k, v), whatever u; the table prints them.
// And every rank's bytes, (u-1)/u of each exchange.
TEST(UlyssesOfFour, BuffersAndBytesAreTheirFormulas) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer("10_context_parallel", 4,
                            "--preset tiny --steps 2 --cp 1 --ulysses 4 --recompute full --json " + dir + "/run.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double B = 8, T = 64 / 4, C = 64;
  const std::string expected = "the exchange's buffers 14 B T C x 4 = " + format_bytes(14 * B * T * C * 4);
  EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  const std::string theory = read_record(dir + "/run.jsonl", "theory");
  EXPECT_EQ(number_field(theory, "measured_activations_bytes"), number_field(theory, "theory_activations_bytes")) << theory;
  const UlyssesCase c{"10_context_parallel", 4, "", "", 4, 1, 1};
  const std::string ulysses = read_record(dir + "/run.jsonl", "ulysses");
  ASSERT_FALSE(ulysses.empty()) << r.output;
  for (int q = 0; q < 4; q++) {
    const std::string k = "rank" + std::to_string(q) + "_";
    EXPECT_DOUBLE_EQ(number_field(ulysses, k + "forward_bytes") + number_field(ulysses, k + "backward_bytes"),
                     ulysses_bytes(c, 1, /*full_recompute=*/true)) << ulysses;
  }
}

}  // namespace

// Checkpoints hold whole tensors, whatever the grid: saved by 10 under --ulysses 2, the run resumes on
// one rank of 01, on 10's ring alone (--cp 2) and in 12 with TP beside Ulysses, and continues the
// uninterrupted losses; 01's checkpoint resumes in 10 under Ulysses inside the ring.
TEST(UlyssesCheckpoints, ResumeOnOtherGridsAndChapters) {
  expect_checkpoints_cross_grids({"10_context_parallel", 2, "--ulysses 2"},
                                 {{"01_vanilla_dp", 1, ""}, {"10_context_parallel", 2, "--cp 2"},
                                  {"12_5d_parallel", 4, "--tp 2 --ulysses 2"}},
                                 {"10_context_parallel", 4, "--cp 2 --ulysses 2"}, "--preset tiny", 4, kTolerance);
}
