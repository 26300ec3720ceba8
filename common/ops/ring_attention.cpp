// ring_attention.cpp: see ring_attention.h. Plain loops, one (sequence, head, query) row at a time:
// the lesson is the order of the work and what each block contributes, not the speed of the kernel.
#include "ops/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "base/check.h"
#include "ops/fast_math.h"
#include "ops/ops.h"  // fill_zero
#ifdef GPT_WITH_CUDA
#include "ops/ring_attention_cuda.h"  // cuda::ring_*: the same kernels on the GPU
#endif

namespace {

float dot(const float* __restrict a, const float* __restrict b, int n) {
  float s = 0;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

// y += a x over n channels.
void axpy(float* __restrict y, float a, const float* __restrict x, int n) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// Whether any key of the block can be seen by any query: a block wholly after the queries (contiguous
// split, a later rank's block) is skipped without looking at its rows.
bool block_visible(const int* q_pos, int Tq, const int* k_pos, int Tk) {
  int last_query = -1, first_key = 1 << 30;
  for (int t = 0; t < Tq; t++) last_query = q_pos[t] > last_query ? q_pos[t] : last_query;
  for (int t = 0; t < Tk; t++) first_key = k_pos[t] < first_key ? k_pos[t] : first_key;
  return first_key <= last_query;
}

// The (query, key) pairs the mask lets through, per sequence and head: what the CPU kernels count as
// they go, counted apart for the GPU's, whose kernels return nothing to the host. Keys sorted once,
// then a binary search per query: Tq log Tk on the host per block, not Tq x Tk.
int64_t visible_pairs(const int* q_pos, int Tq, const int* k_pos, int Tk) {
  std::vector<int> keys(k_pos, k_pos + Tk);
  std::sort(keys.begin(), keys.end());
  int64_t pairs = 0;
  for (int t = 0; t < Tq; t++) pairs += std::upper_bound(keys.begin(), keys.end(), q_pos[t]) - keys.begin();
  return pairs;
}

// Every RowBlock of a call on one device; true for CUDA. A build without CUDA cannot hold CUDA rows.
bool on_gpu(const char* what, std::initializer_list<RowBlock> rows) {
  const Device device = rows.begin()->device;
  for (const RowBlock& r : rows) ENSURE(r.device == device, std::string(what) + ": rows on two devices");
#ifndef GPT_WITH_CUDA
  ENSURE(device == Device::CPU, std::string(what) + ": CUDA rows, but this program was built without CUDA");
#endif
  return device == Device::CUDA;
}

}  // namespace

int64_t attention_block_forward(RowBlock acc, float* row_max, float* row_sum, RowBlock q, RowBlock k, RowBlock v,
                                const int* q_pos, const int* k_pos, int B, int NH, int C) {
  const int hs = C / NH, Tq = q.T, Tk = k.T;
  const float scale = 1.0f / std::sqrt(float(hs));
  if (!block_visible(q_pos, Tq, k_pos, Tk)) return 0;
  if (on_gpu(__func__, {acc, q, k, v})) {
#ifdef GPT_WITH_CUDA
    cuda::ring_block_forward(acc.data, acc.stride, row_max, row_sum, q.data, q.stride, k.data, k.stride, v.data,
                             v.stride, q_pos, Tq, k_pos, Tk, B, NH, C);
#endif
    return visible_pairs(q_pos, Tq, k_pos, Tk) * B * NH;
  }
  thread_local std::vector<float> scores;
  thread_local std::vector<int> keys;
  scores.resize(size_t(Tk));
  keys.resize(size_t(Tk));
  int64_t pairs = 0;
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < Tq; t++) {
        const float* query = q.row(b, t) + h * hs;
        int n = 0;
        float block_max = -INFINITY;
        for (int tk = 0; tk < Tk; tk++) {
          if (k_pos[tk] > q_pos[t]) continue;  // the causal mask, by absolute position
          const float s = dot(query, k.row(b, tk) + h * hs, hs) * scale;
          scores[size_t(n)] = s;
          keys[size_t(n)] = tk;
          block_max = s > block_max ? s : block_max;
          n++;
        }
        if (n == 0) continue;
        pairs += n;
        // Rescale what earlier blocks summed to the new maximum, then add this block's terms.
        const int64_t st = (int64_t(b) * NH + h) * Tq + t;
        const float old_max = row_max[st], new_max = old_max > block_max ? old_max : block_max;
        const float rescale = old_max == -INFINITY ? 0.0f : cpu::fast_exp(old_max - new_max);
        float* out = acc.row(b, t) + h * hs;
        for (int i = 0; i < hs; i++) out[i] *= rescale;
        double sum = double(row_sum[st]) * rescale;
        for (int j = 0; j < n; j++) {
          const float p = cpu::fast_exp(scores[size_t(j)] - new_max);
          sum += p;
          axpy(out, p, v.row(b, keys[size_t(j)]) + h * hs, hs);
        }
        row_max[st] = new_max;
        row_sum[st] = float(sum);
      }
    }
  }
  return pairs;
}

