// ops_cuda.cu: the CUDA implementation of every op in ops.h (declared in ops_cuda.h), in fp32 and in
// bf16 mixed precision. Written to be read next to ops_cpu.cpp: the same ops, the same order of
// arguments, the same accumulate-into-gradients convention. Correctness and clarity first; where a
// faster kernel exists (llm.c's, FlashAttention), the comment says so.
//
// dtypes. Every kernel is a template on its element type Elem, float or bf16 (__nv_bfloat16), and
// touches that memory only through two helpers: to_float() where it loads, from_float<Elem>() where it
// stores. In between everything is fp32: sums, maxima, exponentials, layernorm statistics, AdamW
// moments. A bf16 result is therefore the fp32 computation on the bf16 inputs, rounded once (to
// nearest, ties to even) when it is stored, and an accumulating backward (+=) loads the bf16 value,
// adds in fp32 and rounds once. with_type() turns a call's run-time DType into the template argument.
// In fp32 the two helpers do nothing, so the fp32 kernels compute exactly what they did before bf16.
//
// How the work is spread over the GPU, op by op:
//   elementwise ops (embedding and position lookups, bias, GELU, residual, AdamW, ...): one thread
//       per element, in a grid-stride loop (a thread handles i, i + gridSize, ...), so any n fits any
//       grid.
//   row ops (layernorm, the causal softmax): one warp (32 threads) per row; the warp reduces with
//       __shfl_xor_sync, no shared memory. The cross-entropy softmax runs over rows of V = 50257
//       logits, too long for a warp: one block per row, reduced through shared memory; so do the
//       three stages of the vocabulary-parallel cross-entropy.
//   matrix products (matmul, attention's Q K^T and att V): cuBLAS on fp32 or bf16 operands, always
//       accumulating in fp32 (CUBLAS_COMPUTE_32F): cublasGemmEx and its strided-batched form, and for
//       matmul_forward cuBLASLt, which adds the bias in the GEMM's epilogue. The row-major to
//       column-major translation is explained above matmul_forward.
//   column sums (bias and layernorm parameter gradients): in two stages, partial sums over chunks
//       of rows into a scratch buffer, then one warp per column adds the chunks in order.
//   the token-embedding gradient: each position is linked to the next position of the same token,
//       then one thread per (token, channel) walks its token's positions in order
//       (embedding_backward); the position-embedding gradient: one thread per (position, channel)
//       adds its rows in order (position_backward).
//
// Determinism: every kernel here sums in a fixed order (no atomicAdd), so the same inputs give
// bit-identical outputs run after run, as on the CPU. cuBLAS is deterministic too, for one toolkit
// version on one GPU model. The results still differ from the CPU in the last bits (other summation
// orders, fused multiply-adds, expf/tanhf): tests/test_cuda_ops.cpp states the tolerances.
//
// Every op runs on the calling thread's stream (stream(): the compute stream, or a communicator
// worker's own, ops_cuda.h) and returns as soon as its work is queued. cuBLAS's handle is bound to the
// compute stream: only the training thread multiplies.
#include "ops/ops_cuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "base/cuda_check.h"  // CUDA_CHECK, CUBLAS_CHECK
#include "ops/memory.h"      // device_alloc: scratch buffers are counted like everything else
#include "base/watchdog.h"    // BlockedOnDevice: the compute stream may wait for a peer's collective

namespace cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarp = 32;
constexpr int kBlock = 256;                      // threads per block of most kernels
constexpr int kWarpsPerBlock = kBlock / kWarp;   // rows per block of the warp-per-row kernels
constexpr int kSoftmaxBlock = 512;               // threads per row of the cross-entropy softmax
constexpr float kLayernormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Blocks of kBlock threads for n elements, capped: the elementwise kernels loop with a grid stride,
// so a capped grid still covers every element. Callers skip n == 0 (a grid of 0 blocks is an error).
unsigned grid_for(size_t n) { return unsigned(std::min<size_t>(ceil_div(n, kBlock), 65536)); }

// Blocks for the warp-per-row kernels: kWarpsPerBlock rows per block.
unsigned grid_for_rows(int rows) { return unsigned(ceil_div(size_t(rows), kWarpsPerBlock)); }

// Launch errors (a bad configuration) show up at once through cudaGetLastError; errors inside a
// kernel (an assert, a bad address) show up at the next synchronizing call.
void check_launch() { CUDA_CHECK(cudaGetLastError()); }

// ------------------------------------------------------------------------------------------------
// Element types: loads become fp32, stores round from fp32

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

template <typename Elem>
__device__ __forceinline__ Elem from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);  // to nearest, ties to even: the rounding of bf16.h's float_to_bf16
}

template <typename Elem>
struct TypeTag {
  using type = Elem;
};

// Calls body(TypeTag<Elem>{}) with Elem the element type of dt, so that an op's launch code is written
// once, as a generic lambda that begins with `using Elem = typename decltype(tag)::type;`.
template <typename Body>
void with_type(DType dt, Body&& body) {
  if (dt == DType::F32) {
    body(TypeTag<float>{});
  } else if (dt == DType::BF16) {
    body(TypeTag<bf16>{});
  } else {
    fatal(std::string("CUDA ops take fp32 or bf16 tensors, not ") + dtype_name(dt));
  }
}

// The element type as cuBLAS names it.
cudaDataType_t blas_type(DType dt) {
  ENSURE(dt == DType::F32 || dt == DType::BF16, std::string("cuBLAS: no GEMM on ") + dtype_name(dt));
  return dt == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
}

// ------------------------------------------------------------------------------------------------
// cuBLAS and cuBLASLt, and the scratch buffers

cublasHandle_t cublas() {
  // Created once, on first use, on the device current at that moment, and never destroyed: the
  // process ends with it (destroying it from a static destructor would race the CUDA runtime's own
  // teardown at exit).
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, compute_stream()));  // the training thread's, whoever calls first
    // Plain fp32 products in fp32. (CUBLAS_TF32_TENSOR_OP_MATH would round fp32 inputs to 10 mantissa
    // bits for several times the speed: a precision choice this code does not make silently. bf16
    // operands use the tensor cores whatever the mode, accumulating in fp32 as CUBLAS_COMPUTE_32F asks.)
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    return h;
  }();
  return handle;
}

}  // namespace

// cuBLASLt, the lower-level interface behind cuBLAS: matmul_forward's bias epilogue here, and the
// recipes' products (matmul_recipe_cuda.cu). Created and kept like the cuBLAS handle; the stream is
// given to each call.
cublasLtHandle_t cublaslt() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h;
    CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  }();
  return handle;
}

// Allocated once, at a fixed size: the algorithm the heuristic picks for a shape, and with it the
// rounding, then never changes. 32 MiB is what NVIDIA recommends for Hopper.
void* cublaslt_workspace() {
  static void* workspace = device_alloc(kCublasLtWorkspaceBytes, MemCategory::Other, Device::CUDA);
  return workspace;
}

