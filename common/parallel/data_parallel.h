// data_parallel.h: data parallelism over one group, as chapters 03 and 04 teach it, for the chapters
// that combine it with another parallelism (07 tensor, 08 pipeline), whose own files then hold only
// their lesson. Defines GradientSync.
//
// Gradients are averaged over the data-parallel group bucket by bucket, each bucket's collective
// starting the moment backward has finished its last gradient (03), on the last micro-batch only
// (no_sync). Without a shard plan, a bucket is all-reduced in place (03); with one (ZeRO-1, 04), it
// is reduce-scattered into this rank's gradient shard, and gather_parameters() all-gathers the
// updated pieces after the optimizer. Buckets then hold whole layers (BucketCut::AtLayers), whose
// ranges are the plan's.
// ZeRO-2's rule, every_micro_batch (08's --zero2 demonstration): a sharded gradient cannot wait for
// the last micro-batch, so each micro-batch's buckets are reduce-scattered as they complete, each
// piece added into the shard, and the bucket zeroed for the next micro-batch's backward.
// Chapter 12's mixture of experts: the experts' buckets go to their own group (set_expert_group),
// all-reduced there, or under ZeRO-1 (and ZeRO-2's rule) reduce-scattered and gathered there, the
// plan sharding those buckets over that group (zero1_plan with `experts`).
#pragma once
#include <optional>
#include <utility>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "ops/memory.h"
#include "parallel/shards.h"

class GradientSync {
 public:
  // grads: the full flat gradient buffer the model writes. zero1: null for an all-reduce, else the
  // plan over the group whose ranges are the buckets' (GradientSync::zero1_plan builds it), with
  // grad_shard its shard-sized receive buffer.
  GradientSync(Communicator& group, const GradientBuckets& buckets, Tensor grads, const ShardPlan* zero1 = nullptr,
               Tensor grad_shard = Tensor());

  // The plan of ZeRO-1 over `group` for these buckets: rank r owns piece r of every bucket. With
  // `experts` (chapter 12), the buckets that hold experts are the plan's group 1, over that group
  // (rank r of it owns piece r of each), the rest group 0, over `group`.
  static ShardPlan zero1_plan(const GradientBuckets& buckets, const Communicator& group,
                              const Communicator* experts = nullptr);
  // The same from the groups' sizes and this rank's places, without a communicator: every rank's
  // plan can be built on one (tests/test_5d_parallel.cpp checks they cover every element once).
  static ShardPlan zero1_plan(const GradientBuckets& buckets, ShardGroup dense,
                              std::optional<ShardGroup> experts = std::nullopt);

  // The model's grad_ready, on the step's last micro-batch (no_sync is the caller's: 03): params[p]'s
  // gradient is final; the bucket it completes, if any, starts its collective.
  void gradient_ready(int param);
  // Chapter 12: the buckets of MoE experts (GradientBuckets' experts_apart) go to `experts` (their
  // expert-data-parallel group) instead, averaged there and then scaled by `scale` (an expert's
  // gradient sums the tokens of its expert-parallel group; see 12's train.cpp). Under ZeRO-1 the plan
  // must shard those buckets over that group (zero1_plan with `experts`).
  void set_expert_group(Communicator& experts, float scale);
  // Waits for every bucket (after the last backward); the gradients are then averaged (or, under
  // ZeRO-1, this rank's pieces are, in grad_shard).
  void finish();

  // ZeRO-2's rule (ZeRO-1's plan): gradient_ready is called on every micro-batch, and each bucket
  // reduce-scattered then; the caller zeroes grad_shard at the start of each step, and calls
  // micro_batch_done() before a micro-batch's backward writes into the buckets: it waits for the
  // reduce-scatters in flight, adds their pieces into the shard, and zeroes those buckets. The
  // bucket of `deferred_param` (a tied embedding, summed over stages first; -1: none) keeps
  // accumulating over the micro-batches and is reduce-scattered once, by finish().
  void set_every_micro_batch(int deferred_param = -1);
  void micro_batch_done();
  // What a rank sends a step under that rule in the data-parallel group (docs/theory.md, section 10),
  // from the layout alone, for a group of `ranks` and `deferred` elements held back (a pipeline's tied
  // wte, in a bucket of its own: [0, ParamLayout::tied_wte_end); 0 for none): m reduce-scatters of
  // every bucket but the deferred one, which goes once, then the parameters' all-gather:
  // (N-1)/N x w x (m(padded - E) + E + padded), E the deferred elements and `padded` the elements of
  // the group's buckets (the flat length, less any experts' ranges, which go to their own group:
  // (D-1)/D x w x (m + 1) x their elements). The theory table's (dimension_data.cpp), which has the
  // layout but not the buckets. gather_element_bytes: the parameters' where they travel otherwise (a
  // recipe's; 0: element_bytes).
  static double every_micro_batch_sent_bytes(int ranks, int micro_batches, int64_t padded, int64_t deferred,
                                             double element_bytes,
                                             double gather_element_bytes = 0);
  static constexpr const char* kEveryMicroBatchFormula =
      "m reduce-scatters (wte's bucket: 1) + all-gather: (N-1)/N x w(m(Ψ-E) + E + Ψ)";
  // ZeRO-1: every rank gathers everyone's updated pieces of `params` (the full flat buffer), bucket
  // by bucket, in place, each over the group that shards it.
  void gather_parameters(Tensor params);

 private:
  void bucket_ready(int b);
  Communicator& group_of_bucket(int b);  // the experts' group for their buckets (set_expert_group)
  Communicator& group_of_range(int i);   // the plan's range i: group 0 or 1

  Communicator& group_;
  Communicator* expert_group_ = nullptr;
  float expert_scale_ = 1;
  GradientBuckets buckets_;
  Tensor grads_;
  const ShardPlan* zero1_;
  Tensor grad_shard_;
  std::vector<CommHandle> in_flight_;
  bool every_micro_batch_ = false;
  int deferred_bucket_ = -1;
  struct Piece {  // every_micro_batch: a bucket's piece being received, added into the shard later
    int bucket;
    Buffer piece;
  };
  std::vector<Piece> pieces_;
  void absorb();  // waits for the pieces and adds them into the shard
};
