// wire_format.h: collectives whose payload travels in a low-precision format, a layer around the
// communicator's calls. Defines Wire (a format and a power-of-two scale), WireSegment, the collectives
// in a format (wire_all_reduce_async, wire_reduce_scatter_async, wire_all_gather_async,
// wire_all_gather_segments_async) and CollectiveFormats, the formats of the mixed-precision recipe
// installed on a run's communicators (set by MixedPrecision, fp32 everywhere when none is).
//
// What happens to the values (docs/mixed_precision.md, "Communication in the format"):
//   before the send   each fp32 value x becomes the code of x * scale (x * scale / N for an Avg, as
//                     NCCL's average premultiplies), rounded to nearest even, once per contribution;
//   on arrival        a reduction widens the two codes it combines to fp32, adds them in fp32 and
//                     rounds the sum back to the format: each partial sum that travels on is a code,
//                     as NCCL reduces bf16 and fp16 (comm_mpi_args.cpp, the MPI ops);
//   after             the codes received are decoded and divided by the scale (exact: a power of
//                     two) into the caller's fp32 tensor, the rank's own chunk of a gather included,
//                     so that every rank holds the same values.
// A Wire of fp32 calls the communicator as it is: nothing converted, bit for bit the fp32 run. So
// does a group of one rank, which moves nothing: where no byte travels, nothing is rounded.
// The counters then count what travelled: 2 bytes an element for bf16 and fp16, 1 for fp8. The codes
// are staged in one buffer per communicator, reused call after call (wire_staging_bytes).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "ops/float_formats.h"  // NumberFormat, the codes

struct Wire {
  bool fp32 = true;                          // the payload travels as it is
  NumberFormat format = NumberFormat::BF16;  // else: these codes (E4M3 and E5M2 saturate)
  float scale = 1;                           // codes of x * scale: a power of two
  static Wire in(NumberFormat format, float scale = 1);
  int64_t element_bytes() const { return fp32 ? 4 : format_bits(format) / 8; }
  std::string name() const;  // "fp32", "bf16", "e4m3 x 2^6"
};

// In place over buf (fp32). Reductions take bf16 or fp16 (an 8-bit sum would round every hop to 3 or
// 2 mantissa bits: no recipe reduces in fp8).
CommHandle wire_all_reduce_async(Communicator& comm, Tensor buf, ReduceOp op, const Wire& wire);
// send holds size()*n fp32 values; recv receives this rank's n, reduced.
CommHandle wire_reduce_scatter_async(Communicator& comm, Tensor send, Tensor recv, ReduceOp op, const Wire& wire);
// send holds n fp32 values (or IS this rank's chunk of recv); recv receives size()*n.
CommHandle wire_all_gather_async(Communicator& comm, Tensor send, Tensor recv, const Wire& wire);

// Blocking, as the communicator's blocking forms (fp32: exactly comm.all_reduce).
void wire_all_reduce(Communicator& comm, Tensor buf, ReduceOp op, const Wire& wire);

// Expert parallelism's exchange (Communicator::all_to_all_v_async, the same counts) in bf16 or fp16:
// every segment becomes codes, the rank's own included (where the group has more than one rank), so
// that the rows a rank's experts receive are in one format whichever rank routed them.
CommHandle wire_all_to_all_v_async(Communicator& comm, Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                   const std::vector<int64_t>& recv_counts, const Wire& wire);
void wire_all_to_all_v(Communicator& comm, Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                       const std::vector<int64_t>& recv_counts, const Wire& wire);

// A gather whose range holds tensors of different formats (ZeRO-3's layer: its product weights in
// the recipe's format, its layernorms and biases in fp32). Segment [begin, begin + count) of recv
// travels in `wire`; elements outside every segment travel in fp32. Rank r's chunk (recv.numel() / N
// elements, as wire_all_gather_async) becomes the bytes of its elements' codes, so chunks may differ
// in bytes: an all_gather_v of bytes, each rank sending its own chunk's bytes to each peer.
struct WireSegment {
  int64_t begin = 0, count = 0;
  Wire wire;
};
// keep_own: the rank's own chunk of recv is left as it is (ZeRO-1's and ZeRO-2's gather in place:
// that chunk is the rank's fp32 master, which its optimizer updates; the others' chunks arrive as
// their codes' values).
CommHandle wire_all_gather_segments_async(Communicator& comm, Tensor send, Tensor recv,
                                          const std::vector<WireSegment>& segments, bool keep_own = false);
// The bytes of elements [begin, begin + count) of such a range: what a rank's chunk weighs on the wire.
int64_t wire_bytes_of_range(const std::vector<WireSegment>& segments, int64_t begin, int64_t count);

// The bytes of comm's staging buffer, which its calls in a format stage their codes in, side by side:
// allocated in the first step (its largest burst of calls in flight at once), then reused, never
// grown again while the bursts repeat. Counted as communication buffers. 0 before any such call.
int64_t wire_staging_bytes(Communicator& comm);

// The formats the installed recipe's collectives take, by what they carry. fp32 everywhere by default.
// They belong to a communicator and every group split from it (Communicator::formats): a recipe set on
// the run's world holds for its whole grid.
struct CollectiveFormats {
  Wire gradients;    // data parallelism's gradient reductions; tensor parallelism's backward activation gradients
  Wire activations;  // tensor parallelism's forward activations
  Wire weights;      // ZeRO-3's gathered product weights (the rest of a layer travels in fp32)
  // fp8 weights: each weight's scale is its own, the power of two its amax over the gathering group
  // gives (as the products' per-tensor scale), set at each gather; else `weights.scale`.
  bool weight_scale_per_tensor = false;
};
const CollectiveFormats& collective_formats(const Communicator& comm);
void set_collective_formats(Communicator& comm, const CollectiveFormats& formats);
