// layer_grads.cpp: see layer_grads.h.
#include "parallel/layer_grads.h"

#include "comm/wire_format.h"  // the gradients in the recipe's format
#include "ops/ops.h"

void LayerGradReducer::open(int u) {
  while (in_flight_.size() >= max_in_flight_) retire_oldest();
  if (open_.count(u)) return;
  // Zeroed: backward accumulates.
  Buffer buffer(layout_.unit_size(u), MemCategory::CommBuffers, grad_shard_.dtype, grad_shard_.device);
  model_.bind_unit_grads(u, buffer.data());
  open_[u] = std::move(buffer);
}

void LayerGradReducer::reduce_scatter(int u) {
  const int range = shard_.range_index(layout_.unit_begin[u]);
  Buffer piece(shard_.piece_size(range), MemCategory::CommBuffers, grad_shard_.dtype, grad_shard_.device);
  InFlight sending{std::move(open_.at(u)), std::move(piece), range, CommHandle()};
  open_.erase(u);
  model_.bind_unit_grads(u, nullptr);
  sending.handle = wire_reduce_scatter_async(comm_, sending.layer_grads.view(), sending.piece.view(), ReduceOp::Avg,
                                             collective_formats(comm_).gradients);  // fp32, or the recipe's format
  in_flight_.push_back(std::move(sending));
}

void LayerGradReducer::retire_oldest() {
  InFlight& done = in_flight_.front();
  done.handle.wait();
  add_inplace(shard_.piece_of_shard(grad_shard_, done.range), done.piece.view());
  in_flight_.pop_front();  // frees the layer's gradients and the piece
}

void LayerGradReducer::finish() {
  while (!in_flight_.empty()) retire_oldest();
}