void attention_block_finish(RowBlock out, float* lse, const float* row_max, const float* row_sum, int B, int NH,
                            int C) {
  const int hs = C / NH, T = out.T;
  if (on_gpu(__func__, {out})) {
#ifdef GPT_WITH_CUDA
    cuda::ring_block_finish(out.data, out.stride, lse, row_max, row_sum, T, B, NH, C);
#endif
    return;
  }
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const int64_t st = (int64_t(b) * NH + h) * T + t;
        float* row = out.row(b, t) + h * hs;
        const float inverse = 1.0f / row_sum[st];
        for (int i = 0; i < hs; i++) row[i] *= inverse;
        lse[st] = row_max[st] + std::log(row_sum[st]);
      }
}

void attention_row_dots(float* D, RowBlock dout, RowBlock out, int B, int NH, int C) {
  const int hs = C / NH, T = out.T;
  if (on_gpu(__func__, {dout, out})) {
#ifdef GPT_WITH_CUDA
    cuda::ring_row_dots(D, dout.data, dout.stride, out.data, out.stride, T, B, NH, C);
#endif
    return;
  }
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float* g = dout.row(b, t) + h * hs;
        const float* o = out.row(b, t) + h * hs;
        double s = 0;
        for (int i = 0; i < hs; i++) s += double(g[i]) * o[i];
        D[(int64_t(b) * NH + h) * T + t] = float(s);
      }
}

int64_t attention_block_backward(RowBlock dq, RowBlock dk, RowBlock dv, RowBlock q, RowBlock k, RowBlock v,
                                 RowBlock dout, const float* lse, const float* D, const int* q_pos, const int* k_pos,
                                 int B, int NH, int C) {
  const int hs = C / NH, Tq = q.T, Tk = k.T;
  const float scale = 1.0f / std::sqrt(float(hs));
  if (!block_visible(q_pos, Tq, k_pos, Tk)) return 0;
  if (on_gpu(__func__, {dq, dk, dv, q, k, v, dout})) {
#ifdef GPT_WITH_CUDA
    cuda::ring_block_backward(dq.data, dq.stride, dk.data, dk.stride, dv.data, dv.stride, q.data, q.stride, k.data,
                              k.stride, v.data, v.stride, dout.data, dout.stride, lse, D, q_pos, Tq, k_pos, Tk, B, NH,
                              C);
#endif
    return visible_pairs(q_pos, Tq, k_pos, Tk) * B * NH;
  }
  int64_t pairs = 0;
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < Tq; t++) {
        const float* query = q.row(b, t) + h * hs;
        const float* g = dout.row(b, t) + h * hs;
        float* dquery = dq.row(b, t) + h * hs;
        const int64_t st = (int64_t(b) * NH + h) * Tq + t;
        const float row_lse = lse[st], row_dot = D[st];
        for (int tk = 0; tk < Tk; tk++) {
          if (k_pos[tk] > q_pos[t]) continue;
          const float* key = k.row(b, tk) + h * hs;
          const float* value = v.row(b, tk) + h * hs;
          const float p = cpu::fast_exp(dot(query, key, hs) * scale - row_lse);  // the forward's softmax
          axpy(dv.row(b, tk) + h * hs, p, g, hs);
          const float ds = p * (dot(g, value, hs) - row_dot) * scale;  // the score's gradient, scaled
          axpy(dquery, ds, key, hs);
          axpy(dk.row(b, tk) + h * hs, ds, query, hs);
          pairs++;
        }
      }
    }
  }
  return pairs;
}

