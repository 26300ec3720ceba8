// plan_report.cpp: `plan --published`, the tables of plan_report.h. Each prints the published number
// beside the planner's, the configuration the planner chose where the run left a choice open, and
// whether it fits our memory forecast.
#include "planner/plan_report.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "base/metrics.h"  // format_bytes, format_count
#include "planner/plan_published.h"
#include "planner/planner_kernel_rates.h"

namespace {

std::string choice(const PlanResult& r) {
  const PlanConfig& c = r.config;
  std::string s = "B " + std::to_string(c.micro_batch) + " m " + std::to_string(c.micro_batches);
  if (c.pp > 1) s += std::string(" ") + schedule_name(c.schedule) + (c.virtual_stages > 1 ? " v " + std::to_string(c.virtual_stages) : "");
  if (c.zero > 0) s += " ZeRO-" + std::to_string(c.zero);
  if (c.recompute != Recompute::None) s += std::string(" rc ") + recompute_name(c.recompute);
  return s;
}

std::string fits(const PlanResult& r) {
  return (r.fits ? "yes (" : "no (") + format_bytes(r.memory.peak()) + ")";
}

std::string split(const PlanResult& r) {
  char text[256];
  std::snprintf(text, sizeof(text), "compute %.2f TP %.2f CP %.2f PP %.2f DP %.2f EP %.2f bubble %.2f = %.2f s",
                r.compute_s, r.tp_s, r.cp_s, r.pp_s, r.dp_s, r.ep_s, r.bubble_s, r.step_s);
  return text;
}

double error(double predicted, double published) { return predicted / published - 1; }

// The command that reproduces a row, under it.
void print_command(const PublishedRun& run, const PlanResult& r, double efficiency) {
  std::printf("    $ %s\n", one_command(published_inputs(run, efficiency), r.config).c_str());
}

std::vector<std::string> misses;  // the rows outside their threshold, named at the end
// The rows outside it with a stated reason (PublishedRun::exception), each with its reason.
std::vector<std::pair<std::string, std::string>> exceptions;

// A row's mark: nothing where it holds; a miss without a stated reason fails the check, one with a
// reason is listed with it; a stated exception that holds is stale, and fails too.
const char* verdict(bool good, const std::string& row, const std::string& exception = "") {
  if (exception.empty()) {
    if (!good) misses.push_back(row);
    return good ? "" : "  MISSES";
  }
  if (good) {
    misses.push_back(row + " (holds: its stated exception is stale)");
    return "  HOLDS (stale exception)";
  }
  exceptions.push_back({row, exception});
  return "  MISSES (stated exception)";
}

}  // namespace

