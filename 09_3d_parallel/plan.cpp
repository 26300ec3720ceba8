// 09_3d_parallel/plan.cpp: choose a TP x CP x PP x DP (x EP) configuration before spending the GPUs.
//
// Given a model and a cluster, the planner (common/planner/planner.h) tries every tensor-, context-,
// pipeline-, data- and expert-parallel degree (placed as the published runs place them: TP inside a
// node, then CP, then DP, EP over DP x CP, PP outermost), schedule, micro-batch, virtual stages, ZeRO
// stage and recomputation, predicts each one's memory per GPU by category and its step split into
// compute, TP, CP, PP, DP, EP and bubble, and shows the best. Nothing is run: it is the arithmetic of
// docs/theory.md, applied to a cluster we do not have. The uses:
//   plan --model megatron-146b --cluster dgx-a100 --gpus 1536 --batch 2304     the best configurations
//   plan --model llama3-405b --nodes 2048 --seq-len 131072 --tokens-per-batch 16777216   a published shape
//   plan --model gpt2 --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 --zero 1 ...    the best of those
//   plan --one --model small --cluster emulated --gpus 2 --batch 8 --zero 1    one configuration, every stage
//   plan --one --model small --cluster emulated --gpus 2 --batch 8 --cp 2      chapter 10's grid (--ep: 11's)
//   plan --one --model moe-tiny --cluster emulated --gpus 8 --batch 8 --cp 2 --tp 2 --pp 2 --ep 4 --sequence-parallel
//        --micro-batches 4                                                    chapter 12's composed grid
//   plan --one --model small --cluster namespaces --inter-gbps 0.1 --gpus 4 --tp 2   on make cluster-up's nodes
//   plan --megatron docs/data/megatron_table1.csv                              against Megatron-LM's Table 1
//   plan --published                          against Megatron-Core on H100, Llama 3, GPT-OSS, torchtitan, DeepSeek-V3
//   plan --kernel-rates                       the published kernel rates every product and attention is priced at
//   plan --heatmap results/plan_heatmap.csv                                     best per model, node count, sequence
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/check.h"
#include "planner/checkpoint_scale.h"  // checkpoint_at_scale: the checkpoint line of --one
#include "training/flags.h"
#include "base/metrics.h"  // format_bytes
#include "planner/plan_published.h"
#include "planner/plan_record.h"
#include "planner/plan_report.h"  // the published comparisons' tables
#include "planner/planner.h"
#include "planner/planner_kernel_rates.h"  // the attention kernels --attention-kernel names

