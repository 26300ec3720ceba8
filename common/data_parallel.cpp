// data_parallel.cpp: see data_parallel.h.
#include "data_parallel.h"

#include "check.h"

GradientSync::GradientSync(Communicator& group, const GradientBuckets& buckets, Tensor grads, const ShardPlan* zero1,
                           Tensor grad_shard)
    : group_(group), buckets_(buckets), grads_(grads), zero1_(zero1), grad_shard_(grad_shard) {
  ENSURE(!zero1 || grad_shard.numel() == zero1->size(), "GradientSync: the gradient shard is not the plan's size");
}

ShardPlan GradientSync::zero1_plan(const GradientBuckets& buckets, const Communicator& group) {
  return ShardPlan(buckets.ranges_in_flat_order(), group.size(), group.rank());
}

void GradientSync::gradient_ready(int param) {
  const int b = buckets_.mark_ready(param);
  if (b >= 0) bucket_ready(b);
}

void GradientSync::bucket_ready(int b) {
  const Tensor bucket = grads_.slice1d(buckets_.begin(b), buckets_.size(b));
  if (!zero1_) {
    in_flight_.push_back(group_.all_reduce_async(bucket, ReduceOp::Avg));
    return;
  }
  const int i = zero1_->range_index(buckets_.begin(b));
  in_flight_.push_back(group_.reduce_scatter_async(bucket, zero1_->piece_of_shard(grad_shard_, i), ReduceOp::Avg));
}

void GradientSync::finish() {
  for (CommHandle& handle : in_flight_) handle.wait();
  in_flight_.clear();
  buckets_.reset();
}

void GradientSync::gather_parameters(Tensor params) {
  ENSURE(zero1_, "gather_parameters: only under ZeRO-1");
  for (int i = 0; i < zero1_->count(); i++) {
    const FlatRange bucket = zero1_->range(i);
    in_flight_.push_back(
        group_.all_gather_async(zero1_->piece_of_full(params, i), params.slice1d(bucket.begin, bucket.size())));
  }
  for (CommHandle& handle : in_flight_) handle.wait();
  in_flight_.clear();
}
