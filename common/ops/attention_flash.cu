// attention_flash.cu: causal self-attention without the (B,NH,T,T) matrices, the FlashAttention way
// (Dao et al., 2022; the backward split of FlashAttention-2), for bf16 mixed precision. Defines the
// cuda::*attention*_flash functions of ops_cuda.h.
//
// Why. ops_cuda.cu's attention writes the scores and the softmax of every (query, key) pair to memory
// and reads them back: at GPT-2 small's shape (B=8, NH=12, T=1024) that is 200 MB per matrix per layer
// in bf16, and the backward reads and writes five of them. Here a block keeps one tile of 64 queries
// (or keys) in shared memory and walks the other side tile by tile, so scores exist only as a 64 x 64
// tile in shared memory. The softmax is computed "online": a running maximum m and sum l per row are
// corrected as each new tile arrives, and the output is rescaled by exp(m_old - m_new). The forward
// saves one number per row, lse = m + log(l), from which the backward recomputes any probability as
// exp(score - lse).
//
// Matrix products use the tensor cores through WMMA (16 x 16 x 16 bf16 fragments, fp32 accumulation):
// each of a block's 4 warps owns 16 rows of the tile. Softmax statistics, the rescaling and every
// accumulation are fp32; probabilities are rounded to bf16 only as operands of the next product.
//
// Backward, in three deterministic kernels (no atomics: each output element has one writer):
//   delta:  Dv[b,h,t] = <dout[t], out[t]> per head, the softmax-backward correction of each row;
//   dK, dV: one block per tile of 64 keys, looping over the query tiles at or after it;
//   dQ:     one block per tile of 64 queries, looping over the key tiles at or before it.
// The scores are recomputed in both of the last two: more arithmetic, no T x T memory.
//
// Limits: head size D = C/NH in {16, 32, 64, 128}; any T. ops.cpp falls back to the materialized
// attention otherwise.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <string>

#include "base/check.h"       // fatal
#include "base/cuda_check.h"  // CUDA_CHECK
#include "ops/memory.h"      // device_alloc: the Dv scratch is counted like everything else
#include "ops/ops_cuda.h"

namespace cuda {

namespace {

using bf16 = __nv_bfloat16;
using namespace nvcuda;

constexpr int kTile = 64;     // queries or keys per tile
constexpr int kWarps = 4;     // each owns kTile / kWarps = 16 rows of the tile
constexpr int kThreads = kWarps * 32;
constexpr int kFrag = 16;     // WMMA's m = n = k
// Shared-memory rows are padded: with a row of 128 or 256 bytes, the 16 rows a WMMA load or store
// touches would all start in the same bank, and the accesses would queue. 16 bytes more per row
// spreads them (bf16 rows: +8 elements; fp32 rows: +4).
template <int D>
constexpr int kLd = D + 8;               // bf16 tiles of D columns (q, k, v, dout)
constexpr int kLdP = kTile + 8;          // bf16 tiles of kTile columns (probabilities, dS)
constexpr int kLdS = kTile + 4;          // fp32 tiles of kTile columns (scores, dP)
template <int D>
constexpr int kLdO = D + 4;              // fp32 tiles of D columns (output, dQ, dK, dV)

using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Copies rows [row0, row0 + kTile) of one head of q, k or v (part 0, 1, 2 of qkv) into a kTile x D
// tile, 16 bytes per thread per step; rows at or past T become zeros.
template <int D>
__device__ void load_head_tile(bf16* tile, const bf16* qkv, int b, int row0, int part, int h, int T, int C) {
  constexpr int kVectors = D / 8;  // 8 bf16 per 16-byte vector
  for (int i = threadIdx.x; i < kTile * kVectors; i += kThreads) {
    const int r = i / kVectors, v = i % kVectors, t = row0 + r;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (t < T) value = *reinterpret_cast<const uint4*>(qkv + (size_t(b) * T + t) * 3 * C + part * C + h * D + v * 8);
    *reinterpret_cast<uint4*>(tile + r * kLd<D> + v * 8) = value;
  }
}

// The same for a (B,T,C) tensor (the attention output or its gradient), one head's D columns.
template <int D>
__device__ void load_btc_tile(bf16* tile, const bf16* x, int b, int row0, int h, int T, int C) {
  constexpr int kVectors = D / 8;
  for (int i = threadIdx.x; i < kTile * kVectors; i += kThreads) {
    const int r = i / kVectors, v = i % kVectors, t = row0 + r;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (t < T) value = *reinterpret_cast<const uint4*>(x + (size_t(b) * T + t) * C + h * D + v * 8);
    *reinterpret_cast<uint4*>(tile + r * kLd<D> + v * 8) = value;
  }
}

// out(16 x 64, fp32, row stride kLdS) = a(16 x D) @ b(64 x D)^T: a warp's rows against a tile's
// rows, as in scores = Q K^T. `b` read as a column-major D x 64 matrix is exactly b^T.
template <int D>
__device__ void rows_times_tile_transposed(float* out, const bf16* a, const bf16* b) {
  for (int n = 0; n < kTile / kFrag; n++) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < D / kFrag; k++) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + k * kFrag, kLd<D>);
      wmma::load_matrix_sync(fb, b + n * kFrag * kLd<D> + k * kFrag, kLd<D>);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * kFrag, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] (16 x D in D/16 fragments) += p(16 x 64, bf16, row stride kLdP) @ v(64 x D), as in O += P V.
