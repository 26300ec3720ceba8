// layer_grads.cpp: see layer_grads.h.
#include "layer_grads.h"

#include "ops.h"

void LayerGradReducer::open(int u) {
  while (in_flight_.size() >= max_in_flight_) retire_oldest();
  if (open_.count(u)) return;
  // Zeroed: backward accumulates.
  Buffer buffer(layout_.unit_size(u), MemCategory::CommBuffers, grad_shard_.dtype, grad_shard_.device);
  model_.bind_unit_grads(u, buffer.data());
  open_[u] = std::move(buffer);
}

void LayerGradReducer::reduce_scatter(int u) {
  const int64_t begin = layout_.unit_begin[u], end = layout_.unit_begin[u + 1];
  const int64_t lo = shard_.piece_begin(begin, end), hi = shard_.piece_end(begin, end);
  Buffer piece(hi - lo, MemCategory::CommBuffers, grad_shard_.dtype, grad_shard_.device);
  InFlight sending{std::move(open_.at(u)), std::move(piece), lo, CommHandle()};
  open_.erase(u);
  model_.bind_unit_grads(u, nullptr);
  sending.handle = comm_.reduce_scatter_v_async(sending.layer_grads.view(), sending.piece.view(),
                                                shard_.counts(begin, end), ReduceOp::Avg);
  in_flight_.push_back(std::move(sending));
}

void LayerGradReducer::retire_oldest() {
  InFlight& done = in_flight_.front();
  done.handle.wait();
  if (done.piece.count() > 0) {  // a rank may own none of this layer
    add_inplace(grad_shard_.slice1d(done.piece_begin - shard_.begin(), done.piece.count()), done.piece.view());
  }
  in_flight_.pop_front();  // frees the layer's gradients and the piece
}

void LayerGradReducer::finish() {
  while (!in_flight_.empty()) retire_oldest();
}
