// test_planner_published.cpp: the planner in five dimensions against the published record
// (common/planner/model_shape.h, planner_shape.cpp, plan_published.h). The shapes count what their papers and
// model cards publish; a published shape's memory adds up over its grid and its step is the sum of
// its parts, its activations replayed in the schedule's order; one constant calibrated on Megatron-Core's
// 177B row predicts the other Megatron-Core rows, Llama 3's Table 4, torchtitan's CP 2 ratio and its
// 8B memory peaks within 15%, GPT-OSS 120B and DeepSeek-V3's GPU hours within 25% (the three stated
// exceptions are held to their direction and to their reasons, and `plan --published` lists them and
// exits 0, run once for the whole file); each row's printed command gives its number; chapters 10's and
// 11's grids are forecast as their trainers forecast them; the plan binary refuses what makes no sense,
// in a sentence naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "planner/model_shape.h"
#include "model/param_layout.h"
#include "planner/plan_published.h"
#include "planner/planner.h"
#include "parallel/theory.h"
#include "training_harness.h"  // run_command

namespace {

ModelShape shape(const std::string& name) {
  ModelShape s;
  EXPECT_TRUE(find_model_shape(name, &s)) << name;
  return s;
}

PlanConfig grid(int dp, int tp, int pp, int cp, int ep, Schedule s, int v, int B, int m, int zero, Recompute rc) {
  PlanConfig c{dp, tp, pp, s, v, B, m, zero, rc, tp > 1};
  c.cp = cp, c.ep = ep;
  return c;
}

// Calibrated once per binary: every test predicts from the same residual.
double efficiency() {
  static const double e = calibrate_published(megatron_h100_runs()[size_t(megatron_h100_calibration())]);
  return e;
}

// `plan --published`, run once per binary (its searches are most of this file's time): the tests read
// its rows, their commands and its verdict.
const RunResult& published_output() {
  static const RunResult all = run_command("./09_3d_parallel/plan --published", 300);
  return all;
}

// The line of `text` that starts with `start` ("" if none).
std::string line_starting(const std::string& text, const std::string& start) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind(start, 0) == 0) return line;
  return "";
}

}  // namespace

TEST(ModelShapes, CountWhatThePublicationsPublish) {
  // Llama 3 (arXiv 2407.21783, Table 3) by their names: 8B, 70B, 405B.
  EXPECT_NEAR(total_params(shape("llama3-8b")), 8.03e9, 0.01e9);
  EXPECT_NEAR(total_params(shape("llama3-70b")), 70.6e9, 0.1e9);
  EXPECT_NEAR(total_params(shape("llama3-405b")), 405.9e9, 0.5e9);
  // DeepSeek-V3: 671B total, 37B activated; GPT-OSS 120B: 117B total, 5.1B active.
  EXPECT_NEAR(total_params(shape("deepseek-v3")), 671e9, 3e9);
  EXPECT_NEAR(active_params(shape("deepseek-v3")), 37e9, 1e9);
  EXPECT_NEAR(total_params(shape("gpt-oss-120b")), 117e9, 1e9);
  EXPECT_NEAR(active_params(shape("gpt-oss-120b")), 5.1e9, 0.1e9);
  // Megatron's GPT: 12 L h^2 + 2 V h (untied), plus the norms' 2h a layer and the final one.
  for (const PublishedRun& run : megatron_h100_runs()) {
    const ModelShape s = shape(run.model);
    const double h = s.C, expected = 12.0 * s.L * h * h + 2.0 * s.V * h + (2.0 * s.L + 1) * h;
    EXPECT_DOUBLE_EQ(total_params(s), expected) << run.name;
    // Megatron-LM's count, 72 L h^2 (1 + s/6h + V/12Lh) a token, is ours for GPT.
    const double megatron = 72.0 * s.L * h * h * (1 + s.T / (6 * h) + s.V / (12 * h * s.L));
    EXPECT_NEAR(model_flops_per_token(s), megatron, 1e-9 * megatron) << run.name;
  }
  // Grouped-query attention: Llama 3 405B's keys and values are 1/16 of multi-head attention's.
  ModelShape mha = shape("llama3-405b");
  mha.KV = mha.NH;
  const ModelShape gqa = shape("llama3-405b");
  EXPECT_DOUBLE_EQ(attention_params(mha) - attention_params(gqa), 2.0 * gqa.C * (gqa.NH - gqa.kv()) * gqa.hd());
  // A shape with no such thing is refused.
  ModelShape bad = gqa;
  bad.KV = 7;
  EXPECT_NE(model_shape_problem(bad), "");
}

