// test_matmul_emulation.cpp: low-precision matrix products as the hardware computes them
// (quantize.h, matmul_emulation.h, precision_recipe.h), against straightforward references.
//   - Scaled quantization: each group's scale is the largest power of two that keeps its amax within
//     the format's max; the groups (per tensor, per row, 1 x 128 tiles, 128 x 128 blocks) are
//     independent; underflows and overflows are counted.
//   - emulated_product with fp32 accumulation: within the fp32 summation bound of the exact (float64)
//     sum of the exact products, |C - exact| <= K * 2^-24 * sum |a_k b_k|.
//   - the 14-bit tensor-core accumulator, with and without DeepSeek's promotion every 128 products:
//     bit for bit a reference written here from frexp/ldexp; promotion is closer to the exact sum.
//   - the model's three products through ops.h with a recipe installed: the forward is each output
//     rounded once to bf16 from the float64 sum of the rounded inputs (plus the bias); the input
//     gradient is rounded to the layer's dtype, the weight gradient is not; delayed scaling takes its
//     scale from the reduced amax history, an expert's from its own group's reduction; a scope of
//     fp32 products (a MoE router's) skips the recipe on its thread; two threads' products at once
//     (dualpipev's pairs) equal one thread's.
//   - on a GPU (skipped without one): cuBLASLt's bf16, fp16 and fp8 products of the same codes equal
//     the emulation's within the fp32 summation bound (fp8 where the GPU has fp8 tensor cores); a
//     recipe's layer on the device (bf16, fp16 with a gradient scale, fp8 current, delayed and none)
//     equals the same recipe's CPU emulation: the same counts and scales,
//     the outputs within one ulp of the layer's dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "ops/device.h"  // cuda_device_count, transfer
#include "ops/memory.h"  // Buffer: the device copies of the GPU test
#include "ops/float_formats.h"
#include "ops/matmul_cublaslt.h"
#include "ops/matmul_emulation.h"
#include "ops/ops.h"
#include "training/precision_recipe.h"
#include "ops/quantize.h"
#include "test_util.h"

namespace {

TEST(Quantize, PowerOfTwoScaleKeepsTheAmaxWithinTheFormat) {
  for (NumberFormat f : {NumberFormat::E4M3, NumberFormat::E5M2, NumberFormat::FP16}) {
    for (float amax : {1e-6f, 3e-3f, 0.7f, 1.0f, 448.0f, 5e4f}) {
      const double s = power_of_two_scale(f, amax);
      EXPECT_EQ(std::exp2(std::round(std::log2(s))), s);  // a power of two
      EXPECT_LE(amax * s, format_max(f));
      EXPECT_GT(2 * amax * s, format_max(f));  // and the largest such
    }
  }
  EXPECT_EQ(power_of_two_scale(NumberFormat::E4M3, 0.0f), 1.0f);
  EXPECT_EQ(power_of_two_scale(NumberFormat::E4M3, INFINITY), 1.0f);
}

TEST(Quantize, EachGroupHasItsOwnScale) {
  // 4 x 256, one huge value in row 0's first 128 columns: only that tile (1 x 128) loses its small values.
  const int rows = 4, cols = 256;
  std::vector<float> m = random_vector(size_t(rows) * cols, 5, -1e-3f, 1e-3f);
  m[3] = 300.0f;
  for (auto [tiling, untouched_first] : {std::pair<Tiling, int>{Tiling{1, 128}, 128}, {Tiling{1, 0}, 256}}) {
    std::vector<float> q(m.size());
    QuantCounts counts;
    quantize_matrix(q.data(), m.data(), rows, cols, false, tiling, NumberFormat::E4M3, Overflow::Saturate, 0, &counts);
    for (int i = 0; i < rows * cols; i++) {
      const int r = i / cols, c = i % cols;
      const bool with_the_big_value = r == 0 && c < untouched_first;
      const float amax = with_the_big_value ? 300.0f : [&] {
        float a = 0;
        const int c0 = tiling.along ? c / tiling.along * tiling.along : 0, c1 = tiling.along ? c0 + tiling.along : cols;
        for (int k = c0; k < c1; k++) a = std::max(a, std::fabs(m[r * cols + k]));
        return a;
      }();
      const float s = power_of_two_scale(NumberFormat::E4M3, amax);
      ASSERT_EQ(q[i], round_to_format(NumberFormat::E4M3, m[i] * s, Overflow::Saturate) / s) << i;
    }
    EXPECT_EQ(counts.values, rows * cols);
    EXPECT_GT(counts.underflow, 0);  // the big value's group: 1e-3 * 2^0 is below E4M3's 2^-9 ... partly
    EXPECT_EQ(counts.overflow, 0);
  }
  // The same tiles seen with the contraction down the columns: transposing the matrix and the flag
  // gives the transposed result.
  std::vector<float> t(m.size()), qt(m.size()), q(m.size());
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) t[c * rows + r] = m[r * cols + c];
  quantize_matrix(q.data(), m.data(), rows, cols, false, Tiling{1, 128}, NumberFormat::E4M3, Overflow::Saturate, 0, nullptr);
  quantize_matrix(qt.data(), t.data(), cols, rows, true, Tiling{1, 128}, NumberFormat::E4M3, Overflow::Saturate, 0, nullptr);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) ASSERT_EQ(qt[c * rows + r], q[r * cols + c]);
}

