// planner_kernel_rates.cpp: the published grouped-product measurements (planner_kernel_rates.h) and
// their lookup. Only numbers a publication prints are here; where a GPU has none of its own, its table
// borrows the nearest measured GPU's and says so (docs/planner.md, "Kernel rates").
#include "planner/planner_kernel_rates.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace {

// DeepGEMM's README (deepseek-ai/DeepGEMM, February 2025), measured on H800 SXM5 in FP8 with
// fine-grained scaling: "Grouped GEMMs for MoE models", the contiguous layout's rows (4 groups of 8,192
// rows, 8 of 4,096) and the masked layout's (1 group of 1,024, 2 of 512, 4 of 256); "Normal GEMMs for
// dense models", its M = 4,096 rows of the same (N, K) as the reference.
GroupedRateTable deepgemm_h800() {
  GroupedRateTable t;
  t.measured_on = "H800";
  t.source = "DeepGEMM README (deepseek-ai/DeepGEMM, Feb 2025), H800 FP8: grouped GEMMs (contiguous and masked "
             "layouts) against its normal GEMM at M 4096";
  t.grouped = {
      {256, 4096, 7168, 932},   {512, 4096, 7168, 1040},  {1024, 4096, 7168, 1233},
      {4096, 4096, 7168, 1288}, {8192, 4096, 7168, 1297}, {256, 7168, 2048, 815},
      {512, 7168, 2048, 916},   {1024, 7168, 2048, 925},  {4096, 7168, 2048, 1093},
      {8192, 7168, 2048, 1099},
  };
  t.dense = {{4096, 4096, 7168, 1304}, {4096, 7168, 2048, 1025}};
  t.row_alignment = 128;  // get_m_alignment_for_contiguous_layout() on SM90
  return t;
}

double log_distance(double n0, double k0, double n, double k) {
  return std::hypot(std::log(n / n0), std::log(k / k0));
}

}  // namespace

bool find_grouped_rate_table(const std::string& gpu, GroupedRateTable* out) {
  if (gpu != "A100" && gpu != "H100" && gpu != "H800" && gpu != "H200") return false;
  // The H100 and H200 are the H800's chip (the same SMs, clocks and tensor cores; the H800 cuts
  // NVLink, the H200 adds memory). No grouped product on A100 is published that we found: its row
  // borrows the H800's ratios (the nearest measured GPU), which docs/planner.md states.
  *out = deepgemm_h800();
  out->gpu = gpu;
  return true;
}

double interpolate_log(const std::vector<std::pair<double, double>>& points, double x) {
  if (points.empty()) return 0;
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  for (size_t i = 1; i < points.size(); i++) {
    const auto& a = points[i - 1];
    const auto& b = points[i];
    if (x > b.first) continue;
    const double w = std::log(x / a.first) / std::log(b.first / a.first);
    return std::exp(std::log(a.second) + w * (std::log(b.second) - std::log(a.second)));
  }
  return points.back().second;
}

double grouped_expert_factor(const GroupedRateTable& table, double rows, double n, double k) {
  if (table.dense.empty() || rows <= 0) return 1;
  // The nearest measured (n, k): its dense reference and its grouped points.
  const KernelPoint* reference = &table.dense.front();
  for (const KernelPoint& d : table.dense)
    if (log_distance(d.n, d.k, n, k) < log_distance(reference->n, reference->k, n, k)) reference = &d;
  std::vector<std::pair<double, double>> curve;
  for (const KernelPoint& g : table.grouped)
    if (g.n == reference->n && g.k == reference->k) curve.emplace_back(g.rows, g.tflops / reference->tflops);
  std::sort(curve.begin(), curve.end());
  const double padded = std::ceil(rows / table.row_alignment) * table.row_alignment;
  // At most the dense rate: the grouped points that pass it (7168 x 2048 at 4,096 rows and more) run
  // 8 to 32 times the reference's rows in one launch, while a model's dense products have as many rows
  // as the experts' together, or more.
  return std::min(1.0, interpolate_log(curve, rows)) * rows / padded;
}
