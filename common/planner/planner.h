// planner.h: chooses a TP x CP x PP x DP (x EP) configuration by prediction, before any GPU is spent
// (chapter 09's plan). Defines Cluster and its presets, the planner's models, PlanConfig (one
// configuration), PlanResult (its predicted memory per GPU by category, step time split into compute,
// exposed communication per group and bubble, tokens/s, MFU) and the search: evaluate_plan() and
// search_plans().
//
// Two sources of numbers, one per kind of model. A model the chapters build (their presets, GPT-2 XL,
// Megatron-LM's Table 1), in the grids they build it (DP x TP x PP, 07-09; DP x CP, 10; DP x EP, 11;
// any DP x CP x TP x PP x EP, 12), is predicted with the chapters' own functions: memory is forecast_memory() of theory.h on the layout
// and model parts the trainers build (param_layout.h, pipeline.h), compute is the FLOPs of pipeline.h's
// unit_costs() at a fraction of peak (the one named constant, `efficiency`; on a CPU cluster also the
// activation bytes of activation_bytes() at Cluster::elementwise_rate), communication is the emulated
// link's alpha-beta model (comm.h, modelled_ms) on the bytes of predict() and predict_tensor_parallel().
// A published shape (model_shape.h: SwiGLU, grouped-query attention, untied embeddings, experts) is
// predicted in all five dimensions with model_shape.h's counts (docs/theory.md, section 16) on the same
// link model (planner_shape.cpp). Both time the pipeline's bubble with 08's schedule simulator
// (pipeline_simulate.h). docs/planner.md says what is assumed where the formulas leave a choice (which
// group sits on which link, what overlaps what).
#pragma once
#include <string>
#include <vector>

#include "comm/comm.h"  // LinkModel
#include "model/model_config.h"
#include "planner/model_shape.h"
#include "planner/planner_cpu_rates.h"  // ProductRates
#include "schedule/pipeline_schedule.h"
#include "ops/tensor.h"  // DType, Device
#include "parallel/theory.h"  // MemoryForecast

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
  // What one synchronization between ranks costs besides the link's alpha-beta time, in seconds: the
  // wait for the peer to be scheduled when the cores are shared with more runnable processes than
  // cores. Added once for each blocking collective and message on a rank's path (a chapters' model;
  // `make plan-check` measures it beside each calibration, scripts/plan/sync_probe.cpp). 0: none.
  double sync_s = 0;
  // The device memory's bandwidth (bytes/s, the data sheet's). A published shape's elementwise work
  // (norms, activations, residual adds, the experts' permutation, the loss) is timed as its activations'
  // bytes at this rate (planner_shape.cpp); 0: not counted. The chapters' models keep elementwise_rate.
  double memory_bandwidth = 0;
  DType dtype = DType::BF16;
  Device device = Device::CUDA;
  // The one residual factor of this cluster, calibrated on one published row and used when
  // --efficiency is not given (0: the planner's default). On a GPU with kernel-rate tables
  // (planner_kernel_rates.h) it multiplies the tables' rates, which price each product and attention
  // by its shape: what they leave (launch gaps, stragglers, the clock under load). Without tables (the
  // CPU clusters) it is the fraction of peak the dense math reaches.
  double efficiency = 0;
  std::string efficiency_source;  // the row it was calibrated on
  // The GPU, for the kernel-rate table (planner_kernel_rates.h): "A100", "H100", "H800", "H200";
  // "": none (the CPU clusters), the experts at the dense products' rate.
  std::string gpu;
};
// dgx-a100 (Megatron-LM's Selene nodes), dgx-h100, hgx-h800 (DeepSeek-V3's nodes), emulated (this machine's CPU ranks on the
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

// The chapters' models: every preset of model_config.h, gpt2-xl and the ten GPT models of
// Megatron-LM's Table 1 (megatron-1.7b ... megatron-1t, Narayanan et al. 2021). *note says which it is.
bool find_plan_model(const std::string& name, GPT2Config* out, std::string* note = nullptr);
// Every model the planner takes by name: the chapters' (above) or a published shape (model_shape.h).
std::string plan_model_names();
// A GPT model of the Megatron-LM family's proportions with about `params` parameters (for the heat
// map): hidden size 128 x heads, sequence 2048, vocabulary 51,200.
GPT2Config gpt_like_model(double params);

