// float_formats.h: the low-precision number formats of mixed precision, ours, on the host and in CUDA:
// bf16, fp16 (IEEE binary16), and the two 8-bit formats of the OCP 8-bit floating point specification,
// E4M3 and E5M2. Defines NumberFormat, each format's shape (FormatSpec), and the two conversions,
// float -> code (encode_float) and code -> float (decode_code), written once for both compilers (the
// functions are __host__ __device__ under nvcc; float_formats_cuda.cu runs them over device arrays).
//
// One rule for every format: round to nearest, ties to even, as if the exponent were unbounded; then
// a result above the largest finite value overflows. Subnormals are kept (never flushed). What
// overflow gives depends on the format and on the Overflow mode:
//   - bf16, fp16, E5M2: IEEE infinities. Overflow::Saturate gives +-max instead (also for an infinite
//     input), the mode the fp8 recipes use for gradients (a clipped gradient beats an infinite one);
//   - E4M3 has no infinity and one NaN per sign (S.1111.111), which buys it the exponent's top binade
//     (max 448). Overflow::Ieee gives NaN (the specification's conversion without saturation);
//     Overflow::Saturate gives +-448, which is what the fp8 recipes use for weights and activations.
// NaN in gives NaN out: bf16 keeps the sign and the top payload bits with the quiet bit set (as
// bf16.h does), fp16 gives sign|0x7E00, the 8-bit formats sign|0x7F. The codes are stored in uint16_t
// (the 8-bit formats in its low byte).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define FF_HOST_DEVICE __host__ __device__
#else
#define FF_HOST_DEVICE
#endif

enum class NumberFormat { BF16, FP16, E4M3, E5M2 };
enum class Overflow { Ieee, Saturate };

struct FormatSpec {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool has_infinity;  // false for E4M3: its top exponent holds numbers, and one NaN per sign
};

FF_HOST_DEVICE inline FormatSpec format_spec(NumberFormat f) {
  switch (f) {
    case NumberFormat::BF16: return {8, 7, 127, true};
    case NumberFormat::FP16: return {5, 10, 15, true};
    case NumberFormat::E4M3: return {4, 3, 7, false};
    default: return {5, 2, 15, true};  // E5M2
  }
}

FF_HOST_DEVICE inline int format_bits(NumberFormat f) {
  const FormatSpec s = format_spec(f);
  return 1 + s.exponent_bits + s.mantissa_bits;
}

// The largest finite value: the top exponent below the infinities (IEEE-like formats), or, for E4M3,
// the top exponent with every mantissa bit but the last (the all-ones code is NaN): 448.
FF_HOST_DEVICE inline double format_max(NumberFormat f) {
  const FormatSpec s = format_spec(f);
  const int top_exponent = (1 << s.exponent_bits) - 1 - (s.has_infinity ? 1 : 0) - s.bias;
  const int top_mantissa = (1 << s.mantissa_bits) - 1 - (s.has_infinity ? 0 : 1);
  return std::ldexp(1.0 + double(top_mantissa) / double(1 << s.mantissa_bits), top_exponent);
}

// The smallest positive normal value, 2^(1 - bias); below it the subnormals, steps of 2^(1 - bias - m).
FF_HOST_DEVICE inline double format_min_normal(NumberFormat f) { return std::ldexp(1.0, 1 - format_spec(f).bias); }
FF_HOST_DEVICE inline double format_min_subnormal(NumberFormat f) {
  const FormatSpec s = format_spec(f);
  return std::ldexp(1.0, 1 - s.bias - s.mantissa_bits);
}

FF_HOST_DEVICE inline uint16_t format_nan(NumberFormat f, uint32_t sign, uint32_t fp32_bits) {
  const int bits = format_bits(f);
  if (f == NumberFormat::BF16) return uint16_t((fp32_bits >> 16) | 0x0040u);
  if (f == NumberFormat::FP16) return uint16_t((sign << 15) | 0x7E00u);
  return uint16_t((sign << (bits - 1)) | 0x7Fu);
}

FF_HOST_DEVICE inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

FF_HOST_DEVICE inline uint16_t encode_float(NumberFormat f, float x, Overflow overflow = Overflow::Ieee) {
  const FormatSpec s = format_spec(f);
  const int bits = format_bits(f);
  const uint32_t xb = float_bits(x);
  const uint32_t sign = xb >> 31;
  const uint16_t sign_code = uint16_t(sign << (bits - 1));
  const int exponent_field_max = (1 << s.exponent_bits) - 1;
  if ((xb & 0x7F800000u) == 0x7F800000u && (xb & 0x007FFFFFu)) return format_nan(f, sign, xb);
  const uint16_t infinity_code = uint16_t(sign_code | (exponent_field_max << s.mantissa_bits));
  const uint16_t max_code = uint16_t(sign_code | ((s.has_infinity ? exponent_field_max - 1 : exponent_field_max)
                                                  << s.mantissa_bits) |
                                     ((1 << s.mantissa_bits) - 1 - (s.has_infinity ? 0 : 1)));
  const uint16_t overflow_code = overflow == Overflow::Saturate ? max_code
                                 : s.has_infinity               ? infinity_code
                                                                : format_nan(f, sign, xb);
  const double a = std::fabs(double(x));
  if (a == 0.0) return sign_code;
  if (std::isinf(a)) return overflow_code;
  // The quantum (distance between neighbours) at a's binade, or the subnormals' below the normals.
  const int min_exponent = 1 - s.bias;
  int exponent;
  std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1)
  exponent -= 1;             // a = 1.xxx * 2^exponent
  if (exponent < min_exponent) exponent = min_exponent;
  const int quantum_exponent = exponent - s.mantissa_bits;
  const double steps = std::ldexp(a, -quantum_exponent);  // exact: a has 24 significant bits
  double whole = std::floor(steps);
  const double fraction = steps - whole;
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(whole, 2.0) != 0.0)) whole += 1.0;
  const double rounded = std::ldexp(whole, quantum_exponent);
  if (rounded > format_max(f)) return overflow_code;
  if (rounded < format_min_normal(f)) return uint16_t(sign_code | uint16_t(whole));  // subnormal (or zero)
  int rounded_exponent;
  std::frexp(rounded, &rounded_exponent);
  rounded_exponent -= 1;
  const double mantissa = std::ldexp(rounded, s.mantissa_bits - rounded_exponent) - double(1 << s.mantissa_bits);
  return uint16_t(sign_code | ((rounded_exponent + s.bias) << s.mantissa_bits) | uint16_t(mantissa));
}

