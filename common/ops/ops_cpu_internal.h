// ops_cpu_internal.h: what the CPU ops' files share (ops_cpu.cpp, ops_cpu_attention.cpp): sums in
// double that vectorize in a fixed order, a row's maximum, the shifted exponentials of a softmax and a
// dot product in double. Defines kLanes, sum_of_lanes, max_of, exp_shifted and dot_double.
#pragma once

#include <cmath>
#include <cstddef>

#include "ops/fast_math.h"  // fast_exp

namespace cpu {
namespace internal {

// Sums in double that vectorize: element i goes into lane i % kLanes, and the lanes are added in this
// fixed order at the end (a sequential sum cannot be vectorized without reordering it). The order is
// the same on every rank and every call, so results stay deterministic.
constexpr int kLanes = 8;
inline double sum_of_lanes(const double (&lanes)[kLanes]) {
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// The largest of x[0..n) (-inf when n = 0; NaNs are skipped). Lanes, then the lanes' maximum: a
// maximum does not depend on the order.
inline float max_of(const float* __restrict x, int n) {
  constexpr int W = 8;
  float lanes[W];
  for (int j = 0; j < W; j++) lanes[j] = -INFINITY;
  int i = 0;
  for (; i + W <= n; i += W) {
    for (int j = 0; j < W; j++) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  float m = lanes[0];
  for (int j = 1; j < W; j++) m = lanes[j] > m ? lanes[j] : m;
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

// out[i] = exp(x[i] - shift) for i < n; returns their sum in double, in lanes (sum_of_lanes).
inline double exp_shifted(float* __restrict out, const float* __restrict x, float shift, int n) {
  constexpr int W = kLanes;
  double lanes[W] = {};
  int i = 0;
  for (; i + W <= n; i += W) {
    for (int j = 0; j < W; j++) {
      const float e = fast_exp(x[i + j] - shift);
      out[i + j] = e;
      lanes[j] += e;
    }
  }
  double sum = sum_of_lanes(lanes);
  for (; i < n; i++) {
    const float e = fast_exp(x[i] - shift);
    out[i] = e;
    sum += e;
  }
  return sum;
}

// sum_i a[i] * b[i] in double, in lanes (sum_of_lanes).
inline double dot_double(const float* __restrict a, const float* __restrict b, size_t n) {
  constexpr int W = kLanes;
  double lanes[W] = {};
  size_t i = 0;
  for (; i + W <= n; i += W) {
    for (int j = 0; j < W; j++) lanes[j] += double(a[i + j]) * b[i + j];
  }
  double sum = sum_of_lanes(lanes);
  for (; i < n; i++) sum += double(a[i]) * b[i];
  return sum;
}

}  // namespace internal
}  // namespace cpu
