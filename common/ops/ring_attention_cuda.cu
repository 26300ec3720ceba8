// ring_attention_cuda.cu: ring attention's block kernels on the GPU, in fp32 (ring_attention_cuda.h),
// written to be read next to ring_attention.cpp: the same loops, the same order of the sums.
//
// One warp per row. A (sequence, head, query) row of the forward is one warp: each of its 32 lanes
// holds hs/32 of the head's channels (lane, lane + 32, ...), so a dot product of two rows is a
// multiply per lane and a butterfly reduction, and a row of the output is updated by all lanes at
// once. The forward makes two passes over the block, as the CPU kernel does: the block's largest
// score first, then the probabilities against it, so the running state is rescaled once per block and
// the sums are those of the CPU in another order of the additions only.
//
// The backward's gradients have two owners. dq of a query row sums over the block's keys; dk and dv of
// a key row sum over the queries. Writing both from one kernel would need atomicAdd (and give results
// that change from run to run), so there are two kernels, each writing only its own rows: one warp per
// query row for dq, one warp per key row for dk and dv, each recomputing the probabilities from the
// forward's lse (P = exp(s - lse)) and D. Twice the dot products, no T x T memory, deterministic.
//
// Not yet tuned: the rows are read from global memory per key (cached by L1/L2), no tensor cores.
// The chapter's point on a GPU is the overlap of the ring's sends with this work (the sends run on
// the communicator's stream); attention_flash.cu is where the kernel speed is taught.
#include "ops/ring_attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>  // integral_constant
#include <vector>

#include "base/check.h"       // ENSURE
#include "base/cuda_check.h"  // CUDA_CHECK
#include "ops/memory.h"      // device_alloc: the positions uploaded from the host
#include "ops/ops_cuda.h"    // stream()

namespace cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps (rows) per block of 256 threads
constexpr int kMaxHeadChunks = 4;  // hs up to 4 x 32 = 128

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// A head's row as this lane's CHUNKS channels (lane, lane + 32, ...).
template <int CHUNKS>
struct Lanes {
  float x[CHUNKS];
  __device__ void load(const float* row) {
    for (int i = 0; i < CHUNKS; i++) x[i] = row[threadIdx.x % kWarp + i * kWarp];
  }
  __device__ void store(float* row) const {
    for (int i = 0; i < CHUNKS; i++) row[threadIdx.x % kWarp + i * kWarp] = x[i];
  }
  __device__ float dot(const float* row) const {  // <this, row>, on every lane
    float s = 0.0f;
    for (int i = 0; i < CHUNKS; i++) s += x[i] * row[threadIdx.x % kWarp + i * kWarp];
    return warp_sum(s);
  }
  __device__ void axpy(float a, const float* row) {  // this += a row
    for (int i = 0; i < CHUNKS; i++) x[i] += a * row[threadIdx.x % kWarp + i * kWarp];
  }
};

// The warp's row: index w = ((b NH) + h) Tq + t, the statistics' index too.
struct RowIndex {
  int b, h, t;
  int64_t stat;
};
__device__ __forceinline__ bool warp_row(int Tq, int NH, int B, RowIndex* r) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (w >= int64_t(B) * NH * Tq) return false;
  r->stat = w;
  r->t = int(w % Tq);
  r->h = int(w / Tq % NH);
  r->b = int(w / (int64_t(Tq) * NH));
  return true;
}

__device__ __forceinline__ const float* row_at(const float* data, int64_t stride, int T, int b, int t, int h, int hs) {
  return data + (int64_t(b) * T + t) * stride + int64_t(h) * hs;
}
__device__ __forceinline__ float* row_at(float* data, int64_t stride, int T, int b, int t, int h, int hs) {
  return data + (int64_t(b) * T + t) * stride + int64_t(h) * hs;
}

__global__ void start_kernel(float* row_max, float* row_sum, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
  }
}