TEST(Quantize, UnscaledFp8UnderflowsAndOverflowsAreCounted) {
  std::vector<float> m = {1e-4f, -2e-3f, 0.5f, 1000.0f, 0.0f, -1e6f};
  QuantCounts counts;
  quantize_matrix(m.data(), m.data(), 1, 6, false, Tiling{}, NumberFormat::E4M3, Overflow::Saturate, 1.0f, &counts);
  EXPECT_EQ(counts.nonzero, 5);
  EXPECT_EQ(counts.underflow, 1);  // 1e-4 < 2^-10 (half E4M3's smallest subnormal); 2e-3 rounds to 2^-9
  EXPECT_EQ(counts.overflow, 2);
  EXPECT_EQ(m[3], 448.0f);
  EXPECT_EQ(m[5], -448.0f);
}

// A (M,K), B (N,K) already in a format (so that products are exact), of one sign for the long sums.
std::vector<float> in_format(size_t n, uint64_t seed, float lo, float hi, NumberFormat f) {
  std::vector<float> v = random_vector(n, seed, lo, hi);
  for (float& x : v) x = round_to_format(f, x);
  return v;
}

TEST(EmulatedProduct, Fp32AccumulationIsWithinTheSummationBound) {
  const int M = 7, N = 5, K = 300;
  const auto A = in_format(size_t(M) * K, 1, -2, 2, NumberFormat::E4M3);
  const auto B = in_format(size_t(N) * K, 2, -2, 2, NumberFormat::BF16);
  std::vector<float> C(size_t(M) * N);
  emulated_product(C.data(), A.data(), B.data(), M, N, K, Accumulate::Fp32);
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double exact = 0, magnitude = 0;
      for (int k = 0; k < K; k++) {
        exact += double(A[i * K + k]) * B[j * K + k];
        magnitude += std::fabs(double(A[i * K + k]) * B[j * K + k]);
      }
      EXPECT_LE(std::fabs(C[i * N + j] - exact), K * std::ldexp(1.0, -24) * magnitude) << i << "," << j;
    }
  }
}

// The 14-bit accumulator, written apart from the code under test: frexp's fraction cut to 14 bits.
double cut_to_14_bits(double x) {
  int e;
  const double f = std::frexp(x, &e);  // x = f * 2^e, |f| in [0.5, 1)
  return std::ldexp(std::trunc(std::ldexp(f, 14)), e - 14);
}

float reference_limited(const float* a, const float* b, int K, int interval) {
  float total = 0;
  for (int k0 = 0; k0 < K; k0 += interval) {
    float partial = 0;
    for (int k = k0; k < std::min(K, k0 + interval); k++) partial = float(cut_to_14_bits(double(partial + a[k] * b[k])));
    total += partial;
  }
  return total;
}

