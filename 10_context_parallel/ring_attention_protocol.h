// ring_attention_protocol.h: chapter 10's lesson, the ring itself. Attention on a ring of cp ranks:
// which block of keys and values a rank holds at each step, when it is sent on, and how the
// gradients of the keys and values travel home in the backward. Defines RingAttention, which
// train.cpp wires into the model and tests/test_ring_attention.cpp runs over a real communicator
// against the unsplit attention. The kernels a rank runs on each block: common/ops/ring_attention.h;
// the derivations: docs/theory.md, section 13.
#pragma once
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "comm/comm.h"
#include "training/context_report.h"  // RingCounters, thread_cpu_ms
#include "ops/ops.h"             // fill_zero, add_inplace
#include "ops/ring_attention.h"
#include "comm/trace.h"  // TraceScope, now_ms

// Rank r holds the queries, keys and values of its positions; at step s it computes against the
// block of rank r - s, which it received at step s - 1 while it computed the one before.
class RingAttention {
 public:
  // ring: the context-parallel group, ranked by the place in the ring; positions: those of every
  // rank of the ring (positions[r] for rank r), which the causal mask compares.
  RingAttention(Communicator& ring, std::vector<std::vector<int>> positions, int max_B, int C, int NH)
      : ring_(ring), positions_(std::move(positions)), cp_(ring.size()), rank_(ring.rank()), C_(C),
        buffers_(cp_, max_B, checked_positions(ring, positions_), C, NH, ring.device()) {}

  RingCounters counters;

  // out (B,T,C), lse (B,NH,T), qkv (B,T,3C): this rank's T positions.
  void forward(Tensor out, Tensor lse, Tensor qkv, int NH) {
    const int B = int(out.shape[0]), T = int(out.shape[1]);
    const Measure measure(*this, counters.forward_bytes, counters.forward_idle_ms);
    // The running state: out accumulates the weighted values (not yet divided), lse holds the running
    // maximum, buffers_.stat the running sum.
    attention_block_start(out, lse, buffers_.stat.view());
    float* row_max = lse.f32();
    float* row_sum = buffers_.stat.f32();
    Tensor kv[2] = {block(buffers_.kv[0], B, T), cp_ > 1 ? block(buffers_.kv[1], B, T) : Tensor()};
    pack_kv(kv[0], qkv, B, T, C_);  // this rank's own keys and values start the ring
    for (int s = 0; s < cp_; s++) {
      const Tensor current = kv[s % 2], next = kv[(s + 1) % 2];
      CommHandle passing;  // the block goes on to the next rank while this rank computes with it
      if (s < cp_ - 1) passing = ring_.send_recv_async({{true, current, next_rank(), kBlockTag},
                                                        {false, next, previous_rank(), kBlockTag}});
      const int owner = owner_at(s);
      const double start = now_ms(), start_cpu = thread_cpu_ms();
      {
        TraceScope span("ring block " + std::to_string(owner));
        counters.forward_pairs += attention_block_forward(
            btc_rows(out, T, C_), row_max, row_sum, qkv_rows(qkv, 0, B, T, C_), kv_rows(current, 0, B, T, C_),
            kv_rows(current, 1, B, T, C_), positions_[size_t(rank_)].data(), positions_[size_t(owner)].data(), B, NH,
            C_);
      }
      counters.compute_ms += now_ms() - start;
      counters.compute_cpu_ms += thread_cpu_ms() - start_cpu;
      if (passing.valid()) passing.wait();
    }
    attention_block_finish(btc_rows(out, T, C_), lse.f32(), row_max, row_sum, B, NH, C_);
  }

