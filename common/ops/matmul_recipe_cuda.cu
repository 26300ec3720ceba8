// matmul_recipe_cuda.cu: the kernels and the cuBLASLt calls of matmul_recipe_cuda.h, each kernel next
// to its launcher. The conversions are float_formats.h's, compiled for the device, so a code on the
// GPU is the code the CPU's emulation makes of the same value.
//
// Layout. cuBLASLt is column-major, and its fp8 kernels take only the "TN" form (its A transposed, its
// B not), both operands stored with the contraction along their rows. Our row-major
// C(M,N) = A(M,K) B(N,K)^T is the column-major C'(N,M) = B' A'^T: TN with cuBLASLt's A = our B and
// its B = our A (as in matmul_cublaslt.cu). So every operand is cast with the contraction along its
// rows: the forward's input and weight as they are; the backward's weight (for the input gradient),
// gradient and input (for the weight gradient) as transposed copies, which cast() writes directly.
#include "ops/matmul_recipe_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "base/check.h"       // fatal
#include "base/cuda_check.h"  // CUDA_CHECK, CUBLAS_CHECK
#include "base/watchdog.h"    // BlockedOnDevice: the waits for the amax and the counters
#include "ops/matmul_cublaslt.h"  // cuda_type
#include "ops/memory.h"       // Scratch: the buffers, grown at the first steps, then reused
#include "ops/ops_cuda.h"     // cuda::stream

namespace recipe_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kCounters = 3;  // per kind: nonzero, underflow, overflow
int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return int(blocks < 4096 ? blocks : 4096);  // grid-stride loops do the rest
}

Scratch& codes_of(Operand operand) {
  static Scratch a(Device::CUDA), b(Device::CUDA);
  return operand == Operand::A ? a : b;
}
Scratch& product_buffer() {
  static Scratch buffer(Device::CUDA);
  return buffer;
}
// 3 kinds x kCounters counters, then one word for the amax: allocated once, zeroed once.
unsigned long long* counters() {
  static auto* words = [] {
    const size_t bytes = (3 * kCounters + 1) * sizeof(unsigned long long);
    auto* w = static_cast<unsigned long long*>(device_alloc(bytes, MemCategory::Other, Device::CUDA));
    CUDA_CHECK(cudaMemsetAsync(w, 0, bytes, cuda::stream()));
    return w;
  }();
  return words;
}
unsigned int* amax_word() { return reinterpret_cast<unsigned int*>(counters() + 3 * kCounters); }
// Delayed scaling's slots, one per history: a float's bits each.
unsigned int* amax_slots() {
  static auto* slots = [] {
    const size_t bytes = kAmaxSlots * sizeof(unsigned int);
    auto* s = static_cast<unsigned int*>(device_alloc(bytes, MemCategory::Other, Device::CUDA));
    CUDA_CHECK(cudaMemsetAsync(s, 0, bytes, cuda::stream()));
    return s;
  }();
  return slots;
}

// ------------------------------------------------------------------------------------------------
// amax: a block's largest |x * pre| by a tree in shared memory, then one atomicMax per block on the
// float's bits (non-negative floats order as their bits do). fmaxf drops a NaN, as std::max does on
// the CPU when the NaN comes second.

__global__ void amax_kernel(const float* x, int64_t n, float pre, unsigned int* result) {
  __shared__ float largest[kThreads];
  float mine = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    mine = fmaxf(mine, fabsf(x[i] * pre));
  largest[threadIdx.x] = mine;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) largest[threadIdx.x] = fmaxf(largest[threadIdx.x], largest[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicMax(result, __float_as_uint(largest[0]));
}

// ------------------------------------------------------------------------------------------------
// The cast: one value's code, and its counts, as quantize_group (quantize.cpp) counts them.

struct CastCounts {
  unsigned int nonzero = 0, underflow = 0, overflow = 0;
};

__device__ void cast_one(float x, float pre, float scale, float unscale, float max, NumberFormat format,
                         Overflow overflow, int bytes, void* codes, int64_t at, CastCounts& counts) {
  const float value = x * pre;  // the gradient's loss scale first, as scaled_gradient() does on the CPU
  const float scaled = value * scale;
  const uint16_t code = encode_float(format, scaled, overflow);
  if (bytes == 1) {
    static_cast<uint8_t*>(codes)[at] = uint8_t(code);
  } else {
    static_cast<uint16_t*>(codes)[at] = code;
  }
  counts.nonzero += value != 0.0f;
  counts.overflow += fabsf(scaled) > max;
  counts.underflow += value != 0.0f && decode_code(format, code) * unscale == 0.0f;
}

// A block's counts, summed in shared memory, then added once to the kind's global counters.
__device__ void add_block_counts(const CastCounts& mine, unsigned long long* kind_counters) {
  __shared__ unsigned int block[kCounters];
  if (threadIdx.x == 0 && threadIdx.y == 0) block[0] = block[1] = block[2] = 0;
  __syncthreads();
  if (mine.nonzero) atomicAdd(&block[0], mine.nonzero);
  if (mine.underflow) atomicAdd(&block[1], mine.underflow);
  if (mine.overflow) atomicAdd(&block[2], mine.overflow);
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0)
    for (int c = 0; c < kCounters; c++)
      if (block[c]) atomicAdd(&kind_counters[c], (unsigned long long)block[c]);
}

