// shards.h: who owns what under ZeRO (chapters 04-06). Defines ShardPlan.
// Rank r of N owns the flat elements [r*S, (r+1)*S), S = padded_size / N, of the parameters, the
// gradients and the optimizer state: one contiguous slice each, the same offsets in all three.
// A collective over some flat range [begin, end) (a bucket, a layer) then splits it by owner:
// rank r's piece is the range's intersection with its shard, possibly empty. Those per-rank counts
// are what reduce_scatter_v and all_gather_v take.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "param_layout.h"

class ShardPlan {
 public:
  ShardPlan(const ParamLayout& layout, int rank)
      : size_(layout.shard_size()), begin_(layout.shard_begin(rank)), ranks_(layout.ranks) {}

  int64_t size() const { return size_; }    // S: elements this rank owns
  int64_t begin() const { return begin_; }  // first flat element this rank owns
  int64_t end() const { return begin_ + size_; }

  // How many elements of [begin, end) each rank owns, in rank order (they add up to end - begin).
  std::vector<int64_t> counts(int64_t begin, int64_t end) const {
    std::vector<int64_t> counts(ranks_);
    for (int r = 0; r < ranks_; r++)
      counts[r] = std::max<int64_t>(0, std::min(end, (r + 1) * size_) - std::max(begin, r * size_));
    return counts;
  }
  // This rank's piece of [begin, end): [piece_begin, piece_end), empty when it owns none of it.
  int64_t piece_begin(int64_t begin, int64_t end) const { return std::min(std::max(begin, begin_), end); }
  int64_t piece_end(int64_t begin, int64_t end) const { return std::max(std::min(end, this->end()), begin); }

 private:
  int64_t size_, begin_;
  int ranks_;
};
