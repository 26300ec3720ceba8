// model.h: GPT-2, exactly: token + learned position embeddings, L pre-LayerNorm blocks (causal
// multi-head self-attention, 4x MLP with tanh GELU, residual connections), a final LayerNorm and the
// LM head tied to the token embedding, then cross-entropy. Defines ModelHooks, the seams a dimension
// changes (ProductHooks, AttentionHooks; ExpertHooks: moe.h) and GPT2.
//
// A dimension that splits the work changes what the model does at a seam: the collectives around its
// split products, its attention, its experts. The model names the seams by where they sit, never by
// the dimension that fills them: each dimension installs its hooks on a model chunk through its own
// apply function (parallel/parallelize.h, as torchtitan's parallelize_llama applies apply_tp, then
// apply_cp, ...), and the model only checks that a split it was built with has its seam filled.
//
// The model owns only its activations. Parameters and gradients live in flat buffers the chapter
// owns; the model is told where each unit's parameters and gradients are (bind_unit), so a chapter
// can point a unit at a freshly gathered buffer (ZeRO-3) or at a transient bucket, and release it.
//
// Tensor parallelism (chapter 07): the model can run as one rank's part of a tensor-parallel group
// of t ranks, with this rank's slices of the parameters (param_layout.h): its NH/t heads, 4C/t MLP
// channels and V/t vocabulary rows. It then does no communication itself: at each point where
// Megatron-LM places a collective, it calls the ProductHooks tensor parallelism installed.
//
// Pipeline parallelism (chapter 08): a GPT2 object can run a part of the model only (ModelPart,
// param_layout.h: a run of units), for several micro-batches in flight, each in its own activation
// slot. A part that does not start with the embedding takes its input stream from the previous
// stage (input()), one that does not end with the loss hands its output stream to the next
// (output()) and, in backward, takes that output's gradient and leaves its input's (input_grad()).
// With split_backward, backward() computes only the inputs' gradients (the critical path) and
// backward_weights() the weights' later (zero-bubble schedules).
//
// Context parallelism (chapter 10): the model can run on a rank's T/cp positions of each sequence
// (ContextParallelism, param_layout.h). Everything but attention acts position by position and runs
// as it is; the position embeddings are looked up at the rank's absolute positions; attention, the one
// op that mixes positions, goes through the AttentionHooks context parallelism installed (a ring), and keeps, as
// FlashAttention does, only its output and a log-sum-exp per query, never (B,NH,T,T) matrices.
// Mixture of experts (chapter 11): with GPT2Config::experts > 0 each block's MLP is a MoE layer
// (moe.h), in fp32 (CPU, or GPU in 11 and 12); expert parallelism hands its experts' work to the chapter through
// ExpertHooks. Each rank routes the rows it holds (its T/cp positions, its B*T/t rows under sequence
// parallelism, which tensor parallelism then needs), with a router per block and slot (chapter 12).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "comm/comm.h"  // CommHandle, ReduceOp: what the tensor-parallel hooks return and take
#include "ops/memory.h"
#include "model/moe.h"  // ExpertHooks, ExpertWeights, RoutingStats: the MoE presets' MLP
#include "model/param_layout.h"
#include "ops/tensor.h"

// Called at the points later chapters build on. Any of them may be left empty.
struct ModelHooks {
  std::function<void(int unit)> before_forward;   // before unit's forward (ZeRO-3: gather it)
  std::function<void(int unit)> after_forward;    // after unit's forward (ZeRO-3: release it)
  std::function<void(int unit)> before_backward;  // before unit's backward (ZeRO-3: gather again)
  std::function<void(int unit)> after_backward;   // unit's backward done: its gradients are final,
                                                  // except wte's, final only after unit 0
  std::function<void(int param)> grad_ready;      // params[param]'s gradient will not change again
                                                  // in this backward (fires on every backward: a
                                                  // chapter decides which micro-batch communicates)
};

