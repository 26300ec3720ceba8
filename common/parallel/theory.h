// theory.h: what docs/theory.md predicts for a chapter, so that every measured number can be printed
// next to its prediction, and a run that cannot fit is refused before it allocates. Defines Strategy,
// Prediction, predict(), activation_bytes(), MemoryForecast / forecast_memory(), chapter 11's
// ExpertTheory / expert_theory() and chapter 12's groups' formulas. Each dimension's formulas are
// defined in its file (dimension_data.cpp, dimension_tensor.cpp, ...; theory.cpp says which), the
// rest in theory.cpp.
// Ψ = parameters (unpadded), N = data-parallel ranks. fp32 training: 4 bytes per parameter and per
// gradient, 8 bytes of AdamW state (m and v). bf16 mixed precision: 2 bytes per parameter and per
// gradient, 12 bytes of optimizer state (fp32 master weights, m and v); the collectives then move
// bf16 gradients and parameters, 2 bytes per element.
#pragma once
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "comm/comm_p2p.h"     // CollectivesChoice: --collectives, for the per-call rows
#include "comm/wire_format.h"  // CollectiveFormats: the bytes a recipe's collectives move
#include "ops/tensor.h"  // DType, Device

enum class Strategy { DP, ZeRO1, ZeRO2, ZeRO3 };

struct Prediction {
  std::string strategy;        // "DP", "ZeRO-1", ...
  std::string memory_formula;  // e.g. "4Ψ + 4Ψ + 8Ψ"
  double params_bytes = 0, grads_bytes = 0, optim_bytes = 0;
  std::string comm_formula;    // e.g. "2(N-1)/N x 4Ψ"
  double comm_bytes = 0;       // bytes this rank sends per step (see comm.h)
};

// `grad_accum` matters where a strategy communicates once per micro-batch (ZeRO-2, ZeRO-3). `dtype`
// is the parameters' (F32, or BF16 for mixed precision). A MoE layout's experts (Ψe =
// layout.expert_params) average over their own group (chapters 11, 12), so the data-parallel group
// carries Ψ-Ψe, and a ZeRO shard holds (Ψ-Ψe)/N of the rest and Ψe/D of the experts (D =
// layout.ep.replicas, the ranks holding the same experts).
// `wire`: a mixed-precision recipe's formats on the CPU (wire_format.h): the gradients travel in
// wire.gradients' bytes (2: bf16 or fp16), every ZeRO's gathered product weights in wire.weights' (2,
// or 1 for fp8) and the rest of the parameters in 4. Default: every element in the parameters' bytes.
Prediction predict(Strategy strategy, const ParamLayout& layout, int grad_accum, DType dtype = DType::F32,
                   const CollectiveFormats& wire = {});

// The model state as allocated: parameters, gradients and optimizer state in bytes, each a full
// padded buffer or a shard of layout.shard_size() elements as `strategy` keeps it. What the memory
// counters measure, exactly (predict()'s are the formula on the unpadded Ψ).
struct ModelStateBytes {
  double params = 0, grads = 0, optim = 0;
  double total() const { return params + grads + optim; }
};
ModelStateBytes model_state_bytes(Strategy strategy, const ParamLayout& layout, DType dtype = DType::F32);

// The bytes of the model's activation arena (model_activations.cpp) for micro-batches of B sequences: every
// tensor the backward reads, per block and at the ends, plus the backward's scratch (docs/theory.md,
// "Activation memory"), on one rank of a tensor-parallel group `tp` (with or without sequence
// parallelism), for the units of `part` and its slots (a pipeline stage, chapter 08; the default:
// the whole model, one micro-batch). `flash`: FlashAttention's log-sum-exp instead of the
// (B,NH,T,T) matrices. cfg.recompute decides what is kept per block and micro-batch, and what the
// recomputation's workspace adds once (docs/theory.md, "Activation recomputation"). Each tensor is
// rounded up to the allocator's 64 bytes, as the arena carves it.
double activation_bytes(const GPT2Config& cfg, int B, DType dtype, bool flash, TensorParallelism tp = {},
                        const ModelPart& part = {});

// The activation bytes of one rank of a context-parallel group of cp ranks (chapter 10; fp32 on the
// CPU), for micro-batches of B sequences: the model's arena on T/cp positions, keeping a log-sum-exp
// per query where the materialized attention keeps (B,NH,T,T) matrices, plus the ring's buffers
// (ring_attention.h, ring_buffer_bytes). docs/theory.md, section 13. At cp = 1 it is the arena of
// chapter 10 on one rank, whose attention is the same blockwise kernel, a ring of one.
double context_parallel_activation_bytes(const GPT2Config& cfg, int B, int cp);