  // The backward sends the blocks around again. The gradient of block j's keys and values sums the
  // shares of every rank whose queries met it: the owner adds its own share to its dqkv at step 0;
  // the block's first visitor (step 1) starts an accumulator with its share and passes it on; each
  // next visitor adds its share; the last visitor (step cp - 1) is the owner's predecessor, whose
  // send brings the accumulator home. So cp - 1 sends of the blocks and cp - 1 of the accumulators:
  // twice the forward's bytes. Adds into dqkv (B,T,3C).
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
    const int B = int(out.shape[0]), T = int(out.shape[1]);
    const Measure measure(*this, counters.backward_bytes, counters.backward_idle_ms);
    float* D = buffers_.stat.f32();  // <dout, out> per query, which every block's softmax backward needs
    attention_row_dots(D, btc_rows(dout, T, C_), btc_rows(out, T, C_), B, NH, C_);
    Tensor kv[2] = {block(buffers_.kv[0], B, T), cp_ > 1 ? block(buffers_.kv[1], B, T) : Tensor()};
    pack_kv(kv[0], qkv, B, T, C_);
    CommHandle sending[2], arriving;  // the accumulators leaving (one per buffer), the one coming
    for (int s = 0; s < cp_; s++) {
      const Tensor current = kv[s % 2], next = kv[(s + 1) % 2];
      CommHandle passing;
      if (s < cp_ - 1) passing = ring_.send_recv_async({{true, current, next_rank(), kBlockTag},
                                                        {false, next, previous_rank(), kBlockTag}});
      const int owner = owner_at(s);
      // Step 0: the own block's share straight into dqkv. Later: into an accumulator, which must not
      // still be on its way from two steps ago.
      Tensor acc;
      if (s > 0) {
        if (sending[s % 2].valid()) sending[s % 2].wait();
        acc = block(buffers_.dkv_out[s % 2], B, T);
        fill_zero(acc);
      }
      const RowBlock dk = s == 0 ? qkv_rows(dqkv, 1, B, T, C_) : kv_rows(acc, 0, B, T, C_);
      const RowBlock dv = s == 0 ? qkv_rows(dqkv, 2, B, T, C_) : kv_rows(acc, 1, B, T, C_);
      const double start = now_ms(), start_cpu = thread_cpu_ms();
      {
        TraceScope span("ring block " + std::to_string(owner) + " backward");
        counters.backward_pairs += attention_block_backward(
            qkv_rows(dqkv, 0, B, T, C_), dk, dv, qkv_rows(qkv, 0, B, T, C_), kv_rows(current, 0, B, T, C_),
            kv_rows(current, 1, B, T, C_), btc_rows(dout, T, C_), lse.f32(), D,
            positions_[size_t(rank_)].data(), positions_[size_t(owner)].data(), B, NH, C_);
      }
      counters.compute_ms += now_ms() - start;
      counters.compute_cpu_ms += thread_cpu_ms() - start_cpu;
      if (s > 0) {
        // Add what the earlier visitors summed (none at step 1: the owner kept its own share), pass
        // it on, and post the receive of the next one.
        const Tensor incoming = block(buffers_.dkv_in, B, T);
        if (arriving.valid()) {
          arriving.wait();
          add_inplace(acc, incoming);
        }
        sending[s % 2] = ring_.send_async(acc, next_rank(), kGradientTag);
        arriving = ring_.recv_async(incoming, previous_rank(), kGradientTag);
      }
      if (passing.valid()) passing.wait();
    }
    if (arriving.valid()) {  // this rank's own block's accumulator, home from the ring
      arriving.wait();
      add_kv_grad(dqkv, block(buffers_.dkv_in, B, T), B, T, C_);
    }
    for (CommHandle& h : sending)
      if (h.valid()) h.wait();
  }

 private:
  static constexpr int kBlockTag = 10, kGradientTag = 11;
  int next_rank() const { return (rank_ + 1) % cp_; }
  int previous_rank() const { return (rank_ + cp_ - 1) % cp_; }
  int owner_at(int step) const { return (rank_ - step + cp_) % cp_; }  // whose block rank_ holds at `step`
  Tensor block(const Buffer& buffer, int B, int T) const { return buffer.view().slice1d(0, int64_t(B) * T * 2 * C_); }

  // One list of positions per rank of the ring, all as long: a ring of another size would index
  // positions that are not there.
  static int checked_positions(const Communicator& ring, const std::vector<std::vector<int>>& positions) {
    ENSURE(int(positions.size()) == ring.size(),
           "RingAttention: the ring has " + std::to_string(ring.size()) + " ranks but positions for " +
               std::to_string(positions.size()) + ": pass the context-parallel ring (ProcessGrid::ring())");
    for (const std::vector<int>& p : positions)
      ENSURE(!p.empty() && p.size() == positions[0].size(), "RingAttention: every rank holds T/cp positions");
    return int(positions[0].size());
  }

  // The ring communicator's sent bytes and blocked time during one pass, added to the counters.
  struct Measure {
    Measure(const RingAttention& r, int64_t& bytes, double& idle)
        : ring(r.ring_), bytes_(bytes), idle_(idle), before(r.ring_.stats()) {}
    ~Measure() {
      const CommStats d = ring.stats().since(before);
      bytes_ += d.kind[int(CollectiveKind::SendRecv)].sent_bytes;
      idle_ += d.exposed_ms;
    }
    Communicator& ring;
    int64_t& bytes_;
    double& idle_;
    CommStats before;
  };

  Communicator& ring_;
  std::vector<std::vector<int>> positions_;  // of every rank of the ring
  int cp_, rank_, C_;
  RingBuffers buffers_;
};