// The seam around the split products: tensor parallelism's collectives (apply_tensor_parallel). "Local" tensors have the rows a
// rank holds between the parallel layers (all B*T, or its B*T/t under sequence parallelism), "full"
// ones all B*T rows. Each returns the handle of what it started, or an empty CommHandle; the model
// waits on it (CommHandle::valid) before it reads the result, as late as it can.
struct ProductHooks {
  // "f", the input of a column-parallel layer (qkv, mlp.fc, the LM head):
  //   forward:  local -> full: nothing (the same tensor), or an all-gather of the rows;
  //   backward: full -> local: the input's gradient summed over the ranks (each computed its part
  //             from its own slice of the weight): an all-reduce, or a reduce-scatter of the rows.
  std::function<CommHandle(Tensor local, Tensor full)> f_forward;
  std::function<CommHandle(Tensor full, Tensor local)> f_backward;
  // "g", the output of a row-parallel layer (attn.proj, mlp.proj) or of the vocabulary-parallel
  // embedding, each rank holding a partial sum:
  //   forward:  full partial -> local: an all-reduce (in place), or a reduce-scatter of the rows;
  //   backward: local -> full: nothing (the same tensor), or an all-gather of the rows.
  std::function<CommHandle(Tensor partial, Tensor local)> g_forward;
  std::function<CommHandle(Tensor local, Tensor full)> g_backward;
  // The vocabulary-parallel cross-entropy's reductions, in place over (B,T) fp32 values: the rows'
  // maxima (Max), their sums of exponentials and target logits (Sum).
  std::function<void(Tensor values, ReduceOp op)> vocab_all_reduce;
};

// The seam of attention over positions other ranks hold: context parallelism's ring, with Ulysses'
// exchange around it (apply_context_parallel, apply_ulysses). Shapes as FlashAttention's (ops.h),
// on this rank's T/cp positions: qkv (B,T/cp,3C), out (B,T/cp,C), lse (B,NH,T/cp) fp32.
struct AttentionHooks {
  std::function<void(Tensor out, Tensor lse, Tensor qkv, int NH)> attention_forward;
  // dqkv += the gradient, from dout and the forward's qkv, out and lse.
  std::function<void(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH)> attention_backward;
};

class GPT2 {
 public:
  // Allocates activations for micro-batches of up to max_B sequences of cfg.T tokens. `dtype` is
  // what parameters, gradients and activations are kept in: fp32, or bf16 for mixed precision on a
  // GPU (the statistics of layernorm and the losses stay fp32; ops.h). `tp`: this rank's part of a
  // tensor-parallel group (the layout must be this rank's: build_gpt2_layout with the same split).
  // `cp`: this rank's positions under context parallelism (with any of the above: under TP the ring
  // carries this rank's heads); config() then says T/cp, the positions the model holds.
  GPT2(const GPT2Config& cfg, const ParamLayout& layout, int max_B, Device device = Device::CPU,
       DType dtype = DType::F32, TensorParallelism tp = {}, ModelPart part = {}, ContextParallelism cp = {});
  ~GPT2();

  // Points the parameters (or gradients) of the flat range [begin, end) at `base`, which holds
  // that range: a parameter at flat offset o is then read at base + (o - begin). A chapter points
  // a layer at a freshly gathered buffer (ZeRO-3) or a bucket's gradients at a transient buffer
  // (ZeRO-2). Every parameter must lie wholly inside or wholly outside the range. The memory holds
  // elements of the model's dtype; nullptr releases the range.
  void bind_params(int64_t begin, int64_t end, void* base);
  void bind_grads(int64_t begin, int64_t end, void* base);
  // The same for unit u's range [unit_begin[u], unit_begin[u+1]).
  void bind_unit_params(int u, void* base);
  void bind_unit_grads(int u, void* base);
  // Binds everything to full flat buffers (base = flat offset 0).
  void bind_all(void* params, void* grads);

  // Mean cross-entropy over the B x T positions of one micro-batch. inputs, targets: (B,T) tokens.
  float forward(const int* inputs, const int* targets, int B);
  // Accumulates gradients of (loss_weight x mean loss) into the bound gradient buffers, using the
  // activations of the last forward. With gradient accumulation over K micro-batches,
  // loss_weight = 1/K makes the sum of K backwards the gradient of the mean.
  void backward(float loss_weight);