namespace {

// Scratch buffers (memory.h) of the ops below.
Scratch g_ids(Device::CUDA);       // token ids or targets copied from the host
Scratch g_partials(Device::CUDA);  // partial sums of the two-stage reductions (fp32 whatever the dtype)
Scratch g_links(Device::CUDA);     // embedding_backward's links between the positions of one token
Scratch g_segments(Device::CUDA);  // adamw_update_fused's table of segments, copied from the host

// Same message as the CPU ops (ops_cpu.cpp): an id outside the table would read other memory.
void check_id(int id, int V, const char* what) {
  ENSURE(0 <= id && id < V, std::string(what) + " id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(V) + ")");
}

// The V to check targets against where an op sees only a slice of the vocabulary and is not told its
// size (the sliced cross-entropy): only a negative target can be caught there (ops_cpu.cpp alike).
constexpr int kVocabularyUnknown = std::numeric_limits<int>::max();

// The n ids at `ids` as device memory: `ids` itself if it is device (or managed) memory, else a
// checked copy in g_ids. The copy is queued on the stream, so it lands after the kernels queued
// before it (which may still be reading the previous ids in g_ids) and before those queued after.
// cudaMemcpyAsync from pageable memory returns once it has taken the data, so the caller may
// overwrite its host buffer right away. From page-locked memory (cudaMallocHost, cudaHostRegister)
// the copy is a true DMA that runs when the stream gets to it, so there we wait for it: otherwise a
// caller refilling its buffer for the next micro-batch could change ids the copy has not read yet.
const int* device_ids(const int* ids, size_t n, int V, const char* what) {
  cudaPointerAttributes attributes;
  CUDA_CHECK(cudaPointerGetAttributes(&attributes, ids));
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) return ids;
  for (size_t i = 0; i < n; i++) check_id(ids[i], V, what);
  int* staged = static_cast<int*>(g_ids.get(n * sizeof(int)));
  CUDA_CHECK(cudaMemcpyAsync(staged, ids, n * sizeof(int), cudaMemcpyHostToDevice, stream()));
  if (attributes.type == cudaMemoryTypeHost) {
    BlockedOnDevice blocked("waiting for the GPU to take the token ids");
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  return staged;
}

// ------------------------------------------------------------------------------------------------
// Reductions inside a warp and inside a block

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly reduction: after the 5 exchanges every lane holds the result of all 32 lanes. The
// order of the additions is fixed, so the result is deterministic.
template <typename Op>
__device__ float warp_reduce(float value, Op op) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Every thread of the block gets the reduction of all the block's values. blockDim.x must be a
// multiple of 32 (at most 1024). Each warp reduces its own values, warp 0 reduces the warp results.
template <typename Op>
__device__ float block_reduce(float value, Op op, float identity) {
  __shared__ float warp_results[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  value = warp_reduce(value, op);
  __syncthreads();  // a previous call's threads have all read warp_results[0]
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  value = threadIdx.x < blockDim.x / kWarp ? warp_results[threadIdx.x] : identity;
  if (warp == 0) value = warp_reduce(value, op);
  __syncthreads();  // warp 0 has read warp_results before thread 0 overwrites its first entry
  if (threadIdx.x == 0) warp_results[0] = value;
  __syncthreads();
  return warp_results[0];
}

// ------------------------------------------------------------------------------------------------
// Kernels, in the order of ops.h

// One thread per output element (n, c): the token's row of the slice wte, or 0 for a token of
// another slice. A plain copy of the element, so bf16 stays bit-exact.
template <typename Elem>
__global__ void embedding_forward_kernel(Elem* out, const int* tokens, const Elem* wte, int N, int C, int vocab_begin,
                                         int Vl, int vocab_size) {
  const size_t n = size_t(N) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / C;
    const int c = int(i % C);
    const int token = tokens[row];
    assert(0 <= token && token < vocab_size);
    const int slice_row = token - vocab_begin;
    out[i] = 0 <= slice_row && slice_row < Vl ? wte[size_t(slice_row) * C + c] : from_float<Elem>(0.0f);
  }
}

// One thread per element (n, c): out += wpe[(first_position + n) % T], first_position = first_row % T.
// After embedding_forward this is what the fused encoder computed: in bf16 the copied token row is
// exact, so the one rounding is that of the sum, as before.
template <typename Elem>
__global__ void position_forward_kernel(Elem* out, const Elem* wpe, int N, int C, int first_position, int T) {
  const size_t n = size_t(N) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / C;
    const int c = int(i % C), t = int((first_position + row) % T);
    out[i] = from_float<Elem>(to_float(out[i]) + to_float(wpe[size_t(t) * C + c]));
  }
}

// The token-embedding gradient dwte[token - vocab_begin] += dout[i] over every position i holding a
// token of the slice, deterministically and in the CPU's order (increasing i), so that fp32 is
// bit-identical to ops_cpu.cpp, whatever the slicing of the vocabulary. Two steps, both parallel:
//   1. links: for each position i, next[i] = the next position holding the same token (or -1), and
//      first[i] = whether i is the token's first position in the batch; a token outside the slice
//      is in no chain (first[i] = false);
//   2. sums: one thread per (first position i, channel c) starts from dwte[token - vocab_begin, c],
//      walks the chain i, next[i], next[next[i]], ... adding dout[j, c] in fp32, and stores once.
// No two threads write the same address (a token has one first position), so no atomics are needed.
// (The simplest fast version, an atomicAdd per element, rounds differently from run to run; the
// version before this one, one thread per channel walking all B*T positions, had only C threads.)

// Step 1, one warp per position i: the warp compares 32 positions at a time with tokens[i] and gets
// the 32 answers as one bit mask (__ballot_sync); its lowest set bit is the nearest match. B*T is at
// most a few ten thousand, so scanning the ids (a few ten kB, from cache) is cheap.
__global__ void embedding_backward_links_kernel(int* next, int* first, const int* tokens, int N, int vocab_begin,
                                                int Vl, int vocab_size) {
  const int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= N) return;  // the whole warp leaves together, so the votes below see all 32 lanes
  const int token = tokens[i];
  assert(0 <= token && token < vocab_size);
  if (token < vocab_begin || token - vocab_begin >= Vl) {  // another slice's token: in no chain
    if (lane == 0) {
      next[i] = -1;
      first[i] = false;
    }
    return;  // the whole warp: i is the same for its 32 lanes
  }
  bool is_first = true;
  for (int base = 0; base < i && is_first; base += kWarp) {
    const int j = base + lane;
    is_first = !__any_sync(0xffffffffu, j < i && tokens[j] == token);
  }
  int next_position = -1;
  for (int base = i + 1; base < N && next_position < 0; base += kWarp) {
    const int j = base + lane;
    const unsigned matches = __ballot_sync(0xffffffffu, j < N && tokens[j] == token);
    if (matches) next_position = base + __ffs(int(matches)) - 1;
  }
  if (lane == 0) {
    next[i] = next_position;
    first[i] = is_first;
  }
}

// Step 2: block (i, y) covers channels y * blockDim.x + threadIdx.x of position i; the blocks of
// positions that are not their token's first (or whose token is another slice's) return at once.
template <typename Elem>
__global__ void embedding_backward_kernel(Elem* dwte, const Elem* dout, const int* tokens, const int* next,
                                          const int* first, int N, int C, int vocab_begin, bool stage_links) {
  // The walk along a token's positions is a chain of dependent loads, and the chain of a frequent
  // token is long (the space of byte-level text: about one position in six). So the block copies
  // next[] into shared memory (when it fits), thread 0 walks it there, writing up to kChunk positions
  // into `chain`, and then every thread adds those rows of dout with independent loads.
  constexpr int kChunk = 1024;
  extern __shared__ int staged_next[];
  __shared__ int chain[kChunk];
  __shared__ int chain_length, resume_at;
  const int i = blockIdx.x;
  if (!first[i]) return;  // the whole block: only a token's first position sums its chain
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const int* links = next;
  if (stage_links) {
    for (int k = threadIdx.x; k < N; k += blockDim.x) staged_next[k] = next[k];
    links = staged_next;
  }
  const size_t w = size_t(tokens[i] - vocab_begin) * C + c;  // the token's row of the slice
  float sum = c < C ? to_float(dwte[w]) : 0.0f;
  int j = i;
  __syncthreads();
  while (true) {
    if (threadIdx.x == 0) {
      int k = 0;
      for (; k < kChunk && j != -1; k++) {
        chain[k] = j;
        j = links[j];
      }
      chain_length = k;
      resume_at = j;
    }
    __syncthreads();
    const int n = chain_length, resume = resume_at;
    if (c < C) {
      // In chain order, as the CPU adds: bit-identical in fp32.
      for (int k = 0; k < n; k++) sum += to_float(dout[size_t(chain[k]) * C + c]);
    }
    __syncthreads();  // chain is read before thread 0 refills it
    if (resume == -1) break;
    j = resume;
  }
  if (c < C) dwte[w] = from_float<Elem>(sum);
}

// dwpe: one thread per (t, c) of the table adds the rows at position t in increasing row order, the
// CPU's: n = (t - first_position) mod T, then every T rows after (for the whole batch, first_row = 0:
// the sequences b = 0, 1, ...). A position no row holds (fewer than T rows) is left as it is.
template <typename Elem>
__global__ void position_backward_kernel(Elem* dwpe, const Elem* dout, int N, int C, int first_position, int T) {
  const size_t n = size_t(T) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int t = int(i / C), c = int(i % C);
    const int first_at_t = (t - first_position + T) % T;
    if (first_at_t >= N) continue;
    float sum = to_float(dwpe[i]);
    for (size_t row = first_at_t; row < size_t(N); row += T) sum += to_float(dout[row * C + c]);
    dwpe[i] = from_float<Elem>(sum);
  }
}

// One warp per row: two passes over the row (mean, then squared deviations), as the CPU does, in
// fp32 (the CPU sums in double).
template <typename Elem>
__global__ void layernorm_forward_kernel(Elem* out, float* mean, float* rstd, const Elem* inp, const Elem* weight,
                                         const Elem* bias, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below see all 32 lanes
  const Elem* x = inp + size_t(row) * C;

  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) sum += to_float(x[c]);
  const float m = warp_reduce(sum, Sum()) / C;
  float squared_deviations = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = to_float(x[c]) - m;
    squared_deviations += d * d;
  }
  const float s = 1.0f / sqrtf(warp_reduce(squared_deviations, Sum()) / C + kLayernormEps);

  Elem* out_row = out + size_t(row) * C;
  for (int c = lane; c < C; c += kWarp)
    out_row[c] = from_float<Elem>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// The input gradient, one warp per row (the formula and its reason: ops_cpu.cpp). Each lane keeps
