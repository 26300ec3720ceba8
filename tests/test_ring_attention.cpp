// test_ring_attention.cpp: the pieces of context parallelism (chapter 10) below the trainer, in one
// process:
//   - the splits: every position is held by exactly one rank, T/cp a rank, zigzag's chunks i and
//     2cp-1-i; the runs and the gathered tokens follow the positions; sizes that do not divide are
//     refused with a message that names the flag;
//   - ring attention, op by op: cp simulated ranks, each keeping its queries while the key and value
//     blocks come by in ring order (rank r sees block r, r-1, ..., r+1), with an online softmax;
//     their outputs, and in backward the gradients of q, k and v (each block's gradient accumulated
//     along the ring and added at its owner at the end), equal the unsplit attention of ops.h, at
//     cp = 2, 3 and 4, contiguous and zigzag;
//   - the work: each simulated rank's counted (query, key) pairs equal the closed form of
//     docs/theory.md, section 13, in forward and backward: zigzag balanced, contiguous not;
//   - the ring's buffers: their measured bytes equal ring_buffer_bytes().
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "context_split.h"
#include "memory.h"
#include "ops.h"
#include "ring_attention.h"
#include "test_util.h"

namespace {

TEST(ContextSplit, EveryPositionOnExactlyOneRank) {
  for (ContextSplit split : {ContextSplit::Contiguous, ContextSplit::Zigzag}) {
    for (int cp : {1, 2, 3, 4}) {
      const int T = 24;
      std::vector<int> seen(T, 0);
      for (int r = 0; r < cp; r++) {
        const std::vector<int> p = context_positions(T, cp, r, split);
        ASSERT_EQ(int(p.size()), T / cp);
        for (int x : p) seen[size_t(x)]++;
        const std::vector<PositionRun> runs = position_runs(p);
        // Contiguous: one run; zigzag: chunks r and 2cp-1-r, which touch only on the last rank (cp-1, cp).
        EXPECT_EQ(int(runs.size()), split == ContextSplit::Zigzag && r != cp - 1 ? 2 : 1);
        if (split == ContextSplit::Zigzag) {
          const int c = T / (2 * cp);
          EXPECT_EQ(p.front(), r * c);
          EXPECT_EQ(p.back(), (2 * cp - r) * c - 1);
        } else {
          EXPECT_EQ(p.front(), r * (T / cp));
        }
        for (const PositionRun& run : runs)
          for (int i = 0; i < run.length; i++) EXPECT_EQ(p[size_t(run.local + i)], run.position + i);
      }
      for (int x = 0; x < T; x++) EXPECT_EQ(seen[size_t(x)], 1) << "position " << x;
    }
  }
}

TEST(ContextSplit, GathersEachSequencesPositions) {
  const int B = 2, T = 8;
  std::vector<int> full(B * T);
  for (int i = 0; i < B * T; i++) full[size_t(i)] = 100 + i;
  const std::vector<int> p = context_positions(T, 2, 1, ContextSplit::Zigzag);  // chunks 1 and 2: 2,3,4,5
  std::vector<int> local(B * p.size());
  gather_positions(full.data(), B, T, p, local.data());
  EXPECT_EQ(local, (std::vector<int>{102, 103, 104, 105, 110, 111, 112, 113}));
}

TEST(ContextSplit, RefusesSizesThatDoNotDivideNamingTheFlags) {
  EXPECT_EQ(context_split_problem(64, 4, ContextSplit::Zigzag), "");
  EXPECT_EQ(context_split_problem(24, 3, ContextSplit::Contiguous), "");
  const std::string zigzag = context_split_problem(20, 4, ContextSplit::Zigzag);  // 8 chunks of 20
  EXPECT_NE(zigzag.find("2 x --cp = 8"), std::string::npos) << zigzag;
  EXPECT_NE(zigzag.find("--cp-split contiguous"), std::string::npos) << zigzag;
  EXPECT_NE(zigzag.find("--cp 2"), std::string::npos) << zigzag;  // 20 divides into 4 chunks
  const std::string contiguous = context_split_problem(17, 2, ContextSplit::Contiguous);
  EXPECT_NE(contiguous.find("T = 17"), std::string::npos) << contiguous;
  EXPECT_NE(contiguous.find("--cp 2"), std::string::npos) << contiguous;
  EXPECT_NE(context_split_problem(16, 0, ContextSplit::Zigzag).find(">= 1"), std::string::npos);
  ContextSplit s;
  EXPECT_TRUE(parse_context_split("zigzag", &s) && s == ContextSplit::Zigzag);
  EXPECT_TRUE(parse_context_split("contiguous", &s) && s == ContextSplit::Contiguous);
  EXPECT_FALSE(parse_context_split("zig-zag", &s));
}

TEST(ContextSplit, PairsFormulaIsTheCountAndZigzagIsBalanced) {
  for (int T : {24, 48, 96}) {
    for (int cp : {1, 2, 3, 4}) {
      int64_t total_zigzag = 0, total_contiguous = 0;
      for (int r = 0; r < cp; r++) {
        for (ContextSplit split : {ContextSplit::Contiguous, ContextSplit::Zigzag}) {
          const int64_t counted = causal_pairs(context_positions(T, cp, r, split));
          EXPECT_EQ(counted, causal_pairs_formula(T, cp, r, split)) << "T " << T << " cp " << cp << " rank " << r;
          (split == ContextSplit::Zigzag ? total_zigzag : total_contiguous) += counted;
        }
      }
      EXPECT_EQ(total_zigzag, int64_t(T) * (T + 1) / 2);
      EXPECT_EQ(total_contiguous, int64_t(T) * (T + 1) / 2);
      // Contiguous: the last rank has 2cp - 1 times the first's work, nearly.
      if (cp > 1) {
        EXPECT_GT(causal_pairs_formula(T, cp, cp - 1, ContextSplit::Contiguous),
                  (2 * cp - 2) * causal_pairs_formula(T, cp, 0, ContextSplit::Contiguous));
      }
    }
  }
}

// One simulated ring: the whole (B,T,3C) qkv split into cp ranks' (B,T/cp,3C) rows.
struct SimulatedRing {
  int B, T, C, NH, cp;
  ContextSplit split;
  std::vector<std::vector<int>> positions;
  std::vector<std::vector<float>> qkv, kv, out, lse, dout, dqkv;
  std::vector<int64_t> forward_pairs, backward_pairs;

