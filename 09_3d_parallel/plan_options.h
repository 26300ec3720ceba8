// 09_3d_parallel/plan_options.h: what the planner's command line (plan.cpp) hands to what it runs.
// Defines Options (every flag, as given) and declares the four runs: a search (run_search) or one
// configuration (run_one), both in plan_configurations.cpp, and Megatron-LM's Table 1 (run_megatron)
// or the heat map (run_heatmap), in plan_records.cpp.
#pragma once
#include <string>

#include "planner/planner.h"  // PlanInputs, SearchSpace

struct Options {
  std::string model = "megatron-146b", cluster = "dgx-a100";
  int gpus = 0, nodes = 0, batch = 0, top = 8, gpus_per_node = 0;
  double efficiency = 0;  // 0: the calibrated constant below
  double elementwise_rate = -1;  // -1: the cluster's
  double sync_us = 0;            // a synchronization's cost on shared cores (Cluster::sync_s), microseconds
  double expert_load = 1;        // the slowest EP rank's expert rows over the balanced share (PlanInputs)
  std::string product_rates;     // ROWS:FLOPS,... the products' rates by their rows (PlanInputs)
  double attention_rate = 0;     // the attention kernel's FLOP/s (PlanInputs); 0: the products'
  double peak_flops = 0, memory_gb = 0, inter_gbps = -1, inter_latency_us = -1, intra_gbps = -1, intra_latency_us = -1;
  // A single configuration (or a restriction of the search) when given.
  int tp = 0, pp = 0, cp = 0, ep = 0, ulysses = 0, virtual_stages = 0, micro_batch = 0, zero = -1;
  int seq_len = 0;
  double tokens_per_batch = 0, capacity_factor = -1;
  std::string cp_method = "ring";
  bool tp_overlap = false, published = false, kernel_rates = false;
  // A published run's implementation (PlanInputs): each names the setting the run used.
  double attention_efficiency = 0;  // 0: the products' efficiency
  double fp8_speedup = 2, loss_bytes = 4, allocator_overhead = 0;
  double storage_tbps = 0;  // the storage's aggregate write bandwidth, for the checkpoint line (0: not given)
  bool fp8 = false, fp8_activations = false, ep_overlap = false, no_dp_overlap = false, sp_gathered_inputs = false;
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
std::string seconds(double s);

// The best configurations of `space` for `in`, with the best per grid and some that do not fit; 1 when
// nothing fits (or nothing is predicted, with the reason).
int run_search(const PlanInputs& in, const Options& opt, const SearchSpace& space, const std::string& note);
// Exactly the configuration the flags give, every pipeline stage's memory and a plan-json line a stage.
int run_one(const PlanInputs& in, const Options& opt, const std::string& note);
// Megatron-LM's Table 1 (opt.megatron) against the planner; 1 when a row misses 15%.
int run_megatron(const Options& opt);
// The best configuration per model, node count and sequence, as CSV in opt.heatmap.
int run_heatmap(const Options& opt);
