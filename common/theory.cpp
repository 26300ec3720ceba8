// theory.cpp: the formulas of ../shared/THEORY.md, fp32 column.
#include "theory.h"

Prediction predict(Strategy strategy, const ParamLayout& layout, int grad_accum) {
  const double psi = double(layout.num_params), N = layout.ranks;
  const double ring = (N - 1) / N;  // a ring collective sends this share of the payload per rank
  Prediction p;
  switch (strategy) {
    case Strategy::DP:
      p = {"DP", "4Ψ + 4Ψ + 8Ψ", 4 * psi, 4 * psi, 8 * psi, "all-reduce: 2(N-1)/N x 4Ψ", 2 * ring * 4 * psi};
      break;
    case Strategy::ZeRO1:
      p = {"ZeRO-1", "4Ψ + 4Ψ + 8Ψ/N", 4 * psi, 4 * psi, 8 * psi / N,
           "reduce-scatter + all-gather: 2(N-1)/N x 4Ψ", 2 * ring * 4 * psi};
      break;
    case Strategy::ZeRO2:
      p = {"ZeRO-2", "4Ψ + (4Ψ + 8Ψ)/N", 4 * psi, 4 * psi / N, 8 * psi / N,
           "K reduce-scatters + all-gather: (K+1)(N-1)/N x 4Ψ", (grad_accum + 1) * ring * 4 * psi};
      break;
    case Strategy::ZeRO3:
      p = {"ZeRO-3", "(4Ψ + 4Ψ + 8Ψ)/N", 4 * psi / N, 4 * psi / N, 8 * psi / N,
           "K x (2 all-gathers + reduce-scatter): 3K(N-1)/N x 4Ψ", 3.0 * grad_accum * ring * 4 * psi};
      break;
  }
  return p;
}