template <int D>
__device__ void accumulate_rows_times_tile(FragAcc (&acc)[D / kFrag], const bf16* p, const bf16* v) {
  for (int n = 0; n < D / kFrag; n++) {
    for (int k = 0; k < kTile / kFrag; k++) {
      FragA fa;
      FragBRow fb;
      wmma::load_matrix_sync(fa, p + k * kFrag, kLdP);
      wmma::load_matrix_sync(fb, v + k * kFrag * kLd<D> + n * kFrag, kLd<D>);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Stores a warp's 16 x D accumulator to shared memory (row stride kLdO), for whole-row stores.
template <int D>
__device__ void store_rows(float* out, FragAcc (&acc)[D / kFrag]) {
  for (int n = 0; n < D / kFrag; n++) wmma::store_matrix_sync(out + n * kFrag, acc[n], kLdO<D>, wmma::mem_row_major);
}

// ------------------------------------------------------------------------------------------------
// Forward: one block per (query tile, head, sequence).

template <int D>
struct ForwardSmem {
  bf16 q[kTile * kLd<D>], k[kTile * kLd<D>], v[kTile * kLd<D>];
  float s[kTile * kLdS];   // scores of the current key tile
  bf16 p[kTile * kLdP];    // their probabilities (unnormalised), the operand of P V
  float o[kTile * kLdO<D>];  // the output accumulated so far, rescaled as the maximum moves
};

template <int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T,
                                                                 int C, int NH, float scale) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  ForwardSmem<D>& sm = *reinterpret_cast<ForwardSmem<D>*>(smem_bytes);
  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row0 = warp * kFrag;
  // The softmax runs two lanes per row: lane pair (2r, 2r+1) owns row row0 + r, each lane half of
  // its columns (32 of a tile's 64 scores, D/2 of the output). The running maximum m and sum l of
  // the row live in both lanes' registers; one shuffle combines the halves.
  const int row = row0 + lane / 2, half = lane % 2, query = q0 + row;
  float m = -INFINITY, l = 0.0f;

  load_head_tile<D>(sm.q, qkv, b, q0, 0, h, T, C);
  for (int i = threadIdx.x; i < kTile * kLdO<D>; i += kThreads) sm.o[i] = 0.0f;

  // Causal: the key tiles up to and including the diagonal one.
  for (int k0 = 0; k0 <= q0 && k0 < T; k0 += kTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_head_tile<D>(sm.k, qkv, b, k0, 1, h, T, C);
    load_head_tile<D>(sm.v, qkv, b, k0, 2, h, T, C);
    __syncthreads();

    rows_times_tile_transposed<D>(sm.s + row0 * kLdS, sm.q + row0 * kLd<D>, sm.k);
    __syncwarp();

    // Online softmax of this lane's 32 scores.
    const float* s_row = sm.s + row * kLdS + half * 32;
    bf16* p_row = sm.p + row * kLdP + half * 32;
    float tile_max = -INFINITY;
    for (int j = 0; j < 32; j++) {
      const int key = k0 + half * 32 + j;
      if (key <= query) tile_max = fmaxf(tile_max, s_row[j] * scale);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);  // finite: key k0 <= query
    float sum = 0.0f;
    for (int j = 0; j < 32; j++) {
      const int key = k0 + half * 32 + j;
      const float p = key <= query ? __expf(s_row[j] * scale - m_new) : 0.0f;
      p_row[j] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float correction = __expf(m - m_new);  // 0 on the first tile (m = -inf)
    m = m_new;
    l = l * correction + sum;
    float* o_row = sm.o + row * kLdO<D> + half * (D / 2);
    for (int d = 0; d < D / 2; d++) o_row[d] *= correction;
    __syncwarp();

    // O += P V for this warp's 16 rows, the accumulator passing through shared memory, where the
    // rescaling above can reach it.
    FragAcc acc[D / kFrag];
    for (int n = 0; n < D / kFrag; n++)
      wmma::load_matrix_sync(acc[n], sm.o + row0 * kLdO<D> + n * kFrag, kLdO<D>, wmma::mem_row_major);
    accumulate_rows_times_tile<D>(acc, sm.p + row0 * kLdP, sm.v);
    store_rows<D>(sm.o + row0 * kLdO<D>, acc);
    __syncwarp();
  }

  // Normalise by l; lse = m + log(l) is what the backward needs to recompute probabilities.
  if (query < T) {
    const float inv_l = 1.0f / l;
    const float* o_row = sm.o + row * kLdO<D> + half * (D / 2);
    bf16* out_row = out + (size_t(b) * T + query) * C + h * D + half * (D / 2);
    for (int d = 0; d < D / 2; d++) out_row[d] = __float2bfloat16(o_row[d] * inv_l);
    if (half == 0) lse[(size_t(b) * NH + h) * T + query] = m + logf(l);
  }
}

// ------------------------------------------------------------------------------------------------
// Backward

// Dv[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d], one warp per (b, t, h).
__global__ void flash_delta_kernel(float* delta, const bf16* dout, const bf16* out, int B, int T, int C, int NH) {
  const int D = C / NH;
  const size_t rows = size_t(B) * T * NH;
  const size_t row = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int h = int(row % NH);
  const size_t bt = row / NH;
  const bf16* x = dout + bt * C + h * D;
  const bf16* y = out + bt * C + h * D;
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) sum += __bfloat162float(x[d]) * __bfloat162float(y[d]);
  sum = warp_sum(sum);
  const size_t b = bt / T, t = bt % T;
  if (lane == 0) delta[(b * NH + h) * T + t] = sum;
}

template <int D>
struct KeySideSmem {
  bf16 k[kTile * kLd<D>], v[kTile * kLd<D>];     // this block's keys and values
  bf16 q[kTile * kLd<D>], dout[kTile * kLd<D>];  // the current query tile
  float s[kTile * (kLdS > kLdO<D> ? kLdS : kLdO<D>)];   // S^T (keys x queries), later dK for the store
  float dp[kTile * (kLdS > kLdO<D> ? kLdS : kLdO<D>)];  // dP^T, later dV for the store
  bf16 p[kTile * kLdP], ds[kTile * kLdP];
  float lse[kTile], delta[kTile];
};

// dK and dV of one tile of 64 keys: every query tile at or after it contributes. Per query tile,
// in transposed form (rows = this warp's 16 keys):
//   P^T = exp(scale K Q^T - lse)   dV += P^T dO   dP^T = V dO^T   dS^T = P^T (dP^T - Dv)   dK += dS^T Q
// and at the end dK *= scale.
template <int D>
__global__ void __launch_bounds__(kThreads) flash_backward_kv_kernel(bf16* dqkv, const bf16* qkv, const bf16* dout,
                                                                     const float* lse, const float* delta, int T,
                                                                     int C, int NH, float scale) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  KeySideSmem<D>& sm = *reinterpret_cast<KeySideSmem<D>*>(smem_bytes);
  const int k0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row0 = warp * kFrag;
  const float* lse_bh = lse + (size_t(b) * NH + h) * T;
  const float* delta_bh = delta + (size_t(b) * NH + h) * T;

  load_head_tile<D>(sm.k, qkv, b, k0, 1, h, T, C);
  load_head_tile<D>(sm.v, qkv, b, k0, 2, h, T, C);
  FragAcc dk[D / kFrag], dv[D / kFrag];
  for (int n = 0; n < D / kFrag; n++) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  for (int q0 = k0; q0 < T; q0 += kTile) {
    __syncthreads();  // the previous query tile is no longer read
    load_head_tile<D>(sm.q, qkv, b, q0, 0, h, T, C);
    load_btc_tile<D>(sm.dout, dout, b, q0, h, T, C);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      sm.lse[i] = q0 + i < T ? lse_bh[q0 + i] : 0.0f;
      sm.delta[i] = q0 + i < T ? delta_bh[q0 + i] : 0.0f;
    }
    __syncthreads();

    float* s = sm.s + row0 * kLdS;
    float* dp = sm.dp + row0 * kLdS;
    rows_times_tile_transposed<D>(s, sm.k + row0 * kLd<D>, sm.q);     // S^T = K Q^T
    rows_times_tile_transposed<D>(dp, sm.v + row0 * kLd<D>, sm.dout); // dP^T = V dO^T
    __syncwarp();
    for (int r = 0; r < kFrag; r++) {
      const int key = k0 + row0 + r;
      for (int col = lane; col < kTile; col += 32) {
        const int query = q0 + col;
        const float p = (query >= key && query < T) ? __expf(s[r * kLdS + col] * scale - sm.lse[col]) : 0.0f;
        sm.p[(row0 + r) * kLdP + col] = __float2bfloat16(p);
        sm.ds[(row0 + r) * kLdP + col] = __float2bfloat16(p * (dp[r * kLdS + col] - sm.delta[col]));
      }
    }
    __syncwarp();
    accumulate_rows_times_tile<D>(dv, sm.p + row0 * kLdP, sm.dout);  // dV += P^T dO
    accumulate_rows_times_tile<D>(dk, sm.ds + row0 * kLdP, sm.q);    // dK += dS^T Q
  }

  // dqkv += (scale dK, dV), through shared memory so that each lane adds whole rows in order.
  __syncthreads();
  store_rows<D>(sm.s + row0 * kLdO<D>, dk);
  store_rows<D>(sm.dp + row0 * kLdO<D>, dv);
  __syncwarp();
  for (int r = 0; r < kFrag; r++) {
    const int key = k0 + row0 + r;
    if (key >= T) break;
    bf16* row = dqkv + (size_t(b) * T + key) * 3 * C + h * D;
    for (int d = lane; d < D; d += 32) {
      row[C + d] = __float2bfloat16(__bfloat162float(row[C + d]) + scale * sm.s[(row0 + r) * kLdO<D> + d]);
      row[2 * C + d] = __float2bfloat16(__bfloat162float(row[2 * C + d]) + sm.dp[(row0 + r) * kLdO<D> + d]);
    }
  }
}