TEST(EmulatedProduct, TensorCoreAccumulatorAndPromotionAreAsDescribed) {
  const int M = 3, N = 4, K = 4096;
  const auto A = in_format(size_t(M) * K, 3, 0.5f, 1.5f, NumberFormat::E4M3);
  const auto B = in_format(size_t(N) * K, 4, 0.5f, 1.5f, NumberFormat::E4M3);
  std::vector<float> limited(size_t(M) * N), promoted(size_t(M) * N);
  emulated_product(limited.data(), A.data(), B.data(), M, N, K, Accumulate::TensorCore);
  emulated_product(promoted.data(), A.data(), B.data(), M, N, K, Accumulate::Promote128);
  double worst_limited = 0, worst_promoted = 0;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      ASSERT_EQ(limited[i * N + j], reference_limited(&A[i * K], &B[j * K], K, K));
      ASSERT_EQ(promoted[i * N + j], reference_limited(&A[i * K], &B[j * K], K, kPromoteInterval));
      double exact = 0;
      for (int k = 0; k < K; k++) exact += double(A[i * K + k]) * B[j * K + k];
      worst_limited = std::max(worst_limited, std::fabs(limited[i * N + j] - exact) / exact);
      worst_promoted = std::max(worst_promoted, std::fabs(promoted[i * N + j] - exact) / exact);
    }
  }
  // Each cut loses up to 2^-13 of the running sum; over 4096 terms of one sign that adds up (DeepSeek-V3
  // measured ~2% at K = 4096 on H800); 128 terms per partial sum lose 32 times fewer.
  EXPECT_GT(worst_limited, 1e-3);
  EXPECT_LT(worst_promoted, worst_limited / 4);
}

// The model's products through ops.h, with a recipe installed for the test's lifetime.
struct Installed {
  LowPrecisionMatmuls emulation;
  Installed(const PrecisionRecipe& r, const float* params, const float* grads,
            std::function<void(std::vector<float>&)> reduce = [](std::vector<float>&) {})
      : emulation(r, params, grads, std::move(reduce)) {
    set_cpu_matmul_emulation(&emulation);
  }
  ~Installed() { set_cpu_matmul_emulation(nullptr); }
};

TEST(LowPrecisionMatmuls, Bf16ProductsRoundInputsOnceAndOutputsOnce) {
  const int N = 6, C = 40, OC = 9;
  std::vector<float> x = random_vector(size_t(N) * C, 11), w = random_vector(size_t(OC) * C, 12), bias = random_vector(OC, 13);
  std::vector<float> dw(w.size(), 0.25f), dx(x.size(), 0.5f), dout = random_vector(size_t(N) * OC, 14), dbias(OC, 0);
  std::vector<float> out(size_t(N) * OC);
  PrecisionRecipe recipe;
  recipe.precision = Precision::BF16;
  {
    Installed installed(recipe, w.data(), dw.data());
    matmul_forward(make_view(out.data(), {N, OC}), make_view(x.data(), {N, C}), make_view(w.data(), {OC, C}),
                   make_view(bias.data(), {OC}));
    matmul_backward(make_view(dx.data(), {N, C}), make_view(dw.data(), {OC, C}), make_view(dbias.data(), {OC}),
                    make_view(dout.data(), {N, OC}), make_view(x.data(), {N, C}), make_view(w.data(), {OC, C}));
  }
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      double exact = bias[o];
      for (int c = 0; c < C; c++) exact += double(round_to_format(NumberFormat::BF16, x[n * C + c])) * round_to_format(NumberFormat::BF16, w[o * C + c]);
      // fp32 accumulation then one bf16 rounding: within half a bf16 ulp of the exact, plus the fp32 sum's error
      EXPECT_NEAR(out[n * OC + o], exact, std::ldexp(std::fabs(exact), -8) + 1e-5) << n << "," << o;
      EXPECT_EQ(out[n * OC + o], round_to_format(NumberFormat::BF16, out[n * OC + o]));  // stored in bf16
    }
  }
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      double exact = 0;
      for (int o = 0; o < OC; o++) exact += double(round_to_format(NumberFormat::BF16, dout[n * OC + o])) * round_to_format(NumberFormat::BF16, w[o * C + c]);
      EXPECT_NEAR(dx[n * C + c] - 0.5, exact, std::ldexp(std::fabs(exact), -8) + 1e-5);
      EXPECT_EQ(float(dx[n * C + c] - 0.5f), round_to_format(NumberFormat::BF16, float(dx[n * C + c] - 0.5f)));
    }
  }
  bool any_not_bf16 = false;  // the weight gradient is fp32: not rounded to bf16
  for (int o = 0; o < OC; o++) {
    for (int c = 0; c < C; c++) {
      double exact = 0;
      for (int n = 0; n < N; n++) exact += double(round_to_format(NumberFormat::BF16, dout[n * OC + o])) * round_to_format(NumberFormat::BF16, x[n * C + c]);
      EXPECT_NEAR(dw[o * C + c] - 0.25, exact, 1e-5);
      any_not_bf16 |= dw[o * C + c] != round_to_format(NumberFormat::BF16, dw[o * C + c]);
    }
    double column = 0;
    for (int n = 0; n < N; n++) column += dout[n * OC + o];
    EXPECT_NEAR(dbias[o], column, 1e-5);
  }
  EXPECT_TRUE(any_not_bf16);
}

