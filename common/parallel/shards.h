// shards.h: who owns what under ZeRO (chapters 04-06). Defines FlatRange and ShardPlan.
//
// A plan cuts the flat buffer (parameters, gradients, optimizer state: the same offsets in all three)
// into consecutive ranges whose lengths divide by the N ranks of the group, and rank r owns piece r
// of EVERY range: [begin + r*len/N, begin + (r+1)*len/N). Its shard is the concatenation of its
// pieces, in range order. So every collective over one range is balanced: in a reduce-scatter or an
// all-gather of a range, each rank sends and receives (N-1)/N of it, as FSDP shards each flat
// parameter and Megatron's distributed optimizer each bucket. (Owning one contiguous slice of the
// whole buffer instead would make a layer's gather a broadcast from the one or two ranks that hold
// it, with their links carrying N-1 times the layer while the others idle.)
//
// The ranges are layers (per_unit: ZeRO-2 and 3 reduce-scatter and gather layer by layer) or buckets
// of whole layers (ZeRO-1): the layout pads every layer to a multiple of N x 16 elements, so both
// divide evenly, into 64-byte-aligned pieces.
//
// A range may be sharded over another group than the rest (chapter 12's mixture of experts: the
// experts' buckets over the ranks that hold the same experts, the expert-data-parallel group, the
// rest over DP x CP). The plan then lists its groups (ShardGroup: how many ranks, which is this one)
// and the group of every range; rank r of a range's group owns piece r of it. The shard is still the
// pieces in range order (on groups of one rank, the full buffer itself); a checkpoint gathers it group
// by group, each group's pieces packed together (pack_group) for one all-gather over that group.
#pragma once
#include <cstdint>
#include <vector>

#include "model/param_layout.h"
#include "ops/tensor.h"

struct FlatRange {
  int64_t begin = 0, end = 0;  // [begin, end) in elements of the flat buffer
  int64_t size() const { return end - begin; }
};

// A group of ranks a range is sharded over: its size, and this rank's place in it.
struct ShardGroup {
  int ranks = 1, rank = 0;
};

class ShardPlan {
 public:
  // `ranges` are consecutive and cover [0, flat size); each length divides by `ranks`.
  ShardPlan(std::vector<FlatRange> ranges, int ranks, int rank);
  // Each range i sharded over shard_groups[range_groups[i]]; its length divides by that group's ranks.
  ShardPlan(std::vector<FlatRange> ranges, std::vector<int> range_groups, std::vector<ShardGroup> shard_groups);
  // Everything on one rank: what 01-03 run the optimizer on.
  static ShardPlan unsharded(const ParamLayout& layout);
  // One range per unit (layer), over `ranks`: ZeRO-2 and ZeRO-3.
  static ShardPlan per_unit(const ParamLayout& layout, int ranks, int rank);

  // The groups: group 0 (the only one but in chapter 12's MoE plan), and its size and this rank's place.
  int groups() const { return int(groups_.size()); }
  int ranks(int group = 0) const { return groups_[size_t(group)].ranks; }
  int rank(int group = 0) const { return groups_[size_t(group)].rank; }
  int64_t size() const { return size_; }            // S: elements this rank owns (the same on every rank of a group)
  int64_t flat_size() const { return ranges_.empty() ? 0 : ranges_.back().end; }
  int count() const { return int(ranges_.size()); }  // ranges
  const FlatRange& range(int i) const { return ranges_[i]; }
  int group_of(int i) const { return group_of_[size_t(i)]; }
  int64_t piece_size(int i) const { return ranges_[i].size() / ranks(group_of(i)); }
  // The elements of this rank's pieces of group g's ranges (the same on every rank of the group).
  int64_t group_size(int group) const { return group_size_[size_t(group)]; }
  // Rank q's piece of range i, as flat offsets.
  FlatRange piece(int i, int q) const;
  FlatRange piece(int i) const;  // this rank's, in the range's group
  // Where range i's piece starts within a shard (the same offset on every rank).
  int64_t shard_offset(int i) const { return shard_offset_[i]; }
  // The index of the range that begins at flat offset `begin` (a bucket's, a unit's).
  int range_index(int64_t begin) const;

  // This rank's piece of range i as a view: of a full flat buffer (flat_size() elements) or of a
  // shard (size() elements). A plan on one rank has size() == flat_size(): both views coincide.
  Tensor piece_of_full(const Tensor& full, int i) const;
  Tensor piece_of_shard(const Tensor& shard, int i) const;

  // shard = this rank's pieces of `full`, which may live on another device (transfer(), device.h).
  void copy_to_shard(const Tensor& full, const Tensor& shard) const;
  // packed = this rank's pieces of group g's ranges, from `shard`, one after another in range order
  // (group_size(g) elements; with one group, the shard itself).
  void pack_group(const Tensor& shard, int group, const Tensor& packed) const;
  // full = every rank's pieces of group g's ranges, from `all_packed`, the group's ranks' packed
  // pieces one after another (an all-gather of pack_group over the group), both on the host. With one
  // group: the N shards one after another.
  void assemble_full(const Tensor& all_packed, const Tensor& full, int group = 0) const;

 private:
  std::vector<FlatRange> ranges_;
  std::vector<int> group_of_;
  std::vector<ShardGroup> groups_;
  std::vector<int64_t> shard_offset_;
  std::vector<int64_t> group_size_;
  int64_t size_ = 0;
};
