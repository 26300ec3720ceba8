// planner_kernel_rates.cpp: the published kernel measurements (planner_kernel_rates.h) and their
// lookups: dense products, flash attention, grouped expert products. Only numbers a publication prints
// are here; where a GPU has none of its own, its table borrows the nearest measured GPU's and says so
// (docs/planner.md, "Kernel rates").
#include "planner/planner_kernel_rates.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

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

// DeepGEMM's "Normal GEMMs for dense models" at M = 4,096 (H800, FP8): for each depth K, its fastest
// row (K 512: N 32,768, 590 TFLOP/s; 1,536: N 24,576, 990; 2,048: N 7,168, 1,025; 7,168: N 4,096,
// 1,304; 16,384: N 7,168, 1,358), over the deepest's.
std::vector<std::pair<double, double>> deepgemm_depth_curve() {
  const double deepest = 1358;
  return {{512, 590 / deepest}, {1536, 990 / deepest}, {2048, 1025 / deepest}, {7168, 1304 / deepest}, {16384, 1.0}};
}

// FlashAttention-3's paper (Shah et al., arXiv 2407.08608), its figure of the forward pass's speed on
// H100 SXM5 in FP16/BF16, the TFLOP/s labelled on each bar, at sequence lengths 512 to 16K (the batch
// x sequence at 16K tokens, 2,048 channels of heads). Causal panels (head sizes 64 and 128: those where
// standard attention, masked, runs at 16-35 TFLOP/s; 256: the one panel transcribed, read as both) and
// unmasked ones (64 and 128: standard attention at 52-139 TFLOP/s).
AttentionRateTable flash_attention_h100(const std::string& kernel) {
  AttentionRateTable t;
  t.kernel = kernel, t.measured_on = "H100", t.peak_tflops = 989;
  t.source = "FlashAttention-3 (Shah et al., arXiv 2407.08608), the forward-speed figure on H100 SXM5, BF16, "
             "causal and unmasked panels, head dim 64/128/256, the bar labels";
  const double seq[] = {512, 1024, 2048, 4096, 8192, 16384};
  const double fa2[3][6] = {{180, 229, 262, 284, 295, 299}, {191, 260, 298, 319, 333, 335}, {208, 251, 278, 293, 297, 298}};
  const double cudnn[3][6] = {{225, 288, 334, 363, 379, 388}, {315, 410, 484, 518, 529, 539}, {308, 391, 450, 483, 497, 509}};
  const double fa3[3][6] = {{197, 265, 371, 420, 460, 473}, {292, 423, 521, 579, 602, 616}, {286, 427, 537, 612, 628, 642}};
  const double head_dims[] = {64, 128, 256};
  const double fa2_full[2][6] = {{282, 306, 318, 321, 322, 324}, {309, 350, 362, 368, 370, 370}};
  const double cudnn_full[2][6] = {{335, 373, 395, 408, 412, 413}, {497, 574, 617, 609, 600, 595}};
  const double fa3_full[2][6] = {{333, 392, 460, 476, 496, 497}, {467, 565, 625, 638, 646, 648}};
  const double(*rows)[6] = kernel == "fa2" ? fa2 : kernel == "fa3" ? fa3 : cudnn;
  const double(*full)[6] = kernel == "fa2" ? fa2_full : kernel == "fa3" ? fa3_full : cudnn_full;
  for (int h = 0; h < 3; h++)
    for (int i = 0; i < 6; i++) t.points.push_back({head_dims[h], seq[i], rows[h][i], true});
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 6; i++) t.points.push_back({head_dims[h], seq[i], full[h][i], false});
  // The same paper's backward-speed figure (H100 SXM5, BF16, head dim 64 and 128, no mask), the bar
  // labels, in TFLOP/s of the backward's count (2.5 x the forward's: five products to its two).
  const double fa2_backward[2][6] = {{198, 238, 264, 279, 287, 291}, {214, 260, 291, 310, 318, 322}};
  const double cudnn_backward[2][6] = {{266, 348, 395, 417, 432, 433}, {305, 408, 465, 499, 518, 516}};
  const double fa3_backward[2][6] = {{272, 363, 422, 453, 472, 474}, {316, 424, 501, 542, 559, 561}};
  const double(*backward)[6] = kernel == "fa2" ? fa2_backward : kernel == "fa3" ? fa3_backward : cudnn_backward;
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 6; i++) t.backward.push_back({head_dims[h], seq[i], backward[h][i], false});
  t.backward_source = "FlashAttention-3 (Shah et al., arXiv 2407.08608), the backward-speed figure on H100 SXM5, "
                      "BF16, head dim 64/128, no mask, the bar labels";
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

