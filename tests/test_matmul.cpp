// test_matmul.cpp: sgemm_cpu (matmul_cpu.h) against a straightforward float64 reference.
// Covers all four transpose combinations on shapes that are and are not multiples of the kernel's
// blocking (1x1x1, 7x13x5, 67x33x129, 300x200x100, plus shapes that cross the K and N panel sizes),
// alpha/beta variants (beta = 0 must ignore a NaN-filled C, beta = 1 must accumulate), leading
// dimensions larger than the minimum (the padding must stay untouched), K = 0, and bit-identical
// repeated calls; sgemm_cpu_bias against the bias copied into C first, and sgemm_cpu_sum_a against
// sgemm_cpu and a separate pass of sums, bit for bit.
//
// Tolerance: atol = rtol = 1e-5 * sqrt(K) (times |alpha| for atol). Inputs are uniform in [-1, 1], so
// each output is a K-term fp32 sum of order sqrt(K); its rounding error grows like sqrt(K) too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/matmul_cpu.h"
#include "test_util.h"

namespace {

struct Case {
  bool trans_a, trans_b;
  int M, N, K;
  float alpha, beta;
  int lda_pad = 0, ldb_pad = 0, ldc_pad = 0;  // extra elements per row beyond the minimum
};

std::string describe(const Case& c) {
  return std::string("trans_a=") + (c.trans_a ? "1" : "0") + " trans_b=" + (c.trans_b ? "1" : "0") +
         " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) +
         " pads=" + std::to_string(c.lda_pad) + "," + std::to_string(c.ldb_pad) + "," + std::to_string(c.ldc_pad);
}

// Runs one case and compares every element of C, and checks that the padding of C is untouched.
void check_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  // Stored shapes: A is M x K (K x M when transposed), B is K x N (N x K when transposed).
  const int a_rows = c.trans_a ? c.K : c.M, a_cols = c.trans_a ? c.M : c.K;
  const int b_rows = c.trans_b ? c.N : c.K, b_cols = c.trans_b ? c.K : c.N;
  const int lda = a_cols + c.lda_pad, ldb = b_cols + c.ldb_pad, ldc = c.N + c.ldc_pad;
  const std::vector<float> A = random_vector(size_t(a_rows) * lda + 1, seed);
  const std::vector<float> B = random_vector(size_t(b_rows) * ldb + 1, seed + 1);

  // beta = 0 must not read C, so start from NaN there; otherwise from random values.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> C = c.beta == 0.0f ? std::vector<float>(size_t(c.M) * ldc, nan)
                                        : random_vector(size_t(c.M) * ldc, seed + 2);
  const float sentinel = 12345.0f;
  for (int i = 0; i < c.M; ++i)
    for (int j = c.N; j < ldc; ++j) C[size_t(i) * ldc + j] = sentinel;
  const std::vector<float> C0 = C;

  auto a = [&](int i, int k) { return double(c.trans_a ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]); };
  auto b = [&](int k, int j) { return double(c.trans_b ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j]); };
  std::vector<double> expected(size_t(c.M) * c.N);
  for (int i = 0; i < c.M; ++i) {
    for (int j = 0; j < c.N; ++j) {
      double sum = 0.0;
      for (int k = 0; k < c.K; ++k) sum += a(i, k) * b(k, j);
      double value = double(c.alpha) * sum;
      if (c.beta != 0.0f) value += double(c.beta) * C0[size_t(i) * ldc + j];
      expected[size_t(i) * c.N + j] = value;
    }
  }

  sgemm_cpu(c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);

  std::vector<float> actual(size_t(c.M) * c.N);
  bool padding_intact = true;
  for (int i = 0; i < c.M; ++i) {
    for (int j = 0; j < c.N; ++j) actual[size_t(i) * c.N + j] = C[size_t(i) * ldc + j];
    for (int j = c.N; j < ldc; ++j) padding_intact &= C[size_t(i) * ldc + j] == sentinel;
  }
  const double tolerance = 1e-5 * std::sqrt(double(std::max(c.K, 1)));
  EXPECT_TRUE(allclose(actual, expected, tolerance * std::max(1.0, double(std::fabs(c.alpha))), tolerance));
  EXPECT_TRUE(padding_intact) << "sgemm_cpu wrote outside the N columns of a row of C";
}

struct Shape { int M, N, K; };

// Odd sizes on purpose: none is a multiple of the micro-kernel's tile, and 67x33x129 / 300x200x100
// span several register tiles and (for 300) more than one row block. The next three cross the K
// slice (256) and the N panel (2048) of the blocking; the last the rows of op(A) = A^T packed at once
// (384) and the K slice.
const Shape kShapes[] = {{1, 1, 1}, {7, 13, 5}, {67, 33, 129}, {300, 200, 100},
                         {18, 32, 600}, {5, 2100, 3}, {13, 17, 257}, {389, 7, 260}};

