// ops_cpu_attention.cpp: the CPU attention of ops_cpu.h, forward and backward (split from ops_cpu.cpp,
// whose conventions it keeps: single-threaded, deterministic, every backward accumulating).
#include "ops/ops_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/ops_cpu_internal.h"  // max_of, exp_shifted, dot_double

namespace cpu {

using internal::dot_double;
using internal::exp_shifted;
using internal::max_of;

// ----------------------------------------------------------------------------------------------------------
// attention: for every (b, t, head), the row of scores of query t against keys 0..t, then the weighted
// sum of values. Entries t2 > t are masked: preatt holds -inf there and att holds 0, which is what the
// softmax of -inf gives; only the causal part t2 <= t is meaningful (a CUDA version may compute the rest).
//
// One head at a time, as CPU flash-style kernels do it: the head's queries, keys and values are copied
// once into small zero-padded blocks (in L1 and L2), and every product of the head, forward and
// backward, is a product of such blocks, computed in register tiles of kRows rows x 16 (or 8) columns
// by one micro-kernel in the manner of matmul_cpu.cpp's (the head size, or the keys, as its depth):
//   forward    S = scale Q K^T             P = softmax(S) row by row        O = P V
//   backward   dP = dO V^T                 dS = P * (dP - <P, dP>)          dQ = scale dS K
//              dK = scale dS^T Q           dV = P^T dO
// The causal mask skips every tile right of the diagonal; the tiles on it are computed whole, and
// the entries above the diagonal that a tile's sum runs over are zeros in P and dS (which dK and dV
// read down their columns, without a transposed copy), so they add nothing. Every element is one sum
// in a fixed order (over the depth, increasing), which depends only on T and the head size: results
// do not depend on B, NH or which rank computes a head, and the same shapes give the same bits.
// The heads' rows are copied into their blocks, and the results out of them, for a group of heads at a
// time (gather_heads, scatter_heads): every head of a sequence at the presets, whose rows of qkv,
// dout, out and dqkv are then read and written straight through. The scratch, per thread, holds a
// group's blocks (in the backward six of (T, hs) a head) and two of (T, T), rounded up to whole tiles
// (at T = 1024, head size 64, a group of one head: about 10 MB, an eighth of one of the (B,NH,T,T)
// arrays the op is given).

// The kernel's own functions live in a named namespace, so that a profile books them to the attention
// (make profile).
namespace {
namespace attention_tiles {
constexpr int kRows = 6;   // rows of a register tile: 6 x 16 floats are 12 of the 16 AVX2 registers
constexpr int kCols = 16;  // columns of the wide tile (two AVX2 vectors); the narrow one has 8

int round_up(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// One scratch buffer per thread (ranks may be threads), grown on demand and kept, 64-byte aligned.
float* attention_scratch(size_t n) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < n + 16) scratch.resize(n + 16);
  const uintptr_t at = reinterpret_cast<uintptr_t>(scratch.data());
  return scratch.data() + ((64 - at % 64) % 64) / sizeof(float);
}

// As matmul_cpu.cpp's micro-kernel, and for its reasons: without the loop vectorizer GCC's SLP
// vectorizer gives broadcasts and fused multiply-adds on accumulators kept in registers, and
// pressure-aware scheduling keeps the A values from spilling them.
#if defined(__GNUC__) && !defined(__clang__)
#define ATTENTION_TILE_ATTR __attribute__((optimize("no-tree-loop-vectorize", "schedule-insns", "sched-pressure")))
#else
#define ATTENTION_TILE_ATTR
#endif

// c[i][j] = scale * sum over k < depth, in increasing k, of A[i][k] * b[k * ldb + j], for i < kRows,
// j < NR; rows of c are ldc apart. A is read where it lies: along its rows, A[i][k] = a[i * lda + k],
// or, Transposed, down its columns, A[i][k] = a[k * lda + i] (the transpose of a row-major matrix,
// without copying it). Constant trip counts but depth, so that the accumulators live in registers
// for the whole sum; the layout of A is a template parameter, as a stride known at compile time
// (a run-time one made the forward's tiles 1.5x slower).
template <int NR, bool Transposed>
ATTENTION_TILE_ATTR void tile_product(float* __restrict c, size_t ldc, const float* __restrict a, size_t lda,
                                      const float* __restrict b, size_t ldb, int depth, float scale) {
  float acc[kRows][NR];
#pragma GCC unroll 8
  for (int i = 0; i < kRows; i++) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; j++) acc[i][j] = 0.0f;
  }
  for (int k = 0; k < depth; k++) {
    const float* __restrict b_row = b + size_t(k) * ldb;
#pragma GCC unroll 8
    for (int i = 0; i < kRows; i++) {
      const float ai = Transposed ? a[size_t(k) * lda + i] : a[size_t(i) * lda + k];
#pragma GCC unroll 16
      for (int j = 0; j < NR; j++) acc[i][j] += ai * b_row[j];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kRows; i++) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; j++) c[size_t(i) * ldc + j] = acc[i][j] * scale;
  }
}

