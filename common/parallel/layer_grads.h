// layer_grads.h: ZeRO-2/3's gradient path (chapters 05, 06). Defines LayerGradReducer.
// No full gradient buffer exists: each layer's gradients go into a transient buffer that lives from
// the start of the layer's backward until its reduce-scatter has delivered this rank's piece of the
// layer (rank r owns piece r of every layer: ShardPlan::per_unit, shards.h), which is then added
// into the rank's gradient shard. At most max_in_flight reduce-scatters travel at once, which bounds
// the transient memory (counted as communication buffers).
#pragma once
#include <deque>
#include <map>

#include "comm/comm.h"
#include "ops/memory.h"
#include "model/model.h"
#include "parallel/shards.h"

class LayerGradReducer {
 public:
  // grad_shard: this rank's gradient shard (shard.size() elements), on the device the layer buffers
  // are allocated on.
  LayerGradReducer(Communicator& comm, GPT2& model, const ShardPlan& shard, Tensor grad_shard, size_t max_in_flight = 2)
      : comm_(comm), model_(model), layout_(model.layout()), shard_(shard), grad_shard_(grad_shard),
        max_in_flight_(max_in_flight) {}

  // Before unit u's backward: makes room (waits for the oldest reduce-scatters beyond the limit),
  // then gives the unit a zeroed gradient buffer and binds it. Opening an open unit does nothing.
  void open(int u);
  // After unit u's backward: its gradients are final. Reduce-scatters them (async) to their owners
  // and unbinds the unit; the buffer is freed once the reduce-scatter is done.
  void reduce_scatter(int u);
  // Waits for every reduce-scatter and adds each piece into the shard (end of a backward).
  void finish();

 private:
  void retire_oldest();

  struct InFlight {
    Buffer layer_grads, piece;  // what is sent, and this rank's averaged piece
    int range;                  // the layer's range in the plan
    CommHandle handle;
  };
  Communicator& comm_;
  GPT2& model_;
  const ParamLayout& layout_;
  const ShardPlan& shard_;
  Tensor grad_shard_;
  size_t max_in_flight_;
  std::map<int, Buffer> open_;  // unit -> its gradient buffer, being written by backward
  std::deque<InFlight> in_flight_;
};
