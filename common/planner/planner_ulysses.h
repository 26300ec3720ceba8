// planner_ulysses.h: Ulysses sequence parallelism as the planner prices it (the sixth dimension, chapters
// 10 and 12's --ulysses U; docs/theory.md, section 13b, derives each formula). u ranks inside each CP
// place hold n = T/(u cp) positions of every head; an all-to-all trades them for NH/(t u) whole heads
// over the place's u n positions around attention, a second trades the output back. Defines the
// refusal (ulysses_split_problem), the exchange's bytes a rank sends (UlyssesExchange: what chapter
// 10 measures, and what the planner times on the cluster's links) and its buffers.
#pragma once
#include <string>

#include "comm/comm.h"  // LinkModel

// What stops u ranks of Ulysses here, "" when nothing: u >= 1; the heads split by TP first, then by u
// (NH/(t u) whole); a place's T/cp positions into u equal slices.
std::string ulysses_split_problem(int u, int NH, int tp, int T, int cp);

// The all-to-alls of one layer and micro-batch on one rank, with `rows` positions held (B n) and the
// channels `width` of the exchanged tensors a position holds per part (a TP rank's C/t, in `element`
// bytes). The chapters' exchange (ulysses_attention.h) sends, forward, q, k and v to heads (3 parts)
// and the output back (1); backward, q, k, v, the output and its gradient to heads again (5) and the
// gradients of q, k, v back (3): 4 parts forward, 8 backward. Each all-to-all keeps the rank's own
// 1/u and sends the rest: (u-1)/u x rows x parts x width x element bytes.
struct UlyssesExchange {
  int u = 1;
  double rows = 0, width = 0, element = 4;
  // The parts a pass moves: forward {3, 1}; backward {3, 1, 1, 3} (the chapters: the head layout
  // exchanged again) or {1, 3} (a run that keeps it, as DeepSpeed-Ulysses does).
  double forward_parts() const { return 4; }
  double backward_parts(bool keeps_heads) const { return keeps_heads ? 4 : 8; }
  // Bytes sent, forward (x `passes`: 2 under full recomputation, which replays the forward) and backward.
  double forward_bytes(int passes) const;
  double backward_bytes(bool keeps_heads) const;
  // Seconds on `link`: each all-to-all of S = rows x parts x width x element bytes over u ranks, one
  // per exchange (the chapters' pairwise exchange: (u-1) (alpha + S/(u beta))). On the critical path:
  // attention waits for its heads, the next product for its positions.
  double forward_seconds(const LinkModel& link, int passes) const;
  double backward_seconds(const LinkModel& link, bool keeps_heads) const;
  // The bytes a pass's packing and unpacking move through memory (read and written): each exchanged
  // value is copied into the send buffer and out of the receive buffer, and the buffers the results
  // land in are zero-filled first (the output forward, q, k, v's gradients in the head layout
  // backward): forward 2 x 4 copies + 1 fill, backward 2 x 8 + 3 a position and channel. Plain
  // memcpy of whole heads' rows: it runs at the memory's bandwidth, not at the rate of the arithmetic
  // around it (layernorms, softmaxes), which the elementwise rate measures.
  double forward_copy_bytes() const { return rows * width * element * (2 * 2 * forward_parts() + 1); }
  double backward_copy_bytes(bool keeps_heads) const {
    return rows * width * element * (2 * 2 * backward_parts(keeps_heads) + (keeps_heads ? 0 : 3));
  }
};

// The exchange's buffers a rank holds (reused by every layer): q, k, v and their gradients in the head
// layout (3 + 3), the output and its gradient (1 + 1), a send and a receive buffer of q, k, v (3 + 3):
// 14 x rows x width x element bytes, whatever u (docs/theory.md, section 13b).
double ulysses_exchange_buffer_bytes(double rows, double width, double element);
