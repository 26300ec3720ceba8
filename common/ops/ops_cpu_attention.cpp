// ops_cpu_attention.cpp: the CPU attention of ops_cpu.h, forward and backward (split from ops_cpu.cpp,
// whose conventions it keeps: single-threaded, deterministic, every backward accumulating).
#include "ops/ops_cpu.h"

#include <algorithm>
#include <cmath>
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
// The loops run head by head (b, h, then t), so that one head's keys and values can be copied once,
// transposed, into a scratch (hs, Tp) block: a row of scores is then a sum over the hs channels of
// contiguous rows of that block, vectorized across the keys t2, with each score still summed over its
// channels in increasing order, as a plain dot product would be. (A dot product of its own cannot be
// vectorized without reordering its sum.) Every per-element sum keeps one fixed order, so results do not
// depend on B, NH or which rank computes a head.

namespace {
constexpr int kKeyBlock = 32;  // scores computed together: four AVX2 vectors of accumulators

int round_up(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// One scratch buffer per thread (ranks may be threads), grown on demand and kept.
float* attention_scratch(size_t n) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}

// dst(hs, Tp)[i][t2] = src[t2 * stride + i] for t2 < T, zero for T <= t2 < Tp.
void transpose_head(float* __restrict dst, const float* __restrict src, int T, int Tp, int hs, int stride) {
  for (int i = 0; i < hs; i++) {
    float* __restrict row = dst + size_t(i) * Tp;
    for (int t2 = 0; t2 < T; t2++) row[t2] = src[size_t(t2) * stride + i];
    for (int t2 = T; t2 < Tp; t2++) row[t2] = 0.0f;
  }
}

// out[t2] = scale * sum_i x[i] * block[i][t2] for t2 < round_up(n, kKeyBlock): block is (hs, Tp), Tp a
// multiple of kKeyBlock. Each sum runs over i in increasing order, from 0.
void scaled_dots(float* __restrict out, const float* __restrict x, const float* __restrict block, int Tp, int hs,
                 int n, float scale) {
  for (int t0 = 0; t0 < n; t0 += kKeyBlock) {
    // The first channel's products added to zero (the sum's first step, as written), not an array
    // zeroed first: GCC zeroed it on the stack with `rep stos`, tens of cycles per block.
    float acc[kKeyBlock];
    for (int j = 0; j < kKeyBlock; j++) acc[j] = 0.0f + x[0] * block[t0 + j];
    for (int i = 1; i < hs; i++) {
      const float xi = x[i];
      const float* __restrict row = block + size_t(i) * Tp + t0;
      for (int j = 0; j < kKeyBlock; j++) acc[j] += xi * row[j];
    }
    for (int j = 0; j < kKeyBlock; j++) out[t0 + j] = acc[j] * scale;
  }
}

// scaled_dots for two vectors x0 and x1 against the same block, each exactly as scaled_dots computes
// it (the same products, summed over i in the same order). One vector's four accumulators make chains
// of dependent multiply-adds that wait on each other's latency; two vectors' eight keep both
// multiply-add units busy, and each row of the block is loaded once for both.
void scaled_dots2(float* __restrict out0, float* __restrict out1, const float* __restrict x0,
                  const float* __restrict x1, const float* __restrict block, int Tp, int hs, int n, float scale) {
  for (int t0 = 0; t0 < n; t0 += kKeyBlock) {
    float acc0[kKeyBlock], acc1[kKeyBlock];  // from the first channel, as in scaled_dots
    for (int j = 0; j < kKeyBlock; j++) acc0[j] = 0.0f + x0[0] * block[t0 + j];
    for (int j = 0; j < kKeyBlock; j++) acc1[j] = 0.0f + x1[0] * block[t0 + j];
    for (int i = 1; i < hs; i++) {
      const float a0 = x0[i], a1 = x1[i];
      const float* __restrict row = block + size_t(i) * Tp + t0;
      for (int j = 0; j < kKeyBlock; j++) acc0[j] += a0 * row[j];
      for (int j = 0; j < kKeyBlock; j++) acc1[j] += a1 * row[j];
    }
    for (int j = 0; j < kKeyBlock; j++) out0[t0 + j] = acc0[j] * scale, out1[t0 + j] = acc1[j] * scale;
  }
}

// y[i] += sum over r < n, in increasing r, of (coef[r * coef_stride] * coef_scale) * rows[r * row_stride + i],
// for i < width. The sums of 32 (then 8) columns at a time stay in registers across all n rows,
// instead of a load and a store of y per row (which made each row wait for the previous row's store).
void accumulate_weighted_rows(float* __restrict y, const float* __restrict coef, size_t coef_stride, float coef_scale,
                              const float* __restrict rows, size_t row_stride, int n, int width) {
  int i0 = 0;
  for (; i0 + 32 <= width; i0 += 32) {
    float acc[32];
    for (int j = 0; j < 32; j++) acc[j] = y[i0 + j];
    for (int r = 0; r < n; r++) {
      const float g = coef[r * coef_stride] * coef_scale;
      const float* __restrict row = rows + r * row_stride + i0;
      for (int j = 0; j < 32; j++) acc[j] += g * row[j];
    }
    for (int j = 0; j < 32; j++) y[i0 + j] = acc[j];
  }
  for (; i0 + 8 <= width; i0 += 8) {
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = y[i0 + j];
    for (int r = 0; r < n; r++) {
      const float g = coef[r * coef_stride] * coef_scale;
      const float* __restrict row = rows + r * row_stride + i0;
      for (int j = 0; j < 8; j++) acc[j] += g * row[j];
    }
    for (int j = 0; j < 8; j++) y[i0 + j] = acc[j];
  }
  for (; i0 < width; i0++) {
    float acc = y[i0];
    for (int r = 0; r < n; r++) acc += (coef[r * coef_stride] * coef_scale) * rows[r * row_stride + i0];
    y[i0] = acc;
  }
}

// Two outputs from the same n rows at once: y0 with coef0, y1 with coef1, each exactly as
// accumulate_weighted_rows computes it (the same products, summed over r in the same order). One
// output's 4 vector accumulators make a chain of dependent multiply-adds per row, which waits on the
// latency of the previous one; two outputs' 8 keep both multiply-add units busy, and each row is
// loaded once for both.
void accumulate_weighted_rows2(float* __restrict y0, float* __restrict y1, const float* __restrict coef0,
                               const float* __restrict coef1, size_t coef_stride, float coef_scale,
                               const float* __restrict rows, size_t row_stride, int n, int width) {
  int i0 = 0;
  for (; i0 + 32 <= width; i0 += 32) {
    float acc0[32], acc1[32];
    for (int j = 0; j < 32; j++) acc0[j] = y0[i0 + j], acc1[j] = y1[i0 + j];
    for (int r = 0; r < n; r++) {
      const float g0 = coef0[r * coef_stride] * coef_scale, g1 = coef1[r * coef_stride] * coef_scale;
      const float* __restrict row = rows + r * row_stride + i0;
      for (int j = 0; j < 32; j++) acc0[j] += g0 * row[j];
      for (int j = 0; j < 32; j++) acc1[j] += g1 * row[j];
    }
    for (int j = 0; j < 32; j++) y0[i0 + j] = acc0[j], y1[i0 + j] = acc1[j];
  }
  if (i0 < width) {
    const int rest = width - i0;
    accumulate_weighted_rows(y0 + i0, coef0, coef_stride, coef_scale, rows + i0, row_stride, n, rest);
    accumulate_weighted_rows(y1 + i0, coef1, coef_stride, coef_scale, rows + i0, row_stride, n, rest);
  }
}
}  // namespace