// The activation bytes a MoE model (moe.h) keeps on one rank beyond the arena, for micro-batches of B
// sequences (N = B*T tokens; docs/theory.md, section 14). Fixed by shape, per layer: the router's
// probabilities (N E fp32), the top-k choices and their dispatch rows (N k int32 each), and the
// dispatch/combine buffers (4 x N k C fp32). Set by the routing: 9C fp32 per row this rank's experts
// ran in layer l (expert_rows[l]: their input, fc before and after GELU), and once the backward's
// scratch, 8C fp32 per row of the layer with the most. The measured peak equals it exactly.
double moe_activation_bytes(const GPT2Config& cfg, int B, const std::vector<int64_t>& expert_rows);
// The bytes of chapter 11's expert exchange (docs/theory.md, section 14), counted as communication
// buffers: the rows received, regrouped by expert, the experts' results and those back in arrival
// order, 4 x C fp32 per row of the layer whose experts ran the most (expert_rows as above). Set by
// the routing alone; grown layer by layer and freed at the step's end, so the step's peak equals it.
double moe_exchange_buffer_bytes(const GPT2Config& cfg, const std::vector<int64_t>& expert_rows);
// The rows one rank's experts run in a layer: with balanced routing, N k (the same, per rank, at any
// ep); at most, whatever the routing, ep N k, and no more than E/ep experts x min(capacity, ep N)
// (an expert takes a token at most once, and at most `capacity` assignments under capacity_factor f;
// moe.h). world: the ranks whose tokens make the capacity's global micro-batch.
int64_t moe_expert_rows_balanced(const GPT2Config& cfg, int B);
int64_t moe_expert_rows_at_most(const GPT2Config& cfg, int B, int ep, int world);
// The same bound for a rank that routes `tokens` rows of a global micro-batch routed by `routers`
// ranks (chapter 12: B T/cp, or B T/(cp t) under sequence parallelism, over a stage's ranks).
int64_t moe_expert_rows_at_most_of(const GPT2Config& cfg, int64_t tokens, int ep, int routers);

// A MoE model's activations on one rank running `parts` (empty: the whole model) under this rank's
// schedule `actions` (empty: the micro-batches one after the other, as gradient accumulation runs
// them), docs/theory.md, section 17. Fixed by shape: a router's buffers per slot and block, at
// `tokens` rows a rank routes (section 14's N E + 2 N k + 4 N k C fp32 values). At the step's routing:
// rows[micro][l], the rows this rank's experts ran for block l of micro-batch `micro`, 9C values each
// from its forward to its backward, and each slot's backward scratch (a chunk's slots its own), 8C
// values per row of its layer with the most rows held, from that slot's first backward to its last:
// replayed in the schedule's order, the peak. Without a pipeline it is moe_activation_bytes at the largest micro-batch.
double moe_schedule_activation_bytes(const GPT2Config& cfg, int64_t tokens, const std::vector<ModelPart>& parts,
                                     const std::vector<Action>& actions,
                                     const std::vector<std::vector<int64_t>>& rows);

// The FLOPs per token that cfg.recompute adds to a step on one rank of a tensor-parallel group of
// tp.size, for the blocks of `part` (default: all L): 0 for none; the attention's score and value
// products (4TC a block) for selective; the block's forward but for the MLP projection
// (16C^2 + 4TC a block) for full. Against the step's 6N + 12LCT (section 8). `lse_attention`: the
// attention keeps a log-sum-exp per query and recomputes its scores in its own backward in every mode
// (FlashAttention; chapter 10's ring): selective then has nothing to drop and adds nothing.
double recompute_flops_per_token(const GPT2Config& cfg, TensorParallelism tp = {}, const ModelPart& part = {},
                                 bool lse_attention = false);