// its channels' normalised input and weighted gradient in registers between the two reductions and
// the update, so memory is read once and dinp is read and written once. Rows of more than
// 32 x kRegs channels (GPT-2 has 768) take the loop without registers, which reads the row twice.
// __restrict__: dinp is never dout or inp, so the compiler may issue all loads before any store.
template <typename Elem>
__global__ void layernorm_backward_input_kernel(Elem* __restrict__ dinp, const Elem* __restrict__ dout,
                                                const Elem* __restrict__ inp, const Elem* __restrict__ weight,
                                                const float* __restrict__ mean, const float* __restrict__ rstd, int N,
                                                int C) {
  constexpr int kRegs = 32;  // channels per lane held in registers: rows up to 1024 channels
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const Elem* x = inp + size_t(row) * C;
  const Elem* dout_row = dout + size_t(row) * C;
  Elem* dinp_row = dinp + size_t(row) * C;
  const float m = mean[row], s = rstd[row];

  if (C <= kRegs * kWarp) {
    float norm[kRegs], dnorm[kRegs];
    float dnorm_sum = 0.0f, dnorm_dot_norm = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int c = lane + i * kWarp;
      norm[i] = dnorm[i] = 0.0f;
      if (c < C) {
        norm[i] = (to_float(x[c]) - m) * s;
        dnorm[i] = to_float(weight[c]) * to_float(dout_row[c]);
      }
      dnorm_sum += dnorm[i];
      dnorm_dot_norm += dnorm[i] * norm[i];
    }
    const float dnorm_mean = warp_reduce(dnorm_sum, Sum()) / C;
    const float dnorm_norm_mean = warp_reduce(dnorm_dot_norm, Sum()) / C;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int c = lane + i * kWarp;
      if (c < C)
        dinp_row[c] = from_float<Elem>(to_float(dinp_row[c]) + (dnorm[i] - dnorm_mean - norm[i] * dnorm_norm_mean) * s);
    }
    return;
  }

  float dnorm_sum = 0.0f, dnorm_dot_norm = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float norm = (to_float(x[c]) - m) * s;
    const float dnorm = to_float(weight[c]) * to_float(dout_row[c]);
    dnorm_sum += dnorm;
    dnorm_dot_norm += dnorm * norm;
  }
  const float dnorm_mean = warp_reduce(dnorm_sum, Sum()) / C;
  const float dnorm_norm_mean = warp_reduce(dnorm_dot_norm, Sum()) / C;
  for (int c = lane; c < C; c += kWarp) {
    const float norm = (to_float(x[c]) - m) * s;
    const float dnorm = to_float(weight[c]) * to_float(dout_row[c]);
    dinp_row[c] = from_float<Elem>(to_float(dinp_row[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
}

// Stage 1 of the parameter gradients of layernorm: thread c of block column blockIdx.x sums rows
// [chunk * rows_per_chunk, ...) of its column, chunk = blockIdx.y. Neighbouring threads read
// neighbouring channels, so the loads of a warp are coalesced. The partial sums stay fp32.
template <typename Elem>
__global__ void layernorm_param_partials_kernel(float* dweight_partials, float* dbias_partials, const Elem* dout,
                                                const Elem* inp, const float* mean, const float* rstd, int N, int C,
                                                int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int begin = blockIdx.y * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float dweight = 0.0f, dbias = 0.0f;
  for (int i = begin; i < end; i++) {
    const float d = to_float(dout[size_t(i) * C + c]);
    const float norm = (to_float(inp[size_t(i) * C + c]) - mean[i]) * rstd[i];
    dweight += norm * d;
    dbias += d;
  }
  dweight_partials[size_t(blockIdx.y) * C + c] = dweight;
  dbias_partials[size_t(blockIdx.y) * C + c] = dbias;
}

// Stage 1 of a column sum of mat(N,C) (the bias gradient): as above, for plain sums.
template <typename Elem>
__global__ void column_sum_partials_kernel(float* partials, const Elem* mat, int N, int C, int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int begin = blockIdx.y * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float sum = 0.0f;
  for (int i = begin; i < end; i++) sum += to_float(mat[size_t(i) * C + c]);
  partials[size_t(blockIdx.y) * C + c] = sum;
}

// Stage 2: out[c] += the chunks' partial sums of column c, in a fixed order (deterministic).
template <typename Elem>
__global__ void add_column_partials_kernel(Elem* out, const float* partials, int chunks, int C) {
  // One warp per column: lane j adds chunks j, j + 32, ... in order, then the warp's fixed butterfly
  // adds the 32 lane sums. Deterministic, and 32 loads in flight per column instead of one.
  const int c = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (c >= C) return;
  float sum = 0.0f;
  for (int k = lane; k < chunks; k += kWarp) sum += partials[size_t(k) * C + c];
  sum = warp_reduce(sum, Sum());
  if (lane == 0) out[c] = from_float<Elem>(to_float(out[c]) + sum);
}

// One thread per element: out(N,C) += bias(C), for the bias a row-parallel layer adds once, after its
// partial outputs are summed (matmul_forward adds its own bias in the GEMM's epilogue).
template <typename Elem>
__global__ void add_bias_kernel(Elem* out, const Elem* bias, int N, int C) {
  const size_t n = size_t(N) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = from_float<Elem>(to_float(out[i]) + to_float(bias[i % C]));
}

// out(N,OC) = the bias in every row; the GEMM then adds inp @ weight^T on top (beta = 1). Only for
// a bias the GEMM's own epilogue cannot read (see matmul_forward).
template <typename Elem>
__global__ void broadcast_bias_kernel(Elem* out, const Elem* bias, int N, int OC) {
  const size_t n = size_t(N) * OC;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// One warp per row of scores: row = (b * NH + h) * T + t, the scores of query t against keys
// 0..T-1. Softmax over the causal part t2 <= t; above it att = 0 and preatt = -inf, as on the CPU.
// (The GEMM before this computed the masked scores too: half the work is wasted, the price of
// using a plain GEMM. FlashAttention fuses GEMM, mask and softmax and never stores the T x T rows.)
template <typename Elem>
__global__ void causal_softmax_kernel(Elem* preatt, Elem* att, int rows, int T) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = row % T;
  Elem* p = preatt + size_t(row) * T;
  Elem* a = att + size_t(row) * T;

  float maxval = -INFINITY;  // t >= 0, so lane 0 sees at least p[0] and the maximum is finite
  for (int t2 = lane; t2 <= t; t2 += kWarp) maxval = fmaxf(maxval, to_float(p[t2]));
  maxval = warp_reduce(maxval, Max());
  float expsum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarp) expsum += expf(to_float(p[t2]) - maxval);
  const float inv_expsum = 1.0f / warp_reduce(expsum, Sum());
  for (int t2 = lane; t2 < T; t2 += kWarp) {
    if (t2 <= t) {
      a[t2] = from_float<Elem>(expf(to_float(p[t2]) - maxval) * inv_expsum);
    } else {
      a[t2] = from_float<Elem>(0.0f);
      p[t2] = from_float<Elem>(-INFINITY);
    }
  }
}

// One warp per row: dpreatt = att * (datt - <att, datt>) on the causal part (ops_cpu.cpp explains
// the formula), overwriting dpreatt (ops.h). Above the diagonal dpreatt is set to 0: the GEMMs that
// follow read the whole T x T block. (datt holds nonzero values there: the GEMM that produced it
// computed the masked entries too; they are never read.)
template <typename Elem>
__global__ void causal_softmax_backward_kernel(Elem* dpreatt, const Elem* datt, const Elem* att, int rows, int T) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = row % T;
  const Elem* a = att + size_t(row) * T;
  const Elem* da = datt + size_t(row) * T;
  Elem* dp = dpreatt + size_t(row) * T;

  float att_dot_datt = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarp) att_dot_datt += to_float(a[t2]) * to_float(da[t2]);
  att_dot_datt = warp_reduce(att_dot_datt, Sum());
  for (int t2 = lane; t2 < T; t2 += kWarp) {
    const float d = t2 <= t ? to_float(a[t2]) * (to_float(da[t2]) - att_dot_datt) : 0.0f;
    dp[t2] = from_float<Elem>(d);
  }
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
}
__device__ __forceinline__ float gelu_derivative(float x) {
  const float tanh_out = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  const float sech2 = 1.0f - tanh_out * tanh_out;
  return 0.5f * (1.0f + tanh_out) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// bf16 in 16-byte vectors: the memory-bound elementwise ops then move 8 elements per load or store
// instruction instead of one 2-byte access (the scalar kernels reach about half of the memory
// bandwidth). Same arithmetic per element as the scalar kernels, so the same results. Used where
// every pointer is 16-byte aligned and n divides by 8 (vectorizable()), as the model's buffers are.
union Bf16x8 {
  uint4 bits;
  bf16 e[8];
};

__global__ void gelu_forward_bf16x8_kernel(uint4* out, const uint4* inp, size_t vectors) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += size_t(gridDim.x) * blockDim.x) {
    Bf16x8 x, y;
    x.bits = inp[i];
#pragma unroll
    for (int k = 0; k < 8; k++) y.e[k] = __float2bfloat16(gelu(__bfloat162float(x.e[k])));
    out[i] = y.bits;
  }
}

