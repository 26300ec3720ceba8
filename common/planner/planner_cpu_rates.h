// planner_cpu_rates.h: two terms of a chapters' model on CPU ranks, whose rates `make plan-check`
// measures on calibration runs: the matrix products' rate by the rows of their activations (our
// product runs faster a FLOP on taller matrices: an expert's rows under expert parallelism), and the
// ring's hops as chapter 10's protocol overlaps them with the attention on a block (docs/theory.md,
// section 13, "Overlap, counted"). Defines ProductRates, parse_product_rates() and ring_exposed().
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// FLOP/s by class of rows: class b holds the products whose activations have N rows, 2^b <= N <
// 2^(b+1) (matmul_timing.h's matmul_row_class, which the step records' matmul_ms_rows<2^b> use).
struct ProductRates {
  std::vector<std::pair<int, double>> by_class;  // (b, FLOP/s), b increasing
  bool empty() const { return by_class.empty(); }
  // The rate of a product of `rows` rows: its class's; a class not measured takes the nearest one
  // measured (the lower on a tie). 0 when empty.
  double at(double rows) const;
};

// "512:6.1e10,128:5.3e10": rows (any count of the class) and FLOP/s, comma-separated. False, with
// *error naming what is wrong, for a malformed list, a count below 1, a rate not above 0 or a class
// given twice.
bool parse_product_rates(const std::string& text, ProductRates* out, std::string* error);

// The ring's time on a rank's critical path, per block (a layer) and micro-batch, beyond the
// attention it runs, as chapter 10's RingAttention overlaps them (ring_attention_protocol.h). A ring
// of cp ranks takes cp steps; `forward_step` and `backward_step` are one step's attention (seconds),
// `hop` one message of a block or an accumulator (the link's time and a synchronization).
//   forward: the block goes on while this rank computes with it: steps 0..cp-2 each expose
//            max(0, hop - forward_step).
//   backward: at step s the block goes on (s <= cp-2) and the accumulator sent at the end of step s-1
//            travels (s >= 2), both on the rank's one sending lane, while the step computes: each step
//            exposes max(0, n_s hop - backward_step); the last accumulator, sent when the last step
//            ends, meets no compute: one hop exposed.
struct RingExposure {
  double forward = 0, backward = 0;
};
RingExposure ring_exposed(int cp, double hop, double forward_step, double backward_step);
