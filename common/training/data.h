// data.h: byte-level tokens and the documented, rank-count-independent data order.
// Defines TokenData, load_token_data() and default_corpus().
//
// The order, reproducible from this description alone: with global batch B (sequences) and context
// T, global step s and global sample i (0 <= i < B) read the T+1 bytes starting at
//     offset = ((s*B + i) * T) mod (len - T - 1)
// inputs are the first T bytes, targets the last T. Rank r of N takes samples [r*B/N, (r+1)*B/N);
// with gradient accumulation K, it splits them into K micro-batches of B/(N*K) samples, in order.
// A mixture of experts (moe.h) takes micro-batch m as the step's samples [m*B/K, (m+1)*B/K) instead,
// rank r their r-th B/(N*K): its capacity and balance loss then count the same sequences on any grid.
#pragma once
#include <cstdint>
#include <string>

class TokenData {
 public:
  TokenData() = default;
  explicit TokenData(std::string bytes, std::string description);

  int64_t length() const { return int64_t(bytes_.size()); }
  uint64_t hash() const { return hash_; }  // FNV-1a of the bytes: a checkpoint records which data it saw
  const std::string& description() const { return description_; }  // "path (N bytes)" or "built-in ..."

  // Fills inputs and targets, each count x T, with global samples [first, first+count) of global
  // step `step`, for a global batch of B sequences.
  void fill(int64_t step, int B, int first, int count, int T, int* inputs, int* targets) const;

 private:
  std::string bytes_;
  std::string description_;
  uint64_t hash_ = 0;
};

// Reads `path` (any file; each byte is a token), or builds the default corpus when path is empty.
// Returns false with a clear *error for a missing or unreadable file, or one shorter than T+2 bytes.
bool load_token_data(const std::string& path, int T, TokenData* data, std::string* error);

// The built-in corpus: about 1 MB of English-like text generated deterministically from a small
// grammar, so training needs no network and no licence (docs/running.md, "Data").
std::string default_corpus();