__global__ void gelu_backward_bf16x8_kernel(uint4* dinp, const uint4* inp, const uint4* dout, size_t vectors,
                                            bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += size_t(gridDim.x) * blockDim.x) {
    Bf16x8 x, d, g;
    x.bits = inp[i];
    d.bits = dout[i];
    if (accumulate) g.bits = dinp[i];
#pragma unroll
    for (int k = 0; k < 8; k++)
      g.e[k] = __float2bfloat16((accumulate ? __bfloat162float(g.e[k]) : 0.0f) +
                                gelu_derivative(__bfloat162float(x.e[k])) * __bfloat162float(d.e[k]));
    dinp[i] = g.bits;
  }
}

__global__ void residual_forward_bf16x8_kernel(uint4* out, const uint4* a, const uint4* b, size_t vectors) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += size_t(gridDim.x) * blockDim.x) {
    Bf16x8 x, y, z;
    x.bits = a[i];
    y.bits = b[i];
#pragma unroll
    for (int k = 0; k < 8; k++) z.e[k] = __float2bfloat16(__bfloat162float(x.e[k]) + __bfloat162float(y.e[k]));
    out[i] = z.bits;
  }
}

bool vectorizable(DType dt, size_t n, std::initializer_list<const void*> pointers) {
  if (dt != DType::BF16 || n % 8 != 0) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

template <typename Elem>
__global__ void gelu_forward_kernel(Elem* out, const Elem* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    out[i] = from_float<Elem>(gelu(to_float(inp[i])));
  }
}

template <typename Elem>
__global__ void gelu_backward_kernel(Elem* dinp, const Elem* inp, const Elem* dout, size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float before = accumulate ? to_float(dinp[i]) : 0.0f;
    dinp[i] = from_float<Elem>(before + gelu_derivative(to_float(inp[i])) * to_float(dout[i]));
  }
}

template <typename Elem>
__global__ void residual_forward_kernel(Elem* out, const Elem* a, const Elem* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = from_float<Elem>(to_float(a[i]) + to_float(b[i]));
}

template <typename Elem>
__global__ void residual_backward_kernel(Elem* da, Elem* db, const Elem* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float d = to_float(dout[i]);
    da[i] = from_float<Elem>(to_float(da[i]) + d);
    db[i] = from_float<Elem>(to_float(db[i]) + d);
  }
}

// One block of kSoftmaxBlock threads per row of V logits: the threads stride over the row, then
// reduce through shared memory (block_reduce). Three passes: maximum, sum of exponentials, probs.
template <typename Elem>
__global__ void softmax_crossentropy_forward_kernel(float* losses, Elem* probs, const Elem* logits,
                                                    const int* targets, int V) {
  const int row = blockIdx.x;
  const Elem* x = logits + size_t(row) * V;
  Elem* p = probs + size_t(row) * V;

  // One pass for the maximum and the sum of exponentials together ("online softmax"): each thread
  // keeps the largest logit it has seen and its sum relative to that, rescaling the sum when the
  // maximum grows. The logits of a row (100 KB in bf16 at GPT-2's vocabulary) are then read twice,
  // not three times.
  float thread_max = -INFINITY, thread_sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float value = to_float(x[v]);
    if (value > thread_max) {
      thread_sum = thread_sum * expf(thread_max - value) + 1.0f;  // expf(-inf) = 0 the first time
      thread_max = value;
    } else {
      thread_sum += expf(value - thread_max);
    }
  }
  const float maxval = block_reduce(thread_max, Max(), -INFINITY);
  const float rescaled = thread_max == -INFINITY ? 0.0f : thread_sum * expf(thread_max - maxval);
  const float expsum = block_reduce(rescaled, Sum(), 0.0f);
  const float inv_expsum = 1.0f / expsum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] = from_float<Elem>(expf(to_float(x[v]) - maxval) * inv_expsum);
  if (threadIdx.x == 0) {
    const int target = targets[row];
    assert(0 <= target && target < V);
    // -log(probs[target]) as log(expsum) - (logit - max): finite even if probs[target] underflows,
    // and in bf16 computed in fp32, not from the rounded probability
    losses[row] = logf(expsum) - (to_float(x[target]) - maxval);
  }
}

// One thread per logit: dlogits = probs * dloss, minus dloss at the target (the CPU's two steps),
// overwriting dlogits (ops.h): the old values are never read. With a slice of the vocabulary the
// target's column is target - vocab_begin, which no v matches where another slice holds the target.
template <typename Elem>
__global__ void softmax_crossentropy_backward_kernel(Elem* dlogits, const Elem* probs, const int* targets,
                                                     float dloss, int V, int vocab_begin) {
  // One block per row: the row and its target come from the block index, with no division per
  // element (a 64-bit i / V costs more than the rest of this kernel's arithmetic).
  const size_t row = blockIdx.x;
  const int target_column = targets[row] - vocab_begin;  // targets >= 0 and vocab_begin >= 0: no overflow
  const Elem* p = probs + row * V;
  Elem* d = dlogits + row * V;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float value = to_float(p[v]) * dloss;
    if (v == target_column) value -= dloss;
    d[v] = from_float<Elem>(value);
  }
}

// The classifier, version 2 (llm.c's fused_classifier): the forward above and the backward in one
// kernel, which writes dlogits over the logits. The (N,V) probabilities never exist, and the row is read
// twice and written once instead of read three times and written twice: at GPT-2's vocabulary the
// largest activation of the step, gone. Each dlogit is computed in fp32 from the logit and rounded
// once (version 1 rounds the probability to bf16 first). Version 1 stays, as the lesson's first step
// and for the vocabulary-parallel path, which needs the probabilities between its all-reduces.
template <typename Elem>
__global__ void fused_classifier_kernel(Elem* logits, float* losses, const int* targets, float dloss, int V) {
  const int row = blockIdx.x;
  Elem* x = logits + size_t(row) * V;
  float thread_max = -INFINITY, thread_sum = 0.0f;  // the online maximum and sum, as version 1
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float value = to_float(x[v]);
    if (value > thread_max) {
      thread_sum = thread_sum * expf(thread_max - value) + 1.0f;
      thread_max = value;
    } else {
      thread_sum += expf(value - thread_max);
    }
  }
  const float maxval = block_reduce(thread_max, Max(), -INFINITY);
  const float rescaled = thread_max == -INFINITY ? 0.0f : thread_sum * expf(thread_max - maxval);
  const float expsum = block_reduce(rescaled, Sum(), 0.0f);
  const int target = targets[row];
  assert(0 <= target && target < V);
  if (threadIdx.x == 0) losses[row] = logf(expsum) - (to_float(x[target]) - maxval);
  __syncthreads();  // the target's logit is read before any thread overwrites it
  const float inv_expsum = 1.0f / expsum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float value = expf(to_float(x[v]) - maxval) * inv_expsum * dloss;
    if (v == target) value -= dloss;
    x[v] = from_float<Elem>(value);
  }
}

// The vocabulary-parallel cross-entropy (ops.h), softmax_crossentropy_forward_kernel cut where the
// ranks combine their rows: one block per row of the slice, reduced with block_reduce. Without the
// all-reduced maximum the exponentials cannot start, so the maximum has its own pass (no online
// softmax). In bf16 the unnormalised exponentials are stored in bf16 between stages 2 and 3, so the
// probabilities are rounded twice, not once (each rounding moves a value by at most 2^-8 of it).

// Stage 1, kSoftmaxBlock threads per row: the row's largest logit; the target's logit where the slice
// holds the target, else 0, so that the sum over the slices is the target's logit.
template <typename Elem>
__global__ void crossentropy_shard_max_kernel(float* row_max, float* target_logit, const Elem* logits,
                                              const int* targets, int Vl, int vocab_begin) {
  const int row = blockIdx.x;
  const Elem* x = logits + size_t(row) * Vl;
  float thread_max = -INFINITY;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) thread_max = fmaxf(thread_max, to_float(x[v]));
  const float maxval = block_reduce(thread_max, Max(), -INFINITY);
  if (threadIdx.x == 0) {
    const int target = targets[row];
    assert(target >= 0);
    const int column = target - vocab_begin;
    row_max[row] = maxval;
    target_logit[row] = 0 <= column && column < Vl ? to_float(x[column]) : 0.0f;
  }
}

// Stage 2, kSoftmaxBlock threads per row: probs = exp(logits - row_max), unnormalised, and their sum
// over the slice, of the fp32 exponentials (not of their bf16 roundings), as the unsplit kernel sums.
template <typename Elem>
__global__ void crossentropy_shard_exp_kernel(Elem* probs, float* row_sum, const Elem* logits, const float* row_max,
                                              int Vl) {
  const int row = blockIdx.x;
  const Elem* x = logits + size_t(row) * Vl;
  Elem* p = probs + size_t(row) * Vl;
  const float maxval = row_max[row];
  float thread_sum = 0.0f;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) {
    const float e = expf(to_float(x[v]) - maxval);
    p[v] = from_float<Elem>(e);
    thread_sum += e;
  }
  const float expsum = block_reduce(thread_sum, Sum(), 0.0f);
  if (threadIdx.x == 0) row_sum[row] = expsum;
}

