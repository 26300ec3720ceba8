// optimizer.cpp: see optimizer.h.
#include "training/optimizer.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "comm/trace.h"

namespace {
constexpr float kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f;  // GPT-2/3 practice
}

AdamW::AdamW(const ParamLayout& layout, ShardPlan plan, float weight_decay, Device device, DType param_dtype)
    : layout_(layout), plan_(std::move(plan)), weight_decay_(weight_decay), mixed_precision_(param_dtype != DType::F32),
      m_(plan_.size(), MemCategory::OptState, device),
      v_(plan_.size(), MemCategory::OptState, device) {
  ENSURE(plan_.flat_size() == layout.padded_size, "AdamW: the plan does not cover the layout");
  if (mixed_precision_) master_ = Buffer(plan_.size(), MemCategory::OptState, device);
}

void AdamW::update(Tensor params, Tensor grads, int step, float lr, float grad_scale) {
  TraceScope span("optimizer");
  // A gradient with an inf or NaN (clip_factor's NaN): fp16's overflow, skipped (mixed_precision.h),
  // or a diverging run, which end_step stops; the weights keep their last finite values either way.
  if (!std::isfinite(grad_scale)) return;
  const int64_t full = layout_.padded_size;
  ENSURE((params.numel() == full || params.numel() == plan_.size()) &&
             (grads.numel() == full || grads.numel() == plan_.size()),
         "AdamW::update: params and grads must each be a full buffer or this rank's shard");
  for (int i = 0; i < plan_.count(); i++) {
    const FlatRange piece = plan_.piece(i);
    // Where piece i of each buffer starts: its flat offset in a full buffer, its shard offset in a
    // shard. (On one rank the two coincide.)
    const int64_t shard_at = plan_.shard_offset(i);
    const int64_t param_at = params.numel() == full ? piece.begin : shard_at;
    const int64_t grad_at = grads.numel() == full ? piece.begin : shard_at;
    // Walk the parameters that overlap the piece: a piece may start or end inside a tensor.
    for (const ParamInfo& p : layout_.params) {
      const int64_t lo = std::max(p.offset, piece.begin), hi = std::min(p.offset + p.size, piece.end);
      if (lo >= hi) continue;
      const int64_t into = lo - piece.begin, n = hi - lo;
      const Tensor master = mixed_precision_ ? master_.view().slice1d(shard_at + into, n) : Tensor();
      adamw_update(params.slice1d(param_at + into, n), master, grads.slice1d(grad_at + into, n),
                   m_.view().slice1d(shard_at + into, n), v_.view().slice1d(shard_at + into, n), step, lr, kBeta1,
                   kBeta2, kEps, p.weight_decay ? weight_decay_ : 0.0f, grad_scale);
    }
  }
}

double gradient_squares(const ParamLayout& layout, const ShardPlan& plan, Tensor grads,
                        const std::function<bool(const ParamInfo&)>& counted) {
  if (!counted) return sum_of_squares(grads);  // (padding is zero)
  double squares = 0;
  const bool full = grads.numel() == layout.padded_size;
  for (int i = 0; i < plan.count(); i++) {
    const FlatRange piece = plan.piece(i);
    const int64_t at = full ? piece.begin : plan.shard_offset(i);
    for (const ParamInfo& p : layout.params) {
      if (!counted(p)) continue;
      const int64_t lo = std::max(p.offset, piece.begin), hi = std::min(p.offset + p.size, piece.end);
      if (lo < hi) squares += sum_of_squares(grads.slice1d(at + lo - piece.begin, hi - lo));
    }
  }
  return squares;
}

double gradient_squares(const ParamLayout& layout, const ShardPlan& plan, Tensor grads, const GridCoords& at,
                        AxisSet among) {
  return gradient_squares(layout, plan, grads, [&](const ParamInfo& p) { return p.counts_here(at, among); });
}

float learning_rate(const TrainConfig& cfg, float max_lr, int step) {
  const int warmup = cfg.warmup;  // resolved by TrainingRun: the flag, the checkpoint's, or steps/10
  float min_lr = max_lr * 0.1f;
  if (step < warmup) return max_lr * float(step + 1) / float(warmup);
  if (cfg.steps - 1 <= warmup) return max_lr;
  double progress = double(step - warmup) / double(cfg.steps - 1 - warmup);
  return min_lr + 0.5f * (max_lr - min_lr) * float(1.0 + std::cos(M_PI * progress));
}

float clip_factor(double grad_norm, float max_norm) {
  if (!std::isfinite(grad_norm)) return NAN;  // no step to take (AdamW::update skips it)
  if (max_norm <= 0 || grad_norm <= max_norm) return 1.0f;
  return float(max_norm / (grad_norm + 1e-6));
}
