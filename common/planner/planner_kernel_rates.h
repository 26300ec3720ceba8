// planner_kernel_rates.h: the planner's kernel-rate tables, per GPU (A100, H100, H800, H200), from
// published measurements (docs/planner.md cites each): what a dense matrix product reaches by its
// shape (the best bf16 product's share of peak, and how the share falls with the contraction depth),
// what flash attention reaches by kernel, head size and sequence length, and what a grouped expert
// product (the routed experts' GEMMs, one per expert over the rows routed to it) reaches against a
// dense product of the same width, by rows per expert. Defines the measured points, the log-space
// interpolation that reads between them, and the lookups planner_shape.cpp prices each product with.
#pragma once
#include <string>
#include <utility>
#include <vector>

// One published measurement: a product of `rows` x n x k (rows: per expert for a grouped product) at
// `tflops`.
struct KernelPoint {
  double rows = 0, n = 0, k = 0, tflops = 0;
};

// The grouped expert products of one GPU: for each (n, k) measured, the grouped points by rows per
// expert and the dense product of the same (n, k) that they are taken relative to.
struct GroupedRateTable {
  std::string gpu;          // "H800"
  std::string measured_on;  // the GPU the points were measured on ("H800"; another where borrowed)
  std::string source;       // the publication and its table
  std::vector<KernelPoint> grouped, dense;
  // The rows a grouped kernel pads each expert's segment to (its M block): an expert with fewer rows
  // runs a whole block.
  double row_alignment = 128;
};

// The table of `gpu` ("A100", "H100", "H800", "H200"); false for another.
bool find_grouped_rate_table(const std::string& gpu, GroupedRateTable* out);

// y at x on the points (x, y) (sorted by x, positive), linear in log x and log y between the two
// around x, clamped to the first or last y outside them.
double interpolate_log(const std::vector<std::pair<double, double>>& points, double x);

// A grouped product of n x k per expert with `rows` rows each, as a fraction of the rate of the dense
// product of the same (n, k): the nearest measured (n, k) (in log distance), interpolated in log space
// over rows per expert between the measured points (clamped outside them), times the padding a
// segment shorter than the kernel's M block costs (rows / the rows rounded up to it). At most 1 before
// the padding: never faster than the dense product.
double grouped_expert_factor(const GroupedRateTable& table, double rows, double n, double k);

// Dense products of one GPU: the best bf16 product measured (its shape and TFLOP/s: the ceiling), and
// the fall of a product's rate with its contraction depth (the K of M x N x K: the inner loop over
// which a tile's fixed costs, its prologue, epilogue and the write of its output, are spread), as a
// fraction of the deepest measured product's rate.
struct DenseRateTable {
  std::string gpu, ceiling_source, depth_source;
  KernelPoint best;          // rows x n x k at tflops: the ceiling
  double peak_tflops = 0;    // the data sheet's dense bf16 peak the ceiling is a share of
  std::vector<std::pair<double, double>> depth;  // (K, rate / the deepest's rate), sorted by K
  double ceiling() const { return best.tflops / peak_tflops; }
};
// The table of `gpu` ("A100", "H100", "H800", "H200"); false for another.
bool find_dense_rate_table(const std::string& gpu, DenseRateTable* out);
// The share of peak a dense bf16 product of contraction depth `depth` reaches: the ceiling times the
// depth curve read in log space (clamped outside the measured depths).
double dense_product_efficiency(const DenseRateTable& table, double depth);

// Flash attention's forward rate on one GPU, by kernel ("fa2", "fa3", "cudnn"), head size and sequence
// length (the keys a query sees), in TFLOP/s of the kernel's own count.
struct AttentionPoint {
  double head_dim = 0, seq = 0, tflops = 0;
  bool causal = true;  // the causal mask's panel, or the unmasked one (every key for every query)
};
struct AttentionRateTable {
  std::string gpu, kernel, measured_on, source;
  double peak_tflops = 0;
  std::vector<AttentionPoint> points;
  // The backward's rate, where published: the FA3 paper's backward figure (unmasked, head sizes 64 and
  // 128), in TFLOP/s of the backward's own count (2.5 x the forward's FLOPs).
  std::vector<AttentionPoint> backward;
  std::string backward_source;
};
// The kernels a table exists for, "fa2, fa3, cudnn"; and the table of `kernel` on `gpu`, false where
// none is published for it.
const char* attention_kernel_names();
bool find_attention_rate_table(const std::string& gpu, const std::string& kernel, AttentionRateTable* out);
// The share of peak the kernel reaches at `head_dim` and `seq`, causal or unmasked: read over the
// sequence in log space at each measured head size, then between the two head sizes around `head_dim`
// in log space (clamped). A head size measured in one panel only reads that panel for both.
double attention_kernel_efficiency(const AttentionRateTable& table, double head_dim, double seq, bool causal = true);
// The backward's rate against the forward's at `head_dim` and `seq`: the published backward bars over
// the forward's unmasked ones, both read as above at the head size clamped to the measured 64..128
// (no causal backward panel is published: a causal backward is taken to lose what the unmasked one
// does). 1 where the table has no backward.
double attention_backward_factor(const AttentionRateTable& table, double head_dim, double seq);