// Stage 3, one block per row (no reduction: kBlock threads): probs /= row_sum, and the loss as the
// unsplit kernel computes it, log(expsum) - (target logit - max).
template <typename Elem>
__global__ void crossentropy_shard_finish_kernel(float* losses, Elem* probs, const float* row_max,
                                                 const float* row_sum, const float* target_logit, int Vl) {
  const int row = blockIdx.x;
  Elem* p = probs + size_t(row) * Vl;
  const float expsum = row_sum[row];
  const float inv_expsum = 1.0f / expsum;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) p[v] = from_float<Elem>(to_float(p[v]) * inv_expsum);
  if (threadIdx.x == 0) losses[row] = logf(expsum) - (target_logit[row] - row_max[row]);
}

template <typename Elem>
__global__ void add_inplace_kernel(Elem* dst, const Elem* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<Elem>(to_float(dst[i]) + to_float(src[i]));
}

template <typename Elem>
__global__ void scale_inplace_kernel(Elem* x, float factor, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = from_float<Elem>(to_float(x[i]) * factor);
}

template <typename Dst, typename Src>
__global__ void convert_kernel(Dst* dst, const Src* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<Dst>(to_float(src[i]));
}

// partials[block] = the block's sum of x (or of x^2): fp32 per thread, then a block reduction.
template <typename Elem, bool kSquares>
__global__ void partial_sums_kernel(float* partials, const Elem* x, size_t n) {
  float sum = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float value = to_float(x[i]);
    sum += kSquares ? value * value : value;
  }
  sum = block_reduce(sum, Sum(), 0.0f);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One element's AdamW step, shared by both versions below so that they agree bit for bit. The bias
// corrections 1 - beta^step are computed once on the host, as on the CPU. The weight w is the fp32
// master copy where there is one (param then receives w rounded), else param itself.
template <typename Elem>
__device__ inline void adamw_element(size_t i, Elem* param, float* master, const Elem* grad, float* m, float* v,
                                     float lr, float beta1, float beta2, float bias_correction1,
                                     float bias_correction2, float eps, float weight_decay, float grad_scale) {
  const float g = to_float(grad[i]) * grad_scale;
  const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
  const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = m_i;
  v[i] = v_i;
  const float m_hat = m_i / bias_correction1;
  const float v_hat = v_i / bias_correction2;
  const float w = master ? master[i] : to_float(param[i]);
  const float updated = w - lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * w);
  if (master) master[i] = updated;
  param[i] = from_float<Elem>(updated);
}

template <typename Elem>
__global__ void adamw_kernel(Elem* param, float* master, const Elem* grad, float* m, float* v, size_t n, float lr,
                             float beta1, float beta2, float bias_correction1, float bias_correction2, float eps,
                             float weight_decay, float grad_scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    adamw_element(i, param, master, grad, m, v, lr, beta1, beta2, bias_correction1, bias_correction2, eps, weight_decay,
                  grad_scale);
  }
}

// AdamW, version 2: one launch for a whole flat range of parameters that differ only in their weight
// decay, where version 1 (above, launched per tensor by optimizer.cpp) takes ~150 launches for GPT-2
// 124M. segment_ends (S, ascending, the last = n) cut the range; segment s decays iff decays[s] != 0.
// Each element finds its segment by binary search (8 steps for 150 segments) and then computes
// adamw_element, as version 1 does.
template <typename Elem>
__global__ void adamw_fused_kernel(Elem* param, float* master, const Elem* grad, float* m, float* v, size_t n,
                                   const int64_t* segment_ends, const int64_t* decays, int segments, float lr,
                                   float beta1, float beta2, float bias_correction1, float bias_correction2,
                                   float eps, float weight_decay, float grad_scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    int lo = 0, hi = segments - 1;  // the first segment whose end lies beyond i
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (segment_ends[mid] > int64_t(i)) hi = mid;
      else lo = mid + 1;
    }
    const float decay = decays[lo] ? weight_decay : 0.0f;
    adamw_element(i, param, master, grad, m, v, lr, beta1, beta2, bias_correction1, bias_correction2, eps, decay,
                  grad_scale);
  }
}

// How a column sum over N rows is split: `chunks` chunks of `rows_per_chunk` rows (the last one may
// be shorter), at most 256 of them, each of at least 32 rows. Depends on N only, so the order of the
// additions, and with it the result, is the same every time.
struct RowChunks {
  int chunks;
  int rows_per_chunk;
};
RowChunks plan_row_chunks(int N) {
  const int chunks = int(std::max<size_t>(1, std::min<size_t>(ceil_div(size_t(N), 32), 256)));
  const int rows_per_chunk = int(ceil_div(size_t(N), size_t(chunks)));
  return {int(ceil_div(size_t(N), size_t(rows_per_chunk))), rows_per_chunk};
}

// Sum of x (or of its squares) with fp32 partial sums: each thread adds a strided subset, each block
// reduces its threads, and the host adds the (at most 1024) block sums in double.
double sum_on_device(DType dt, const void* x, size_t n, bool squares) {
  if (n == 0) return 0.0;
  const unsigned blocks = unsigned(std::min<size_t>(ceil_div(n, kBlock), 1024));
  float* partials = static_cast<float*>(g_partials.get(blocks * sizeof(float)));
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    const Elem* values = static_cast<const Elem*>(x);
    if (squares) {
      partial_sums_kernel<Elem, true><<<blocks, kBlock, 0, stream()>>>(partials, values, n);
    } else {
      partial_sums_kernel<Elem, false><<<blocks, kBlock, 0, stream()>>>(partials, values, n);
    }
  });
  check_launch();
  std::vector<float> host(blocks);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), partials, blocks * sizeof(float), cudaMemcpyDeviceToHost, stream()));
  {
    BlockedOnDevice blocked("waiting for the GPU to sum a tensor");
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  double total = 0.0;
  for (float p : host) total += p;
  return total;
}

// ------------------------------------------------------------------------------------------------
// GEMM calls, in column-major terms (see "matmul through cuBLAS" below): C = alpha op(A) op(B) +
// beta C, every matrix of dtype dt, the products accumulated in fp32 (CUBLAS_COMPUTE_32F) and C
// rounded once at the end. The batched form runs `batch` such products, each operand moving by its
// stride (in elements) from one to the next.

void gemm(DType dt, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha,
          const void* A, int lda, const void* B, int ldb, float beta, void* C, int ldc) {
  const cudaDataType_t type = blas_type(dt);
  CUBLAS_CHECK(cublasGemmEx(cublas(), transa, transb, m, n, k, &alpha, A, type, lda, B, type, ldb, &beta, C, type,
                            ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_batched(DType dt, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha,
                  const void* A, int lda, long long stride_a, const void* B, int ldb, long long stride_b, float beta,
                  void* C, int ldc, long long stride_c, int batch) {
  const cudaDataType_t type = blas_type(dt);
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas(), transa, transb, m, n, k, &alpha, A, type, lda, stride_a, B, type,
                                          ldb, stride_b, &beta, C, type, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
}

// The largest power of two, at most 256, that divides the address. cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and could pick a kernel that cannot read a view
// starting in the middle of a buffer.
uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// D(m x n) = A^T B + beta D (+ bias(m) added to every column when bias is not null), column-major,
// A (k x m) with leading dimension k, B (k x n) with leading dimension k, D with leading dimension m,
// all of dtype dt, accumulated in fp32: the one GEMM of matmul_forward, through cuBLASLt.
void lt_matmul_tn(DType dt, int m, int n, int k, const void* A, const void* B, const void* bias, float beta, void* D) {
  const cudaDataType_t type = blas_type(dt);
  cublasLtMatmulDesc_t desc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // alpha, beta: fp32
  const cublasOperation_t transpose = CUBLAS_OP_T, as_stored = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &as_stored, sizeof as_stored));
  // The bias epilogue adds bias[row] to every column of D (a row of out in row-major terms), in fp32,
  // before the one rounding to dt; the bias has D's dtype.
  const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));

  cublasLtMatrixLayout_t a_layout, b_layout, d_layout;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout, type, k, m, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout, type, k, n, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_layout, type, m, n, m));

  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = kCublasLtWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof workspace_bytes));
  const uint32_t a_alignment = alignment_of(A), b_alignment = alignment_of(B), d_alignment = alignment_of(D);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                    &a_alignment, sizeof a_alignment));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                    &b_alignment, sizeof b_alignment));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                    &d_alignment, sizeof d_alignment));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                    &d_alignment, sizeof d_alignment));

  // The heuristic's first choice. It depends only on the shapes, dtypes, epilogue, alignments and
  // workspace size, so a given matmul of a run always gets the same algorithm, and the same
  // roundings. Asking costs tens of microseconds of host time, about what the GEMM itself takes on
  // the GPU, so the answer is kept per key (a model has a handful of distinct matmuls).
  using Key = std::tuple<int, int, int, int, bool, uint32_t, uint32_t, uint32_t>;
  static std::map<Key, cublasLtMatmulAlgo_t> chosen;
  const Key key{int(dt), m, n, k, bias != nullptr, a_alignment, b_alignment, d_alignment};
  auto at = chosen.find(key);
  if (at == chosen.end()) {
    cublasLtMatmulHeuristicResult_t choice;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(cublaslt(), desc, a_layout, b_layout, d_layout, d_layout, preference,
                                                1, &choice, &found));
    ENSURE(found > 0, "matmul_forward: cuBLASLt has no algorithm for " + std::string(dtype_name(dt)) + " (" +
                          std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) + ")");
    at = chosen.emplace(key, choice.algo).first;
  }
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(cublaslt(), desc, &alpha, A, a_layout, B, b_layout, &beta, D, d_layout, D, d_layout,
                              &at->second, cublaslt_workspace(), kCublasLtWorkspaceBytes, stream()));

  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d_layout));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(b_layout));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(a_layout));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// The stream

