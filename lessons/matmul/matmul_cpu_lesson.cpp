// matmul_cpu_lesson.cpp: the matrix product on one CPU core in five versions, from naive to the
// packed, register-blocked micro-kernel the framework runs (common/ops/matmul_cpu.cpp), each next to the
// core's measured peak. The CPU companion of matmul_lesson.cu; it needs no GPU and no MPI.
//
// The product: C(M,N) = A(M,K) @ B(K,N), fp32, row-major.
//   v1 naive          C[i][j] = dot(row i of A, column j of B): the column is read with stride N, one
//                     float per cache line, and the dot product is one chain of dependent adds.
//   v2 loop order     i, k, j: C's row i += A[i][k] * row k of B. The inner loop walks B and C with
//                     unit stride and its iterations are independent, so the compiler vectorizes it.
//   v3 cache blocks   v2 on 64 x 256 blocks of C and 256-deep slices of K, so the slice of B a block
//                     reuses stays in L2 instead of streaming from memory for every row of A.
//   v4 micro-kernel   the framework's sgemm_cpu: op(B) packed into 16-wide panels that fit L1, op(A)
//                     into 6-tall blocks that fit L2, and a 6 x 16 block of C held in 12 vector
//                     registers through the whole depth: per k, 6 broadcasts and 2 vector loads feed
//                     12 multiply-adds, so the core computes instead of waiting for loads and stores;
//                     the rows of C the next tile reads or writes are fetched while a tile computes.
//   v5 intrinsics     v4's kernel with the instructions named (_mm256_broadcast_ss, _mm256_fmadd_ps),
//                     as BLAS libraries write theirs; v4's plain loops where the build lacks AVX2 and FMA.
//                     It is no faster: GCC already emits these instructions from v4's loops (compare
//                     `objdump -d` of the two), which is why the framework keeps v4's portable code.
// The peak: one core's fp32 multiply-add rate, measured (not read from a data sheet, which would need
// the clock under load) by a loop of independent chains acc = acc * m + a, enough of them to cover the
// latency of a multiply-add on every vector unit, each chain as wide as the build's vectors (AVX-512,
// AVX, or SSE under ARCH=-march=x86-64-v2). The best of five runs. A version's "of peak" is its
// GFLOP/s over this number.
// Validation: every version on a small odd-shaped problem (all entries, so the edges where a block
// sticks out of the matrix are covered), then on the timed problem at 4096 random entries, against a
// float64 reference, within the fp32 error bound of a K-term sum. Timing: the thread's CPU time, the
// best of five runs after a warm-up (on a busy machine the best run is the one least disturbed), for
// the peak as for the versions.
//
// Build and run (the top-level Makefile builds it with the chapters):
//   make lessons/matmul/matmul_cpu_lesson     then   lessons/matmul/matmul_cpu_lesson [M N K]
// Output (on a 2-core AMD EPYC VM with AVX2, busy with other work; the numbers are your CPU's):
//   CPU peak, one core, fp32: 89.8 GFLOP/s (measured: 12 independent chains of 8-float (AVX) ...)
//   C(512 x 512) = A(512 x 512) @ B(512 x 512), fp32: 0.268 GFLOP per product
//   version            check    time ms   GFLOP/s  of peak
//   v1 naive           ok        344.47       0.8       1%
//   v2 loop order      ok         19.48      13.8      15%
//   v3 cache blocks    ok         25.30      10.6      12%
//   v4 micro-kernel    ok          7.40      36.3      40%
// On the same machine at load 0.9 (peak 98.2), and with v5 at load 20-25 (peak 101.3; over several
// runs v4 and v5 each came out ahead, by up to 10%):
//   v4 micro-kernel    ok          3.50      76.6      78%   (load 0.9)
//   v4 micro-kernel    ok          4.05      66.2      65%   (load 20-25)
//   v5 intrinsics      ok          3.58      74.9      74%   (load 20-25, the same run)
// The same product's CPU time grows with the machine's load, so compare versions within one run.
// (v3 gains nothing over v2 here: at 512 columns B's rows already stay in this CPU's large L2.)
// make test runs it on a small odd shape (tests/manifest.txt), for the checks. Exits 1 if one fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <time.h>  // clock_gettime: CPU time of this thread
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>  // v5: _mm256_fmadd_ps and friends
#endif

#include "ops/matmul_cpu.h"  // sgemm_cpu: version 4

