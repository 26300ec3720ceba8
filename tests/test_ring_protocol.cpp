// test_ring_protocol.cpp: chapter 10's ring itself, the RingAttention of
// 10_context_parallel/ring_attention_protocol.h that the chapter runs, over real communicators under
// mpiexec (1 to 4 ranks: rings of every size that divides the world, each ring a group split from it).
// Each rank of a ring keeps its queries while the blocks of keys and values travel; its outputs and
// its rows of the gradients of q, k and v (each block's accumulated along the ring and brought home)
// equal the unsplit attention of ops.h at its positions, contiguous and zigzag. Twice: on ordinary
// inputs, and on large logits (scores of 1e3 to 1e4, where exp overflows fp32 unless the running
// maximum is subtracted). Each rank's counted (query, key) pairs equal the closed form of
// docs/theory.md, section 13, and its sent bytes the ring's: (cp-1) blocks forward, twice that backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../10_context_parallel/ring_attention_protocol.h"
#include "parallel/context_split.h"
#include "mpi_test_env.h"
#include "ops/ops.h"
#include "test_util.h"

namespace {

// B sequences of T positions; C = 32 channels in NH = 2 heads of hs = 16, whose 1/sqrt(hs) = 1/4 is
// exact: with integer q and k every score is exact in fp32, whatever order a kernel sums in, so the
// ring and the reference see the same scores even at 1e4.
constexpr int B = 2, T = 24, C = 32, NH = 2;

struct Attention {
  std::vector<float> qkv, dout, out, dqkv;  // (B,T,3C), (B,T,C), (B,T,C), (B,T,3C)
};

// The inputs, the same on every rank (fixed seeds), and ops.h's attention over the whole sequence,
// with its (B,NH,T,T) matrices.
Attention reference(bool large_logits) {
  Attention a;
  a.qkv = random_vector(size_t(B) * T * 3 * C, 7, -1.5f, 1.5f);
  if (large_logits) {
    // q and k: integers in [-64, 64], so <q, k> / 4 reaches thousands; v stays in (-1.5, 1.5).
    const std::vector<float> big = random_vector(a.qkv.size(), 9, -64.0f, 64.0f);
    for (size_t row = 0; row < size_t(B) * T; row++)
      for (int i = 0; i < 2 * C; i++) a.qkv[row * 3 * C + size_t(i)] = std::round(big[row * 3 * C + size_t(i)]);
  }
  a.dout = random_vector(size_t(B) * T * C, 8);
  std::vector<float> qkv = a.qkv, dout = a.dout, preatt(size_t(B) * NH * T * T), att(preatt.size());
  std::vector<float> dpreatt(preatt.size()), datt(preatt.size());
  a.out.assign(size_t(B) * T * C, 0.0f);
  a.dqkv.assign(qkv.size(), 0.0f);
  attention_forward(make_view(a.out.data(), {B, T, C}), make_view(preatt.data(), {B, NH, T, T}),
                    make_view(att.data(), {B, NH, T, T}), make_view(qkv.data(), {B, T, 3 * C}), NH);
  attention_backward(make_view(a.dqkv.data(), {B, T, 3 * C}), make_view(dpreatt.data(), {B, NH, T, T}),
                     make_view(datt.data(), {B, NH, T, T}), make_view(dout.data(), {B, T, C}),
                     make_view(qkv.data(), {B, T, 3 * C}), make_view(att.data(), {B, NH, T, T}), NH);
  return a;
}

// The rows (B,T,width) of `full` at `positions`: what a rank holds.
std::vector<float> rows_at(const std::vector<float>& full, int width, const std::vector<int>& positions) {
  std::vector<float> local;
  for (int b = 0; b < B; b++)
    for (int p : positions) {
      const float* row = full.data() + (size_t(b) * T + size_t(p)) * width;
      local.insert(local.end(), row, row + width);
    }
  return local;
}

float largest_magnitude(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Every ring of cp ranks of the world runs the chapter's ring forward and backward on its rank's rows.
void expect_ring_equals_unsplit_attention(int cp, ContextSplit split, bool large_logits) {
  Communicator& world = test_comm();
  const std::unique_ptr<Communicator> ring = world.split(world.rank() / cp, world.rank() % cp, "cp");
  ASSERT_EQ(ring->size(), cp);
  std::vector<std::vector<int>> positions;
  for (int r = 0; r < cp; r++) positions.push_back(context_positions(T, cp, r, split));
  const std::vector<int>& mine = positions[size_t(ring->rank())];
  const int Tl = int(mine.size());
  const Attention full = reference(large_logits);

  RingAttention attention(*ring, positions, B, C, NH);
  std::vector<float> qkv = rows_at(full.qkv, 3 * C, mine), dout = rows_at(full.dout, C, mine);
  std::vector<float> out(size_t(B) * Tl * C), lse(size_t(B) * NH * Tl), dqkv(qkv.size(), 0.0f);
  attention.forward(make_view(out.data(), {B, Tl, C}), make_view(lse.data(), {B, NH, Tl}),
                    make_view(qkv.data(), {B, Tl, 3 * C}), NH);
  attention.backward(make_view(dqkv.data(), {B, Tl, 3 * C}), make_view(dout.data(), {B, Tl, C}),
                     make_view(qkv.data(), {B, Tl, 3 * C}), make_view(out.data(), {B, Tl, C}),
                     make_view(lse.data(), {B, NH, Tl}), NH);

  const std::string where = "cp " + std::to_string(cp) + " " + context_split_name(split) + ", ring rank " +
                            std::to_string(ring->rank()) + (large_logits ? ", large logits" : "");
  const std::vector<float> out_ref = rows_at(full.out, C, mine), dqkv_ref = rows_at(full.dqkv, 3 * C, mine);
  EXPECT_TRUE(allclose(out, out_ref, 1e-6, 1e-5)) << where;
  // fp32 against fp32. Large logits: the gradients of near-tied scores cancel, and q and k of up to 64
  // scale what is left, so the tolerance follows the largest gradient (a missing maximum subtraction
  // misses by far more: its softmax is uniform over the keys whose exp saturates).
  const double atol = large_logits ? 1e-5 * largest_magnitude(dqkv_ref) : 1e-6, rtol = large_logits ? 1e-4 : 1e-5;
  EXPECT_TRUE(allclose(dqkv, dqkv_ref, atol, rtol)) << where;

  // The work: the pairs the mask leaves this rank, in both passes; the traffic: cp - 1 blocks of
  // (B, T/cp, 2C) fp32 forward, and backward the blocks again with their gradients' accumulators.
  const int64_t pairs = int64_t(B) * NH * causal_pairs_formula(T, cp, ring->rank(), split);
  EXPECT_EQ(attention.counters.forward_pairs, pairs) << where;
  EXPECT_EQ(attention.counters.backward_pairs, pairs) << where;
  const int64_t block_bytes = int64_t(B) * Tl * 2 * C * 4;
  EXPECT_EQ(attention.counters.forward_bytes, (cp - 1) * block_bytes) << where;
  EXPECT_EQ(attention.counters.backward_bytes, 2 * (cp - 1) * block_bytes) << where;
}

class RingProtocol : public ::testing::TestWithParam<std::tuple<ContextSplit, bool>> {};

TEST_P(RingProtocol, EveryRingEqualsTheUnsplitAttention) {
  const ContextSplit split = std::get<0>(GetParam());
  const bool large_logits = std::get<1>(GetParam());
  const int world = test_comm().size();
  for (int cp = 1; cp <= world; cp++)
    if (world % cp == 0) expect_ring_equals_unsplit_attention(cp, split, large_logits);
}

INSTANTIATE_TEST_SUITE_P(SplitsAndLogits, RingProtocol,
                         ::testing::Combine(::testing::Values(ContextSplit::Contiguous, ContextSplit::Zigzag),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(context_split_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_large_logits" : "_ordinary");
                         });

}  // namespace