cudaStream_t compute_stream() {
  // A static local is initialised once, thread-safely, on first use.
  static cudaStream_t compute = [] {
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));  // default flags: ordered with the legacy default stream
    return s;
  }();
  return compute;
}

namespace {
thread_local cudaStream_t t_stream = nullptr;  // use_stream_on_this_thread's; nullptr: the compute stream
}  // namespace

cudaStream_t stream() { return t_stream ? t_stream : compute_stream(); }

void use_stream_on_this_thread(cudaStream_t s) { t_stream = s; }

void synchronize() {
  BlockedOnDevice blocked("waiting for the GPU's compute stream");
  CUDA_CHECK(cudaStreamSynchronize(stream()));
}

size_t shared_memory_per_block() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();  // clear the error: having no GPU is an answer here, not a failure
    return 0;
  }
  return size_t(bytes);
}

// ------------------------------------------------------------------------------------------------
// token and position embeddings (ops.cpp's encoder is these with the whole table and first_row 0)

void embedding_forward(DType dt, void* out, const int* tokens, const void* wte, int N, int C, int vocab_begin, int Vl,
                       int vocab_size) {
  const size_t n = size_t(N) * C;
  if (n == 0) return;
  const int* ids = device_ids(tokens, size_t(N), vocab_size, "token");
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    embedding_forward_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(
        static_cast<Elem*>(out), ids, static_cast<const Elem*>(wte), N, C, vocab_begin, Vl, vocab_size);
  });
  check_launch();
}

void embedding_backward(DType dt, void* dwte, const void* dout, const int* tokens, int N, int C, int vocab_begin,
                        int Vl, int vocab_size) {
  if (size_t(N) * C == 0) return;
  const int* ids = device_ids(tokens, size_t(N), vocab_size, "token");
  int* next = static_cast<int*>(g_links.get(2 * size_t(N) * sizeof(int)));
  int* first = next + N;
  embedding_backward_links_kernel<<<grid_for_rows(N), kBlock, 0, stream()>>>(next, first, ids, N, vocab_begin, Vl,
                                                                             vocab_size);
  check_launch();
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    const dim3 grid(unsigned(N), unsigned(ceil_div(C, kBlock)));
    // next[] staged in shared memory where it fits next to the kernel's own (chain, 4 KB) under the
    // GPU's per-block limit (99 KB on sm_86/89, 227 KB on an H100: 24k or 56k positions); beyond,
    // the walk reads it in place.
    const size_t links_bytes = size_t(N) * sizeof(int);
    const bool stage_links = links_bytes + 8 * 1024 <= shared_memory_per_block();
    const size_t shared = stage_links ? links_bytes : 0;
    CUDA_CHECK(cudaFuncSetAttribute(embedding_backward_kernel<Elem>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(shared)));
    embedding_backward_kernel<Elem><<<grid, kBlock, shared, stream()>>>(
        static_cast<Elem*>(dwte), static_cast<const Elem*>(dout), ids, next, first, N, C, vocab_begin, stage_links);
    check_launch();
  });
}

void position_forward(DType dt, void* out, const void* wpe, int N, int C, int64_t first_row, int T) {
  const size_t n = size_t(N) * C;
  if (n == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    position_forward_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(
        static_cast<Elem*>(out), static_cast<const Elem*>(wpe), N, C, int(first_row % T), T);
  });
  check_launch();
}

void position_backward(DType dt, void* dwpe, const void* dout, int N, int C, int64_t first_row, int T) {
  if (size_t(N) * C == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    position_backward_kernel<Elem><<<grid_for(size_t(T) * C), kBlock, 0, stream()>>>(
        static_cast<Elem*>(dwpe), static_cast<const Elem*>(dout), N, C, int(first_row % T), T);
  });
  check_launch();
}

// ------------------------------------------------------------------------------------------------
// layernorm

void layernorm_forward(DType dt, void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C) {
  if (N == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    layernorm_forward_kernel<Elem><<<grid_for_rows(N), kBlock, 0, stream()>>>(
        static_cast<Elem*>(out), mean, rstd, static_cast<const Elem*>(inp), static_cast<const Elem*>(weight),
        static_cast<const Elem*>(bias), N, C);
  });
  check_launch();
}

void layernorm_backward(DType dt, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, const float* mean, const float* rstd, int N, int C) {
  if (N == 0) return;
  // dweight and dbias: sums over the N rows, in two deterministic stages (see the kernels).
  const RowChunks plan = plan_row_chunks(N);
  float* partials = static_cast<float*>(g_partials.get(2 * size_t(plan.chunks) * C * sizeof(float)));
  float* dweight_partials = partials;
  float* dbias_partials = partials + size_t(plan.chunks) * C;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    const Elem* dout_ = static_cast<const Elem*>(dout);
    const Elem* inp_ = static_cast<const Elem*>(inp);
    layernorm_backward_input_kernel<Elem><<<grid_for_rows(N), kBlock, 0, stream()>>>(
        static_cast<Elem*>(dinp), dout_, inp_, static_cast<const Elem*>(weight), mean, rstd, N, C);
    check_launch();
    const dim3 grid(unsigned(ceil_div(C, kBlock)), unsigned(plan.chunks));
    layernorm_param_partials_kernel<Elem><<<grid, kBlock, 0, stream()>>>(dweight_partials, dbias_partials, dout_,
                                                                         inp_, mean, rstd, N, C,
                                                                         plan.rows_per_chunk);
    check_launch();
    const unsigned columns = grid_for_rows(C);  // a warp per column
    add_column_partials_kernel<Elem><<<columns, kBlock, 0, stream()>>>(static_cast<Elem*>(dweight),
                                                                       dweight_partials, plan.chunks, C);
    check_launch();
    add_column_partials_kernel<Elem><<<columns, kBlock, 0, stream()>>>(static_cast<Elem*>(dbias), dbias_partials,
                                                                       plan.chunks, C);
    check_launch();
  });
}

// ------------------------------------------------------------------------------------------------
// matmul through cuBLAS
//
// cuBLAS follows Fortran BLAS: matrices are column-major. Our tensors are row-major. The bridge: a
// row-major (R x K) matrix with row stride ld is, byte for byte, a column-major (K x R) matrix with
// leading dimension ld, i.e. its transpose. So to get a row-major product out = X @ Y, ask cuBLAS
// for the column-major out^T = Y^T @ X^T: swap the operands, and read each "transpose" flag in the
// calls below as "this operand is used as stored (N) or transposed (T) in that column-major view".
//
//   forward   out(N,OC) = inp(N,C) @ weight(OC,C)^T   ->  out^T(OC,N) = weight @ inp^T
//             = gemm(T, N, m=OC, n=N, k=C, weight (ld C), inp (ld C), out (ld OC))
//   backward  dinp(N,C) += dout(N,OC) @ weight(OC,C)  ->  dinp^T(C,N) = weight^T @ dout^T
//             = gemm(N, N, m=C, n=N, k=OC, weight (ld C), dout (ld OC), dinp (ld C)), beta 1
//             dweight(OC,C) += dout^T @ inp(N,C)      ->  dweight^T(C,OC) = inp^T @ dout
//             = gemm(N, T, m=C, n=OC, k=N, inp (ld C), dout (ld OC), dweight (ld C)), beta 1
// (In each, "weight" in column-major terms is the (C x OC) matrix weight^T, and so on.)
//
// The forward goes through cuBLASLt, whose epilogue adds the bias while the product is still in
// fp32 registers: the bias costs no pass over out, and in bf16 out is rounded once, after the bias.
// In out^T's column-major view the bias belongs to each row m (an output channel) of every column
// n (a position), which is what CUBLASLT_EPILOGUE_BIAS broadcasts. The epilogue reads the bias with
// vector loads, so a bias that is not 16-byte aligned (a view at an odd offset) takes the older way:
// out starts as the bias in every row and the GEMM adds the product on top (beta = 1).

