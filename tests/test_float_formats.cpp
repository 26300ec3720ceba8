// test_float_formats.cpp: bf16, fp16, E4M3 and E5M2 (float_formats.h) against a reference written
// apart from them, over every code of every format and every rounding boundary.
//
// The reference: each format's fields are written out here by hand (the OCP 8-bit specification's
// table for E4M3 and E5M2, IEEE 754's for binary16, bfloat16 as fp32's top half). A code decodes by
// the formula (-1)^s * 2^(e - bias) * 1.m (0.m * 2^(1 - bias) when e = 0), with pow(), and E4M3's
// S.1111.111 as its only NaN. A value encodes by search: the nearest among all finite codes, sorted
// by value, a tie going to the code whose last bit is 0 (ties to even); one more point above the
// largest finite value, at the next step (max + its ulp), stands for overflow (its code's parity as
// if the format went on), so that "round as if the exponent were unbounded, then overflow" is decided
// by the same search.
//
// Coverage: every code of every format decodes as the formula says and encodes back to itself
// (65536 + 65536 + 256 + 256 codes). Around every gap between neighbouring values (both signs), the
// value itself, the midpoint (exactly a tie), the fp32 values just below and above the midpoint, and
// a random fp32 inside the gap encode as the search says, in both overflow modes; so do 2^18 random
// fp32 bit patterns (NaNs, infinities and subnormals among them). On a GPU, the kernels of
// float_formats_cuda.cu give the host's codes for all of these, and NVIDIA's intrinsics agree with
// them (skipped without a GPU: "no CUDA device: <why>").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/bf16.h"  // float_to_bf16: the GPU path's bf16, which ours must equal
#include "ops/device.h"
#include "ops/float_formats.h"
#include "ops/float_formats_cuda.h"
#include "test_util.h"