// Columns [0, width) of the kRows rows of c, in wide tiles and then, where 8 columns or fewer are
// left, one narrow one; b has at least round_up(width, 8) columns (zero-padded ones contribute zeros
// to columns of c that the caller does not read).
template <bool Transposed = false>
void tile_row(float* c, size_t ldc, const float* a, size_t lda, const float* b, size_t ldb, int depth, int width,
              float scale) {
  int j0 = 0;
  for (; width - j0 > 8; j0 += kCols)
    tile_product<kCols, Transposed>(c + j0, ldc, a, lda, b + j0, ldb, depth, scale);
  if (j0 < width) tile_product<8, Transposed>(c + j0, ldc, a, lda, b + j0, ldb, depth, scale);
}

// d[0..n) = s[0..n), 8 floats at a time: a plain loop over a head's few channels became a call to
// memcpy per row, whose overhead was a tenth of the forward's time.
inline void copy_row(float* __restrict d, const float* __restrict s, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) d[i + j] = s[i + j];
  }
  for (; i < n; i++) d[i] = s[i];
}

// Where one part of a group of heads (their queries, keys, values or output gradients) is copied:
// head j of the group into blocks + j * stride, a (Tr, hsp) block of rows, or, transposed, a (hs, Tc)
// block whose column t is row t; zero-padded either way.
struct PartBlocks {
  float* blocks;
  size_t stride;
  bool transposed;
};

// Heads [h0, h0 + gh) of the first `parts` parts of rows 0..T-1 of src (rows ld apart; part p of head
// h at channels p * C + h * hs) into their blocks. Row after row of src, every head of the group from
// each: one head's channels are short pieces of long rows (qkv's are 3C floats), which copied one
// head at a time came from memory piece by piece, with misses the hardware's prefetchers do not
// follow; a group's pieces of a row lie side by side, and at these sizes a group is every head, so
// src is read straight through.
void gather_heads(const PartBlocks* part, int parts, const float* src, size_t ld, int C, int T, int h0, int gh,
                  int hs, int hsp, int Tr, int Tc) {
  for (int t = 0; t < T; t++) {
    const float* row = src + size_t(t) * ld;
    for (int p = 0; p < parts; p++) {
      for (int j = 0; j < gh; j++) {
        const float* __restrict s = row + size_t(p) * C + size_t(h0 + j) * hs;
        float* __restrict block = part[p].blocks + size_t(j) * part[p].stride;
        if (part[p].transposed) {
          for (int i = 0; i < hs; i++) block[size_t(i) * Tc + t] = s[i];
        } else {
          float* __restrict d = block + size_t(t) * hsp;
          copy_row(d, s, hs);
          for (int i = hs; i < hsp; i++) d[i] = 0.0f;
        }
      }
    }
  }
  for (int p = 0; p < parts; p++) {  // the padding: rows T..Tr-1, or columns T..Tc-1 transposed
    for (int j = 0; j < gh; j++) {
      float* __restrict block = part[p].blocks + size_t(j) * part[p].stride;
      if (part[p].transposed) {
        for (int i = 0; i < hs; i++)
          for (int t = T; t < Tc; t++) block[size_t(i) * Tc + t] = 0.0f;
      } else {
        for (size_t k = size_t(T) * hsp; k < size_t(Tr) * hsp; k++) block[k] = 0.0f;
      }
    }
  }
}

