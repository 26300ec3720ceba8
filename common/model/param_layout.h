// param_layout.h: where every parameter lives in the flat buffers.
// All parameters sit in one contiguous buffer and all gradients in a second with the same offsets;
// this table (name, shape, offset, size, unit) describes both. A bucket, a ZeRO shard and a pipeline
// stage are then offset ranges, and distribution becomes arithmetic.
//
// A "unit" is what the hooks and later chapters call a layer: unit 0 holds the embeddings (wte, wpe),
// units 1..L the transformer blocks, unit L+1 the final layernorm (the LM head reuses wte: tied).
// Parameters are stored in forward order, so backward produces gradients from high offsets to low.
// Each unit is padded to a multiple of ranks x 16 elements (ranks: of the data-parallel group): the
// whole length then divides by the rank count, and every unit splits into equal, 64-byte-aligned
// per-rank pieces (ZeRO-3 gathers per unit). Padding elements are zero and stay zero.
// A MoE block's experts are a range of their own, [the first expert tensor it holds, the unit's end):
// it starts on such a boundary and its length is a multiple of lcm(ranks, ep.replicas) x 16, so that
// the block's other tensors split over the data-parallel group and its experts over their replicas
// (chapter 12's ZeRO-1: the experts' buckets are sharded over the expert-data-parallel group).
//
// Under tensor parallelism (chapter 07) a rank holds a slice of some tensors: the layout is then this
// rank's, and each entry says which slice of which global tensor it is (TensorShard), so that
// initialisation, checkpoints and tests can go between the global tensors and the ranks' slices. As
// Megatron-LM splits GPT-2 over t ranks:
//   column-parallel (split the output rows, dim 0): attn.qkv (by heads: rank r's q, k and v rows,
//     three blocks cut alike), mlp.fc, wte (by vocabulary: the tied LM head is column-parallel too);
//   row-parallel (split the input columns, dim 1): attn.proj, mlp.proj (their biases stay whole);
//   whole on every rank: wpe, the layernorms, the row-parallel biases.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/grid_axes.h"  // AxisSet, first_copy: a parameter's copies
#include "model/model_config.h"
#include "schedule/pipeline_schedule.h"  // Action: a stage's schedule

// How a rank's tensor is cut from its global tensor: dimension `dim` split into `parts` equal pieces,
// of which this rank holds piece `index`. With `blocks` > 1, the global dimension is that many equal
// blocks, each cut alike (qkv's q, k and v), and the piece is the same slice of every block.
struct TensorShard {
  int dim = -1;  // -1: whole, the same tensor on every rank of the tensor-parallel group
  int parts = 1, index = 0, blocks = 1;
  bool whole() const { return dim < 0 || parts == 1; }
};

struct ParamInfo {
  std::string name;        // the global name, e.g. "h1.attn.qkv.weight"
  int ndim = 0;
  int64_t shape[2] = {0, 0};         // this rank's
  int64_t global_shape[2] = {0, 0};  // the whole tensor's
  TensorShard shard;
  int64_t offset = 0;      // in elements, into the flat buffers
  int64_t size = 0;        // elements
  int unit = 0;
  int expert = -1;         // a MoE expert's tensor: its expert (sharded by expert parallelism); -1: not
  bool weight_decay = false;  // AdamW decays matrices (ndim 2), not biases or layernorm gains
  // Its placement (grid_axes.h): the axes along which every rank holds this same tensor. An expert:
  // its replicas (EDP). Any other: the data replicas (DP, CP, U); TP too where it is whole; PP too for
  // the tied wte, on the first and the last stage.
  AxisSet copies = 0;
  bool held() const { return size > 0; }  // false: on another pipeline stage (shape and size 0)
  // This rank's copy is the one that counts among its copies along `among` (grid_axes.h).
  bool counts_here(const GridCoords& at, AxisSet among) const { return first_copy(copies, at, among); }
};

// How the model is split over a tensor-parallel group: `size` ranks, of which this is `rank`. The
// default: not at all.
struct TensorParallelism {
  int size = 1, rank = 0;
  // Sequence parallelism (Korthikanti et al. 2022): between the tensor-parallel layers, activations
  // are split along the B*T positions too: rank r holds rows [r*BT/t, (r+1)*BT/t) of the flattened
  // (B,T,C) stream (the layernorms, residual adds and biases are per row, so any split of rows works).
  // It changes no parameter's shape, only the model's activations and collectives.
  bool sequence_parallel = false;
};