  int Tl() const { return T / cp; }
  // rows of `full` (B,T,width) at rank r's positions, and back.
  std::vector<float> take(const std::vector<float>& full, int width, int r) const {
    std::vector<float> local(size_t(B) * Tl() * width);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl(); t++)
        for (int i = 0; i < width; i++)
          local[(size_t(b) * Tl() + t) * width + i] = full[(size_t(b) * T + positions[size_t(r)][size_t(t)]) * width + i];
    return local;
  }
  void put(std::vector<float>& full, const std::vector<float>& local, int width, int r) const {
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl(); t++)
        for (int i = 0; i < width; i++)
          full[(size_t(b) * T + positions[size_t(r)][size_t(t)]) * width + i] = local[(size_t(b) * Tl() + t) * width + i];
  }
  Tensor view(std::vector<float>& v) const { return make_view(v.data(), {int64_t(v.size())}); }

  SimulatedRing(int B_, int T_, int C_, int NH_, int cp_, ContextSplit split_, const std::vector<float>& full_qkv,
                const std::vector<float>& full_dout)
      : B(B_), T(T_), C(C_), NH(NH_), cp(cp_), split(split_) {
    for (int r = 0; r < cp; r++) {
      positions.push_back(context_positions(T, cp, r, split));
      qkv.push_back(take(full_qkv, 3 * C, r));
      dout.push_back(take(full_dout, C, r));
      kv.emplace_back(size_t(B) * Tl() * 2 * C);
      pack_kv(view(kv.back()), view(qkv.back()), B, Tl(), C);
    }
  }

  // Rank r at step s holds the block of rank (r - s) mod cp.
  int block_at(int r, int s) const { return ((r - s) % cp + cp) % cp; }

  void forward() {
    out.assign(size_t(cp), std::vector<float>(size_t(B) * Tl() * C, 0.0f));
    lse.assign(size_t(cp), std::vector<float>(size_t(B) * NH * Tl()));
    forward_pairs.assign(size_t(cp), 0);
    for (int r = 0; r < cp; r++) {
      std::vector<float> row_max(size_t(B) * NH * Tl(), -INFINITY), row_sum(size_t(B) * NH * Tl(), 0.0f);
      const RowBlock acc{out[size_t(r)].data(), C, Tl()};
      for (int s = 0; s < cp; s++) {
        const int j = block_at(r, s);
        forward_pairs[size_t(r)] += attention_block_forward(
            acc, row_max.data(), row_sum.data(), qkv_rows(view(qkv[size_t(r)]), 0, B, Tl(), C),
            kv_rows(view(kv[size_t(j)]), 0, B, Tl(), C), kv_rows(view(kv[size_t(j)]), 1, B, Tl(), C),
            positions[size_t(r)].data(), positions[size_t(j)].data(), B, NH, C);
      }
      attention_block_finish(acc, lse[size_t(r)].data(), row_max.data(), row_sum.data(), B, NH, C);
    }
  }

  void backward() {
    dqkv.assign(size_t(cp), std::vector<float>(size_t(B) * Tl() * 3 * C, 0.0f));
    backward_pairs.assign(size_t(cp), 0);
    std::vector<std::vector<float>> D(size_t(cp), std::vector<float>(size_t(B) * NH * Tl()));
    for (int r = 0; r < cp; r++)
      attention_row_dots(D[size_t(r)].data(), RowBlock{dout[size_t(r)].data(), C, Tl()},
                         RowBlock{out[size_t(r)].data(), C, Tl()}, B, NH, C);
    // Block j's gradient accumulator travels with it: filled by the ranks it visits after its owner.
    std::vector<std::vector<float>> dkv(size_t(cp), std::vector<float>(size_t(B) * Tl() * 2 * C, 0.0f));
    for (int s = 0; s < cp; s++) {
      for (int r = 0; r < cp; r++) {
        const int j = block_at(r, s);
        Tensor mine = view(dqkv[size_t(r)]);
        // Step 0: the rank's own block, straight into its own gradients; later: into the accumulator.
        const RowBlock dk = s == 0 ? qkv_rows(mine, 1, B, Tl(), C) : kv_rows(view(dkv[size_t(j)]), 0, B, Tl(), C);
        const RowBlock dv = s == 0 ? qkv_rows(mine, 2, B, Tl(), C) : kv_rows(view(dkv[size_t(j)]), 1, B, Tl(), C);
        backward_pairs[size_t(r)] += attention_block_backward(
            qkv_rows(mine, 0, B, Tl(), C), dk, dv, qkv_rows(view(qkv[size_t(r)]), 0, B, Tl(), C),
            kv_rows(view(kv[size_t(j)]), 0, B, Tl(), C), kv_rows(view(kv[size_t(j)]), 1, B, Tl(), C),
            RowBlock{dout[size_t(r)].data(), C, Tl()}, lse[size_t(r)].data(), D[size_t(r)].data(),
            positions[size_t(r)].data(), positions[size_t(j)].data(), B, NH, C);
      }
    }
    for (int j = 0; j < cp; j++) add_kv_grad(view(dqkv[size_t(j)]), view(dkv[size_t(j)]), B, Tl(), C);
  }
};

