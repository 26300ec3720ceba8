// ops_cuda.cu: the CUDA implementation of every op in ops.h (declared in ops_cuda.h), in fp32.
// Written to be read next to ops_cpu.cpp: the same ops, the same order of arguments, the same
// accumulate-into-gradients convention. Correctness and clarity first; where a faster kernel exists
// (llm.c's, FlashAttention), the comment says so.
//
// How the work is spread over the GPU, op by op:
//   elementwise ops (encoder forward, GELU, residual, AdamW, ...): one thread per element, in a
//       grid-stride loop (a thread handles i, i + gridSize, ...), so any n fits any grid.
//   row ops (layernorm, the causal softmax): one warp (32 threads) per row; the warp reduces with
//       __shfl_xor_sync, no shared memory. The cross-entropy softmax runs over rows of V = 50257
//       logits, too long for a warp: one block per row, reduced through shared memory.
//   matrix products (matmul, attention's Q K^T and att V): cuBLAS (cublasSgemm and its strided-
//       batched form). The row-major to column-major translation is explained above matmul_forward.
//   column sums (bias and layernorm parameter gradients): in two stages, partial sums over chunks
//       of rows into a scratch buffer, then one thread per column adds the chunks in order.
//
// Determinism: every kernel here sums in a fixed order (no atomicAdd), so the same inputs give
// bit-identical outputs run after run, as on the CPU. cuBLAS is deterministic too, for one toolkit
// version on one GPU model. The results still differ from the CPU in the last bits (other summation
// orders, fused multiply-adds, expf/tanhf): tests/test_cuda_ops.cpp states the tolerances.
//
// Everything runs on one stream (stream()); an op returns as soon as its work is queued.
#include "ops_cuda.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_check.h"  // CUDA_CHECK, CUBLAS_CHECK
#include "memory.h"      // device_alloc: scratch buffers are counted like everything else

namespace cuda {

namespace {

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

cublasHandle_t cublas() {
  // Created once, on first use, on the device current at that moment, and never destroyed: the
  // process ends with it (destroying it from a static destructor would race the CUDA runtime's own
  // teardown at exit).
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, stream()));
    // Plain fp32 products. (CUBLAS_TF32_TENSOR_OP_MATH would round the inputs to 10 mantissa bits
    // for several times the speed: a mixed-precision choice this fp32 port does not make silently.)
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    return h;
  }();
  return handle;
}

// A device buffer that grows on demand. Allocated through device_alloc, so its bytes appear in the
// memory report under "other". Growing returns the old buffer to the allocator's cache (memory.cpp)
// without waiting: whoever takes it next zeroes it on the compute stream, behind every kernel queued
// before that still reads it. Never freed (see cublas() on teardown at exit).
class Scratch {
 public:
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      device_free(data_);
      data_ = device_alloc(bytes, MemCategory::Other, Device::CUDA);
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

Scratch g_ids;       // token ids or targets copied from the host
Scratch g_partials;  // partial sums of the two-stage reductions

// Same message as the CPU ops (ops_cpu.cpp): an id outside the table would read other memory.
void check_id(int id, int V, const char* what) {
  ENSURE(0 <= id && id < V, std::string(what) + " id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(V) + ")");
}

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
  if (attributes.type == cudaMemoryTypeHost) CUDA_CHECK(cudaStreamSynchronize(stream()));
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

// One thread per output element (b, t, c).
__global__ void encoder_forward_kernel(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                                       int T, int C, int V) {
  const size_t n = size_t(B) * T * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t bt = i / C;  // the position b * T + t
    const int c = int(i % C), t = int(bt % T);
    const int token = tokens[bt];
    assert(0 <= token && token < V);
    out[i] = wte[size_t(token) * C + c] + wpe[size_t(t) * C + c];
  }
}

// dwte: one thread per channel c walks every position in order and adds into the row of its token.
// No two threads touch the same address (each owns a column), so no atomics are needed and the sum
// runs in exactly the CPU's order: bit-identical to ops_cpu.cpp. The price is parallelism: only C
// threads, each with B*T dependent read-modify-writes (about a millisecond at GPT-2 small sizes).
// (llm.c's faster deterministic version groups the positions by token on the host first; the
// simplest fast one, an atomicAdd per element, gives run-to-run different roundings.)
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* tokens, int BT, int C,
                                            int V) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int i = 0; i < BT; i++) {
    const int token = tokens[i];
    assert(0 <= token && token < V);
    dwte[size_t(token) * C + c] += dout[size_t(i) * C + c];
  }
}