struct PlanConfig {
  int dp = 1, tp = 1, pp = 1;  // dp: data-parallel replicas (the context-parallel ranks of each apart)
  Schedule schedule = Schedule::OneFOneB;  // with pp = 1: no pipeline, the micro-batches accumulate
  int virtual_stages = 1;                  // v, chunks per pipeline rank (interleaved only)
  int micro_batch = 1, micro_batches = 1;  // B per micro-batch, m per step and data-parallel rank
  int zero = 0;                            // 0 (plain data parallelism) .. 3
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  // Context parallelism: cp ranks share each sequence (T/cp positions each). Expert parallelism: the
  // routed experts spread over ep of the dp x cp ranks that hold the same layers (the published
  // placement: TP inside a node, then CP, then DP; EP over DP x CP; PP outermost).
  int cp = 1, ep = 1;
  // Ulysses (chapters 10 and 12's --ulysses): u ranks inside each CP place trade their T/(u cp)
  // positions of every head for NH/(t u) whole heads around attention (docs/theory.md, section 13b).
  // The context axis is cp x ulysses ranks, Ulysses innermost: the order tp-ulysses-cp-dp-pp.
  int ulysses = 1;
  int context() const { return cp * ulysses; }  // ranks sharing each sequence
  int gpus() const { return dp * tp * pp * cp * ulysses; }
  std::string describe() const;  // "dp 8 tp 8 pp 16 cp 2 u 2 interleaved v 2 B 1 m 16 ZeRO-1 recompute full SP"
};

// How a context-parallel group lets every query meet every key: chapter 10's ring (each rank's keys
// and values travel the ring, each hop hidden behind the attention on the block before), or Llama 3's
// all-gather of the keys and values before the attention (and a reduce-scatter of their gradients).
enum class ContextMethod { Ring, AllGather };