void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int C3 = 3 * C;
  const int hs = C / NH;  // head size
  const float scale = 1.0f / std::sqrt(float(hs));
  const int Tp = round_up(T, kKeyBlock);
  // (hs, Tp), then two rows of scores and one of their exponentials
  float* keys_t = attention_scratch(size_t(hs) * Tp + 3 * Tp);
  float* scores0 = keys_t + size_t(hs) * Tp;
  float* scores1 = scores0 + Tp;
  float* exps = scores1 + Tp;

  for (int b = 0; b < B; b++) {
    const float* qkv_b = qkv + size_t(b) * T * C3;
    for (int h = 0; h < NH; h++) {
      transpose_head(keys_t, qkv_b + C + h * hs, T, Tp, hs, C3);
      auto query = [&](int t) { return qkv_b + size_t(t) * C3 + h * hs; };
      // Row t's softmax from its scores (keys 0..t).
      auto softmax_row = [&](int t, const float* __restrict scores) {
        const int n = t + 1;  // keys 0..t
        float* __restrict preatt_row = preatt + ((size_t(b) * NH + h) * T + t) * T;
        float* __restrict att_row = att + ((size_t(b) * NH + h) * T + t) * T;
        for (int t2 = 0; t2 < n; t2++) preatt_row[t2] = scores[t2];
        for (int t2 = n; t2 < T; t2++) preatt_row[t2] = -INFINITY;

        // softmax over the causal part, shifted by the maximum so that exp() never overflows. The
        // exponentials wait in a scratch row in L1, so that att's row is written once, not written,
        // read back and written again.
        const float maxval = max_of(scores, n);
        const double expsum = exp_shifted(exps, scores, maxval, n);
        const float inv_expsum = float(1.0 / expsum);
        for (int t2 = 0; t2 < n; t2++) att_row[t2] = exps[t2] * inv_expsum;
        for (int t2 = n; t2 < T; t2++) att_row[t2] = 0.0f;
      };
      // Scores two queries at a time (t and t + 1; t's extra key t + 1 is computed and not used).
      int t = 0;
      for (; t + 1 < T; t += 2) {
        scaled_dots2(scores0, scores1, query(t), query(t + 1), keys_t, Tp, hs, t + 2, scale);
        softmax_row(t, scores0);
        softmax_row(t + 1, scores1);
      }
      if (t < T) {
        scaled_dots(scores0, query(t), keys_t, Tp, hs, t + 1, scale);
        softmax_row(t, scores0);
      }

      // out = att @ v, summed over t2 in increasing order: two queries at a time (t and t + 1 share
      // the values 0..t; t + 1's last one follows alone).
      const float* values = qkv_b + 2 * C + h * hs;
      const float* att_head = att + (size_t(b) * NH + h) * T * T;
      auto out_row = [&](int t) { return out + (size_t(b) * T + t) * C + h * hs; };
      for (t = 0; t < T; t++) std::fill(out_row(t), out_row(t) + hs, 0.0f);
      for (t = 0; t + 1 < T; t += 2) {
        const float* att0 = att_head + size_t(t) * T;
        const float* att1 = att0 + T;
        accumulate_weighted_rows2(out_row(t), out_row(t + 1), att0, att1, 1, 1.0f, values, C3, t + 1, hs);
        accumulate_weighted_rows(out_row(t + 1), att1 + t + 1, 1, 1.0f, values + size_t(t + 1) * C3, C3, 1, hs);
      }
      if (t < T) accumulate_weighted_rows(out_row(t), att_head + size_t(t) * T, 1, 1.0f, values, C3, t + 1, hs);
    }
  }
}

