// ring_attention.h: causal attention computed one block of keys and values at a time, with an online
// softmax (a running maximum and sum per query, the FlashAttention way), forward and backward, in
// fp32 on the CPU or a GPU: what a rank of a context-parallel ring (chapter 10) computes as each block of keys and
// values comes by. Defines RowBlock, OnlineSoftmax's kernels (attention_block_forward, _finish,
// attention_row_dots, attention_block_backward), the packing of a rank's k and v into the block that
// travels (pack_kv, add_kv_grad), RingBuffers and ring_buffer_bytes(). docs/theory.md, section 13,
// derives every formula here.
//
// Masking is by absolute position: a query at position p sees the keys at positions <= p, wherever
// they sit in their blocks, so any split of the sequence (contiguous, zigzag) gives the same attention.
// A (query, key) pair that the mask removes costs nothing; the kernels count the pairs they computed.
//
// On a GPU (rows on Device::CUDA, fp32) each kernel dispatches to ring_attention_cuda.cu, which
// runs the same loops in the same order; the positions stay host memory either way.
//
// Shapes: B sequences; a block of Tq queries (or Tk keys); C channels in NH heads of hs = C/NH.
// Tensors with one row per (sequence, position) are RowBlocks: row (b, t) starts at
// data + (b T + t) stride, and head h's hs channels follow at + h hs. The statistics (the running
// maximum and sum, the log-sum-exp lse, the row dots D) are (B, NH, Tq) fp32.
#pragma once
#include <cstdint>
#include <string>

#include "ops/memory.h"  // Buffer
#include "ops/tensor.h"

struct RowBlock {
  float* data;
  int64_t stride;  // floats from one row to the next
  int T;           // rows per sequence
  Device device = Device::CPU;  // where data lives: the kernels below run there (CUDA: fp32 only)
  float* row(int b, int t) const { return data + (int64_t(b) * T + t) * stride; }
};

// One block of keys and values into the running state of the queries: for each query row, the
// scores s = <q, k> / sqrt(hs) of the keys it may see, m' = max(m, max s), and then
//   sum <- sum exp(m - m') + sum_k exp(s_k - m'),   acc <- acc exp(m - m') + sum_k exp(s_k - m') v_k.
// `acc` is (B,Tq,C) (the output, not yet divided), row_max and row_sum (B,NH,Tq); start them at 0,
// -inf and 0. Returns the (query, key) pairs computed, summed over sequences and heads.
int64_t attention_block_forward(RowBlock acc, float* row_max, float* row_sum, RowBlock q, RowBlock k, RowBlock v,
                                const int* q_pos, const int* k_pos, int B, int NH, int C);
// Before the first block: acc(B,Tq,C) = 0, row_max (B,NH,Tq) = -inf, row_sum (B,NH,Tq) = 0, on
// whichever device they live.
void attention_block_start(Tensor acc, Tensor row_max, Tensor row_sum);
// After the last block: out = acc / sum (in place) and lse = m + log(sum), kept for the backward.
void attention_block_finish(RowBlock out, float* lse, const float* row_max, const float* row_sum, int B, int NH,
                            int C);
// D = <dout, out> per query row and head: the softmax's backward needs it, once for all blocks.
void attention_row_dots(float* D, RowBlock dout, RowBlock out, int B, int NH, int C);
// One block's share of the gradients, from the forward's lse (P = exp(s - lse) is recomputed):
//   dv_k += sum_q P dout_q;   dP = <dout_q, v_k>;   dS = P (dP - D_q);
//   dq += sum_k dS k_k / sqrt(hs);   dk_k += sum_q dS q_q / sqrt(hs).
// Accumulates into dq, dk, dv. Returns the pairs computed.
int64_t attention_block_backward(RowBlock dq, RowBlock dk, RowBlock dv, RowBlock q, RowBlock k, RowBlock v,
                                 RowBlock dout, const float* lse, const float* D, const int* q_pos, const int* k_pos,
                                 int B, int NH, int C);

// The block that travels the ring: a rank's keys and values, (B, T, 2C): k in channels [0, C), v in
// [C, 2C). pack_kv copies them out of qkv (B,T,3C); add_kv_grad adds a travelled block of their
// gradients into dqkv's k and v channels.
void pack_kv(Tensor kv, Tensor qkv, int B, int T, int C);
void add_kv_grad(Tensor dqkv, Tensor dkv, int B, int T, int C);
// Views of a (B,T,3C) qkv and of a (B,T,2C) block as RowBlocks of q, k, v (part 0, 1, 2 of qkv; 0 and
// 1 of a block), and of a (B,T,C) tensor (out, dout) as one RowBlock. fp32, on either device.
RowBlock qkv_rows(Tensor qkv, int part, int B, int T, int C);
RowBlock kv_rows(Tensor kv, int part, int B, int T, int C);
RowBlock btc_rows(Tensor x, int T, int C);
// "" where ring attention can run on `device` with these shapes, else the reason, one line: on
// CUDA, a build with CUDA and a head size C/NH that ring_attention_cuda.cu takes.
std::string ring_attention_problem(Device device, int C, int NH);

// What a rank of the ring keeps besides the model's activations, for micro-batches of up to B
// sequences of T local positions: two blocks of keys and values (the one computed on, the one
// arriving), in backward also two of their gradients' accumulators (the one leaving, the one being
// filled) and one arriving, and one (B,NH,T) fp32 statistic (the running sum in forward, D in
// backward). With one rank (no ring) a single block: the rank's own keys and values. Counted as
// activations.
struct RingBuffers {
  RingBuffers(int cp, int B, int T, int C, int NH, Device device = Device::CPU);
  Buffer kv[2];       // (B,T,2C)
  Buffer dkv_out[2];  // (B,T,2C)
  Buffer dkv_in;      // (B,T,2C)
  Buffer stat;        // (B,NH,T) fp32
};
// Their bytes, as the allocator counts them (docs/theory.md, section 13):
//   cp > 1: 5 x B T 2C x 4 + B NH T x 4;   cp = 1: B T 2C x 4 + B NH T x 4.
double ring_buffer_bytes(int cp, int B, int T, int C, int NH);
