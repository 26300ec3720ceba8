// ring_attention_cuda.h: the CUDA kernels of ring attention (chapter 10, and 12 with --cp), in fp32:
// the same four steps as ring_attention.h's CPU kernels, which dispatch here when their rows live on
// the GPU. Defines namespace cuda's ring_* launchers, defined in ring_attention_cuda.cu.
//
// Rows are given as in ring_attention.h's RowBlock: (data, stride, T), row (b, t) at
// data + (b T + t) stride, head h's hs = C/NH channels at + h hs; statistics are (B, NH, Tq) fp32.
// Positions (q_pos of the Tq queries, k_pos of the Tk keys) are host or device memory; a host list is
// uploaded the first time its contents are seen and kept (memory "other"), so a step uploads nothing. Every launcher queues its work on cuda::stream() and returns:
// the ring's sends run on the communicator's stream meanwhile (comm_nccl.cpp), which is the overlap.
// Supported head sizes: hs a multiple of 32 up to 128 (GPT-2's 64 included), checked by ring_check.
#pragma once
#include <cstdint>
#include <string>

namespace cuda {

// "" where the kernels take these shapes, else why not (one line, for a refusal).
std::string ring_head_size_problem(int C, int NH);

// The running state before the first block: acc = 0 is the caller's (fill_zero); this sets
// row_max = -inf and row_sum = 0 over n statistics.
void ring_start(float* row_max, float* row_sum, int64_t n);
// attention_block_forward: the online softmax folds one block of keys and values into acc, row_max,
// row_sum.
void ring_block_forward(float* acc, int64_t acc_stride, float* row_max, float* row_sum, const float* q,
                        int64_t q_stride, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                        const int* q_pos, int Tq, const int* k_pos, int Tk, int B, int NH, int C);
// attention_block_finish: out = acc / sum in place, lse = max + log(sum).
void ring_block_finish(float* out, int64_t out_stride, float* lse, const float* row_max, const float* row_sum,
                       int T, int B, int NH, int C);
// attention_row_dots: D = <dout, out> per (row, head).
void ring_row_dots(float* D, const float* dout, int64_t dout_stride, const float* out, int64_t out_stride, int T,
                   int B, int NH, int C);
// attention_block_backward: dq, dk, dv += one block's share. Two kernels, no atomics (deterministic,
// as every kernel of ops_cuda.cu): one warp per query row sums dq over the block's keys, then one warp
// per key row sums dk and dv over the queries; each recomputes the probabilities from lse.
void ring_block_backward(float* dq, int64_t dq_stride, float* dk, int64_t dk_stride, float* dv, int64_t dv_stride,
                         const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                         int64_t v_stride, const float* dout, int64_t dout_stride, const float* lse, const float* D,
                         const int* q_pos, int Tq, const int* k_pos, int Tk, int B, int NH, int C);
// pack_kv: kv(B,T,2C) = the k and v channels of qkv(B,T,3C) (one 2-D copy).
void ring_pack_kv(float* kv, const float* qkv, int B, int T, int C);
// add_kv_grad: dqkv's k and v channels += dkv(B,T,2C).
void ring_add_kv_grad(float* dqkv, const float* dkv, int B, int T, int C);

}  // namespace cuda