// dwpe: one thread per (t, c) adds the gradient of every sequence b, in the CPU's order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t n = size_t(T) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float sum = dwpe[i];  // i = t * C + c
    for (int b = 0; b < B; b++) sum += dout[size_t(b) * T * C + i];
    dwpe[i] = sum;
  }
}

// One warp per row: two passes over the row (mean, then squared deviations), as the CPU does, in
// fp32 (the CPU sums in double).
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below see all 32 lanes
  const float* x = inp + size_t(row) * C;

  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) sum += x[c];
  const float m = warp_reduce(sum, Sum()) / C;
  float squared_deviations = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = x[c] - m;
    squared_deviations += d * d;
  }
  const float s = 1.0f / sqrtf(warp_reduce(squared_deviations, Sum()) / C + kLayernormEps);

  float* out_row = out + size_t(row) * C;
  for (int c = lane; c < C; c += kWarp) out_row[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// The input gradient, one warp per row (the formula and its reason: ops_cpu.cpp).
__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean, const float* rstd, int N,
                                                int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + size_t(row) * C;
  const float* dout_row = dout + size_t(row) * C;
  float* dinp_row = dinp + size_t(row) * C;
  const float m = mean[row], s = rstd[row];

  float dnorm_sum = 0.0f, dnorm_dot_norm = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * dout_row[c];
    dnorm_sum += dnorm;
    dnorm_dot_norm += dnorm * norm;
  }
  const float dnorm_mean = warp_reduce(dnorm_sum, Sum()) / C;
  const float dnorm_norm_mean = warp_reduce(dnorm_dot_norm, Sum()) / C;
  for (int c = lane; c < C; c += kWarp) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * dout_row[c];
    dinp_row[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// Stage 1 of the parameter gradients of layernorm: thread c of block column blockIdx.x sums rows
// [chunk * rows_per_chunk, ...) of its column, chunk = blockIdx.y. Neighbouring threads read
// neighbouring channels, so the loads of a warp are coalesced.
__global__ void layernorm_param_partials_kernel(float* dweight_partials, float* dbias_partials, const float* dout,
                                                const float* inp, const float* mean, const float* rstd, int N,
                                                int C, int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int begin = blockIdx.y * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float dweight = 0.0f, dbias = 0.0f;
  for (int i = begin; i < end; i++) {
    const float d = dout[size_t(i) * C + c];
    const float norm = (inp[size_t(i) * C + c] - mean[i]) * rstd[i];
    dweight += norm * d;
    dbias += d;
  }
  dweight_partials[size_t(blockIdx.y) * C + c] = dweight;
  dbias_partials[size_t(blockIdx.y) * C + c] = dbias;
}

// Stage 1 of a column sum of mat(N,C) (the bias gradient): as above, for plain sums.
__global__ void column_sum_partials_kernel(float* partials, const float* mat, int N, int C, int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int begin = blockIdx.y * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float sum = 0.0f;
  for (int i = begin; i < end; i++) sum += mat[size_t(i) * C + c];
  partials[size_t(blockIdx.y) * C + c] = sum;
}

// Stage 2: out[c] += the chunks' partial sums of column c, added in chunk order (deterministic).
__global__ void add_column_partials_kernel(float* out, const float* partials, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int k = 0; k < chunks; k++) sum += partials[size_t(k) * C + c];
  out[c] += sum;
}

