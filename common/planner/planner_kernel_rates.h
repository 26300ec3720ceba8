// planner_kernel_rates.h: the planner's kernel-rate table: what a grouped expert matrix product (the
// routed experts' GEMMs, one per expert over the rows routed to it) reaches against a dense product of
// the same width, by rows per expert, on each GPU (A100, H100, H800, H200). Defines the measured
// points (published, docs/planner.md cites each), the log-space interpolation that reads between them
// and grouped_expert_factor(), what planner_shape.cpp multiplies the dense products' rate by.
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
