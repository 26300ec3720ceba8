// weight_gather.h: ZeRO-3's gather of a layer in the recipe's formats. Under a mixed-precision recipe
// a layer's product weights travel as the products will read them (bf16, fp16, or fp8 with a scale
// per tensor), as torchtitan's Float8 gathers fp8 weights under FSDP2; its layernorms, biases and
// embeddings travel in fp32 (they are read in fp32). Defines is_product_weight, weight_segments and
// gather_unit_async.
#pragma once
#include <vector>

#include "comm/comm.h"
#include "comm/wire_format.h"
#include "model/param_layout.h"

// A weight that a matrix product reads and nothing else does: a block's qkv, attention projection,
// fc and fc projection (ndim 2). Not wte, which the embedding reads in fp32, nor wpe.
bool is_product_weight(const ParamInfo& p);

// The segments (offsets from unit u's start) whose elements travel in formats.weights: the unit's
// product weights. With a per-tensor scale (formats.weight_scale_per_tensor), each weight's scale is
// the power of two its amax over `group` gives (E4M3: the largest s with amax x s <= 448, as the
// products' per-tensor scale): each rank takes the amax of the part of the weight its `piece` (its
// chunk of the unit, rank() x size / N onwards) holds, and one scalar all-reduce per weight (Max)
// makes it the whole tensor's. Collective over `group` then; else local.
std::vector<WireSegment> weight_segments(const ParamLayout& layout, int u, const CollectiveFormats& formats,
                                         Tensor piece, Communicator& group);

// The all-gather of unit u's parameters from every rank's piece into `full` (the unit's size),
// in the installed recipe's formats (collective_formats(group)); under fp32 the communicator's own.
CommHandle gather_unit_async(Communicator& group, const ParamLayout& layout, int u, Tensor piece, Tensor full);