// Tensor parallelism's traffic over the tensor-parallel group (docs/theory.md, section 9), per rank.
struct TensorParallelPrediction {
  // Per micro-batch: collectives of B*T*C activations (all-reduces without sequence parallelism; with
  // it, all-gathers and reduce-scatters, of which `regathers` are the inputs gathered again for the
  // weights' gradients), and the cross-entropy's 3 all-reduces of B*T fp32 values.
  int all_reduces = 0, all_gathers = 0, reduce_scatters = 0, regathers = 0, loss_all_reduces = 0;
  int recomputed = 0;  // of those, the collectives that full recomputation's replay adds (cfg.recompute)
  double bytes_per_micro_batch = 0;  // sent by this rank
  // Per step, under sequence parallelism: the all-reduces of the gradients of the parameters every
  // rank holds whole (6 a block: layernorms and row-parallel biases; wpe and the final layernorm's
  // 2), which each rank computed from its rows only.
  int partial_grad_all_reduces = 0;
  double partial_grad_bytes = 0;
  std::string formula;
};
// `parts`: a pipeline stage's model parts (chapters 08, 09): only their blocks, and the embedding's
// and head's collectives where the stage holds them; empty: the whole model. `activation_bytes`: the
// bytes of an activation (and its gradient) on the wire under a mixed-precision recipe (2); 0: the dtype's.
// `gradient_bytes`: those of an element of the sums of the gradients held whole under such a recipe
// (its gradient format: 2, as DP's buckets); 0: the dtype's.
TensorParallelPrediction predict_tensor_parallel(const GPT2Config& cfg, int micro_B, TensorParallelism tp, DType dtype,
                                                 const std::vector<ModelPart>& parts = {}, int activation_bytes = 0,
                                                 int gradient_bytes = 0);

// The message buffers a pipeline stage (chapter 08) keeps for one model part of `stages` stages: a
// (B,T,C) buffer per activation slot (part.slots, the schedule's micro-batches in flight) for each
// message it receives or sends a copy of (docs/theory.md, section 3), B*T/t rows under sequence
// parallelism. Does not grow with the step's micro-batches.
double pipeline_buffer_bytes(const GPT2Config& cfg, const ModelPart& part, int stages, int micro_B, DType dtype,
                             TensorParallelism tp = {});

// The communication buffers a data-parallel strategy holds at most during a step (docs/theory.md,
// "Transient buffers"): none for DP; ZeRO-1's gradient shard (twice under ZeRO-2's rule of a
// pipeline, reduce_every_micro_batch); ZeRO-2's two layers' gradients in flight; ZeRO-3's also the
// gathered layers.
double strategy_transient_bytes(Strategy strategy, const ParamLayout& layout, DType dtype,
                                bool reduce_every_micro_batch);
// The staging buffer of the data-parallel group's collectives under a recipe's formats (wire_format.h:
// the codes of the calls in flight at once; docs/theory.md, section 3), at most; 0 under fp32 or on
// one rank. g the gradients' bytes, b(X) the bytes of X's elements in the gather's formats (the
// matrices in the weights' format, the rest 4), Ψ padded: DP g Ψ; ZeRO-1 and 2 the larger of the
// reduce-scatters' g Ψ(1 + 1/N) and the gather's b(Ψ) + 4Ψ/N; ZeRO-3 the layers in flight,
// (1 + 1/N)(b(E + 2U + head) + g(E + 2U)).
double strategy_staging_bytes(Strategy strategy, const ParamLayout& layout, const CollectiveFormats& formats);

// The peak memory of one rank, predicted before anything is allocated.
struct MemoryForecast {
  double model_state = 0;   // parameters + gradients + optimizer state (Prediction, with padding)
  double activations = 0;   // activation_bytes(), plus the token ids on a GPU
  double transient = 0;     // at most this in communication buffers during a step (docs/theory.md)
  double checkpoint = 0;    // host copies while initialising, resuming or saving (the whole model's, fp32)
  double data = 0;          // the training text, which every rank keeps
  // An asynchronous save's staged copy (--async-save): this rank's slices of the parameters and both
  // moments, 12 bytes an element, kept while the next steps run.
  double staged_save = 0;
  // A recipe's emulated products on the CPU (--precision): their operands' rounded copies,
  // precision_scratch_bytes; 0 in fp32, which installs nothing.
  double precision_scratch = 0;
  double peak() const;      // model state + activations + data + staged save + precision scratch + the larger of transient and checkpoint
};
// The scratch of a recipe's emulated products (LowPrecisionMatmuls, docs/theory.md "The emulation's
// scratch"): for a product of I inputs to O outputs over N tokens it holds the operands it rounds,
// a (N max(I, O)) and b (I max(O, N)); a transposed copy, max(I O, N max(I, O)); the fp32 result
// before it is rounded, I max(N, O); under fp16's loss scale the scaled output gradient, N O. Each
// buffer keeps the largest of GPT-2's products (C -> 3C, C -> C, C -> 4C, 4C -> C and the head
// C -> V), in fp32 bytes. N = B x T, a micro-batch's tokens. Exact for the whole model on one rank;
// a bound where TP slices the products, a pipeline stage runs some of them or CP holds fewer tokens.
// A mixture of experts adds its experts' two products (C -> 4C, 4C -> C; the router stays in fp32)
// over M = `expert_rows` rows, the most one expert can take: the rows of every rank of its
// expert-parallel group, at most the capacity. M <= N on one rank, where the dense MLP's bound holds
// it; past one expert-parallel rank M is a bound the routing decides (0: a dense model).
double precision_scratch_bytes(int C, int V, int64_t tokens, bool gradient_scaled, int64_t expert_rows = 0);
// whole_model_size: the whole model's flat length (build_gpt2_layout(cfg, 1)'s padded_size), of
// which `layout` is this rank's part where tensor, pipeline or expert parallelism splits the model:
// the host copies that initialise, save and resume it are the whole model's. micro_batches: those
// of a step (their token ids are kept); pp: a pipeline stage's model parts (chapter 08), each with
// its own activation arena; none: the whole model.
MemoryForecast forecast_memory(Strategy strategy, const ParamLayout& layout, int64_t whole_model_size,
                               const GPT2Config& cfg, int micro_B, int micro_batches, DType dtype, Device device,
                               bool flash, bool saves_or_resumes, double data_bytes, TensorParallelism tp = {},
                               const PipelineParallelism& pp = {});

