// layer_gather.h: ZeRO-3's parameter path (chapter 06). Defines GatheredLayers.
// No full parameter buffer exists: a layer is gathered, when a hook asks, into a layer-sized buffer
// that every rank's piece of it fills (gather_unit_async, weight_gather.h), bound to the model once
// the gather has arrived, and freed when the hook releases it. Which layer is gathered, prefetched
// and released when is the chapter's lesson; this holds the buffers and counts the most elements
// held gathered at once (counted as communication buffers).
#pragma once
#include <cstdint>
#include <map>

#include "comm/comm.h"
#include "ops/memory.h"
#include "model/model.h"
#include "parallel/shards.h"

class GatheredLayers {
 public:
  // param_shard: this rank's parameter shard (shard.size() elements); the buffers are allocated in
  // its dtype, on `device`.
  GatheredLayers(Communicator& comm, GPT2& model, const ShardPlan& shard, Tensor param_shard, DType dtype,
                 Device device)
      : comm_(comm), model_(model), layout_(model.layout()), shard_(shard), param_shard_(param_shard), dtype_(dtype),
        device_(device) {}

  // Launches the all-gather of unit u and returns at once. Nothing for a unit already gathered (or
  // being gathered), nor for one outside the model (u < 0 or past the head), so that a prefetch of
  // "the next layer" needs no bounds check.
  void gather(int u);
  // Unit u is about to compute: gathers it if it is not, waits for its gather and binds it.
  void use(int u);
  // Unbinds unit u and frees its buffer.
  void release(int u);
  // The most elements held gathered at once so far (for report_zero3_peak, zero3_report.h).
  int64_t peak() const { return peak_; }

 private:
  struct Gathered {
    Buffer params;
    CommHandle handle;
    bool bound = false;
  };
  Communicator& comm_;
  GPT2& model_;
  const ParamLayout& layout_;
  const ShardPlan& shard_;
  Tensor param_shard_;
  DType dtype_;
  Device device_;
  std::map<int, Gathered> gathered_;
  int64_t now_ = 0, peak_ = 0;  // elements
};
