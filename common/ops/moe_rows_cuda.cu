// moe_rows_cuda.cu: moe_rows.h's row movements on the GPU, fp32 (moe_rows_cuda.h), read next to the
// CPU loops of moe_rows.cpp. Each kernel gives every output element one writer, so no atomics and
// the same bits run after run: the dispatch and the combine's backward by (assignment, channel),
// whose rows are distinct; the combine and the return of the rows by (token, channel), each thread
// adding the token's k choices in choice order, as the CPU does. The gates' gradients are dot
// products: one warp per assignment, summed in double like the CPU's.
#include "ops/moe_rows_cuda.h"

#include <algorithm>

#include "base/cuda_check.h"  // CUDA_CHECK
#include "ops/ops_cuda.h"    // stream()

namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536)); }
void check_launch() { CUDA_CHECK(cudaGetLastError()); }

// Grid-stride loop over n elements.
#define FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__global__ void dispatch_kernel(float* rows, const float* x, const int* row, int64_t A, int C, int k) {
  FOR_EACH(i, A * C) {
    const int64_t a = i / C, c = i % C;
    if (row[a] >= 0) rows[int64_t(row[a]) * C + c] = x[(a / k) * C + c];
  }
}

__global__ void combine_kernel(float* out, const float* y, const float* probs, const int* chosen, const int* row,
                               int64_t N, int C, int k, int E) {
  FOR_EACH(i, N * C) {
    const int64_t t = i / C, c = i % C;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
      const int64_t a = t * k + j;
      if (row[a] < 0) continue;
      sum += probs[t * E + chosen[a]] * y[int64_t(row[a]) * C + c];
    }
    out[i] = sum;
  }
}

__global__ void combine_backward_dy_kernel(float* dy, const float* dout, const float* probs, const int* chosen,
                                           const int* row, int64_t A, int C, int k, int E) {
  FOR_EACH(i, A * C) {
    const int64_t a = i / C, c = i % C;
    if (row[a] < 0) continue;
    dy[int64_t(row[a]) * C + c] = probs[(a / k) * E + chosen[a]] * dout[(a / k) * C + c];
  }
}

// One warp per assignment: dgate[a] = <dout[t], y[row[a]]>, in double (as the CPU sums it).
__global__ void combine_backward_gate_kernel(float* dgate, const float* dout, const float* y, const int* row,
                                             int64_t A, int C, int k) {
  const int64_t a = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kWarp;
  if (a >= A) return;  // whole warps leave together
  const int lane = threadIdx.x % kWarp;
  if (row[a] < 0) {
    if (lane == 0) dgate[a] = 0.0f;
    return;
  }
  const float* g = dout + (a / k) * C;
  const float* from = y + int64_t(row[a]) * C;
  double dot = 0;
  for (int c = lane; c < C; c += kWarp) dot += double(g[c]) * from[c];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  if (lane == 0) dgate[a] = float(dot);
}

__global__ void return_rows_kernel(float* dx, const float* drows, const int* row, int64_t N, int C, int k) {
  FOR_EACH(i, N * C) {
    const int64_t t = i / C, c = i % C;
    float sum = dx[i];
    for (int j = 0; j < k; j++) {
      const int r = row[t * k + j];
      if (r >= 0) sum += drows[int64_t(r) * C + c];
    }
    dx[i] = sum;
  }
}

}  // namespace

void moe_dispatch(float* rows, const float* x, const int* row, int64_t N, int C, int k) {
  if (N * k * C == 0) return;
  dispatch_kernel<<<blocks_for(N * k * C), kThreads, 0, stream()>>>(rows, x, row, N * k, C, k);
  check_launch();
}

void moe_combine(float* out, const float* y, const float* probs, const int* chosen, const int* row, int64_t N, int C,
                 int k, int E) {
  if (N * C == 0) return;
  combine_kernel<<<blocks_for(N * C), kThreads, 0, stream()>>>(out, y, probs, chosen, row, N, C, k, E);
  check_launch();
}

void moe_combine_backward(float* dy, float* dgate, const float* dout, const float* y, const float* probs,
                          const int* chosen, const int* row, int64_t N, int C, int k, int E) {
  const int64_t A = N * k;
  if (A == 0) return;
  if (C > 0) {
    combine_backward_dy_kernel<<<blocks_for(A * C), kThreads, 0, stream()>>>(dy, dout, probs, chosen, row, A, C, k, E);
    check_launch();
  }
  const int64_t warps_per_block = kThreads / kWarp;
  combine_backward_gate_kernel<<<unsigned((A + warps_per_block - 1) / warps_per_block), kThreads, 0, stream()>>>(
      dgate, dout, y, row, A, C, k);
  check_launch();
}

void moe_return_rows(float* dx, const float* drows, const int* row, int64_t N, int C, int k) {
  if (N * C == 0) return;
  return_rows_kernel<<<blocks_for(N * C), kThreads, 0, stream()>>>(dx, drows, row, N, C, k);
  check_launch();
}

}  // namespace cuda