void attention_backward(float* dqkv, float* dpreatt, float* /*datt: not written, below*/, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH) {
  const int C3 = 3 * C;
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int Tp = round_up(T, kKeyBlock);
  float* values_t = attention_scratch(size_t(hs) * Tp + 2 * Tp);  // (hs, Tp), then two rows of datt
  float* datt_block0 = values_t + size_t(hs) * Tp;
  float* datt_block1 = datt_block0 + Tp;

  for (int b = 0; b < B; b++) {
    const float* qkv_b = qkv + size_t(b) * T * C3;
    float* dqkv_b = dqkv + size_t(b) * T * C3;
    for (int h = 0; h < NH; h++) {
      transpose_head(values_t, qkv_b + 2 * C + h * hs, T, Tp, hs, C3);
      auto dout_row = [&](int t) { return dout + (size_t(b) * T + t) * C + h * hs; };
      // Row t of dpreatt from its datt (out = sum_t2 att[t2] * value[t2]: the gradient into att; the
      // values' comes below). The row of datt stays in the small scratch block, in L1: the (B,NH,T,T)
      // datt is scratch whose contents no caller reads (ops.h), so it is not written at all.
      auto softmax_backward_row = [&](int t, const float* __restrict datt_row) {
        const int n = t + 1;
        const float* __restrict att_row = att + ((size_t(b) * NH + h) * T + t) * T;
        float* __restrict dpreatt_row = dpreatt + ((size_t(b) * NH + h) * T + t) * T;

        // softmax: the Jacobian is diag(att) - att att^T, so its product with datt is
        // att * (datt - <att, datt>): O(T) per row instead of building the T x T Jacobian.
        const float weighted_datt = float(dot_double(att_row, datt_row, n));
        for (int t2 = 0; t2 < n; t2++) dpreatt_row[t2] = att_row[t2] * (datt_row[t2] - weighted_datt);
      };
      // Two rows at a time, as in the forward's scores.
      int t = 0;
      for (; t + 1 < T; t += 2) {
        scaled_dots2(datt_block0, datt_block1, dout_row(t), dout_row(t + 1), values_t, Tp, hs, t + 2, 1.0f);
        softmax_backward_row(t, datt_block0);
        softmax_backward_row(t + 1, datt_block1);
      }
      if (t < T) {
        scaled_dots(datt_block0, dout_row(t), values_t, Tp, hs, t + 1, 1.0f);
        softmax_backward_row(t, datt_block0);
      }
      // preatt = scale * <query, key[t2]>: the gradient into the query, two queries at a time as in
      // the forward (t and t + 1 share the keys 0..t; t + 1's last one follows alone).
      const float* keys = qkv_b + C + h * hs;
      const float* dpreatt_head = dpreatt + (size_t(b) * NH + h) * T * T;
      auto dquery_row = [&](int t) { return dqkv_b + size_t(t) * C3 + h * hs; };
      for (t = 0; t + 1 < T; t += 2) {
        const float* coef0 = dpreatt_head + size_t(t) * T;
        const float* coef1 = coef0 + T;
        accumulate_weighted_rows2(dquery_row(t), dquery_row(t + 1), coef0, coef1, 1, scale, keys, C3, t + 1, hs);
        accumulate_weighted_rows(dquery_row(t + 1), coef1 + t + 1, 1, scale, keys + size_t(t + 1) * C3, C3, 1, hs);
      }
      if (t < T) accumulate_weighted_rows(dquery_row(t), dpreatt_head + size_t(t) * T, 1, scale, keys, C3, t + 1, hs);

      // The gradients into key t2 and value t2 gather the rows t >= t2 that attended to it: a column of
      // dpreatt and of att. Each is summed over t in increasing order. Two keys at a time: key t2's
      // own row t2 first, alone, then rows t2 + 1.. for keys t2 and t2 + 1 together.
      auto key_and_value = [&](int t2, int rows_from, int rows) {
        const size_t first = ((size_t(b) * NH + h) * T + rows_from) * T + t2;  // element (rows_from, t2)
        accumulate_weighted_rows(dqkv_b + size_t(t2) * C3 + C + h * hs, dpreatt + first, T, scale,
                                 qkv_b + size_t(rows_from) * C3 + h * hs, C3, rows, hs);
        accumulate_weighted_rows(dqkv_b + size_t(t2) * C3 + 2 * C + h * hs, att + first, T, 1.0f,
                                 dout + (size_t(b) * T + rows_from) * C + h * hs, C, rows, hs);
      };
      int t2 = 0;
      for (; t2 + 1 < T; t2 += 2) {
        key_and_value(t2, t2, 1);
        const size_t below = ((size_t(b) * NH + h) * T + t2 + 1) * T + t2;  // element (t2 + 1, t2)
        const int rows = T - t2 - 1;
        accumulate_weighted_rows2(dqkv_b + size_t(t2) * C3 + C + h * hs, dqkv_b + size_t(t2 + 1) * C3 + C + h * hs,
                                  dpreatt + below, dpreatt + below + 1, T, scale,
                                  qkv_b + size_t(t2 + 1) * C3 + h * hs, C3, rows, hs);
        accumulate_weighted_rows2(dqkv_b + size_t(t2) * C3 + 2 * C + h * hs,
                                  dqkv_b + size_t(t2 + 1) * C3 + 2 * C + h * hs, att + below, att + below + 1, T,
                                  1.0f, dout + (size_t(b) * T + t2 + 1) * C + h * hs, C, rows, hs);
      }
      if (t2 < T) key_and_value(t2, t2, T - t2);
    }
  }
}

}  // namespace cpu