TEST(LowPrecisionMatmuls, DelayedScalingUsesTheReducedAmaxHistory) {
  const int N = 4, C = 8, OC = 3;
  std::vector<float> x = random_vector(size_t(N) * C, 21), w = random_vector(size_t(OC) * C, 22, -0.01f, 0.01f);
  std::vector<float> out(size_t(N) * OC), grads(w.size());
  PrecisionRecipe recipe;
  recipe.precision = Precision::FP8;
  recipe.scaling = Fp8Scaling::Delayed;
  recipe.amax_history = 2;
  // Another rank saw amaxes 4 times larger: the reduced history, hence the scales, follow it.
  Installed installed(recipe, w.data(), grads.data(), [](std::vector<float>& amaxes) {
    for (float& a : amaxes) a *= 4;
  });
  auto forward = [&] {
    matmul_forward(make_view(out.data(), {N, OC}), make_view(x.data(), {N, C}), make_view(w.data(), {OC, C}), Tensor{});
  };
  forward();
  EXPECT_EQ(installed.emulation.delayed_scales(), std::vector<float>({0.0f, 0.0f}));  // no history yet
  installed.emulation.end_step();
  const float amax_x = matrix_amax(x.data(), N, C), amax_w = matrix_amax(w.data(), OC, C);
  EXPECT_EQ(installed.emulation.delayed_scales(),
            std::vector<float>({power_of_two_scale(NumberFormat::E4M3, 4 * amax_x),
                                power_of_two_scale(NumberFormat::E4M3, 4 * amax_w)}));
  // The next forward quantizes with those scales: the weights' values are code(w * s) / s.
  forward();
  const float s = installed.emulation.delayed_scales()[1], sx = installed.emulation.delayed_scales()[0];
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      double exact = 0;
      for (int c = 0; c < C; c++)
        exact += double(round_to_format(NumberFormat::E4M3, x[n * C + c] * sx, Overflow::Saturate) / sx) *
                 (round_to_format(NumberFormat::E4M3, w[o * C + c] * s, Overflow::Saturate) / s);
      EXPECT_EQ(out[n * OC + o], round_to_format(NumberFormat::BF16, float(exact)));
    }
  }
  installed.emulation.end_step();  // history: 4 amax_x, 4 amax_x
  // A history of 2: a third step's smaller amax leaves the largest of the last two, a fourth's replaces it.
  x.assign(x.size(), 1e-3f);
  forward();
  installed.emulation.end_step();
  EXPECT_EQ(installed.emulation.delayed_scales()[0], power_of_two_scale(NumberFormat::E4M3, 4 * amax_x));
  forward();
  installed.emulation.end_step();
  EXPECT_EQ(installed.emulation.delayed_scales()[0], power_of_two_scale(NumberFormat::E4M3, 4 * 1e-3f));
}