class RingAttentionOps : public ::testing::TestWithParam<std::tuple<int, ContextSplit>> {};

TEST_P(RingAttentionOps, ForwardAndBackwardEqualTheUnsplitAttention) {
  const int cp = std::get<0>(GetParam());
  const ContextSplit split = std::get<1>(GetParam());
  const int B = 2, T = 24, C = 16, NH = 2;
  const std::vector<float> qkv = random_vector(size_t(B) * T * 3 * C, 7, -1.5f, 1.5f);
  const std::vector<float> dout = random_vector(size_t(B) * T * C, 8);

  // The reference: ops.h's attention over the whole sequence, with its (B,NH,T,T) matrices.
  std::vector<float> qkv_copy = qkv, dout_copy = dout;
  std::vector<float> out(size_t(B) * T * C), preatt(size_t(B) * NH * T * T), att(preatt.size());
  std::vector<float> dqkv(qkv.size(), 0.0f), dpreatt(preatt.size()), datt(preatt.size());
  attention_forward(make_view(out.data(), {B, T, C}), make_view(preatt.data(), {B, NH, T, T}),
                    make_view(att.data(), {B, NH, T, T}), make_view(qkv_copy.data(), {B, T, 3 * C}), NH);
  attention_backward(make_view(dqkv.data(), {B, T, 3 * C}), make_view(dpreatt.data(), {B, NH, T, T}),
                     make_view(datt.data(), {B, NH, T, T}), make_view(dout_copy.data(), {B, T, C}),
                     make_view(qkv_copy.data(), {B, T, 3 * C}), make_view(att.data(), {B, NH, T, T}), NH);

  SimulatedRing ring(B, T, C, NH, cp, split, qkv, dout);
  ring.forward();
  ring.backward();
  std::vector<float> ring_out(out.size()), ring_dqkv(dqkv.size());
  for (int r = 0; r < cp; r++) {
    ring.put(ring_out, ring.out[size_t(r)], C, r);
    ring.put(ring_dqkv, ring.dqkv[size_t(r)], 3 * C, r);
  }
  EXPECT_TRUE(allclose(ring_out, out, 1e-6, 1e-5));
  EXPECT_TRUE(allclose(ring_dqkv, dqkv, 1e-6, 1e-5));

  // Each rank computed exactly the pairs the mask leaves it, per sequence and head, in both passes.
  for (int r = 0; r < cp; r++) {
    const int64_t expected = int64_t(B) * NH * causal_pairs_formula(T, cp, r, split);
    EXPECT_EQ(ring.forward_pairs[size_t(r)], expected) << "rank " << r;
    EXPECT_EQ(ring.backward_pairs[size_t(r)], expected) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(CpAndSplit, RingAttentionOps,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(ContextSplit::Contiguous, ContextSplit::Zigzag)),
                         [](const auto& info) {
                           return "cp" + std::to_string(std::get<0>(info.param)) + "_" +
                                  context_split_name(std::get<1>(info.param));
                         });

// The order of the blocks does not matter to the online softmax: blocks in reverse ring order give
// the same output (up to rounding), which is why any rank may start from its own block.
TEST(RingAttentionOps, OnlineSoftmaxDoesNotDependOnTheBlockOrder) {
  const int B = 1, T = 16, C = 8, NH = 2, cp = 4;
  const std::vector<float> qkv = random_vector(size_t(B) * T * 3 * C, 11, -3.0f, 3.0f);
  SimulatedRing ring(B, T, C, NH, cp, ContextSplit::Zigzag, qkv, std::vector<float>(size_t(B) * T * C));
  ring.forward();
  for (int r = 0; r < cp; r++) {
    std::vector<float> out(size_t(B) * (T / cp) * C, 0.0f), lse(size_t(B) * NH * (T / cp));
    std::vector<float> row_max(lse.size(), -INFINITY), row_sum(lse.size(), 0.0f);
    const RowBlock acc{out.data(), C, T / cp};
    for (int j = cp - 1; j >= 0; j--)
      attention_block_forward(acc, row_max.data(), row_sum.data(),
                              qkv_rows(ring.view(ring.qkv[size_t(r)]), 0, B, T / cp, C),
                              kv_rows(ring.view(ring.kv[size_t(j)]), 0, B, T / cp, C),
                              kv_rows(ring.view(ring.kv[size_t(j)]), 1, B, T / cp, C),
                              ring.positions[size_t(r)].data(), ring.positions[size_t(j)].data(), B, NH, C);
    attention_block_finish(acc, lse.data(), row_max.data(), row_sum.data(), B, NH, C);
    EXPECT_TRUE(allclose(out, ring.out[size_t(r)], 1e-6, 1e-5)) << "rank " << r;
    EXPECT_TRUE(allclose(lse, ring.lse[size_t(r)], 1e-6, 1e-5)) << "rank " << r;
  }
}

TEST(RingBuffers, MeasuredBytesEqualTheFormula) {
  for (int cp : {1, 2, 4}) {
    const int64_t before = memory_stats().current[int(MemCategory::Activations)];
    {
      RingBuffers buffers(cp, 3, 40, 24, 4);
      const int64_t measured = memory_stats().current[int(MemCategory::Activations)] - before;
      EXPECT_EQ(double(measured), ring_buffer_bytes(cp, 3, 40, 24, 4)) << "cp " << cp;
    }
    EXPECT_EQ(memory_stats().current[int(MemCategory::Activations)], before);
  }
}

}  // namespace
