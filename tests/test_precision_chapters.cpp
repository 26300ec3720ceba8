// test_precision_chapters.cpp: --precision in chapters 01-12 (common/training/mixed_precision.h), run as a user runs them.
//   - chapter 03 under fp16 (its loss scale applied at the products) equals chapter 13 (which scales
//     the loss) bit for bit: the same recipe, skipped steps and loss scales on the same grid.
//   - DP (02), ZeRO-3, tensor parallelism, TP with a pipeline, DP x CP, and 12 (TP with SP beside DP; ZeRO-1 and
//     ZeRO-2 over DP, its per-group table beside the formula), on 2 and 4 ranks, under bf16,
//     fp16 and fp8 (delayed), equal one rank of 01 under the same recipe within the format's
//     tolerance (docs/mixed_precision.md derives it), and every rank records the same loss scale and
//     delayed scales at every step.
//   - the operands each product reads per step equal their formula under ZeRO-3 (the whole model on
//     every rank), as in chapter 13.
//   - the collectives move the format's bytes beside their formulas: tensor parallelism's activations
//     (sequence parallel: all-gathers and reduce-scatters; without: all-reduces) in 2 bytes, and
//     under sequence parallelism the sums of the gradients held whole in 2 too, ZeRO-3's fp8 weights
//     in 1 and its bf16 gradients in 2.
//   - the pre-run memory forecast counts the codes the recipe's collectives stage (03 and 13 under fp16).
//   - ZeRO-1's and ZeRO-2's gathers of the updated parameters move the matrices in the recipe's
//     weights format (bf16 2 bytes, fp8 1) and the rest in fp32, beside their formula, and tensor
//     parallelism without sequence parallelism all-reduces its activations in bf16, and a pipeline's
//     messages and its tied wte's sum over the stages travel in bf16, on 2 ranks; each run equals one rank within the format's tolerance,
//     and its staged codes stay within the communication buffers' bound.
//   - a resumed run continues the uninterrupted one exactly: the loss scale and the amax histories are
//     saved beside the checkpoint.
//   - a mixture of experts (11 at --ep 2 on 2 and 4 ranks, 12 at EP 2 beside TP 2 on 4) under bf16, fp16
//     and fp8 equals one rank of 11 under the same recipe within the format's tolerance, each expert's
//     scales the same on the ranks that hold it, its all-to-alls and gradient all-reduces in 2 bytes
//     beside their formulas.
//   - every recipe trains at a head size FlashAttention does not take (attention stays fp32).
//   - a flag that cannot compose with a recipe, or a --dtype beside it, is refused in one line naming
//     the flags.
// (fp32 stays each chapter's own test: no line of it changed.)
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "training_harness.h"

