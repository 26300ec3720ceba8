// theory.h: what ../shared/THEORY.md predicts for a chapter, so every measured number can be printed
// next to its prediction. Defines Prediction and predict().
// Ψ = parameters (unpadded), N = data-parallel ranks. fp32 training: 4 bytes per parameter and per
// gradient, 8 bytes of AdamW state (m and v). bf16 mixed precision: 2 bytes per parameter and per
// gradient, 12 bytes of optimizer state (fp32 master weights, m and v); the collectives then move
// bf16 gradients and parameters, 2 bytes per element.
#pragma once
#include <string>

#include "param_layout.h"
#include "tensor.h"  // DType

enum class Strategy { DP, ZeRO1, ZeRO2, ZeRO3 };

struct Prediction {
  std::string strategy;        // "DP", "ZeRO-1", ...
  std::string memory_formula;  // e.g. "4Ψ + 4Ψ + 8Ψ"
  double params_bytes = 0, grads_bytes = 0, optim_bytes = 0;
  std::string comm_formula;    // e.g. "2(N-1)/N x 4Ψ"
  double comm_bytes = 0;       // wire bytes per rank per step (see comm.h)
};

// `grad_accum` matters where a strategy communicates once per micro-batch (ZeRO-2, ZeRO-3). `dtype`
// is the parameters' (F32, or BF16 for mixed precision).
Prediction predict(Strategy strategy, const ParamLayout& layout, int grad_accum, DType dtype = DType::F32);