// gather_heads' reverse, for blocks of rows: rows 0..T-1 of parts' blocks (part p of head j of the
// group at blocks + (p * g + j) * stride) into rows 0..T-1 of dst, row after row. Added, or, not
// accumulating, copied (a gradient's first and only contribution: no pass zeroing dst before, nor
// its read).
void scatter_heads(float* dst, size_t ld, int C, int parts, const float* blocks, size_t stride, int g, int T,
                   int h0, int gh, int hs, int hsp, bool accumulate) {
  for (int t = 0; t < T; t++) {
    float* row = dst + size_t(t) * ld;
    for (int p = 0; p < parts; p++) {
      for (int j = 0; j < gh; j++) {
        float* __restrict d = row + size_t(p) * C + size_t(h0 + j) * hs;
        const float* __restrict s = blocks + (size_t(p) * g + j) * stride + size_t(t) * hsp;
        if (accumulate) {
          for (int i = 0; i < hs; i++) d[i] += s[i];
        } else {
          copy_row(d, s, hs);
        }
      }
    }
  }
}

// Heads gathered at once: as many as keep their blocks within kGroupBytes (about an L2), at least one.
// (Every head at the presets; at GPT-2's T = 1024 and head size 64, one.)
constexpr size_t kGroupBytes = size_t(512) << 10;
int heads_per_group(size_t floats_per_head, int NH) {
  return std::max(1, std::min(NH, int(kGroupBytes / (floats_per_head * sizeof(float)))));
}

// The sizes of one head's blocks: Tr rows (whole tiles), Tc columns of keys (whole wide tiles, and at
// least Tr: dK's and dV's last tile reads dS and P down their columns as far as column Tr - 1), hsp
// columns of head channels (whole narrow tiles).
struct HeadBlocks {
  int Tr, Tc, hsp;
  HeadBlocks(int T, int hs) : Tr(round_up(T, kRows)), Tc(round_up(Tr, kCols)), hsp(round_up(hs, 8)) {}
  size_t rows_block() const { return size_t(Tr) * hsp; }   // (Tr, hsp): queries, keys, values, gradients
  size_t square_block() const { return size_t(Tr) * Tc; }  // (Tr, Tc): scores, probabilities, their gradients
  size_t transposed_block(int hs) const { return size_t(hs) * Tc; }
};
}  // namespace attention_tiles
}  // namespace

using namespace attention_tiles;