__global__ void cast_kernel(void* codes, const float* x, int64_t n, NumberFormat format, Overflow overflow, float pre,
                            float scale, float max, int bytes, unsigned long long* kind_counters) {
  const float unscale = 1.0f / scale;  // exact: a power of two
  CastCounts counts;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    cast_one(x[i], pre, scale, unscale, max, format, overflow, bytes, codes, i, counts);
  add_block_counts(counts, kind_counters);
}

// The transposed cast: a 32 x 32 tile of x read along its rows into shared memory (coalesced), written
// along the transpose's rows (coalesced too). Blocks of 32 x 8 threads, each thread 4 rows of the tile.
constexpr int kTile = 32, kTileRows = 8;

__global__ void cast_transposed_kernel(void* codes, const float* x, int rows, int cols, NumberFormat format,
                                       Overflow overflow, float pre, float scale, float max, int bytes,
                                       unsigned long long* kind_counters) {
  __shared__ float tile[kTile][kTile + 1];  // +1: the column reads hit 32 different banks
  const float unscale = 1.0f / scale;
  const int r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  for (int dr = threadIdx.y; dr < kTile; dr += kTileRows) {
    const int r = r0 + dr, c = c0 + threadIdx.x;
    tile[dr][threadIdx.x] = r < rows && c < cols ? x[int64_t(r) * cols + c] : 0.0f;
  }
  __syncthreads();
  CastCounts counts;
  for (int dc = threadIdx.y; dc < kTile; dc += kTileRows) {
    const int c = c0 + dc, r = r0 + threadIdx.x;  // out(c, r) = x(r, c): the transpose has `rows` columns
    if (c < cols && r < rows)
      cast_one(tile[threadIdx.x][dc], pre, scale, unscale, max, format, overflow, bytes, codes, int64_t(c) * rows + r,
               counts);
  }
  add_block_counts(counts, kind_counters);
}

// ------------------------------------------------------------------------------------------------
// The epilogues, in fp32 as the CPU's (precision_recipe.cpp).

__global__ void forward_epilogue_kernel(float* out, const float* product, const float* bias, int64_t n, int OC,
                                        NumberFormat output) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float y = product[i];
    out[i] = round_to_format(output, bias ? y + bias[i % OC] : y);
  }
}

__global__ void accumulate_kernel(float* dst, const float* product, int64_t n, bool round, NumberFormat output,
                                  float unscale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += (round ? round_to_format(output, product[i]) : product[i]) * unscale;
}

void check_launch() { CUDA_CHECK(cudaGetLastError()); }

// ------------------------------------------------------------------------------------------------
// cuBLASLt: one plan (descriptor, layouts, the heuristic's algorithm) per distinct product, made at
// its first call and kept, so that a product of a run always runs the same algorithm (the same
// roundings) and later steps ask cuBLASLt nothing.

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

const Plan& plan_for(NumberFormat a_format, NumberFormat b_format, int M, int N, int K, bool fast_accumulation) {
  using Key = std::tuple<int, int, int, int, int, bool>;
  static std::map<Key, Plan> plans;
  const Key key{int(a_format), int(b_format), M, N, K, fast_accumulation};
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  if (format_bits(a_format) == 8) {
    const int8_t fast = fast_accumulation ? 1 : 0;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.layout_a, cuda_type(b_format), K, N, K));  // our B, transposed
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.layout_b, cuda_type(a_format), K, M, K));  // our A
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.layout_c, CUDA_R_32F, N, M, N));
  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = cuda::kCublasLtWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t choice{};
  int count = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(cuda::cublaslt(), p.op, p.layout_a, p.layout_b, p.layout_c, p.layout_c,
                                              preference, 1, &choice, &count));
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  if (count == 0)
    fatal(std::string("the recipe's product on the GPU: cuBLASLt has no kernel for ") + format_name(a_format) + " x " +
          format_name(b_format) + " (" + std::to_string(M) + " x " + std::to_string(N) + " x " + std::to_string(K) +
          ") on this GPU");
  p.algo = choice.algo;
  return plans.emplace(key, p).first->second;
}

}  // namespace

float amax(const float* x, int64_t n, float pre) {
  unsigned int* word = amax_word();
  CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof *word, cuda::stream()));
  if (n > 0) {
    amax_kernel<<<blocks_for(n), kThreads, 0, cuda::stream()>>>(x, n, pre, word);
    check_launch();
  }
  unsigned int bits = 0;
  CUDA_CHECK(cudaMemcpyAsync(&bits, word, sizeof bits, cudaMemcpyDeviceToHost, cuda::stream()));
  {
    BlockedOnDevice blocked("waiting for the GPU to find a tensor's amax");
    CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  }
  float value;
  static_assert(sizeof value == sizeof bits, "a float's bits");
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

