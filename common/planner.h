// planner.h: chooses a DP x TP x PP configuration by prediction, before any GPU is spent (chapter
// 09's plan). Defines Cluster and its presets, the planner's models, PlanConfig (one configuration),
// PlanResult (its predicted memory per GPU by category, step time split into compute, exposed
// communication per group and bubble, tokens/s, MFU) and the search: evaluate_plan() and search_plans().
//
// Nothing here is a formula of its own: memory is forecast_memory() of theory.h on the layout and
// model parts the trainers build (param_layout.h, pipeline.h), compute is the FLOPs of pipeline.h's
// unit_costs() at a fraction of peak (the one named constant, `efficiency`; on a CPU cluster also
// the activation bytes of activation_bytes() at Cluster::elementwise_rate), communication is the
// emulated link's alpha-beta model (comm.h, modelled_ms) on the bytes of predict() and
// predict_tensor_parallel(), and the pipeline's bubble is 08's schedule simulator (pipeline_schedule.h).
// docs/planner.md says what is assumed where the formulas leave a choice (which group sits on which link,
// what overlaps what).
#pragma once
#include <string>
#include <vector>

#include "comm.h"  // LinkModel
#include "model_config.h"
#include "pipeline_schedule.h"
#include "tensor.h"  // DType, Device
#include "theory.h"  // MemoryForecast

// A cluster of identical nodes. The links are per GPU: the bandwidth one GPU can send at to a peer in
// its node (NVLink) and to one in another node (its own network card), each with a per-message latency.
struct Cluster {
  std::string name, description;
  int gpus_per_node = 8;
  double memory_bytes = 0;  // per GPU, what a rank may use
  double peak_flops = 0;    // dense, of `dtype`
  LinkModel intra_node, inter_node;
  // The rest of the compute, what is not a matrix product (layernorms, GELU, residual adds, biases,
  // attention with its softmax, the loss), in activation bytes a second: each pass costs its
  // activation_bytes() (theory.h, as if nothing were recomputed) at this rate, besides its matrix
  // products' FLOPs at peak x efficiency. 0: no such term, the dense math's FLOPs (unit_costs,
  // attention's products included) stand for everything, as on a GPU, where that work is a few
  // percent; on this machine's CPU it is a third of a step (docs/planner.md).
  double elementwise_rate = 0;
  DType dtype = DType::BF16;
  Device device = Device::CUDA;
};
// dgx-a100 (Megatron-LM's Selene nodes), dgx-h100, emulated (this machine's CPU ranks on the
// emulated link of the chapters' --link-gbps/--link-latency-us, one rank a "node"), namespaces (the
// cluster of docs/cluster.md: network namespaces of this machine as nodes of 2 CPU ranks, MPI's
// shared memory inside a node, the tbf-shaped link between nodes).
bool find_cluster(const std::string& name, Cluster* out);
// The namespaces cluster with `ranks_per_node` ranks in a node (its memory per rank depends on it).
Cluster namespaces_cluster(int ranks_per_node);
const char* cluster_names();
// "DGX A100 80GB, ...: 8 GPUs a node, 312 TFLOP/s bf16 each, links per GPU 2400 Gb/s 5 us in a node, 200
// Gb/s 10 us between nodes": the cluster as the planner uses it, flags' overrides included.
std::string describe_cluster(const Cluster& cluster);

// The planner's models: every dense preset of model_config.h (a mixture of experts is refused by
// plan_model_problem()), gpt2-xl, the ten GPT models of Megatron-LM's
// Table 1 (megatron-1.7b ... megatron-1t, Narayanan et al. 2021) and llama-70b-like (Llama 2 70B's
// depth, width, heads, context and vocabulary in GPT-2's architecture: a GELU MLP of 4C, learned
// positions, no grouped-query attention; 65 billion parameters). *note says which it is.
bool find_plan_model(const std::string& name, GPT2Config* out, std::string* note = nullptr);
std::string plan_model_names();
// "" for a model the planner predicts, else the refusal naming --model: a mixture of experts (its
// routing and expert parallelism have no place in a DP x TP x PP plan).
std::string plan_model_problem(const GPT2Config& model);
// A GPT model of the Megatron-LM family's proportions with about `params` parameters (for the heat
// map): hidden size 128 x heads, sequence 2048, vocabulary 51,200.
GPT2Config gpt_like_model(double params);

struct PlanConfig {
  int dp = 1, tp = 1, pp = 1;
  Schedule schedule = Schedule::OneFOneB;  // with pp = 1: no pipeline, the micro-batches accumulate
  int virtual_stages = 1;                  // v, chunks per pipeline rank (interleaved only)
  int micro_batch = 1, micro_batches = 1;  // B per micro-batch, m per step and data-parallel rank
  int zero = 0;                            // 0 (plain data parallelism) .. 3
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  int gpus() const { return dp * tp * pp; }
  std::string describe() const;  // "dp 4 tp 8 pp 2 1f1b B 1 m 64 ZeRO-1 recompute full SP"
};

