// model_internal.h: what the files of GPT2 (model*.cpp) share and nothing else includes. Defines
// the activations (GPT2::Layer, GPT2::Slot, GPT2::Activations), one rank's tensor sizes (Dims), the
// blocks a part runs (BlockRange), where each parameter sits in the layout (BlockParam and friends),
// and Views, the arena's tensors shaped for the current micro-batch.
//
// The model is spread over files by concern, one a dimension: model.cpp (construction, binding, the
// forward and backward drivers), model_activations.cpp (the arena), model_block.cpp (a block's steps),
// model_ends.cpp (embedding and head), model_tensor_parallel.cpp, model_context_parallel.cpp,
// model_experts.cpp, model_recompute.cpp and model_split_backward.cpp (each dimension's pieces).
#pragma once
#include <functional>
#include <vector>

#include "model/model.h"

// The activations, per slot. Shapes in comments: R = B*T positions; r = R/t rows under sequence
// parallelism, else R; C' = C/t, NH' = NH/t, F' = 4C/t, V' = V/t on a tensor-parallel rank (t = 1:
// the whole model). A smaller batch uses a prefix of each. A slot holds one micro-batch's
// activations for the units the model runs (its ModelPart): the whole model in chapters 01-07, a
// pipeline stage's units in 08, one slot per micro-batch in flight. void*: the model's dtype (fp32,
// or bf16 in mixed precision); float*: fp32 always (statistics that feed a division, the losses).
struct GPT2::Layer {
  void* ln1; float *ln1_mean, *ln1_rstd;   // (r,C), (r), (r)
  void* qkv;                               // (R,3C')  this rank's heads' q, k, v
  void* atty;                              // (R,C')   attention output, this rank's heads
  void *preatt, *att;                      // (B,NH',T,T); not allocated with FlashAttention
  float* lse;                              // (B,NH',T); FlashAttention only
  void* attproj;                           // (r,C)
  void* residual2;                         // (r,C)    stream after attention
  void* ln2; float *ln2_mean, *ln2_rstd;   // (r,C), (r), (r)
  void *fch, *fch_gelu;                    // (R,F')
  void* fcproj;                            // (r,C)
  void* residual3;                         // (r,C)    stream after the MLP
  // split_backward only: the gradients of the four products' outputs, kept from backward() for
  // backward_weights(): qkv's and fc's (written there directly), the projections' (copied; all R
  // rows, as the row-parallel products read them).
  void *dqkv, *dattproj, *dfch, *dfcproj;  // (R,3C'), (R,C), (R,F'), (R,C)
};

struct GPT2::Slot {
  void* encoded;    // (r,C) the stream entering the part's first block: embeddings, or received
  std::vector<Layer> layers;                 // the part's blocks
  void* lnf; float *lnf_mean, *lnf_rstd;     // (r,C), (r), (r)       the head's part only
  void *logits, *probs;                      // (R,V')
  float* losses;                             // (R)
  float *row_max, *row_sum, *target_logit;   // (R); the vocabulary-parallel cross-entropy (t > 1)
  void* dlogits;                             // (R,V') split_backward only (else the scratch's)
  // The micro-batch in this slot (forward), and what its backward left for backward_weights().
  const int* inputs = nullptr;
  const int* targets = nullptr;
  int B = 0;
  struct WeightGradient {  // dweight (, dbias) of one product: from its output's gradient and input
    int weight, bias;      // parameter indices; bias -1: none
    Tensor dout, inp;
    Tensor inp_local;      // sequence parallelism: the rows kept of inp, gathered again when it is due
  };
  std::vector<WeightGradient> weight_gradients;
};

// Every activation the backward pass reads, in one arena: a slot per micro-batch in flight, plus
// the scratch gradients the backward writes.
struct GPT2::Activations {
  Buffer arena;
  std::vector<Slot> slots;
  // Backward scratch, reused by every layer and slot.
  void *dresidual, *dln;                     // (r,C)
  void* datty;                               // (R,C')
  void* dqkv;                                // (R,3C')  (split_backward: the layer's, kept)
  void *dpreatt, *datt;                      // (B,NH',T,T); not allocated with FlashAttention
  void* dfch;                                // (R,F')   (split_backward: the layer's, kept)
  void* dlogits;                             // (R,V')
  // Sequence parallelism only (else these are the local tensors themselves): a full-rows input of a
  // column-parallel layer (gathered, in forward and again in backward), a row-parallel layer's full
  // partial output, and a full-rows gradient (an f's input in backward, a g's output).
  void *gathered, *partial, *dfull;          // (R,C)
  // Recomputation's workspace (docs/theory.md, section 12). Selective: the recomputed softmax, the
  // scores before it written into dpreatt (the backward reads them never and overwrites dpreatt).
  // Full: a whole block replayed in its backward, up to GELU's output (recomputed_att its softmax,
  // dpreatt its scores; no fcproj, no residual3: the replay stops before them).
  void* recomputed_att;                      // (B,NH',T,T)
  Layer replay;
};

