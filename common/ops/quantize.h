// quantize.h: scaled quantization, the step between an fp32 tensor and a low-precision matrix product.
// Defines Tiling (which values share one scale), QuantCounts (what underflowed and overflowed),
// power_of_two_scale() and quantize_matrix().
//
// A value x goes into a format as the code of x * s, and comes back as code / s. The scale s maps the
// group's largest magnitude (its amax) close to the format's max, so that the group uses the top of the
// format's range instead of underflowing into its subnormals (fp8 E4M3's smallest subnormal is 2^-9:
// a weight of 1e-3 is zero without a scale). Our scales are powers of two, the largest with
// amax * s <= max: multiplying by one changes only the exponent, so the scaling itself never rounds,
// and code / s is exactly the value the hardware multiplies (as in the OCP MX formats and DeepSeek-V3's
// recipe; Transformer Engine's default scales are arbitrary reals).
//
// The groups (Tiling) are described relative to the product the matrix enters: `along` counts values
// in the direction the product sums over (the contraction), `across` in the other. A per-tensor scale
// is one group; per-row is one group per index that is not summed over (a token of the activations, an
// output channel of the weights); DeepSeek-V3's tiles are 1 x 128 for activations and gradients (128
// values along the contraction) and 128 x 128 blocks for weights.
#pragma once
#include <cstdint>

#include "ops/float_formats.h"

struct Tiling {
  int across = 0;  // values per group across the contraction; 0: the whole extent
  int along = 0;   // values per group along the contraction; 0: the whole extent
};

// Underflow: a non-zero value that came back as zero. Overflow: a value beyond the format's max after
// scaling (saturated, or infinite, by the Overflow mode). Counted over values, for the report.
struct QuantCounts {
  int64_t values = 0, nonzero = 0, underflow = 0, overflow = 0;
  void add(const QuantCounts& o) {
    values += o.values;
    nonzero += o.nonzero;
    underflow += o.underflow;
    overflow += o.overflow;
  }
};

// The largest power of two s with amax * s <= format_max, clamped to [2^-64, 2^64]; 1 for an amax of 0
// or one that is not finite (a step whose values overflowed: the scale is not what failed).
float power_of_two_scale(NumberFormat format, float amax);

// The largest |x| of the rows x cols matrix m: a per-tensor scale's amax.
float matrix_amax(const float* m, int rows, int cols);

// out = the values of m (rows x cols, row-major) after the round trip through `format`: code(x * s) / s,
// one scale s per group. `contraction_along_rows` says which way the product sums (true: down the
// columns, as in a weight gradient's dY^T X). `fixed_scale` > 0: that one scale for every group (a
// delayed or a unit scale); else each group's scale from its own amax. `counts` (optional) adds this
// call's underflows and overflows. out may be m.
void quantize_matrix(float* out, const float* m, int rows, int cols, bool contraction_along_rows, Tiling tiling,
                     NumberFormat format, Overflow overflow, float fixed_scale, QuantCounts* counts);