// What the planner is given besides a configuration.
struct PlanInputs {
  GPT2Config model;            // a model of the chapters (chapters_model)
  ModelShape shape;            // the model as published; shape_of(model) for a chapters' model
  bool chapters_model = true;  // false: a published shape, predicted by model_shape.h's counts
  Cluster cluster;
  int gpus = 1;
  int batch = 1;              // global batch, sequences
  // The fraction of peak that the dense math reaches (compute time = FLOPs / (peak x this)); on a GPU
  // with kernel-rate tables, the residual factor over the tables' rates (Cluster::efficiency).
  double efficiency = 0.5;
  bool flash_attention = true;  // where the head size allows it (bf16 on a GPU): FlashAttention's memory
  // Chapter 10's blockwise ring attention even at cp 1 (a ring of one, as 10 runs on a CPU); always at cp > 1.
  bool ring_attention = false;
  double data_bytes = 0;      // the training text every rank keeps (CPU runs)
  // Whether the data-parallel gradients go out during the backward (buckets, as 02-08 do) or after it
  // (Megatron-LM in 2021, whose DDP all-reduced the whole gradient once the backward had ended).
  bool dp_overlap = true;
  // How a published run's implementation works where implementations differ (docs/planner.md says
  // which run did what). Published shapes only; the chapters' models are timed as the chapters run.
  bool tp_overlap = false;     // TP's collectives hidden behind the products (Megatron-Core's --tp-comm-overlap)
  ContextMethod cp_method = ContextMethod::Ring;
  bool ep_overlap = false;     // EP's all-to-alls hidden behind another micro-batch's compute (DualPipe)
  double capacity_factor = 0;  // 0: dropless; else each expert takes at most f x its balanced share
  // A chapters' mixture of experts, its time only: the rows the slowest EP rank's experts run (and
  // send) over the balanced share, from a routing measured beforehand. 1: balanced, the bound a capacity
  // sets; a router that starves some experts and overfills others runs fewer under a capacity (the
  // overflow is dropped) and more without one (docs/planner.md, plan-check).
  double expert_load = 1;
  // A chapters' model on CPU ranks, rates measured beforehand (make plan-check's calibrations): the
  // matrix products' FLOP/s by the rows of their activations, replacing peak x efficiency for them (a
  // dense product runs B T/cp rows, an expert its share of the routed rows; planner_cpu_rates.h); and
  // the attention kernel's FLOP/s, for the attention on a ring's block that hides its hop (0: the
  // products' rate). Empty and 0: one rate for every product, the attention at it.
  ProductRates product_rates;
  double attention_rate = 0;
  bool fp8 = false;            // the matrix products in FP8 (attention stays bf16), `fp8_speedup` x faster
  // FP8's gain on the products' rate: 2, the peak's ratio, for DeepSeek-V3's own FP8 GEMMs; less where
  // the casts and scales cost (torchtitan's Float8 measures its own: docs/planner.md).
  double fp8_speedup = 2;
  bool fp8_activations = false;  // the products' inputs (and the experts' SwiGLU inputs) kept in one byte
  // Bytes a logit holds at the loss's peak: 4, one fp32 copy (a fused, vocabulary-parallel cross
  // entropy: Megatron's, ours); 12 for PyTorch's cross_entropy on logits.float(), as torchtitan runs it,
  // whose peak is log-softmax's backward: its saved fp32 output, the fp32 gradient nll_loss hands it
  // and the fp32 gradient it returns (the forward holds 10: bf16 logits, their fp32 copy, the output).
  double loss_bytes_per_logit = 4;
  // The caching allocator's reserve over what the tensors hold, a fraction of the activations and
  // buffers (what it reports as reserved, not allocated; 0: exact, as our own arena allocates).
  double allocator_overhead = 0;
  // Where sequence parallelism's all-gathered input is kept for the weight gradient. Megatron-Core
  // (and our chapter 07) keeps a TP rank's shard and gathers it again in the backward (false). PyTorch's
  // DTensor SP, torchtitan's, keeps what it gathered: the full-sequence input of each column-parallel
  // product (attention's q, k, v and the MLP's up and gate, the norms' outputs, and the head's input),
  // t times the shard (true). AsyncTP's fused all-gather and product keeps the shard again.
  bool sp_gathered_inputs = false;
  // The fraction of peak the attention kernel reaches, forward and backward (0: the kernel-rate
  // table's, below, times `efficiency`; the products' rate where the GPU has no table).
  double attention_efficiency = 0;
  // Which attention kernel the table reads (planner_kernel_rates.h: fa2, fa3, cudnn): cuDNN's fused
  // attention, as Transformer Engine runs it (Megatron-Core); PyTorch's SDPA is FlashAttention-2.
  std::string attention_kernel = "cudnn";
};

// A model by name (find_plan_model or find_model_shape) into in->model, in->shape, in->chapters_model.
bool set_plan_model(const std::string& name, PlanInputs* in, std::string* note = nullptr);
// The model as a shape: in.shape for a published one, shape_of(in.model) for the chapters'.
ModelShape plan_shape(const PlanInputs& in);
// The sequence length of the planned run, in the model and its shape.
void set_sequence_length(PlanInputs* in, int T);

