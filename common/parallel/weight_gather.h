// weight_gather.h: ZeRO-3's gather of a layer in the recipe's formats. Under a mixed-precision recipe
// a layer's product weights travel as the products will read them (bf16, fp16, or fp8 with a scale
// per tensor), as torchtitan's Float8 gathers fp8 weights under FSDP2; its layernorms, biases and
// embeddings travel in fp32 (they are read in fp32). ZeRO-1's and ZeRO-2's gathers of the updated
// parameters travel the same way. Defines is_product_weight, weight_segments, gather_unit_async and
// gather_updated_async.
#pragma once
#include <vector>

#include "comm/comm.h"
#include "comm/wire_format.h"
#include "model/param_layout.h"
#include "parallel/shards.h"  // FlatRange

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
// The same for any flat range [range.begin, range.end) whose rank r holds `piece` from
// range.begin + r x piece.numel() (a ZeRO-1 bucket's pieces): offsets from range.begin.
std::vector<WireSegment> weight_segments(const ParamLayout& layout, FlatRange range, const CollectiveFormats& formats,
                                         Tensor piece, Communicator& group);

// The all-gather of unit u's parameters from every rank's piece into `full` (the unit's size),
// in the installed recipe's formats (collective_formats(group)); under fp32 the communicator's own.
CommHandle gather_unit_async(Communicator& group, const ParamLayout& layout, int u, Tensor piece, Tensor full);

// ZeRO-1's and ZeRO-2's gather after the sharded optimizer step, in place: every rank's updated piece
// of `range` (rank r's from range.begin + r x piece.numel()) into `params` (the full flat buffer).
// Under a recipe the product weights travel as the products read them, the rest in fp32; this rank's
// own piece is not rewritten: it is its fp32 master, which only its optimizer updates and the
// checkpoint saves. Exact (docs/mixed_precision.md, "ZeRO-1's and ZeRO-2's gathers"): a product
// rounds a weight to its format before reading it, and a value already in the format rounds to
// itself. fp32, or a group of one: the communicator's own all-gather.
CommHandle gather_updated_async(Communicator& group, const ParamLayout& layout, FlatRange range, Tensor piece,
                                Tensor params);