void amax_into_slot(const float* x, int64_t n, float pre, int slot) {
  if (slot < 0 || slot >= kAmaxSlots)
    fatal("the recipe's products on the GPU: more than " + std::to_string(kAmaxSlots) + " amax histories");
  if (n == 0) return;
  amax_kernel<<<blocks_for(n), kThreads, 0, cuda::stream()>>>(x, n, pre, amax_slots() + slot);
  check_launch();
}

void drain_amax_slots(float* out, int count) {
  if (count <= 0) return;
  std::vector<unsigned int> bits(static_cast<size_t>(count));
  CUDA_CHECK(cudaMemcpyAsync(bits.data(), amax_slots(), bits.size() * sizeof(unsigned int), cudaMemcpyDeviceToHost,
                             cuda::stream()));
  CUDA_CHECK(cudaMemsetAsync(amax_slots(), 0, bits.size() * sizeof(unsigned int), cuda::stream()));
  {
    BlockedOnDevice blocked("waiting for the GPU's amaxes of the step");
    CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  }
  for (int i = 0; i < count; i++) {
    float value;
    std::memcpy(&value, &bits[size_t(i)], sizeof value);
    out[i] = std::max(out[i], value);
  }
}

const void* cast(Operand operand, const float* x, int rows, int cols, bool transposed, NumberFormat format,
                 Overflow overflow, float pre, float scale, int kind) {
  const int bytes = format_bits(format) / 8;
  const int64_t n = int64_t(rows) * cols;
  void* codes = codes_of(operand).get(size_t(n > 0 ? n : 1) * bytes);
  if (n == 0) return codes;
  const float max = float(format_max(format));
  unsigned long long* kind_counters = counters() + kind * kCounters;
  if (!transposed) {
    cast_kernel<<<blocks_for(n), kThreads, 0, cuda::stream()>>>(codes, x, n, format, overflow, pre, scale, max, bytes,
                                                                kind_counters);
  } else {
    const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, kTileRows);
    cast_transposed_kernel<<<grid, block, 0, cuda::stream()>>>(codes, x, rows, cols, format, overflow, pre, scale, max,
                                                               bytes, kind_counters);
  }
  check_launch();
  return codes;
}

const float* product(const void* a, NumberFormat a_format, const void* b, NumberFormat b_format, int M, int N, int K,
                     float factor, bool fast_accumulation) {
  if (format_bits(a_format) == 8 && (M % 16 || N % 16 || K % 16))
    fatal("the recipe's fp8 product on the GPU needs M, N and K multiples of 16 (got " + std::to_string(M) + ", " +
          std::to_string(N) + ", " + std::to_string(K) + ")");
  float* c = static_cast<float*>(product_buffer().get(size_t(M > 0 && N > 0 ? int64_t(M) * N : 1) * sizeof(float)));
  if (M == 0 || N == 0) return c;
  if (K == 0) {  // no products: zeros, as the CPU's sum of nothing
    CUDA_CHECK(cudaMemsetAsync(c, 0, size_t(M) * N * sizeof(float), cuda::stream()));
    return c;
  }
  const Plan& p = plan_for(a_format, b_format, M, N, K, fast_accumulation);
  const float beta = 0.0f;  // c is written, never read
  CUBLAS_CHECK(cublasLtMatmul(cuda::cublaslt(), p.op, &factor, b, p.layout_a, a, p.layout_b, &beta, c, p.layout_c, c,
                              p.layout_c, &p.algo, cuda::cublaslt_workspace(), cuda::kCublasLtWorkspaceBytes,
                              cuda::stream()));
  return c;
}

void forward_epilogue(float* out, const float* product, const float* bias, int N, int OC, NumberFormat output) {
  const int64_t n = int64_t(N) * OC;
  if (n == 0) return;
  forward_epilogue_kernel<<<blocks_for(n), kThreads, 0, cuda::stream()>>>(out, product, bias, n, OC, output);
  check_launch();
}

void accumulate(float* dst, const float* product, int64_t n, bool round, NumberFormat output, float unscale) {
  if (n == 0) return;
  accumulate_kernel<<<blocks_for(n), kThreads, 0, cuda::stream()>>>(dst, product, n, round, output, unscale);
  check_launch();
}

void drain_counts(int64_t nonzero[3], int64_t underflow[3], int64_t overflow[3]) {
  unsigned long long host[3 * kCounters];
  CUDA_CHECK(cudaMemcpyAsync(host, counters(), sizeof host, cudaMemcpyDeviceToHost, cuda::stream()));
  CUDA_CHECK(cudaMemsetAsync(counters(), 0, sizeof host, cuda::stream()));
  {
    BlockedOnDevice blocked("waiting for the GPU's underflow and overflow counts");
    CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  }
  for (int kind = 0; kind < 3; kind++) {
    nonzero[kind] += int64_t(host[kind * kCounters + 0]);
    underflow[kind] += int64_t(host[kind * kCounters + 1]);
    overflow[kind] += int64_t(host[kind * kCounters + 2]);
  }
}

}  // namespace recipe_cuda