// A mixture of experts' expert (reduce_apart): its histories exist before any product runs it, and
// its amaxes are reduced by its own group's reduction, the others' by the run's.
TEST(LowPrecisionMatmuls, AnExpertsAmaxesAreReducedApart) {
  const int N = 4, C = 8, OC = 3;
  std::vector<float> x = random_vector(size_t(N) * C, 31), params = random_vector(size_t(2 * OC) * C, 32);
  std::vector<float> grads(params.size()), out(size_t(N) * OC);
  PrecisionRecipe recipe;
  recipe.precision = Precision::FP8;
  recipe.scaling = Fp8Scaling::Delayed;
  Installed installed(recipe, params.data(), grads.data(), [](std::vector<float>& amaxes) {
    for (float& a : amaxes) a *= 4;  // the data-parallel group: another rank saw 4 times larger
  });
  installed.emulation.reduce_apart({OC * C}, [](std::vector<float>& amaxes) {
    for (float& a : amaxes) a *= 2;  // the expert's holders: 2 times larger
  });
  EXPECT_EQ(installed.emulation.delayed_scales().size(), 6u);  // the expert's six operands, before any product
  const Tensor dense = make_view(params.data(), {OC, C}), expert = make_view(params.data() + OC * C, {OC, C});
  matmul_forward(make_view(out.data(), {N, OC}), make_view(x.data(), {N, C}), dense, Tensor{});
  matmul_forward(make_view(out.data(), {N, OC}), make_view(x.data(), {N, C}), expert, Tensor{});
  installed.emulation.end_step();
  // In the order of the weights' offsets: the dense product's input and weight, then the expert's six
  // operands (forward input and weight first), the backward's four without an amax this step.
  const float amax_x = matrix_amax(x.data(), N, C);
  const std::vector<float> scales = installed.emulation.delayed_scales();
  ASSERT_EQ(scales.size(), 8u);
  EXPECT_EQ(scales[0], power_of_two_scale(NumberFormat::E4M3, 4 * amax_x));
  EXPECT_EQ(scales[1], power_of_two_scale(NumberFormat::E4M3, 4 * matrix_amax(params.data(), OC, C)));
  EXPECT_EQ(scales[2], power_of_two_scale(NumberFormat::E4M3, 2 * amax_x));
  EXPECT_EQ(scales[3], power_of_two_scale(NumberFormat::E4M3, 2 * matrix_amax(params.data() + OC * C, OC, C)));
  for (size_t i = 4; i < scales.size(); i++) EXPECT_EQ(scales[i], 0.0f) << i;  // no amax yet: current scaling next
}

// A scope of fp32 products (a MoE router's) skips the recipe on its own thread only; and two threads'
// products at once (dualpipev's F&B pairs) give what one thread gives, each product whole.
TEST(LowPrecisionMatmuls, Fp32ScopesAndTwoThreadsAtOnce) {
  const int N = 48, C = 64, OC = 80;
  std::vector<float> x = random_vector(size_t(N) * C, 41), w = random_vector(size_t(OC) * C, 42), dw(w.size(), 0);
  std::vector<float> plain(size_t(N) * OC), scoped(plain.size());
  // out (n, OC) = in (n, C) W^T, then the input gradient of dout = out into dx: the products of a layer.
  auto layer = [&](std::vector<float>& out, std::vector<float>& dx, const std::vector<float>& in, int n) {
    matmul_forward(make_view(out.data(), {n, OC}), make_view(const_cast<float*>(in.data()), {n, C}),
                   make_view(w.data(), {OC, C}), Tensor{});
    std::fill(dx.begin(), dx.end(), 0.0f);
    matmul_backward_input(make_view(dx.data(), {n, C}), make_view(out.data(), {n, OC}), make_view(w.data(), {OC, C}));
  };
  std::vector<float> dx(x.size());
  layer(plain, dx, x, N);  // no recipe installed: fp32
  PrecisionRecipe recipe;
  recipe.precision = Precision::BF16;
  Installed installed(recipe, w.data(), dw.data());
  {
    const Fp32Products router;
    layer(scoped, dx, x, N);
  }
  EXPECT_EQ(scoped, plain);
  // Two layers of different sizes (so that each may grow the scratch), each alone on one thread, then
  // both again and again on two threads at once.
  const int M = 3 * N;
  const std::vector<float> y = random_vector(size_t(M) * C, 43);
  std::vector<float> alone_x(plain.size()), alone_y(size_t(M) * OC), dx_alone(x.size()), dy_alone(y.size());
  layer(alone_x, dx_alone, x, N);
  layer(alone_y, dy_alone, y, M);
  EXPECT_NE(alone_x, plain);  // the recipe applies outside the scope
  for (int round = 0; round < 20; round++) {
    std::vector<float> at_once_x(alone_x.size()), at_once_y(alone_y.size()), dx_once(x.size()), dy_once(y.size());
    std::thread other([&] {
      for (int i = 0; i < 5; i++) layer(at_once_y, dy_once, y, M);
    });
    for (int i = 0; i < 15; i++) layer(at_once_x, dx_once, x, N);
    other.join();
    ASSERT_EQ(at_once_x, alone_x) << "round " << round;
    ASSERT_EQ(dx_once, dx_alone) << "round " << round;
    ASSERT_EQ(at_once_y, alone_y) << "round " << round;
    ASSERT_EQ(dy_once, dy_alone) << "round " << round;
  }
}

