// optimizer.h: AdamW over any offset range of the flat buffers, global-norm gradient clipping and
// the learning-rate schedule. Defines AdamW, learning_rate() and clip_factor().
// Because the optimizer works on a range, ZeRO runs the same code on a rank's shard: its m and v
// are then shard-sized, which is the whole point of ZeRO-1.
#pragma once
#include <cstdint>

#include "flags.h"
#include "memory.h"
#include "param_layout.h"

class AdamW {
 public:
  // Owns m and v for flat elements [begin, end) on `device` (counted as optimizer state).
  AdamW(const ParamLayout& layout, int64_t begin, int64_t end, float weight_decay, Device device = Device::CPU);

  // One update of the range. params and grads are range-sized views (a full buffer's slice from
  // `begin`, or a shard buffer) on the optimizer's device. Decay applies only to matrices; padding
  // is left untouched. `step` counts from 1. grad_scale multiplies every gradient first (clipping).
  void update(Tensor params, Tensor grads, int step, float lr, float grad_scale);

  Tensor m() const { return m_.view(); }  // range-sized, for checkpoints
  Tensor v() const { return v_.view(); }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  const ParamLayout& layout_;
  int64_t begin_, end_;
  float weight_decay_;
  Buffer m_, v_;
};

// Linear warm-up over `warmup` steps to `max_lr`, then cosine decay to max_lr/10 at the last step.
float learning_rate(const TrainConfig& cfg, float max_lr, int step);

// The factor that scales gradients down to `max_norm` when their global norm exceeds it.
float clip_factor(double grad_norm, float max_norm);
