// quantize.cpp: the scaled quantization of quantize.h.
#include "ops/quantize.h"

#include <algorithm>
#include <cmath>

float power_of_two_scale(NumberFormat format, float amax) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  int exponent;
  std::frexp(format_max(format) / double(amax), &exponent);  // ratio = f * 2^exponent, f in [0.5, 1)
  exponent = std::min(64, std::max(-64, exponent - 1));        // the power of two at or below the ratio
  return float(std::ldexp(1.0, exponent));
}

float matrix_amax(const float* m, int rows, int cols) {
  float amax = 0;
  const int64_t n = int64_t(rows) * cols;
  for (int64_t i = 0; i < n; i++) amax = std::max(amax, std::fabs(m[i]));
  return amax;
}

namespace {

// One group: the rectangle [r0, r1) x [c0, c1) of the matrix.
void quantize_group(float* out, const float* m, int cols, int r0, int r1, int c0, int c1, NumberFormat format,
                    Overflow overflow, float fixed_scale, QuantCounts* counts) {
  float scale = fixed_scale;
  if (!(scale > 0)) {
    float amax = 0;
    for (int r = r0; r < r1; r++)
      for (int c = c0; c < c1; c++) amax = std::max(amax, std::fabs(m[int64_t(r) * cols + c]));
    scale = power_of_two_scale(format, amax);
  }
  const float unscale = 1.0f / scale;  // exact: a power of two
  const float max = float(format_max(format));
  QuantCounts local;
  for (int r = r0; r < r1; r++) {
    const float* in = m + int64_t(r) * cols;
    float* o = out + int64_t(r) * cols;
    int64_t nonzero = 0, underflow = 0, overflowed = 0;
    for (int c = c0; c < c1; c++) {  // counted first: out may be m
      nonzero += in[c] != 0;
      overflowed += std::fabs(in[c] * scale) > max;
    }
    for (int c = c0; c < c1; c++) {
      const bool was_nonzero = in[c] != 0;
      o[c] = round_to_format(format, in[c] * scale, overflow) * unscale;
      underflow += was_nonzero && o[c] == 0;
    }
    local.values += c1 - c0;
    local.nonzero += nonzero;
    local.underflow += underflow;
    local.overflow += overflowed;
  }
  if (counts) counts->add(local);
}

}  // namespace

void quantize_matrix(float* out, const float* m, int rows, int cols, bool contraction_along_rows, Tiling tiling,
                     NumberFormat format, Overflow overflow, float fixed_scale, QuantCounts* counts) {
  // The group's extent in rows and columns, from its extent across and along the contraction.
  int group_rows = contraction_along_rows ? tiling.along : tiling.across;
  int group_cols = contraction_along_rows ? tiling.across : tiling.along;
  if (group_rows <= 0 || group_rows > rows) group_rows = rows;
  if (group_cols <= 0 || group_cols > cols) group_cols = cols;
  for (int r0 = 0; r0 < rows; r0 += group_rows) {
    for (int c0 = 0; c0 < cols; c0 += group_cols) {
      quantize_group(out, m, cols, r0, std::min(rows, r0 + group_rows), c0, std::min(cols, c0 + group_cols), format,
                     overflow, fixed_scale, counts);
    }
  }
}