// out(N,OC) = the bias in every row; the GEMM then adds inp @ weight^T on top (beta = 1).
__global__ void broadcast_bias_kernel(float* out, const float* bias, int N, int OC) {
  const size_t n = size_t(N) * OC;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// One warp per row of scores: row = (b * NH + h) * T + t, the scores of query t against keys
// 0..T-1. Softmax over the causal part t2 <= t; above it att = 0 and preatt = -inf, as on the CPU.
// (The GEMM before this computed the masked scores too: half the work is wasted, the price of
// using a plain GEMM. FlashAttention fuses GEMM, mask and softmax and never stores the T x T rows.)
__global__ void causal_softmax_kernel(float* preatt, float* att, int rows, int T) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = row % T;
  float* p = preatt + size_t(row) * T;
  float* a = att + size_t(row) * T;

  float maxval = -INFINITY;  // t >= 0, so lane 0 sees at least p[0] and the maximum is finite
  for (int t2 = lane; t2 <= t; t2 += kWarp) maxval = fmaxf(maxval, p[t2]);
  maxval = warp_reduce(maxval, Max());
  float expsum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarp) expsum += expf(p[t2] - maxval);
  const float inv_expsum = 1.0f / warp_reduce(expsum, Sum());
  for (int t2 = lane; t2 < T; t2 += kWarp) {
    if (t2 <= t) {
      a[t2] = expf(p[t2] - maxval) * inv_expsum;
    } else {
      a[t2] = 0.0f;
      p[t2] = -INFINITY;
    }
  }
}

// One warp per row: dpreatt += att * (datt - <att, datt>) on the causal part (ops_cpu.cpp explains
// the formula). Above the diagonal dpreatt is set to 0, not accumulated: the GEMMs that follow read
// the whole T x T block, so it must hold zeros there even if a caller forgot to zero it. (datt may
// hold nonzero values there: the GEMM that produced it computed the masked entries too.)
__global__ void causal_softmax_backward_kernel(float* dpreatt, const float* datt, const float* att, int rows,
                                               int T) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = row % T;
  const float* a = att + size_t(row) * T;
  const float* da = datt + size_t(row) * T;
  float* dp = dpreatt + size_t(row) * T;

  float att_dot_datt = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarp) att_dot_datt += a[t2] * da[t2];
  att_dot_datt = warp_reduce(att_dot_datt, Sum());
  for (int t2 = lane; t2 < T; t2 += kWarp) {
    if (t2 <= t) {
      dp[t2] += a[t2] * (da[t2] - att_dot_datt);
    } else {
      dp[t2] = 0.0f;
    }
  }
}

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float tanh_out = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    const float sech2 = 1.0f - tanh_out * tanh_out;
    const float local_grad =
        0.5f * (1.0f + tanh_out) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void residual_backward_kernel(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// One block of kSoftmaxBlock threads per row of V logits: the threads stride over the row, then
// reduce through shared memory (block_reduce). Three passes: maximum, sum of exponentials, probs.
__global__ void softmax_crossentropy_forward_kernel(float* losses, float* probs, const float* logits,
                                                    const int* targets, int V) {
  const int row = blockIdx.x;
  const float* x = logits + size_t(row) * V;
  float* p = probs + size_t(row) * V;

  float maxval = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) maxval = fmaxf(maxval, x[v]);
  maxval = block_reduce(maxval, Max(), -INFINITY);
  float expsum = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) expsum += expf(x[v] - maxval);
  expsum = block_reduce(expsum, Sum(), 0.0f);
  const float inv_expsum = 1.0f / expsum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] = expf(x[v] - maxval) * inv_expsum;
  if (threadIdx.x == 0) {
    const int target = targets[row];
    assert(0 <= target && target < V);
    // -log(probs[target]) as log(expsum) - (logit - max): finite even if probs[target] underflows
    losses[row] = logf(expsum) - (x[target] - maxval);
  }
}

// One thread per logit: dlogits += probs * dloss, minus dloss at the target (the CPU's two steps).
__global__ void softmax_crossentropy_backward_kernel(float* dlogits, const float* probs, const int* targets,
                                                     float dloss, int N, int V) {
  const size_t n = size_t(N) * V;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / V;
    const int v = int(i % V);
    float d = dlogits[i] + probs[i] * dloss;
    if (v == targets[row]) d -= dloss;
    dlogits[i] = d;
  }
}

__global__ void add_inplace_kernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__global__ void scale_inplace_kernel(float* x, float factor, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] *= factor;
}