namespace {

constexpr int kSteps = 3;

// The loss scale is the same on every rank; the delayed scales on every rank of a pipeline stage,
// which hold parts of the same tensors (PP is the outermost axis of the grid: stage = rank / (ranks/pp)).
void expect_equal_on_every_rank(const std::string& path, int ranks, int steps, int pp = 1) {
  for (const char* key : {"loss_scale", "scales_fingerprint", "scale_weights", "scale_activations", "scale_gradients"}) {
    const auto values = precision_field(path, key);
    ASSERT_EQ(values.size(), size_t(ranks * steps)) << key;
    const int stage_ranks = std::string(key) == "loss_scale" ? ranks : ranks / pp;
    for (const auto& [step_rank, value] : values) {
      const auto [s, r] = step_rank;
      const int first = r / stage_ranks * stage_ranks;  // the first rank of r's stage
      EXPECT_EQ(value, values.at({s, first})) << key << " step " << s << " rank " << r;
    }
  }
}

TEST(PrecisionChapters, Chapter03UnderFp16IsChapter13) {
  // A scale of 2^30 overflows fp16 at first: the skipped steps and the halvings must match too.
  const std::string dir = temp_dir();
  const std::string args = "--precision fp16 --loss-scale-init 1073741824 --loss-scale-window 2 --steps 4 --json ";
  RunResult a = run_trainer("03_bucket_dp", 2, args + dir + "/03.jsonl");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = run_trainer("13_mixed_precision", 2, args + dir + "/13.jsonl");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(max_relative_difference(read_losses(dir + "/03.jsonl"), read_losses(dir + "/13.jsonl")), 0.0);
  EXPECT_EQ(precision_field(dir + "/03.jsonl", "loss_scale"), precision_field(dir + "/13.jsonl", "loss_scale"));
  EXPECT_NE(a.output.find("step skipped"), std::string::npos) << a.output;
  // The pre-run memory forecast counts the codes the gradients' all-reduce stages (fp16: g = 2 bytes
  // a padded element, DP's bound, docs/theory.md, section 3; nothing else is transient under DP),
  // in 13 (which installs its formats before the run) as in 03, and the staging stays within it.
  for (const std::string name : {"03", "13"}) {
    const std::string path = dir + "/" + name + ".jsonl";
    const std::string run = read_record(path, "run"), theory = read_record(path, "theory");
    ASSERT_FALSE(run.empty() || theory.empty()) << name;
    EXPECT_EQ(number_field(run, "forecast_transient_bytes"), 2 * number_field(theory, "padded_params")) << name;
    EXPECT_EQ(number_field(run, "forecast_transient_bytes"), number_field(theory, "theory_transient_bytes_at_most"));
    EXPECT_GT(number_field(theory, "measured_transient_bytes"), 0) << name << ": no codes staged";
    EXPECT_LE(number_field(theory, "measured_transient_bytes"), number_field(run, "forecast_transient_bytes")) << name;
  }
}

// The emulated products' scratch beside its formula (docs/theory.md, section 18, "The emulation's
// scratch"), for tiny (C 64, V 256) with N = B x T tokens a micro-batch; the widest products are fc's
// projection (4C -> C) and the head (C -> V): rounded operands N max(4C, V) and
// max(4C max(C, N), C max(V, N)), the transposed copy max(4C C, C V, N max(4C, V)), the result as
// large as the second operand, and under fp16 the scaled gradient N max(4C, V). Exact where every rank
// runs the whole model; where the grid splits it, what the buffers hold stays within it.
// A mixture of experts adds its experts' fc and projection over M rows, the most one expert can take
// (`expert_rows`; 0: a dense model): M 4C to the first, 4C max(C, M) and C max(4C, M) to the second
// and the result, M 4C to the transposed copy.
void expect_precision_scratch_matches(const std::string& path, bool fp16, double expert_rows = 0) {
  const std::string run = read_record(path, "run"), theory = read_record(path, "theory");
  ASSERT_FALSE(run.empty() || theory.empty()) << path;
  const double C = 64, V = 256, N = number_field(run, "micro_batch") * 64, M = expert_rows;
  const double first = std::max(N * std::max(4 * C, V), M * 4 * C);
  const double second =
      std::max({4 * C * std::max(C, N), C * std::max(V, N), 4 * C * std::max(C, M), C * std::max(4 * C, M)});
  const double transposed = std::max({4 * C * C, C * V, N * std::max(4 * C, V), M * 4 * C});
  const double formula = 4 * (first + second + transposed + second + (fp16 ? first : 0));
  EXPECT_EQ(number_field(theory, "theory_precision_scratch_bytes"), formula) << path;
  const double measured = number_field(theory, "measured_precision_scratch_bytes");
  if (number_field(theory, "theory_precision_scratch_exact") != 0) EXPECT_EQ(measured, formula) << path;
  else EXPECT_LE(measured, formula) << path;
  EXPECT_GT(measured, 0) << path;
}

TEST(PrecisionChapters, AnyGridEqualsOneRankWithinTheFormat) {
  struct Recipe {
    std::string flags;
    double tolerance;  // relative, per step (docs/mixed_precision.md)
  };
  const std::map<std::string, Recipe> recipes = {{"bf16", {"--precision bf16", std::ldexp(1.0, -10)}},
                                                 {"fp16", {"--precision fp16", std::ldexp(1.0, -13)}},
                                                 {"fp8", {"--precision fp8 --fp8-scaling delayed", std::ldexp(1.0, -6)}}};
  struct Case {
    std::string chapter, recipe;
    int ranks;
    std::string grid;
    int pp;
  };
  // fp16 on 4 ranks: the gradients' fp16 sums at the loss scale, added by chapter 00's collectives
  // (which once read fp16 codes as bf16's: 8e-4 from one rank).
  const Case cases[] = {{"02_overlap_dp", "fp16", 4, "--collectives ring", 1},
                        {"06_zero3", "fp8", 4, "", 1},
                        {"07_tensor_parallel", "fp16", 2, "--tp 2 --sequence-parallel", 1},
                        // DP 2 x TP 2 under delayed fp8: each history's amax over both groups, the
                        // same scales on every rank though each holds a slice of the tensors.
                        {"07_tensor_parallel", "fp8", 4, "--tp 2 --sequence-parallel", 1},
                        {"09_3d_parallel", "bf16", 4, "--tp 2 --pp 2", 2},  // tensor parallelism and a pipeline
                        {"10_context_parallel", "fp8", 4, "--cp 2", 1},  // DP 2 x CP 2: the amaxes over both
                        {"12_5d_parallel", "bf16", 4, "--tp 2 --sequence-parallel", 1},
                        {"12_5d_parallel", "bf16", 4, "--zero1", 1},  // ZeRO over DP x CP: 12's own groups table
                        {"12_5d_parallel", "bf16", 4, "--zero2", 1},
                        {"12_5d_parallel", "fp8", 4, "--zero2", 1}};
  const std::string dir = temp_dir();
  std::map<std::string, LossCurve> one_rank;
  for (const auto& [name, recipe] : recipes) {
    const std::string path = dir + "/one_" + name + ".jsonl";
    RunResult r = run_trainer("01_vanilla_dp", 1, recipe.flags + " --steps " + std::to_string(kSteps) + " --json " + path);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    one_rank[name] = read_losses(path);
  }
  int i = 0;
  for (const Case& c : cases) {
    const Recipe& recipe = recipes.at(c.recipe);
    const std::string path = dir + "/many" + std::to_string(i++) + ".jsonl";
    RunResult r = run_trainer(c.chapter, c.ranks, recipe.flags + " " + c.grid + " --steps " + std::to_string(kSteps) +
                                                      " --json " + path);
    ASSERT_EQ(r.exit_code, 0) << c.chapter << ": " << r.output;
    EXPECT_LE(max_relative_difference(read_losses(path), one_rank.at(c.recipe)), recipe.tolerance)
        << c.chapter << " on " << c.ranks << " ranks, " << recipe.flags;
    expect_equal_on_every_rank(path, c.ranks, kSteps, c.pp);
    expect_precision_scratch_matches(path, c.recipe == "fp16");
    // The collectives move the format's bytes (docs/theory.md, section 18, "Communication in the
    // format"): tensor parallelism's activations and their gradients 2 bytes an element, each row
    // beside its formula.
    const bool zero = c.grid.find("--zero") != std::string::npos;
    if (c.chapter != "06_zero3" && !zero) expect_theory_matches(path, 4);
    if (zero) {
      // 12's own table of every rank's groups under ZeRO-1 and ZeRO-2 (docs/theory.md, sections 17
      // and 18): m bf16 reduce-scatters of the gradients (one under ZeRO-1), then the gather of the
      // updated parameters, the blocks' matrices Ψm = 12LC^2 in the weights' b bytes (bf16 2, fp8
      // 1), the rest in fp32: (N-1)/N (2 m Ψ + b Ψm + 4(Ψ - Ψm)), Ψ the padded flat length. A rank
      // sends its own pieces, whose share of the blocks' 13C layernorm and bias elements is its own:
      // within (N-1)(4 - b) 13LC of the mean. fp32 bytes anywhere would be far outside.
      const std::string groups = read_record(path, "groups"), theory = read_record(path, "theory");
      ASSERT_FALSE(groups.empty() || theory.empty()) << r.output;
      const double L = 2, C = 64, N = c.ranks, matrices = 12 * L * C * C, b = c.recipe == "fp8" ? 1 : 2;
      const double psi = number_field(theory, "padded_params");
      const double m = c.grid == "--zero2" ? number_field(read_record(path, "run"), "grad_accum") : 1;
      const double formula = (N - 1) / N * (2 * m * psi + b * matrices + 4 * (psi - matrices));
      const double slack = (N - 1) * (4 - b) * 13 * L * C + 64;
      EXPECT_NEAR(number_field(theory, "theory_comm_bytes"), formula, 1.0) << c.grid << ", " << recipe.flags;
      for (int q = 0; q < c.ranks; q++) {
        const std::string group = "rank" + std::to_string(q) + "_dp_cp";
        EXPECT_NEAR(number_field(groups, group + "_theory"), formula, 1.0) << group << " " << c.grid << ", " << recipe.flags;
        EXPECT_NEAR(number_field(groups, group), formula, slack) << group << " " << c.grid << ", " << recipe.flags;
      }
      EXPECT_GT((N - 1) / N * (4 - b) * matrices, 4 * slack);  // the check tells the weights' format from fp32
      EXPECT_GT((N - 1) / N * 2 * psi, 4 * slack);             // and the gradients' from fp32
    } else if (c.chapter == "12_5d_parallel") {
      // 12's own table of every rank's groups: TP's collectives with the sums of the gradients held
      // whole, and DP's all-reduce, in bf16, each beside its formula (rounded to whole bytes per call).
      const std::string groups = read_record(path, "groups");
      ASSERT_FALSE(groups.empty()) << r.output;
      for (const std::string group : {"rank0_tp", "rank3_tp", "rank0_dp_cp", "rank3_dp_cp"})
        EXPECT_NEAR(number_field(groups, group), number_field(groups, group + "_theory"), 200) << group;
    }
    if (c.chapter == "07_tensor_parallel") {
      // Sequence parallelism: per micro-batch (10L + 5) gathers and scatters of BTC in fp16 (2 bytes)
      // and the loss's 3 fp32 all-reduces of BT; per step the (6L + 3) sums of the gradients held
      // whole, 6LC + 2C + TC elements, in the gradient format too, 2 bytes (fp32 would add as many).
      const std::string run = read_record(path, "run"), theory = read_record(path, "theory");
      const double L = 2, C = 64, T = 64, t = 2, B = number_field(run, "micro_batch");
      const double m = number_field(run, "grad_accum"), held_whole = 6 * L * C + 2 * C + T * C;
      const double formula = m * ((10 * L + 5) * (t - 1) / t * B * T * C * 2 + 3 * 2 * (t - 1) / t * B * T * 4) +
                             2 * (t - 1) / t * held_whole * 2;
      EXPECT_NEAR(number_field(theory, "theory_tp_comm_bytes"), formula, 1.0);
      EXPECT_NEAR(number_field(theory, "measured_tp_comm_bytes"), formula, 2 * (6 * L + 3 + m * (10 * L + 8)));
      EXPECT_GT(2 * (t - 1) / t * held_whole * 2, 4 * 2 * (6 * L + 3 + m * (10 * L + 8)));  // it tells 2 bytes from 4
    }
    if (c.chapter == "06_zero3") {
      // ZeRO-3 gathers fp8 matrices (1 byte), the rest of each layer fp32, and reduce-scatters bf16
      // gradients: K(N-1)/N (2(Ψm + 4(Ψ-Ψm)) + 2Ψ), Ψm = 12LC^2. Rank 0's own pieces hold the blocks'
      // 13C layernorm and bias elements in their own proportion: within 2K(N-1) x 3 x 13LC of it,
      // plus the padding's fp32 bytes. bf16 weights would send K(N-1)/N 2Ψm more, far outside.
      const std::string theory = read_record(path, "theory");
      const double blocks = 2, width = 64, ranks = 4, psi = number_field(theory, "params");
      const double padding = number_field(theory, "padded_params") - psi, matrices = 12 * blocks * width * width;
      const double formula = (ranks - 1) / ranks * (2 * (matrices + 4 * (psi - matrices)) + 2 * psi);
      const double slack = 2 * (ranks - 1) * 3 * 13 * blocks * width + 10 * padding;
      EXPECT_NEAR(number_field(theory, "theory_comm_bytes"), formula, 1.0);
      EXPECT_NEAR(number_field(theory, "measured_comm_bytes"), formula, slack);
      EXPECT_GT((ranks - 1) / ranks * 2 * matrices, 4 * slack);  // the check tells fp8 weights from bf16
      // Every rank runs the whole model: the operands equal their formula
      // (theory.md, section 18; tiny: L=2, C=64, V=256, T=64; 8 sequences over 4 ranks: N = 128 tokens)
      const std::string summary = read_record(path, "precision_summary");
      ASSERT_FALSE(summary.empty()) << r.output;
      const double L = 2, C = 64, V = 256, N = 8.0 / 4 * 64;
      EXPECT_EQ(number_field(summary, "activations_values_per_step"), 2 * N * (7 * L * C + C));
      EXPECT_EQ(number_field(summary, "weights_values_per_step"), 2 * (12 * L * C * C + V * C));
      EXPECT_EQ(number_field(summary, "gradients_values_per_step"), 2 * N * (9 * L * C + V));
    }
  }
}

TEST(PrecisionChapters, ZeroGathersAndTensorParallelAllReducesMoveTheFormatsBytes) {
  struct Recipe {
    std::string flags;
    double weight_bytes, tolerance;  // the gathered matrices' bytes; relative loss, per step (docs/mixed_precision.md)
  };
  const Recipe recipes[] = {{"--precision bf16", 2, std::ldexp(1.0, -10)},
                            {"--precision fp8 --fp8-scaling delayed", 1, std::ldexp(1.0, -6)}};
  const std::string dir = temp_dir();
  const double L = 2, C = 64, N = 2, matrices = 12 * L * C * C;  // tiny: Ψm = 12LC^2
  int i = 0;
  for (const Recipe& recipe : recipes) {
    const std::string steps = " --steps " + std::to_string(kSteps) + " --json ";
    const std::string one = dir + "/one" + std::to_string(i) + ".jsonl";
    RunResult base = run_trainer("01_vanilla_dp", 1, recipe.flags + steps + one);
    ASSERT_EQ(base.exit_code, 0) << base.output;
    for (const std::string chapter : {"04_zero1", "05_zero2", "07_tensor_parallel", "08_pipeline"}) {
      const std::string path = dir + "/" + chapter + std::to_string(i) + ".jsonl";
      const bool tp = chapter == "07_tensor_parallel", pp = chapter == "08_pipeline";
      RunResult r = run_trainer(chapter, 2, recipe.flags + (tp ? " --tp 2" : pp ? " --pp 2" : "") + steps + path);
      ASSERT_EQ(r.exit_code, 0) << chapter << ": " << r.output;
      EXPECT_LE(max_relative_difference(read_losses(path), read_losses(one)), recipe.tolerance)
          << chapter << ", " << recipe.flags;
      const std::string theory = read_record(path, "theory");
      EXPECT_LE(number_field(theory, "measured_transient_bytes"), number_field(theory, "theory_transient_bytes_at_most"))
          << chapter << ": the staged codes beyond the communication buffers' bound";
      // That bound, the staging included, is the pre-run forecast's: a recipe is judged before the work.
      EXPECT_EQ(number_field(read_record(path, "run"), "forecast_transient_bytes"),
                number_field(theory, "theory_transient_bytes_at_most"))
          << chapter;
      if (tp) {  // the all-reduces of whole (B, T, C) activations, 2 bytes an element, and every other row
        expect_theory_matches(path, 4);
        continue;
      }
      if (pp) {  // each stage sends one message per micro-batch, the (B/m, T, C) stream, in bf16: BTC x 2
        const std::string stage = read_record(path, "pipeline_stage");  // stage 0: rank 0
        ASSERT_FALSE(stage.empty()) << r.output;
        const double B = 8, T = 64;
        EXPECT_EQ(number_field(stage, "theory_p2p_bytes"), B * T * C * 2);
        EXPECT_EQ(number_field(stage, "measured_p2p_bytes"), B * T * C * 2);
        // The tied wte's gradient summed over the two stages in bf16: 2(2-1)/2 x VC x 2 (fp32: x 4).
        const std::string pipeline = read_record(path, "pipeline");
        const double V = 256;
        EXPECT_EQ(number_field(pipeline, "theory_embedding_bytes"), V * C * 2);
        EXPECT_EQ(number_field(pipeline, "measured_embedding_bytes"), V * C * 2);
        continue;
      }
      // A bf16 reduce-scatter of the gradients, then the gather: (N-1)/N (2Ψ + b Ψm + 4(Ψ - Ψm)).
      // Rank 0 sends its own pieces, whose share of the blocks' 13C layernorm and bias elements is
      // its own: within (N-1)(4 - b) 13LC of the mean, plus the padding's fp32 bytes; an fp32 gather
      // would send (N-1)/N (4 - b) Ψm more, far outside.
      const double psi = number_field(theory, "params"), padding = number_field(theory, "padded_params") - psi;
      const double formula = (N - 1) / N * (2 * psi + recipe.weight_bytes * matrices + 4 * (psi - matrices));
      const double slack = (N - 1) * (4 - recipe.weight_bytes) * 13 * L * C + 4 * padding + 64;
      EXPECT_NEAR(number_field(theory, "theory_comm_bytes"), formula, 1.0) << chapter << ", " << recipe.flags;
      EXPECT_NEAR(number_field(theory, "measured_comm_bytes"), formula, slack) << chapter << ", " << recipe.flags;
      EXPECT_GT((N - 1) / N * (4 - recipe.weight_bytes) * matrices, 4 * slack);  // the check tells the formats apart
    }
    i++;
  }
}

TEST(PrecisionChapters, AResumedRunKeepsTheLossScaleAndTheAmaxHistories) {
  // fp16 from 2^30 with a window of 2 (the scale moves every step), in 03 and in chapter 13's own
  // lines, and delayed fp8 on a pipeline (each stage's histories): the run that saved half-way is the uninterrupted
  // one, and the resumed run must continue its losses and loss scales exactly. Without the saved
  // state, fp16 would start again from 2^30 and skip steps the uninterrupted run did not.
  struct Case {
    std::string chapter;
    int ranks;
    std::string args, checkpoint;
  };
  const std::string dir = temp_dir();
  const Case cases[] = {{"03_bucket_dp", 2, "--precision fp16 --loss-scale-init 1073741824 --loss-scale-window 2", "/c{step}.bin"},
                        {"08_pipeline", 2, "--precision fp8 --fp8-scaling delayed --pp 2", "/d{step}/"},
                        {"13_mixed_precision", 1, "--precision fp16 --loss-scale-init 1073741824 --loss-scale-window 2",
                         "/m{step}.bin"}};
  for (const Case& c : cases) {
    const std::string full = dir + "/full_" + c.chapter + ".jsonl", resumed = dir + "/resumed_" + c.chapter + ".jsonl";
    RunResult a = run_trainer(c.chapter, c.ranks,
                              c.args + " --steps 6 --save-every 3 --save " + dir + c.checkpoint + " --json " + full);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    std::string half = dir + c.checkpoint;
    half.replace(half.find("{step}"), 6, "3");
    RunResult b = run_trainer(c.chapter, c.ranks, c.args + " --steps 6 --resume " + half + " --json " + resumed);
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("precision: resumed"), std::string::npos) << b.output;
    if (c.args.find("fp16") != std::string::npos) {  // the scale as the other scale lines print it
      const size_t at = b.output.find("precision: resumed the loss scale (");
      ASSERT_NE(at, std::string::npos) << b.output;
      const std::string line = b.output.substr(at, b.output.find('\n', at) - at);
      EXPECT_NE(line.find(" = 2^"), std::string::npos) << line;
    }
    const LossCurve whole = read_losses(full), rest = read_losses(resumed);
    ASSERT_EQ(whole.losses.size(), 6u);
    ASSERT_EQ(rest.losses.size(), 3u);
    for (int s = 0; s < 3; s++) EXPECT_EQ(rest.losses[size_t(s)], whole.losses[size_t(s + 3)]) << c.chapter << " step " << s + 3;
    const auto scales = precision_field(full, "loss_scale"), resumed_scales = precision_field(resumed, "loss_scale");
    for (const auto& [step_rank, scale] : resumed_scales) EXPECT_EQ(scale, scales.at(step_rank)) << c.chapter;
    expect_equal_on_every_rank(resumed, c.ranks, 3, c.chapter == "08_pipeline" ? 2 : 1);  // the records of steps 3-5
  }
}

