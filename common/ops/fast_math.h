// fast_math.h: tanh and exp for the CPU ops' inner loops, as plain arithmetic that GCC vectorizes.
// A libm call per element (std::exp, std::tanh, and even std::fmin/std::fmax without -ffast-math)
// stops a loop from vectorizing and costs a call through the PLT each time; these inline functions
// use only multiply-adds, one division or one bit manipulation, and comparisons that compile to
// vminps/vmaxps/blends. Their accuracy against libm is tested in tests/test_ops.cpp (FastMath.*).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace cpu {

// tanh as a rational function of x (odd degree-13 numerator over even degree-6 denominator, the
// minimax fit Eigen uses), accurate to a few float ulps on [-7.9, 7.9] and exactly +-1 in float
// beyond. The clamp is written as comparisons: a NaN input stays NaN (std::fmin would clamp it).
inline float fast_tanh(float x) {
  constexpr float kClamp = 7.90531110763549805f;
  x = x < -kClamp ? -kClamp : x;
  x = x > kClamp ? kClamp : x;
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return x * p / q;
}

// exp(x) = 2^n exp(r): n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2], with ln 2 split in two
// parts so that n ln 2 is subtracted exactly (Cody and Waite); exp(r) by the polynomial of Cephes'
// expf (relative error about 1e-7 on that interval); 2^n built in the exponent bits. Within 2 ulps of
// libm's expf for x in [-87, 88]. Below -87 it returns 0 where expf returns at most 1.6e-38 (nothing a
// softmax sum can see); above 88 it returns +inf (expf overflows at 88.72); NaN stays NaN.
inline float fast_exp(float x) {
  constexpr float kMaxArg = 88.0f, kMinArg = -87.0f;  // n stays in [-126, 127]: a normal 2^n
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float clamped = x < kMinArg ? kMinArg : (x > kMaxArg ? kMaxArg : x);
  const float n = (clamped * kLog2e + kRound) - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float exp_r = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof bits);
  float result = exp_r * two_n;
  result = x < kMinArg ? 0.0f : result;
  result = x > kMaxArg ? std::numeric_limits<float>::infinity() : result;
  return x != x ? x : result;
}

}  // namespace cpu