#ifdef GPT_WITH_CUDA
TEST(CublasLt, ProductsEqualTheEmulation) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int M = 32, N = 48, K = 256;
  const std::vector<float> A = random_vector(size_t(M) * K, 31, -3e-3f, 3e-3f), B = random_vector(size_t(N) * K, 32, -2, 2);
  struct Case { NumberFormat a, b; };
  for (Case c : {Case{NumberFormat::BF16, NumberFormat::BF16}, Case{NumberFormat::FP16, NumberFormat::FP16},
                 Case{NumberFormat::E4M3, NumberFormat::E4M3}, Case{NumberFormat::E5M2, NumberFormat::E4M3}}) {
    const bool fp8 = format_bits(c.a) == 8;
    if (fp8 && !gpu_has_fp8_tensor_cores(&why)) {
      std::printf("fp8 skipped: %s\n", why.c_str());
      continue;
    }
    const float sa = fp8 ? power_of_two_scale(c.a, matrix_amax(A.data(), M, K)) : 1.0f;
    const float sb = fp8 ? power_of_two_scale(c.b, matrix_amax(B.data(), N, K)) : 1.0f;
    std::vector<float> qa(A.size()), qb(B.size()), emulated(size_t(M) * N), gpu(size_t(M) * N);
    quantize_matrix(qa.data(), A.data(), M, K, false, Tiling{}, c.a, fp8 ? Overflow::Saturate : Overflow::Ieee, sa, nullptr);
    quantize_matrix(qb.data(), B.data(), N, K, false, Tiling{}, c.b, fp8 ? Overflow::Saturate : Overflow::Ieee, sb, nullptr);
    emulated_product(emulated.data(), qa.data(), qb.data(), M, N, K, Accumulate::Fp32);
    cublaslt_product(gpu.data(), A.data(), B.data(), M, N, K, c.a, c.b, sa, sb);
    for (int i = 0; i < M * N; i++) {
      double magnitude = 0;
      for (int k = 0; k < K; k++) magnitude += std::fabs(double(qa[(i / N) * K + k]) * qb[(i % N) * K + k]);
      ASSERT_NEAR(gpu[i], emulated[i], 2 * K * std::ldexp(magnitude, -24)) << format_name(c.a) << " x " << format_name(c.b) << " at " << i;
    }
  }
}