template <int CHUNKS>
__global__ void block_forward_kernel(float* acc, int64_t acc_stride, float* row_max, float* row_sum, const float* q,
                                     int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                                     int64_t v_stride, const int* q_pos, int Tq, const int* k_pos, int Tk, int B,
                                     int NH, float scale) {
  RowIndex r;
  if (!warp_row(Tq, NH, B, &r)) return;  // whole warps leave together: rows are per warp
  constexpr int hs = CHUNKS * kWarp;
  Lanes<CHUNKS> query;
  query.load(row_at(q, q_stride, Tq, r.b, r.t, r.h, hs));
  const int p = q_pos[r.t];
  // Pass 1: the block's largest score among the keys the mask lets this query see.
  float block_max = -INFINITY;
  int seen = 0;
  for (int tk = 0; tk < Tk; tk++) {
    if (k_pos[tk] > p) continue;  // the causal mask, by absolute position (the same on every lane)
    block_max = fmaxf(block_max, query.dot(row_at(k, k_stride, Tk, r.b, tk, r.h, hs)) * scale);
    seen++;
  }
  if (seen == 0) return;
  // Rescale what earlier blocks summed to the new maximum, then add this block's terms.
  const float old_max = row_max[r.stat], new_max = fmaxf(old_max, block_max);
  const float rescale = old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
  float* out = row_at(acc, acc_stride, Tq, r.b, r.t, r.h, hs);
  Lanes<CHUNKS> o;
  o.load(out);
  for (int i = 0; i < CHUNKS; i++) o.x[i] *= rescale;
  double sum = double(row_sum[r.stat]) * rescale;
  for (int tk = 0; tk < Tk; tk++) {
    if (k_pos[tk] > p) continue;
    const float e = expf(query.dot(row_at(k, k_stride, Tk, r.b, tk, r.h, hs)) * scale - new_max);
    sum += e;
    o.axpy(e, row_at(v, v_stride, Tk, r.b, tk, r.h, hs));
  }
  o.store(out);
  if (threadIdx.x % kWarp == 0) {
    row_max[r.stat] = new_max;
    row_sum[r.stat] = float(sum);
  }
}

template <int CHUNKS>
__global__ void finish_kernel(float* out, int64_t out_stride, float* lse, const float* row_max, const float* row_sum,
                              int T, int B, int NH) {
  RowIndex r;
  if (!warp_row(T, NH, B, &r)) return;
  constexpr int hs = CHUNKS * kWarp;
  float* row = row_at(out, out_stride, T, r.b, r.t, r.h, hs);
  const float inverse = 1.0f / row_sum[r.stat];
  for (int i = 0; i < CHUNKS; i++) row[threadIdx.x % kWarp + i * kWarp] *= inverse;
  if (threadIdx.x % kWarp == 0) lse[r.stat] = row_max[r.stat] + logf(row_sum[r.stat]);
}

template <int CHUNKS>
__global__ void row_dots_kernel(float* D, const float* dout, int64_t dout_stride, const float* out,
                                int64_t out_stride, int T, int B, int NH) {
  RowIndex r;
  if (!warp_row(T, NH, B, &r)) return;
  constexpr int hs = CHUNKS * kWarp;
  Lanes<CHUNKS> g;
  g.load(row_at(dout, dout_stride, T, r.b, r.t, r.h, hs));
  const float d = g.dot(row_at(out, out_stride, T, r.b, r.t, r.h, hs));
  if (threadIdx.x % kWarp == 0) D[r.stat] = d;
}

// dq of one query row: sum over the block's keys of dS k / sqrt(hs), in key order.
template <int CHUNKS>
__global__ void block_backward_dq_kernel(float* dq, int64_t dq_stride, const float* q, int64_t q_stride,
                                         const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                                         const float* dout, int64_t dout_stride, const float* lse, const float* D,
                                         const int* q_pos, int Tq, const int* k_pos, int Tk, int B, int NH,
                                         float scale) {
  RowIndex r;
  if (!warp_row(Tq, NH, B, &r)) return;
  constexpr int hs = CHUNKS * kWarp;
  Lanes<CHUNKS> query, g, dquery;
  query.load(row_at(q, q_stride, Tq, r.b, r.t, r.h, hs));
  g.load(row_at(dout, dout_stride, Tq, r.b, r.t, r.h, hs));
  float* dq_row = row_at(dq, dq_stride, Tq, r.b, r.t, r.h, hs);
  dquery.load(dq_row);
  const float row_lse = lse[r.stat], row_dot = D[r.stat];
  const int p = q_pos[r.t];
  for (int tk = 0; tk < Tk; tk++) {
    if (k_pos[tk] > p) continue;
    const float* key = row_at(k, k_stride, Tk, r.b, tk, r.h, hs);
    const float prob = expf(query.dot(key) * scale - row_lse);  // the forward's softmax
    const float ds = prob * (g.dot(row_at(v, v_stride, Tk, r.b, tk, r.h, hs)) - row_dot) * scale;
    dquery.axpy(ds, key);
  }
  dquery.store(dq_row);
}