// For GPT with FlashAttention a layer keeps 16C elements (32C bytes): Korthikanti et al.'s 34 s b h
// less the two dropout masks; the causal attention a layer computes is half of the full T x T count.
TEST(ModelShapes, ActivationsAndFlopsAgreeWithTheClassicCounts) {
  GPT2Config gpt;
  ASSERT_TRUE(find_preset("gpt2", &gpt));
  const ModelShape s = shape_of(gpt);
  const LayerActivations a = layer_activations(s, 0);
  EXPECT_DOUBLE_EQ(a.residual + a.norm_out + a.qkv + a.attention_out + a.mlp_in + a.mlp_product, 16.0 * s.C);
  EXPECT_DOUBLE_EQ(layer_attention_flops(s, 0), 2.0 * s.C * s.T);  // 4TC over the full square, halved
  EXPECT_DOUBLE_EQ(layer_product_flops(s, 0), 2.0 * 12 * s.C * s.C);
  // Banded layers (GPT-OSS: every other one, 128 keys) meet at most the window.
  const ModelShape oss = shape("gpt-oss-120b");
  EXPECT_DOUBLE_EQ(layer_attention_flops(oss, 0), 2.0 * oss.NH * 128 * 2 * oss.hd());
  EXPECT_DOUBLE_EQ(layer_attention_flops(oss, 1), 2.0 * oss.NH * (oss.T / 2.0) * 2 * oss.hd());
}

// A published shape's parameters add up over its grid: every stage's, times t (and the experts'
// times ep), is the model; the step is the sum of its parts.
TEST(PlannerShapes, MemoryAddsUpOverTheGridAndTheStepIsItsParts) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("llama3-8b", &in));
  ASSERT_FALSE(in.chapters_model);
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  in.gpus = 64, in.batch = 64, in.efficiency = 0.5;
  const PlanConfig c = grid(4, 2, 4, 2, 1, Schedule::Interleaved, 2, 1, 16, 0, Recompute::None);
  const PlanResult r = evaluate_plan(in, c, true);
  ASSERT_EQ(r.invalid, "");
  ASSERT_EQ(r.stages.size(), 4u);
  double params = 0;
  for (const StageMemory& sm : r.stages) params += sm.params_bytes / 2 * c.tp;
  EXPECT_NEAR(params, total_params(in.shape), 1e-6 * params);
  EXPECT_NEAR(r.step_s, r.compute_s + r.tp_s + r.cp_s + r.ep_s + r.pp_s + r.bubble_s + r.dp_s + r.embedding_s,
              1e-9 * r.step_s);
  EXPECT_GT(r.tp_s, 0);
  EXPECT_GT(r.bubble_s, 0);

  // The experts spread over ep: GPT-OSS on one stage, ep 8.
  ASSERT_TRUE(set_plan_model("gpt-oss-120b", &in));
  in.gpus = 8, in.batch = 8;
  const PlanResult moe = evaluate_plan(in, grid(8, 1, 1, 1, 8, Schedule::OneFOneB, 1, 1, 1, 1, Recompute::Full), true);
  ASSERT_EQ(moe.invalid, "");
  const double experts = moe.expert_params_bytes / 2 * 8, dense = (moe.params_bytes - moe.expert_params_bytes) / 2;
  EXPECT_NEAR(experts + dense, total_params(in.shape), 1e-6 * total_params(in.shape));
  EXPECT_GT(moe.ep_s, 0);
  // CP halves what a rank keeps of each sequence; ZeRO-1 shards the optimizer state over d x cp.
  ASSERT_TRUE(set_plan_model("llama3-8b", &in));
  in.gpus = 8, in.batch = 4;
  const PlanResult cp1 = evaluate_plan(in, grid(4, 2, 1, 1, 1, Schedule::OneFOneB, 1, 1, 1, 1, Recompute::None), true);
  const PlanResult cp2 = evaluate_plan(in, grid(2, 2, 1, 2, 1, Schedule::OneFOneB, 1, 2, 1, 1, Recompute::None), true);
  ASSERT_EQ(cp1.invalid + cp2.invalid, "");
  EXPECT_NEAR(cp2.memory.activations, cp1.memory.activations, 1e-9 * cp1.memory.activations);  // B 2 x T/2
  EXPECT_DOUBLE_EQ(cp2.optim_bytes, cp1.optim_bytes);
  EXPECT_NE(evaluate_plan(in, grid(8, 1, 1, 1, 2, Schedule::OneFOneB, 1, 1, 1, 1, Recompute::None)).invalid, "")
      << "expert parallelism without experts";
}

