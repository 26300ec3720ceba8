// ops.h: every op of GPT-2, forward and backward, behind one call per op.
// Each call looks at its tensors' device and runs the CPU implementation (ops_cpu.cpp) or, when
// built with CUDA, the CUDA one. The model (model*.cpp) is written only against these calls.
//
// Shapes use the project's short names: B batch, T sequence, C channels, NH heads, V vocabulary,
// OC output channels. N = B*T when a tensor is seen as rows.
// Convention (as in llm.c): every backward ACCUMULATES (+=) into the gradients it writes, both
// parameter gradients and input gradients. Callers zero what must start at zero. Two exceptions,
// named where they are declared, overwrite pure scratch, so the model need not zero hundreds of MB
// per step: attention's dpreatt and datt, and the cross-entropy's dlogits. And two backwards whose
// input gradient is often the first thing written into its buffer (a product's, GELU's and the
// attention's) take a GradWrite: Overwrite writes the gradient instead of adding it, where the caller would otherwise
// zero the buffer first: the same values without that pass over memory, nor the read of the zeros.
// matmul_backward_input_gelu, the two in one call, overwrites too.
//
// dtypes: on the CPU every tensor is fp32. On CUDA the model's tensors (activations, parameters,
// gradients) are fp32 or bf16, one dtype per call (bf16 mixed precision: see ops_cuda.h); layernorm's
// mean and rstd, the losses and AdamW's m, v and master weights are fp32 always.
#pragma once
#include "ops/matmul_timing.h"  // cpu_matmul_ms, cpu_matmul_by_rows: the products' time, which callers read here
#include "ops/tensor.h"

// How an input gradient meets what its buffer holds (see the convention above).
enum class GradWrite { Accumulate, Overwrite };

// out(B,T,C) = wte[tokens[b,t]] + wpe[t].  tokens: int32 (B,T) viewed as F32-sized ints.
void encoder_forward(Tensor out, const int* tokens, Tensor wte, Tensor wpe, int B, int T);
// dwte(V,C) += scatter of dout over tokens; dwpe(maxT,C) += sum over batch of dout.
void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int* tokens, int B, int T);

// The same split over ranks that hold a slice of the vocabulary (tensor parallelism, chapter 07):
// wte holds rows [vocab_begin, vocab_begin + Vl) of the full (vocab_size, C) table.
// out(N,C) = wte[token - vocab_begin] for a token in that range, else 0: a partial lookup, whose sum
// over the ranks is the lookup. Tokens must lie in [0, vocab_size).
void embedding_forward(Tensor out, const int* tokens, Tensor wte, int vocab_begin, int vocab_size);
// dwte(Vl,C) += dout's rows for the tokens in range, each row of dwte summing its positions in
// increasing order (deterministic; equal to encoder_backward's order).
void embedding_backward(Tensor dwte, Tensor dout, const int* tokens, int vocab_begin, int vocab_size);
// Position embeddings of rows that are a contiguous run of the flattened (B,T) positions starting at
// `first_row` (a rank's slice of the sequence under sequence parallelism):
// out(N,C) += wpe[(first_row + n) % T] for row n; dwpe[(first_row + n) % T] += dout(n), in row order.
void position_forward(Tensor out, Tensor wpe, int64_t first_row, int T);
void position_backward(Tensor dwpe, Tensor dout, int64_t first_row, int T);

// out(N,C) = (inp - mean) * rstd * weight + bias, eps = 1e-5; saves mean(N), rstd(N) for backward.
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias);
// dinp(N,C), dweight(C), dbias(C) += gradients, given dout(N,C) and the forward's inp, mean, rstd.
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, Tensor mean, Tensor rstd);

// out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC). bias may be an empty Tensor (no bias).
void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias);
// dinp(N,C) += dout @ weight; dweight(OC,C) += dout^T @ inp; dbias(OC) += column sums of dout
// (skipped when dbias is empty).
void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight);
// Its two halves, for a backward that computes the input's gradient first and the weight's later (so
// that a collective of the first can travel while the second computes: tensor parallelism's overlap;
// a zero-bubble pipeline's B and W). Calling both gives matmul_backward's result bit for bit.
// dinp += dout @ weight (GradWrite::Overwrite: dinp = dout @ weight).
void matmul_backward_input(Tensor dinp, Tensor dout, Tensor weight, GradWrite write = GradWrite::Accumulate);
void matmul_backward_weight(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp);  // dweight, dbias
// out(N,C) += bias(C) in every row; dbias(C) += column sums of dout(N,C). For a row-parallel layer,
// whose bias is added once, after its partial outputs are summed over the ranks.
void add_bias(Tensor out, Tensor bias);
void bias_backward(Tensor dbias, Tensor dout);

// Causal multi-head self-attention. qkv(B,T,3C) holds q, k, v side by side; each head has C/NH
// channels. preatt and att are (B,NH,T,T) (scores before and after the causal softmax, scaled by
// 1/sqrt(C/NH)). out(B,T,C) = att @ v, heads concatenated. On the CPU preatt may be empty: the scores
// are then not stored, a pass of B NH T^2 writes fewer (the backward reads only att; the GPU's
// softmax reads the scores back from preatt, which it needs there).
void attention_forward(Tensor out, Tensor preatt, Tensor att, Tensor qkv, int NH);
// dqkv(B,T,3C) += gradient (GradWrite::Overwrite: dqkv = gradient). dpreatt and datt (B,NH,T,T) are
// scratch: their contents on entry do not matter, nor on exit (the CPU keeps each head's datt in a
// scratch block and leaves datt unwritten).
void attention_backward(Tensor dqkv, Tensor dpreatt, Tensor datt, Tensor dout, Tensor qkv, Tensor att,
                        int NH, GradWrite write = GradWrite::Accumulate);

