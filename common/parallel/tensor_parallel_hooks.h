// tensor_parallel_hooks.h: chapter 07's collectives as the chapters that compose tensor parallelism
// with other dimensions (09, 12) wire them into every model chunk. "f" precedes a column-parallel
// product and "g" follows a row-parallel one, each the other's mirror in backward (model.h,
// ProductHooks): all-reduces, or under sequence parallelism all-gathers and reduce-scatters of
// the rows, over the tensor-parallel group. 07 writes them out itself: they are its lesson.
// Defines tensor_parallel_hooks().
#pragma once
#include "comm/comm.h"
#include "model/model.h"  // ProductHooks

// The hooks over `group` (which must outlive them). `overlap` (--tp-overlap): the backward's input
// gradient sums are left running while the weight's gradient is computed; without it each is waited
// for at once, so that nothing runs behind the computation.
ProductHooks tensor_parallel_hooks(Communicator& group, bool sequence_parallel, bool overlap);
