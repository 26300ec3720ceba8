// bf16.h: bfloat16 on the host: the 16-bit format mixed precision keeps parameters, gradients and
// activations in (the top half of an IEEE fp32: 1 sign, 8 exponent, 7 mantissa bits), and the two
// conversions. Host code only, so it builds without CUDA; the GPU kernels use cuda_bf16.h, whose
// conversions round the same way (to nearest, ties to even).
#pragma once
#include <cstdint>
#include <cstring>

using bf16_bits = uint16_t;  // one bfloat16, as raw bits

inline float bf16_to_float(bf16_bits h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rounds to the nearest bfloat16, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
// A NaN stays a (quiet) NaN: the rounding carry could otherwise turn it into an infinity.
inline bf16_bits float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) return bf16_bits((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return bf16_bits(bits >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
