// matmul_lesson.cu: a matrix product on the GPU in four versions, from naive to register-blocked,
// next to cuBLAS. The framework itself calls cuBLAS (common/ops/ops_cuda.cu); this lesson shows where
// cuBLAS's speed comes from, in the manner of llm.c's dev/cuda: a CPU reference, then numbered
// kernels, each validated against the reference before it is timed.
//
// The product: C(M,N) = A(M,K) @ B(K,N), fp32, all row-major (the textbook form; the framework's
// linear layer out = inp @ weight^T differs only in which index of the weight is contiguous).
//   v1 naive          one thread per C entry; the 32 threads of a warp walk down a column of C, so
//                     their loads of A are 32 separate rows: uncoalesced.
//   v2 coalesced      the same, but a warp walks along a row of C: its loads of B and its stores of
//                     C hit 32 neighbouring floats (one memory transaction), its loads of A one float.
//   v3 shared tiles   a block loads 32x32 tiles of A and B into shared memory once and every thread
//                     reads them 32 times from there: 32x less traffic to global memory.
//   v4 register tile  a block computes a 128x128 tile of C, each thread an 8x8 piece of it held in
//                     registers: per k, a thread loads 8 + 8 values from shared memory and does 64
//                     multiply-adds, so shared-memory bandwidth stops being the limit.
//   cuBLAS            cublasSgemm: the same ideas, plus years of tuning per GPU.
// Validation: every version on a small odd-shaped problem (all entries; this exercises the edges
// where a tile sticks out of the matrix), then on the timed problem at 4096 random entries, against
// a float64 CPU reference with a tolerance from the fp32 error bound. Timing: CUDA events around 10
// runs after 2 warm-up runs.
//
// Build and run (nvcc needed; the top-level Makefile builds it where nvcc exists):
//   make lessons/matmul/matmul_lesson        then   lessons/matmul/matmul_lesson [M N K]
// Output (numbers from your GPU; v4 typically reaches about half of cuBLAS or more, v1 a few %):
//   device: NVIDIA H100 ..., 132 SMs, fp32 peak 66.9 TFLOP/s (132 SMs x 128 lanes x 2 FLOP x 1.98 GHz)
//   C(4096 x 4096) = A(4096 x 4096) @ B(4096 x 4096), fp32: 137.4 GFLOP per product
//   version            check   time ms   TFLOP/s   of cuBLAS   of peak
//   v1 naive           ok        ...
// Without a GPU it prints "no CUDA device: skipping" and exits 0.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// A standalone program (it does not link the framework's libcommon, whose error path needs MPI),
// so it carries its own two check macros: print the library's message and the call, then exit.
#define CUDA_OK(call)                                                                                   \
  do {                                                                                                  \
    cudaError_t status_ = (call);                                                                       \
    if (status_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "CUDA error at %s:%d: %s\n    in: %s\n", __FILE__, __LINE__,                  \
                   cudaGetErrorString(status_), #call);                                                 \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)
#define CUBLAS_OK(call)                                                                                 \
  do {                                                                                                  \
    cublasStatus_t status_ = (call);                                                                    \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "cuBLAS error at %s:%d: %s\n    in: %s\n", __FILE__, __LINE__,                \
                   cublasGetStatusName(status_), #call);                                                \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

namespace {

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------------------------
// v1: naive. Thread (x, y) of the block computes C[row][col] with row from x. The 32 threads of a
// warp have consecutive threadIdx.x, hence consecutive rows: at each k they read A[row][k] from 32
// different rows (32 transactions) and write C down a column (32 more).

__global__ void matmul_v1_naive(float* C, const float* A, const float* B, int M, int N, int K) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const int col = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float sum = 0.0f;
  for (int k = 0; k < K; k++) sum += A[size_t(row) * K + k] * B[size_t(k) * N + col];
  C[size_t(row) * N + col] = sum;
}

// ------------------------------------------------------------------------------------------------
// v2: coalesced. Only the mapping changes: consecutive threads take consecutive columns. A warp now
// reads one A[row][k] (a broadcast), 32 neighbouring B[k][col..col+31] (one transaction) and writes
// 32 neighbouring C entries.

__global__ void matmul_v2_coalesced(float* C, const float* A, const float* B, int M, int N, int K) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float sum = 0.0f;
  for (int k = 0; k < K; k++) sum += A[size_t(row) * K + k] * B[size_t(k) * N + col];
  C[size_t(row) * N + col] = sum;
}

// ------------------------------------------------------------------------------------------------
// v3: shared-memory tiles. A 32x32 block computes a 32x32 tile of C. For each 32-wide slice of k,
// the block copies the 32x32 tiles of A and B it needs into shared memory (each thread one element
// of each), waits for all copies (__syncthreads), then every thread does its 32 multiply-adds from
// shared memory. Every global element is loaded once per block instead of 32 times.
// Parts of a tile outside the matrices are filled with 0, which adds nothing to the sums.

constexpr int kTile = 32;

__global__ void matmul_v3_shared(float* C, const float* A, const float* B, int M, int N, int K) {
  __shared__ float As[kTile][kTile];
  __shared__ float Bs[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;
  const int col = blockIdx.x * kTile + tx;
  float sum = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Coalesced loads: neighbouring threads (tx) read neighbouring columns of A and of B.
    As[ty][tx] = (row < M && k0 + tx < K) ? A[size_t(row) * K + k0 + tx] : 0.0f;
    Bs[ty][tx] = (k0 + ty < K && col < N) ? B[size_t(k0 + ty) * N + col] : 0.0f;
    __syncthreads();  // the tiles are complete
    // As[ty][k] is the same address for the whole warp (a broadcast); Bs[k][tx] are 32
    // neighbouring words in 32 different banks: no bank conflicts.
    for (int k = 0; k < kTile; k++) sum += As[ty][k] * Bs[k][tx];
    __syncthreads();  // everyone is done with the tiles before the next slice overwrites them
  }
  if (row < M && col < N) C[size_t(row) * N + col] = sum;
}

// ------------------------------------------------------------------------------------------------
// v4: 2D register blocking. A block of 256 threads computes a 128x128 tile of C, so each thread
// computes 8x8 = 64 entries, kept in registers. The k dimension goes in slices of 8:
//   load    the 128x8 slice of A and the 8x128 slice of B into shared memory (4 + 4 floats per thread)
//   compute for each of the 8 k: load 8 values of A's column and 8 of B's row into registers, then
//           64 multiply-adds (an outer product). 16 shared loads per 64 FMAs instead of 2 per 1 in v3.
// Thread (tr, tc) = (tid / 16, tid % 16) owns rows tr + 16i and columns tc + 16j (i, j < 8): within
// a warp, neighbouring threads own neighbouring columns, so B's reads from shared memory and the
// final stores to C are contiguous. A's slice is stored transposed (As[k][row]) so that the 8 values
// a thread needs for one k are a row of As; the +4 padding spreads the transposing stores over all
// 32 banks.

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;
constexpr int kV4Threads = (kBM / kTM) * (kBN / kTN);  // 256

__global__ void __launch_bounds__(kV4Threads) matmul_v4_register(float* C, const float* A, const float* B, int M,
                                                                  int N, int K) {
  __shared__ float As[kBK][kBM + 4];
  __shared__ float Bs[kBK][kBN];
  const int tid = threadIdx.x;
  const int tr = tid / (kBN / kTN), tc = tid % (kBN / kTN);
  const int row0 = blockIdx.y * kBM, col0 = blockIdx.x * kBN;

  float acc[kTM][kTN] = {};
  float a_reg[kTM], b_reg[kTN];
  for (int k0 = 0; k0 < K; k0 += kBK) {
    // Each thread copies 4 of the 1024 elements of each slice; out-of-range elements become 0.
    for (int e = tid; e < kBM * kBK; e += kV4Threads) {
      const int r = e / kBK, k = e % kBK;  // A slice: 128 rows x 8 columns
      const int gr = row0 + r, gk = k0 + k;
      As[k][r] = (gr < M && gk < K) ? A[size_t(gr) * K + gk] : 0.0f;
    }
    for (int e = tid; e < kBK * kBN; e += kV4Threads) {
      const int k = e / kBN, c = e % kBN;  // B slice: 8 rows x 128 columns
      const int gk = k0 + k, gc = col0 + c;
      Bs[k][c] = (gk < K && gc < N) ? B[size_t(gk) * N + gc] : 0.0f;
    }
    __syncthreads();
    // Fully unrolled (#pragma unroll), so that acc, a_reg and b_reg are indexed by constants and
    // live in registers; an array indexed at run time would be placed in (slow) local memory.
#pragma unroll
    for (int k = 0; k < kBK; k++) {
#pragma unroll
      for (int i = 0; i < kTM; i++) a_reg[i] = As[k][tr + i * (kBM / kTM)];
#pragma unroll
      for (int j = 0; j < kTN; j++) b_reg[j] = Bs[k][tc + j * (kBN / kTN)];
#pragma unroll
      for (int i = 0; i < kTM; i++)
#pragma unroll
        for (int j = 0; j < kTN; j++) acc[i][j] += a_reg[i] * b_reg[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTM; i++) {
    const int r = row0 + tr + i * (kBM / kTM);
    if (r >= M) continue;
#pragma unroll
    for (int j = 0; j < kTN; j++) {
      const int c = col0 + tc + j * (kBN / kTN);
      if (c < N) C[size_t(r) * N + c] = acc[i][j];
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The versions, as the host launches them

struct Problem {
  int M, N, K;
  const float *A, *B;  // device
  float* C;            // device
};

void run_v1(const Problem& p, cublasHandle_t) {
  const dim3 block(32, 32), grid(ceil_div(p.M, 32), ceil_div(p.N, 32));
  matmul_v1_naive<<<grid, block>>>(p.C, p.A, p.B, p.M, p.N, p.K);
}
void run_v2(const Problem& p, cublasHandle_t) {
  const dim3 block(32, 32), grid(ceil_div(p.N, 32), ceil_div(p.M, 32));
  matmul_v2_coalesced<<<grid, block>>>(p.C, p.A, p.B, p.M, p.N, p.K);
}
void run_v3(const Problem& p, cublasHandle_t) {
  const dim3 block(kTile, kTile), grid(ceil_div(p.N, kTile), ceil_div(p.M, kTile));
  matmul_v3_shared<<<grid, block>>>(p.C, p.A, p.B, p.M, p.N, p.K);
}
void run_v4(const Problem& p, cublasHandle_t) {
  const dim3 grid(ceil_div(p.N, kBN), ceil_div(p.M, kBM));
  matmul_v4_register<<<grid, kV4Threads>>>(p.C, p.A, p.B, p.M, p.N, p.K);
}
// cuBLAS is column-major. Row-major C(M,N) is column-major C^T(N,M), and C^T = B^T A^T where B^T and
// A^T are exactly how row-major B and A look to cuBLAS: so ask for B @ A with swapped sizes.
void run_cublas(const Problem& p, cublasHandle_t handle) {
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_OK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, p.N, p.M, p.K, &one, p.B, p.N, p.A, p.K, &zero, p.C, p.N));
}

struct Version {
  const char* name;
  void (*run)(const Problem&, cublasHandle_t);
};
const Version kVersions[] = {{"v1 naive", run_v1},           {"v2 coalesced", run_v2}, {"v3 shared tiles", run_v3},
                             {"v4 register tile", run_v4}, {"cuBLAS sgemm", run_cublas}};

// ------------------------------------------------------------------------------------------------
// CPU reference and validation

// Deterministic inputs uniform in [-1, 1).
std::vector<float> random_matrix(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = float(s >> 40) / float(1 << 24) * 2.0f - 1.0f;
  }
  return x;
}

// Checks C[i][j] against the float64 sum for each (i, j) in `entries`. The tolerance follows the
// fp32 error bound of a K-term dot product, K * 2^-24 * sum_k |A_ik B_kj|, with a factor 1/8 because
// real rounding errors partly cancel (any summation order of a correct kernel stays far inside it).
bool validate(const std::vector<float>& C, const std::vector<float>& A, const std::vector<float>& B, int N, int K,
              const std::vector<std::pair<int, int>>& entries, double* worst) {
  *worst = 0;
  bool ok = true;
  for (auto [i, j] : entries) {
    double sum = 0, magnitude = 0;
    for (int k = 0; k < K; k++) {
      const double product = double(A[size_t(i) * K + k]) * B[size_t(k) * N + j];
      sum += product;
      magnitude += std::fabs(product);
    }
    const double error = std::fabs(C[size_t(i) * N + j] - sum);
    const double tolerance = (K / 8.0) * std::ldexp(1.0, -24) * magnitude + 1e-6;
    *worst = std::max(*worst, error);
    if (!(error <= tolerance)) ok = false;  // written so that NaN fails
  }
  return ok;
}

// Runs `version` on M x N x K with fresh inputs and validates the given entries (all if `all`).
bool check(const Version& version, int M, int N, int K, bool all, cublasHandle_t handle, double* worst) {
  const std::vector<float> A = random_matrix(size_t(M) * K, 1), B = random_matrix(size_t(K) * N, 2);
  float *dA, *dB, *dC;
  CUDA_OK(cudaMalloc(&dA, A.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&dB, B.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&dC, size_t(M) * N * sizeof(float)));
  CUDA_OK(cudaMemcpy(dA, A.data(), A.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dB, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dC, 0xff, size_t(M) * N * sizeof(float)));  // NaN everywhere: unwritten entries fail
  version.run({M, N, K, dA, dB, dC}, handle);
  CUDA_OK(cudaGetLastError());
  std::vector<float> C(size_t(M) * N);
  CUDA_OK(cudaMemcpy(C.data(), dC, C.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(dA));
  CUDA_OK(cudaFree(dB));
  CUDA_OK(cudaFree(dC));

  std::vector<std::pair<int, int>> entries;
  if (all) {
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) entries.push_back({i, j});
  } else {
    // 4096 random entries, plus the four corners (the edges of the last tiles)
    entries = {{0, 0}, {0, N - 1}, {M - 1, 0}, {M - 1, N - 1}};
    uint64_t s = 12345;
    for (int e = 0; e < 4096; e++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      entries.push_back({int((s >> 33) % uint64_t(M)), int((s >> 13) % uint64_t(N))});
    }
  }
  return validate(C, A, B, N, K, entries, worst);
}

// Average milliseconds of one run, over 10 runs timed with CUDA events after 2 warm-up runs.
float time_ms(const Version& version, const Problem& p, cublasHandle_t handle) {
  for (int i = 0; i < 2; i++) version.run(p, handle);
  CUDA_OK(cudaGetLastError());
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  constexpr int kRuns = 10;
  CUDA_OK(cudaEventRecord(start));
  for (int i = 0; i < kRuns; i++) version.run(p, handle);
  CUDA_OK(cudaEventRecord(stop));
  CUDA_OK(cudaEventSynchronize(stop));
  CUDA_OK(cudaGetLastError());
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  return ms / kRuns;
}

// FP32 lanes per SM (not tensor cores): 64 on compute capability 6.0, 7.x and 8.0, 128 on 6.1/6.2,
// 8.6-8.9 and 9.0 and later.
int fp32_lanes_per_sm(int major, int minor) {
  if (major == 8 && minor == 0) return 64;
  if (major == 7) return 64;
  if (major == 6) return minor == 0 ? 64 : 128;
  return 128;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipping (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount found none");
    return 0;
  }
  int M = 4096, N = 4096, K = 4096;
  if (argc == 4) {
    M = std::atoi(argv[1]);
    N = std::atoi(argv[2]);
    K = std::atoi(argv[3]);
  }
  if (argc != 1 && argc != 4) {
    std::fprintf(stderr, "usage: %s [M N K]   (default 4096 4096 4096)\n", argv[0]);
    return 1;
  }
  if (M <= 0 || N <= 0 || K <= 0) {
    std::fprintf(stderr, "M, N and K must be positive\n");
    return 1;
  }

  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CUDA_OK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const int lanes = fp32_lanes_per_sm(prop.major, prop.minor);
  const double peak_tflops = double(prop.multiProcessorCount) * lanes * 2 * clock_khz * 1e3 / 1e12;
  std::printf("device: %s, %d SMs, fp32 peak %.1f TFLOP/s (%d SMs x %d lanes x 2 FLOP x %.2f GHz)\n", prop.name,
              prop.multiProcessorCount, peak_tflops, prop.multiProcessorCount, lanes, clock_khz / 1e6);
  const double flops = 2.0 * M * N * K;
  std::printf("C(%d x %d) = A(%d x %d) @ B(%d x %d), fp32: %.1f GFLOP per product\n", M, N, M, K, K, N,
              flops / 1e9);

  cublasHandle_t handle;
  CUBLAS_OK(cublasCreate(&handle));
  CUBLAS_OK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // true fp32, no TF32 tensor cores

  // Inputs of the timed problem (their values do not matter for the time).
  const std::vector<float> A = random_matrix(size_t(M) * K, 1), B = random_matrix(size_t(K) * N, 2);
  float *dA, *dB, *dC;
  CUDA_OK(cudaMalloc(&dA, A.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&dB, B.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&dC, size_t(M) * N * sizeof(float)));
  CUDA_OK(cudaMemcpy(dA, A.data(), A.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dB, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice));
  const Problem timed{M, N, K, dA, dB, dC};

  constexpr int kVersionCount = int(sizeof kVersions / sizeof kVersions[0]);
  bool valid[kVersionCount];
  float ms[kVersionCount];
  double worst_small[kVersionCount], worst_large[kVersionCount];
  bool all_valid = true;
  for (int v = 0; v < kVersionCount; v++) {
    // First a small odd shape in full (the edges of partial tiles), then samples of the timed shape.
    valid[v] = check(kVersions[v], 133, 97, 71, /*all=*/true, handle, &worst_small[v]) &&
               check(kVersions[v], M, N, K, /*all=*/false, handle, &worst_large[v]);
    ms[v] = valid[v] ? time_ms(kVersions[v], timed, handle) : 0.0f;  // only a correct kernel is timed
    all_valid = all_valid && valid[v];
  }

  const float cublas_ms = ms[kVersionCount - 1];
  std::printf("%-18s %-6s %9s %9s %11s %9s\n", "version", "check", "time ms", "TFLOP/s", "of cuBLAS", "of peak");
  for (int v = 0; v < kVersionCount; v++) {
    if (!valid[v]) {
      std::printf("%-18s FAILED (largest error %.3g on the small problem, %.3g on the timed one): not timed\n",
                  kVersions[v].name, worst_small[v], worst_large[v]);
      continue;
    }
    const double tflops = flops / (ms[v] * 1e-3) / 1e12;
    std::printf("%-18s %-6s %9.3f %9.2f %10.0f%% %8.0f%%\n", kVersions[v].name, "ok", ms[v], tflops,
                cublas_ms > 0 ? 100.0 * cublas_ms / ms[v] : 0.0, 100.0 * tflops / peak_tflops);
  }

  CUDA_OK(cudaFree(dA));
  CUDA_OK(cudaFree(dB));
  CUDA_OK(cudaFree(dC));
  CUBLAS_OK(cublasDestroy(handle));
  return all_valid ? 0 : 1;
}