template <int D>
struct QuerySideSmem {
  bf16 q[kTile * kLd<D>], dout[kTile * kLd<D>];  // this block's queries and their output gradients
  bf16 k[kTile * kLd<D>], v[kTile * kLd<D>];     // the current key tile
  float s[kTile * (kLdS > kLdO<D> ? kLdS : kLdO<D>)];  // scores, later dQ for the store
  float dp[kTile * kLdS];
  bf16 ds[kTile * kLdP];
  float lse[kTile], delta[kTile];
};

// dQ of one tile of 64 queries: every key tile at or before it contributes.
//   P = exp(scale Q K^T - lse)   dP = dO V^T   dS = P (dP - Dv)   dQ += dS K,   then dQ *= scale.
template <int D>
__global__ void __launch_bounds__(kThreads) flash_backward_q_kernel(bf16* dqkv, const bf16* qkv, const bf16* dout,
                                                                    const float* lse, const float* delta, int T,
                                                                    int C, int NH, float scale) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  QuerySideSmem<D>& sm = *reinterpret_cast<QuerySideSmem<D>*>(smem_bytes);
  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row0 = warp * kFrag;

  load_head_tile<D>(sm.q, qkv, b, q0, 0, h, T, C);
  load_btc_tile<D>(sm.dout, dout, b, q0, h, T, C);
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    const size_t at = (size_t(b) * NH + h) * T + q0 + i;
    sm.lse[i] = q0 + i < T ? lse[at] : 0.0f;
    sm.delta[i] = q0 + i < T ? delta[at] : 0.0f;
  }
  FragAcc dq[D / kFrag];
  for (int n = 0; n < D / kFrag; n++) wmma::fill_fragment(dq[n], 0.0f);

  for (int k0 = 0; k0 <= q0 && k0 < T; k0 += kTile) {
    __syncthreads();
    load_head_tile<D>(sm.k, qkv, b, k0, 1, h, T, C);
    load_head_tile<D>(sm.v, qkv, b, k0, 2, h, T, C);
    __syncthreads();

    float* s = sm.s + row0 * kLdS;
    float* dp = sm.dp + row0 * kLdS;
    rows_times_tile_transposed<D>(s, sm.q + row0 * kLd<D>, sm.k);      // S = Q K^T
    rows_times_tile_transposed<D>(dp, sm.dout + row0 * kLd<D>, sm.v);  // dP = dO V^T
    __syncwarp();
    for (int r = 0; r < kFrag; r++) {
      const int row = row0 + r, query = q0 + row;
      for (int col = lane; col < kTile; col += 32) {
        const int key = k0 + col;
        const float p = key <= query ? __expf(s[r * kLdS + col] * scale - sm.lse[row]) : 0.0f;
        sm.ds[row * kLdP + col] = __float2bfloat16(p * (dp[r * kLdS + col] - sm.delta[row]));
      }
    }
    __syncwarp();
    accumulate_rows_times_tile<D>(dq, sm.ds + row0 * kLdP, sm.k);  // dQ += dS K
  }

  __syncthreads();
  store_rows<D>(sm.s + row0 * kLdO<D>, dq);
  __syncwarp();
  for (int r = 0; r < kFrag; r++) {
    const int query = q0 + row0 + r;
    if (query >= T) break;
    bf16* row = dqkv + (size_t(b) * T + query) * 3 * C + h * D;
    for (int d = lane; d < D; d += 32)
      row[d] = __float2bfloat16(__bfloat162float(row[d]) + scale * sm.s[(row0 + r) * kLdO<D> + d]);
  }
}

