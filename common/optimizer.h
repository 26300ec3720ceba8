// optimizer.h: AdamW over any offset range of the flat buffers, global-norm gradient clipping and
// the learning-rate schedule. Defines AdamW, learning_rate() and clip_factor().
// Because the optimizer works on a range, ZeRO runs the same code on a rank's shard: its m and v
// are then shard-sized, which is the whole point of ZeRO-1.
// Mixed precision: when the model's parameters are bf16, the optimizer also owns the fp32 master
// copy of its range and updates that; the bf16 parameters are the master rounded after every step.
// m, v and master make the 12 bytes per parameter of optimizer state in ../shared/THEORY.md.
#pragma once
#include <cstdint>

#include "flags.h"
#include "memory.h"
#include "param_layout.h"

class AdamW {
 public:
  // Owns m and v for flat elements [begin, end) on `device` (counted as optimizer state), and the
  // fp32 master weights of the range when the parameters have `param_dtype` bf16.
  AdamW(const ParamLayout& layout, int64_t begin, int64_t end, float weight_decay, Device device = Device::CPU,
        DType param_dtype = DType::F32);

  // One update of the range. params and grads are range-sized views (a full buffer's slice from
  // `begin`, or a shard buffer) on the optimizer's device, of the parameters' dtype. Decay applies
  // only to matrices; padding is left untouched. `step` counts from 1. grad_scale multiplies every
  // gradient first (clipping).
  void update(Tensor params, Tensor grads, int step, float lr, float grad_scale);

  Tensor m() const { return m_.view(); }  // range-sized, for checkpoints
  Tensor v() const { return v_.view(); }
  // The fp32 master weights of the range (mixed precision), or an empty Tensor (fp32 parameters are
  // their own master).
  Tensor master() const { return mixed_precision_ ? master_.view() : Tensor(); }
  bool mixed_precision() const { return mixed_precision_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  const ParamLayout& layout_;
  int64_t begin_, end_;
  float weight_decay_;
  bool mixed_precision_;
  Buffer m_, v_, master_;
};

// Linear warm-up over `warmup` steps to `max_lr`, then cosine decay to max_lr/10 at the last step.
float learning_rate(const TrainConfig& cfg, float max_lr, int step);

// The factor that scales gradients down to `max_norm` when their global norm exceeds it.
float clip_factor(double grad_norm, float max_norm);
