// shards.cpp: the ShardPlan of shards.h.
#include "parallel/shards.h"

#include <cstring>
#include <string>

#include "base/check.h"
#include "ops/device.h"  // transfer

ShardPlan::ShardPlan(std::vector<FlatRange> ranges, int ranks, int rank)
    : ShardPlan(ranges, std::vector<int>(ranges.size(), 0), {ShardGroup{ranks, rank}}) {}

ShardPlan::ShardPlan(std::vector<FlatRange> ranges, std::vector<int> range_groups, std::vector<ShardGroup> shard_groups)
    : ranges_(std::move(ranges)), group_of_(std::move(range_groups)), groups_(std::move(shard_groups)) {
  ENSURE(group_of_.size() == ranges_.size() && !groups_.empty(), "ShardPlan: a group for every range");
  for (const ShardGroup& g : groups_)
    ENSURE(g.ranks >= 1 && g.rank >= 0 && g.rank < g.ranks, "ShardPlan: rank out of range");
  group_size_.assign(groups_.size(), 0);
  int64_t expected_begin = 0;
  for (size_t i = 0; i < ranges_.size(); i++) {
    const FlatRange& r = ranges_[i];
    ENSURE(r.begin == expected_begin && r.end >= r.begin, "ShardPlan: ranges must be consecutive from 0");
    ENSURE(group_of_[i] >= 0 && group_of_[i] < groups(), "ShardPlan: a range's group is not the plan's");
    ENSURE(r.size() % ranks(group_of_[i]) == 0, "ShardPlan: a range does not divide by its group's rank count");
    shard_offset_.push_back(size_);
    size_ += piece_size(int(i));
    group_size_[size_t(group_of_[i])] += piece_size(int(i));
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
  ENSURE(q >= 0 && q < ranks(group_of(i)), "ShardPlan::piece: no such rank in the range's group");
  const int64_t n = piece_size(i);
  return {ranges_[i].begin + q * n, ranges_[i].begin + (q + 1) * n};
}

FlatRange ShardPlan::piece(int i) const { return piece(i, rank(group_of(i))); }

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

void ShardPlan::pack_group(const Tensor& shard, int group, const Tensor& packed) const {
  ENSURE(packed.numel() == group_size(group), "pack_group: not the group's size");
  int64_t at = 0;
  for (int i = 0; i < count(); i++)
    if (group_of(i) == group) {
      transfer(packed.slice1d(at, piece_size(i)), piece_of_shard(shard, i));
      at += piece_size(i);
    }
}

void ShardPlan::assemble_full(const Tensor& all_packed, const Tensor& full, int group) const {
  ENSURE(all_packed.device == Device::CPU && full.device == Device::CPU && all_packed.dtype == full.dtype,
         "assemble_full: host tensors of one dtype");
  const int64_t packed = group_size(group);
  ENSURE(all_packed.numel() == packed * ranks(group) && full.numel() == flat_size(), "assemble_full: sizes");
  const size_t element = dtype_size(full.dtype);
  const char* from = static_cast<const char*>(all_packed.data);
  char* to = static_cast<char*>(full.data);
  for (int q = 0; q < ranks(group); q++) {
    int64_t at = q * packed;  // rank q's pieces of the group, in range order
    for (int i = 0; i < count(); i++) {
      if (group_of(i) != group) continue;
      std::memcpy(to + piece(i, q).begin * element, from + at * element, size_t(piece_size(i)) * element);
      at += piece_size(i);
    }
  }
}
