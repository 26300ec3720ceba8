// optimizer.cpp: see optimizer.h.
#include "optimizer.h"

#include <algorithm>
#include <cmath>

#include "ops.h"
#include "trace.h"

namespace {
constexpr float kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f;  // GPT-2/3 practice
}

AdamW::AdamW(const ParamLayout& layout, int64_t begin, int64_t end, float weight_decay, Device device,
             DType param_dtype)
    : layout_(layout), begin_(begin), end_(end), weight_decay_(weight_decay),
      mixed_precision_(param_dtype != DType::F32),
      m_(end - begin, MemCategory::OptState, device),
      v_(end - begin, MemCategory::OptState, device) {
  if (mixed_precision_) master_ = Buffer(end - begin, MemCategory::OptState, device);
}

void AdamW::update(Tensor params, Tensor grads, int step, float lr, float grad_scale) {
  TraceScope span("optimizer");
  ENSURE(params.numel() == end_ - begin_ && grads.numel() == end_ - begin_,
         "AdamW::update: params and grads must hold the optimizer's range");
  // Walk the parameters that overlap [begin, end): a shard may start or end inside a tensor.
  for (const ParamInfo& p : layout_.params) {
    int64_t lo = std::max(p.offset, begin_), hi = std::min(p.offset + p.size, end_);
    if (lo >= hi) continue;
    int64_t at = lo - begin_, n = hi - lo;
    const Tensor master = mixed_precision_ ? master_.view().slice1d(at, n) : Tensor();
    adamw_update(params.slice1d(at, n), master, grads.slice1d(at, n), m_.view().slice1d(at, n),
                 v_.view().slice1d(at, n), step, lr, kBeta1, kBeta2, kEps, p.weight_decay ? weight_decay_ : 0.0f,
                 grad_scale);
  }
}

float learning_rate(const TrainConfig& cfg, float max_lr, int step) {
  int warmup = cfg.warmup >= 0 ? cfg.warmup : cfg.steps / 10;
  float min_lr = max_lr * 0.1f;
  if (step < warmup) return max_lr * float(step + 1) / float(warmup);
  if (cfg.steps - 1 <= warmup) return max_lr;
  double progress = double(step - warmup) / double(cfg.steps - 1 - warmup);
  return min_lr + 0.5f * (max_lr - min_lr) * float(1.0 + std::cos(M_PI * progress));
}

float clip_factor(double grad_norm, float max_norm) {
  if (max_norm <= 0 || grad_norm <= max_norm) return 1.0f;
  return float(max_norm / (grad_norm + 1e-6));
}