namespace {
void expect_f32(const Tensor& t, const char* what) {
  ENSURE(t.dtype == DType::F32, std::string(what) + ": ring attention runs in fp32 (chapter 10 and 12 refuse bf16 with --cp > 1)");
}
}  // namespace

std::string ring_attention_problem(Device device, int C, int NH) {
  if (device == Device::CPU) return "";
#ifdef GPT_WITH_CUDA
  return cuda::ring_head_size_problem(C, NH);
#else
  (void)C, (void)NH;
  return "ring attention on CUDA: this program was built without CUDA";
#endif
}

void attention_block_start(Tensor acc, Tensor row_max, Tensor row_sum) {
  expect_f32(row_max, "attention_block_start");
  ENSURE(row_max.device == row_sum.device && row_max.numel() <= row_sum.numel(),
         "attention_block_start: row_max and row_sum on one device, row_sum as long as row_max");
  fill_zero(acc);
  if (row_max.device == Device::CUDA) {
#ifdef GPT_WITH_CUDA
    cuda::ring_start(row_max.f32(), row_sum.f32(), row_max.numel());
#endif
    return;
  }
  float* m = row_max.f32();
  float* sum = row_sum.f32();
  for (int64_t i = 0; i < row_max.numel(); i++) m[i] = -INFINITY, sum[i] = 0.0f;
}

RowBlock qkv_rows(Tensor qkv, int part, int B, int T, int C) {
  expect_f32(qkv, "qkv_rows");
  ENSURE(qkv.numel() >= int64_t(B) * T * 3 * C, "qkv_rows: qkv holds fewer than (B,T,3C) values");
  return {qkv.f32() + int64_t(part) * C, 3 * int64_t(C), T, qkv.device};
}

RowBlock kv_rows(Tensor kv, int part, int B, int T, int C) {
  expect_f32(kv, "kv_rows");
  ENSURE(kv.numel() >= int64_t(B) * T * 2 * C, "kv_rows: the block holds fewer than (B,T,2C) values");
  return {kv.f32() + int64_t(part) * C, 2 * int64_t(C), T, kv.device};
}

RowBlock btc_rows(Tensor x, int T, int C) {
  expect_f32(x, "btc_rows");
  return {x.f32(), C, T, x.device};
}

void pack_kv(Tensor kv, Tensor qkv, int B, int T, int C) {
  const RowBlock src = qkv_rows(qkv, 1, B, T, C), dst = kv_rows(kv, 0, B, T, C);
  if (on_gpu(__func__, {src, dst})) {
#ifdef GPT_WITH_CUDA
    cuda::ring_pack_kv(dst.data, qkv.f32(), B, T, C);
#endif
    return;
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float* from = src.row(b, t);  // k, then v: adjacent in qkv as in the block
      float* to = dst.row(b, t);
      for (int i = 0; i < 2 * C; i++) to[i] = from[i];
    }
}

void add_kv_grad(Tensor dqkv, Tensor dkv, int B, int T, int C) {
  const RowBlock dst = qkv_rows(dqkv, 1, B, T, C), src = kv_rows(dkv, 0, B, T, C);
  if (on_gpu(__func__, {src, dst})) {
#ifdef GPT_WITH_CUDA
    cuda::ring_add_kv_grad(dqkv.f32(), dkv.f32(), B, T, C);
#endif
    return;
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) axpy(dst.row(b, t), 1.0f, src.row(b, t), 2 * C);
}

RingBuffers::RingBuffers(int cp, int B, int T, int C, int NH, Device device) {
  const int64_t block = int64_t(B) * T * 2 * C;
  kv[0] = Buffer(block, MemCategory::Activations, device);
  stat = Buffer(int64_t(B) * NH * T, MemCategory::Activations, device);
  if (cp == 1) return;
  kv[1] = Buffer(block, MemCategory::Activations, device);
  dkv_out[0] = Buffer(block, MemCategory::Activations, device);
  dkv_out[1] = Buffer(block, MemCategory::Activations, device);
  dkv_in = Buffer(block, MemCategory::Activations, device);
}

double ring_buffer_bytes(int cp, int B, int T, int C, int NH) {
  const double block = double(B) * T * 2 * C * 4, stat = double(B) * NH * T * 4;
  return (cp > 1 ? 5 : 1) * block + stat;
}