// FlashAttention (GPU, bf16; attention_flash.cu): what attention_forward computes, without the
// (B,NH,T,T) matrices. lse(B,NH,T), fp32, is saved for the backward: the log of each row's softmax
// denominator, from which the backward recomputes the probabilities. Available only where
// flash_attention_available() says so (bf16 on CUDA, head size C/NH of 16, 32, 64 or 128).
bool flash_attention_available(DType dtype, Device device, int C, int NH);
void attention_forward_flash(Tensor out, Tensor lse, Tensor qkv, int NH);
// dqkv(B,T,3C) += gradient, from dout(B,T,C) and the forward's qkv, out and lse.
void attention_backward_flash(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(Tensor out, Tensor inp);
// dinp += gelu'(inp) * dout (GradWrite::Overwrite: dinp = gelu'(inp) * dout).
void gelu_backward(Tensor dinp, Tensor inp, Tensor dout, GradWrite write = GradWrite::Accumulate);

// The MLP's first product and GELU, and the second's input gradient and GELU's backward, each in one
// call: the results of the two ops called apart, bit for bit. On the CPU GELU runs inside the product,
// on each block of its output as it is finished, which saves GELU's pass over memory; elsewhere (CUDA,
// chapter 13's emulated products) the call is the two ops.
// out(N,OC) = inp @ weight^T + bias, out_gelu = GELU(out) (gelu_forward).
void matmul_forward_gelu(Tensor out, Tensor out_gelu, Tensor inp, Tensor weight, Tensor bias);
// dinp(N,C) = GELU'(gelu_inp) * (dout @ weight): matmul_backward_input with GradWrite::Overwrite into a
// buffer, then gelu_backward with GradWrite::Overwrite from it. gelu_inp is (N,C), GELU's input.
void matmul_backward_input_gelu(Tensor dinp, Tensor dout, Tensor weight, Tensor gelu_inp);

void residual_forward(Tensor out, Tensor a, Tensor b);     // out = a + b
void residual_backward(Tensor da, Tensor db, Tensor dout); // da += dout; db += dout
// A residual add and the layernorm of its sum in one call: out = a + b (N,C), then ln(N,C), mean(N) and
// rstd(N) = layernorm_forward of out: the two ops' results, bit for bit. On the CPU each row is
// normalised right after it is summed, while it is in L1 (the layernorm's reads of out from L2 or
// memory go); elsewhere the call is the two ops.
void residual_layernorm_forward(Tensor out, Tensor ln, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor weight,
                                Tensor bias);

// Fused softmax + cross-entropy over the last dimension. logits, probs: (B,T,V); losses: (B,T);
// targets: int32 (B,T). losses[b,t] = -log probs[b,t,targets[b,t]].
void softmax_crossentropy_forward(Tensor losses, Tensor probs, Tensor logits, const int* targets);
// dlogits(B,T,V) = (probs - onehot(targets)) * dloss, where every position's loss has the same
// weight dloss (1/(B*T) for a mean, divided further by gradient-accumulation steps). Overwritten, not
// accumulated: dlogits is scratch that only the LM head's backward reads. With a vocabulary slice
// (vocab_begin > 0 or fewer columns than the vocabulary: tensor parallelism), the one-hot is
// subtracted only where the target falls in [vocab_begin, vocab_begin + V).
void softmax_crossentropy_backward(Tensor dlogits, Tensor probs, const int* targets, float dloss,
                                   int vocab_begin = 0);

// Vocabulary-parallel cross-entropy (Megatron-LM): every rank holds logits(N,Vl) for its slice
// [vocab_begin, vocab_begin + Vl) of the vocabulary, and the full (N,V) logits never exist. Three
// stages; between them the caller all-reduces (N) values over the ranks of the slices. Every value
// below named row_* or target_logit is fp32, (N).
// 1. row_max = each row's largest logit in this slice; target_logit = the logit of the row's target
//    where the target falls in this slice, else 0. (Then: all-reduce Max of row_max, Sum of
//    target_logit.)
void crossentropy_shard_max(Tensor row_max, Tensor target_logit, Tensor logits, const int* targets, int vocab_begin);
// 2. probs(N,Vl) = exp(logits - row_max), unnormalised; row_sum = their sum over this slice. (Then:
//    all-reduce Sum of row_sum.)
void crossentropy_shard_exp(Tensor probs, Tensor row_sum, Tensor logits, Tensor row_max);
// 3. losses = log(row_sum) + row_max - target_logit; probs /= row_sum. The backward is
//    softmax_crossentropy_backward with the slice's vocab_begin.
void crossentropy_shard_finish(Tensor losses, Tensor probs, Tensor row_max, Tensor row_sum, Tensor target_logit);

// Small helpers the trainers need on any device.
void fill_zero(Tensor t);
void copy_tensor(Tensor dst, Tensor src);      // same numel
void add_inplace(Tensor dst, Tensor src);      // dst += src
void scale_inplace(Tensor t, float factor);    // t *= factor
void convert_tensor(Tensor dst, Tensor src);   // dst = src in dst's dtype (fp32 <-> bf16), same device
double sum_of_squares(Tensor t);               // accumulated in double
double mean_of(Tensor t);                      // accumulated in double

// One AdamW update of `n` elements (decoupled weight decay, bias-corrected moments):
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)
// where w is `param` itself in fp32 (master empty), or, in mixed precision, the fp32 `master` copy,
// after which param (bf16) = w rounded. `step` counts from 1. The optimizer (optimizer.cpp) calls
// this once per parameter segment.
void adamw_update(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, int step, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale);