// dk and dv of one key row: sums over the queries that see it, in query order.
template <int CHUNKS>
__global__ void block_backward_dkv_kernel(float* dk, int64_t dk_stride, float* dv, int64_t dv_stride, const float* q,
                                          int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                                          int64_t v_stride, const float* dout, int64_t dout_stride, const float* lse,
                                          const float* D, const int* q_pos, int Tq, const int* k_pos, int Tk, int B,
                                          int NH, float scale) {
  RowIndex r;  // here t is the key's row in the block, and stat is not used
  if (!warp_row(Tk, NH, B, &r)) return;
  constexpr int hs = CHUNKS * kWarp;
  Lanes<CHUNKS> key, value, dkey, dvalue;
  key.load(row_at(k, k_stride, Tk, r.b, r.t, r.h, hs));
  value.load(row_at(v, v_stride, Tk, r.b, r.t, r.h, hs));
  float* dk_row = row_at(dk, dk_stride, Tk, r.b, r.t, r.h, hs);
  float* dv_row = row_at(dv, dv_stride, Tk, r.b, r.t, r.h, hs);
  dkey.load(dk_row);
  dvalue.load(dv_row);
  const int kp = k_pos[r.t];
  for (int t = 0; t < Tq; t++) {
    if (kp > q_pos[t]) continue;
    const int64_t st = (int64_t(r.b) * NH + r.h) * Tq + t;
    const float* query = row_at(q, q_stride, Tq, r.b, t, r.h, hs);
    const float* g = row_at(dout, dout_stride, Tq, r.b, t, r.h, hs);
    const float prob = expf(key.dot(query) * scale - lse[st]);
    dvalue.axpy(prob, g);
    const float ds = prob * (value.dot(g) - D[st]) * scale;
    dkey.axpy(ds, query);
  }
  dkey.store(dk_row);
  dvalue.store(dv_row);
}

__global__ void add_kv_grad_kernel(float* dqkv, const float* dkv, int64_t rows, int C) {
  const int64_t n = rows * 2 * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / (2 * C), j = i % (2 * C);
    dqkv[row * 3 * C + C + j] += dkv[i];
  }
}

unsigned blocks_for_rows(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }
unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 65536)); }
void check_launch() { CUDA_CHECK(cudaGetLastError()); }

// Calls body(std::integral_constant<int, CHUNKS>) for the head size's number of 32-channel chunks.
template <typename Body>
void with_chunks(int C, int NH, Body&& body) {
  const std::string problem = ring_head_size_problem(C, NH);
  ENSURE(problem.empty(), problem);
  switch (C / NH / kWarp) {
    case 1: body(std::integral_constant<int, 1>{}); break;
    case 2: body(std::integral_constant<int, 2>{}); break;
    case 3: body(std::integral_constant<int, 3>{}); break;
    default: body(std::integral_constant<int, 4>{}); break;
  }
}

// The two lists of positions as device memory: the caller's if they are; else each host list is
// uploaded once, the first time its contents are seen, and kept (a ring has cp lists of T/cp
// positions: a few KB). Kept by contents, not by address, so a list that changes is never stale; a
// mutex, because chapter 12's lanes run rings from two threads.
struct DevicePositions {
  const int* q;
  const int* k;
};
const int* uploaded(const int* host, int n) {
  static std::mutex mutex;
  static std::map<std::vector<int>, int*>* kept = new std::map<std::vector<int>, int*>();  // never freed: see Scratch
  std::vector<int> key(host, host + n);
  std::lock_guard<std::mutex> lock(mutex);
  auto found = kept->find(key);
  if (found != kept->end()) return found->second;
  int* device = static_cast<int*>(device_alloc(size_t(n) * sizeof(int), MemCategory::Other, Device::CUDA));
  CUDA_CHECK(cudaMemcpy(device, host, size_t(n) * sizeof(int), cudaMemcpyHostToDevice));  // once per list
  kept->emplace(std::move(key), device);
  return device;
}
DevicePositions device_positions(const int* q_pos, int Tq, const int* k_pos, int Tk) {
  cudaPointerAttributes qa, ka;
  CUDA_CHECK(cudaPointerGetAttributes(&qa, q_pos));
  CUDA_CHECK(cudaPointerGetAttributes(&ka, k_pos));
  auto on_device = [](const cudaPointerAttributes& a) {
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  };
  return {on_device(qa) ? q_pos : uploaded(q_pos, Tq), on_device(ka) ? k_pos : uploaded(k_pos, Tk)};
}

float score_scale(int C, int NH) { return 1.0f / std::sqrt(float(C / NH)); }

}  // namespace

std::string ring_head_size_problem(int C, int NH) {
  if (NH <= 0 || C % NH != 0) return "ring attention on CUDA: C = " + std::to_string(C) + " is not a multiple of NH";
  const int hs = C / NH;
  if (hs % kWarp != 0 || hs > kMaxHeadChunks * kWarp)
    return "ring attention on CUDA: head size C/NH = " + std::to_string(hs) +
           " is not a multiple of 32 up to 128 (the kernels give each of a warp's lanes hs/32 channels)";
  return "";
}