TEST(SgemmCpu, AllTransposesAndShapesBetaZeroIgnoresNaN) {
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape& s : kShapes) check_case({ta, tb, s.M, s.N, s.K, 1.0f, 0.0f}, seed += 10);
}

TEST(SgemmCpu, BetaOneAccumulates) {
  uint64_t seed = 1000;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape& s : kShapes) check_case({ta, tb, s.M, s.N, s.K, 1.0f, 1.0f}, seed += 10);
}

TEST(SgemmCpu, AlphaAndBetaScale) {
  uint64_t seed = 2000;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({ta, tb, 67, 33, 129, 0.5f, 0.0f}, seed += 10);
      check_case({ta, tb, 67, 33, 129, -1.5f, 0.25f}, seed += 10);
      check_case({ta, tb, 7, 13, 5, 2.0f, -1.0f}, seed += 10);
      check_case({ta, tb, 18, 32, 600, 0.75f, 0.5f}, seed += 10);
      check_case({ta, tb, 19, 35, 400, 0.75f, 0.5f}, seed += 10);
    }
}

// The summation order is fixed by the shapes: each element is summed over k in increasing order, split
// at every 256 (KC) depths into parts that are merged, even where a product runs a deeper slice at once
// (op(A) = A with K up to 512). So a product of depth 400 equals, bit for bit, one of depth 256 followed
// by one of the other 144 accumulated onto it, for every transpose, alpha and beta, and with a bias.
TEST(SgemmCpu, DepthPastKCEqualsTwoProductsBitForBit) {
  struct Shape { int M, N, K; };
  const Shape shapes[] = {{19, 35, 400}, {13, 17, 300}, {96, 32, 512}};
  const float alpha_beta[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.75f, 0.5f}};
  uint64_t seed = 5000;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape& s : shapes) {
        SCOPED_TRACE("trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb) + " M=" + std::to_string(s.M) +
                     " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
        const int lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N, k1 = 256;
        const std::vector<float> A = random_vector(size_t(s.M) * s.K, seed++);
        const std::vector<float> B = random_vector(size_t(s.N) * s.K, seed++);
        const std::vector<float> C0 = random_vector(size_t(s.M) * s.N, seed++);
        const std::vector<float> bias = random_vector(size_t(s.N), seed++);
        // The second part of the depth: columns k1.. of op(A), rows k1.. of op(B).
        const float* A2 = ta ? A.data() + size_t(k1) * lda : A.data() + k1;
        const float* B2 = tb ? B.data() + k1 : B.data() + size_t(k1) * ldb;
        for (const auto& ab : alpha_beta) {
          std::vector<float> whole = C0, parts = C0;
          sgemm_cpu(ta, tb, s.M, s.N, s.K, ab[0], A.data(), lda, B.data(), ldb, ab[1], whole.data(), s.N);
          sgemm_cpu(ta, tb, s.M, s.N, k1, ab[0], A.data(), lda, B.data(), ldb, ab[1], parts.data(), s.N);
          sgemm_cpu(ta, tb, s.M, s.N, s.K - k1, ab[0], A2, lda, B2, ldb, 1.0f, parts.data(), s.N);
          EXPECT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)))
              << "alpha=" << ab[0] << " beta=" << ab[1];
        }
        std::vector<float> whole(size_t(s.M) * s.N), parts(size_t(s.M) * s.N);
        sgemm_cpu_bias(ta, tb, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, bias.data(), whole.data(), s.N);
        sgemm_cpu_bias(ta, tb, s.M, s.N, k1, A.data(), lda, B.data(), ldb, bias.data(), parts.data(), s.N);
        sgemm_cpu(ta, tb, s.M, s.N, s.K - k1, 1.0f, A2, lda, B2, ldb, 1.0f, parts.data(), s.N);
        EXPECT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float))) << "with a bias";
      }
}

TEST(SgemmCpu, LeadingDimensionsLargerThanRows) {
  uint64_t seed = 3000;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({ta, tb, 7, 13, 5, 1.0f, 0.0f, 3, 5, 7}, seed += 10);
      check_case({ta, tb, 67, 33, 129, 1.0f, 1.0f, 1, 9, 4}, seed += 10);
      check_case({ta, tb, 300, 200, 100, 0.5f, 0.5f, 16, 3, 11}, seed += 10);
    }
}

// K = 0 (and alpha = 0) leave only beta * C; beta = 0 then writes zeros even over NaN.
TEST(SgemmCpu, NothingToMultiplyScalesC) {
  check_case({false, false, 5, 6, 0, 1.0f, 0.0f, 0, 0, 2}, 4000);
  check_case({false, true, 5, 6, 0, 1.0f, 2.0f, 0, 0, 2}, 4010);
  check_case({true, false, 5, 6, 4, 0.0f, 0.5f, 0, 0, 2}, 4020);
}

