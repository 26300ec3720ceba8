// test_ring_attention.cpp: the pieces of context parallelism (chapter 10) below the ring, in one
// process:
//   - the splits: every position is held by exactly one rank, T/cp a rank, zigzag's chunks i and
//     2cp-1-i; the runs and the gathered tokens follow the positions; sizes that do not divide are
//     refused with a message that names the flag and suggests only --cp values that fit the ranks;
//   - the work: the counted (query, key) pairs equal the closed form of docs/theory.md, section 13:
//     zigzag balanced, contiguous not;
//   - the online softmax: blocks of keys in any order give the same output and log-sum-exp;
//   - the ring's buffers: their measured bytes equal ring_buffer_bytes().
// The ring itself (chapter 10's RingAttention, over real communicators, against the unsplit
// attention): test_ring_protocol.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/context_split.h"
#include "ops/memory.h"
#include "ops/ops.h"
#include "ops/ring_attention.h"
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
  EXPECT_EQ(context_split_problem(64, 4, ContextSplit::Zigzag, 4), "");
  EXPECT_EQ(context_split_problem(24, 3, ContextSplit::Contiguous, 3), "");
  const std::string zigzag = context_split_problem(20, 4, ContextSplit::Zigzag, 4);  // 8 chunks of 20
  EXPECT_NE(zigzag.find("2 x --cp = 8"), std::string::npos) << zigzag;
  EXPECT_NE(zigzag.find("--cp-split contiguous"), std::string::npos) << zigzag;
  EXPECT_NE(zigzag.find("use --cp 1 or 2 on these 4 ranks,"), std::string::npos) << zigzag;  // 2 and 4 chunks
  const std::string contiguous = context_split_problem(17, 2, ContextSplit::Contiguous, 2);
  EXPECT_NE(contiguous.find("T = 17"), std::string::npos) << contiguous;
  EXPECT_NE(contiguous.find("use --cp 1 on these 2 ranks"), std::string::npos) << contiguous;
  EXPECT_NE(context_split_problem(16, 0, ContextSplit::Zigzag, 2).find(">= 1"), std::string::npos);
  ContextSplit s;
  EXPECT_TRUE(parse_context_split("zigzag", &s) && s == ContextSplit::Zigzag);
  EXPECT_TRUE(parse_context_split("contiguous", &s) && s == ContextSplit::Contiguous);
  EXPECT_FALSE(parse_context_split("zig-zag", &s));
}

// The --cp values a refusal suggests: "use --cp 1 or 2, ..." -> {1, 2}.
std::vector<int> suggested_cps(const std::string& message) {
  std::vector<int> values;
  const size_t at = message.find("use --cp ");
  if (at == std::string::npos) return values;
  std::istringstream in(message.substr(at + 9));
  int value;
  std::string word;
  while (in >> value) {
    values.push_back(value);
    if (!(in >> word) || word != "or") break;
  }
  return values;
}

// Every --cp a refusal suggests fits both the ranks (rings of equal size) and T; on 3 ranks of T = 64
// only 1 does (2 and 4 divide T but not the ranks).
TEST(ContextSplit, SuggestsOnlyRingSizesThatFit) {
  for (ContextSplit split : {ContextSplit::Contiguous, ContextSplit::Zigzag})
    for (int world : {2, 3, 4, 6, 8})
      for (int T : {17, 20, 64})
        for (int cp = 1; cp <= world; cp++) {
          const std::string message = world % cp == 0 ? context_split_problem(T, cp, split, world) : "";
          if (message.empty()) continue;
          // Exactly the ring sizes that work here, tried one by one.
          std::vector<int> fit;
          for (int other = 1; other <= world; other++)
            if (world % other == 0 && context_split_problem(T, other, split, world).empty()) fit.push_back(other);
          EXPECT_EQ(suggested_cps(message), fit) << message;
        }
  const std::string three = context_split_problem(64, 3, ContextSplit::Contiguous, 3);
  EXPECT_EQ(suggested_cps(three), std::vector<int>{1}) << three;
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

// The order of the blocks does not matter to the online softmax: a rank's queries against the cp
// blocks in ring order and in reverse give the same output and log-sum-exp (up to rounding), which is
// why any rank may start from its own block.
TEST(RingAttentionOps, OnlineSoftmaxDoesNotDependOnTheBlockOrder) {
  const int B = 1, T = 16, C = 8, NH = 2, cp = 4, Tl = T / cp;
  const std::vector<float> qkv = random_vector(size_t(B) * T * 3 * C, 11, -3.0f, 3.0f);
  std::vector<std::vector<int>> positions;
  std::vector<std::vector<float>> local(cp), kv(cp);
  for (int r = 0; r < cp; r++) {
    positions.push_back(context_positions(T, cp, r, ContextSplit::Zigzag));
    for (int p : positions.back())
      local[size_t(r)].insert(local[size_t(r)].end(), qkv.begin() + p * 3 * C, qkv.begin() + (p + 1) * 3 * C);
    kv[size_t(r)].resize(size_t(B) * Tl * 2 * C);
    pack_kv(make_view(kv[size_t(r)].data(), {int64_t(kv[size_t(r)].size())}),
            make_view(local[size_t(r)].data(), {int64_t(local[size_t(r)].size())}), B, Tl, C);
  }
  for (int r = 0; r < cp; r++) {
    std::vector<float> out[2], lse[2];
    for (int reverse : {0, 1}) {
      out[reverse].assign(size_t(B) * Tl * C, 0.0f);
      lse[reverse].assign(size_t(B) * NH * Tl, 0.0f);
      std::vector<float> row_max(lse[reverse].size(), -INFINITY), row_sum(lse[reverse].size(), 0.0f);
      const RowBlock acc{out[reverse].data(), C, Tl};
      for (int s = 0; s < cp; s++) {
        const int j = reverse ? cp - 1 - s : (r - s + cp) % cp;  // ring order: r, r-1, ...
        Tensor block = make_view(kv[size_t(j)].data(), {int64_t(kv[size_t(j)].size())});
        attention_block_forward(acc, row_max.data(), row_sum.data(),
                                qkv_rows(make_view(local[size_t(r)].data(), {int64_t(local[size_t(r)].size())}), 0, B,
                                         Tl, C),
                                kv_rows(block, 0, B, Tl, C), kv_rows(block, 1, B, Tl, C),
                                positions[size_t(r)].data(), positions[size_t(j)].data(), B, NH, C);
      }
      attention_block_finish(acc, lse[reverse].data(), row_max.data(), row_sum.data(), B, NH, C);
    }
    EXPECT_TRUE(allclose(out[1], out[0], 1e-6, 1e-5)) << "rank " << r;
    EXPECT_TRUE(allclose(lse[1], lse[0], 1e-6, 1e-5)) << "rank " << r;
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