TEST(PlanPublished, MegatronCoreOnH100WithinFifteenPercentFromTheCalibrationRow) {
  const std::vector<PublishedRun> runs = megatron_h100_runs();
  ASSERT_EQ(runs.size(), 9u);
  const int cal = megatron_h100_calibration();
  EXPECT_EQ(runs[size_t(cal)].name, "177B");
  const double e = efficiency();
  EXPECT_GT(e, 0.3);
  EXPECT_LT(e, 0.8);
  for (size_t i = 0; i < runs.size(); i++) {
    const PlanResult r = predict_published(runs[i], e);
    EXPECT_TRUE(r.fits) << runs[i].name << ": " << r.overflow;
    const double predicted = published_metric(runs[i], r);
    EXPECT_NEAR(predicted, runs[i].published, (int(i) == cal ? 0.005 : 0.15) * runs[i].published)
        << runs[i].name << " " << r.config.describe();
  }
}

TEST(PlanPublished, Llama3Table4WithinFifteenPercentAndItsGridInTheSearch) {
  const double e = efficiency();
  const std::string& all = published_output().output;
  for (const PublishedRun& run : llama3_runs()) {
    const PlanResult r = predict_published(run, e);
    // 131K: a stated exception (docs/planner.md): the paper names no kernel, and its attention, most
    // of that step, at FlashAttention-2's published rates comes out slow; cuDNN's would be fast.
    if (run.cp > 1) {
      EXPECT_NE(run.exception, "") << run.name;
      EXPECT_LT(published_metric(run, r), (1 - kPublishedTolerance) * run.published) << run.name;
      PublishedRun cudnn = run;
      cudnn.attention_kernel = "cudnn";
      EXPECT_GT(published_metric(cudnn, evaluate_plan(published_inputs(cudnn, e), r.config, true)), run.published)
          << run.name;
    } else {
      EXPECT_EQ(run.exception, "") << run.name;
      EXPECT_NEAR(published_metric(run, r), run.published, kPublishedTolerance * run.published) << run.name << " " << r.config.describe();
    }
    // The paper's (TP, CP, PP, DP), given only the model, GPUs, sequence and tokens a batch (the search
    // tries Ulysses too): found, fitting, and within a third of the planner's best (docs/planner.md
    // says why it is not first: the V schedules at 8K, no pipeline and its bubble at 131K). Read from
    // `plan --published`'s row: "#12 of 264 grids, 23.7% slower than #1 (...)".
    const std::string row = line_starting(all, run.name);
    ASSERT_NE(row, "") << all;
    if (run.gpus == 8192) continue;  // its interleaved first stage does not fit our forecast at 8K (docs/planner.md)
    const size_t at = row.find(" grids, ");
    ASSERT_NE(at, std::string::npos) << row;
    EXPECT_LT(std::atof(row.c_str() + at + 8), 35.0) << row;  // % slower than #1
  }
}

