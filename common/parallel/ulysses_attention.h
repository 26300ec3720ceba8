// ulysses_attention.h: Ulysses sequence parallelism (DeepSpeed-Ulysses, Jacobs et al. 2023) around
// attention, for chapters 10 and 12. Defines UlyssesCounters, ulysses_positions(), ulysses_problem(),
// UlyssesAttention, ulysses_buffer_bytes() and the all-to-alls' bytes (ulysses_forward_bytes(),
// ulysses_backward_bytes()); docs/theory.md, section 13b, derives every formula here.
//
// A group of u ranks splits the positions of every sequence: each holds T/u of them, all heads. Every
// op but attention acts position by position and runs on them unchanged. Attention mixes positions
// but not heads, so an all-to-all trades the split: afterwards each rank holds NH/u whole heads over
// all the group's positions, computes their attention exactly as one rank would, and a second
// all-to-all trades the output back. With a ring around it (USP, Fang and Zhao 2024: Ulysses inside,
// the ring outside) "all the group's positions" is the ring's chunk, and the ring then runs over
// those positions on NH/u heads.
//
// The backward runs the same two exchanges the other way round: the output's gradient to heads, the
// gradients of q, k and v back to positions. Attention's backward needs q, k, v and the output in the
// head layout too: they are exchanged again rather than kept for every layer (an activation of
// 4 B T C per layer traded for the same bytes on the wire; the log-sum-exp is kept, in the head
// layout, in the model's own (B,NH,T) buffer of the same size).
//
// Layouts (T: this rank's positions; C and NH: the channels and heads the model hands in, its TP
// slice under tensor parallelism; c = C/u): the model's qkv is (B,T,3C), q, k, v each C channels of
// NH heads; the head layout is (B,uT,3c): group rank i's positions at rows [iT, (i+1)T), this rank's
// NH/u heads of q, k and v. fp32, on the CPU.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.h"           // Communicator
#include "parallel/context_split.h"  // ContextSplit
#include "ops/memory.h"         // Buffer
#include "ops/tensor.h"

// What a rank's all-to-alls did, summed over a step's layers and micro-batches.
struct UlyssesCounters {
  int64_t forward_bytes = 0, backward_bytes = 0;  // sent, from the group communicator's counters
  int64_t forward_exchanges = 0, backward_exchanges = 0;
  double forward_idle_ms = 0, backward_idle_ms = 0;  // blocked in the exchanges (their exposed time)
};

// The positions group rank `rank` of u holds of `chunk` (the positions its ring place holds, all T
// of them without a ring): the rank-th of u equal consecutive slices, so that the exchange's rows
// [iT, (i+1)T) are the chunk in order.
std::vector<int> ulysses_positions(const std::vector<int>& chunk, int u, int rank);

// What stops --ulysses u here, as one line naming the flag and what would work, or "": u >= 1; the
// NH heads split by TP first (tp), then by u (NH/(tp u) whole); each ring chunk's T/cp positions
// into u equal slices; the `ranks` that split sequences and heads
// (a stage's DP x CP x TP, or the world) a multiple of tp x cp x u.
std::string ulysses_problem(int u, int NH, int tp, int T, int cp, ContextSplit split, int ranks);

class UlyssesAttention {
 public:
  // The attention that runs in the head layout (a ring of one or more ranks, chapter 10's lesson):
  // the model's hook signatures (model.h, AttentionHooks).
  using Forward = std::function<void(Tensor out, Tensor lse, Tensor qkv, int NH)>;
  using Backward = std::function<void(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH)>;

  // group: the u ranks that trade positions for heads, ranked by the slice they hold; up to max_B
  // sequences of T positions and C channels (the model's, its TP slice) per rank.
  UlyssesAttention(Communicator& group, int max_B, int T, int C, Forward attend, Backward attend_backward);

  UlyssesCounters counters;

  // The model's hooks. out (B,T,C), lse (B,NH,T), qkv (B,T,3C): this rank's positions, every head.
  void forward(Tensor out, Tensor lse, Tensor qkv, int NH);
  // Adds into dqkv (B,T,3C).
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH);

 private:
  // x (B,T,parts C) -> xh (B,uT,parts c): the first all-to-all. to_positions: the second, back, adding
  // into x.
  void to_heads(Tensor x, int parts, float* xh);
  void to_positions(const float* xh, int parts, Tensor x);
  void exchange(int64_t count);  // send_ -> recv_: `count` floats, u equal chunks

  Communicator& group_;
  int u_, C_;
  Forward attend_;
  Backward attend_backward_;
  Buffer qkv_heads_, out_heads_, dout_heads_, dqkv_heads_;  // (B,uT,3c), (B,uT,c), (B,uT,c), (B,uT,3c)
  Buffer send_, recv_;                                     // u chunks of (B,T,3c)
};

// The buffers above, as the allocator counts them (activations): 14 B T C x 4 bytes for up to B
// sequences of T positions and C channels, whatever u.
double ulysses_buffer_bytes(int B, int T, int C);

// The bytes a rank sends in its all-to-alls over a step of K micro-batches of B sequences, L layers,
// T positions held and C channels (docs/theory.md, section 13b): each exchange of x values per
// position keeps the rank's own 1/u and sends the rest, (u-1)/u B T x 4 bytes.
//   forward:  passes x (3C for q, k, v + C for the output) = passes x 4 (u-1)/u L K B T C x 4
//             (passes: 2 under full recomputation, which replays the forward)
//   backward: q, k, v, the output and its gradient to heads (5C), the gradients of q, k, v back (3C)
//             = 8 (u-1)/u L K B T C x 4
double ulysses_forward_bytes(int u, int L, int K, int B, int T, int C, int passes);
double ulysses_backward_bytes(int u, int L, int K, int B, int T, int C);