void ring_start(float* row_max, float* row_sum, int64_t n) {
  if (n == 0) return;
  start_kernel<<<blocks_for(n), 256, 0, stream()>>>(row_max, row_sum, n);
  check_launch();
}

void ring_block_forward(float* acc, int64_t acc_stride, float* row_max, float* row_sum, const float* q,
                        int64_t q_stride, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                        const int* q_pos, int Tq, const int* k_pos, int Tk, int B, int NH, int C) {
  const int64_t rows = int64_t(B) * NH * Tq;
  if (rows == 0 || Tk == 0) return;
  const DevicePositions pos = device_positions(q_pos, Tq, k_pos, Tk);
  with_chunks(C, NH, [&](auto chunks) {
    block_forward_kernel<decltype(chunks)::value><<<blocks_for_rows(rows), kRowsPerBlock * kWarp, 0, stream()>>>(
        acc, acc_stride, row_max, row_sum, q, q_stride, k, k_stride, v, v_stride, pos.q, Tq, pos.k, Tk, B, NH,
        score_scale(C, NH));
  });
  check_launch();
}

void ring_block_finish(float* out, int64_t out_stride, float* lse, const float* row_max, const float* row_sum, int T,
                       int B, int NH, int C) {
  const int64_t rows = int64_t(B) * NH * T;
  if (rows == 0) return;
  with_chunks(C, NH, [&](auto chunks) {
    finish_kernel<decltype(chunks)::value><<<blocks_for_rows(rows), kRowsPerBlock * kWarp, 0, stream()>>>(
        out, out_stride, lse, row_max, row_sum, T, B, NH);
  });
  check_launch();
}

void ring_row_dots(float* D, const float* dout, int64_t dout_stride, const float* out, int64_t out_stride, int T,
                   int B, int NH, int C) {
  const int64_t rows = int64_t(B) * NH * T;
  if (rows == 0) return;
  with_chunks(C, NH, [&](auto chunks) {
    row_dots_kernel<decltype(chunks)::value><<<blocks_for_rows(rows), kRowsPerBlock * kWarp, 0, stream()>>>(
        D, dout, dout_stride, out, out_stride, T, B, NH);
  });
  check_launch();
}

void ring_block_backward(float* dq, int64_t dq_stride, float* dk, int64_t dk_stride, float* dv, int64_t dv_stride,
                         const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                         int64_t v_stride, const float* dout, int64_t dout_stride, const float* lse, const float* D,
                         const int* q_pos, int Tq, const int* k_pos, int Tk, int B, int NH, int C) {
  if (int64_t(B) * NH * Tq == 0 || Tk == 0) return;
  const DevicePositions pos = device_positions(q_pos, Tq, k_pos, Tk);
  const float scale = score_scale(C, NH);
  with_chunks(C, NH, [&](auto chunks) {
    constexpr int kChunks = decltype(chunks)::value;
    block_backward_dq_kernel<kChunks>
        <<<blocks_for_rows(int64_t(B) * NH * Tq), kRowsPerBlock * kWarp, 0, stream()>>>(
            dq, dq_stride, q, q_stride, k, k_stride, v, v_stride, dout, dout_stride, lse, D, pos.q, Tq, pos.k, Tk, B,
            NH, scale);
    check_launch();
    block_backward_dkv_kernel<kChunks>
        <<<blocks_for_rows(int64_t(B) * NH * Tk), kRowsPerBlock * kWarp, 0, stream()>>>(
            dk, dk_stride, dv, dv_stride, q, q_stride, k, k_stride, v, v_stride, dout, dout_stride, lse, D, pos.q,
            Tq, pos.k, Tk, B, NH, scale);
    check_launch();
  });
}

void ring_pack_kv(float* kv, const float* qkv, int B, int T, int C) {
  const size_t rows = size_t(B) * T;
  if (rows == 0) return;
  // k and v are adjacent in each row of qkv, as in the block: one strided 2-D copy.
  CUDA_CHECK(cudaMemcpy2DAsync(kv, 2 * size_t(C) * sizeof(float), qkv + C, 3 * size_t(C) * sizeof(float),
                               2 * size_t(C) * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream()));
}

void ring_add_kv_grad(float* dqkv, const float* dkv, int B, int T, int C) {
  const int64_t rows = int64_t(B) * T;
  if (rows == 0) return;
  add_kv_grad_kernel<<<blocks_for(rows * 2 * C), 256, 0, stream()>>>(dqkv, dkv, rows, C);
  check_launch();
}

}  // namespace cuda