  // A part's forward and backward for the micro-batch in activation slot `slot` (0..part.slots-1),
  // which keeps its activations until its backward (and backward_weights) is done. `inputs` are
  // read by the embedding's part, `targets` by the loss's; both must stay valid until the slot's
  // backward. forward returns the micro-batch's mean loss on the loss's part, else (a MoE model) its blocks'
  // share of the balance loss, 0 for a dense one.
  float forward(int slot, const int* inputs, const int* targets, int B);
  // `output_grad`: the gradient of output(slot), from the next stage (not for the loss's part).
  void backward(int slot, float loss_weight, Tensor output_grad = Tensor());
  void backward_weights(int slot);  // split_backward only: the weights' gradients of slot's backward
  Tensor input(int slot, int B);    // (B*T, C): where a later stage's input goes before forward
  Tensor output(int slot);          // (B*T, C): after forward, what goes to the next stage
  Tensor input_grad();              // (B*T, C): after backward, the input's gradient (until the next)
  const ModelPart& part() const { return part_; }
  bool has_embedding() const { return part_.first_unit == 0; }
  bool has_head() const { return part_.last_unit == cfg_.L + 1; }

  ModelHooks hooks;
  // The seams, each filled by the dimension that splits it (parallel/parallelize.h): the products'
  // collectives (needed when tp.size > 1), attention over positions held elsewhere (needed under
  // context parallelism), and a MoE model's experts (GPT2Config::moe(), moe.h: empty on one rank;
  // forward() returns the cross-entropy plus the balance loss).
  ProductHooks product_hooks;
  AttentionHooks attention_hooks;
  ExpertHooks expert_hooks;
  double aux_loss() const { return aux_loss_; }  // this rank's share of the last forward's balance loss
  // Block l's routing in the last forward of activation slot `slot` (a pipeline's micro-batch in flight).
  const RoutingStats& routing(int l, int slot = 0) const;
  // Block l's assignments routed and dropped per expert (E), summed over every forward since
  // reset_routing_totals(): a step's micro-batches, whichever slots they used.
  const std::vector<int64_t>& routed_total(int l) const { return routed_total_[size_t(l)]; }
  const std::vector<int64_t>& dropped_total(int l) const { return dropped_total_[size_t(l)]; }
  void reset_routing_totals();
  std::vector<ExpertWeights> held_experts(int l) const;  // block l's experts this rank holds, in order
  const GPT2Config& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  bool flash_attention() const { return flash_; }  // see GPT2Config::flash_attention
  const TensorParallelism& tensor_parallelism() const { return tp_; }

  // GPT-2 initialisation into a full flat parameter buffer of the whole model (a layout without
  // tensor parallelism): N(0, 0.02) for matrices and embeddings, residual projections scaled by
  // 1/sqrt(2L), zero biases, unit layernorm gains. Each parameter draws from its own stream seeded by
  // (seed, parameter index), so the result is the same for any rank count and layout padding; a
  // tensor-parallel rank takes its slices of it (slice_from_global), so that every split starts from
  // the very same model.
  static void init_weights(const ParamLayout& layout, uint64_t seed, float* params);

  struct Layer;        // defined in model_internal.h: one block's activations
  struct Slot;         // one micro-batch's activations for the part
  struct Activations;  // the arena: the slots and the backward's scratch

 private:
  Tensor param(int p) const;  // view of params[p] at its bound location
  Tensor grad(int p) const;

  // model_activations.cpp: where things are in the arena.
  Layer& layer(Slot& s, int l);     // block l's activations in slot s
  int slot_of(const Slot& s) const;  // its index
  void* stream_into(Slot& s, int l);  // the residual stream entering block l

  // model_block.cpp: a block's steps. The forward writes into the tensors of x (its kept ones, or
  // recomputation's workspace); a replay (full recomputation, in backward) stops once it has made
  // what the backward reads.
  void block_forward(Slot& s, int l, const Layer& x, bool replay);
  void block_backward(Slot& s, int l);

  // model_ends.cpp: the embedding, and the head (final layernorm, tied LM head, cross-entropy).
  void embed_forward(Slot& s);
  float head_forward(Slot& s);
  void head_backward(Slot& s, float loss_weight);
  void embed_backward(Slot& s);

