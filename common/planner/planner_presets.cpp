// planner_presets.cpp: the planner's clusters (dgx-a100, dgx-h100, hgx-h800, emulated, namespaces) and
// the models it takes by name: the chapters' presets, GPT-2 XL, Megatron-LM's Table 1 (the chapters'
// architecture), and the published shapes of model_shape.h.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "ops/device.h"  // memory_per_rank: the namespaces cluster's memory, as its trainers compute it
#include "planner/planner.h"

namespace {
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
// MPI's shared memory between two ranks of this machine (namespaces_cluster; measured, see there).
constexpr double kNamespacesSharedMemoryGbps = 16, kNamespacesSharedMemoryLatencyUs = 5;
}  // namespace

bool find_cluster(const std::string& name, Cluster* out) {
  Cluster c;
  c.name = name;
  if (name == "dgx-a100") {
    // Selene's nodes (Narayanan et al. 2021): NVLink 3 at 300 GB/s a direction per GPU, 8 HDR
    // InfiniBand cards of 200 Gb/s per node, one per GPU.
    c.description = "DGX A100 80GB, NVLink in a node, InfiniBand between nodes";
    c.gpus_per_node = 8, c.memory_bytes = 80 * GiB, c.peak_flops = 312e12;
    c.intra_node = {2400, 5}, c.inter_node = {200, 10};
    c.memory_bandwidth = 2.039e12;  // A100 SXM4 80GB, HBM2e
    // `plan --megatron docs/data/megatron_table1.csv` recalibrates it.
    c.efficiency = 0.5949, c.efficiency_source = "Megatron-LM Table 1's 145.6B row, over the kernel-rate tables";
    c.gpu = "A100";
  } else if (name == "dgx-h100") {
    c.description = "DGX H100, NVLink in a node, InfiniBand between nodes";
    c.gpus_per_node = 8, c.memory_bytes = 80 * GiB, c.peak_flops = 989e12;
    c.intra_node = {3600, 5}, c.inter_node = {400, 10};
    c.memory_bandwidth = 3.35e12;  // H100 SXM5 80GB, HBM3
    // `plan --published` recalibrates it.
    c.efficiency = 0.6262, c.efficiency_source = "Megatron-Core H100's 177B row, over the kernel-rate tables";
    c.gpu = "H100";
  } else if (name == "hgx-h800") {
    // DeepSeek-V3's nodes (arXiv 2412.19437, section 3.2.2): the H100's compute with NVLink cut to what
    // the paper measures, 160 GB/s, and 50 GB/s of InfiniBand per GPU.
    c.description = "HGX H800, NVLink in a node, InfiniBand between nodes (DeepSeek-V3's cluster)";
    c.gpus_per_node = 8, c.memory_bytes = 80 * GiB, c.peak_flops = 989e12;
    c.intra_node = {1280, 5}, c.inter_node = {400, 10};
    c.memory_bandwidth = 3.35e12;
    // No H800 run publishes a throughput to calibrate on apart from DeepSeek-V3's, which is checked: the
    // H100's, the same chip.
    c.efficiency = 0.6262;
    c.efficiency_source = "Megatron-Core H100's 177B row, over the kernel-rate tables (the H800 is an H100's chip)";
    c.gpu = "H800";
  } else if (name == "emulated") {
    // This machine: CPU ranks in fp32 on the chapters' emulated link (bench-tp's "across nodes"
    // link; --inter-gbps/--inter-latency-us and --peak-flops change it). Its peak is not a data
    // sheet's: the calibration run measures what the math reaches, with efficiency 1.
    c.description = "this machine: CPU ranks on the emulated link, one rank a node";
    c.gpus_per_node = 1, c.memory_bytes = 16 * GiB, c.peak_flops = 1e10;
    c.intra_node = {0.5, 50}, c.inter_node = {0.5, 50};
    c.elementwise_rate = 0.6e9;  // (make plan-check calibrates it)
    c.dtype = DType::F32, c.device = Device::CPU;
  } else if (name == "namespaces") {
    c = namespaces_cluster(2);
  } else {
    return false;
  }
  *out = c;
  return true;
}

Cluster namespaces_cluster(int ranks_per_node) {
  Cluster c;
  c.name = "namespaces";
  ranks_per_node = std::max(1, ranks_per_node);
  // docs/cluster.md: network namespaces of this machine as nodes (make cluster-up), ranks_per_node
  // CPU ranks in each (the hostfile's SLOTS, 2 by default). Memory is what each trainer's check
  // allows itself: the machine's memory (or the container's limit) over the ranks of its node.
  c.description = "this machine's network namespaces as nodes: CPU ranks, MPI's shared memory in a node, the "
                  "tbf-shaped veth link between nodes";
  c.gpus_per_node = ranks_per_node;
  c.memory_bytes = memory_per_rank(Device::CPU, ranks_per_node);
  // Inside a node MPICH's shared memory carries the messages (UCX only between nodes). The rate is
  // measured, not a data sheet's: 00_collectives --communicator, 2 ranks on one host without a link model, our
  // all-reduce's busbw from 1 to 16 MiB was 1.7 to 2.8 GB/s on this loaded machine (2 GB/s taken),
  // and its 16 KiB all-reduce, two messages, 11 us (docs/planner.md). --intra-gbps and
  // --intra-latency-us replace it.
  c.intra_node = {kNamespacesSharedMemoryGbps, kNamespacesSharedMemoryLatencyUs};
  // Between nodes: the tbf rate of `make cluster-up GBPS=...` (1 Gbit/s by default; pass the one the
  // cluster has with --inter-gbps). No netem here, so the latency is the kernel's own TCP path,
  // tens of microseconds.
  c.inter_node = {1.0, 50};
  // CPU compute as on `emulated`: a placeholder peak and elementwise rate, replaced by a calibration
  // run's (--peak-flops with --efficiency 1, --elementwise-rate; scripts/cluster/cluster_lessons.sh does it).
  c.peak_flops = 1e10;
  c.elementwise_rate = 0.6e9;
  c.dtype = DType::F32, c.device = Device::CPU;
  return c;
}