namespace {

// ---------------------------------------------------------------------------------------------------
// The versions
// ---------------------------------------------------------------------------------------------------

void matmul_v1_naive(const float* A, const float* B, float* C, int M, int N, int K) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      float sum = 0.0f;
      for (int k = 0; k < K; ++k) sum += A[size_t(i) * K + k] * B[size_t(k) * N + j];
      C[size_t(i) * N + j] = sum;
    }
  }
}

void matmul_v2_loop_order(const float* A, const float* B, float* C, int M, int N, int K) {
  for (int i = 0; i < M; ++i) {
    float* __restrict c = C + size_t(i) * N;
    std::fill(c, c + N, 0.0f);
    for (int k = 0; k < K; ++k) {
      const float a = A[size_t(i) * K + k];
      const float* __restrict b = B + size_t(k) * N;
      for (int j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

void matmul_v3_cache_blocks(const float* A, const float* B, float* C, int M, int N, int K) {
  constexpr int kRows = 64, kCols = 256, kDepth = 256;  // B's slice: 256 x 256 floats = 256 KiB, in L2
  std::fill(C, C + size_t(M) * N, 0.0f);
  for (int j0 = 0; j0 < N; j0 += kCols) {
    const int j1 = std::min(N, j0 + kCols);
    for (int k0 = 0; k0 < K; k0 += kDepth) {
      const int k1 = std::min(K, k0 + kDepth);
      for (int i0 = 0; i0 < M; i0 += kRows) {
        const int i1 = std::min(M, i0 + kRows);
        for (int i = i0; i < i1; ++i) {
          float* __restrict c = C + size_t(i) * N;
          for (int k = k0; k < k1; ++k) {
            const float a = A[size_t(i) * K + k];
            const float* __restrict b = B + size_t(k) * N;
            for (int j = j0; j < j1; ++j) c[j] += a * b[j];
          }
        }
      }
    }
  }
}

void matmul_v4_micro_kernel(const float* A, const float* B, float* C, int M, int N, int K) {
  sgemm_cpu(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
}

// v5: v4's scheme written out with the instructions named, as BLAS libraries write their kernels: 256-deep
// slices of B packed row by row into 16-wide strips, rows of A read in place, and a 6 x 16 block of C in
// twelve 8-float registers, each k one broadcast of A per row and two loads of B feeding twelve fused
// multiply-adds (_mm256_fmadd_ps), k unrolled by four. Builds without AVX2 and FMA get v4's portable code.
#if defined(__AVX2__) && defined(__FMA__)
constexpr int kV5Depth = 256, kV5Block = 96, kV5Rows = 6, kV5Cols = 16;  // as v4: 96 x 256 of A stay in L2

// C[0:6, 0:16] (rows ldc apart) += A[0:6, 0:kc] (rows lda apart) @ the packed strip Bp (kc x 16, k-major).
void kernel_6x16_fma(int kc, const float* A, int lda, const float* Bp, float* C, int ldc) {
  __m256 c[kV5Rows][2];
  for (int i = 0; i < kV5Rows; ++i) {
    c[i][0] = _mm256_loadu_ps(C + size_t(i) * ldc);
    c[i][1] = _mm256_loadu_ps(C + size_t(i) * ldc + 8);
  }
  auto step = [&](int k) {
    const __m256 b0 = _mm256_loadu_ps(Bp + k * kV5Cols), b1 = _mm256_loadu_ps(Bp + k * kV5Cols + 8);
    for (int i = 0; i < kV5Rows; ++i) {
      const __m256 a = _mm256_broadcast_ss(A + size_t(i) * lda + k);
      c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
    }
  };
  int k = 0;
  for (; k + 4 <= kc; k += 4) step(k), step(k + 1), step(k + 2), step(k + 3);
  for (; k < kc; ++k) step(k);
  for (int i = 0; i < kV5Rows; ++i) {
    _mm256_storeu_ps(C + size_t(i) * ldc, c[i][0]);
    _mm256_storeu_ps(C + size_t(i) * ldc + 8, c[i][1]);
  }
}

void matmul_v5_intrinsics(const float* A, const float* B, float* C, int M, int N, int K) {
  const int strips = (N + kV5Cols - 1) / kV5Cols;
  std::vector<float> packed(size_t(kV5Depth) * strips * kV5Cols), a_edge(size_t(kV5Rows) * kV5Depth);
  std::fill(C, C + size_t(M) * N, 0.0f);
  for (int k0 = 0; k0 < K; k0 += kV5Depth) {
    const int kc = std::min(kV5Depth, K - k0);
    // B[k0:k0+kc, :] into strips, row by row (one contiguous read per row); the last strip zero-padded.
    for (int k = 0; k < kc; ++k) {
      const float* row = B + size_t(k0 + k) * N;
      for (int js = 0; js < strips; ++js) {
        float* dst = packed.data() + size_t(js) * kc * kV5Cols + k * kV5Cols;
        const int nr = std::min(kV5Cols, N - js * kV5Cols);
        std::copy(row + js * kV5Cols, row + js * kV5Cols + nr, dst);
        std::fill(dst + nr, dst + kV5Cols, 0.0f);
      }
    }
    for (int ib = 0; ib < M; ib += kV5Block) {
     for (int js = 0; js < strips; ++js) {
      const float* strip = packed.data() + size_t(js) * kc * kV5Cols;
      const int j0 = js * kV5Cols, nr = std::min(kV5Cols, N - j0);
      for (int i0 = ib; i0 < std::min(M, ib + kV5Block); i0 += kV5Rows) {
        const int mr = std::min(kV5Rows, M - i0);
        if (mr == kV5Rows && nr == kV5Cols) {
          kernel_6x16_fma(kc, A + size_t(i0) * K + k0, K, strip, C + size_t(i0) * N + j0, N);
          continue;
        }
        // An edge: the rows of A that exist (zeros below), C's block through a full-size tile.
        float tile[kV5Rows * kV5Cols] = {};
        std::fill(a_edge.begin(), a_edge.end(), 0.0f);
        for (int i = 0; i < mr; ++i) {
          std::copy(A + size_t(i0 + i) * K + k0, A + size_t(i0 + i) * K + k0 + kc, a_edge.begin() + size_t(i) * kc);
          std::copy(C + size_t(i0 + i) * N + j0, C + size_t(i0 + i) * N + j0 + nr, tile + i * kV5Cols);
        }
        kernel_6x16_fma(kc, a_edge.data(), kc, strip, tile, kV5Cols);
        for (int i = 0; i < mr; ++i) std::copy(tile + i * kV5Cols, tile + i * kV5Cols + nr, C + size_t(i0 + i) * N + j0);
      }
     }
    }
  }
}
#else
void matmul_v5_intrinsics(const float* A, const float* B, float* C, int M, int N, int K) {
  matmul_v4_micro_kernel(A, B, C, M, N, K);
}
#endif

struct Version {
  const char* name;
  void (*run)(const float*, const float*, float*, int, int, int);
};
const Version kVersions[] = {
    {"v1 naive", matmul_v1_naive},
    {"v2 loop order", matmul_v2_loop_order},
    {"v3 cache blocks", matmul_v3_cache_blocks},
    {"v4 micro-kernel", matmul_v4_micro_kernel},
    {"v5 intrinsics", matmul_v5_intrinsics},
};

// ---------------------------------------------------------------------------------------------------
// The peak
// ---------------------------------------------------------------------------------------------------

// The build's vector width in floats, and enough independent chains to keep every multiply-add unit
// busy through its latency (2 units x 4-5 cycles on current x86 cores), within 16 vector registers.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
constexpr int kChains = 12;

// 2 x kChains x kLanes FLOPs per iteration. acc converges to a / (1 - m): no overflow, no denormals.
// noinline and the volatile sink keep the compiler from folding the loop away.
__attribute__((noinline)) float multiply_add_chains(long iterations, float m, float a) {
  float acc[kChains][kLanes];
  for (int c = 0; c < kChains; ++c) {
    for (int l = 0; l < kLanes; ++l) acc[c][l] = float(c + l);
  }
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) {
#pragma GCC unroll 16
      for (int l = 0; l < kLanes; ++l) acc[c][l] = acc[c][l] * m + a;
    }
  }
  float sum = 0.0f;
  for (int c = 0; c < kChains; ++c) {
    for (int l = 0; l < kLanes; ++l) sum += acc[c][l];
  }
  return sum;
}

// The thread's CPU time, not the wall clock: on a machine shared with other work, the time this
// thread waited for a core is not the kernel's.
double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

double measured_peak_gflops() {
  const long iterations = 5'000'000;
  volatile float sink = multiply_add_chains(iterations / 10, 0.999f, 1e-3f);  // warm-up (and clock up)
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const double start = cpu_seconds();
    sink = multiply_add_chains(iterations, 0.999f, 1e-3f);
    best = std::min(best, cpu_seconds() - start);
  }
  (void)sink;
  return 2.0 * kChains * kLanes * iterations / best / 1e9;
}

// ---------------------------------------------------------------------------------------------------
// Validation and timing
// ---------------------------------------------------------------------------------------------------

struct Problem {
  int M, N, K;
  std::vector<float> A, B, C;
  Problem(int m, int n, int k) : M(m), N(n), K(k), A(size_t(m) * k), B(size_t(k) * n), C(size_t(m) * n) {
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& x : A) x = uniform(rng);
    for (float& x : B) x = uniform(rng);
  }
};

// Entry (i, j) against float64, within the bound on the rounding of a K-term fp32 sum of products:
// |error| <= K * 2^-24 * sum_k |A[i][k] B[k][j]| (plus a little for the summation order).
bool entry_ok(const Problem& p, int i, int j, double* worst) {
  double ref = 0.0, magnitude = 0.0;
  for (int k = 0; k < p.K; ++k) {
    const double term = double(p.A[size_t(i) * p.K + k]) * p.B[size_t(k) * p.N + j];
    ref += term;
    magnitude += std::fabs(term);
  }
  const double error = std::fabs(p.C[size_t(i) * p.N + j] - ref);
  const double bound = 2.0 * p.K * std::ldexp(1.0, -24) * magnitude + 1e-30;
  *worst = std::max(*worst, error / bound);
  return error <= bound;
}

// Runs `version` on p (C first filled with NaN, so an entry never written fails) and checks all its
// entries or `samples` random ones.
bool check(const Version& version, Problem& p, int samples, double* worst) {
  std::fill(p.C.begin(), p.C.end(), std::nanf(""));
  version.run(p.A.data(), p.B.data(), p.C.data(), p.M, p.N, p.K);
  bool ok = true;
  if (samples == 0) {
    for (int i = 0; i < p.M; ++i) {
      for (int j = 0; j < p.N; ++j) ok &= entry_ok(p, i, j, worst);
    }
  } else {
    std::mt19937 rng(99);
    for (int s = 0; s < samples; ++s) ok &= entry_ok(p, int(rng() % p.M), int(rng() % p.N), worst);
  }
  return ok;
}

double best_ms(const Version& version, Problem& p) {
  version.run(p.A.data(), p.B.data(), p.C.data(), p.M, p.N, p.K);  // warm-up
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const double start = cpu_seconds();
    version.run(p.A.data(), p.B.data(), p.C.data(), p.M, p.N, p.K);
    best = std::min(best, cpu_seconds() - start);
  }
  return best * 1e3;
}