void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int C3 = 3 * C;
  const int hs = C / NH;  // head size
  const float scale = 1.0f / std::sqrt(float(hs));
  const HeadBlocks blk(T, hs);
  const int Tr = blk.Tr, Tc = blk.Tc, hsp = blk.hsp;
  const size_t rows = blk.rows_block(), transposed = blk.transposed_block(hs);
  const int g = heads_per_group(3 * rows + transposed, NH);
  float* queries_g = attention_scratch(g * (3 * rows + transposed) + blk.square_block() + Tc);
  float* values_g = queries_g + g * rows;       // (Tr, hsp) a head
  float* keys_t_g = values_g + g * rows;        // (hs, Tc) a head
  float* outputs_g = keys_t_g + g * transposed; // (Tr, hsp) a head
  float* probs = outputs_g + g * rows;          // (Tr, Tc): scores, then probabilities
  float* exps = probs + blk.square_block();     // one row
  const PartBlocks parts[3] = {{queries_g, rows, false}, {keys_t_g, transposed, true}, {values_g, rows, false}};

  for (int b = 0; b < B; b++) {
    const float* qkv_b = qkv + size_t(b) * T * C3;
    for (int h = 0; h < NH; h++) {
      const int j = h % g;  // the head's place in its group, gathered with the group's first
      if (j == 0) gather_heads(parts, 3, qkv_b, C3, C, T, h, std::min(g, NH - h), hs, hsp, Tr, Tc);
      const float* queries = queries_g + j * rows;
      const float* keys_t = keys_t_g + j * transposed;
      const float* values = values_g + j * rows;
      float* outputs = outputs_g + j * rows;
      float* preatt_head = preatt ? preatt + (size_t(b) * NH + h) * T * T : nullptr;
      float* att_head = att + (size_t(b) * NH + h) * T * T;

      for (int t0 = 0; t0 < Tr; t0 += kRows) {
        const int keys = std::min(t0 + kRows, T);  // the tile's rows see keys 0..keys-1
        float* tile = probs + size_t(t0) * Tc;
        tile_row(tile, Tc, queries + size_t(t0) * hsp, hsp, keys_t, Tc, hs, keys, scale);

        // softmax over each row's causal part, shifted by its maximum so that exp() never overflows.
        // The row's probabilities go to att and stay in probs for O = P V, with zeros where the
        // tile's sum runs past the diagonal.
        for (int t = t0; t < std::min(t0 + kRows, T); t++) {
          const int n = t + 1;  // keys 0..t
          float* __restrict scores = probs + size_t(t) * Tc;
          float* __restrict att_row = att_head + size_t(t) * T;
          if (preatt_head) {
            float* __restrict preatt_row = preatt_head + size_t(t) * T;
            for (int t2 = 0; t2 < n; t2++) preatt_row[t2] = scores[t2];
            for (int t2 = n; t2 < T; t2++) preatt_row[t2] = -INFINITY;
          }
          const float maxval = max_of(scores, n);
          const double expsum = exp_shifted(exps, scores, maxval, n);
          const float inv_expsum = float(1.0 / expsum);
          for (int t2 = 0; t2 < n; t2++) scores[t2] = att_row[t2] = exps[t2] * inv_expsum;
          for (int t2 = n; t2 < T; t2++) att_row[t2] = 0.0f;
          for (int t2 = n; t2 < keys; t2++) scores[t2] = 0.0f;
        }
        tile_row(outputs + size_t(t0) * hsp, hsp, tile, Tc, values, hsp, keys, hs, 1.0f);
      }
      // After the group's last head, the group's outputs into out, row after row.
      const int h0 = h - j, gh = std::min(g, NH - h0);
      if (j == gh - 1) scatter_heads(out + size_t(b) * T * C, C, C, 1, outputs_g, rows, g, T, h0, gh, hs, hsp, false);
    }
  }
}

