// moe_rows_cuda.h: the CUDA kernels of moe_rows.h's ops, fp32, defined in moe_rows_cuda.cu. The
// arguments are moe_rows.h's as raw device pointers; N tokens, C channels, k choices, E experts.
// Every launcher queues its kernel on cuda::stream() and returns.
#pragma once
#include <cstdint>

namespace cuda {

void moe_dispatch(float* rows, const float* x, const int* row, int64_t N, int C, int k);
void moe_combine(float* out, const float* y, const float* probs, const int* chosen, const int* row, int64_t N, int C,
                 int k, int E);
void moe_combine_backward(float* dy, float* dgate, const float* dout, const float* y, const float* probs,
                          const int* chosen, const int* row, int64_t N, int C, int k, int E);
void moe_return_rows(float* dx, const float* drows, const int* row, int64_t N, int C, int k);

}  // namespace cuda