int print_published_comparisons(double default_efficiency) {
  misses.clear(), exceptions.clear();
  const std::vector<PublishedRun> mcore = megatron_h100_runs();
  const int cal = megatron_h100_calibration();
  const double e = calibrate_published(mcore[size_t(cal)]);
  const double tol = kPublishedTolerance, moe_tol = kPublishedMoeTolerance;
  std::printf("each product and attention priced at its kernel's published rate by shape (plan --kernel-rates), times "
              "ONE residual factor calibrated on ONE row, Megatron-Core H100 %s (TP %d, PP %d, DP %d, %d GPUs): %.4f "
              "(dgx-h100's default: %.4f); every other number below is predicted from it; each row's command reproduces "
              "it\n\n",
              mcore[size_t(cal)].name.c_str(), mcore[size_t(cal)].tp, mcore[size_t(cal)].pp, mcore[size_t(cal)].dp,
              mcore[size_t(cal)].gpus, e, default_efficiency);

  std::printf("1. Megatron-Core r0.8.0 on H100 (NVIDIA/Megatron-LM README): GPT, V 131,072, T 4,096; model TFLOP/s per "
              "GPU by Megatron's count, 72 L h^2 (1 + s/6h + V/12Lh) a token\n");
  std::printf("%-6s %3s %3s %3s %5s %5s | %9s %9s %7s | %-34s %s\n", "model", "TP", "PP", "DP", "GPUs", "batch",
              "published", "predicted", "error", "the planner's choice", "fits ours");
  int within = 0;
  for (size_t i = 0; i < mcore.size(); i++) {
    const PublishedRun& run = mcore[i];
    const PlanResult r = predict_published(run, e);
    const double p = published_metric(run, r), err = error(p, run.published);
    const bool good = std::fabs(err) <= tol;
    if (int(i) != cal) within += good;
    std::printf("%-6s %3d %3d %3d %5d %5d | %9.1f %9.1f %+6.1f%% | %-34s %s%s%s\n", run.name.c_str(), run.tp, run.pp,
                run.dp, run.gpus, run.batch, run.published, p, 100 * err, choice(r).c_str(), fits(r).c_str(),
                int(i) == cal ? "  <- calibration" : "", verdict(good || int(i) == cal, run.source + " " + run.name));
    print_command(run, r, e);
  }
  std::printf("%d of %zu rows within %.0f%% (the calibration row aside)\n\n", within, mcore.size() - 1, 100 * tol);

  std::printf("2. Llama 3 405B, Table 4 (arXiv 2407.21783): FSDP (ZeRO-2 under the pipeline), interleaved 1F1B, CP by "
              "all-gather; model TFLOP/s per GPU by 6N + 12 L H T; attention at FlashAttention-2's published rates on H100 "
              "(the paper names no kernel; --attention-kernel %s)\n", kPyTorchAttentionKernel);
  std::printf("%-18s %3s %3s %3s %4s | %9s %9s %7s | %-26s %-16s | %s\n", "row", "TP", "CP", "PP", "DP", "published",
              "predicted", "error", "the planner's choice", "fits ours", "the paper's grid in the planner's own search");
  for (const PublishedRun& run : llama3_runs()) {
    const PlanResult r = predict_published(run, e);
    const double p = published_metric(run, r), err = error(p, run.published);
    const bool good = std::fabs(err) <= tol;
    const std::vector<PlanResult> best = search_published(run, e);
    const int rank = grid_rank(run, best);
    char where[160];
    if (rank >= 0)
      std::snprintf(where, sizeof(where), "#%d of %zu grids, %.1f%% slower than #1 (%s)", rank + 1, best.size(),
                    100 * (best[size_t(rank)].step_s / best.front().step_s - 1), best.front().config.describe().c_str());
    else
      std::snprintf(where, sizeof(where), "absent (nothing of it fits ours); #1 %s", best.front().config.describe().c_str());
    std::printf("%-18s %3d %3d %3d %4d | %9.0f %9.1f %+6.1f%% | %-26s %-16s | %s%s\n", run.name.c_str(), run.tp, run.cp,
                run.pp, run.dp, run.published, p, 100 * err, choice(r).c_str(), fits(r).c_str(), where, verdict(good, run.source + " " + run.name, run.exception));
    print_command(run, r, e);
    // The search tries Ulysses (no published run used it): where its best grid stands.
    for (size_t i = 0; i < best.size(); i++) {
      if (best[i].config.ulysses == 1) continue;
      const double slower = 100 * (best[i].step_s / best.front().step_s - 1);
      char behind[64] = "level with #1 (a tie goes to the simpler grid)";
      if (slower >= 0.05) std::snprintf(behind, sizeof(behind), "%.1f%% slower than #1", slower);
      std::printf("    the search's best grid with Ulysses: #%zu, %s (%s)\n", i + 1, behind,
                  best[i].config.describe().c_str());
      break;
    }
  }
  std::printf("\n");

  const PublishedRun oss = gpt_oss_run();
  {
    const PlanResult r = predict_published(oss, e);
    const double p = published_metric(oss, r), err = error(p, oss.published);
    const bool good = std::fabs(err) <= moe_tol;
    std::printf("3. GPT-OSS 120B on Megatron-Bridge (25.11, 64 H100, BF16, TP 1 PP 4 EP 8, MBS 4, GBS 512, T 4,096): "
                "tokens/s per GPU (published 153 model TFLOP/s by Megatron-Bridge's count)\n");
    std::printf("   published %.0f, predicted %.0f (%+.1f%%, within %.0f%%: a mixture of experts; 153 TFLOP/s scales to %.0f) | "
                "%s | fits ours %s%s\n   step: %s\n",
                oss.published, p, 100 * err, 100 * moe_tol, 153 * p / oss.published, choice(r).c_str(), fits(r).c_str(),
                verdict(good, oss.name), split(r).c_str());
    print_command(oss, r, e);
    std::printf("\n");
  }

  std::printf("4. torchtitan, Llama 3 8B on 8 H100 (Float8 at %.2f x bf16's rate, its own table 1; full AC; FSDP x CP = "
              "8; SDPA, FlashAttention-2's published rates, --attention-kernel %s): tokens/s per GPU, and the ratio to CP 1 "
              "(500 W parts: the ratios are compared)\n",
              kTorchtitanFloat8Speedup, kPyTorchAttentionKernel);
  std::printf("%-12s | %9s %7s | %9s %7s | %13s | %s\n", "run", "published", "ratio", "predicted", "ratio",
              "ratio's error", "a token's time against the CP before, published / predicted");
  double published_base = 0, predicted_base = 0, published_before = 0, predicted_before = 0;
  for (const PublishedRun& run : torchtitan_cp_runs()) {
    const PlanResult r = predict_published(run, e);
    const double p = published_metric(run, r);
    if (run.cp == 1) published_base = run.published, predicted_base = p;
    const double err = error(p / predicted_base, run.published / published_base);
    const bool good = std::fabs(err) <= tol;
    char doubling[64] = "";
    if (run.cp > 1)
      std::snprintf(doubling, sizeof(doubling), "x%.2f / x%.2f", published_before / run.published, predicted_before / p);
    std::printf("%-12s | %9.0f %7.3f | %9.0f %7.3f | %+12.1f%% | %-15s%s\n", run.name.c_str(), run.published,
                run.published / published_base, p, p / predicted_base, 100 * err, doubling,
                verdict(good, run.source + " " + run.name, run.exception));
    print_command(run, r, e);
    published_before = run.published, predicted_before = p;
  }
  std::printf("\n");

  PublishedRun ds = deepseek_v3_run();
  const PlanResult r = predict_published(ds, e);
  auto hours = [&](const PlanResult& x) { return 1e12 / (x.tokens_per_s / ds.gpus) / 3600; };
  const double ds_err = error(hours(r), kDeepSeekGpuHoursPerTrillion);
  const bool ds_good = std::fabs(ds_err) <= moe_tol;
  std::printf("5. DeepSeek-V3 (arXiv 2412.19437) on 2,048 H800: PP 16 (dualpipev) x EP 64, ZeRO-1 DP 128, no TP; "
              "15,360 x 4,096 tokens a step; FP8 products and cached inputs, the all-to-alls behind DualPipe's other "
              "micro-batch (--fp8 --fp8-activations --ep-overlap)\n");
  std::printf("   H800 GPU hours per trillion tokens: published %s, predicted %s (%+.1f%%, within %.0f%%: a mixture of "
              "experts)%s\n   step: %s\n",
              format_count(kDeepSeekGpuHoursPerTrillion).c_str(), format_count(hours(r)).c_str(), 100 * ds_err,
              100 * moe_tol, verdict(ds_good, "DeepSeek-V3 GPU hours"), split(r).c_str());
  std::printf("   memory per GPU (stage %d): parameters %s (routed experts %s), gradients %s, optimizer %s, activations "
              "%s (logits %s), buffers %s: peak %s of %s: %s\n",
              r.stage, format_bytes(r.params_bytes).c_str(), format_bytes(r.expert_params_bytes).c_str(),
              format_bytes(r.grads_bytes).c_str(), format_bytes(r.optim_bytes).c_str(),
              format_bytes(r.memory.activations).c_str(), format_bytes(r.logits_bytes).c_str(),
              format_bytes(r.memory.transient).c_str(), format_bytes(r.memory.peak()).c_str(),
              format_bytes(published_inputs(ds, e).cluster.memory_bytes).c_str(), r.fits ? "fits" : "DOES NOT FIT");
  print_command(ds, r, e);
  // What each setting is worth: the same configuration without it.
  PublishedRun without = ds;
  without.ep_overlap = false;
  const PlanResult exposed = evaluate_plan(published_inputs(without, e), r.config, true);
  without = ds;
  without.fp8 = false;
  const PlanResult bf16 = evaluate_plan(published_inputs(without, e), r.config, true);
  std::printf("   without --ep-overlap (the all-to-alls exposed): %s; without --fp8 (the products at the bf16 peak): %s\n\n",
              format_count(hours(exposed)).c_str(), format_count(hours(bf16)).c_str());
  std::printf("6. Memory against torchtitan's measured peaks (GiB, the largest over the GPUs; its Llama 3 H100 benchmark): "
              "the activations replayed in the schedule's order, PyTorch's loss at 12 bytes a logit, 16 under TP's "
              "loss_parallel (--loss-bytes), DTensor's SP keeping the gathered inputs (--sp-gathered-inputs)\n");
  std::printf("%-20s | %9s %9s %7s | %s\n", "run", "measured", "predicted", "error", "predicted: model state + activations (logits) + buffers");
  for (const PublishedRun& run : torchtitan_memory_runs()) {
    const PlanResult r = predict_published(run, e);
    const double gib = r.memory.peak() / GiB_bytes, err = error(gib, run.published);
    const bool good = std::fabs(err) <= tol;
    std::printf("%-20s | %9.1f %9.1f %+6.1f%% | %.1f + %.1f (%.1f) + %.1f GiB%s\n", run.name.c_str(), run.published, gib,
                100 * err, r.memory.model_state / GiB_bytes, r.memory.activations / GiB_bytes, r.logits_bytes / GiB_bytes,
                r.memory.transient / GiB_bytes, verdict(good, run.source + " " + run.name));
    print_command(run, r, e);
  }
  std::printf("\n");
  if (!exceptions.empty()) {
    std::printf("outside the threshold with a stated reason (docs/planner.md says what was looked for):\n");
    for (const auto& x : exceptions) std::printf("  %s: %s\n", x.first.c_str(), x.second.c_str());
  }
  if (misses.empty()) {
    std::printf(exceptions.empty() ? "every check holds\n" : "every other check holds\n");
  } else {
    std::printf("outside the threshold without a stated reason:");
    for (const std::string& m : misses) std::printf(" %s;", m.c_str());
    std::printf("\n");
  }
  return misses.empty() ? 0 : 1;
}