TEST(PlanPublished, GptOss120bWithinTwentyFivePercentAndTorchtitansCpScalingAsRatios) {
  const double e = efficiency();
  const PublishedRun oss = gpt_oss_run();
  const PlanResult r = predict_published(oss, e);
  EXPECT_EQ(r.config.ep, 8);
  EXPECT_TRUE(r.fits) << r.overflow;
  EXPECT_NEAR(published_metric(oss, r), oss.published, 0.25 * oss.published) << r.config.describe();

  const std::vector<PublishedRun> runs = torchtitan_cp_runs();
  ASSERT_EQ(runs.size(), 4u);
  std::vector<double> predicted;
  for (const PublishedRun& run : runs) predicted.push_back(published_metric(run, predict_published(run, e)));
  for (size_t i = 0; i < runs.size(); i++) {
    const PublishedRun& run = runs[i];
    const double ratio = predicted[i] / predicted[0], published = run.published / runs[0].published;
    // CP 2 within the threshold; CP 4 and 8 stated exceptions (docs/planner.md): torchtitan's step
    // from CP 2 to CP 4 costs more than twice a token's time, which doubling every cost that grows
    // with T cannot give; CP 8 carries it, its own doubling from CP 4 within the threshold.
    if (run.cp <= 2) {
      EXPECT_EQ(run.exception, "") << run.name;
      EXPECT_NEAR(ratio, published, kPublishedTolerance * published) << run.name;
      continue;
    }
    EXPECT_NE(run.exception, "") << run.name;
    EXPECT_GT(ratio, (1 + kPublishedTolerance) * published) << run.name;
    const double published_doubling = runs[i - 1].published / run.published;  // a token's time, x
    const double predicted_doubling = predicted[i - 1] / predicted[i];
    if (run.cp == 4) {
      EXPECT_GT(published_doubling, 2.0) << "more than doubling the whole step";
    } else {
      EXPECT_NEAR(predicted_doubling, published_doubling, kPublishedTolerance * published_doubling) << run.name;
    }
  }
}

// Only the rows named as stated exceptions may miss, and `plan --published` exits 0 with them listed
// last, each with its reason; every other row holds (the tests above check each).
TEST(PlanPublished, ExceptionsAreStatedAndTheVerdictNamesThem) {
  std::vector<PublishedRun> runs = megatron_h100_runs();
  for (const auto& more : {llama3_runs(), torchtitan_cp_runs(), torchtitan_memory_runs()})
    runs.insert(runs.end(), more.begin(), more.end());
  runs.push_back(gpt_oss_run()), runs.push_back(deepseek_v3_run());
  const RunResult& all = published_output();
  EXPECT_EQ(all.exit_code, 0) << all.output;
  int stated = 0;
  for (const PublishedRun& run : runs) {
    if (run.exception.empty()) continue;
    stated++;
    EXPECT_NE(all.output.find("  " + run.source + " " + run.name + ": " + run.exception), std::string::npos) << run.name;
  }
  EXPECT_EQ(stated, 3);  // Llama 3's 131K, torchtitan's CP 4 and CP 8
  EXPECT_NE(all.output.find("\nevery other check holds\n"), std::string::npos) << all.output;
  EXPECT_EQ(all.output.find("without a stated reason"), std::string::npos) << all.output;
}

// DeepSeek-V3 is checked on what it published, GPU hours per trillion tokens, with its own settings
// (FP8 products, DualPipe's overlap of the all-to-alls), not only on fitting.
TEST(PlanPublished, DeepSeekV3GpuHoursWithDualPipesOverlapAndItFitsIn80GB) {
  const double e = efficiency();
  PublishedRun ds = deepseek_v3_run();
  ASSERT_TRUE(ds.ep_overlap && ds.fp8 && ds.fp8_activations);
  const PlanResult r = predict_published(ds, e);
  EXPECT_EQ(r.config.pp, 16);
  EXPECT_EQ(r.config.ep, 64);
  EXPECT_TRUE(r.fits) << r.overflow;
  EXPECT_NEAR(r.memory.model_state, r.params_bytes + r.grads_bytes + r.optim_bytes, 1);
  EXPECT_GT(r.expert_params_bytes, 0);
  const double hours = 1e12 / (r.tokens_per_s / ds.gpus) / 3600;
  EXPECT_NEAR(hours, kDeepSeekGpuHoursPerTrillion, kPublishedMoeTolerance * kDeepSeekGpuHoursPerTrillion);
  // The all-to-alls across 8 nodes: exposed, they are a third of the step and more; overlapped, less.
  ds.ep_overlap = false;
  const PlanResult exposed = evaluate_plan(published_inputs(ds, e), r.config, true);
  EXPECT_GT(exposed.ep_s, 0.3 * exposed.step_s);
  EXPECT_LT(r.step_s, 0.85 * exposed.step_s);
  ds.ep_overlap = true, ds.fp8 = false;
  EXPECT_LT(r.compute_s, 0.7 * evaluate_plan(published_inputs(ds, e), r.config, true).compute_s);
}