const char* cluster_names() { return "dgx-a100, dgx-h100, hgx-h800, emulated, namespaces"; }

std::string describe_cluster(const Cluster& c) {
  auto link = [](const LinkModel& l) {
    std::ostringstream text;
    text << l.gbps << " Gb/s " << l.latency_us << " us";
    return text.str();
  };
  std::ostringstream text;
  text << c.description << ": " << c.gpus_per_node << " GPU" << (c.gpus_per_node > 1 ? "s" : "") << " a node, "
       << c.peak_flops / 1e12 << " TFLOP/s " << dtype_name(c.dtype) << " each, links per GPU " << link(c.intra_node)
       << " in a node, " << link(c.inter_node) << " between nodes";
  return text.str();
}

namespace {
struct NamedModel {
  const char* name;
  int L, C, NH, T, V;
  const char* note;
};
// Megatron-LM's Table 1 (Narayanan et al. 2021, arXiv 2104.04473): vocabulary 51,200, sequence 2,048.
const NamedModel kModels[] = {
    {"gpt2-xl", 48, 1600, 25, 1024, 50304, "GPT-2 XL (1.5B; vocabulary padded to a multiple of 128)"},
    {"megatron-1.7b", 24, 2304, 24, 2048, 51200, "Megatron-LM Table 1, 1.7B"},
    {"megatron-3.6b", 30, 3072, 32, 2048, 51200, "Megatron-LM Table 1, 3.6B"},
    {"megatron-7.5b", 36, 4096, 32, 2048, 51200, "Megatron-LM Table 1, 7.5B"},
    {"megatron-18b", 40, 6144, 48, 2048, 51200, "Megatron-LM Table 1, 18.4B"},
    {"megatron-39b", 48, 8192, 64, 2048, 51200, "Megatron-LM Table 1, 39.1B"},
    {"megatron-76b", 60, 10240, 80, 2048, 51200, "Megatron-LM Table 1, 76.1B"},
    {"megatron-146b", 80, 12288, 96, 2048, 51200, "Megatron-LM Table 1, 145.6B"},
    {"megatron-310b", 96, 16384, 128, 2048, 51200, "Megatron-LM Table 1, 310.1B"},
    {"megatron-530b", 105, 20480, 128, 2048, 51200, "Megatron-LM Table 1, 529.6B"},
    {"megatron-1t", 128, 25600, 160, 2048, 51200, "Megatron-LM Table 1, 1008B"},
};
}  // namespace

bool find_plan_model(const std::string& name, GPT2Config* out, std::string* note) {
  if (find_preset(name, out)) {
    if (note) *note = "preset " + name;
    return true;
  }
  for (const NamedModel& m : kModels) {
    if (name != m.name) continue;
    GPT2Config c;
    c.preset = m.name;
    c.L = m.L, c.C = m.C, c.NH = m.NH, c.T = m.T, c.V = m.V;
    c.default_batch = 512;
    *out = c;
    if (note) *note = m.note;
    return true;
  }
  return false;
}

std::string plan_model_names() {
  std::string names = preset_names();
  for (const NamedModel& m : kModels) names += std::string(", ") + m.name;
  return names + ", " + model_shape_names();
}

bool set_plan_model(const std::string& name, PlanInputs* in, std::string* note) {
  GPT2Config chapters;
  if (find_plan_model(name, &chapters, note)) {
    in->model = chapters, in->shape = shape_of(chapters), in->chapters_model = true;
    return true;
  }
  ModelShape shape;
  if (!find_model_shape(name, &shape)) return false;
  in->shape = shape, in->chapters_model = false;
  in->model = GPT2Config{};
  in->model.preset = name, in->model.L = shape.L, in->model.C = shape.C, in->model.NH = shape.NH;
  in->model.T = shape.T, in->model.V = shape.V, in->model.default_batch = shape.default_batch;
  if (note) *note = shape.note;
  return true;
}

ModelShape plan_shape(const PlanInputs& in) { return in.chapters_model ? shape_of(in.model) : in.shape; }

void set_sequence_length(PlanInputs* in, int T) { in->model.T = T, in->shape.T = T; }

GPT2Config gpt_like_model(double params) {
  // Megatron-LM's proportions: head size 128, about 100 x C/L (L from 24 at 2B to 128 at 1T).
  GPT2Config best;
  double best_error = 1e300;
  for (int NH = 8; NH <= 256; NH += 8) {
    const int C = 128 * NH;
    const int L = std::max(8, int(std::lround((params - 51200.0 * C) / (12.0 * C * C))));
    const double error = std::fabs(std::log(double(L) * 12 * C * C + 51200.0 * C) - std::log(params)) +
                         0.3 * std::fabs(std::log(double(C) / L / 100.0));  // keep the shape Megatron-like
    if (error < best_error) {
      best_error = error;
      best.L = L, best.C = C, best.NH = NH;
    }
  }
  best.T = 2048, best.V = 51200, best.preset = "custom", best.default_batch = 512;
  return best;
}
