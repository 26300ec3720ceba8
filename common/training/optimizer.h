// optimizer.h: AdamW over a rank's shard of the flat buffers, global-norm gradient clipping and the
// learning-rate schedule. Defines AdamW, learning_rate() and clip_factor().
// The optimizer updates the pieces a ShardPlan gives this rank (shards.h): all of the buffer in
// 01-03 (ShardPlan::unsharded), a 1/N shard under ZeRO, where its m and v are shard-sized: the whole
// point of ZeRO-1.
// Mixed precision: when the model's parameters are bf16, the optimizer also owns the fp32 master
// copy of its shard and updates that; the bf16 parameters are the master rounded after every step.
// m, v and master make the 12 bytes per parameter of optimizer state (docs/theory.md).
#pragma once
#include <cstdint>
#include <functional>

#include "training/flags.h"
#include "ops/memory.h"
#include "model/param_layout.h"
#include "parallel/shards.h"

class AdamW {
 public:
  // Owns m and v for this rank's shard of `plan` on `device` (counted as optimizer state), and the
  // fp32 master weights of the shard when the parameters have `param_dtype` bf16.
  AdamW(const ParamLayout& layout, ShardPlan plan, float weight_decay, Device device = Device::CPU,
        DType param_dtype = DType::F32);

  // One update of this rank's pieces. params and grads are each either a full flat buffer
  // (layout.padded_size elements) or a shard (plan.size() elements), on the optimizer's device, of
  // the parameters' dtype: 04 and 05 keep full parameters but a gradient shard, 06 both as shards.
  // Decay applies only to matrices; padding is left untouched. `step` counts from 1. grad_scale
  // multiplies every gradient first (clipping); a grad_scale that is not finite (clip_factor of a
  // gradient with an inf or NaN) skips the update: fp16's overflowed step (mixed_precision.h).
  void update(Tensor params, Tensor grads, int step, float lr, float grad_scale);

  Tensor m() const { return m_.view(); }  // shard-sized, for checkpoints
  Tensor v() const { return v_.view(); }
  // The fp32 master weights of the shard (mixed precision), or an empty Tensor (fp32 parameters are
  // their own master).
  Tensor master() const { return mixed_precision_ ? master_.view() : Tensor(); }
  bool mixed_precision() const { return mixed_precision_; }
  const ShardPlan& plan() const { return plan_; }

 private:
  const ParamLayout& layout_;
  ShardPlan plan_;
  float weight_decay_;
  bool mixed_precision_;
  Buffer m_, v_, master_;
};

// The sum of squares of the gradients this rank holds of `plan`'s pieces (`grads`: a full flat
// buffer or a shard, as AdamW::update takes them), for the global norm: summed over the ranks that
// hold different pieces, it is the norm squared. A tensor several ranks hold alike must count once:
// `counted`, where given, says which parameters this rank counts (07: the tensors every rank of a
// tensor-parallel group holds whole count on one rank of it; 08: the tied wte on the first stage).
double gradient_squares(const ParamLayout& layout, const ShardPlan& plan, Tensor grads,
                        const std::function<bool(const ParamInfo&)>& counted = nullptr);
// The same, each tensor counted where its copy is the one that counts (ParamInfo::counts_here) among
// its copies along `among`: the axes the norm's sum runs over, less those it is sharded along
// (counted_along, grid_axes.h).
double gradient_squares(const ParamLayout& layout, const ShardPlan& plan, Tensor grads, const GridCoords& at,
                        AxisSet among);

// Linear warm-up over cfg.warmup steps to `max_lr`, then cosine decay to max_lr/10 at the last step.
float learning_rate(const TrainConfig& cfg, float max_lr, int step);

// The factor that scales gradients down to `max_norm` when their global norm exceeds it; NaN when
// the norm is not finite (an inf or NaN in the gradients: no step to take).
float clip_factor(double grad_norm, float max_norm);