bool find_dense_rate_table(const std::string& gpu, DenseRateTable* out) {
  DenseRateTable t;
  t.gpu = gpu;
  // Stas Bekman's ml-engineering, compute/accelerator, "Maximum Achievable Matmul FLOPS comparison
  // table" (bf16 matmul, the best shape its finder met): A100 SXM 267.9 of 312 at 6912x16384x2048
  // (CUDA 12.1), H100 SXM 792.1 of 989 at 6144x17920x2816 (CUDA 12.1), GH200 SXM 821.0 of 989 at
  // 11264x19712x1536 (CUDA 12.5).
  t.ceiling_source = "ml-engineering (stas00), Maximum Achievable Matmul FLOPS table, bf16";
  t.depth_source = "DeepGEMM README (deepseek-ai/DeepGEMM, Feb 2025), normal GEMMs at M 4096, H800 FP8";
  if (gpu == "A100") {
    t.best = {6912, 16384, 2048, 267.9}, t.peak_tflops = 312;
  } else if (gpu == "H100" || gpu == "H800") {
    // The H800 is the H100's chip (NVLink cut): the H100's measurement.
    t.best = {6144, 17920, 2816, 792.1}, t.peak_tflops = 989;
  } else if (gpu == "H200") {
    // No H200 row; GH200's Hopper GPU is the nearest measured part.
    t.best = {11264, 19712, 1536, 821.0}, t.peak_tflops = 989;
  } else {
    return false;
  }
  t.depth = deepgemm_depth_curve();
  *out = t;
  return true;
}

double dense_product_efficiency(const DenseRateTable& table, double depth) {
  // The ceiling was met at its own depth: a product at least that deep reaches it; a shallower one
  // loses what DeepGEMM's rows lose between the two depths (bf16 publishes no such curve we found).
  const double at_best = interpolate_log(table.depth, table.best.k);
  return table.ceiling() * std::min(1.0, interpolate_log(table.depth, depth) / at_best);
}

const char* attention_kernel_names() { return "fa2, fa3, cudnn"; }

bool find_attention_rate_table(const std::string& gpu, const std::string& kernel, AttentionRateTable* out) {
  if (kernel != "fa2" && kernel != "fa3" && kernel != "cudnn") return false;
  // Only H100 measurements are published that we found; the H800 and H200 are its chip (the same SMs
  // and clocks). No per-shape A100 figures are transcribed here: an A100 has no table.
  if (gpu != "H100" && gpu != "H800" && gpu != "H200") return false;
  *out = flash_attention_h100(kernel);
  out->gpu = gpu;
  return true;
}

double attention_kernel_efficiency(const AttentionRateTable& table, double head_dim, double seq, bool causal) {
  std::map<double, std::vector<std::pair<double, double>>> by_head, other;
  for (const AttentionPoint& p : table.points)
    (p.causal == causal ? by_head : other)[p.head_dim].emplace_back(p.seq, p.tflops / table.peak_tflops);
  for (auto& [h, curve] : other)
    if (!by_head.count(h)) by_head[h] = curve;  // measured in the other panel only
  std::vector<std::pair<double, double>> across;  // (head size, share at seq)
  for (auto& [h, curve] : by_head) {
    std::sort(curve.begin(), curve.end());
    across.emplace_back(h, interpolate_log(curve, seq));
  }
  return interpolate_log(across, head_dim);
}

double attention_backward_factor(const AttentionRateTable& table, double head_dim, double seq) {
  if (table.backward.empty()) return 1;
  AttentionRateTable backward = table;
  backward.points = table.backward;
  const double hd = std::min(128.0, std::max(64.0, head_dim));
  return attention_kernel_efficiency(backward, hd, seq, false) / attention_kernel_efficiency(table, hd, seq, false);
}