// How the model is split over a context-parallel group (chapter 10): every rank keeps, in every layer,
// the T/size positions `positions` of each sequence (absolute, in the order the rank keeps them: see
// context_split.h), and attention meets the other positions' keys and values through the chapter's
// hooks (model.h, AttentionHooks). It changes no parameter, only the activations' length: T/size.
// The default (no positions): not at all, every rank holds all T positions.
struct ContextParallelism {
  int size = 1, rank = 0;
  std::vector<int> positions;
  bool on() const { return !positions.empty(); }
  int ulysses = 1;  // of `size`, the ranks of a Ulysses group inside each ring place (ulysses_attention.h)
  int ring() const { return size / ulysses; }  // the ring's ranks, over which K and V travel
  // The positions of a sequence of T that a rank's model holds: its T/cp, or all T.
  int held_positions(int T) const { return on() ? int(positions.size()) : T; }
  // Attention keeps only its output and a log-sum-exp per query, never the (B,NH,T,T) matrices:
  // FlashAttention's (`flash`: asked for and available here), or the ring's, which is blockwise.
  bool lse_attention(bool flash) const { return flash || on(); }
};

// How the experts of a MoE model are spread over an expert-parallel group (chapter 11): `size` ranks,
// each holding E/size consecutive experts of every block (rank r: experts [r E/size, (r+1) E/size)).
// The layout still lists every expert's tensors, in the same order; another rank's have size 0
// (ParamInfo::held), so every rank's flat buffers have the same length and offsets.
// `replicas`: the ranks that hold the same experts (the expert-data-parallel group, over which their
// gradients average and chapter 12's ZeRO-1 shards their optimizer state); 1 where none is known.
struct ExpertParallelism {
  int size = 1, rank = 0;
  int replicas = 1;
  // Where the routing counts are gathered: 12 over the stage's EP group then its EDP group; 11 over
  // the data-parallel group (every rank), which then carries them and every gradient but the
  // experts' (ExpertTheory, theory.h): its bytes are those, not the strategy's.
  bool routing_counts_over_data_group = false;
  bool holds(int expert, int experts) const { return expert / (experts / size) == rank; }
};

// A contiguous run of units that one GPT2 object runs (model.h), for up to `slots` micro-batches in
// flight at once, each with its own activations (chapter 08). Units: 0 the embedding, 1..L the
// blocks, L+1 the final layernorm, LM head and loss. The default is the whole model, one at a time.
struct ModelPart {
  int first_unit = 0, last_unit = -1;  // inclusive; -1: the last unit, L+1
  int slots = 1;
  // Zero-bubble schedules: backward computes the inputs' gradients only, and keeps what the weights'
  // gradients need (the outputs' gradients of the matrix products) for backward_weights() later.
  bool split_backward = false;
  // Its input comes from a chunk of the same rank (one stage; the turn of a V): the input's gradient
  // is copied back into that chunk's buffer, not sent (pipeline_buffer_bytes).
  bool input_is_local = false;
  int last(const GPT2Config& cfg) const { return last_unit < 0 ? cfg.L + 1 : last_unit; }
  bool holds(const GPT2Config& cfg, int unit) const { return unit >= first_unit && unit <= last(cfg); }
};

// How the model is split over a pipeline group (chapter 08): `size` stages, of which this rank is
// `rank`, running `parts` (one, or v chunks under an interleaved schedule). The default: not at all.
struct PipelineParallelism {
  int size = 1, rank = 0;
  std::vector<ModelPart> parts;
  // 08's --zero2: ZeRO-1's memory, but every micro-batch's gradients reduce-scattered, their pieces
  // received apart from the shard they are added into (one more shard's worth in flight).
  bool reduce_every_micro_batch = false;
  // This rank's schedule (pipeline_schedule.h), in the order it runs: what a MoE model's experts keep
  // alive at once depends on it (theory.h, moe_schedule_activation_bytes). Empty: the micro-batches
  // one after the other.
  std::vector<Action> actions;
  // dualpipev's F&B pairs run as two lanes at once (--fb-overlap, pipeline.h): every pass keeps its
  // scratch per lane (lanes.h), so the ring's buffers (chapter 10) and the expert exchange's
  // (chapter 11) are there twice.
  bool fb_overlap = false;
  int scratch_lanes() const { return fb_overlap ? 2 : 1; }  // the copies of that scratch
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  std::vector<int64_t> unit_begin;  // unit u spans [unit_begin[u], unit_begin[u+1]); size num_units+1
  int64_t num_params = 0;           // Ψ: real parameters, no padding (this rank's, under TP)
  int64_t padded_size = 0;          // the flat length, a multiple of ranks x 16
  int ranks = 1;                    // of the data-parallel group
  // A MoE model's: the elements of this rank's experts' ranges (their tensors and padding), and of
  // the tensors alone (this rank's experts' parameters); 0 for a dense model.
  int64_t expert_range_size = 0, expert_params = 0;
  // A pipeline stage holding the tied wte (the first, the last): where wte's range ends, padded to a
  // multiple of ranks x 16 within unit 0, so that wte travels in a data-parallel bucket (and ZeRO
  // pieces) of its own, of one shape on both stages: their two copies, equal after the embedding
  // group's sum, then reduce over their DP groups in the same order, and update bit for bit alike
  // (buckets.h). 0 elsewhere.
  int64_t tied_wte_end = 0;
  TensorParallelism tp;
  ExpertParallelism ep;