namespace {
// The number after `key` in `text` ("per GPU: 1234.5 tokens/s": key "per GPU: "), or NaN.
double number_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? std::nan("") : std::atof(text.c_str() + at + key.size());
}
}  // namespace

// Every row of `plan --published` prints the `plan --one` command that reproduces it; a few of them,
// one per source, are run as printed and give the row's number.
TEST(PlanPublished, EachRowsPrintedCommandGivesItsNumber) {
  const RunResult& all = published_output();
  ASSERT_NE(all.output.find("calibrated on ONE row, Megatron-Core H100 177B"), std::string::npos) << all.output;
  std::istringstream lines(all.output);
  std::string line, row;
  struct Checked {
    const char* row_start;  // how the row's line begins
    const char* in_row;     // the predicted number follows this in the row
    const char* in_output;  // and this in the command's output
    double tolerance;
  };
  const std::vector<Checked> checks = {
      {"70B      8   2", "|", "model TFLOP/s ", 0.051},  // the row's "published predicted" pair: the second number
      {"131K, 16,384 GPUs", "|", "model TFLOP/s ", 0.051},
      {"   published 5630, predicted ", "predicted ", "per GPU: ", 0.51},
      {"CP 2 @ 64K", "|", "per GPU: ", 0.51},
      {"   H800 GPU hours per trillion tokens", "predicted ", "GPU hours per trillion tokens ", 0.051},  // thousands
  };
  int commands = 0, ran = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("    $ 09_3d_parallel/plan --one ", 0) != 0) {
      if (line.rfind("   step:", 0) != 0 && line.rfind("   memory per GPU", 0) != 0) row = line;
      continue;
    }
    commands++;
    for (const Checked& c : checks) {
      if (row.rfind(c.row_start, 0) != 0) continue;
      SCOPED_TRACE(row);
      const RunResult one = run_command(line.substr(6), 120);
      ASSERT_EQ(one.exit_code, 0) << one.output;
      double printed;
      if (std::string(c.in_row) == "|") {  // a table row: published, predicted (TFLOP/s or tokens/s) after the first |
        std::istringstream cells(row.substr(row.find('|') + 1));
        double published = 0;
        cells >> published >> printed;
        if (row.rfind("CP ", 0) == 0) printed = number_after(row.substr(row.find('|') + 1), "|");
      } else {
        printed = number_after(row, c.in_row);
      }
      const double predicted = number_after(one.output, c.in_output);
      EXPECT_NEAR(predicted, printed, c.tolerance) << line << "\n" << one.output;
      ran++;
    }
  }
  EXPECT_EQ(commands, 9 + 3 + 1 + 4 + 1 + 5) << all.output;  // every row has its command
  EXPECT_EQ(ran, int(checks.size())) << all.output;
}