namespace {

struct Options {
  std::string model = "megatron-146b", cluster = "dgx-a100";
  int gpus = 0, nodes = 0, batch = 0, top = 8, gpus_per_node = 0;
  double efficiency = 0;  // 0: the calibrated constant below
  double elementwise_rate = -1;  // -1: the cluster's
  double peak_flops = 0, memory_gb = 0, inter_gbps = -1, inter_latency_us = -1, intra_gbps = -1, intra_latency_us = -1;
  // A single configuration (or a restriction of the search) when given.
  int tp = 0, pp = 0, cp = 0, ep = 0, virtual_stages = 0, micro_batch = 0, zero = -1;
  int seq_len = 0;
  double tokens_per_batch = 0, capacity_factor = -1;
  std::string cp_method = "ring";
  bool tp_overlap = false, published = false, kernel_rates = false;
  // A published run's implementation (PlanInputs): each names the setting the run used.
  double attention_efficiency = 0;  // 0: the products' efficiency
  double fp8_speedup = 2, loss_bytes = 4, allocator_overhead = 0;
  double storage_tbps = 0;  // the storage's aggregate write bandwidth, for the checkpoint line (0: not given)
  bool fp8 = false, fp8_activations = false, ep_overlap = false, no_dp_overlap = false;
  std::string schedule, recompute, attention = "flash", attention_kernel = "cudnn";
  bool sequence_parallel = false, no_sequence_parallel = false, runnable_here = false;
  int micro_batches = 0;
  bool one = false;
  std::string megatron, heatmap;
  int calibration_row = 6;
};

// The efficiency of a cluster with no kernel-rate table and no calibration of its own (the CPU
// clusters until `make plan-check` calibrates them): Megatron-Core's H100 177B row priced at one
// efficiency, without the tables. The GPU clusters carry their own residual over the tables
// (planner_presets.cpp), which `plan --published` and `plan --megatron` recompute.
constexpr double kCalibratedEfficiency = 0.4892;

// Fits its column whatever the magnitude (--efficiency 1e-300 makes a step last 1e+290 s).
std::string seconds(double s) {
  char text[32];
  if (s >= 1e4) std::snprintf(text, sizeof(text), "%.3g s", s);
  else if (s >= 1) std::snprintf(text, sizeof(text), "%.2f s", s);
  else std::snprintf(text, sizeof(text), "%.1f ms", s * 1e3);
  return text;
}

void print_header(const PlanInputs& in, const std::string& note) {
  const ModelShape m = plan_shape(in);
  std::printf("model %s: L=%d C=%d NH=%d T=%d V=%d", m.name.c_str(), m.L, m.C, m.NH, m.T, m.V);
  if (!in.chapters_model) {
    std::printf(" KV=%d F=%d %s %s", m.kv(), m.ffn, m.gated ? "SwiGLU" : "GELU", m.tied ? "tied" : "untied");
    if (m.moe())
      std::printf(" | %d experts top-%d of width %d, %d shared, %d dense layers", m.experts, m.top_k, m.expert_ffn,
                  m.shared_experts, m.dense_layers);
    std::printf(" | %.4gB parameters, %.4gB active", total_params(m) / 1e9, active_params(m) / 1e9);
  }
  std::printf(" (%s)\n", note.c_str());
  const int nodes = (in.gpus + in.cluster.gpus_per_node - 1) / in.cluster.gpus_per_node;
  std::printf("cluster %s: %s; %d GPUs (%d node%s), %s each\n", in.cluster.name.c_str(),
              describe_cluster(in.cluster).c_str(), in.gpus, nodes, nodes > 1 ? "s" : "",
              format_bytes(in.cluster.memory_bytes).c_str());
  DenseRateTable table;
  const bool residual = find_dense_rate_table(in.cluster.gpu, &table);
  const std::string& source = in.cluster.efficiency_source;
  std::printf("global batch %d sequences of %d tokens (%s tokens) | compute efficiency %.4g (%s; --efficiency%s%s) | "
              "attention %s\n",
              in.batch, m.T, format_count(double(in.batch) * m.T).c_str(), in.efficiency,
              residual ? "the residual factor over the kernel-rate tables" : "fraction of peak the dense math reaches",
              source.empty() ? "" : ", the cluster's, calibrated on ", source.c_str(),
              in.chapters_model ? (in.ring_attention    ? "ring (chapter 10's blockwise kernel)"
                                   : in.flash_attention ? "flash where the head size allows"
                                                        : "materialized")
                                : "flash (causal: T/2 keys a query)");
  if (!in.chapters_model) {
    std::printf("TP collectives %s | CP by %s | EP at balanced routing, capacity factor %s, all-to-alls %s | elementwise "
                "work at %.3g TB/s\n",
                in.tp_overlap ? "behind the products (--tp-overlap)" : "exposed (--tp-overlap hides them)",
                in.cp_method == ContextMethod::Ring ? "ring (--cp-method)" : "all-gather of K, V (--cp-method)",
                in.capacity_factor > 0 ? std::to_string(in.capacity_factor).c_str() : "none (dropless)",
                in.ep_overlap ? "behind another micro-batch's compute (--ep-overlap)" : "exposed (--ep-overlap hides them)",
                in.cluster.memory_bandwidth / 1e12);
    char products[96];
    if (in.fp8) std::snprintf(products, sizeof(products), "in FP8, %g x bf16's rate (--fp8, --fp8-speedup)", in.fp8_speedup);
    else std::snprintf(products, sizeof(products), "in bf16 (--fp8: FP8)");
    char attention[160];
    if (in.attention_efficiency > 0)
      std::snprintf(attention, sizeof(attention), "at %.3g of peak (--attention-efficiency)", in.attention_efficiency);
    else if (residual)
      std::snprintf(attention, sizeof(attention), "by %s's table x the residual (--attention-kernel)", in.attention_kernel.c_str());
    else
      std::snprintf(attention, sizeof(attention), "at the products' rate (no kernel table for this GPU)");
    std::printf("matrix products %s | products' inputs kept in %s | attention %s | DP's traffic %s\n",
                products,
                in.fp8_activations ? "one byte (--fp8-activations)" : "bf16 (--fp8-activations: one byte)", attention,
                in.dp_overlap ? "behind the backward and forward" : "after the backward (--no-dp-overlap)");
  } else if (!in.dp_overlap) {
    std::printf("DP's gradients all-reduced after the backward (--no-dp-overlap)\n");
  }
  if (in.cluster.elementwise_rate > 0)
    std::printf("the rest of the compute (not matrix products): activation bytes at %.3g GB/s (--elementwise-rate)\n",
                in.cluster.elementwise_rate / 1e9);
}

// `chapters`: the model is one the chapters build, and what they cannot run yet is said.
void print_table(const std::vector<PlanResult>& results, int count, bool chapters = true) {
  std::printf("%-3s %-66s %9s %9s %9s %9s %9s %9s | %9s %8s %8s %8s %8s %8s %8s %8s %9s | %10s %6s\n", "#",
              "configuration", "params", "grads", "optim", "activ", "buffers", "peak", "compute", "TP", "CP", "PP",
              "DP", "EP", "bubble", "embed", "step", "tokens/s", "MFU");
  for (int i = 0; i < count && i < int(results.size()); i++) {
    const PlanResult& r = results[i];
    std::printf("%-3d %-66s %9s %9s %9s %9s %9s %9s | %9s %8s %8s %8s %8s %8s %8s %8s %9s | %10s %5.1f%%%s\n", i + 1,
                r.config.describe().c_str(), format_bytes(r.params_bytes).c_str(), format_bytes(r.grads_bytes).c_str(),
                format_bytes(r.optim_bytes).c_str(), format_bytes(r.memory.activations).c_str(),
                format_bytes(std::max(r.memory.transient, r.memory.checkpoint)).c_str(),
                format_bytes(r.memory.peak()).c_str(), seconds(r.compute_s).c_str(), seconds(r.tp_s).c_str(),
                seconds(r.cp_s).c_str(), seconds(r.pp_s).c_str(), seconds(r.dp_s).c_str(), seconds(r.ep_s).c_str(),
                seconds(r.bubble_s).c_str(), seconds(r.embedding_s).c_str(), seconds(r.step_s).c_str(),
                format_count(r.tokens_per_s).c_str(), 100 * r.mfu, r.fits ? "" : "  DOES NOT FIT");
    const std::string why = chapters ? not_runnable_here(r.config) : "";
    if (!why.empty()) std::printf("    (not runnable by our chapters yet: %s)\n", why.c_str());
    if (!r.fits) std::printf("    %s\n", r.overflow.c_str());
  }
}

void print_legend() {
  std::printf("(memory: the GPU with the largest peak, by category; peak adds communication buffers; time: one step "
              "on the slowest rank: compute with recomputation, exposed TP collectives, exposed CP traffic (ring "
              "hops or all-gathers), what the pipeline's messages add to it, exposed DP, exposed EP all-to-alls, "
              "the pipeline's bubble (idle time with free links; 08's simulator), the tied embedding's all-reduce; "
              "docs/planner.md)\n");
}

int run_search(const PlanInputs& in, const Options& opt, const SearchSpace& space, const std::string& note) {
  print_header(in, note);
  const std::vector<PlanResult> results = search_plans(in, space);
  int fitting = 0;
  for (const PlanResult& r : results) fitting += r.fits;
  std::printf("%zu configurations predicted, %d fit in memory\n\n", results.size(), fitting);
  if (results.empty()) {  // not memory: every grid is refused before its memory is forecast
    std::printf("%s\n", why_no_configuration(in, space).c_str());
    return 1;
  }
  if (fitting == 0) {
    std::printf("nothing fits on %d GPUs of %s; the least short:\n", in.gpus, format_bytes(in.cluster.memory_bytes).c_str());
    print_table(results, 3, in.chapters_model);
    print_legend();
    return 1;
  }
  std::printf("best configurations:\n");
  print_table(results, std::min(opt.top, fitting), in.chapters_model);
  const std::vector<PlanResult> grids = best_per_grid(in, results);
  std::printf("\nbest per grid (tp, cp, pp, ep), simulated:\n");
  print_table(grids, opt.top, in.chapters_model);
  // What does not fit, and why: the fastest-looking of those that overflow.
  std::vector<PlanResult> overflowing;
  for (const PlanResult& r : results)
    if (!r.fits && overflowing.size() < 3) overflowing.push_back(r);
  if (!overflowing.empty()) {
    std::printf("\nsome that do not fit:\n");
    print_table(overflowing, 3, in.chapters_model);
  }
  print_legend();
  return fitting > 0 ? 0 : 1;
}

// What the published sources report, per GPU: tokens/s, model TFLOP/s by the source's own count, GPU
// hours per trillion tokens. `plan --published` and `--megatron` print the same numbers for their rows.
void print_per_gpu(const PlanInputs& in, const PlanResult& r) {
  const double tokens = r.tokens_per_s / in.gpus;
  std::printf("per GPU: %.1f tokens/s | model TFLOP/s %.1f (%s) | GPU hours per trillion tokens %.1fk\n", tokens,
              model_tflops_per_gpu(in, r), model_flops_count_name(in), 1e12 / tokens / 3600 / 1e3);
}

// One configuration, every pipeline stage's memory, and a machine-readable line for scripts/plan/plan_check.sh.
int run_one(const PlanInputs& in, const Options& opt, const std::string& note) {
  PlanConfig c;
  c.tp = opt.tp > 0 ? opt.tp : 1;
  c.pp = opt.pp > 0 ? opt.pp : 1;
  c.cp = opt.cp > 0 ? opt.cp : 1;
  c.ep = opt.ep > 0 ? opt.ep : 1;
  if (in.gpus % (c.tp * c.pp * c.cp)) config_error("--tp x --cp x --pp must divide --gpus");
  c.dp = in.gpus / (c.tp * c.pp * c.cp);
  if (!opt.schedule.empty() && !parse_schedule(opt.schedule, &c.schedule))
    config_error("--schedule " + opt.schedule + ": choose " + schedule_names());
  // zb-v and dualpipev hold two chunks a rank, in a V: their only v.
  c.virtual_stages = opt.virtual_stages > 0 ? opt.virtual_stages : placement_of(c.schedule) == Placement::V ? 2 : 1;
  c.micro_batches = opt.micro_batches > 0 ? opt.micro_batches : 1;
  if (long(c.dp) * c.micro_batches > in.batch || (opt.micro_batch == 0 && in.batch % (long(c.dp) * c.micro_batches)))
    config_error("--batch " + std::to_string(in.batch) + " does not split over dp " + std::to_string(c.dp) +
                 " (--gpus / (--tp x --cp x --pp)) x --micro-batches " + std::to_string(c.micro_batches) +
                 ": give a --batch that dp x m divides");
  c.micro_batch = opt.micro_batch > 0 ? opt.micro_batch : in.batch / (c.dp * c.micro_batches);
  if (long(c.dp) * c.micro_batch * c.micro_batches != in.batch)
    config_error("--batch " + std::to_string(in.batch) + " is not dp " + std::to_string(c.dp) + " x --micro-batch " +
                 std::to_string(c.micro_batch) + " x --micro-batches " + std::to_string(c.micro_batches));
  c.zero = opt.zero >= 0 ? opt.zero : 0;
  if (!opt.recompute.empty() && !parse_recompute(opt.recompute, &c.recompute))
    config_error("--recompute " + opt.recompute + ": choose none, selective or full");
  c.sequence_parallel = opt.sequence_parallel;
  const PlanResult r = evaluate_plan(in, c, true);
  if (!r.invalid.empty()) config_error(c.describe() + ": " + r.invalid);
  print_header(in, note);
  print_table({r}, 1, in.chapters_model);
  print_per_gpu(in, r);
  if (!in.chapters_model && r.product_share > 0)
    std::printf("kernel rates (%s's tables; docs/planner.md): the products at %.3f of peak (FLOP-weighted over their "
                "depths and passes), attention (%s) at %.3f, each x the residual %.4g (--efficiency)\n",
                in.cluster.gpu.c_str(), r.product_share,
                in.attention_efficiency > 0 ? "--attention-efficiency" : in.attention_kernel.c_str(),
                in.attention_efficiency > 0 ? in.attention_efficiency : r.attention_share, in.efficiency);
  if (!in.chapters_model && in.shape.moe())
    std::printf("routed experts: %.0f rows each a micro-batch, their grouped products at %.3f of the dense products' "
                "rate (%s; docs/planner.md, kernel rates)\n",
                r.expert_rows, r.expert_rate_factor,
                in.cluster.gpu.empty() ? "no kernel table for this cluster: the dense rate"
                                       : (in.cluster.gpu + "'s kernel table, DeepGEMM's H800 rows").c_str());
  // A sharded checkpoint of this run (docs/theory.md, section 19): every element once, 12 bytes a
  // parameter, each GPU its own slices (and, under --async-save, its staged copy of them).
  if (!in.chapters_model) {
    const double psi = total_params(plan_shape(in));
    const CheckpointScale ck = checkpoint_at_scale(psi, in.gpus, opt.storage_tbps * 1e12, 50e9);
    std::printf("checkpoint: 12 Psi = %.2f TB, %.1f MB per GPU", ck.bytes / 1e12, ck.bytes_per_gpu / 1e6);
    if (opt.storage_tbps > 0)
      std::printf(", a sharded save %.1f s at %.3g TB/s (one writer at 50 GB/s: %.0f s)", ck.sharded_s, opt.storage_tbps,
                  ck.single_writer_s);
    else
      std::printf(" (--storage-tbps gives a save's time)");
    std::printf("\n");
  }
  std::printf("per stage (pipeline rank), model state by category%s:\n",
              in.chapters_model ? ", padded as allocated" : "");
  std::printf("  %-6s %12s %12s %12s %12s %12s %12s\n", "stage", "params", "grads", "optim", "activations", "buffers", "peak");
  for (int stage = 0; stage < c.pp; stage++) {
    const StageMemory sm = in.chapters_model ? stage_memory(in, c, stage) : r.stages[size_t(stage)];
    std::printf("  %-6d %12s %12s %12s %12s %12s %12s\n", stage, format_bytes(sm.params_bytes).c_str(),
                format_bytes(sm.grads_bytes).c_str(), format_bytes(sm.optim_bytes).c_str(),
                format_bytes(sm.memory.activations).c_str(), format_bytes(sm.memory.transient).c_str(),
                format_bytes(sm.memory.peak()).c_str());
    std::printf("plan-json {\"stage\": %d, \"params_bytes\": %.0f, \"grads_bytes\": %.0f, \"optim_bytes\": %.0f, "
                "\"activations_bytes\": %.0f, \"transient_bytes\": %.0f, \"step_s\": %.9g, \"compute_s\": %.9g, "
                "\"tp_s\": %.9g, \"bubble_s\": %.9g, \"pp_s\": %.9g, \"dp_s\": %.9g, \"embedding_s\": %.9g, \"cp_s\": %.9g, "
                "\"ep_s\": %.9g}\n",
                stage, sm.params_bytes, sm.grads_bytes, sm.optim_bytes, sm.memory.activations, sm.memory.transient,
                r.step_s, r.compute_s, r.tp_s, r.bubble_s, r.pp_s, r.dp_s, r.embedding_s, r.cp_s, r.ep_s);
  }
  print_legend();
  return 0;
}

int run_megatron(const Options& opt) {
  const std::vector<RecordRow> rows = read_megatron_table(opt.megatron);
  if (opt.calibration_row < 0 || opt.calibration_row >= int(rows.size()))
    config_error("--calibration-row " + std::to_string(opt.calibration_row) + ": the table has rows 0.." +
                 std::to_string(rows.size() - 1));
  double efficiency = 0;
  const std::vector<RecordComparison> cmp = compare_with_record(rows, opt.calibration_row, &efficiency);
  Cluster a100;
  find_cluster("dgx-a100", &a100);
  std::printf("Megatron-LM, Table 1 (Narayanan et al. 2021) against the planner: DGX A100 80GB, 312 TFLOP/s bf16, "
              "NVLink in a node, 8 x 200 Gb/s InfiniBand a node\n");
  std::printf("efficiency calibrated on the %s row (t %d, p %d, %d GPUs): %.4f (plan's default: %.4f)\n",
              rows[opt.calibration_row].name().c_str(), rows[opt.calibration_row].tp, rows[opt.calibration_row].pp,
              rows[opt.calibration_row].gpus, efficiency, a100.efficiency);
  std::printf("the paper's configuration: its t, p, d and batch, full recomputation, interleaved where p > 1, the "
              "gradients all-reduced after the backward, attention's matrices; micro-batch and v the planner's fastest\n\n");
  std::printf("%-8s %3s %3s %4s %5s %5s | %8s %9s %7s | %-19s %-6s | %-7s %s\n", "model", "t", "p", "d", "GPUs", "batch",
              "paper TF", "predicted", "error", "predicted (B m v)", "fits?", "(t,p) #", "planner's best with the paper's techniques");
  int within = 0, in_top5 = 0;
  for (const RecordComparison& c : cmp) {
    const RecordRow& r = c.row;
    const PlanConfig& pc = c.paper_config.config;
    char chosen[64];
    std::snprintf(chosen, sizeof(chosen), "B %d m %d v %d", pc.micro_batch, pc.micro_batches, pc.virtual_stages);
    const std::string rank = c.paper_grid_rank < 0 ? "-" : "#" + std::to_string(c.paper_grid_rank + 1);
    const std::string best = c.best.empty() || !c.best.front().fits ? "nothing fits" : c.best.front().config.describe();
    std::printf("%-8s %3d %3d %4d %5d %5d | %8.0f %9.1f %+6.1f%% | %-19s %-6s | %-7s %s\n", r.name().c_str(), r.tp, r.pp,
                r.gpus / (r.tp * r.pp), r.gpus, r.batch, r.tflops_per_gpu, c.predicted_tflops, 100 * c.relative_error,
                chosen, c.paper_config.fits ? "yes" : "no", rank.c_str(), best.c_str());
    std::printf("    $ %s\n", one_command(record_inputs(r, efficiency), pc).c_str());
    within += std::abs(c.relative_error) <= 0.15;
    in_top5 += c.paper_grid_rank >= 0 && c.paper_grid_rank < 5;
  }
  std::printf("\n%d of %zu rows predicted within 15%%; the paper's (t, p) among the planner's top five (t, p) in %d of %zu "
              "(searched with the paper's techniques, given only model, GPUs and batch)\n",
              within, cmp.size(), in_top5, cmp.size());
  for (const RecordComparison& c : cmp) {
    if (!c.paper_config.fits)
      std::printf("%s: our trainers' forecast does not fit the paper's configuration: %s\n", c.row.name().c_str(),
                  c.paper_config.overflow.c_str());
    if (c.paper_grid_rank >= 0 && c.paper_grid_rank < 5) continue;
    const PlanResult& best = c.best.front();
    if (!best.fits) {
      std::printf("%s: with the paper's techniques nothing fits our trainers' forecast (the least short: %s, %s)\n",
                  c.row.name().c_str(), best.config.describe().c_str(), best.overflow.c_str());
      continue;
    }
    std::printf("%s: the planner prefers %s, predicted %s a step against %s for the paper's configuration%s\n",
                c.row.name().c_str(), best.config.describe().c_str(), seconds(best.step_s).c_str(),
                seconds(c.paper_config.step_s).c_str(), c.paper_config.fits ? "" : " (which our forecast does not fit)");
  }
  std::printf("\nwith every technique the planner knows (ZeRO, sequence parallelism, zb-h1, selective recomputation):\n");
  for (const RecordComparison& c : cmp)
    std::printf("  %-8s %-62s %s a step (%+.0f%% against the paper's configuration)\n", c.row.name().c_str(),
                c.best_today.config.describe().c_str(), seconds(c.best_today.step_s).c_str(),
                100 * (c.best_today.step_s / c.paper_config.step_s - 1));
  return within == int(cmp.size()) ? 0 : 1;
}

// One cell of the heat map: the best configuration for `in`, as a CSV row under `panel`.
void heatmap_cell(std::FILE* out, const char* panel, const std::string& label, const PlanInputs& in, int nodes) {
  SearchSpace space;
  space.recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  const std::vector<PlanResult> results = search_plans(in, space, 8);
  const ModelShape m = plan_shape(in);
  std::fprintf(out, "%s,%s,%g,%d,%d,%d,%d,%g,", panel, label.c_str(), total_params(m), m.T, nodes, in.gpus, in.batch,
               in.efficiency);
  if (results.empty() || !results.front().fits) {
    std::fprintf(out, "0,,,,,,,,,,,,,,,0,%g\n", results.empty() ? 0.0 : results.front().memory.peak());
    return;
  }
  const PlanResult& r = results.front();
  const PlanConfig& c = r.config;
  std::fprintf(out, "1,%d,%d,%d,%d,%d,%s,%d,%d,%d,%d,%s,%d,%g,%g,%g\n", c.dp, c.tp, c.pp, c.cp, c.ep,
               c.pp > 1 ? schedule_name(c.schedule) : "-", c.virtual_stages, c.micro_batch, c.micro_batches, c.zero,
               recompute_name(c.recompute), c.sequence_parallel ? 1 : 0, r.step_s, r.mfu, r.memory.peak());
}

// Three panels on nodes of 8 H100s, 16M tokens a batch (Llama 3 405B's): dense models and mixtures of
// experts over 1 to 512 nodes, and one model over the sequence length on 64 nodes.
int run_heatmap(const Options& opt) {
  std::FILE* out = std::fopen(opt.heatmap.c_str(), "w");
  if (!out) config_error("--heatmap: cannot write " + opt.heatmap);
  Cluster h100;
  find_cluster("dgx-h100", &h100);
  const double efficiency = opt.efficiency > 0 ? opt.efficiency : h100.efficiency;
  const double tokens = 16.0 * 1024 * 1024;
  std::fprintf(out, "panel,model,params,T,nodes,gpus,batch,efficiency,fits,dp,tp,pp,cp,ep,schedule,v,micro_batch,"
                    "micro_batches,zero,recompute,sp,step_s,mfu,peak_bytes\n");
  std::printf("heat map: nodes of 8 H100s, %s tokens a batch, efficiency %.3f\n", format_count(tokens).c_str(),
              efficiency);
  auto inputs = [&](const std::string& model, int T, int nodes) {
    PlanInputs in;
    if (model == "gpt-1t") {  // Megatron-LM's proportions at 1T (gpt_like_model), as a published GPT
      in.shape = shape_of(gpt_like_model(1e12));
      in.shape.name = model, in.shape.tied = false, in.shape.learned_positions = false, in.shape.T = 4096;
      in.shape.V = 131072;
      in.chapters_model = false;
    } else {
      ENSURE(set_plan_model(model, &in), "heat map: no model " + model);
    }
    if (T > 0) set_sequence_length(&in, T);
    find_cluster("dgx-h100", &in.cluster);
    in.gpus = nodes * in.cluster.gpus_per_node;
    in.batch = int(tokens / in.shape.T);
    in.efficiency = efficiency;
    in.tp_overlap = true;
    return in;
  };
  const std::vector<std::pair<std::string, std::string>> dense = {
      {"llama3-8b", "Llama 3 8B"}, {"llama3-70b", "Llama 3 70B"}, {"mcore-177b", "GPT 177B"},
      {"llama3-405b", "Llama 3 405B"}, {"gpt-1t", "GPT 1T"}};
  const std::vector<std::pair<std::string, std::string>> moe = {{"gpt-oss-120b", "GPT-OSS 120B"},
                                                                {"deepseek-v3", "DeepSeek-V3 671B"}};
  for (const auto& panel : {std::make_pair("dense", dense), std::make_pair("moe", moe)}) {
    for (const auto& [model, label] : panel.second) {
      for (int nodes = 1; nodes <= 512; nodes *= 2) heatmap_cell(out, panel.first, label, inputs(model, 0, nodes), nodes);
      std::printf("  %s done\n", label.c_str());
      std::fflush(stdout);
    }
  }
  for (int T = 8192; T <= 131072; T *= 2) heatmap_cell(out, "sequence", "Llama 3 70B", inputs("llama3-70b", T, 64), 64);
  std::printf("  Llama 3 70B over the sequence length done\n");
  std::fclose(out);
  std::printf("wrote %s\n", opt.heatmap.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  FlagParser flags;
  flags.add("--model", &opt.model, "one of: " + plan_model_names(), "NAME");
  flags.add("--cluster", &opt.cluster, std::string("one of: ") + cluster_names(), "NAME");
  flags.add("--gpus", &opt.gpus, "GPUs (or --nodes)");
  flags.add("--nodes", &opt.nodes, "nodes of the cluster's GPUs per node");
  flags.add("--gpus-per-node", &opt.gpus_per_node, "GPUs (ranks) a node, replacing the preset's (namespaces: the "
            "hostfile's slots, which also divide the node's memory)");
  flags.add("--batch", &opt.batch, "global batch in sequences (default: 512 for large models, the preset's otherwise)");
  flags.add("--top", &opt.top, "configurations to print");
  flags.add("--efficiency", &opt.efficiency, "fraction of peak the dense math reaches (default: calibrated on Megatron-LM's Table 1)");
  flags.add("--peak-flops", &opt.peak_flops, "the cluster's peak FLOP/s per GPU, replacing the preset's");
  flags.add("--elementwise-rate", &opt.elementwise_rate,
            "activation bytes a second at which the work that is not a matrix product runs (0: counted in the "
            "dense FLOPs; default: the cluster's)");
  flags.add("--memory-gb", &opt.memory_gb, "memory per GPU in GB (10^9 bytes), replacing the preset's");
  flags.add("--intra-gbps", &opt.intra_gbps, "link inside a node, Gb/s per GPU (replaces the preset's)");
  flags.add("--intra-latency-us", &opt.intra_latency_us, "its latency per message");
  flags.add("--inter-gbps", &opt.inter_gbps, "link between nodes, Gb/s per GPU (replaces the preset's)");
  flags.add("--inter-latency-us", &opt.inter_latency_us, "its latency per message");
  flags.add("--tp", &opt.tp, "only this tensor-parallel degree");
  flags.add("--pp", &opt.pp, "only this pipeline-parallel degree");
  flags.add("--cp", &opt.cp, "only this context-parallel degree (ranks sharing each sequence)");
  flags.add("--ep", &opt.ep, "only this expert-parallel degree (ranks of DP x CP sharing the experts)");
  flags.add("--seq-len", &opt.seq_len, "the sequence length T, replacing the model's");
  flags.add("--tokens-per-batch", &opt.tokens_per_batch, "the global batch in tokens (a multiple of T; or --batch)");
  flags.add("--capacity-factor", &opt.capacity_factor, "a mixture of experts: each expert takes at most this x its "
            "balanced share (0: dropless)");
  flags.add("--cp-method", &opt.cp_method, "how CP meets every key: ring (chapter 10) or all-gather (Llama 3)", "HOW");
  flags.add_switch("--tp-overlap", &opt.tp_overlap, "TP's collectives hidden behind the products (Megatron-Core's "
                   "--tp-comm-overlap; a published shape only)");
  flags.add("--attention-efficiency", &opt.attention_efficiency, "a published shape: the fraction of peak the attention "
            "kernel reaches, replacing the kernel-rate table's (docs/planner.md)");
  flags.add("--attention-kernel", &opt.attention_kernel, "a published shape: the attention kernel whose published "
            "rates (by head size and sequence) price attention: cudnn (Transformer Engine's, the default), fa3, or fa2 "
            "(PyTorch's SDPA)", "KERNEL");
  flags.add_switch("--fp8", &opt.fp8, "a published shape: the matrix products in FP8, at twice the bf16 peak "
                   "(DeepSeek-V3, torchtitan's Float8)");
  flags.add("--fp8-speedup", &opt.fp8_speedup, "with --fp8: the products' rate in FP8 against bf16 (default 2, the "
            "peak's ratio; torchtitan's Float8 measured 1.28 end to end: docs/planner.md)");
  flags.add("--loss-bytes", &opt.loss_bytes, "a published shape: bytes a logit holds at the loss's peak (4: a fused "
            "fp32 cross entropy, Megatron's; 12: PyTorch's cross_entropy on logits.float(), torchtitan's)");
  flags.add("--storage-tbps", &opt.storage_tbps, "a published shape: the storage's aggregate write bandwidth in TB/s, "
            "for the time of a sharded save (Llama 3's Tectonic: 2 sustained; docs/checkpoint.md)");
  flags.add("--allocator-overhead", &opt.allocator_overhead, "a published shape: the caching allocator's reserve over "
            "the activations and buffers, a fraction (PyTorch reports reserved memory; 0: exact)");
  flags.add_switch("--fp8-activations", &opt.fp8_activations, "a published shape: the products' cached inputs in one "
                   "byte (DeepSeek-V3's FP8 activations)");
  flags.add_switch("--ep-overlap", &opt.ep_overlap, "a published shape with experts: the all-to-alls hidden behind "
                   "another micro-batch's compute (DualPipe)");
  flags.add_switch("--no-dp-overlap", &opt.no_dp_overlap, "DP's gradients all-reduced after the backward, not during "
                   "it (Megatron-LM in 2021)");
  flags.add("--schedule", &opt.schedule, "only this pipeline schedule: " + schedule_names(), "NAME");
  flags.add("--virtual-stages", &opt.virtual_stages, "only this v (interleaved)");
  flags.add("--micro-batch", &opt.micro_batch, "only this micro-batch size B");
  flags.add("--zero", &opt.zero, "only this ZeRO stage, 0..3");
  flags.add("--micro-batches", &opt.micro_batches, "with --one: m, the micro-batches per step and data-parallel rank");
  flags.add_switch("--one", &opt.one, "predict exactly the configuration the flags give (defaults: tp 1, pp 1, 1f1b, "
                   "ZeRO 0, no recomputation), every stage");
  flags.add("--recompute", &opt.recompute, "only this recomputation: none, selective, full", "WHAT");
  flags.add_switch("--sequence-parallel", &opt.sequence_parallel, "only with sequence parallelism");
  flags.add_switch("--no-sequence-parallel", &opt.no_sequence_parallel, "only without sequence parallelism");
  flags.add_switch("--runnable-here", &opt.runnable_here, "only what chapters 03-09 can run (no ZeRO-2/3 with TP or "
                   "PP)");
  flags.add("--attention", &opt.attention, "flash (where the head size allows), materialized, or ring (chapter 10's "
            "blockwise kernel, which --cp > 1 implies)", "HOW");
  flags.add("--megatron", &opt.megatron, "compare with Megatron-LM's Table 1 kept in this CSV", "PATH");
  flags.add("--calibration-row", &opt.calibration_row, "the Table 1 row the efficiency is calibrated on (0-based)");
  flags.add_switch("--published", &opt.published, "compare with Megatron-Core on H100, Llama 3 405B, GPT-OSS 120B, "
                   "torchtitan's CP scaling and DeepSeek-V3 (docs/planner.md)");
  flags.add_switch("--kernel-rates", &opt.kernel_rates, "print the kernel-rate tables every published shape is priced "
                   "with, per GPU, and their sources (docs/planner.md)");
  flags.add("--heatmap", &opt.heatmap, "write the best configuration per model size and node count to this CSV", "PATH");
  if (!flags.parse(argc, argv, "usage: plan [flags]   (09_3d_parallel/plan.cpp: the best TP x CP x PP x DP (x EP) configurations, predicted)\n"))
    return 0;

  // Each flag given is checked, never dropped for its default (a zero or a negative is a mistake).
  auto given = [&](const char* flag) { return flags.given().count(flag) > 0; };
  for (const auto& [flag, value] : std::vector<std::pair<const char*, double>>{
           {"--gpus", opt.gpus}, {"--nodes", opt.nodes}, {"--gpus-per-node", opt.gpus_per_node}, {"--batch", opt.batch}, {"--top", opt.top},
           {"--efficiency", opt.efficiency}, {"--peak-flops", opt.peak_flops}, {"--memory-gb", opt.memory_gb},
           {"--cp", opt.cp}, {"--ep", opt.ep}, {"--seq-len", opt.seq_len}, {"--tokens-per-batch", opt.tokens_per_batch},
           {"--tp", opt.tp}, {"--pp", opt.pp}, {"--micro-batch", opt.micro_batch}, {"--micro-batches", opt.micro_batches},
           {"--virtual-stages", opt.virtual_stages}})
    if (given(flag) && !(value > 0)) config_error(std::string(flag) + " must be positive");
  for (const auto& [flag, value] : std::vector<std::pair<const char*, double>>{
           {"--intra-gbps", opt.intra_gbps}, {"--intra-latency-us", opt.intra_latency_us},
           {"--inter-gbps", opt.inter_gbps}, {"--inter-latency-us", opt.inter_latency_us},
           {"--elementwise-rate", opt.elementwise_rate}, {"--capacity-factor", opt.capacity_factor}})
    if (given(flag) && !(value >= 0)) config_error(std::string(flag) + " must be 0 or more");
  // Sizes no cluster or model has: a typo, not a plan (and arithmetic that would overflow an int).
  for (const auto& [flag, value, most] : std::vector<std::tuple<const char*, double, double>>{
           {"--gpus", opt.gpus, 1 << 22}, {"--nodes", opt.nodes, 1 << 20}, {"--seq-len", opt.seq_len, 1 << 24},
           {"--batch", opt.batch, 1 << 26}, {"--tokens-per-batch", opt.tokens_per_batch, 1e12},
           {"--cp", opt.cp, 1 << 16}, {"--ep", opt.ep, 1 << 16}, {"--tp", opt.tp, 1 << 16}, {"--pp", opt.pp, 1 << 16}})
    if (given(flag) && value > most)
      config_error(std::string(flag) + " " + format_count(value) + " is beyond any cluster or model the planner "
                   "knows (at most " + format_count(most) + ")");
  if (opt.efficiency > 1) config_error("--efficiency " + std::to_string(opt.efficiency) + ": a fraction of peak, at most 1");
  if (int(!opt.megatron.empty()) + int(!opt.heatmap.empty()) + int(opt.published) + int(opt.kernel_rates) > 1)
    config_error("--megatron, --published, --kernel-rates and --heatmap: give one (each is a run of its own)");
  if (opt.kernel_rates) return print_kernel_rates();

  if (!opt.megatron.empty()) return run_megatron(opt);
  if (opt.published) {
    Cluster h100;
    find_cluster("dgx-h100", &h100);
    return print_published_comparisons(h100.efficiency);
  }
  if (!opt.heatmap.empty()) return run_heatmap(opt);

  PlanInputs in;
  std::string note;
  if (!set_plan_model(opt.model, &in, &note))
    config_error("--model " + opt.model + ": choose one of " + plan_model_names());
  // A published shape is planned on the cluster it was published on unless told otherwise.
  if (!in.chapters_model && !given("--cluster")) opt.cluster = in.shape.name == "deepseek-v3" ? "hgx-h800" : "dgx-h100";
  if (!find_cluster(opt.cluster, &in.cluster))
    config_error("--cluster " + opt.cluster + ": choose one of " + cluster_names());
  Cluster& k = in.cluster;
  if (given("--gpus-per-node")) {
    // On the namespaces cluster the ranks of a node share the machine's memory, as its trainers count it.
    if (k.name == "namespaces") k = namespaces_cluster(opt.gpus_per_node);
    else k.gpus_per_node = opt.gpus_per_node;
  }
  if (given("--peak-flops")) k.peak_flops = opt.peak_flops;
  if (given("--elementwise-rate")) k.elementwise_rate = opt.elementwise_rate;
  if (given("--memory-gb")) k.memory_bytes = opt.memory_gb * 1e9;
  if (given("--intra-gbps")) k.intra_node.gbps = opt.intra_gbps;
  if (given("--intra-latency-us")) k.intra_node.latency_us = opt.intra_latency_us;
  if (given("--inter-gbps")) k.inter_node.gbps = opt.inter_gbps;
  if (given("--inter-latency-us")) k.inter_node.latency_us = opt.inter_latency_us;
  if (given("--gpus") && given("--nodes")) config_error("--gpus and --nodes: give one");
  in.gpus = given("--gpus") ? opt.gpus : given("--nodes") ? opt.nodes * k.gpus_per_node : k.gpus_per_node;
  if (given("--seq-len")) set_sequence_length(&in, opt.seq_len);
  if (given("--batch") && given("--tokens-per-batch")) config_error("--batch and --tokens-per-batch: give one");
  if (given("--tokens-per-batch")) {
    const double sequences = opt.tokens_per_batch / plan_shape(in).T;
    if (sequences < 1 || sequences != std::floor(sequences))
      config_error("--tokens-per-batch " + format_count(opt.tokens_per_batch) + " is not a whole number of sequences of " +
                   std::to_string(plan_shape(in).T) + " tokens");
    in.batch = int(sequences);
  } else {
    in.batch = given("--batch") ? opt.batch : in.model.default_batch;
  }
  if (opt.cp_method != "ring" && opt.cp_method != "all-gather")
    config_error("--cp-method " + opt.cp_method + ": choose ring or all-gather");
  in.cp_method = opt.cp_method == "ring" ? ContextMethod::Ring : ContextMethod::AllGather;
  // A published run's implementation settings time a published shape; a chapters' model is timed as
  // the chapters run it, so they are refused there, never dropped.
  if (in.chapters_model)
    for (const char* flag : {"--tp-overlap", "--fp8", "--fp8-speedup", "--fp8-activations", "--loss-bytes", "--allocator-overhead", "--storage-tbps", "--ep-overlap", "--attention-efficiency", "--attention-kernel", "--cp-method"})
      if (given(flag) && !(std::string(flag) == "--cp-method" && opt.cp_method == "ring"))
        config_error(std::string(flag) + ": a published run's implementation setting, for a published shape (" +
                     model_shape_names() + "); --model " + opt.model + " is timed as the chapters run it");
  if (!in.chapters_model) {
    if (given("--attention") && opt.attention != "flash")
      config_error("--attention " + opt.attention + ": a published shape is timed with flash attention (causal, T/2 "
                   "keys a query); --attention-efficiency sets the kernel's speed");
    if (given("--elementwise-rate"))
      config_error("--elementwise-rate: the chapters' CPU models' rate; a published shape's elementwise work runs at "
                   "the cluster's memory bandwidth");
  }
  if (given("--ep")) {
    const ModelShape m = plan_shape(in);
    if (!m.moe()) config_error("--ep " + std::to_string(opt.ep) + ": --model " + opt.model + " has no experts to spread");
    if (m.experts % opt.ep)
      config_error("--ep " + std::to_string(opt.ep) + " does not divide the " + std::to_string(m.experts) +
                   " experts of --model " + opt.model);
  }
  if (opt.ep_overlap && !plan_shape(in).moe()) config_error("--ep-overlap: --model " + opt.model + " has no experts");
  if (given("--attention-kernel")) {
    AttentionRateTable unused;
    if (!find_attention_rate_table("H100", opt.attention_kernel, &unused))
      config_error("--attention-kernel " + opt.attention_kernel + ": choose " + attention_kernel_names());
    if (given("--attention-efficiency"))
      config_error("--attention-kernel and --attention-efficiency: give one (a kernel's table, or a rate of your own)");
    if (!find_attention_rate_table(k.gpu, opt.attention_kernel, &unused))
      config_error("--attention-kernel " + opt.attention_kernel + ": no published attention rates for --cluster " +
                   k.name + (k.gpu.empty() ? "" : " (" + k.gpu + ")") + "; --attention-efficiency sets one");
  }
  in.attention_kernel = opt.attention_kernel;
  if (given("--attention-efficiency")) {
    if (!(opt.attention_efficiency > 0) || opt.attention_efficiency > 1)
      config_error("--attention-efficiency " + std::to_string(opt.attention_efficiency) + ": a fraction of peak, in (0, 1]");
    in.attention_efficiency = opt.attention_efficiency;
  }
  in.tp_overlap = opt.tp_overlap;
  if (given("--fp8-speedup") && !opt.fp8) config_error("--fp8-speedup: the products run in FP8 only with --fp8");
  if (given("--fp8-speedup") && !(opt.fp8_speedup >= 1 && opt.fp8_speedup <= 2))
    config_error("--fp8-speedup " + std::to_string(opt.fp8_speedup) + ": FP8 against bf16, from 1 to 2 (the peak's ratio)");
  in.fp8_speedup = opt.fp8_speedup;
  if (given("--storage-tbps") && !(opt.storage_tbps > 0 && opt.storage_tbps < 1e6))
    config_error("--storage-tbps " + std::to_string(opt.storage_tbps) + ": the storage's write bandwidth, TB/s, above 0");
  if (given("--loss-bytes") && !(opt.loss_bytes >= 2 && opt.loss_bytes <= 32))
    config_error("--loss-bytes " + std::to_string(opt.loss_bytes) + ": bytes a logit holds, from 2 to 32");
  if (given("--allocator-overhead") && !(opt.allocator_overhead >= 0 && opt.allocator_overhead <= 1))
    config_error("--allocator-overhead " + std::to_string(opt.allocator_overhead) + ": a fraction, from 0 to 1");
  in.loss_bytes_per_logit = opt.loss_bytes, in.allocator_overhead = opt.allocator_overhead;
  in.fp8 = opt.fp8, in.fp8_activations = opt.fp8_activations, in.ep_overlap = opt.ep_overlap;
  in.dp_overlap = !opt.no_dp_overlap;
  if (given("--capacity-factor")) {
    if (!plan_shape(in).moe()) config_error("--capacity-factor: --model " + opt.model + " has no experts");
    in.capacity_factor = opt.capacity_factor;
    in.model.capacity_factor = opt.capacity_factor;
  }
  in.efficiency = given("--efficiency") ? opt.efficiency : k.efficiency > 0 ? k.efficiency : kCalibratedEfficiency;
  if (opt.attention != "flash" && opt.attention != "materialized" && opt.attention != "ring")
    config_error("--attention " + opt.attention + ": choose flash, materialized or ring");
  in.flash_attention = opt.attention == "flash";
  in.ring_attention = opt.attention == "ring";

  if (opt.one) return run_one(in, opt, note);

  SearchSpace space;
  if (opt.tp > 0) space.tp = {opt.tp};
  if (opt.pp > 0) space.pp = {opt.pp};
  if (opt.cp > 0) space.cp = {opt.cp};
  if (opt.ep > 0) space.ep = {opt.ep};
  if (opt.virtual_stages > 0) space.virtual_stages = {opt.virtual_stages};
  if (opt.micro_batch > 0) space.micro_batch = {opt.micro_batch};
  if (opt.zero >= 0) {
    if (opt.zero > 3) config_error("--zero " + std::to_string(opt.zero) + ": a ZeRO stage, 0..3");
    space.zero = {opt.zero};
  }
  if (!opt.schedule.empty()) {
    Schedule s;
    if (!parse_schedule(opt.schedule, &s)) config_error("--schedule " + opt.schedule + ": choose " + schedule_names());
    space.schedules = {s};
  }
  if (!opt.recompute.empty()) {
    Recompute rc;
    if (!parse_recompute(opt.recompute, &rc)) config_error("--recompute " + opt.recompute + ": choose none, selective or full");
    space.recompute = {rc};
  }
  if (opt.sequence_parallel && opt.no_sequence_parallel) config_error("--sequence-parallel and --no-sequence-parallel: choose one");
  if (opt.sequence_parallel) space.sequence_parallel = {true};
  if (opt.no_sequence_parallel) space.sequence_parallel = {false};
  space.runnable_here_only = opt.runnable_here;
  return run_search(in, opt, space, note);
}
