// context_split.h: which positions of every sequence each rank of a context-parallel group holds
// (chapter 10), and what that costs its attention. Defines ContextSplit, parse_context_split(),
// context_split_problem(), context_positions(), PositionRun / position_runs(), gather_positions() and
// the causal-pair counts of docs/theory.md, section 13.
//
// A group of cp ranks splits the T positions of each sequence; rank r keeps its T/cp positions in every
// layer. Two ways to choose them:
//   contiguous: rank r holds positions [r T/cp, (r+1) T/cp);
//   zigzag:     the sequence is cut into 2cp chunks of T/(2cp), and rank r holds chunks r and 2cp-1-r,
//               so that every rank has as many early positions (cheap under the causal mask) as late
//               ones (dear): each computes the same number of scores.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

enum class ContextSplit { Contiguous, Zigzag };

// "contiguous" or "zigzag" -> *out; false for anything else.
bool parse_context_split(const std::string& text, ContextSplit* out);
const char* context_split_name(ContextSplit split);

// What stops T positions from splitting over cp ranks this way, as a message naming the flags and
// what would work, or "": cp >= 1, T divisible by cp (contiguous) or by 2cp (zigzag). The --cp values
// it suggests are those that work on `world` ranks too (world divisible by them: rings of equal size).
std::string context_split_problem(int T, int cp, ContextSplit split, int world);

// The absolute positions rank `rank` holds, in the order it keeps them (increasing): T/cp of them.
std::vector<int> context_positions(int T, int cp, int rank, ContextSplit split);

// A run of consecutive positions kept at consecutive local rows: local rows [local, local + length)
// hold positions [position, position + length). Contiguous: one run; zigzag: two.
struct PositionRun {
  int local, position, length;
};
std::vector<PositionRun> position_runs(const std::vector<int>& positions);

// local(B, positions.size()) = full(B, T) at those positions: a rank's tokens (or targets) of a
// micro-batch of whole sequences.
void gather_positions(const int* full, int B, int T, const std::vector<int>& positions, int* local);

// The (query, key) pairs that the causal mask leaves to a rank, per sequence and head: a query at
// position p sees keys 0..p, so sum over its positions of (p + 1). Counted from the positions.
int64_t causal_pairs(const std::vector<int>& positions);
// The same in closed form (docs/theory.md, section 13), with n = T/cp and c = T/(2cp):
//   contiguous: rank r:  n^2 r + n(n+1)/2        (rank 0 the least, rank cp-1 the most)
//   zigzag:     every rank:  T(T+1)/(2cp)        (the whole triangle T(T+1)/2, split evenly)
int64_t causal_pairs_formula(int T, int cp, int rank, ContextSplit split);
