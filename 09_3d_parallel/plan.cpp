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
//   plan --one --model small --cluster emulated --gpus 4 --batch 8 --cp 2 --ulysses 2   10's Ulysses inside a ring
//   plan --one --model moe-tiny --cluster emulated --gpus 8 --batch 8 --cp 2 --tp 2 --pp 2 --ep 4 --sequence-parallel
//        --micro-batches 4                                                    chapter 12's composed grid
//   plan --one --model small --cluster namespaces --inter-gbps 0.1 --gpus 4 --tp 2   on make cluster-up's nodes
//   plan --megatron docs/data/megatron_table1.csv                              against Megatron-LM's Table 1
//   plan --published                          against Megatron-Core on H100, Llama 3, GPT-OSS, torchtitan, DeepSeek-V3
//   plan --kernel-rates                       the published kernel rates every product and attention is priced at
//   plan --heatmap results/plan_heatmap.csv                                     best per model, node count, sequence//
// This file is the command line: every flag, each checked (a flag given is honoured or refused, never
// dropped), into PlanInputs; plan_configurations.cpp prints configurations, plan_records.cpp whole tables.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/check.h"    // config_error
#include "base/metrics.h"  // format_count
#include "planner/plan_published.h"
#include "planner/plan_report.h"  // the published comparisons' tables
#include "planner/planner.h"
#include "planner/planner_kernel_rates.h"  // the attention kernels --attention-kernel names
#include "plan_options.h"
#include "training/flags.h"

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
  flags.add("--sync-us", &opt.sync_us,
            "microseconds one synchronization between ranks costs besides the link (the wait for the peer to get a "
            "shared core; make plan-check measures it), once for each blocking collective and message");
  flags.add("--expert-load", &opt.expert_load,
            "a chapters' mixture of experts: the rows the slowest EP rank's experts run over the balanced share, from "
            "a routing measured beforehand (make plan-check: its calibration's, capped at the capacity; default 1)");
  flags.add("--product-rates", &opt.product_rates,
            "a chapters' model: the matrix products' FLOP/s by the rows of their activations, ROWS:FLOPS,... (a class "
            "a power of two; a product takes its class's rate, or the nearest measured; make plan-check measures them; "
            "replaces --peak-flops x --efficiency for the products)", "LIST");
  flags.add("--attention-rate", &opt.attention_rate,
            "a chapters' model: FLOP/s of the attention on a ring's block, which hides the ring's hop (make plan-check "
            "measures chapter 10's kernel; default: the products' rate)");
  flags.add("--memory-gb", &opt.memory_gb, "memory per GPU in GB (10^9 bytes), replacing the preset's");
  flags.add("--intra-gbps", &opt.intra_gbps, "link inside a node, Gb/s per GPU (replaces the preset's)");
  flags.add("--intra-latency-us", &opt.intra_latency_us, "its latency per message");
  flags.add("--inter-gbps", &opt.inter_gbps, "link between nodes, Gb/s per GPU (replaces the preset's)");
  flags.add("--inter-latency-us", &opt.inter_latency_us, "its latency per message");
  flags.add("--tp", &opt.tp, "only this tensor-parallel degree");
  flags.add("--pp", &opt.pp, "only this pipeline-parallel degree");
  flags.add("--cp", &opt.cp, "only this context-parallel degree (ranks sharing each sequence)");
  flags.add("--ep", &opt.ep, "only this expert-parallel degree (ranks of DP x CP x U sharing the experts)");
  flags.add("--ulysses", &opt.ulysses, "only this Ulysses degree u: ranks inside each CP place that trade positions "
            "for heads around attention (chapters 10 and 12; NH/(t u) whole heads)");
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
  flags.add_switch("--sp-gathered-inputs", &opt.sp_gathered_inputs, "a published shape under sequence parallelism: "
                   "each column-parallel product keeps its all-gathered input, t times the shard (PyTorch's DTensor "
                   "SP, torchtitan's; Megatron-Core keeps the shard)");
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
           {"--cp", opt.cp}, {"--ep", opt.ep}, {"--ulysses", opt.ulysses}, {"--seq-len", opt.seq_len}, {"--tokens-per-batch", opt.tokens_per_batch},
           {"--tp", opt.tp}, {"--pp", opt.pp}, {"--micro-batch", opt.micro_batch}, {"--micro-batches", opt.micro_batches},
           {"--virtual-stages", opt.virtual_stages}, {"--attention-rate", opt.attention_rate}})
    if (given(flag) && !(value > 0)) config_error(std::string(flag) + " must be positive");
  for (const auto& [flag, value] : std::vector<std::pair<const char*, double>>{
           {"--intra-gbps", opt.intra_gbps}, {"--intra-latency-us", opt.intra_latency_us},
           {"--inter-gbps", opt.inter_gbps}, {"--inter-latency-us", opt.inter_latency_us},
           {"--elementwise-rate", opt.elementwise_rate}, {"--capacity-factor", opt.capacity_factor}, {"--sync-us", opt.sync_us}})
    if (given(flag) && !(value >= 0)) config_error(std::string(flag) + " must be 0 or more");
  // Sizes no cluster or model has: a typo, not a plan (and arithmetic that would overflow an int).
  for (const auto& [flag, value, most] : std::vector<std::tuple<const char*, double, double>>{
           {"--gpus", opt.gpus, 1 << 22}, {"--nodes", opt.nodes, 1 << 20}, {"--seq-len", opt.seq_len, 1 << 24},
           {"--batch", opt.batch, 1 << 26}, {"--tokens-per-batch", opt.tokens_per_batch, 1e12},
           {"--cp", opt.cp, 1 << 16}, {"--ep", opt.ep, 1 << 16}, {"--ulysses", opt.ulysses, 1 << 16}, {"--tp", opt.tp, 1 << 16}, {"--pp", opt.pp, 1 << 16}})
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
  if (given("--sync-us")) k.sync_s = opt.sync_us * 1e-6;
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
    for (const char* flag : {"--tp-overlap", "--fp8", "--fp8-speedup", "--fp8-activations", "--loss-bytes", "--allocator-overhead", "--storage-tbps", "--ep-overlap", "--sp-gathered-inputs", "--attention-efficiency", "--attention-kernel", "--cp-method"})
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
    if (given("--sync-us"))
      config_error("--sync-us: the wait of CPU ranks on shared cores, for the chapters' models; a published shape's "
                   "GPUs each have their own");
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
  if (opt.sp_gathered_inputs && opt.one && !opt.sequence_parallel)
    config_error("--sp-gathered-inputs: what sequence parallelism keeps; give --sequence-parallel (and --tp > 1)");
  in.sp_gathered_inputs = opt.sp_gathered_inputs;
  in.dp_overlap = !opt.no_dp_overlap;
  if (given("--capacity-factor")) {
    if (!plan_shape(in).moe()) config_error("--capacity-factor: --model " + opt.model + " has no experts");
    in.capacity_factor = opt.capacity_factor;
    in.model.capacity_factor = opt.capacity_factor;
  }
  if (given("--expert-load")) {
    if (!in.chapters_model || !plan_shape(in).moe())
      config_error("--expert-load: a chapters' model with experts (moe-tiny, moe-small); --model " + opt.model + " has none");
    if (!(opt.expert_load > 0 && opt.expert_load <= 64))
      config_error("--expert-load " + std::to_string(opt.expert_load) + ": a ratio of rows, above 0 (1: balanced)");
    in.expert_load = opt.expert_load;
  }
  for (const char* flag : {"--product-rates", "--attention-rate"})
    if (given(flag) && !in.chapters_model)
      config_error(std::string(flag) + ": rates measured for a chapters' model on CPU ranks (make plan-check); --model " +
                   opt.model + " is a published shape, priced by the kernel-rate tables");
  if (given("--product-rates")) {
    std::string why;
    if (!parse_product_rates(opt.product_rates, &in.product_rates, &why))
      config_error("--product-rates " + opt.product_rates + ": " + why);
  }
  if (given("--attention-rate")) in.attention_rate = opt.attention_rate;
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
  if (opt.ulysses > 0) space.ulysses = {opt.ulysses};
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