// Chapters 10 and 11 in the planner: memory as TrainingRun::check_memory forecasts it (12's grids:
// test_planner.cpp).
TEST(PlannerChapters, ContextAndExpertGridsAreForecastAsTheirTrainersDo) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("small", &in));
  ASSERT_TRUE(find_cluster("emulated", &in.cluster));
  in.gpus = 4, in.batch = 8, in.efficiency = 1;
  PlanConfig c = grid(2, 1, 1, 2, 1, Schedule::OneFOneB, 1, 4, 1, 0, Recompute::None);
  PlanResult r = evaluate_plan(in, c);
  ASSERT_EQ(r.invalid, "");
  EXPECT_DOUBLE_EQ(r.memory.activations, context_parallel_activation_bytes(in.model, 4, 2));
  const ParamLayout layout = build_gpt2_layout(in.model, 4);
  EXPECT_DOUBLE_EQ(r.params_bytes, 4.0 * double(layout.padded_size));
  // A chapters' model in a grid no chapter builds is refused (ZeRO-2 over DP x CP; 12 shards with
  // ZeRO-1 only); TP x CP is 12's (test_planner.cpp checks it against 12's own run).
  EXPECT_NE(evaluate_plan(in, grid(2, 1, 1, 2, 1, Schedule::OneFOneB, 1, 4, 1, 2, Recompute::None)).invalid, "");
  EXPECT_EQ(evaluate_plan(in, grid(1, 2, 1, 2, 1, Schedule::OneFOneB, 1, 8, 1, 0, Recompute::None)).invalid, "");

  ASSERT_TRUE(set_plan_model("moe-small", &in));
  c = grid(4, 1, 1, 1, 2, Schedule::OneFOneB, 1, 2, 1, 0, Recompute::None);
  r = evaluate_plan(in, c);
  ASSERT_EQ(r.invalid, "");
  const ParamLayout held = build_gpt2_layout(in.model, 4, {}, {}, ExpertParallelism{2, 0});
  EXPECT_DOUBLE_EQ(r.params_bytes, 4.0 * double(held.padded_size));
  const std::vector<int64_t> rows(size_t(in.model.L), moe_expert_rows_at_most(in.model, 2, 2, 4));
  EXPECT_DOUBLE_EQ(r.memory.transient, moe_exchange_buffer_bytes(in.model, rows));
  EXPECT_GT(r.ep_s, 0);
}