  // model_tensor_parallel.cpp: the products, with the collectives f and g of tensor parallelism
  // around them (none on one rank), and the vocabulary-parallel embedding and loss.
  // out = f(inp_local) W + b: under sequence parallelism the input is gathered to all rows first.
  // With gelu_out (the MLP's first layer): also gelu_out = GELU(out), inside the product.
  void column_parallel_forward(Slot& s, Tensor out, void* inp_local, int weight, int bias,
                               Tensor gelu_out = Tensor());
  // out_local = g(inp W) + b: the partial sums reduced over the group, then the bias added once.
  void row_parallel_forward(Slot& s, void* out_local, Tensor inp, int weight, int bias);
  // A column-parallel layer's backward: the input's gradient (summed over the group by f), then the
  // weight's while that travels; `inp_local` is the layer's input as this rank keeps it (re-gathered
  // under sequence parallelism). Overwrites dinp_local.
  void column_parallel_backward(Slot& s, Tensor dinp_local, int weight, int bias, Tensor dout, Tensor inp_local,
                                void* kept);
  // A row-parallel layer's backward, from its output's gradient, the residual stream's (dresidual).
  // Overwrites dinp_full with its input's gradient; with gelu_inp (the MLP's projection, whose input is
  // GELU(gelu_inp)), with the gradient of GELU's input instead, GELU's backward inside the product.
  void row_parallel_backward(Slot& s, Tensor dinp_full, int weight, int bias, Tensor inp_full, void* kept,
                             Tensor gelu_inp = Tensor());
  void vocab_parallel_embedding_forward(Slot& s);   // this rank's V/t rows of wte, summed by g
  void vocab_parallel_embedding_backward(Slot& s);
  float vocab_parallel_head(Slot& s);               // logits of V/t tokens a rank; the mean loss

  // model_context_parallel.cpp: attention, the one op that mixes positions (on this rank, or around
  // the ring of context parallelism), and the position embeddings at the rank's absolute positions.
  void self_attention_forward(Slot& s, const Layer& x);
  // dqkv (overwritten) from atty's gradient in the scratch datty; `att`: the softmax to read.
  void self_attention_backward(Slot& s, const Layer& x, void* dqkv, void* att);
  void position_embedding_forward(Slot& s);
  void position_embedding_backward(Slot& s);

  // model_experts.cpp: a MoE model's MLP step, a router per block and slot.
  void init_experts(int max_B);
  MoELayer& moe_layer(const Slot& s, int l);  // block l's router in slot s
  size_t moe_index(int slot, int l) const;    // its place in moe_: slot-major over the part's blocks
  void moe_mlp_forward(Slot& s, int l, const Layer& x);
  void moe_mlp_backward(Slot& s, int l, const Layer& x);  // into the scratch dln

  // model_recompute.cpp: what a block's forward writes and its backward reads under recomputation.
  Layer forward_layer(Slot& s, int l);
  const Layer& backward_layer(Slot& s, int l);   // full recomputation: the block replayed first
  void* recompute_attention(Slot& s, int l, const Layer& x);  // the softmax to read (selective: again)

  // model_split_backward.cpp: a product's weight (and bias) gradient from its output's gradient and
  // its input: now, or under split_backward kept for backward_weights() (`kept`: where the output's
  // gradient is kept). `inp_local`: under split_backward and sequence parallelism, the rows of `inp`
  // this rank keeps, gathered into `inp` only when the weight's gradient is computed.
  void weight_gradient(Slot& s, int weight, int bias, Tensor dout, Tensor inp, void* kept,
                       Tensor inp_local = Tensor());

  GPT2Config cfg_;
  const ParamLayout& layout_;
  int max_B_;
  Device device_;
  DType dtype_;
  bool flash_;
  TensorParallelism tp_;
  ModelPart part_;
  ContextParallelism cp_;
  std::vector<char*> param_ptr_, grad_ptr_;  // per parameter, where it lives now
  std::unique_ptr<Activations> acts_;
  std::vector<std::unique_ptr<MoELayer>> moe_;  // per slot and block of the part, for a MoE model
  std::vector<std::unique_ptr<ExpertMLPs>> experts_;  // per slot: the held experts' activations, when they run here
  double aux_loss_ = 0;
  std::vector<std::vector<int64_t>> routed_total_, dropped_total_;  // (L) x (E)
  float loss_weight_ = 1;                       // the running backward's
  int last_backward_B_ = 0;  // the micro-batch of the last backward (input_grad's shape)
};