// A mixture of experts under each recipe (chapter 11, moe-tiny): the experts' products take the
// recipe, the router stays fp32, the all-to-alls move the rows in the layer's dtype (2 bytes) and the
// gradients' all-reduces in the gradients' format. At --ep 2 on 2 ranks under bf16, fp16 and fp8
// (delayed), and DP 2 x EP 2 on 4 under fp8, the losses equal 11 on one rank under the same recipe
// within the format's tolerance; the loss scale and the dense products' scales are the same on every
// rank, every expert's scales the same on the ranks that hold it (its amax reduced over them, not
// over ranks holding other experts); the bytes and the scratch stand beside their formulas.
TEST(PrecisionChapters, MixtureOfExpertsOnAnyGridEqualsOneRankWithinTheFormat) {
  struct Case {
    std::string recipe, flags;
    double tolerance;  // relative, per step (docs/mixed_precision.md)
    int ranks;
  };
  const Case cases[] = {{"bf16", "--precision bf16", std::ldexp(1.0, -10), 2},
                        {"fp16", "--precision fp16", std::ldexp(1.0, -13), 2},
                        {"fp8", "--precision fp8 --fp8-scaling delayed", std::ldexp(1.0, -6), 2},
                        {"fp8", "--precision fp8 --fp8-scaling delayed", std::ldexp(1.0, -6), 4}};
  const std::string dir = temp_dir(), steps = " --steps " + std::to_string(kSteps) + " --json ";
  std::map<std::string, std::string> one_rank;
  int i = 0;
  for (const Case& c : cases) {
    if (!one_rank.count(c.recipe)) {
      one_rank[c.recipe] = dir + "/one_" + c.recipe + ".jsonl";
      RunResult r = run_trainer("11_expert_parallel", 1, c.flags + steps + one_rank[c.recipe]);
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    const std::string path = dir + "/ep" + std::to_string(i++) + ".jsonl";
    RunResult r = run_trainer("11_expert_parallel", c.ranks, c.flags + " --ep 2" + steps + path);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LE(max_relative_difference(read_losses(path), read_losses(one_rank[c.recipe])), c.tolerance)
        << c.ranks << " ranks, " << c.flags;
    // Rank r holds the experts of its place r % 2 in the EP group, the same as rank r + 2.
    for (const char* key : {"loss_scale", "scales_fingerprint", "scale_weights", "scale_activations", "scale_gradients"}) {
      const auto values = precision_field(path, key);
      ASSERT_EQ(values.size(), size_t(c.ranks * kSteps)) << key;
      const bool experts_apart = std::string(key) == "scales_fingerprint";
      for (const auto& [step_rank, value] : values)
        EXPECT_EQ(value, values.at({step_rank.first, experts_apart ? step_rank.second % 2 : 0}))
            << key << " step " << step_rank.first << " rank " << step_rank.second << ", " << c.flags;
    }
    // The bytes (docs/theory.md, sections 14 and 18): each all-to-all's rows in 2 bytes an element,
    // rank 0's from its routing records; the gradients' all-reduces in 2 bytes too, the world's over
    // the non-expert ranges and the expert-data-parallel group's over the experts'.
    const std::string run = read_record(path, "run"), theory = read_record(path, "theory");
    ASSERT_FALSE(run.empty() || theory.empty()) << r.output;
    const double L = 2, E = 4, C = 64, k = 2, P = 2, W = c.ranks, D = W / P;
    const double n = number_field(run, "micro_batch") * 64;  // a rank's tokens
    const double experts = number_field(theory, "padded_expert_params"), dense = number_field(theory, "padded_params") - experts;
    for (const std::string& record : read_records(path, "experts")) {
      const int step = int(number_field(record, "step"));
      EXPECT_EQ(number_field(record, "a2a_sent_bytes"), a2a_bytes_from_routing(path, step, 0, 2, 4, 64, -1, 2)) << record;
      EXPECT_EQ(number_field(record, "a2a_predicted_bytes"), number_field(record, "a2a_sent_bytes")) << record;
      EXPECT_NEAR(number_field(record, "a2a_balanced_theory_bytes"),
                  L * ((P - 1) / P * 4 * E + 2 * (P - 1) / P * n * k * C * (2 + 2)), 1e-6) << record;
      EXPECT_EQ(number_field(record, "world_all_reduce_bytes"), number_field(record, "world_all_reduce_theory")) << record;
      EXPECT_NEAR(number_field(record, "world_all_reduce_theory"), 2 * (W - 1) / W * 2 * dense, 1e-6) << record;
      EXPECT_EQ(number_field(record, "expert_dp_all_reduce_bytes"), number_field(record, "expert_dp_all_reduce_theory"))
          << record;
      EXPECT_NEAR(number_field(record, "expert_dp_all_reduce_theory"), 2 * (D - 1) / D * 2 * experts, 1e-6) << record;
    }
    EXPECT_GT(dense, 4 * E * L * kSteps);  // the all-reduces' check tells 2 bytes from fp32's 4
    // Memory per category: the fp32 master state as in fp32, the scratch within its formula (an
    // expert takes at most the EP group's n tokens each: M = P n), the staged codes within the bound.
    for (const char* category : {"params", "grads", "optim"})
      EXPECT_EQ(number_field(theory, std::string("measured_") + category + "_bytes"),
                number_field(theory, std::string("theory_") + category + "_bytes")) << category;
    expect_precision_scratch_matches(path, c.recipe == "fp16", P * n);
    EXPECT_LE(number_field(theory, "measured_transient_bytes"), number_field(theory, "theory_transient_bytes_at_most"));
  }
  // 12: the experts at --ep 2 beside TP 2 with sequence parallelism, under fp8, against 11 on one rank
  // (one micro-batch a step, the whole batch: the same routing, capacity and balance loss); every
  // rank's groups beside their formulas, the all-to-alls in 2 bytes (12 predicts them from the
  // routing records at the format's bytes).
  const std::string fp8 = "--precision fp8 --fp8-scaling delayed --preset moe-tiny --micro-batches 1" + steps;
  RunResult grid = run_trainer("12_5d_parallel", 4, "--ep 2 --tp 2 --sequence-parallel " + fp8 + dir + "/12.jsonl");
  ASSERT_EQ(grid.exit_code, 0) << grid.output;
  EXPECT_LE(max_relative_difference(read_losses(dir + "/12.jsonl"), read_losses(one_rank["fp8"])), std::ldexp(1.0, -6));
  for (const char* key : {"loss_scale", "scale_weights", "scale_activations", "scale_gradients"})
    for (const auto& [step_rank, value] : precision_field(dir + "/12.jsonl", key))
      EXPECT_EQ(value, precision_field(dir + "/12.jsonl", key).at({step_rank.first, 0})) << key;
  const std::string groups = read_record(dir + "/12.jsonl", "groups");
  ASSERT_FALSE(groups.empty()) << grid.output;
  for (int q = 0; q < 4; q++)
    for (const std::string group : {"_ep", "_expert_dp", "_tp", "_dp_cp"}) {
      const std::string name = "rank" + std::to_string(q) + group;
      EXPECT_EQ(number_field(groups, name), number_field(groups, name + "_theory")) << name;
    }
  // The rows alone, from the routing records at 2 bytes an element: the ep row beyond them is the
  // counts' gathers, a few hundred bytes; at fp32's 4 it would be twice the rows.
  for (int q = 0; q < 4; q++) {
    const double rows = a2a_bytes_from_routing(dir + "/12.jsonl", 1, q, 2, 4, 64, 0, 2);
    EXPECT_NEAR(number_field(groups, "rank" + std::to_string(q) + "_ep"), rows, 1024) << "rank " << q;
    EXPECT_GT(rows, 4 * 1024);
  }
}

// No recipe constrains the head size (docs/mixed_precision.md, "Head size: no rule"): a recipe casts
// the linear layers' operands only, and attention stays in the model's fp32. The odd preset's heads
// of 5 channels (C = 15, NH = 3), which FlashAttention does not take, train under every recipe, and
// under fp8 with products whose sizes are not multiples of 16 (the CPU's emulation has no such rule).
TEST(PrecisionChapters, EveryRecipeTrainsAtAnyHeadSize) {
  for (const char* recipe : {"--precision bf16", "--precision fp16", "--precision fp8",
                             "--precision fp8 --fp8-scaling blocks"}) {
    const std::string dir = temp_dir();
    RunResult r = run_trainer("01_vanilla_dp", 1, std::string(recipe) + " --preset odd --steps 2 --json " + dir + "/run.jsonl");
    ASSERT_EQ(r.exit_code, 0) << recipe << ": " << r.output;
    const LossCurve curve = read_losses(dir + "/run.jsonl");
    ASSERT_EQ(curve.losses.size(), 2u) << recipe;
    for (double loss : curve.losses) EXPECT_TRUE(std::isfinite(loss) && loss > 0) << recipe << ": " << loss;
  }
}

TEST(PrecisionChapters, RefusesWhatCannotComposeNamingTheFlag) {
  struct Case {
    std::string chapter, args, flag;
  };
  const Case cases[] = {{"05_zero2", "--precision bf16 --fp8-scaling row", "--fp8-scaling"},
                        {"02_overlap_dp", "--precision fp16 --dtype bf16", "--dtype"},
                        // The contradiction itself, before bf16's own refusal on the CPU: both flags named.
                        {"02_overlap_dp", "--dtype bf16 --precision bf16", "--dtype bf16 with --precision bf16"}};
  for (const Case& c : cases) {
    RunResult r = run_trainer(c.chapter, 1, c.args + " --steps 2");
    EXPECT_NE(r.exit_code, 0) << c.chapter << " " << c.args;
    EXPECT_NE(r.output.find(c.flag), std::string::npos) << c.args << ": " << r.output;
    EXPECT_EQ(r.output.find("step 0"), std::string::npos) << c.args << ": refused after the work began";
  }
}

}  // namespace