// The summation order depends only on the shapes, so the same call gives bit-identical results,
// whatever C held before (beta = 0) and whatever buffers the previous call left behind.
TEST(SgemmCpu, RepeatedCallsAreBitIdentical) {
  const int M = 67, N = 45, K = 300;
  const std::vector<float> A = random_vector(size_t(M) * K, 5000), B = random_vector(size_t(N) * K, 5001);
  std::vector<float> first(size_t(M) * N, 0.0f), second(size_t(M) * N, 7.0f);
  sgemm_cpu(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, first.data(), N);
  std::vector<float> other(size_t(300) * 200);  // a different shape in between
  sgemm_cpu(true, false, 300, 200, 100, 1.0f, random_vector(size_t(100) * 300, 5002).data(), 300,
            random_vector(size_t(100) * 200, 5003).data(), 200, 0.0f, other.data(), 200);
  sgemm_cpu(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, second.data(), N);
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
}

// sgemm_cpu_bias (a linear layer's forward) starts each output from its bias inside the kernel: it must
// give, bit for bit, what copying the bias into every row and accumulating with beta = 1 gives, on full
// and edge tiles, both transposes, and K deeper than one packed slice (the bias enters once).
TEST(SgemmCpu, BiasInsideEqualsBiasCopiedFirst) {
  struct Shape { bool trans_a, trans_b; int M, N, K; };
  const Shape shapes[] = {{false, true, 67, 45, 33}, {false, true, 96, 32, 300}, {true, false, 13, 37, 20},
                          {false, false, 7, 16, 5}, {false, true, 1, 1, 1}};
  uint64_t seed = 6000;
  for (const Shape& s : shapes) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    const int lda = s.trans_a ? s.M : s.K, ldb = s.trans_b ? s.K : s.N;
    const std::vector<float> A = random_vector(size_t(s.M) * s.K, seed++), B = random_vector(size_t(s.K) * s.N, seed++);
    const std::vector<float> bias = random_vector(size_t(s.N), seed++);
    std::vector<float> copied(size_t(s.M) * s.N);
    for (int i = 0; i < s.M; ++i) std::copy(bias.begin(), bias.end(), copied.begin() + size_t(i) * s.N);
    sgemm_cpu(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, copied.data(), s.N);
    std::vector<float> inside(size_t(s.M) * s.N, std::numeric_limits<float>::quiet_NaN());  // never read
    sgemm_cpu_bias(s.trans_a, s.trans_b, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, bias.data(), inside.data(), s.N);
    EXPECT_EQ(0, std::memcmp(copied.data(), inside.data(), copied.size() * sizeof(float)));
  }
}

// sgemm_cpu_sum_a (a linear layer's weight gradient with its bias's) adds op(A)'s row sums while it packs
// A: the product must equal sgemm_cpu's and the sums a separate pass over A's rows, both bit for bit,
// onto sums that already hold values (a bias gradient accumulates), with A's rows wider than M (lda >
// M), on shapes past one row panel (MC = 96), one depth slice (KC = 256), one column panel (NC =
// 2048, where A is packed again and must not be summed twice) and the rows of A packed at once (384),
// and with nothing to multiply (N = 0).
TEST(SgemmCpu, SumsOfAWhilePackingEqualASeparatePass) {
  struct Shape { bool trans_b; int M, N, K, lda_pad; };
  const Shape shapes[] = {{false, 13, 37, 20, 0}, {false, 100, 40, 300, 3}, {true, 7, 2100, 9, 0},
                          {false, 1, 1, 1, 0},    {false, 5, 0, 6, 0},    {false, 400, 24, 260, 2}};
  uint64_t seed = 7000;
  for (const Shape& s : shapes) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    const int lda = s.M + s.lda_pad, ldb = s.trans_b ? s.K : s.N;
    const std::vector<float> A = random_vector(size_t(s.K) * lda, seed++);
    const std::vector<float> B = random_vector(size_t(s.K) * std::max(s.N, 1), seed++);
    const std::vector<float> C0 = random_vector(size_t(s.M) * std::max(s.N, 1), seed++);
    const std::vector<float> sums0 = random_vector(size_t(s.M), seed++);
    std::vector<float> C_apart = C0, sums_apart = sums0;
    sgemm_cpu(true, s.trans_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, C_apart.data(), s.N);
    for (int k = 0; k < s.K; ++k)
      for (int i = 0; i < s.M; ++i) sums_apart[i] += A[size_t(k) * lda + i];
    std::vector<float> C_packed = C0, sums_packed = sums0;
    sgemm_cpu_sum_a(s.trans_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, C_packed.data(), s.N,
                    sums_packed.data());
    EXPECT_EQ(0, std::memcmp(C_apart.data(), C_packed.data(), C_apart.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(sums_apart.data(), sums_packed.data(), sums_apart.size() * sizeof(float)));
  }
}

}  // namespace