// partials[block] = the block's sum of x (or of x^2): fp32 per thread, then a block reduction.
template <bool kSquares>
__global__ void partial_sums_kernel(float* partials, const float* x, size_t n) {
  float sum = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    sum += kSquares ? x[i] * x[i] : x[i];
  sum = block_reduce(sum, Sum(), 0.0f);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// The bias corrections 1 - beta^step are computed once on the host, as on the CPU.
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                             float beta2, float bias_correction1, float bias_correction2, float eps,
                             float weight_decay, float grad_scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = grad[i] * grad_scale;
    const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    const float m_hat = m_i / bias_correction1;
    const float v_hat = v_i / bias_correction2;
    param[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * param[i]);
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
double sum_on_device(const float* x, size_t n, bool squares) {
  if (n == 0) return 0.0;
  const unsigned blocks = unsigned(std::min<size_t>(ceil_div(n, kBlock), 1024));
  float* partials = static_cast<float*>(g_partials.get(blocks * sizeof(float)));
  if (squares) {
    partial_sums_kernel<true><<<blocks, kBlock, 0, stream()>>>(partials, x, n);
  } else {
    partial_sums_kernel<false><<<blocks, kBlock, 0, stream()>>>(partials, x, n);
  }
  check_launch();
  std::vector<float> host(blocks);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), partials, blocks * sizeof(float), cudaMemcpyDeviceToHost, stream()));
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  double total = 0.0;
  for (float p : host) total += p;
  return total;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// The stream

cudaStream_t stream() {
  // A static local is initialised once, thread-safely, on first use.
  static cudaStream_t compute_stream = [] {
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));  // default flags: ordered with the legacy default stream
    return s;
  }();
  return compute_stream;
}

void synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream())); }

// ------------------------------------------------------------------------------------------------
// encoder

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     int V) {
  const size_t n = size_t(B) * T * C;
  if (n == 0) return;
  const int* ids = device_ids(tokens, size_t(B) * T, V, "token");
  encoder_forward_kernel<<<grid_for(n), kBlock, 0, stream()>>>(out, ids, wte, wpe, B, T, C, V);
  check_launch();
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C,
                      int V) {
  if (size_t(B) * T * C == 0) return;
  const int* ids = device_ids(tokens, size_t(B) * T, V, "token");
  constexpr int kThreads = 64;  // few threads in all (C), so small blocks spread them over more SMs
  encoder_backward_wte_kernel<<<unsigned(ceil_div(C, kThreads)), kThreads, 0, stream()>>>(dwte, dout, ids, B * T,
                                                                                         C, V);
  check_launch();
  encoder_backward_wpe_kernel<<<grid_for(size_t(T) * C), kBlock, 0, stream()>>>(dwpe, dout, B, T, C);
  check_launch();
}

