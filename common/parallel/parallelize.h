// parallelize.h: each dimension applied to a model chunk, as torchtitan's parallelize_llama applies
// apply_tp, then apply_cp, ... to the model on one mesh. A dimension that changes what the model does
// installs its hooks at the model's seams (model.h: the split products' collectives, attention over
// positions held elsewhere, the experts) through its own apply function, defined in its own file
// (dimension_tensor.cpp, dimension_context.cpp, dimension_ulysses.cpp, dimension_expert.cpp). A chapter
// composes its dimensions as one list of calls, parallelize(chunks, {apply_tensor_parallel(...),
// apply_context_parallel(...), ...}), handing each the pieces of its lesson (07's collectives, 10's
// ring, 11's exchange); the model never asks which ran. Data parallelism and the pipeline fill no
// seam: they act on the gradients (gradient_router.h) and between chunks (pipeline.h).
// Defines ChunkTransform, parallelize() and the dimensions' apply functions.
#pragma once
#include <vector>

#include "comm/comm.h"
#include "model/model.h"  // GPT2 and its seams: ProductHooks, AttentionHooks, ExpertHooks

class UlyssesAttention;  // ulysses_attention.h

// A dimension applied to chunk `index` of this rank's chunks (0 without a pipeline; a V's two chunks
// are 0 and 1). Empty: the dimension splits nothing on this run.
using ChunkTransform = std::function<void(GPT2& chunk, int index)>;

// Applies `dimensions` to every chunk, in the order given: a later one may wrap what an earlier one
// installed (Ulysses around the ring).
void parallelize(const std::vector<GPT2*>& chunks, const std::vector<ChunkTransform>& dimensions);

// Tensor parallelism (07): the f and g collectives around the split products, as the chapter writes
// them (07's lesson), or tensor_parallel_hooks()'s over `group` (tensor_parallel_hooks.h: 09, 12).
ChunkTransform apply_tensor_parallel(ProductHooks collectives);
ChunkTransform apply_tensor_parallel(Communicator& group, bool sequence_parallel, bool overlap);
// Context parallelism (10): attention around the chapter's ring (10's ring_attention_protocol.h).
ChunkTransform apply_context_parallel(AttentionHooks ring);
// Ulysses (10, 12): attention through Ulysses' exchanges, each around the attention it was built on
// (the ring: Ulysses inside, the ring outside). One per lane (lanes.h: dualpipev's F&B pairs run two
// attentions at once), the calling thread's taken; the exchanges must outlive the chunks' passes.
// Empty (no exchange): Ulysses splits nothing, the transform is empty.
ChunkTransform apply_ulysses(const std::vector<UlyssesAttention*>& exchange_of_lane);
// Expert parallelism (11, 12): each chunk's experts through the chapter's exchange (11's
// expert_exchange.h), chunk c's hooks `of_chunk[c]` (its own activation slots of the exchange).
ChunkTransform apply_expert_parallel(std::vector<ExpertHooks> of_chunk);
