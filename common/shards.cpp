// shards.cpp: the ShardPlan of shards.h.
#include "shards.h"

#include <cstring>
#include <string>

#include "check.h"
#include "device.h"  // transfer

ShardPlan::ShardPlan(std::vector<FlatRange> ranges, int ranks, int rank)
    : ranges_(std::move(ranges)), ranks_(ranks), rank_(rank) {
  ENSURE(ranks >= 1 && rank >= 0 && rank < ranks, "ShardPlan: rank out of range");
  int64_t expected_begin = 0;
  for (const FlatRange& r : ranges_) {
    ENSURE(r.begin == expected_begin && r.end >= r.begin, "ShardPlan: ranges must be consecutive from 0");
    ENSURE(r.size() % ranks == 0, "ShardPlan: a range does not divide by the rank count");
    shard_offset_.push_back(size_);
    size_ += r.size() / ranks;
    expected_begin = r.end;
  }
}

ShardPlan ShardPlan::unsharded(const ParamLayout& layout) { return ShardPlan({{0, layout.padded_size}}, 1, 0); }

ShardPlan ShardPlan::per_unit(const ParamLayout& layout, int ranks, int rank) {
  std::vector<FlatRange> ranges;
  for (int u = 0; u < layout.num_units(); u++) ranges.push_back({layout.unit_begin[u], layout.unit_begin[u + 1]});
  return ShardPlan(std::move(ranges), ranks, rank);
}

int ShardPlan::range_index(int64_t begin) const {
  for (int i = 0; i < count(); i++)
    if (ranges_[i].begin == begin) return i;
  ENSURE(false, "ShardPlan: no range begins at " + std::to_string(begin));
  return -1;
}

FlatRange ShardPlan::piece(int i, int q) const {
  const int64_t n = piece_size(i);
  return {ranges_[i].begin + q * n, ranges_[i].begin + (q + 1) * n};
}

Tensor ShardPlan::piece_of_full(const Tensor& full, int i) const {
  ENSURE(full.numel() == flat_size(), "piece_of_full: not a full flat buffer");
  return full.slice1d(piece(i).begin, piece_size(i));
}

Tensor ShardPlan::piece_of_shard(const Tensor& shard, int i) const {
  ENSURE(shard.numel() == size_, "piece_of_shard: not a shard of this plan");
  return shard.slice1d(shard_offset_[i], piece_size(i));
}

void ShardPlan::copy_to_shard(const Tensor& full, const Tensor& shard) const {
  for (int i = 0; i < count(); i++) transfer(piece_of_shard(shard, i), piece_of_full(full, i));
}

void ShardPlan::assemble_full(const Tensor& all_shards, const Tensor& full) const {
  ENSURE(all_shards.device == Device::CPU && full.device == Device::CPU && all_shards.dtype == full.dtype,
         "assemble_full: host tensors of one dtype");
  ENSURE(all_shards.numel() == size_ * ranks_ && full.numel() == flat_size(), "assemble_full: sizes");
  const size_t element = dtype_size(full.dtype);
  const char* from = static_cast<const char*>(all_shards.data);
  char* to = static_cast<char*>(full.data);
  for (int q = 0; q < ranks_; q++)
    for (int i = 0; i < count(); i++)
      std::memcpy(to + piece(i, q).begin * element, from + (q * size_ + shard_offset_[i]) * element,
                  size_t(piece_size(i)) * element);
}
