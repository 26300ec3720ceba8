// test_mixed_precision.cpp: chapter 13 (13_mixed_precision/train), run as a user runs it.
//   - --precision fp32 is chapter 01's run on one rank: the losses, norms and parameters (1e-5).
//   - bf16, fp16 (2 ranks) and fp8 with delayed scaling (4 ranks) equal the same recipe on one rank within the format's
//     tolerance (docs/mixed_precision.md derives it: a quarter of the forward format's unit roundoff
//     u = 2^-(m+1), relative, per step: bf16 2^-10, fp16 2^-13, fp8 E4M3 2^-6); every rank records the
//     same loss scale and the same scales at every step.
//   - fp16's dynamic loss scale: a scale too large for fp16 overflows, the step is skipped (applied
//     false), the scale halves; after --loss-scale-window clean steps it doubles.
//   - the operands each product reads per step, their bytes (fp8's LM head in bf16), and the model
//     state (4 + 4 + 8 bytes a parameter: the master is the model's own fp32 copy), equal their
//     formulas; so does 03's table (theory record).
//   - a recipe that cannot run, or a flag of another recipe, is refused with one line naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "training_harness.h"

namespace {

constexpr int kSteps = 3;

void expect_equal_on_every_rank(const std::string& path, int ranks, int steps) {
  for (const char* key : {"loss_scale", "scales_fingerprint", "scale_weights", "scale_activations", "scale_gradients"}) {
    const auto values = precision_field(path, key);
    ASSERT_EQ(values.size(), size_t(ranks * steps)) << key;
    for (int s = 0; s < steps; s++)
      for (int r = 1; r < ranks; r++) EXPECT_EQ(values.at({s, r}), values.at({s, 0})) << key << " step " << s << " rank " << r;
  }
}

TEST(MixedPrecision, Fp32IsChapter01OnOneRank) {
  expect_trains_like_one_rank_of_01("13_mixed_precision", 2, "--precision fp32", "tiny", "", 10, 1e-5);
}

TEST(MixedPrecision, AnyGridEqualsOneRankWithinTheFormat) {
  struct Case {
    std::string recipe;
    int ranks;
    double tolerance;
  };
  const Case cases[] = {{"--precision bf16", 2, std::ldexp(1.0, -10)},
                        {"--precision fp16", 2, std::ldexp(1.0, -13)},
                        {"--precision fp8 --fp8-scaling delayed", 4, std::ldexp(1.0, -6)}};
  const std::string dir = temp_dir();
  int i = 0;
  for (const Case& c : cases) {
    const std::string one = dir + "/one" + std::to_string(i) + ".jsonl", many = dir + "/many" + std::to_string(i) + ".jsonl";
    i++;
    const std::string common = c.recipe + " --steps " + std::to_string(kSteps);
    RunResult a = run_trainer("13_mixed_precision", 1, common + " --json " + one);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    RunResult b = run_trainer("13_mixed_precision", c.ranks, common + " --json " + many);
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_LE(max_relative_difference(read_losses(many), read_losses(one)), c.tolerance) << c.recipe;
    expect_equal_on_every_rank(many, c.ranks, kSteps);
    expect_theory_matches(many, 4);  // 03's table: the model state as in fp32, the gradients in 2 bytes (bf16, fp16)
  }
}

TEST(MixedPrecision, Fp16SkipsAnOverflowedStepAndHalvesTheScale) {
  // 2^22: the gradients, all-reduced in fp16 at the loss scale (weight gradients up to about 1, halved
  // by the average before the send), pass 65504: skipped until the scale is below ~2^18.
  const std::string path = temp_dir() + "/fp16.jsonl";
  RunResult r = run_trainer("13_mixed_precision", 2,
                            "--precision fp16 --loss-scale-init 4194304 --loss-scale-window 2 --steps 10 --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto applied = precision_field(path, "applied");
  const auto scale = precision_field(path, "loss_scale");
  expect_equal_on_every_rank(path, 2, 10);
  ASSERT_EQ(applied.at({0, 0}), 0) << "2^22 must overflow fp16";
  EXPECT_EQ(scale.at({0, 0}), std::ldexp(1.0, 21));
  double previous = std::ldexp(1.0, 22);
  int clean = 0, skipped = 0;
  for (int s = 0; s < 10; s++) {
    const double now = scale.at({s, 0});
    if (applied.at({s, 0}) == 0) {
      skipped++;
      clean = 0;
      EXPECT_EQ(now, previous / 2) << "step " << s;
    } else if (++clean == 2) {
      clean = 0;
      EXPECT_EQ(now, previous * 2) << "step " << s;
    } else {
      EXPECT_EQ(now, previous) << "step " << s;
    }
    previous = now;
  }
  EXPECT_GE(skipped, 3);
  EXPECT_LT(skipped, 10) << "the scale must come down to where fp16 holds the gradients";
  EXPECT_NE(r.output.find("step skipped"), std::string::npos);
  EXPECT_NE(r.output.find("a window of clean steps: loss scale now"), std::string::npos) << "the growth is said too";
}

TEST(MixedPrecision, OperandsAndModelStateEqualTheirFormulas) {
  const std::string path = temp_dir() + "/fp8.jsonl";
  RunResult r = run_trainer("13_mixed_precision", 2, "--precision fp8 --fp8-scaling row --steps 2 --grad-accum 2 --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string summary = read_record(path, "precision_summary");
  ASSERT_FALSE(summary.empty()) << r.output;
  const std::string run = read_record(path, "run");
  const double P = number_field(run, "padded_params");
  // The operand formulas, written from the shapes here (tiny: L=2, C=64, V=256, T=64, 8 sequences over 2
  // ranks and 2 micro-batches: N = 256 tokens per rank per step).
  const double L = 2, C = 64, V = 256, N = 8.0 / 2 * 64, micro = 2;
  EXPECT_EQ(number_field(summary, "activations_values_per_step"), 2 * N * (7 * L * C + C));
  EXPECT_EQ(number_field(summary, "weights_values_per_step"), 2 * micro * (12 * L * C * C + V * C));
  EXPECT_EQ(number_field(summary, "gradients_values_per_step"), 2 * N * (9 * L * C + V));
  // Their bytes as the products read them: E4M3 activations and weights, E5M2 gradients, 1 byte
  // each, but the LM head's operands (2NC, 2VC a micro-batch, 2NV) in bf16, 2 bytes.
  EXPECT_EQ(number_field(summary, "activations_bytes_per_step"), 2 * N * 7 * L * C + 2 * 2 * N * C);
  EXPECT_EQ(number_field(summary, "weights_bytes_per_step"), 2 * micro * 12 * L * C * C + 2 * 2 * micro * V * C);
  EXPECT_EQ(number_field(summary, "gradients_bytes_per_step"), 2 * N * 9 * L * C + 2 * 2 * N * V);
  for (const char* kind : {"activations", "weights", "gradients"})
    EXPECT_EQ(number_field(summary, std::string(kind) + "_bytes_per_step"),
              number_field(summary, std::string(kind) + "_bytes_formula"))
        << kind;
  EXPECT_EQ(number_field(summary, "params_bytes"), 4 * P);  // the fp32 master; the casts live in the products
  EXPECT_EQ(number_field(summary, "grads_bytes"), 4 * P);
  EXPECT_EQ(number_field(summary, "optim_bytes"), 8 * P);
  expect_theory_matches(path, 4);
}

TEST(MixedPrecision, RefusesWhatCannotRunNamingTheFlag) {
  struct Case {
    std::string args, flag;
  };
  const Case cases[] = {{"--precision fp9", "--precision"},
                        {"--precision bf16 --fp8-scaling row", "--fp8-scaling"},
                        {"--precision fp8 --loss-scale 8", "--loss-scale"},
                        {"--precision fp8 --fp8-grad bf16", "--fp8-grad"},
                        {"--precision fp16 --loss-scale-window 0", "--loss-scale-window"},
                        {"--precision fp16 --dtype bf16", "--dtype"}};
  for (const Case& c : cases) {
    const int ranks = &c == &cases[0] ? 2 : 1;  // refused on every rank: once with two
    RunResult r = run_trainer("13_mixed_precision", ranks, c.args + " --steps 2");
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.flag), std::string::npos) << c.args << ": " << r.output;
    EXPECT_EQ(r.output.find("step 0"), std::string::npos) << c.args << ": refused after the work began";
  }
}

}  // namespace