FF_HOST_DEVICE inline bool code_is_nan(NumberFormat f, uint16_t code) {
  const FormatSpec s = format_spec(f);
  const uint32_t exponent = (code >> s.mantissa_bits) & ((1u << s.exponent_bits) - 1);
  const uint32_t mantissa = code & ((1u << s.mantissa_bits) - 1);
  if (!s.has_infinity) return exponent == (1u << s.exponent_bits) - 1 && mantissa == (1u << s.mantissa_bits) - 1;
  return exponent == (1u << s.exponent_bits) - 1 && mantissa != 0;
}

FF_HOST_DEVICE inline float decode_code(NumberFormat f, uint16_t code) {
  const FormatSpec s = format_spec(f);
  const int bits = format_bits(f);
  const bool negative = (code >> (bits - 1)) & 1u;
  const int exponent = int((code >> s.mantissa_bits) & ((1u << s.exponent_bits) - 1));
  const int mantissa = int(code & ((1u << s.mantissa_bits) - 1));
  double value;
  if (code_is_nan(f, code)) {
    value = NAN;
  } else if (s.has_infinity && exponent == (1 << s.exponent_bits) - 1) {
    value = INFINITY;
  } else if (exponent == 0) {
    value = std::ldexp(double(mantissa), 1 - s.bias - s.mantissa_bits);
  } else {
    value = std::ldexp(double(mantissa + (1 << s.mantissa_bits)), exponent - s.bias - s.mantissa_bits);
  }
  return float(negative ? -value : value);
}

FF_HOST_DEVICE inline float float_from_bits(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// round_to_format's constants, spelled out (format_max() and friends compute them with ldexp, too slow
// to call per value): max, smallest normal, 2^(1 - bias - m + 23), and the fp32 mantissa bits dropped.
struct RoundingConstants {
  float max, min_normal, subnormal_shift;
  int dropped_bits;
  bool has_infinity;
};
FF_HOST_DEVICE inline RoundingConstants rounding_constants(NumberFormat f) {
  switch (f) {
    case NumberFormat::BF16: return {0x1.fep127f, 0x1p-126f, 0x1p-110f, 16, true};
    case NumberFormat::FP16: return {65504.0f, 0x1p-14f, 0x1p-1f, 13, true};
    case NumberFormat::E4M3: return {448.0f, 0x1p-6f, 0x1p14f, 20, false};
    default: return {57344.0f, 0x1p-14f, 0x1p7f, 21, true};
  }
}

// decode_code(f, encode_float(f, x, overflow)), the value x becomes, computed in fp32 alone: what the
// emulated products call for every operand, so it must be fast. Above the format's smallest normal,
// round the fp32 significand to m bits (add half a step minus one, plus the last kept bit: ties to
// even; a carry moves into the exponent as it should). Below it, the format's steps are a fixed
// 2^(1 - bias - m): adding 2^(1 - bias - m + 23) makes fp32's own rounding (to nearest even) round
// there, and subtracting it back is exact. test_float_formats checks it equals the codes' path.
FF_HOST_DEVICE inline float round_to_format(NumberFormat f, float x, Overflow overflow = Overflow::Ieee) {
  const RoundingConstants k = rounding_constants(f);
  const uint32_t bits = float_bits(x);
  const uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return x;  // NaN
  const float overflowed = overflow == Overflow::Saturate ? k.max : k.has_infinity ? INFINITY : NAN;
  if (magnitude == 0x7F800000u) return float_from_bits(sign | float_bits(overflowed));
  float rounded;
  const float a = float_from_bits(magnitude);
  if (a < k.min_normal) {
    volatile float sum = a + k.subnormal_shift;  // volatile: the compiler may not fold (a + shift) - shift into a
    rounded = sum - k.subnormal_shift;
  } else {
    uint32_t r = magnitude + (1u << (k.dropped_bits - 1)) - 1u + ((magnitude >> k.dropped_bits) & 1u);
    r &= ~((1u << k.dropped_bits) - 1u);
    rounded = float_from_bits(r);
  }
  if (rounded > k.max) rounded = overflowed;
  return float_from_bits(sign | float_bits(rounded));
}

// Host-side helpers (float_formats.cpp).
const char* format_name(NumberFormat f);                  // "bf16", "fp16", "e4m3", "e5m2"
bool parse_format(const char* name, NumberFormat* out);   // the inverse of format_name