// Launches `kernel` over (tiles of T, heads, sequences) with its shared memory. Past 48 KB a kernel
// must ask for it (a microsecond; done at every launch rather than cached per kernel).
template <typename Smem, typename Kernel, typename... Args>
void launch_tiled(Kernel kernel, int B, int T, int NH, Args... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))));
  const dim3 grid(unsigned((T + kTile - 1) / kTile), unsigned(NH), unsigned(B));
  kernel<<<grid, kThreads, sizeof(Smem), stream()>>>(args...);
  CUDA_CHECK(cudaGetLastError());
}

Scratch g_delta(Device::CUDA);  // Dv of the backward (memory.h)

template <int D>
void forward_for(void* out, float* lse, const void* qkv, int B, int T, int C, int NH) {
  launch_tiled<ForwardSmem<D>>(flash_forward_kernel<D>, B, T, NH, static_cast<bf16*>(out), lse,
                               static_cast<const bf16*>(qkv), T, C, NH, 1.0f / sqrtf(float(D)));
}

template <int D>
void backward_for(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* delta, int B, int T,
                  int C, int NH) {
  const float scale = 1.0f / sqrtf(float(D));
  launch_tiled<KeySideSmem<D>>(flash_backward_kv_kernel<D>, B, T, NH, static_cast<bf16*>(dqkv),
                               static_cast<const bf16*>(qkv), static_cast<const bf16*>(dout), lse, delta, T, C, NH,
                               scale);
  launch_tiled<QuerySideSmem<D>>(flash_backward_q_kernel<D>, B, T, NH, static_cast<bf16*>(dqkv),
                                 static_cast<const bf16*>(qkv), static_cast<const bf16*>(dout), lse, delta, T, C, NH,
                                 scale);
}

