// tensor_parallel_hooks.cpp: see tensor_parallel_hooks.h.
#include "parallel/tensor_parallel_hooks.h"

#include "comm/wire_format.h"  // activations and their gradients in the recipe's formats (fp32: as they are)

namespace {
const Wire& activations(const Communicator& tp) { return collective_formats(tp).activations; }
const Wire& gradients(const Communicator& tp) { return collective_formats(tp).gradients; }
}  // namespace

ProductHooks tensor_parallel_hooks(Communicator& group, bool sequence_parallel, bool overlap) {
  Communicator* tp = &group;
  auto started = [overlap](CommHandle handle) {
    if (!overlap) {
      handle.wait();
      return CommHandle();
    }
    return handle;
  };
  ProductHooks hooks;
  if (!sequence_parallel) {
    hooks.f_forward = [](Tensor, Tensor) { return CommHandle(); };
    hooks.f_backward = [tp, started](Tensor full, Tensor) {
      return started(wire_all_reduce_async(*tp, full, ReduceOp::Sum, gradients(*tp)));
    };
    hooks.g_forward = [tp](Tensor partial, Tensor) { return wire_all_reduce_async(*tp, partial, ReduceOp::Sum, activations(*tp)); };
    hooks.g_backward = [](Tensor, Tensor) { return CommHandle(); };
  } else {
    hooks.f_forward = [tp, started](Tensor local, Tensor full) {
      return started(wire_all_gather_async(*tp, local, full, activations(*tp)));
    };
    hooks.f_backward = [tp, started](Tensor full, Tensor local) {
      return started(wire_reduce_scatter_async(*tp, full, local, ReduceOp::Sum, gradients(*tp)));
    };
    hooks.g_forward = [tp](Tensor partial, Tensor local) {
      return wire_reduce_scatter_async(*tp, partial, local, ReduceOp::Sum, activations(*tp));
    };
    hooks.g_backward = [tp](Tensor local, Tensor full) { return wire_all_gather_async(*tp, local, full, gradients(*tp)); };
  }
  hooks.vocab_all_reduce = [tp](Tensor values, ReduceOp op) { tp->all_reduce(values, op); };
  return hooks;
}