// Chapter 12's groups, per rank and step (4-byte elements; docs/theory.md, section 17). `blocks`:
// the blocks this rank runs (every chunk), m the micro-batches of a step, B a micro-batch's sequences.
// CP's ring: each layer sends (cp-1)/cp of K and V forward (twice under full recomputation), and in
// backward the blocks again and their gradients, of this rank's C/t channels (its heads):
//   (2 x passes + 4) (cp-1)/cp x blocks m B T C/t x 4.
double ring_sent_bytes(const GPT2Config& cfg, int blocks, int m, int B, int cp, int tp);
// The routing counts' all-gathers, one a block and micro-batch, each over a group of `group` ranks
// gathering `chunk` records of `record` int32s from every rank (12: EP, then expert DP over the
// stage; 11: one over the world): what rank `rank` sends in them under `collectives`
// (collective_sent_bytes; docs/theory.md, section 15), under the library and the ring
// blocks m (group-1) chunk record x 4.
double routing_counts_bytes(const CollectivesChoice& collectives, int blocks, int m, int group, int rank, int64_t chunk,
                            int64_t record);

// The bytes and sizes theory predicts for a run of chapter 11 (4-byte elements; docs/theory.md, 14).
// Its expert ranges are the flat ranges whose gradients it averages over the expert-data-parallel
// group, as it cuts them: each run of expert tensors and the padding after it, up to the next tensor.
// Under chapter 00's collectives each gradient all-reduce sends what the algorithm picked for its
// size sends (docs/theory.md, section 15): the first two are then the calls' own, one by one.
struct ExpertTheory {
  double world_all_reduce = 0;      // 2(W-1)/W x g x the non-expert ranges (padding included)
  double expert_dp_all_reduce = 0;  // 2(D-1)/D x g x the expert ranges held (padding included), D = W/ep
  double counts_all_gather = 0;     // K x L x (W-1) x 4E: every layer's routing counts, over the world
  double a2a_balanced = 0;          // L x [(P-1)/P x 4E + 2 x (P-1)/P x n k C x (a + g)], P = ep, n = tokens a rank
  double expert_params = 0;         // L x E/ep x (8C^2 + 5C) x 4: a rank's expert parameters
  int64_t expert_elements = 0;      // the expert tensors this rank holds
};
// `micro_B`: the sequences a rank computes per micro-batch; K = `micro_batches` of them a step (each
// routed on its own: moe.h). g and a: the bytes of an element of the gradients and of the activations
// on the wire, 4 in fp32, a recipe's formats' under --precision (`formats`, wire_format.h: bf16 and
// fp16 2): the rows' dispatch and combine travel as activations, their two trips backward as gradients.
// The step's gradient all-reduces as chapter 11 issues them (each bucket's runs of expert tensors over
// the expert-data-parallel group, the rest over the world), in elements, and where this rank stands
// in each group: under --collectives each call's algorithm follows its size. Empty lists: the
// formulas over the ranges (the same bytes under the library).
struct ExpertGradientCalls {
  CollectivesChoice collectives;
  std::vector<int64_t> world, expert_dp;
  int world_rank = 0, expert_dp_rank = 0;
};
ExpertTheory expert_theory(const ParamLayout& layout, const GPT2Config& cfg, int world, int ep, int micro_B,
                           int micro_batches, const CollectiveFormats& formats = CollectiveFormats(),
                           const ExpertGradientCalls& calls = ExpertGradientCalls());