namespace model_internal {

// The sizes of one rank's tensors (see Activations).
struct Dims {
  int64_t B, T, C, R, r, Cl, NHl, Fl, Vl;
  bool sp;
};
Dims dims_for(const GPT2Config& cfg, int B, const TensorParallelism& tp);

// The blocks [begin, end) a part runs: unit u > 0 is block u - 1.
struct BlockRange {
  int begin, end;
};
BlockRange blocks_of(const GPT2Config& cfg, const ModelPart& part);

// Counts the arena of `a` (every slot's activations and the backward's scratch, model_activations.cpp),
// allocates it and points every tensor into it. `lse_only`: attention keeps a log-sum-exp per query,
// not (B,NH,T,T) matrices (FlashAttention, or the ring of context parallelism).
void allocate_activations(GPT2::Activations& a, const GPT2Config& cfg, int max_B, bool lse_only,
                          const TensorParallelism& tp, const ModelPart& part, DType dtype, Device device);

// Index of the first parameter of each unit, and of a block's parameters in the order added by
// build_gpt2_layout: ln1 w,b; qkv w,b; proj w,b; ln2 w,b; fc w,b; mlp proj w,b.
enum BlockParam { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B,
                  kBlockParams };
constexpr int kWte = 0, kWpe = 1;
// A MoE block (moe.h) lists the same first eight, then the router and each expert's four (fc w, b,
// proj w, b) where the dense block has its MLP's.
constexpr int kRouter = LN2_B + 1, kExpertParams = 4;
inline int params_per_block(const GPT2Config& cfg) {
  return cfg.moe() ? kRouter + 1 + kExpertParams * cfg.experts : kBlockParams;
}
inline int block_param(const GPT2Config& cfg, int l, int which) { return 2 + l * params_per_block(cfg) + which; }
inline int expert_param(const GPT2Config& cfg, int l, int e, int which) {
  return block_param(cfg, l, kRouter + 1 + kExpertParams * e + which);
}
inline int lnf_param(const GPT2Config& cfg, int which) { return 2 + cfg.L * params_per_block(cfg) + which; }

inline void call(const std::function<void(int)>& hook, int arg) {
  if (hook) hook(arg);
}

inline void wait(CommHandle& handle) {
  if (handle.valid()) handle.wait();
}

// Views of the arena for the current batch.
struct Views {
  Dims d;
  DType dtype;
  Device device;
  Tensor rows(void* p, int64_t n, int64_t cols) const { return make_view(p, {n, cols}, dtype, device); }
  Tensor local(void* p) const { return rows(p, d.r, d.C); }    // (r,C): the stream between the parallel layers
  Tensor full(void* p, int64_t cols) const { return rows(p, d.R, cols); }
  Tensor btc(void* p, int64_t cols) const { return make_view(p, {d.B, d.T, cols}, dtype, device); }
  Tensor stat(float* p, int64_t n) const { return make_view(p, {n}, DType::F32, device); }
  Tensor bhtt(void* p) const { return make_view(p, {d.B, d.NHl, d.T, d.T}, dtype, device); }
  Tensor lse(float* p) const { return make_view(p, {d.B, d.NHl, d.T}, DType::F32, device); }
  // The full-rows form of a local tensor: its own rows without sequence parallelism, else `spare`.
  Tensor full_of(void* local_data, void* spare) const { return full(d.sp ? spare : local_data, d.C); }
  // Where attention_forward writes the scores before the softmax: nowhere on the CPU, whose backward
  // reads only the softmax (ops.h); the GPU's softmax reads them back. (The arena holds them either
  // way: its size, and docs/theory.md's count, do not depend on the device.)
  Tensor scores(void* preatt) const { return device == Device::CPU ? Tensor() : bhtt(preatt); }
};

}  // namespace model_internal
