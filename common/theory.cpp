// theory.cpp: the formulas of ../shared/THEORY.md, fp32 and bf16 mixed-precision columns.
#include "theory.h"

Prediction predict(Strategy strategy, const ParamLayout& layout, int grad_accum, DType dtype) {
  const double psi = double(layout.num_params), N = layout.ranks;
  const double ring = (N - 1) / N;  // a ring collective sends this share of the payload per rank
  // Bytes per parameter of the parameters (= of the gradients, = of an element on the wire) and of
  // the optimizer state: 4 and 8 in fp32; 2 and 12 in mixed precision (master weights, m, v).
  const bool mixed = dtype == DType::BF16;
  const double w = mixed ? 2 : 4, k = mixed ? 12 : 8;
  const std::string W = mixed ? "2Ψ" : "4Ψ", K = mixed ? "12Ψ" : "8Ψ";
  const double K_acc = grad_accum;
  Prediction p;
  switch (strategy) {
    case Strategy::DP:
      p = {"DP", W + " + " + W + " + " + K, w * psi, w * psi, k * psi, "all-reduce: 2(N-1)/N x " + W,
           2 * ring * w * psi};
      break;
    case Strategy::ZeRO1:
      p = {"ZeRO-1", W + " + " + W + " + " + K + "/N", w * psi, w * psi, k * psi / N,
           "reduce-scatter + all-gather: 2(N-1)/N x " + W, 2 * ring * w * psi};
      break;
    case Strategy::ZeRO2:
      p = {"ZeRO-2", W + " + (" + W + " + " + K + ")/N", w * psi, w * psi / N, k * psi / N,
           "K reduce-scatters + all-gather: (K+1)(N-1)/N x " + W, (K_acc + 1) * ring * w * psi};
      break;
    case Strategy::ZeRO3:
      p = {"ZeRO-3", "(" + W + " + " + W + " + " + K + ")/N", w * psi / N, w * psi / N, k * psi / N,
           "K x (2 all-gathers + reduce-scatter): 3K(N-1)/N x " + W, 3.0 * K_acc * ring * w * psi};
      break;
  }
  return p;
}