int positive_arg(const char* text, const char* what) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > 8192) {
    std::fprintf(stderr, "matmul_cpu_lesson: %s must be an integer in 1..8192, got '%s'\n", what, text);
    std::exit(2);
  }
  return int(value);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 1 && argc != 4) {
    std::fprintf(stderr, "usage: %s [M N K]   (default 512 512 512)\n", argv[0]);
    return 2;
  }
  const int M = argc == 4 ? positive_arg(argv[1], "M") : 512;
  const int N = argc == 4 ? positive_arg(argv[2], "N") : 512;
  const int K = argc == 4 ? positive_arg(argv[3], "K") : 512;

  const double peak = measured_peak_gflops();
  const char* isa = kLanes == 16 ? "AVX-512" : kLanes == 8 ? "AVX" : "SSE";
  std::printf("CPU peak, one core, fp32: %.1f GFLOP/s (measured: %d independent chains of %d-float (%s) "
              "multiply-adds, 2 FLOP each, best of 5 runs)\n",
              peak, kChains, kLanes, isa);
  const double gflop = 2.0 * M * N * K / 1e9;
  std::printf("C(%d x %d) = A(%d x %d) @ B(%d x %d), fp32: %.3f GFLOP per product\n", M, N, M, K, K, N, gflop);

  Problem edges(67, 45, 33), timed(M, N, K);
  bool all_ok = true;
  std::printf("%-18s %-6s %9s %9s %8s\n", "version", "check", "time ms", "GFLOP/s", "of peak");
  for (const Version& version : kVersions) {
    double worst = 0.0;
    const bool ok = check(version, edges, 0, &worst) && check(version, timed, 4096, &worst);
    all_ok &= ok;
    if (!ok) {
      std::printf("%-18s %-6s (largest error %.2f x the fp32 bound)\n", version.name, "FAIL", worst);
      continue;
    }
    const double ms = best_ms(version, timed);
    const double gflops = gflop / (ms / 1e3);
    std::printf("%-18s %-6s %9.2f %9.1f %7.0f%%\n", version.name, "ok", ms, gflops, 100.0 * gflops / peak);
  }
  return all_ok ? 0 : 1;
}