// What one pipeline rank (stage) of a configuration holds, the model state by category: for a model of
// the chapters forecast_memory() of the layout and model parts the trainers build for it (padded, as
// allocated); for a published shape model_shape.h's counts.
struct StageMemory {
  double params_bytes = 0, grads_bytes = 0, optim_bytes = 0;
  MemoryForecast memory;
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
  // Of step_s, what the synchronizations add (Cluster::sync_s; 0 without).
  double sync_added_s = 0;
  double cp_s = 0, ep_s = 0;  // exposed context-parallel (ring, all-gather, Ulysses) and expert (all-to-all) traffic
  // Of cp_s, Ulysses' all-to-alls (on the critical path), and the bytes a rank sends in them a step.
  double ulysses_s = 0, ulysses_bytes = 0;
  bool simulated = false;     // bubble from simulate() (else from theory_bubble())
  double tokens_per_s = 0;
  double mfu = 0;             // model FLOPs (6N + 12LCT per token, docs/theory.md section 8) / (GPUs x peak)
  double flops_per_gpu = 0;   // FLOP/s per GPU counting recomputation (Megatron-LM's "achieved")
  // The routed experts' products: rows each expert takes per micro-batch on the slowest-priced MoE
  // layer, and their rate as a fraction of the dense products' (planner_kernel_rates.h; 1: no experts
  // or no table for the cluster's GPU).
  double expert_rows = 0, expert_rate_factor = 1;
  // A published shape's products and attention by the kernel-rate tables (planner_kernel_rates.h),
  // before the residual `efficiency`: the dense products' share of peak, weighted by their FLOPs over
  // every pass, and the attention kernel's share on the layers that see the most keys (0: no table).
  double product_share = 0, attention_share = 0;
  // Memory by category of a published shape's worst rank (bytes), beside memory's sum.
  double expert_params_bytes = 0;  // of params_bytes, the routed experts'
  double logits_bytes = 0;         // of memory.activations, the head's fp32 logits
  std::vector<StageMemory> stages;  // a published shape's every pipeline rank (when simulated)
};


// "" when one of our chapters runs `config` (03-09), else why not: ZeRO-2/3 exist in 05/06 only,
// without TP or a pipeline. The planner still predicts such configurations (the formulas hold for
// them), and marks them.
std::string not_runnable_here(const PlanConfig& config);

// A chapters' model's pipeline rank `stage` (a published shape's are PlanResult::stages).
StageMemory stage_memory(const PlanInputs& in, const PlanConfig& config, int stage);

// The prediction for one configuration. `simulate_pipeline`: the bubble by 08's simulator on the
// stages' own costs (exact, slower for deep pipelines); false: theory_bubble() on the slowest stage.
PlanResult evaluate_plan(const PlanInputs& in, const PlanConfig& config, bool simulate_pipeline = true);
// The same for a published shape (in.chapters_model false; evaluate_plan calls it): planner_shape.cpp.
PlanResult evaluate_shape_plan(const PlanInputs& in, const PlanConfig& config, bool simulate_pipeline);

// The share of peak a model's weight products reach on `gpu`'s dense kernel-rate table
// (planner_kernel_rates.h), weighted by their FLOPs over the three passes (forward at each product's
// depth K, input gradient at N, weight gradient at `rows`), on a TP rank of `tp`: what the chapters'
// models' FLOPs are priced at on a GPU cluster. 1 where the GPU has no table.
double dense_product_share(const ModelShape& s, const std::string& gpu, int tp, double rows);

// What the search may choose. Empty lists mean: every value that makes sense.
struct SearchSpace {
  std::vector<int> tp, pp;                 // default: powers of 2 (and L's divisors for pp)
  std::vector<int> cp, ep;                 // default: 1 for the chapters' dense models; powers of 2
  // Ulysses' u, default: powers of 2 that split the heads NH/(t u) whole, keep t u inside a node (an
  // all-to-all needs every pair linked) and leave a rank at least 2048 positions, as CP.
  std::vector<int> ulysses;
  std::vector<int> micro_batch = {1, 2, 4, 8};
  std::vector<Schedule> schedules = {Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZBH1, Schedule::ZBV,
                                     Schedule::DualPipeV};
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

// Why search_plans found nothing, in a sentence naming the flag: no grid fills in.gpus, none leaves a
// data-parallel degree that divides in.batch, or why the first grid that does is refused.
std::string why_no_configuration(const PlanInputs& in, const SearchSpace& space);

// The best of each grid (tp, cp, u, pp, ep): results sorted as search_plans returns them, first of each kept,
// each simulated, in the order of the simulation.
std::vector<PlanResult> best_per_grid(const PlanInputs& in, const std::vector<PlanResult>& sorted);