// What the planner is given besides a configuration.
struct PlanInputs {
  GPT2Config model;
  Cluster cluster;
  int gpus = 1;
  int batch = 1;              // global batch, sequences
  double efficiency = 0.5;    // the fraction of peak that the dense math reaches (compute time = FLOPs / (peak x this))
  bool flash_attention = true;  // where the head size allows it (bf16 on a GPU): FlashAttention's memory
  double data_bytes = 0;      // the training text every rank keeps (CPU runs)
  // Whether the data-parallel gradients go out during the backward (buckets, as 02-08 do) or after it
  // (Megatron-LM in 2021, whose DDP all-reduced the whole gradient once the backward had ended).
  bool dp_overlap = true;
};

struct PlanResult {
  PlanConfig config;
  std::string invalid;        // why the configuration cannot run at all; "" when it can
  // The rank with the largest predicted peak (pipeline stage `stage`), by category.
  int stage = 0;
  double params_bytes = 0, grads_bytes = 0, optim_bytes = 0;
  MemoryForecast memory;      // model_state, activations, transient, checkpoint, data
  bool fits = false;
  std::string overflow;       // what does not fit, when it does not
  // One step on the slowest rank, seconds: compute (with recomputation) + exposed TP + the pipeline's
  // bubble (idle time with free links) + its exposed point-to-point messages (what they add to the
  // simulated step) + exposed DP + the embedding group's all-reduce = step.
  double compute_s = 0, tp_s = 0, bubble_s = 0, pp_s = 0, dp_s = 0, embedding_s = 0, step_s = 0;
  bool simulated = false;     // bubble from simulate() (else from theory_bubble())
  double tokens_per_s = 0;
  double mfu = 0;             // model FLOPs (6N + 12LCT per token, docs/theory.md section 8) / (GPUs x peak)
  double flops_per_gpu = 0;   // FLOP/s per GPU counting recomputation (Megatron-LM's "achieved")
};

// "" when one of our chapters runs `config` (03-09), else why not: ZeRO-2/3 exist in 05/06 only,
// without TP or a pipeline. The planner still predicts such configurations (the formulas hold for
// them), and marks them.
std::string not_runnable_here(const PlanConfig& config);

// What one pipeline rank (stage) of a configuration holds: forecast_memory() of the layout and model
// parts that the trainers build for it, and the model state by category (padded, as allocated).
struct StageMemory {
  double params_bytes = 0, grads_bytes = 0, optim_bytes = 0;
  MemoryForecast memory;
};
StageMemory stage_memory(const PlanInputs& in, const PlanConfig& config, int stage);

// The prediction for one configuration. `simulate_pipeline`: the bubble by 08's simulator on the
// stages' own costs (exact, slower for deep pipelines); false: theory_bubble() on the slowest stage.
PlanResult evaluate_plan(const PlanInputs& in, const PlanConfig& config, bool simulate_pipeline = true);

// What the search may choose. Empty lists mean: every value that makes sense.
struct SearchSpace {
  std::vector<int> tp, pp;                 // default: powers of 2 (and L's divisors for pp)
  std::vector<int> micro_batch = {1, 2, 4, 8};
  std::vector<Schedule> schedules = {Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZBH1};
  std::vector<int> virtual_stages = {2, 3, 4};  // interleaved's v
  std::vector<int> zero = {0, 1, 2, 3};
  std::vector<Recompute> recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  std::vector<bool> sequence_parallel = {false, true};
  // false: rank by step time alone, fitting or not (to predict a run that fitted on someone else's
  // implementation); the memory is still predicted and shown.
  bool require_fit = true;
  bool runnable_here_only = false;  // only what not_runnable_here() allows
};

// Every configuration of `space` on in.gpus GPUs for in.batch, predicted and sorted: those that fit
// by step time, then those that do not by how far they overflow (all by step time when
// space.require_fit is false). Pruned: for each choice of the rest,
// micro-batches grow until one does not fit (memory grows with B); only the best `simulate_top`
// are simulated (the others keep theory_bubble's estimate), and the order is then by the simulation.
std::vector<PlanResult> search_plans(const PlanInputs& in, const SearchSpace& space = {}, int simulate_top = 20);

// The best of each (tp, pp): results sorted as search_plans returns them, first of each pair kept,
// each simulated, in the order of the simulation.
std::vector<PlanResult> best_per_grid(const PlanInputs& in, const std::vector<PlanResult>& sorted);