// ------------------------------------------------------------------------------------------------
// layernorm

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  if (N == 0) return;
  layernorm_forward_kernel<<<grid_for_rows(N), kBlock, 0, stream()>>>(out, mean, rstd, inp, weight, bias, N, C);
  check_launch();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  if (N == 0) return;
  layernorm_backward_input_kernel<<<grid_for_rows(N), kBlock, 0, stream()>>>(dinp, dout, inp, weight, mean, rstd,
                                                                              N, C);
  check_launch();
  // dweight and dbias: sums over the N rows, in two deterministic stages (see the kernels).
  const RowChunks plan = plan_row_chunks(N);
  float* partials = static_cast<float*>(g_partials.get(2 * size_t(plan.chunks) * C * sizeof(float)));
  float* dweight_partials = partials;
  float* dbias_partials = partials + size_t(plan.chunks) * C;
  const dim3 grid(unsigned(ceil_div(C, kBlock)), unsigned(plan.chunks));
  layernorm_param_partials_kernel<<<grid, kBlock, 0, stream()>>>(dweight_partials, dbias_partials, dout, inp, mean,
                                                                 rstd, N, C, plan.rows_per_chunk);
  check_launch();
  const unsigned columns = unsigned(ceil_div(C, kBlock));
  add_column_partials_kernel<<<columns, kBlock, 0, stream()>>>(dweight, dweight_partials, plan.chunks, C);
  check_launch();
  add_column_partials_kernel<<<columns, kBlock, 0, stream()>>>(dbias, dbias_partials, plan.chunks, C);
  check_launch();
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
//             = cublasSgemm(T, N, m=OC, n=N, k=C, weight (ld C), inp (ld C), out (ld OC))
//   backward  dinp(N,C) += dout(N,OC) @ weight(OC,C)  ->  dinp^T(C,N) = weight^T @ dout^T
//             = cublasSgemm(N, N, m=C, n=N, k=OC, weight (ld C), dout (ld OC), dinp (ld C)), beta 1
//             dweight(OC,C) += dout^T @ inp(N,C)      ->  dweight^T(C,OC) = inp^T @ dout
//             = cublasSgemm(N, T, m=C, n=OC, k=N, inp (ld C), dout (ld OC), dweight (ld C)), beta 1
// (In each, "weight" in column-major terms is the (C x OC) matrix weight^T, and so on.)

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                    int OC) {
  if (N == 0 || OC == 0) return;
  const float one = 1.0f;
  // As on the CPU: start from the bias and let the GEMM add the product (beta = 1). Without a bias,
  // beta = 0 tells cuBLAS not to read `out` at all, so stale contents (even NaN) cannot leak in.
  float beta = 0.0f;
  if (bias) {
    broadcast_bias_kernel<<<grid_for(size_t(N) * OC), kBlock, 0, stream()>>>(out, bias, N, OC);
    check_launch();
    beta = 1.0f;
  }
  CUBLAS_CHECK(cublasSgemm(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C, inp, C, &beta, out, OC));
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (N == 0 || C == 0 || OC == 0) return;
  const float one = 1.0f;  // alpha, and beta = 1 because backward accumulates
  CUBLAS_CHECK(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout, OC, &one, dinp, C));
  CUBLAS_CHECK(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dweight, C));
  if (dbias) {
    const RowChunks plan = plan_row_chunks(N);
    float* partials = static_cast<float*>(g_partials.get(size_t(plan.chunks) * OC * sizeof(float)));
    const dim3 grid(unsigned(ceil_div(OC, kBlock)), unsigned(plan.chunks));
    column_sum_partials_kernel<<<grid, kBlock, 0, stream()>>>(partials, dout, N, OC, plan.rows_per_chunk);
    check_launch();
    add_column_partials_kernel<<<unsigned(ceil_div(OC, kBlock)), kBlock, 0, stream()>>>(dbias, partials,
                                                                                        plan.chunks, OC);
    check_launch();
  }
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
// out; T*T for the scores), which is what cublasSgemmStridedBatched wants: one call covers the NH
// heads of one sequence, a loop covers the B sequences. (llm.c instead first permutes qkv into
// (B,NH,T,hs) so that one call covers everything; this avoids that copy and its buffer.)
// The row-major/column-major translation is the one explained above matmul_forward:
//   preatt = scale * Q @ K^T   has the form of matmul_forward's   out = inp @ weight^T
//   out    = att @ V           ->  out^T(hs,T) = V^T @ att^T   (both operands as stored)

void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const int C3 = 3 * C, hs = C / NH;
  const long long TT = (long long)T * T;
  const float scale = 1.0f / sqrtf(float(hs)), zero = 0.0f, one = 1.0f;
  for (int b = 0; b < B; b++) {
    const float* q = qkv + size_t(b) * T * C3;
    const float* k = q + C;
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale, k, C3, hs, q, C3,
                                           hs, &zero, preatt + size_t(b) * NH * TT, T, TT, NH));
  }
  const int rows = B * NH * T;
  causal_softmax_kernel<<<grid_for_rows(rows), kBlock, 0, stream()>>>(preatt, att, rows, T);
  check_launch();
  for (int b = 0; b < B; b++) {
    const float* v = qkv + size_t(b) * T * C3 + 2 * C;
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, v, C3, hs,
                                           att + size_t(b) * NH * TT, T, TT, &zero, out + size_t(b) * T * C, C, hs,
                                           NH));
  }
}

