// plan_published.h: the planner (planner.h) against the published multi-dimension runs: Megatron-Core
// on H100 (nine GPT models), Llama 3 405B's Table 4, Megatron-Bridge's GPT-OSS 120B row, torchtitan's
// context-parallel scaling and measured memory, and DeepSeek-V3. Defines PublishedRun (a run as
// published: model, cluster, grid, batch, what its implementation did, and its number), the rows of
// each source, predict_published() / calibrate_published() (the efficiency constant is calibrated on
// ONE named row and every other row is predicted from it), one_command() (the `plan --one` line that
// reproduces a row) and the thresholds. docs/planner.md prints every comparison; test_planner.cpp
// and `plan --published` keep them.
#pragma once
#include <string>
#include <vector>

#include "planner/planner.h"

struct PublishedRun {
  std::string source, name;     // "Megatron-Core H100", "177B"
  std::string model, cluster;   // presets of model_shape.h and planner.h
  int gpus = 1, tp = 1, cp = 1, pp = 1, dp = 1, ep = 1;
  int batch = 1, seq = 0;       // global batch in sequences; sequence length (0: the model's)
  int micro_batch = 0;          // 0: unpublished, the planner's fastest
  int virtual_stages = 0;       // 0: unpublished, the planner's fastest (1f1b or interleaved)
  std::vector<Schedule> schedules = {Schedule::OneFOneB, Schedule::Interleaved};
  int zero = 1;                 // the data-parallel sharding it used (Llama 3's FSDP under PP: 2)
  std::vector<Recompute> recompute = {Recompute::None, Recompute::Full};  // what it may have used
  // The implementation, where runs differ (planner.h, PlanInputs).
  bool tp_overlap = false, dp_overlap = true, ep_overlap = false, fp8 = false, fp8_activations = false;
  ContextMethod cp_method = ContextMethod::Ring;
  double attention_efficiency = 0, capacity_factor = 0;  // 0: the kernel-rate table's attention
  std::string attention_kernel = "cudnn";  // PlanInputs::attention_kernel
  double fp8_speedup = 2;
  double loss_bytes = 4, allocator_overhead = 0;  // PlanInputs::loss_bytes_per_logit, allocator_overhead
  bool sp_gathered_inputs = false;                // PlanInputs::sp_gathered_inputs (DTensor's SP)
  // The published number: model TFLOP/s per GPU (by `flops_per_token`, its own count), or tokens/s
  // per GPU where flops_per_token is 0.
  double published = 0;
  double flops_per_token = 0;
  std::string note;             // what is assumed where the publication is silent
  // Why this row may stay outside its threshold, where nothing documented explains the gap
  // (docs/planner.md says what was looked for); empty: the row must hold. `plan --published` still
  // checks it: a stated exception that holds is stale, and fails.
  std::string exception;
};

// Megatron-LM README, "Training speed and scalability" (Megatron-Core r0.8.0, July 2024): 1.7B ... 462B.
std::vector<PublishedRun> megatron_h100_runs();
// The row the efficiency is calibrated on: 177B (TP 8, PP 6, DP 48: every group of the grid at work).
int megatron_h100_calibration();
// Llama 3 405B, Table 4 (arXiv 2407.21783): 8K on 8,192 and 16,384 GPUs, 131K with CP 16.
std::vector<PublishedRun> llama3_runs();
// Megatron-Bridge's GPT-OSS 120B row (release 25.11, DGX-H100, BF16): tokens/s per GPU.
PublishedRun gpt_oss_run();
// torchtitan's Llama 3 8B on 8 H100s, CP 1/2/4/8 at 32K...256K (Float8, full AC): tokens/s per GPU.
std::vector<PublishedRun> torchtitan_cp_runs();
// torchtitan's measured peaks (its Llama 3 H100 benchmark, "Memory(GiB)", the largest over the GPUs):
// `published` holds GiB; the 8B on 8 and 128 GPUs (FSDP, LBS 2, selective AC), CP 1 and CP 8 (Float8,
// full AC), the 70B on FSDP 32 x TP 8 (Float8, LBS 16, full AC). PyTorch's loss: 12 bytes a logit.
std::vector<PublishedRun> torchtitan_memory_runs();
constexpr double GiB_bytes = 1024.0 * 1024.0 * 1024.0;
// DeepSeek-V3's pre-training (arXiv 2412.19437): 2,048 H800, PP 16 x EP 64, ZeRO-1 DP; DualPipe.
PublishedRun deepseek_v3_run();
// DeepSeek-V3's 180K H800 GPU hours per trillion tokens (section 1).
constexpr double kDeepSeekGpuHoursPerTrillion = 180e3;
// PyTorch's SDPA on H100 is FlashAttention-2 (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608,
// section 1: "only 35%" of the peak): the kernel-rate table's "fa2" (planner_kernel_rates.h).
constexpr const char* kPyTorchAttentionKernel = "fa2";
// torchtitan's Float8 products against bf16: its own table 1 (Llama 3 8B, FSDP 8, T 8,192, LBS 2,
// compiled) measured 8,532 against 6,667 tokens/s per GPU, 1.28 x end to end; the planner gives that
// ratio for that run with the products 1.49 x faster (docs/planner.md; tests/test_planner_published.cpp
// derives it again).
constexpr double kTorchtitanFloat8Speedup = 1.49;
// One threshold for every source's published number (throughput, GPU hours, a ratio of throughputs):
// 15%; a mixture of experts' throughput 25%, because its routing (forced-balanced in the published
// run, balanced in ours) and its grouped products are not modelled kernel by kernel (docs/planner.md).
constexpr double kPublishedTolerance = 0.15, kPublishedMoeTolerance = 0.25;

PlanInputs published_inputs(const PublishedRun& run, double efficiency);
// The command line that predicts configuration `c` for `in`, every setting a flag:
// "09_3d_parallel/plan --one --model llama3-405b ... --efficiency 0.4893". Running it prints the
// numbers the comparison shows (per GPU: tokens/s, model TFLOP/s, GPU hours per trillion tokens).
std::string one_command(const PlanInputs& in, const PlanConfig& c);
// Model TFLOP/s per GPU by the count the model's source publishes against: Megatron-LM 2021's
// 96 L h^2 (1 + s/6h + V/16Lh) a token (recomputation included) for its Table 1 models, model_shape.h's
// 6N + 12 L H T (causal: half) for a published shape, 6N + 12 L C T for the chapters' others.
double model_tflops_per_gpu(const PlanInputs& in, const PlanResult& r);
const char* model_flops_count_name(const PlanInputs& in);
// The run's own grid and batch, what it left unpublished (micro-batch, v, recomputation) the
// planner's fastest that fits (the fastest of all where nothing fits our forecast).
PlanResult predict_published(const PublishedRun& run, double efficiency);
// Model TFLOP/s per GPU by the run's own count, or tokens/s per GPU: what `published` holds.
double published_metric(const PublishedRun& run, const PlanResult& r);
// The efficiency at which the run is predicted at its published number, to 4 decimals (what a
// printed command carries).
double calibrate_published(const PublishedRun& run);
// The planner's free search for the run's model, GPUs, sequence length and tokens per batch, with its
// implementation: the best configuration of each grid (tp, cp, u, pp, ep), best first. With Ulysses, as
// `plan`'s own search: none of the published runs used it, but the search may prefer it.
std::vector<PlanResult> search_published(const PublishedRun& run, double efficiency);
// The rank of the run's (TP, CP, PP, DP), at u = 1, among them (0 = first; -1: absent).
int grid_rank(const PublishedRun& run, const std::vector<PlanResult>& best);