void matmul_forward(DType dt, void* out, const void* inp, const void* weight, const void* bias, int N, int C,
                    int OC) {
  if (N == 0 || OC == 0) return;
  const bool bias_in_epilogue = bias != nullptr && alignment_of(bias) >= 16;
  // Without a bias in out, beta = 0 tells cuBLAS not to read `out` at all, so stale contents (even
  // NaN) cannot leak in.
  float beta = 0.0f;
  if (bias != nullptr && !bias_in_epilogue) {
    with_type(dt, [&](auto tag) {
      using Elem = typename decltype(tag)::type;
      broadcast_bias_kernel<Elem><<<grid_for(size_t(N) * OC), kBlock, 0, stream()>>>(
          static_cast<Elem*>(out), static_cast<const Elem*>(bias), N, OC);
    });
    check_launch();
    beta = 1.0f;
  }
  lt_matmul_tn(dt, OC, N, C, weight, inp, bias_in_epilogue ? bias : nullptr, beta, out);
}

// matmul_backward (ops.cpp) is these two, in this order: the same GEMMs as one call would make.
void matmul_backward_input(DType dt, void* dinp, const void* dout, const void* weight, int N, int C, int OC,
                           bool accumulate) {
  if (N == 0 || C == 0) return;
  if (OC == 0) return accumulate ? void() : fill_zero(dt, dinp, size_t(N) * C);  // an empty sum
  // alpha = 1, and beta = 1 because backward accumulates (0 where the caller asked to overwrite)
  gemm(dt, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, weight, C, dout, OC, accumulate ? 1.0f : 0.0f, dinp, C);
}

void matmul_backward_weight(DType dt, void* dweight, void* dbias, const void* dout, const void* inp, int N, int C,
                            int OC) {
  if (N == 0 || C == 0 || OC == 0) return;
  gemm(dt, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, C);
  if (dbias) bias_backward(dt, dbias, dout, N, OC);
}

void add_bias(DType dt, void* out, const void* bias, int N, int C) {
  const size_t n = size_t(N) * C;
  if (n == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    add_bias_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(static_cast<Elem*>(out),
                                                                static_cast<const Elem*>(bias), N, C);
  });
  check_launch();
}

void bias_backward(DType dt, void* dbias, const void* dout, int N, int C) {
  if (size_t(N) * C == 0) return;
  // A sum over the N rows, in two deterministic stages (see the kernels).
  const RowChunks plan = plan_row_chunks(N);
  float* partials = static_cast<float*>(g_partials.get(size_t(plan.chunks) * C * sizeof(float)));
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    const dim3 grid(unsigned(ceil_div(C, kBlock)), unsigned(plan.chunks));
    column_sum_partials_kernel<Elem><<<grid, kBlock, 0, stream()>>>(partials, static_cast<const Elem*>(dout), N, C,
                                                                    plan.rows_per_chunk);
    check_launch();
    add_column_partials_kernel<Elem><<<grid_for_rows(C), kBlock, 0, stream()>>>(static_cast<Elem*>(dbias), partials,
                                                                                plan.chunks, C);
    check_launch();
  });
}

// ------------------------------------------------------------------------------------------------
// attention: the CPU's algorithm (scores, causal softmax, weighted sum) with the two products done
// by cuBLAS, for all heads at once.
//
// For one sequence b and head h, with hs = C/NH channels per head, the row-major operands are
//   Q, K, V (T x hs): qkv + b*T*3C + {0, C, 2C} + h*hs, row stride 3C
//   scores (T x T):   preatt/att + (b*NH + h)*T*T, row stride T
//   out (T x hs):     out + b*T*C + h*hs, row stride C
// Within one b, moving to the next head moves every operand by a fixed stride (hs for Q, K, V and
// out; T*T for the scores), which is what the strided-batched GEMM wants: one call covers the NH
// heads of one sequence, a loop covers the B sequences. (llm.c instead first permutes qkv into
// (B,NH,T,hs) so that one call covers everything; this avoids that copy and its buffer.)
// The row-major/column-major translation is the one explained above matmul_forward:
//   preatt = scale * Q @ K^T   has the form of matmul_forward's   out = inp @ weight^T
//   out    = att @ V           ->  out^T(hs,T) = V^T @ att^T   (both operands as stored)
// In bf16 the scores are stored in bf16 between the steps (each rounded once), as activations are.

void attention_forward(DType dt, void* out, void* preatt, void* att, const void* qkv, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const int C3 = 3 * C, hs = C / NH;
  const long long TT = (long long)T * T;
  const float scale = 1.0f / sqrtf(float(hs));
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    const Elem* qkv_ = static_cast<const Elem*>(qkv);
    Elem* preatt_ = static_cast<Elem*>(preatt);
    Elem* att_ = static_cast<Elem*>(att);
    for (int b = 0; b < B; b++) {
      const Elem* q = qkv_ + size_t(b) * T * C3;
      const Elem* k = q + C;
      gemm_batched(dt, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, C3, hs, q, C3, hs, 0.0f,
                   preatt_ + size_t(b) * NH * TT, T, TT, NH);
    }
    const int rows = B * NH * T;
    causal_softmax_kernel<Elem><<<grid_for_rows(rows), kBlock, 0, stream()>>>(preatt_, att_, rows, T);
    check_launch();
    for (int b = 0; b < B; b++) {
      const Elem* v = qkv_ + size_t(b) * T * C3 + 2 * C;
      gemm_batched(dt, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, hs, att_ + size_t(b) * NH * TT, T, TT, 0.0f,
                   static_cast<Elem*>(out) + size_t(b) * T * C, C, hs, NH);
    }
  });
}

// Backward, per (b, h), in row-major terms:
//   datt     = dout @ V^T                (T x T)   form of matmul_forward; beta 0: overwritten
//   dV      += att^T @ dout              (T x hs)  ->  dV^T = dout^T @ att, att used transposed
//   dpreatt  = softmax backward of datt  (kernel, causal part; zeros above the diagonal)
//   dQ      += scale * dpreatt @ K       (T x hs)  ->  dQ^T = K^T @ dpreatt^T, as stored
//   dK      += scale * dpreatt^T @ Q     (T x hs)  ->  dK^T = Q^T @ dpreatt, dpreatt transposed
// The entries of att and dpreatt above the diagonal are 0, so the full T x T products add exactly
// the causal sums of the CPU loops. datt and dpreatt are written before they are read, so their
// contents on entry do not matter (ops.h): the model need not zero them.
void attention_backward(DType dt, void* dqkv, void* dpreatt, void* datt, const void* dout, const void* qkv,
                        const void* att, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const int C3 = 3 * C, hs = C / NH;
  const long long TT = (long long)T * T;
  const float scale = 1.0f / sqrtf(float(hs));
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    const Elem* qkv_ = static_cast<const Elem*>(qkv);
    Elem* dqkv_ = static_cast<Elem*>(dqkv);
    Elem* datt_ = static_cast<Elem*>(datt);
    Elem* dpreatt_ = static_cast<Elem*>(dpreatt);
    const Elem* att_ = static_cast<const Elem*>(att);
    for (int b = 0; b < B; b++) {
      const Elem* v = qkv_ + size_t(b) * T * C3 + 2 * C;
      Elem* dv = dqkv_ + size_t(b) * T * C3 + 2 * C;
      const Elem* dout_b = static_cast<const Elem*>(dout) + size_t(b) * T * C;
      const Elem* att_b = att_ + size_t(b) * NH * TT;
      gemm_batched(dt, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, C3, hs, dout_b, C, hs, 0.0f,
                   datt_ + size_t(b) * NH * TT, T, TT, NH);
      gemm_batched(dt, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dout_b, C, hs, att_b, T, TT, 1.0f, dv, C3, hs, NH);
    }
    const int rows = B * NH * T;
    causal_softmax_backward_kernel<Elem><<<grid_for_rows(rows), kBlock, 0, stream()>>>(dpreatt_, datt_, att_, rows,
                                                                                       T);
    check_launch();
    for (int b = 0; b < B; b++) {
      const Elem* q = qkv_ + size_t(b) * T * C3;
      const Elem* k = q + C;
      Elem* dq = dqkv_ + size_t(b) * T * C3;
      Elem* dk = dq + C;
      const Elem* dpreatt_b = dpreatt_ + size_t(b) * NH * TT;
      gemm_batched(dt, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, C3, hs, dpreatt_b, T, TT, 1.0f, dq, C3, hs, NH);
      gemm_batched(dt, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, C3, hs, dpreatt_b, T, TT, 1.0f, dk, C3, hs, NH);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// GELU and the residual connection

void gelu_forward(DType dt, void* out, const void* inp, size_t n) {
  if (n == 0) return;
  if (vectorizable(dt, n, {out, inp})) {
    gelu_forward_bf16x8_kernel<<<grid_for(n / 8), kBlock, 0, stream()>>>(static_cast<uint4*>(out),
                                                                        static_cast<const uint4*>(inp), n / 8);
    return check_launch();
  }
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    gelu_forward_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(static_cast<Elem*>(out),
                                                                    static_cast<const Elem*>(inp), n);
  });
  check_launch();
}

