// buckets.h: gradient buckets for data parallelism (chapters 03, 04). Defines BucketCut and
// GradientBuckets.
// A bucket is a contiguous offset range of the flat gradient buffer, so communicating it copies
// nothing. Buckets are cut in the order backward produces gradients: from the end of the buffer
// toward its start (parameters are stored in forward order). Together they cover [0, padded_size)
// exactly, padding included. A parameter never straddles two buckets, so a bucket may exceed the
// target size when one tensor alone does. ZeRO (04) cuts only between layers, where the layout pads
// to a multiple of the rank count, so that every bucket splits evenly over the ranks (shards.h).
// A pipeline stage's tied wte is a bucket of its own, whatever the cut (ParamLayout::tied_wte_end).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/param_layout.h"
#include "parallel/shards.h"  // FlatRange

enum class BucketCut { AtTensors, AtLayers };

// The default bucket size when --bucket-mb is not given: an eighth of the gradient, so that about
// eight buckets travel whatever the model's size: enough for the first to leave while backward
// still runs, few enough that the link's latency is paid a few times only. (PyTorch DDP's fixed 25 MB
// suits models of hundreds of MB; this course's models are 0.5 to 500 MB.)
double default_bucket_bytes(const ParamLayout& layout, size_t element_bytes);

class GradientBuckets {
 public:
  // element_bytes: the size of one gradient element (4 in fp32, 2 in bf16), so that a bucket holds
  // about bucket_bytes whatever the dtype. AtLayers: buckets hold whole units (layers).
  // experts_apart (chapter 12): a bucket never mixes a MoE expert's tensors with others, so that each
  // bucket averages over one group (experts over their expert-data-parallel group, the rest over DP).
  GradientBuckets(const ParamLayout& layout, double bucket_bytes, size_t element_bytes = 4,
                  BucketCut cut = BucketCut::AtTensors, bool experts_apart = false);

  // The layout the buckets cut (it must outlive them): which of a bucket's tensors are matrices.
  const ParamLayout& layout() const { return *layout_; }
  int count() const { return int(begin_.size()); }
  int64_t begin(int b) const { return begin_[b]; }  // bucket 0 is the first backward fills
  int64_t end(int b) const { return end_[b]; }
  int64_t size(int b) const { return end_[b] - begin_[b]; }
  int bucket_of(int param) const { return bucket_of_[param]; }
  bool holds_experts(int b) const { return experts_[size_t(b)]; }  // (experts_apart: wholly)
  FlatRange range(int b) const { return {begin_[b], end_[b]}; }
  // Every bucket's, in bucket order; without_experts: but those of MoE experts, which average over
  // their own group (the data-parallel group's calls).
  std::vector<int64_t> sizes(bool without_experts = false) const;
  std::vector<int64_t> expert_sizes() const;  // those of MoE experts alone (experts_apart), in bucket order
  // Every bucket's range in flat order (the reverse of the bucket order), for a ShardPlan.
  std::vector<FlatRange> ranges_in_flat_order() const;
  // The plan as the chapters print it: "8 buckets of about 1.21 MB, in the order backward fills them:
  // [2090240, 2420480) ...", bucket_bytes being the target size asked for.
  std::string describe(double bucket_bytes) const;

  // Marks params[param]'s gradient as final. Returns the bucket's index when that completes it
  // (every parameter in it is final), else -1.
  int mark_ready(int param);
  // Forgets every mark, for the next backward.
  void reset();

 private:
  const ParamLayout* layout_;
  std::vector<int64_t> begin_, end_;
  std::vector<int> bucket_of_;
  std::vector<int> params_in_;  // per bucket
  std::vector<int> pending_;    // per bucket: parameters not yet final
  std::vector<bool> experts_;   // per bucket: it holds expert tensors
};
