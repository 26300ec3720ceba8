// layer_gather.cpp: GatheredLayers, ZeRO-3's layers gathered for use (layer_gather.h).
#include "parallel/layer_gather.h"

#include <algorithm>

#include "parallel/weight_gather.h"  // gather_unit_async: a layer in the recipe's formats (fp32: as it is)

void GatheredLayers::gather(int u) {
  if (u < 0 || u >= layout_.num_units() || gathered_.count(u)) return;
  Gathered& g = gathered_[u];
  g.params = Buffer(layout_.unit_size(u), MemCategory::CommBuffers, dtype_, device_);
  g.handle = gather_unit_async(comm_, layout_, u, shard_.piece_of_shard(param_shard_, u), g.params.view());
  now_ += layout_.unit_size(u);
  peak_ = std::max(peak_, now_);
}

void GatheredLayers::use(int u) {
  gather(u);
  Gathered& g = gathered_[u];
  if (!g.bound) {
    g.handle.wait();
    model_.bind_unit_params(u, g.params.data());
    g.bound = true;
  }
}

void GatheredLayers::release(int u) {
  model_.bind_unit_params(u, nullptr);
  now_ -= layout_.unit_size(u);
  gathered_.erase(u);  // frees the buffer
}