void gelu_backward(DType dt, void* dinp, const void* inp, const void* dout, size_t n, bool accumulate) {
  if (n == 0) return;
  if (vectorizable(dt, n, {dinp, inp, dout})) {
    gelu_backward_bf16x8_kernel<<<grid_for(n / 8), kBlock, 0, stream()>>>(
        static_cast<uint4*>(dinp), static_cast<const uint4*>(inp), static_cast<const uint4*>(dout), n / 8,
        accumulate);
    return check_launch();
  }
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    gelu_backward_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(
        static_cast<Elem*>(dinp), static_cast<const Elem*>(inp), static_cast<const Elem*>(dout), n, accumulate);
  });
  check_launch();
}

void residual_forward(DType dt, void* out, const void* a, const void* b, size_t n) {
  if (n == 0) return;
  if (vectorizable(dt, n, {out, a, b})) {
    residual_forward_bf16x8_kernel<<<grid_for(n / 8), kBlock, 0, stream()>>>(
        static_cast<uint4*>(out), static_cast<const uint4*>(a), static_cast<const uint4*>(b), n / 8);
    return check_launch();
  }
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    residual_forward_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(
        static_cast<Elem*>(out), static_cast<const Elem*>(a), static_cast<const Elem*>(b), n);
  });
  check_launch();
}

void residual_backward(DType dt, void* da, void* db, const void* dout, size_t n) {
  if (n == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    residual_backward_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(
        static_cast<Elem*>(da), static_cast<Elem*>(db), static_cast<const Elem*>(dout), n);
  });
  check_launch();
}

// ------------------------------------------------------------------------------------------------
// softmax + cross-entropy

void softmax_crossentropy_forward(DType dt, float* losses, void* probs, const void* logits, const int* targets,
                                  int N, int V) {
  if (N == 0) return;
  const int* ids = device_ids(targets, size_t(N), V, "target");
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    softmax_crossentropy_forward_kernel<Elem><<<unsigned(N), kSoftmaxBlock, 0, stream()>>>(
        losses, static_cast<Elem*>(probs), static_cast<const Elem*>(logits), ids, V);
  });
  check_launch();
}

void fused_classifier(DType dt, void* logits, float* losses, const int* targets, float dloss, int N, int V) {
  if (N == 0) return;
  const int* ids = device_ids(targets, size_t(N), V, "target");
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    fused_classifier_kernel<Elem><<<unsigned(N), kSoftmaxBlock, 0, stream()>>>(static_cast<Elem*>(logits), losses, ids,
                                                                               dloss, V);
  });
  check_launch();
}

void softmax_crossentropy_backward(DType dt, void* dlogits, const void* probs, const int* targets, float dloss,
                                   int N, int V, int vocab_begin) {
  if (size_t(N) * V == 0) return;
  // A slice does not know the vocabulary's size: host targets are checked to be >= 0 only.
  const int* ids = device_ids(targets, size_t(N), kVocabularyUnknown, "target");
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    softmax_crossentropy_backward_kernel<Elem><<<unsigned(N), kBlock, 0, stream()>>>(
        static_cast<Elem*>(dlogits), static_cast<const Elem*>(probs), ids, dloss, V, vocab_begin);
  });
  check_launch();
}

// The vocabulary-parallel cross-entropy: the caller all-reduces row_max, target_logit and row_sum
// between the stages.

void crossentropy_shard_max(DType dt, float* row_max, float* target_logit, const void* logits, const int* targets,
                            int N, int Vl, int vocab_begin) {
  if (N == 0) return;
  const int* ids = device_ids(targets, size_t(N), kVocabularyUnknown, "target");
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    crossentropy_shard_max_kernel<Elem><<<unsigned(N), kSoftmaxBlock, 0, stream()>>>(
        row_max, target_logit, static_cast<const Elem*>(logits), ids, Vl, vocab_begin);
  });
  check_launch();
}

void crossentropy_shard_exp(DType dt, void* probs, float* row_sum, const void* logits, const float* row_max, int N,
                            int Vl) {
  if (N == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    crossentropy_shard_exp_kernel<Elem><<<unsigned(N), kSoftmaxBlock, 0, stream()>>>(
        static_cast<Elem*>(probs), row_sum, static_cast<const Elem*>(logits), row_max, Vl);
  });
  check_launch();
}

void crossentropy_shard_finish(DType dt, float* losses, void* probs, const float* row_max, const float* row_sum,
                               const float* target_logit, int N, int Vl) {
  if (N == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    crossentropy_shard_finish_kernel<Elem><<<unsigned(N), kBlock, 0, stream()>>>(
        losses, static_cast<Elem*>(probs), row_max, row_sum, target_logit, Vl);
  });
  check_launch();
}

// ------------------------------------------------------------------------------------------------
// helpers for the trainers

void fill_zero(DType dt, void* x, size_t n) {
  if (n == 0) return;
  // all-zero bytes are 0.0 in fp32 and in bf16 alike
  CUDA_CHECK(cudaMemsetAsync(x, 0, n * dtype_size(dt), stream()));
}

void copy_tensor(DType dt, void* dst, const void* src, size_t n) {
  if (n == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(dt), cudaMemcpyDeviceToDevice, stream()));
}

void add_inplace(DType dt, void* dst, const void* src, size_t n) {
  if (n == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    add_inplace_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(static_cast<Elem*>(dst),
                                                                   static_cast<const Elem*>(src), n);
  });
  check_launch();
}

void scale_inplace(DType dt, void* x, float factor, size_t n) {
  if (n == 0) return;
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    scale_inplace_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(static_cast<Elem*>(x), factor, n);
  });
  check_launch();
}

void convert(DType dst_dt, void* dst, DType src_dt, const void* src, size_t n) {
  if (n == 0) return;
  if (dst_dt == src_dt) return copy_tensor(dst_dt, dst, src, n);
  with_type(dst_dt, [&](auto dst_tag) {
    with_type(src_dt, [&](auto src_tag) {
      using Dst = typename decltype(dst_tag)::type;
      using Src = typename decltype(src_tag)::type;
      convert_kernel<Dst, Src><<<grid_for(n), kBlock, 0, stream()>>>(static_cast<Dst*>(dst),
                                                                     static_cast<const Src*>(src), n);
    });
  });
  check_launch();
}

double sum_of_squares(DType dt, const void* x, size_t n) { return sum_on_device(dt, x, n, /*squares=*/true); }

double mean_of(DType dt, const void* x, size_t n) {
  ENSURE(n > 0, "mean of an empty tensor");
  return sum_on_device(dt, x, n, /*squares=*/false) / double(n);
}

// ------------------------------------------------------------------------------------------------
// AdamW

void adamw_update(DType dt, void* param, float* master, const void* grad, float* m, float* v, size_t n, int step,
                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale) {
  ENSURE(step >= 1, "adamw step counts from 1");
  if (n == 0) return;
  const float bias_correction1 = 1.0f - std::pow(beta1, float(step));
  const float bias_correction2 = 1.0f - std::pow(beta2, float(step));
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    adamw_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(static_cast<Elem*>(param), master,
                                                             static_cast<const Elem*>(grad), m, v, n, lr, beta1, beta2,
                                                             bias_correction1, bias_correction2, eps, weight_decay,
                                                             grad_scale);
  });
  check_launch();
}

void adamw_update_fused(DType dt, void* param, float* master, const void* grad, float* m, float* v, size_t n,
                        const std::vector<int64_t>& segment_ends, const std::vector<bool>& decays, int step, float lr,
                        float beta1, float beta2, float eps, float weight_decay, float grad_scale) {
  ENSURE(step >= 1, "adamw step counts from 1");
  ENSURE(!segment_ends.empty() && segment_ends.size() == decays.size() && segment_ends.back() == int64_t(n),
         "adamw_update_fused: one decay per segment, the last segment ending at n");
  if (n == 0) return;
  const float bias_correction1 = 1.0f - std::pow(beta1, float(step));
  const float bias_correction2 = 1.0f - std::pow(beta2, float(step));
  // The table goes up on the stream, behind the kernels that may still read the previous one.
  std::vector<int64_t> table(segment_ends);
  for (bool d : decays) table.push_back(d ? 1 : 0);
  int64_t* staged = static_cast<int64_t*>(g_segments.get(table.size() * sizeof(int64_t)));
  CUDA_CHECK(cudaMemcpyAsync(staged, table.data(), table.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream()));
  const int segments = int(segment_ends.size());
  with_type(dt, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    adamw_fused_kernel<Elem><<<grid_for(n), kBlock, 0, stream()>>>(
        static_cast<Elem*>(param), master, static_cast<const Elem*>(grad), m, v, n, staged, staged + segments,
        segments, lr, beta1, beta2, bias_correction1, bias_correction2, eps, weight_decay, grad_scale);
  });
  check_launch();
}

}  // namespace cuda