// The recipe's layers on the device (precision_recipe_cuda.cpp) against the same recipe's CPU
// emulation, on the same inputs: every operand gets the same scale (an amax does not depend on the
// order it is taken in) and so the same codes, and the counts agree exactly; the products differ by
// the order of their fp32 sums alone, so an output rounded to the layer's dtype is within one ulp of
// it (2^-7 relative for bf16, 2^-10 for fp16) and the fp32 weight gradient within the fp32 summation
// bound (taken loosely as 1e-4 relative). Two steps, so that delayed scaling uses its history.
TEST(OnGpu, RecipeLayersOnTheDeviceEqualTheCpuEmulation) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int N = 64, C = 96, OC = 48;  // multiples of 16, as cuBLASLt's fp8 requires
  const std::vector<float> x = random_vector(size_t(N) * C, 41), w = random_vector(size_t(OC) * C, 42, -0.05f, 0.05f),
                           bias = random_vector(OC, 43), dout = random_vector(size_t(N) * OC, 44, -1e-3f, 1e-3f);
  struct Case {
    const char* name;
    Precision precision;
    Fp8Scaling scaling;
    float gradient_scale;
  };
  // (Not --fp8-accumulate tensor-core: the emulation's 14-bit accumulator models what DeepSeek-V3
  // measured, cuBLASLt's fast accumulation is Hopper's own; they need not agree within an ulp.)
  for (const Case c : {Case{"bf16", Precision::BF16, Fp8Scaling::Delayed, 1},
                       Case{"fp16, gradient scale 2^10", Precision::FP16, Fp8Scaling::Delayed, 1024},
                       Case{"fp8 current", Precision::FP8, Fp8Scaling::Current, 1},
                       Case{"fp8 delayed", Precision::FP8, Fp8Scaling::Delayed, 1},
                       Case{"fp8 none", Precision::FP8, Fp8Scaling::None, 1}}) {
    if (c.precision == Precision::FP8 && !gpu_has_fp8_tensor_cores(&why)) {
      std::printf("%s skipped: %s\n", c.name, why.c_str());
      continue;
    }
    PrecisionRecipe recipe;
    recipe.precision = c.precision;
    recipe.scaling = c.scaling;
    // Runs two steps of the layer's three products on `device`; returns out, dx, dw, dbias (on the host).
    auto run = [&](Device device, LowPrecisionMatmuls** kept) {
      std::vector<std::vector<float>> host = {std::vector<float>(size_t(N) * OC), std::vector<float>(x.size(), 0.5f),
                                              std::vector<float>(w.size(), 0.25f), std::vector<float>(OC, 0)};
      std::vector<float> inputs[] = {x, w, bias, dout};
      std::vector<Buffer> buffers;
      std::vector<void*> at;
      for (std::vector<float>* v : {&host[0], &host[1], &host[2], &host[3], &inputs[0], &inputs[1], &inputs[2], &inputs[3]}) {
        if (device == Device::CPU) {
          at.push_back(v->data());
          continue;
        }
        buffers.emplace_back(int64_t(v->size()), MemCategory::Other, DType::F32, Device::CUDA);
        transfer(buffers.back().view(), make_view(v->data(), {int64_t(v->size())}));
        at.push_back(buffers.back().data());
      }
      auto view = [&](int i, std::initializer_list<int64_t> shape) { return make_view(at[size_t(i)], shape, DType::F32, device); };
      *kept = new LowPrecisionMatmuls(recipe, static_cast<float*>(at[5]), static_cast<float*>(at[2]),
                                      [](std::vector<float>&) {});
      (*kept)->set_gradient_scale(c.gradient_scale);
      set_cpu_matmul_emulation(*kept);
      for (int step = 0; step < 2; step++) {
        matmul_forward(view(0, {N, OC}), view(4, {N, C}), view(5, {OC, C}), view(6, {OC}));
        matmul_backward(view(1, {N, C}), view(2, {OC, C}), view(3, {OC}), view(7, {N, OC}), view(4, {N, C}),
                        view(5, {OC, C}));
        (*kept)->end_step();
      }
      set_cpu_matmul_emulation(nullptr);
      if (device == Device::CUDA)
        for (int i = 0; i < 4; i++) transfer(make_view(host[size_t(i)].data(), {int64_t(host[size_t(i)].size())}), buffers[size_t(i)].view());
      return host;
    };
    LowPrecisionMatmuls *cpu_products = nullptr, *gpu_products = nullptr;
    const auto cpu = run(Device::CPU, &cpu_products);
    const auto gpu = run(Device::CUDA, &gpu_products);
    const double output_ulp = c.precision == Precision::FP16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    const char* names[] = {"out", "dx", "dw", "dbias"};
    for (int t = 0; t < 4; t++) {
      const double relative = t == 0 || t == 1 ? output_ulp : 1e-4;
      for (size_t i = 0; i < cpu[size_t(t)].size(); i++)
        ASSERT_NEAR(gpu[size_t(t)][i], cpu[size_t(t)][i], relative * std::fabs(cpu[size_t(t)][i]) + 1e-6)
            << c.name << ": " << names[t] << "[" << i << "]";
    }
    for (TensorKind kind : {TensorKind::Weights, TensorKind::Activations, TensorKind::Gradients}) {
      EXPECT_EQ(gpu_products->counts(kind).values, cpu_products->counts(kind).values) << c.name;
      EXPECT_EQ(gpu_products->counts(kind).nonzero, cpu_products->counts(kind).nonzero) << c.name;
      EXPECT_EQ(gpu_products->counts(kind).underflow, cpu_products->counts(kind).underflow) << c.name;
      EXPECT_EQ(gpu_products->counts(kind).overflow, cpu_products->counts(kind).overflow) << c.name;
    }
    EXPECT_EQ(gpu_products->delayed_scales(), cpu_products->delayed_scales()) << c.name;
    delete cpu_products;
    delete gpu_products;
  }
}
#endif

}  // namespace
