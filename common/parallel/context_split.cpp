// context_split.cpp: see context_split.h.
#include "parallel/context_split.h"

#include "base/check.h"

bool parse_context_split(const std::string& text, ContextSplit* out) {
  if (text == "contiguous") *out = ContextSplit::Contiguous;
  else if (text == "zigzag") *out = ContextSplit::Zigzag;
  else return false;
  return true;
}

const char* context_split_name(ContextSplit split) {
  return split == ContextSplit::Zigzag ? "zigzag" : "contiguous";
}

std::string context_split_problem(int T, int cp, ContextSplit split, int world) {
  if (cp < 1) return "--cp must be >= 1";
  auto parts = [&](int ring) { return split == ContextSplit::Zigzag ? 2 * ring : ring; };
  if (T % parts(cp) == 0) return "";
  // The --cp values that would work here: rings that the ranks divide into and T divides for (1 always).
  std::string fits;
  for (int other = 1; other <= world; other++)
    if (other != cp && world % other == 0 && T % parts(other) == 0)
      fits += (fits.empty() ? "--cp " : " or ") + std::to_string(other);
  if (!fits.empty()) fits = fits + " on these " + std::to_string(world) + " ranks, or ";
  if (split == ContextSplit::Zigzag)
    return "the sequence length T = " + std::to_string(T) + " does not divide into 2 x --cp = " +
           std::to_string(parts(cp)) + " zigzag chunks (--cp-split zigzag gives each rank chunks i and 2cp-1-i): use " +
           fits + (T % cp == 0 ? "--cp-split contiguous (T divides by --cp " + std::to_string(cp) + "), or " : "") +
           "another --preset";
  return "the sequence length T = " + std::to_string(T) + " does not divide into --cp " + std::to_string(cp) +
         " equal parts (--cp-split contiguous): use " + fits + "another --preset";
}

std::vector<int> context_positions(int T, int cp, int rank, ContextSplit split) {
  ENSURE(context_split_problem(T, cp, split, cp).empty() && rank >= 0 && rank < cp, "context_positions: bad split");
  std::vector<int> positions;
  auto chunk = [&](int first, int length) {
    for (int p = first; p < first + length; p++) positions.push_back(p);
  };
  if (split == ContextSplit::Contiguous) {
    chunk(rank * (T / cp), T / cp);
  } else {
    const int c = T / (2 * cp);
    chunk(rank * c, c);
    chunk((2 * cp - 1 - rank) * c, c);
  }
  return positions;
}

std::vector<PositionRun> position_runs(const std::vector<int>& positions) {
  std::vector<PositionRun> runs;
  for (int i = 0; i < int(positions.size()); i++) {
    if (!runs.empty() && runs.back().position + runs.back().length == positions[size_t(i)]) {
      runs.back().length++;
    } else {
      runs.push_back({i, positions[size_t(i)], 1});
    }
  }
  return runs;
}

void gather_positions(const int* full, int B, int T, const std::vector<int>& positions, int* local) {
  const size_t n = positions.size();
  for (int b = 0; b < B; b++)
    for (size_t i = 0; i < n; i++) local[size_t(b) * n + i] = full[size_t(b) * T + size_t(positions[i])];
}

int64_t causal_pairs(const std::vector<int>& positions) {
  int64_t pairs = 0;
  for (int p : positions) pairs += p + 1;
  return pairs;
}

int64_t causal_pairs_formula(int T, int cp, int rank, ContextSplit split) {
  if (split == ContextSplit::Zigzag) return int64_t(T) * (T + 1) / (2 * cp);
  const int64_t n = T / cp;
  return n * n * rank + n * (n + 1) / 2;
}