namespace {

const NumberFormat kFormats[] = {NumberFormat::BF16, NumberFormat::FP16, NumberFormat::E4M3, NumberFormat::E5M2};

// The fields, written out from the specifications (not from format_spec()).
struct Fields {
  int exponent_bits, mantissa_bits, bias;
  bool ieee_specials;  // all-ones exponent: infinities and NaNs; false: E4M3, only S.1111.111 is NaN
  double max, min_subnormal;
};

Fields fields_of(NumberFormat f) {
  switch (f) {
    case NumberFormat::BF16: return {8, 7, 127, true, 3.3895313892515355e38, std::pow(2.0, -133)};
    case NumberFormat::FP16: return {5, 10, 15, true, 65504.0, std::pow(2.0, -24)};
    case NumberFormat::E4M3: return {4, 3, 7, false, 448.0, std::pow(2.0, -9)};
    default: return {5, 2, 15, true, 57344.0, std::pow(2.0, -16)};
  }
}

int code_count(NumberFormat f) {
  const Fields d = fields_of(f);
  return 1 << (1 + d.exponent_bits + d.mantissa_bits);
}

double reference_decode(NumberFormat f, uint32_t code) {
  const Fields d = fields_of(f);
  const uint32_t sign = code >> (d.exponent_bits + d.mantissa_bits);
  const uint32_t e = (code >> d.mantissa_bits) & ((1u << d.exponent_bits) - 1);
  const uint32_t m = code & ((1u << d.mantissa_bits) - 1);
  const uint32_t e_top = (1u << d.exponent_bits) - 1, m_top = (1u << d.mantissa_bits) - 1;
  const double s = sign ? -1.0 : 1.0;
  if (d.ieee_specials && e == e_top) return m == 0 ? s * HUGE_VAL : NAN;
  if (!d.ieee_specials && e == e_top && m == m_top) return NAN;
  const double fraction = double(m) / std::pow(2.0, d.mantissa_bits);
  if (e == 0) return s * fraction * std::pow(2.0, 1 - d.bias);
  return s * (1.0 + fraction) * std::pow(2.0, int(e) - d.bias);
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;  // also tells -0 from +0
}

float from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// The search: every non-negative finite value with its code, sorted, and the overflow point after it.
struct Ladder {
  std::vector<double> values;
  std::vector<uint32_t> codes;
  double overflow_point;
  uint32_t overflow_code_parity;
};

Ladder ladder_of(NumberFormat f) {
  Ladder l;
  const uint32_t sign_bit = uint32_t(code_count(f)) / 2;
  for (uint32_t c = 0; c < sign_bit; c++) {
    const double v = reference_decode(f, c);
    if (std::isfinite(v)) {
      l.values.push_back(v);
      l.codes.push_back(c);
    }
  }
  // Codes grow with their value among non-negative finite codes; check rather than assume.
  for (size_t i = 1; i < l.values.size(); i++) EXPECT_LT(l.values[i - 1], l.values[i]) << format_name(f);
  const size_t n = l.values.size();
  l.overflow_point = l.values[n - 1] + (l.values[n - 1] - l.values[n - 2]);
  l.overflow_code_parity = (l.codes[n - 1] + 1) & 1u;
  return l;
}

// The code the specification asks for: nearest, ties to even, overflow by the mode.
uint32_t reference_encode(NumberFormat f, const Ladder& l, float x, Overflow overflow) {
  const Fields d = fields_of(f);
  const uint32_t sign_code = std::signbit(x) ? uint32_t(code_count(f)) / 2 : 0;
  const uint32_t e_top = (1u << d.exponent_bits) - 1;
  const uint32_t max_code = l.codes.back();
  const uint32_t overflowed = overflow == Overflow::Saturate ? max_code
                              : d.ieee_specials              ? e_top << d.mantissa_bits                   // infinity
                                                             : (e_top << d.mantissa_bits) | ((1u << d.mantissa_bits) - 1);  // NaN
  const double a = std::fabs(double(x));
  if (std::isinf(a)) return sign_code | overflowed;
  auto above = std::lower_bound(l.values.begin(), l.values.end(), a);
  if (above == l.values.end()) {  // beyond max: the nearer of max and the overflow point
    const double below = l.values.back();
    const bool up = a - below > l.overflow_point - a ||
                    (a - below == l.overflow_point - a && l.overflow_code_parity == 0);
    return sign_code | (up ? overflowed : max_code);
  }
  const size_t i = size_t(above - l.values.begin());
  if (*above == a || i == 0) return sign_code | l.codes[i];
  const double lo = l.values[i - 1], hi = l.values[i];
  const bool up = a - lo > hi - a || (a - lo == hi - a && (l.codes[i] & 1u) == 0);
  return sign_code | (up ? l.codes[i] : l.codes[i - 1]);
}

// The fp32 inputs around every gap of the ladder, both signs, and random bit patterns.
std::vector<float> boundary_inputs(const Ladder& l, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> points = l.values;
  points.push_back(l.overflow_point);
  std::vector<float> inputs;
  for (size_t i = 0; i + 1 < points.size(); i++) {
    const double lo = points[i], hi = points[i + 1];
    const double mid = 0.5 * (lo + hi);
    const float mid32 = float(mid);
    if (double(mid32) != mid) continue;  // never for these formats: a midpoint needs one bit more than fp32 has
    const float candidates[] = {float(lo), mid32, std::nextafter(mid32, 0.0f), std::nextafter(mid32, HUGE_VALF),
                                float(lo + (hi - lo) * rng.uniform())};
    for (float c : candidates) {
      if (!std::isfinite(c)) continue;
      inputs.push_back(c);
      inputs.push_back(-c);
    }
  }
  for (int i = 0; i < 1 << 16; i++) inputs.push_back(from_bits(uint32_t(rng.next_u64())));
  inputs.push_back(HUGE_VALF);
  inputs.push_back(-HUGE_VALF);
  return inputs;
}

TEST(FloatFormats, ShapesAreTheSpecifications) {
  for (NumberFormat f : kFormats) {
    const Fields d = fields_of(f);
    EXPECT_EQ(format_max(f), d.max) << format_name(f);
    EXPECT_EQ(format_min_subnormal(f), d.min_subnormal) << format_name(f);
    EXPECT_EQ(format_bits(f), 1 + d.exponent_bits + d.mantissa_bits) << format_name(f);
    const RoundingConstants k = rounding_constants(f);
    EXPECT_EQ(double(k.max), d.max) << format_name(f);
    EXPECT_EQ(double(k.min_normal), std::pow(2.0, 1 - d.bias)) << format_name(f);
    EXPECT_EQ(double(k.subnormal_shift), std::pow(2.0, 1 - d.bias - d.mantissa_bits + 23)) << format_name(f);
    EXPECT_EQ(k.dropped_bits, 23 - d.mantissa_bits) << format_name(f);
  }
}

TEST(FloatFormats, EveryCodeDecodesByTheFormulaAndEncodesBack) {
  for (NumberFormat f : kFormats) {
    int nans = 0, infinities = 0, subnormals = 0;
    for (int c = 0; c < code_count(f); c++) {
      const double expected = reference_decode(f, uint32_t(c));
      const float decoded = decode_code(f, uint16_t(c));
      ASSERT_TRUE(same_float(decoded, float(expected)))
          << format_name(f) << " code 0x" << std::hex << c << ": " << decoded << " vs " << expected;
      ASSERT_EQ(code_is_nan(f, uint16_t(c)), std::isnan(expected)) << format_name(f) << " code " << c;
      if (std::isnan(expected)) {
        nans++;
        continue;
      }
      if (std::isinf(expected)) infinities++;
      if (expected != 0 && std::fabs(expected) < format_min_normal(f)) subnormals++;
      ASSERT_EQ(encode_float(f, decoded), c) << format_name(f) << " code 0x" << std::hex << c;
    }
    const Fields d = fields_of(f);
    // E4M3: one NaN per sign, no infinity; the others: every non-zero mantissa under the top exponent.
    EXPECT_EQ(nans, d.ieee_specials ? 2 * ((1 << d.mantissa_bits) - 1) : 2) << format_name(f);
    EXPECT_EQ(infinities, d.ieee_specials ? 2 : 0) << format_name(f);
    EXPECT_EQ(subnormals, 2 * ((1 << d.mantissa_bits) - 1)) << format_name(f);
  }
}

TEST(FloatFormats, EveryRoundingBoundaryRoundsToNearestEven) {
  for (NumberFormat f : kFormats) {
    const Ladder l = ladder_of(f);
    const std::vector<float> inputs = boundary_inputs(l, 7 + int(f));
    int checked = 0;
    for (Overflow overflow : {Overflow::Ieee, Overflow::Saturate}) {
      for (float x : inputs) {
        const uint16_t code = encode_float(f, x, overflow);
        if (std::isnan(x)) {
          ASSERT_TRUE(code_is_nan(f, code)) << format_name(f) << " NaN in, 0x" << std::hex << code << " out";
          continue;
        }
        const uint32_t expected = reference_encode(f, l, x, overflow);
        ASSERT_EQ(code, expected) << format_name(f) << (overflow == Overflow::Saturate ? " saturating" : "")
                                  << ": " << std::hexfloat << x << " gives 0x" << std::hex << code << ", not 0x"
                                  << expected;
        checked++;
      }
    }
    EXPECT_GT(checked, 4 * int(l.values.size())) << format_name(f);
  }
}

// round_to_format, the fast path the emulated products use, is the value of the code, everywhere.
TEST(FloatFormats, RoundToFormatIsTheCodesValue) {
  for (NumberFormat f : kFormats) {
    for (float x : boundary_inputs(ladder_of(f), 17)) {
      for (Overflow overflow : {Overflow::Ieee, Overflow::Saturate}) {
        ASSERT_TRUE(same_float(round_to_format(f, x, overflow), decode_code(f, encode_float(f, x, overflow))))
            << format_name(f) << " " << std::hexfloat << x << ": " << round_to_format(f, x, overflow);
      }
    }
  }
}

TEST(FloatFormats, SpecialValuesAsTheSpecificationSays) {
  // E4M3: 464 is the tie between 448 (mantissa 110) and the 480 it does not have: even wins, 448.
  EXPECT_EQ(encode_float(NumberFormat::E4M3, 464.0f), 0x7E);
  EXPECT_EQ(encode_float(NumberFormat::E4M3, 464.01f), 0x7F);  // NaN: no infinity to overflow to
  EXPECT_EQ(encode_float(NumberFormat::E4M3, 1e9f, Overflow::Saturate), 0x7E);
  EXPECT_EQ(encode_float(NumberFormat::E4M3, -HUGE_VALF, Overflow::Saturate), 0xFE);
  EXPECT_EQ(encode_float(NumberFormat::E5M2, 61440.0f), 0x7C);  // the tie above 57344 goes to infinity
  EXPECT_EQ(encode_float(NumberFormat::E5M2, 61439.0f), 0x7B);
  EXPECT_EQ(encode_float(NumberFormat::E5M2, HUGE_VALF, Overflow::Saturate), 0x7B);
  EXPECT_EQ(encode_float(NumberFormat::FP16, 65520.0f), 0x7C00);
  EXPECT_EQ(encode_float(NumberFormat::E4M3, std::ldexp(1.0f, -10)), 0x00);  // half the smallest: even, 0
  EXPECT_EQ(encode_float(NumberFormat::E4M3, std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(encode_float(NumberFormat::E4M3, -0.0f), 0x80);
}

TEST(FloatFormats, Bf16EqualsTheGpuPathsBf16) {
  Rng rng(3);
  for (int i = 0; i < 1 << 18; i++) {
    const float x = from_bits(uint32_t(rng.next_u64()));
    ASSERT_EQ(encode_float(NumberFormat::BF16, x), float_to_bf16(x)) << std::hexfloat << x;
  }
}

#ifdef GPT_WITH_CUDA
class FloatFormatsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

TEST_F(FloatFormatsCuda, KernelsGiveTheHostsCodesAndAgreeWithNvidia) {
  for (NumberFormat f : kFormats) {
    std::vector<uint16_t> all_codes(code_count(f));
    for (size_t c = 0; c < all_codes.size(); c++) all_codes[c] = uint16_t(c);
    std::vector<float> decoded(all_codes.size());
    decode_on_gpu(f, all_codes.data(), decoded.data(), all_codes.size());
    for (size_t c = 0; c < all_codes.size(); c++) {
      ASSERT_TRUE(same_float(decoded[c], decode_code(f, all_codes[c]))) << format_name(f) << " code " << c;
    }
    const std::vector<float> inputs = boundary_inputs(ladder_of(f), 11);
    for (Overflow overflow : {Overflow::Ieee, Overflow::Saturate}) {
      std::vector<uint16_t> ours(inputs.size()), nvidia(inputs.size());
      encode_on_gpu(f, overflow, inputs.data(), ours.data(), inputs.size());
      encode_with_cuda_intrinsics(f, overflow, inputs.data(), nvidia.data(), inputs.size());
      const bool nvidia_comparable = overflow == Overflow::Ieee || f == NumberFormat::E4M3 || f == NumberFormat::E5M2;
      for (size_t i = 0; i < inputs.size(); i++) {
        ASSERT_EQ(ours[i], encode_float(f, inputs[i], overflow)) << format_name(f) << " " << std::hexfloat << inputs[i];
        if (!nvidia_comparable) continue;
        if (std::isnan(inputs[i]) || code_is_nan(f, ours[i])) {  // NaN payloads and signs differ by design
          EXPECT_TRUE(code_is_nan(f, nvidia[i])) << format_name(f) << " " << std::hexfloat << inputs[i];
        } else {
          ASSERT_EQ(ours[i], nvidia[i]) << format_name(f) << " " << std::hexfloat << inputs[i];
        }
      }
    }
  }
}
#endif

}  // namespace