// Backward, per (b, h), in row-major terms (every product accumulates, beta = 1):
//   datt    += dout @ V^T                (T x T)   form of matmul_forward
//   dV      += att^T @ dout              (T x hs)  ->  dV^T = dout^T @ att, att used transposed
//   dpreatt += softmax backward of datt  (kernel, causal part only)
//   dQ      += scale * dpreatt @ K       (T x hs)  ->  dQ^T = K^T @ dpreatt^T, as stored
//   dK      += scale * dpreatt^T @ Q     (T x hs)  ->  dK^T = Q^T @ dpreatt, dpreatt transposed
// The entries of att and dpreatt above the diagonal are 0, so the full T x T products add exactly
// the causal sums of the CPU loops.
void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const int C3 = 3 * C, hs = C / NH;
  const long long TT = (long long)T * T;
  const float scale = 1.0f / sqrtf(float(hs)), one = 1.0f;
  for (int b = 0; b < B; b++) {
    const float* v = qkv + size_t(b) * T * C3 + 2 * C;
    float* dv = dqkv + size_t(b) * T * C3 + 2 * C;
    const float* dout_b = dout + size_t(b) * T * C;
    const float* att_b = att + size_t(b) * NH * TT;
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one, v, C3, hs, dout_b, C,
                                           hs, &one, datt + size_t(b) * NH * TT, T, TT, NH));
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, dout_b, C, hs, att_b,
                                           T, TT, &one, dv, C3, hs, NH));
  }
  const int rows = B * NH * T;
  causal_softmax_backward_kernel<<<grid_for_rows(rows), kBlock, 0, stream()>>>(dpreatt, datt, att, rows, T);
  check_launch();
  for (int b = 0; b < B; b++) {
    const float* q = qkv + size_t(b) * T * C3;
    const float* k = q + C;
    float* dq = dqkv + size_t(b) * T * C3;
    float* dk = dq + C;
    const float* dpreatt_b = dpreatt + size_t(b) * NH * TT;
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &scale, k, C3, hs,
                                           dpreatt_b, T, TT, &one, dq, C3, hs, NH));
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &scale, q, C3, hs,
                                           dpreatt_b, T, TT, &one, dk, C3, hs, NH));
  }
}

// ------------------------------------------------------------------------------------------------
// GELU and the residual connection

void gelu_forward(float* out, const float* inp, size_t n) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kBlock, 0, stream()>>>(out, inp, n);
  check_launch();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kBlock, 0, stream()>>>(dinp, inp, dout, n);
  check_launch();
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  residual_forward_kernel<<<grid_for(n), kBlock, 0, stream()>>>(out, a, b, n);
  check_launch();
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  if (n == 0) return;
  residual_backward_kernel<<<grid_for(n), kBlock, 0, stream()>>>(da, db, dout, n);
  check_launch();
}

// ------------------------------------------------------------------------------------------------
// softmax + cross-entropy

void softmax_crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V) {
  if (N == 0) return;
  const int* ids = device_ids(targets, size_t(N), V, "target");
  softmax_crossentropy_forward_kernel<<<unsigned(N), kSoftmaxBlock, 0, stream()>>>(losses, probs, logits, ids, V);
  check_launch();
}

void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V) {
  if (size_t(N) * V == 0) return;
  const int* ids = device_ids(targets, size_t(N), V, "target");
  softmax_crossentropy_backward_kernel<<<grid_for(size_t(N) * V), kBlock, 0, stream()>>>(dlogits, probs, ids, dloss,
                                                                                         N, V);
  check_launch();
}

// ------------------------------------------------------------------------------------------------
// helpers for the trainers

void fill_zero(float* x, size_t n) {
  if (n == 0) return;
  CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream()));  // all-zero bytes are 0.0f
}

void copy_tensor(float* dst, const float* src, size_t n) {
  if (n == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
}

void add_inplace(float* dst, const float* src, size_t n) {
  if (n == 0) return;
  add_inplace_kernel<<<grid_for(n), kBlock, 0, stream()>>>(dst, src, n);
  check_launch();
}

void scale_inplace(float* x, float factor, size_t n) {
  if (n == 0) return;
  scale_inplace_kernel<<<grid_for(n), kBlock, 0, stream()>>>(x, factor, n);
  check_launch();
}

double sum_of_squares(const float* x, size_t n) { return sum_on_device(x, n, /*squares=*/true); }

double mean_of(const float* x, size_t n) {
  ENSURE(n > 0, "mean of an empty tensor");
  return sum_on_device(x, n, /*squares=*/false) / double(n);
}

// ------------------------------------------------------------------------------------------------
// AdamW

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, int step, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale) {
  ENSURE(step >= 1, "adamw step counts from 1");
  if (n == 0) return;
  const float bias_correction1 = 1.0f - std::pow(beta1, float(step));
  const float bias_correction2 = 1.0f - std::pow(beta2, float(step));
  adamw_kernel<<<grid_for(n), kBlock, 0, stream()>>>(param, grad, m, v, n, lr, beta1, beta2, bias_correction1,
                                                     bias_correction2, eps, weight_decay, grad_scale);
  check_launch();
}

}  // namespace cuda