  int num_units() const { return int(unit_begin.size()) - 1; }
  int64_t unit_size(int u) const { return unit_begin[u + 1] - unit_begin[u]; }
  // The elements a rank's ZeRO shard holds: the dense ranges over the data-parallel group, a MoE
  // model's experts' ranges over their replicas (ExpertParallelism::replicas).
  int64_t shard_size() const {
    return (padded_size - expert_range_size) / ranks + expert_range_size / ep.replicas;
  }
  int find(const std::string& name) const;  // index into params, or -1
};

// What stops `cfg` from splitting over the tensor-parallel group `tp`, as the message that names the
// flag and what would be right (config_error's text), or "" when nothing does: the heads NH, the
// vocabulary V and the MLP's width 4C must divide by tp.size, checked in that order, and under
// sequence parallelism the micro_batch x T positions of a micro-batch too (the refusal then names
// the chapter's flag for the micro-batches). A pure function, so that each refusal is testable on a
// model no preset has (the tensor dimension's refusal, dimension_tensor.cpp, calls it before the layout).
std::string tensor_parallel_size_problem(const GPT2Config& cfg, const TensorParallelism& tp, int micro_batch,
                                         const std::string& micro_batches_flag = "--grad-accum");

// GPT-2's parameters, for a data-parallel group of `ranks` ranks and this rank's part of a tensor-
// parallel group (`tp`; the default is the whole model). The sizes must divide (NH, V and 4C by
// tp.size: tensor_parallel_size_problem() is "").
// A pipeline stage (chapter 08) holds the units of its `parts` only: the layout still lists every
// parameter, in the same order, but those of the other stages' units have size 0 (ParamInfo::held).
// The tied wte is held by the stage of the embedding and by the stage of the LM head, a copy each,
// padded to end on a shard boundary (ParamLayout::tied_wte_end).
// A MoE model (cfg.moe()) has, in each block, after ln2: the router "h{l}.moe.router.weight" (E,C),
// then per expert e the dense MLP's four tensors "h{l}.moe.expert{e}.mlp.{fc,proj}.{weight,bias}";
// `ep` says which experts this rank holds, whole (tensor parallelism splits no expert, and the router
// is held whole by every rank of the group), on the stage that holds their block.
ParamLayout build_gpt2_layout(const GPT2Config& cfg, int ranks, TensorParallelism tp = {},
                              const std::vector<ModelPart>& parts = {}, ExpertParallelism ep = {});

// Between the global tensors and a rank's slices. `global` is the layout of the whole model
// (build_gpt2_layout(cfg, any ranks)); `local` a rank's under tensor parallelism; the flat arrays are
// fp32 and padded as their layouts say. Parameters are matched by their index (both layouts list the
// same parameters in the same order).
// local_flat = this rank's slice of every tensor of global_flat (padding left as it was: zero).
void slice_from_global(const ParamLayout& global, const float* global_flat, const ParamLayout& local, float* local_flat);
// The inverse: writes `local`'s slices into their places in global_flat (tensors whole on every rank
// are copied too); with every rank's slices written, global_flat is complete.
void place_into_global(const ParamLayout& local, const float* local_flat, const ParamLayout& global, float* global_flat);

// Parameters of the whole model excluding position embeddings: the N of FLOPs/token = 6N + 12LCT.
int64_t flops_params(const ParamLayout& layout);
