// ops_cpu.h: the CPU implementation of every op in ops.h, on raw pointers in the llm.c manner.
// Defines namespace cpu with one function per op. ops.cpp reads the sizes from the Tensor shapes
// and calls these; the CUDA versions (namespace cuda, ops_cuda.h) take the same arguments.
// The shapes and the accumulate-into-gradients convention are those documented in ops.h.
// Element counts are size_t (activations such as (B,T,V) logits outgrow int); dimensions are int.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cpu {

// N rows of C channels. wte(Vl,C) holds rows [vocab_begin, vocab_begin + Vl) of the (vocab_size, C)
// table: tokens outside them give zero rows forward and no gradient backward. (ops.cpp builds
// encoder_forward and encoder_backward from these four, with the whole table and first_row = 0.)
void embedding_forward(float* out, const int* tokens, const float* wte, int N, int C, int vocab_begin, int Vl,
                       int vocab_size);
void embedding_backward(float* dwte, const float* dout, const int* tokens, int N, int C, int vocab_begin, int Vl,
                        int vocab_size);
// Row n is position (first_row + n) % T of the table wpe(maxT,C), maxT >= T.
void position_forward(float* out, const float* wpe, int N, int C, int64_t first_row, int T);
void position_backward(float* dwpe, const float* dout, int N, int C, int64_t first_row, int T);

// N rows of C channels; mean(N) and rstd(N) are saved by the forward for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias and dbias may be nullptr.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                    int OC);
// The backward in its two halves (ops.cpp's matmul_backward calls both, input first). accumulate =
// false overwrites dinp instead of adding to it (ops.h's GradWrite::Overwrite).
void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C, int OC,
                           bool accumulate = true);
void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C,
                            int OC);
// out(N,C) += bias(C) in every row; dbias(C) += column sums of dout(N,C), row by row.
void add_bias(float* out, const float* bias, int N, int C);
void bias_backward(float* dbias, const float* dout, int N, int C);

// qkv(B,T,3C), out(B,T,C), preatt/att and their gradients (B,NH,T,T); preatt nullptr: not stored.
void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH);
// accumulate = false overwrites dqkv instead of adding to it (ops.h's GradWrite::Overwrite).
void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH, bool accumulate = true);

void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, bool accumulate = true);
// The MLP's products with GELU applied inside them (bit for bit the separate ops): out = inp @ weight^T
// + bias and out_gelu = GELU(out); dinp = GELU'(gelu_inp) * (dout @ weight), overwritten.
void matmul_forward_gelu(float* out, float* out_gelu, const float* inp, const float* weight, const float* bias,
                         int N, int C, int OC);
void matmul_backward_input_gelu(float* dinp, const float* dout, const float* weight, const float* gelu_inp, int N,
                                int C, int OC);

void residual_forward(float* out, const float* a, const float* b, size_t n);
// out = a + b, then ln = layernorm_forward(out), row by row; N rows of C channels.
void residual_layernorm_forward(float* out, float* ln, float* mean, float* rstd, const float* a, const float* b,
                                const float* weight, const float* bias, int N, int C);
void residual_backward(float* da, float* db, const float* dout, size_t n);

// N rows of V logits, one target per row.
void softmax_crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V);
// V is the columns of probs: the whole vocabulary, or the slice starting at vocab_begin.
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V, int vocab_begin);
// The vocabulary-parallel cross-entropy's three stages on N rows of a slice of Vl logits starting at
// vocab_begin; row_max, target_logit, row_sum and losses hold one value per row.
void crossentropy_shard_max(float* row_max, float* target_logit, const float* logits, const int* targets, int N,
                            int Vl, int vocab_begin);
void crossentropy_shard_exp(float* probs, float* row_sum, const float* logits, const float* row_max, int N, int Vl);
void crossentropy_shard_finish(float* losses, float* probs, const float* row_max, const float* row_sum,
                               const float* target_logit, int N, int Vl);

void fill_zero(float* x, size_t n);
void copy_tensor(float* dst, const float* src, size_t n);
void add_inplace(float* dst, const float* src, size_t n);
void scale_inplace(float* x, float factor, size_t n);
double sum_of_squares(const float* x, size_t n);
double mean_of(const float* x, size_t n);

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, int step, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale);

}  // namespace cpu
