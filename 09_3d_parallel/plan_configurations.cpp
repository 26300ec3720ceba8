// 09_3d_parallel/plan_configurations.cpp: what `plan` prints for configurations of one model on one
// cluster: the header (the model, the cluster and every setting it is timed with), the table of
// configurations by memory category and step component, the search's best (run_search) and one
// configuration with every stage (run_one, whose plan-json lines scripts/plan/plan_check.sh reads).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"    // config_error
#include "base/metrics.h"  // format_bytes, format_count
#include "planner/checkpoint_scale.h"  // checkpoint_at_scale: the checkpoint line of --one
#include "planner/plan_published.h"    // model_tflops_per_gpu
#include "planner/planner.h"
#include "planner/planner_kernel_rates.h"  // find_dense_rate_table: is the residual over tables?
#include "plan_options.h"

namespace {

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
    std::printf("matrix products %s | products' inputs kept in %s, under SP %s | attention %s | DP's traffic %s | "
                "the loss's peak %g bytes a logit (--loss-bytes)\n",
                products,
                in.fp8_activations ? "one byte (--fp8-activations)" : "bf16 (--fp8-activations: one byte)",
                in.sp_gathered_inputs ? "gathered (--sp-gathered-inputs)" : "as a rank's shard (--sp-gathered-inputs: gathered)",
                attention, in.dp_overlap ? "behind the backward and forward" : "after the backward (--no-dp-overlap)",
                in.loss_bytes_per_logit);
  } else if (!in.dp_overlap) {
    std::printf("DP's gradients all-reduced after the backward (--no-dp-overlap)\n");
  }
  if (in.cluster.elementwise_rate > 0)
    std::printf("the rest of the compute (not matrix products): activation bytes at %.3g GB/s (--elementwise-rate)\n",
                in.cluster.elementwise_rate / 1e9);
  if (in.cluster.sync_s > 0)
    std::printf("a synchronization between ranks: %.1f us, once for each blocking collective and message (--sync-us)\n",
                in.cluster.sync_s * 1e6);
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
              "hops, all-gathers or Ulysses' all-to-alls), what the pipeline's messages add to it, exposed DP, exposed EP all-to-alls, "
              "the pipeline's bubble (idle time with free links; 08's simulator), the tied embedding's all-reduce; "
              "docs/planner.md)\n");
}

// What the published sources report, per GPU: tokens/s, model TFLOP/s by the source's own count, GPU
// hours per trillion tokens. `plan --published` and `--megatron` print the same numbers for their rows.
void print_per_gpu(const PlanInputs& in, const PlanResult& r) {
  const double tokens = r.tokens_per_s / in.gpus;
  std::printf("per GPU: %.1f tokens/s | model TFLOP/s %.1f (%s) | GPU hours per trillion tokens %.1fk\n", tokens,
              model_tflops_per_gpu(in, r), model_flops_count_name(in), 1e12 / tokens / 3600 / 1e3);
}

}  // namespace

// Fits its column whatever the magnitude (--efficiency 1e-300 makes a step last 1e+290 s).
std::string seconds(double s) {
  char text[32];
  if (s >= 1e4) std::snprintf(text, sizeof(text), "%.3g s", s);
  else if (s >= 1) std::snprintf(text, sizeof(text), "%.2f s", s);
  else std::snprintf(text, sizeof(text), "%.1f ms", s * 1e3);
  return text;
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
  std::printf("\nbest per grid (tp, cp, u, pp, ep), simulated:\n");
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

// One configuration, every pipeline stage's memory, and a machine-readable line for scripts/plan/plan_check.sh.
int run_one(const PlanInputs& in, const Options& opt, const std::string& note) {
  PlanConfig c;
  c.tp = opt.tp > 0 ? opt.tp : 1;
  c.pp = opt.pp > 0 ? opt.pp : 1;
  c.cp = opt.cp > 0 ? opt.cp : 1;
  c.ep = opt.ep > 0 ? opt.ep : 1;
  c.ulysses = opt.ulysses > 0 ? opt.ulysses : 1;
  if (in.gpus % (c.tp * c.pp * c.cp * c.ulysses)) config_error("--tp x --cp x --ulysses x --pp must divide --gpus");
  c.dp = in.gpus / (c.tp * c.pp * c.cp * c.ulysses);
  if (!opt.schedule.empty() && !parse_schedule(opt.schedule, &c.schedule))
    config_error("--schedule " + opt.schedule + ": choose " + schedule_names());
  // zb-v and dualpipev hold two chunks a rank, in a V: their only v.
  c.virtual_stages = opt.virtual_stages > 0 ? opt.virtual_stages : placement_of(c.schedule) == Placement::V ? 2 : 1;
  c.micro_batches = opt.micro_batches > 0 ? opt.micro_batches : 1;
  if (long(c.dp) * c.micro_batches > in.batch || (opt.micro_batch == 0 && in.batch % (long(c.dp) * c.micro_batches)))
    config_error("--batch " + std::to_string(in.batch) + " does not split over dp " + std::to_string(c.dp) +
                 " (--gpus / (--tp x --cp x --ulysses x --pp)) x --micro-batches " + std::to_string(c.micro_batches) +
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
  if (c.ulysses > 1)
    std::printf("Ulysses %d (x ring %d): each rank holds T/(u cp) = %d positions of every head, attends NH/(t u) = %d "
                "heads; its all-to-alls send %s a rank a step (stage 0), %s on the critical path, in the CP column "
                "(docs/theory.md, section 13b)\n",
                c.ulysses, c.cp, plan_shape(in).T / c.context(), plan_shape(in).NH / (c.tp * c.ulysses),
                format_bytes(r.ulysses_bytes).c_str(), seconds(r.ulysses_s).c_str());
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
                "\"ep_s\": %.9g, \"ulysses_s\": %.9g, \"ulysses_bytes\": %.0f, \"sync_s\": %.9g}\n",
                stage, sm.params_bytes, sm.grads_bytes, sm.optim_bytes, sm.memory.activations, sm.memory.transient,
                r.step_s, r.compute_s, r.tp_s, r.bubble_s, r.pp_s, r.dp_s, r.embedding_s, r.cp_s, r.ep_s, r.ulysses_s,
                stage == 0 ? r.ulysses_bytes : 0.0, r.sync_added_s);
  }
  print_legend();
  return 0;
}
