// tensor_parallel_hooks.cpp: see tensor_parallel_hooks.h.
#include "parallel/tensor_parallel_hooks.h"

TensorParallelHooks tensor_parallel_hooks(Communicator& group, bool sequence_parallel, bool overlap) {
  Communicator* tp = &group;
  auto started = [overlap](CommHandle handle) {
    if (!overlap) {
      handle.wait();
      return CommHandle();
    }
    return handle;
  };
  TensorParallelHooks hooks;
  if (!sequence_parallel) {
    hooks.f_forward = [](Tensor, Tensor) { return CommHandle(); };
    hooks.f_backward = [tp, started](Tensor full, Tensor) { return started(tp->all_reduce_async(full, ReduceOp::Sum)); };
    hooks.g_forward = [tp](Tensor partial, Tensor) { return tp->all_reduce_async(partial, ReduceOp::Sum); };
    hooks.g_backward = [](Tensor, Tensor) { return CommHandle(); };
  } else {
    hooks.f_forward = [tp, started](Tensor local, Tensor full) { return started(tp->all_gather_async(local, full)); };
    hooks.f_backward = [tp, started](Tensor full, Tensor local) {
      return started(tp->reduce_scatter_async(full, local, ReduceOp::Sum));
    };
    hooks.g_forward = [tp](Tensor partial, Tensor local) { return tp->reduce_scatter_async(partial, local, ReduceOp::Sum); };
    hooks.g_backward = [tp](Tensor local, Tensor full) { return tp->all_gather_async(local, full); };
  }
  hooks.vocab_all_reduce = [tp](Tensor values, ReduceOp op) { tp->all_reduce(values, op); };
  return hooks;
}
