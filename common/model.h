// model.h: GPT-2, exactly: token + learned position embeddings, L pre-LayerNorm blocks (causal
// multi-head self-attention, 4x MLP with tanh GELU, residual connections), a final LayerNorm and the
// LM head tied to the token embedding, then cross-entropy. Defines ModelHooks and GPT2.
//
// The model owns only its activations. Parameters and gradients live in flat buffers the chapter
// owns; the model is told where each unit's parameters and gradients are (bind_unit), so a chapter
// can point a unit at a freshly gathered buffer (ZeRO-3) or at a transient bucket, and release it.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "memory.h"
#include "param_layout.h"
#include "tensor.h"

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

class GPT2 {
 public:
  // Allocates activations for micro-batches of up to max_B sequences of cfg.T tokens. `dtype` is
  // what parameters, gradients and activations are kept in: fp32, or bf16 for mixed precision on a
  // GPU (the statistics of layernorm and the losses stay fp32; ops.h).
  GPT2(const GPT2Config& cfg, const ParamLayout& layout, int max_B, Device device = Device::CPU,
       DType dtype = DType::F32);
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

  ModelHooks hooks;
  const GPT2Config& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  bool flash_attention() const { return flash_; }  // see GPT2Config::flash_attention

  // GPT-2 initialisation into a full flat parameter buffer: N(0, 0.02) for matrices and embeddings,
  // residual projections scaled by 1/sqrt(2L), zero biases, unit layernorm gains. Each parameter
  // draws from its own stream seeded by (seed, parameter index), so the result is the same for any
  // rank count and layout padding.
  static void init_weights(const ParamLayout& layout, uint64_t seed, float* params);

  struct Activations;  // defined in model.cpp

 private:
  Tensor param(int p) const;  // view of params[p] at its bound location
  Tensor grad(int p) const;

  GPT2Config cfg_;
  const ParamLayout& layout_;
  int max_B_;
  Device device_;
  DType dtype_;
  bool flash_;
  std::vector<char*> param_ptr_, grad_ptr_;  // per parameter, where it lives now
  std::unique_ptr<Activations> acts_;
  int B_ = 0;  // batch of the last forward
  const int* inputs_ = nullptr;
  const int* targets_ = nullptr;
};
