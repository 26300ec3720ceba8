// moe_rows.cpp: moe_rows.h's ops: the CPU loops (MoELayer's, moved here so that a GPU can run the same
// steps), and the dispatch to the CUDA kernels of moe_rows_cuda.cu for CUDA tensors.
#include "ops/moe_rows.h"

#include <cstring>
#include <string>

#include "base/check.h"
#ifdef GPT_WITH_CUDA
#include "ops/moe_rows_cuda.h"  // cuda::moe_*
#endif

namespace {
// The device of a call's tensors, all fp32 and on one device; true for CUDA. A CPU-only build cannot
// hold CUDA tensors.
bool on_gpu(const char* what, std::initializer_list<Tensor> tensors) {
  const Device device = tensors.begin()->device;
  for (const Tensor& t : tensors) {
    ENSURE(t.device == device, std::string(what) + ": tensors on two devices");
    ENSURE(t.dtype == DType::F32, std::string(what) + ": the MoE layer runs in fp32");
  }
#ifndef GPT_WITH_CUDA
  ENSURE(device == Device::CPU, std::string(what) + ": CUDA tensors, but this program was built without CUDA");
#endif
  return device == Device::CUDA;
}
}  // namespace

void moe_dispatch(Tensor rows, Tensor x, const int* row, int k) {
  const int64_t N = x.shape[0], C = x.shape[1];
  if (on_gpu(__func__, {rows, x})) {
#ifdef GPT_WITH_CUDA
    cuda::moe_dispatch(rows.f32(), x.f32(), row, N, int(C), k);
#endif
    return;
  }
  for (int64_t a = 0; a < N * k; a++)
    if (row[a] >= 0) std::memcpy(rows.f32() + row[a] * C, x.f32() + (a / k) * C, size_t(C) * sizeof(float));
}

void moe_combine(Tensor out, Tensor y, const float* probs, const int* chosen, const int* row, int k, int E) {
  const int64_t N = out.shape[0], C = out.shape[1];
  if (on_gpu(__func__, {out, y})) {
#ifdef GPT_WITH_CUDA
    cuda::moe_combine(out.f32(), y.f32(), probs, chosen, row, N, int(C), k, E);
#endif
    return;
  }
  std::memset(out.f32(), 0, size_t(N * C) * sizeof(float));
  for (int64_t a = 0; a < N * k; a++) {
    if (row[a] < 0) continue;
    const float gate = probs[(a / k) * E + chosen[a]];
    float* o = out.f32() + (a / k) * C;
    const float* from = y.f32() + row[a] * C;
    for (int64_t c = 0; c < C; c++) o[c] += gate * from[c];
  }
}

void moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* probs, const int* chosen,
                          const int* row, int k, int E) {
  const int64_t N = dout.shape[0], C = dout.shape[1];
  if (on_gpu(__func__, {dy, dout, y})) {
#ifdef GPT_WITH_CUDA
    cuda::moe_combine_backward(dy.f32(), dgate, dout.f32(), y.f32(), probs, chosen, row, N, int(C), k, E);
#endif
    return;
  }
  for (int64_t a = 0; a < N * k; a++) {
    dgate[a] = 0.0f;
    if (row[a] < 0) continue;
    const float gate = probs[(a / k) * E + chosen[a]];
    const float* g = dout.f32() + (a / k) * C;
    const float* from = y.f32() + row[a] * C;
    float* to = dy.f32() + row[a] * C;
    double dot = 0;
    for (int64_t c = 0; c < C; c++) {
      to[c] = gate * g[c];
      dot += double(g[c]) * from[c];
    }
    dgate[a] = float(dot);
  }
}

void moe_return_rows(Tensor dx, Tensor drows, const int* row, int k) {
  const int64_t N = dx.shape[0], C = dx.shape[1];
  if (on_gpu(__func__, {dx, drows})) {
#ifdef GPT_WITH_CUDA
    cuda::moe_return_rows(dx.f32(), drows.f32(), row, N, int(C), k);
#endif
    return;
  }
  for (int64_t a = 0; a < N * k; a++) {
    if (row[a] < 0) continue;
    float* to = dx.f32() + (a / k) * C;
    const float* from = drows.f32() + row[a] * C;
    for (int64_t c = 0; c < C; c++) to[c] += from[c];
  }
}