void attention_backward(float* dqkv, float* dpreatt, float* /*datt: not written, below*/, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH, bool accumulate) {
  const int C3 = 3 * C;
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const HeadBlocks blk(T, hs);
  const int Tr = blk.Tr, Tc = blk.Tc, hsp = blk.hsp;
  const size_t rows = blk.rows_block(), transposed = blk.transposed_block(hs);
  const int g = heads_per_group(6 * rows + transposed, NH);
  float* queries_g = attention_scratch(g * (6 * rows + transposed) + 2 * blk.square_block());
  float* keys_g = queries_g + g * rows;        // (Tr, hsp) a head
  float* douts_g = keys_g + g * rows;          // (Tr, hsp) a head
  float* values_t_g = douts_g + g * rows;      // (hs, Tc) a head
  float* grads_g = values_t_g + g * transposed;  // (Tr, hsp) a head: its dQ, then the group's dKs, then dVs
  float* dscores = grads_g + 3 * g * rows;     // (Tr, Tc): dP, then scale * dS
  float* probs = dscores + blk.square_block(); // (Tr, Tc): att's causal part, zero-padded
  const PartBlocks parts[3] = {{queries_g, rows, false}, {keys_g, rows, false}, {values_t_g, transposed, true}};
  const PartBlocks dout_part = {douts_g, rows, false};

  for (int b = 0; b < B; b++) {
    const float* qkv_b = qkv + size_t(b) * T * C3;
    float* dqkv_b = dqkv + size_t(b) * T * C3;
    for (int h = 0; h < NH; h++) {
      const int j = h % g;  // the head's place in its group, gathered with the group's first
      if (j == 0) {
        gather_heads(parts, 3, qkv_b, C3, C, T, h, std::min(g, NH - h), hs, hsp, Tr, Tc);
        gather_heads(&dout_part, 1, dout + size_t(b) * T * C, C, C, T, h, std::min(g, NH - h), hs, hsp, Tr, Tc);
      }
      const float* queries = queries_g + j * rows;
      const float* keys = keys_g + j * rows;
      const float* douts = douts_g + j * rows;
      const float* values_t = values_t_g + j * transposed;
      float* dq = grads_g + j * rows;
      float* dk = grads_g + (g + j) * rows;
      float* dv = grads_g + (2 * g + j) * rows;
      const float* att_head = att + (size_t(b) * NH + h) * T * T;
      float* dpreatt_head = dpreatt + (size_t(b) * NH + h) * T * T;

      for (int t0 = 0; t0 < Tr; t0 += kRows) {
        const int keys_seen = std::min(t0 + kRows, T);
        // dP = dO V^T: out = sum_t2 att[t2] * value[t2], so this is the gradient into att. The
        // (B,NH,T,T) datt is scratch whose contents no caller reads (ops.h): it is not written.
        tile_row(dscores + size_t(t0) * Tc, Tc, douts + size_t(t0) * hsp, hsp, values_t, Tc, hs, keys_seen, 1.0f);
        // softmax: the Jacobian is diag(att) - att att^T, so its product with datt is
        // att * (datt - <att, datt>): O(T) per row instead of building the T x T Jacobian. Each row
        // of dS and of att is zero past the diagonal as far as a tile's sum reads it: to the end of
        // this tile's keys, and in the last tile's rows to Tr, where dK's and dV's last tile reads
        // them down their columns.
        const int zero_to = keys_seen == T ? Tr : keys_seen;
        for (int t = t0; t < std::min(t0 + kRows, T); t++) {
          const int n = t + 1;
          const float* __restrict att_row = att_head + size_t(t) * T;
          float* __restrict ds_row = dscores + size_t(t) * Tc;
          float* __restrict probs_row = probs + size_t(t) * Tc;
          float* __restrict dpreatt_row = dpreatt_head + size_t(t) * T;
          const float weighted_datt = float(dot_double(att_row, ds_row, n));
          for (int t2 = 0; t2 < n; t2++) {
            const float p = att_row[t2];
            const float d = p * (ds_row[t2] - weighted_datt);
            dpreatt_row[t2] = d;
            ds_row[t2] = d * scale;  // preatt = scale * <query, key>
            probs_row[t2] = p;
          }
          for (int t2 = n; t2 < zero_to; t2++) ds_row[t2] = probs_row[t2] = 0.0f;
        }
        // dQ = scale dS K, over the keys this tile's rows see
        tile_row(dq + size_t(t0) * hsp, hsp, dscores + size_t(t0) * Tc, Tc, keys, hsp, keys_seen, hs, 1.0f);
      }

      // dK = (scale dS)^T Q and dV = P^T dO: row t2 gathers the rows t >= t2 that attended to key t2,
      // dS and P read down their columns t2..t2 + kRows - 1 from row t0 on (zero above the diagonal).
      for (int t0 = 0; t0 < Tr; t0 += kRows) {
        tile_row<true>(dk + size_t(t0) * hsp, hsp, dscores + size_t(t0) * Tc + t0, Tc, queries + size_t(t0) * hsp,
                       hsp, T - t0, hs, 1.0f);
      }
      for (int t0 = 0; t0 < Tr; t0 += kRows) {
        tile_row<true>(dv + size_t(t0) * hsp, hsp, probs + size_t(t0) * Tc + t0, Tc, douts + size_t(t0) * hsp, hsp,
                       T - t0, hs, 1.0f);
      }
      // After the group's last head, the group's dQ, dK and dV into dqkv, row after row.
      const int h0 = h - j, gh = std::min(g, NH - h0);
      if (j == gh - 1) scatter_heads(dqkv_b, C3, C, 3, grads_g, rows, g, T, h0, gh, hs, hsp, accumulate);
    }
  }
}

}  // namespace cpu
