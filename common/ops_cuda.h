// ops_cuda.h: the CUDA implementation of every op in ops.h (fp32), defined in ops_cuda.cu.
// Defines namespace cuda with one function per op, taking exactly the raw-pointer arguments of the
// cpu:: functions in ops_cpu.h (ops.cpp calls one or the other by the tensors' device), plus the
// compute stream every op runs on. Shapes and the accumulate-into-gradients convention: see ops.h.
//
// Pointers are device memory, with one convenience: `tokens` and `targets` may be host or device
// memory. Host ids are checked against V on the host (as the CPU ops do) and copied to the GPU first;
// that copy from pageable memory may wait for the stream (from page-locked memory it always does, so
// that the caller may reuse its buffer on return), so a fast trainer uploads its ids once per
// micro-batch and passes device pointers (checked on the device with assert()).
//
// Every op is asynchronous: it queues its kernels and cuBLAS calls on stream() and returns. Only
// sum_of_squares and mean_of wait, because they return a number to the host.
// Select the GPU (cudaSetDevice, done by communicator_for in comm_factory.h) before the first op:
// the stream and the cuBLAS handle are created on first use, on the current device.
#pragma once
#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>

namespace cuda {

// The compute stream. Created with default flags, so it also orders itself with the legacy default
// stream: a plain cudaMemcpy (which runs there) sees the results of earlier ops and vice versa.
cudaStream_t stream();
// Blocks the host until every op queued so far has finished (and reports any kernel error).
void synchronize();

// out(B,T,C) = wte(V,C)[tokens[b,t]] + wpe(maxT,C)[t]
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     int V);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C,
                      int V);

// N rows of C channels; mean(N) and rstd(N) are saved by the forward for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias and dbias may be nullptr.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                    int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// qkv(B,T,3C), out(B,T,C), preatt/att and their gradients (B,NH,T,T).
void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

void residual_forward(float* out, const float* a, const float* b, size_t n);
void residual_backward(float* da, float* db, const float* dout, size_t n);

// N rows of V logits, one target per row.
void softmax_crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V);
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V);

void fill_zero(float* x, size_t n);
void copy_tensor(float* dst, const float* src, size_t n);
void add_inplace(float* dst, const float* src, size_t n);
void scale_inplace(float* x, float factor, size_t n);
// fp32 partial sums on the GPU (one per thread, then per block), added up in double on the host.
double sum_of_squares(const float* x, size_t n);
double mean_of(const float* x, size_t n);

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, int step, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale);

}  // namespace cuda