int print_kernel_rates() {
  const double depths[] = {512, 1024, 2048, 4096, 8192, 16384};
  std::printf("Dense bf16 products: share of the data sheet's peak by contraction depth K (the ceiling at its own "
              "depth and deeper)\n%-5s %-28s", "GPU", "ceiling (rows x n x k)");
  for (double d : depths) std::printf(" K %-6.0f", d);
  std::printf("\n");
  for (const char* gpu : {"A100", "H100", "H800", "H200"}) {
    DenseRateTable t;
    if (!find_dense_rate_table(gpu, &t)) continue;
    char best[64];
    std::snprintf(best, sizeof(best), "%.1f/%.0f (%.0fx%.0fx%.0f)", t.best.tflops, t.peak_tflops, t.best.rows, t.best.n,
                  t.best.k);
    std::printf("%-5s %-28s", gpu, best);
    for (double d : depths) std::printf(" %8.3f", dense_product_efficiency(t, d));
    std::printf("\n");
    if (std::string(gpu) == "H200") std::printf("  sources: %s; depth: %s\n", t.ceiling_source.c_str(), t.depth_source.c_str());
  }
  const double seqs[] = {512, 1024, 2048, 4096, 8192, 16384};
  std::printf("\nFlash attention, forward: share of peak by kernel, head size and keys a query sees (past 16K: the "
              "16K bar)\n%-5s %-6s %4s", "GPU", "kernel", "hd");
  for (double q : seqs) std::printf(" T %-6.0f", q);
  std::printf("\n");
  for (const char* gpu : {"A100", "H100"}) {
    for (const char* kernel : {"fa2", "fa3", "cudnn"}) {
      AttentionRateTable t;
      if (!find_attention_rate_table(gpu, kernel, &t)) {
        if (std::string(kernel) == "fa2") std::printf("%-5s none transcribed: attention at the products' ceiling\n", gpu);
        continue;
      }
      for (double hd : {64.0, 128.0, 256.0}) {
        std::printf("%-5s %-6s %4.0f", gpu, kernel, hd);
        for (double q : seqs) std::printf(" %8.3f", attention_kernel_efficiency(t, hd, q));
        std::printf("\n");
      }
    }
  }
  AttentionRateTable h100;
  find_attention_rate_table("H100", "fa2", &h100);
  std::printf("  H800, H200: the H100's (the same chip). source: %s\n", h100.source.c_str());
  std::printf("\nFlash attention, backward: its rate against the forward's, by kernel, head size and keys a query "
              "sees (2.5 x the forward's FLOPs at this x the forward's rate; causal taken as unmasked)\n%-5s %-6s %4s",
              "GPU", "kernel", "hd");
  for (double q : seqs) std::printf(" T %-6.0f", q);
  std::printf("\n");
  for (const char* kernel : {"fa2", "fa3", "cudnn"}) {
    AttentionRateTable t;
    find_attention_rate_table("H100", kernel, &t);
    for (double hd : {64.0, 128.0}) {
      std::printf("%-5s %-6s %4.0f", "H100", kernel, hd);
      for (double q : seqs) std::printf(" %8.3f", attention_backward_factor(t, hd, q));
      std::printf("\n");
    }
  }
  std::printf("  H800, H200: the H100's. source: %s\n", h100.backward_source.c_str());
  const double rows[] = {128, 256, 512, 1024, 2048, 4096};
  std::printf("\nGrouped expert products: rate against the dense product of the same (n, k), by rows per expert\n"
              "%-12s", "n x k");
  for (double r : rows) std::printf(" rows %-5.0f", r);
  std::printf("\n");
  GroupedRateTable g;
  find_grouped_rate_table("H100", &g);
  for (const auto& nk : {std::pair<double, double>{4096, 7168}, {7168, 2048}}) {
    std::printf("%5.0f x %-5.0f", nk.first, nk.second);
    for (double r : rows) std::printf(" %10.3f", grouped_expert_factor(g, r, nk.first, nk.second));
    std::printf("\n");
  }
  std::printf("  every GPU: %s\n", g.source.c_str());
  return 0;
}
