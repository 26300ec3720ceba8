// tp_test_hooks.h: Megatron's f and g collectives for a model split over a tensor-parallel group,
// written out here as the tests' own (07_tensor_parallel/train.cpp holds the chapter's), so that a
// test of the model under tensor parallelism does not depend on a chapter. Defines
// set_tensor_parallel_hooks().
#pragma once
#include "comm/comm.h"
#include "model/model.h"

// Without sequence parallelism: f is the identity forward and an all-reduce backward, g the reverse.
// With it: f all-gathers the rows forward and reduce-scatters backward, g the reverse. `group` must
// outlive the model's use of the hooks.
inline void set_tensor_parallel_hooks(GPT2& model, Communicator& group, bool sequence_parallel) {
  if (!sequence_parallel) {
    model.product_hooks.f_forward = [](Tensor, Tensor) { return CommHandle(); };
    model.product_hooks.f_backward = [&](Tensor full, Tensor) { return group.all_reduce_async(full, ReduceOp::Sum); };
    model.product_hooks.g_forward = [&](Tensor partial, Tensor) { return group.all_reduce_async(partial, ReduceOp::Sum); };
    model.product_hooks.g_backward = [](Tensor, Tensor) { return CommHandle(); };
  } else {
    model.product_hooks.f_forward = [&](Tensor local, Tensor full) { return group.all_gather_async(local, full); };
    model.product_hooks.f_backward = [&](Tensor full, Tensor local) {
      return group.reduce_scatter_async(full, local, ReduceOp::Sum);
    };
    model.product_hooks.g_forward = [&](Tensor partial, Tensor local) {
      return group.reduce_scatter_async(partial, local, ReduceOp::Sum);
    };
    model.product_hooks.g_backward = [&](Tensor local, Tensor full) { return group.all_gather_async(local, full); };
  }
  model.product_hooks.vocab_all_reduce = [&](Tensor values, ReduceOp op) { group.all_reduce(values, op); };
}