template <int D>
bool fits(size_t limit) {
  return limit == 0 || (sizeof(ForwardSmem<D>) <= limit && sizeof(KeySideSmem<D>) <= limit &&
                        sizeof(QuerySideSmem<D>) <= limit);
}

}  // namespace

bool flash_attention_supported(DType dt, int C, int NH) {
  if (dt != DType::BF16 || NH <= 0 || C % NH != 0) return false;
  // The tiles of a head size must fit the GPU's shared memory (without a GPU, only the head size
  // decides: nothing will run).
  const size_t limit = shared_memory_per_block();
  switch (C / NH) {
    case 16: return fits<16>(limit);
    case 32: return fits<32>(limit);
    case 64: return fits<64>(limit);
    case 128: return fits<128>(limit);
  }
  return false;
}

void attention_forward_flash(void* out, float* lse, const void* qkv, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  switch (C / NH) {
    case 16: return forward_for<16>(out, lse, qkv, B, T, C, NH);
    case 32: return forward_for<32>(out, lse, qkv, B, T, C, NH);
    case 64: return forward_for<64>(out, lse, qkv, B, T, C, NH);
    case 128: return forward_for<128>(out, lse, qkv, B, T, C, NH);
  }
  fatal("attention_forward_flash: head size " + std::to_string(C / NH) + " is not 16, 32, 64 or 128");
}

void attention_backward_flash(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, int B,
                              int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const size_t rows = size_t(B) * T * NH;
  float* delta = static_cast<float*>(g_delta.get(rows * sizeof(float)));
  flash_delta_kernel<<<unsigned((rows * 32 + 255) / 256), 256, 0, stream()>>>(
      delta, static_cast<const bf16*>(dout), static_cast<const bf16*>(out), B, T, C, NH);
  CUDA_CHECK(cudaGetLastError());
  switch (C / NH) {
    case 16: return backward_for<16>(dqkv, dout, qkv, lse, delta, B, T, C, NH);
    case 32: return backward_for<32>(dqkv, dout, qkv, lse, delta, B, T, C, NH);
    case 64: return backward_for<64>(dqkv, dout, qkv, lse, delta, B, T, C, NH);
    case 128: return backward_for<128>(dqkv, dout, qkv, lse, delta, B, T, C, NH);
  }
  fatal("attention_backward_flash: head size " + std::to_string(C / NH) + " is not 16, 32, 64 or 128");
}

}  // namespace cuda
