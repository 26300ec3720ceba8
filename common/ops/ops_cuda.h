// ops_cuda.h: the CUDA implementation of every op in ops.h, defined in ops_cuda.cu, in fp32 and in
// bf16 mixed precision. Defines namespace cuda with one function per op, plus the compute stream
// every op runs on. Shapes and the accumulate-into-gradients convention: see ops.h.
//
// dtype. Every function takes the dtype `dt` (DType::F32 or DType::BF16) of its "model" tensors:
// activations, parameters and their gradients, passed as void*. A few tensors are always fp32,
// whatever dt is, and are typed float*: layernorm's mean and rstd, the losses, and AdamW's m, v and
// master weights. In bf16, every kernel reads bf16, computes and accumulates in fp32 (sums, softmax,
// layernorm statistics, GEMMs through cuBLAS with CUBLAS_COMPUTE_32F) and rounds once when it
// stores. An accumulating backward (+=) reads the bf16 value, adds in fp32 and rounds.
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
#include <cublasLt.h>         // cublasLtHandle_t
#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/tensor.h"  // DType

namespace cuda {

// The stream the calling thread's ops run on: the compute stream, unless the thread chose another
// with use_stream_on_this_thread() (a communicator's worker, comm_p2p.cpp, whose collectives must not
// land between the training thread's kernels).
cudaStream_t stream();
// The compute stream, whichever thread asks. Created with default flags, so it also orders itself
// with the legacy default stream: a plain cudaMemcpy (which runs there) sees the results of earlier
// ops and vice versa.
cudaStream_t compute_stream();
// From now on, the ops this thread queues run on `s` (nullptr: the compute stream again). The thread
// orders `s` with the compute stream itself, by events.
void use_stream_on_this_thread(cudaStream_t s);
// Blocks the host until every op queued so far on stream() has finished (and reports any kernel error).
void synchronize();
// The most shared memory one block of the current GPU may ask for (227 KB on an H100, 163 KB on an
// A100, 99 KB on sm_86/sm_89 parts), or 0 where no GPU answers.
size_t shared_memory_per_block();
// cuBLASLt's handle and workspace, one of each for every product through cuBLASLt (fp32 with a bias
// epilogue here, a recipe's bf16/fp16/fp8 in matmul_recipe_cuda.cu). Its calls queue on stream(), so
// the workspace is used by one product at a time. The size: what NVIDIA recommends for Hopper.
cublasLtHandle_t cublaslt();
void* cublaslt_workspace();
constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;

// N rows of C channels; wte(Vl,C) holds rows [vocab_begin, vocab_begin + Vl) of the (vocab_size, C)
// table, and wpe's row for row n is (first_row + n) % T. (ops.cpp builds encoder_forward and
// encoder_backward from these four.)
void embedding_forward(DType dt, void* out, const int* tokens, const void* wte, int N, int C, int vocab_begin, int Vl,
                       int vocab_size);
void embedding_backward(DType dt, void* dwte, const void* dout, const int* tokens, int N, int C, int vocab_begin,
                        int Vl, int vocab_size);
void position_forward(DType dt, void* out, const void* wpe, int N, int C, int64_t first_row, int T);
void position_backward(DType dt, void* dwpe, const void* dout, int N, int C, int64_t first_row, int T);

// N rows of C channels; mean(N) and rstd(N) (fp32) are saved by the forward for the backward.
void layernorm_forward(DType dt, void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C);
void layernorm_backward(DType dt, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, const float* mean, const float* rstd, int N, int C);

// out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias and dbias may be nullptr.
void matmul_forward(DType dt, void* out, const void* inp, const void* weight, const void* bias, int N, int C,
                    int OC);
// The backward in its two halves (ops.cpp's matmul_backward calls both, input first).
// accumulate = false overwrites dinp (ops.h's GradWrite::Overwrite), in the product and in GELU's backward.
void matmul_backward_input(DType dt, void* dinp, const void* dout, const void* weight, int N, int C, int OC,
                           bool accumulate);
void matmul_backward_weight(DType dt, void* dweight, void* dbias, const void* dout, const void* inp, int N, int C,
                            int OC);
// out(N,C) += bias(C) in every row; dbias(C) += column sums of dout(N,C).
void add_bias(DType dt, void* out, const void* bias, int N, int C);
void bias_backward(DType dt, void* dbias, const void* dout, int N, int C);

// qkv(B,T,3C), out(B,T,C), preatt/att and the scratch dpreatt/datt (B,NH,T,T).
void attention_forward(DType dt, void* out, void* preatt, void* att, const void* qkv, int B, int T, int C, int NH);
// dqkv += gradient; dpreatt and datt are scratch, overwritten (their contents on entry do not matter).
void attention_backward(DType dt, void* dqkv, void* dpreatt, void* datt, const void* dout, const void* qkv,
                        const void* att, int B, int T, int C, int NH);

// FlashAttention (attention_flash.cu): the same attention without the (B,NH,T,T) matrices, for bf16
// with head size C/NH in {16, 32, 64, 128} (flash_attention_supported). The forward saves
// lse(B,NH,T) (fp32: the log of each row's softmax denominator, plus its maximum); the backward
// recomputes the probabilities from it and from q and k, and adds into dqkv.
bool flash_attention_supported(DType dt, int C, int NH);
void attention_forward_flash(void* out, float* lse, const void* qkv, int B, int T, int C, int NH);
void attention_backward_flash(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, int B,
                              int T, int C, int NH);

void gelu_forward(DType dt, void* out, const void* inp, size_t n);
void gelu_backward(DType dt, void* dinp, const void* inp, const void* dout, size_t n, bool accumulate);

void residual_forward(DType dt, void* out, const void* a, const void* b, size_t n);
void residual_backward(DType dt, void* da, void* db, const void* dout, size_t n);

// N rows of V logits, one target per row; losses(N) are fp32.
void softmax_crossentropy_forward(DType dt, float* losses, void* probs, const void* logits, const int* targets,
                                  int N, int V);
// dlogits = (probs - onehot) * dloss: overwritten, not accumulated (see ops.h). V is the columns of
// probs: the vocabulary, or its slice starting at vocab_begin (targets beyond it are not checked).
void softmax_crossentropy_backward(DType dt, void* dlogits, const void* probs, const int* targets, float dloss,
                                   int N, int V, int vocab_begin);
// The classifier's version 2: softmax, cross-entropy and its backward in one kernel. logits(N,V) in,
// dlogits = (softmax - onehot(targets)) * dloss out, in place; losses(N) fp32. Equal to
// softmax_crossentropy_forward then _backward (whole vocabulary), without their (N,V) probabilities.
// Not yet called by the model (docs/gpus.md): tests/test_cuda_ops.cpp checks it against the CPU ops.
void fused_classifier(DType dt, void* logits, float* losses, const int* targets, float dloss, int N, int V);
// The vocabulary-parallel cross-entropy's three stages (ops.h) on N rows of a slice of Vl logits;
// row_max, target_logit, row_sum and losses are fp32, one value per row.
void crossentropy_shard_max(DType dt, float* row_max, float* target_logit, const void* logits, const int* targets,
                            int N, int Vl, int vocab_begin);
void crossentropy_shard_exp(DType dt, void* probs, float* row_sum, const void* logits, const float* row_max, int N,
                            int Vl);
void crossentropy_shard_finish(DType dt, float* losses, void* probs, const float* row_max, const float* row_sum,
                               const float* target_logit, int N, int Vl);

void fill_zero(DType dt, void* x, size_t n);
void copy_tensor(DType dt, void* dst, const void* src, size_t n);
void add_inplace(DType dt, void* dst, const void* src, size_t n);
void scale_inplace(DType dt, void* x, float factor, size_t n);
// dst(dst_dt) = src(src_dt), element by element, rounding to nearest-even into bf16.
void convert(DType dst_dt, void* dst, DType src_dt, const void* src, size_t n);
// fp32 partial sums on the GPU (one per thread, then per block), added up in double on the host.
double sum_of_squares(DType dt, const void* x, size_t n);
double mean_of(DType dt, const void* x, size_t n);

// AdamW on n elements. fp32 (master == nullptr): param is fp32 and is the weight updated. Mixed
// precision (master != nullptr): the fp32 master weights are updated and param (bf16) receives them
// rounded. grad has dtype dt, like param; m, v (and master) are fp32.
void adamw_update(DType dt, void* param, float* master, const void* grad, float* m, float* v, size_t n, int step,
                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale);

// AdamW, version 2: the same update over n elements cut into segments (segment_ends ascending, the last
// = n) that differ only in whether weight decay applies (decays[s]): one kernel launch where version 1
// takes one per segment, and the same bits. Not yet called by the optimizer (docs/gpus.md):
// tests/test_cuda_ops.cpp checks it against the CPU's adamw_update per segment.
void adamw_update_fused(DType dt, void* param, float* master, const void* grad, float* m, float* v, size_t n,
                        const std::vector<int64_t>& segment_ends, const std::vector<bool>& decays, int step, float lr,
                        float beta1, float beta2, float eps, float weight_decay, float grad_scale);

}  // namespace cuda
