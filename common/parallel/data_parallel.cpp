// data_parallel.cpp: see data_parallel.h.
#include "parallel/data_parallel.h"

#include "base/check.h"
#include "comm/wire_format.h"  // the gradients in the recipe's format
#include "parallel/weight_gather.h"  // gather_updated_async: the parameters in the recipe's format
#include "ops/ops.h"

GradientSync::GradientSync(Communicator& group, const GradientBuckets& buckets, Tensor grads, const ShardPlan* zero1,
                           Tensor grad_shard)
    : group_(group), buckets_(buckets), grads_(grads), zero1_(zero1), grad_shard_(grad_shard) {
  ENSURE(!zero1 || grad_shard.numel() == zero1->size(), "GradientSync: the gradient shard is not the plan's size");
}

ShardPlan GradientSync::zero1_plan(const GradientBuckets& buckets, const Communicator& group,
                                   const Communicator* experts) {
  std::optional<ShardGroup> expert_group;
  if (experts) expert_group = ShardGroup{experts->size(), experts->rank()};
  return zero1_plan(buckets, ShardGroup{group.size(), group.rank()}, expert_group);
}

ShardPlan GradientSync::zero1_plan(const GradientBuckets& buckets, ShardGroup dense,
                                   std::optional<ShardGroup> experts) {
  if (!experts) return ShardPlan(buckets.ranges_in_flat_order(), dense.ranks, dense.rank);
  std::vector<int> group_of;  // in flat order, as the ranges: the reverse of the bucket order
  for (int b = buckets.count() - 1; b >= 0; b--) group_of.push_back(buckets.holds_experts(b) ? 1 : 0);
  return ShardPlan(buckets.ranges_in_flat_order(), std::move(group_of), {dense, *experts});
}

void GradientSync::gradient_ready(int param) {
  if (every_micro_batch_ && buckets_.bucket_of(param) == deferred_bucket_) return;  // see finish()
  const int b = buckets_.mark_ready(param);
  if (b >= 0) bucket_ready(b);
}

void GradientSync::set_every_micro_batch(int deferred_param) {
  ENSURE(zero1_, "ZeRO-2's rule needs a shard plan");
  every_micro_batch_ = true;
  deferred_bucket_ = deferred_param >= 0 ? buckets_.bucket_of(deferred_param) : -1;
}

double GradientSync::every_micro_batch_sent_bytes(int ranks, int micro_batches, int64_t padded, int64_t deferred,
                                                  double element_bytes, double gather_element_bytes) {
  const double ring = double(ranks - 1) / ranks, all = double(padded), once = double(deferred);
  const double gather = gather_element_bytes > 0 ? gather_element_bytes : element_bytes;
  return ring * (element_bytes * (micro_batches * (all - once) + once) + gather * all);
}

void GradientSync::set_expert_group(Communicator& experts, float scale) {
  ENSURE(!zero1_ || (zero1_->groups() == 2 && zero1_->ranks(1) == experts.size() && zero1_->rank(1) == experts.rank()),
         "GradientSync: under ZeRO-1 the plan must shard the experts' buckets over their group (zero1_plan)");
  expert_group_ = &experts;
  expert_scale_ = scale;
}

Communicator& GradientSync::group_of_bucket(int b) {
  return expert_group_ && buckets_.holds_experts(b) ? *expert_group_ : group_;
}

Communicator& GradientSync::group_of_range(int i) {
  if (zero1_->group_of(i) == 0) return group_;
  ENSURE(expert_group_, "GradientSync: the plan shards the experts apart, but no expert group was set");
  return *expert_group_;
}

void GradientSync::bucket_ready(int b) {
  const Tensor bucket = grads_.slice1d(buckets_.begin(b), buckets_.size(b));
  if (!zero1_) {
    Communicator& group = group_of_bucket(b);
    in_flight_.push_back(wire_all_reduce_async(group, bucket, ReduceOp::Avg, collective_formats(group).gradients));
    return;
  }
  const int i = zero1_->range_index(buckets_.begin(b));
  Tensor piece = zero1_->piece_of_shard(grad_shard_, i);
  if (every_micro_batch_) {  // received apart, added into the shard by absorb()
    pieces_.push_back({b, Buffer(piece.numel(), MemCategory::CommBuffers, piece.dtype, piece.device)});
    piece = pieces_.back().piece.view();
  }
  Communicator& group = group_of_range(i);
  in_flight_.push_back(wire_reduce_scatter_async(group, bucket, piece, ReduceOp::Avg,
                                                 collective_formats(group).gradients));  // fp32, or the recipe's format
}

void GradientSync::absorb() {
  for (CommHandle& handle : in_flight_) handle.wait();
  in_flight_.clear();
  for (Piece& p : pieces_) {
    const int i = zero1_->range_index(buckets_.begin(p.bucket));
    add_inplace(zero1_->piece_of_shard(grad_shard_, i), p.piece.view());
  }
}

void GradientSync::micro_batch_done() {
  ENSURE(every_micro_batch_ && zero1_, "micro_batch_done: only under ZeRO-2's rule");
  absorb();
  for (Piece& p : pieces_) fill_zero(grads_.slice1d(buckets_.begin(p.bucket), buckets_.size(p.bucket)));
  pieces_.clear();
  buckets_.reset();
}

void GradientSync::finish() {
  if (every_micro_batch_ && deferred_bucket_ >= 0) bucket_ready(deferred_bucket_);
  absorb();
  if (expert_group_ && expert_scale_ != 1)  // (under ZeRO-1 only this rank's pieces are averaged: those)
    for (int b = 0; b < buckets_.count(); b++) {
      if (!buckets_.holds_experts(b)) continue;
      scale_inplace(zero1_ ? zero1_->piece_of_shard(grad_shard_, zero1_->range_index(buckets_.begin(b)))
                           : grads_.slice1d(buckets_.begin(b), buckets_.size(b)),
                    expert_scale_);
    }
  pieces_.clear();
  buckets_.reset();
}

void GradientSync::gather_parameters(Tensor params) {
  ENSURE(zero1_, "gather_parameters: only under ZeRO-1");
  for (int i = 0; i < zero1_->count(); i++) {
    const FlatRange bucket = zero1_->range(i);
    in_flight_.push_back(gather_updated_async(group_of_range(i), buckets_.layout(), bucket,
                                              zero1_->piece_of_full(params, i), params));  // the recipe's format
  }
  for (CommHandle& handle : in_flight_) handle.wait();
  in_flight_.clear();
}