TEST(PlanFlags, SequenceAndTokensPerBatchAreInputsAndAbsurdInputsAreRefused) {
  RunResult r = run_command("./09_3d_parallel/plan --model llama3-8b --gpus 8 --seq-len 32768 --tokens-per-batch 262144 "
                            "--top 2",
                            120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("T=32768"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("global batch 8 sequences of 32768 tokens"), std::string::npos) << r.output;
  for (const char* column : {" compute ", " TP ", " CP ", " PP ", " DP ", " EP ", " bubble "})
    EXPECT_NE(r.output.find(column), std::string::npos) << column;
  const std::string base = "./09_3d_parallel/plan --model llama3-8b ";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--seq-len 0", "--seq-len must be positive"},
           {"--seq-len 8192 --tokens-per-batch 10000", "is not a whole number of sequences of 8192 tokens"},
           {"--batch 8 --tokens-per-batch 65536", "--batch and --tokens-per-batch: give one"},
           {"--gpus 100000000", "is beyond any cluster or model"},
           {"--gpus 8 --cp 3 --one", "--tp x --cp x --ulysses x --pp must divide --gpus"},
           {"--cp-method smoke", "--cp-method smoke: choose ring or all-gather"},
           {"--capacity-factor 1.25", "has no experts"},
           {"--cp -2", "--cp must be positive"},
           // Refusals name the real cause and its flag.
           {"--gpus 3 --batch 512", "--batch 512 does not split over any data-parallel degree that --gpus 3 leaves"},
           {"--attention materialized", "a published shape is timed with flash attention"},
           {"--elementwise-rate 1e9", "--elementwise-rate: the chapters' CPU models' rate"},
           {"--sync-us 2000", "--sync-us: the wait of CPU ranks on shared cores"},
           {"--sync-us -5", "--sync-us must be 0 or more"},
           {"--ep 2", "--ep 2: --model llama3-8b has no experts"},
           {"--fp8-speedup 1.5", "--fp8-speedup: the products run in FP8 only with --fp8"},
           {"--attention-efficiency 2", "--attention-efficiency 2.000000: a fraction of peak"}}) {
    SCOPED_TRACE(args);
    r = run_command(base + args, 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  }
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--model gpt-oss-120b --gpus 64 --ep 7", "--ep 7 does not divide the 128 experts of --model gpt-oss-120b"},
           {"--model gpt-oss-120b --gpus 64 --one --ep 3", "--ep 3 does not divide the 128 experts"},
           {"--model small --cluster emulated --tp-overlap", "--tp-overlap: a published run's implementation setting"},
           {"--model small --cluster emulated --fp8", "--fp8: a published run's implementation setting"},
           {"--model small --cluster emulated --attention-kernel fa2", "--attention-kernel: a published run's"},
           {"--model llama3-8b --attention-kernel fa4", "--attention-kernel fa4: choose fa2, fa3, cudnn"},
           {"--model llama3-8b --cluster dgx-a100 --attention-kernel fa3", "no published attention rates for --cluster dgx-a100"},
           {"--model llama3-8b --attention-kernel fa3 --attention-efficiency 0.5", "give one"},
           {"--model small --cluster emulated --gpus 4 --batch 6 --micro-batches 4 --one",
            "--batch 6 does not split over dp 4"}}) {
    SCOPED_TRACE(args);
    r = run_command("./09_3d_parallel/plan " + args, 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  // An odd sequence plans without CP (only CP's zigzag cuts it in 2cp chunks).
  r = run_command("./09_3d_parallel/plan --model llama3-8b --gpus 8 --seq-len 8191 --batch 64 --one --micro-batches 8", 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // What the published sources name is a flag, shown in the header.
  r = run_command("./09_3d_parallel/plan --model llama3-8b --gpus 8 --seq-len 8192 --batch 64 --one --micro-batches 8 "
                  "--fp8 --fp8-speedup 1.5 --fp8-activations --attention-efficiency 0.35 --no-dp-overlap --zero 1",
                  60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* said : {"in FP8, 1.5 x", "one byte (--fp8-activations)", "attention at 0.35 of peak",
                           "after the backward (--no-dp-overlap)"})
    EXPECT_NE(r.output.find(said), std::string::npos) << said << "\n" << r.output;
  // The kernel-rate tables price it by default: the header and the rates line name them and the residual.
  r = run_command("./09_3d_parallel/plan --model llama3-8b --gpus 8 --seq-len 8192 --batch 64 --one --micro-batches 8 "
                  "--attention-kernel fa2",
                  60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* said : {"the residual factor over the kernel-rate tables", "by fa2's table x the residual",
                           "attention (fa2) at 0.337", "x the residual 0.6262"})
    EXPECT_NE(r.output.find(said), std::string::npos) << said << "\n" << r.output;
}

// A published run's sharded checkpoint (docs/theory.md, section 19): 12 bytes a parameter, each GPU its
// share, and at the storage's bandwidth the save's time; the flag is a published shape's only.
TEST(PlanFlags, OnePrintsTheShardedCheckpointAtScale) {
  const RunResult r = run_command("./09_3d_parallel/plan --one --model llama3-405b --cluster dgx-h100 --gpus 16384 "
                                  "--seq-len 8192 --batch 2048 --tp 8 --pp 16 --schedule interleaved --virtual-stages 4 "
                                  "--micro-batch 1 --micro-batches 16 --zero 2 --sequence-parallel --storage-tbps 2", 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double bytes = 12 * total_params(shape("llama3-405b"));
  char expected[160];
  std::snprintf(expected, sizeof expected, "checkpoint: 12 Psi = %.2f TB, %.1f MB per GPU, a sharded save %.1f s at 2 TB/s",
                bytes / 1e12, bytes / 16384 / 1e6, bytes / 2e12);
  EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  const RunResult chapters = run_command("./09_3d_parallel/plan --model tiny --gpus 2 --one --storage-tbps 2", 60);
  EXPECT_NE(chapters.exit_code, 0);
  EXPECT_NE(chapters.output.find("--storage-tbps: a published run's implementation setting"), std::string::npos)
      << chapters.output;
}

// A published shape's activations peak where the schedule's order puts the most micro-batches in
// flight over all of a rank's chunks together, not at each chunk's own largest count added up.
TEST(PlannerShapes, ActivationsAreReplayedInTheSchedulesOrder) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_model("llama3-8b", &in));
  ASSERT_TRUE(find_cluster("dgx-h100", &in.cluster));
  in.efficiency = 0.5;
  // One micro-batch of each virtual stage of 8: rank r of a pipeline of 8 holds virtual stage r.
  in.gpus = 8, in.batch = 1;
  const PlanResult one = evaluate_plan(in, grid(1, 1, 8, 1, 1, Schedule::OneFOneB, 1, 1, 1, 0, Recompute::None), true);
  ASSERT_EQ(one.invalid, "");
  // Interleaved on 4 ranks, 2 chunks each: rank 1 holds virtual stages 1 and 5.
  const double chunk[2] = {one.stages[1].memory.activations, one.stages[5].memory.activations};
  in.gpus = 4, in.batch = 8;
  const PlanResult r = evaluate_plan(in, grid(1, 1, 4, 1, 1, Schedule::Interleaved, 2, 1, 8, 0, Recompute::None), true);
  ASSERT_EQ(r.invalid, "");
  const std::vector<Action> order = build_schedule(Schedule::Interleaved, PipelineShape{4, 8, 2}, 1);
  int now[2] = {0, 0};
  double most = 0;
  for (const Action& a : order) {
    if (a.op == Op::F) now[a.chunk]++, most = std::max(most, now[0] * chunk[0] + now[1] * chunk[1]);
    if (a.op == Op::B) now[a.chunk]--;
  }
  EXPECT_NEAR(r.stages[1].memory.activations, most, 1e-9 * most);
  EXPECT_LT(most, max_in_flight(order, 0) * chunk[0] + max_in_flight(order, 1) * chunk[1]);
}

// Against torchtitan's measured peaks: every run within the threshold, with PyTorch's loss at 12 bytes
// a logit (16 under TP's loss_parallel) and, under TP, DTensor's SP keeping each column-parallel
// product's gathered input; without those two the 70B under TP 8 is 27% short (docs/planner.md).
TEST(PlanPublished, TorchtitansMeasuredPeaks) {
  const double e = efficiency();
  for (const PublishedRun& run : torchtitan_memory_runs()) {
    const PlanResult r = predict_published(run, e);
    const double gib = r.memory.peak() / GiB_bytes;
    EXPECT_NEAR(gib, run.published, kPublishedTolerance * run.published) << run.name;
    EXPECT_GT(r.logits_bytes, 0) << run.name;
    if (run.tp == 1) continue;
    // Each term is its formula: the gathered inputs add (t - 1)/t of the two norms' outputs to the
    // recomputed layer and the head's whole input; loss_parallel 4 bytes a logit more.
    PublishedRun megatron_like = run;
    megatron_like.sp_gathered_inputs = false, megatron_like.loss_bytes = 12;
    const PlanResult m = evaluate_plan(published_inputs(megatron_like, e), r.config, true);
    const ModelShape s = plan_shape(published_inputs(run, e));
    const double tokens = double(r.config.micro_batch) * s.T, t = run.tp;
    const double gathered = tokens * 2 * s.C * 2 * (t - 1) / t + tokens * s.C * 2;
    const double loss = tokens * s.V / t * 4;
    EXPECT_NEAR(r.memory.activations - m.memory.activations, gathered + loss, 1e-9 * r.memory.activations) << run.name;
  }
}

// torchtitan's Float8 speed-up is derived, not guessed: on its table 1 run (8B, FSDP 8, T 8,192, LBS 2,
// selective AC) the planner with the products kTorchtitanFloat8Speedup x faster gives the measured
// 8,532 against 6,667 tokens/s per GPU, within half a percent.
TEST(PlanPublished, TorchtitansFloat8SpeedupReproducesItsTable1) {
  PublishedRun run = torchtitan_memory_runs().front();  // 8B FSDP 8, LBS 2, selective AC, bf16
  ASSERT_EQ(run.name, "8B FSDP 8");
  const double e = efficiency();
  const PlanResult bf16 = predict_published(run, e);
  run.fp8 = true;
  const PlanResult fp8 = evaluate_plan(published_inputs(run, e), bf16.config, true);
  EXPECT_NEAR(fp8.tokens_per_s / bf16.tokens_per_s, 8532.0 / 6667, 0.005 * 8532.0 / 6667);
}
