// planner.cpp: the clusters, models, cost model and search of planner.h. Each number comes from a
// function the trainers use or print (theory.h, pipeline.h, pipeline_schedule.h, comm.h); what is
// added here is only which link each group travels on and what overlaps what (docs/planner.md).
#include "planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "device.h"   // memory_per_rank: the namespaces cluster's memory, as its trainers compute it
#include "metrics.h"  // format_bytes
#include "param_layout.h"
#include "pipeline.h"  // unit_costs, balanced_partition, parts_of_rank

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
// MPI's shared memory between two ranks of this machine (namespaces_cluster; measured, see there).
constexpr double kNamespacesSharedMemoryGbps = 16, kNamespacesSharedMemoryLatencyUs = 5;

Strategy strategy_of(int zero) {
  return zero == 0 ? Strategy::DP : zero == 1 ? Strategy::ZeRO1 : zero == 2 ? Strategy::ZeRO2 : Strategy::ZeRO3;
}

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// The process grid of chapters 07-09: TP innermost, then DP, PP outermost. A group stays inside a
// node when the ranks it spans fit in one: TP spans t, DP t x d, PP the whole t x d x p.
const LinkModel& link_for(const Cluster& cluster, int span) {
  return span <= cluster.gpus_per_node ? cluster.intra_node : cluster.inter_node;
}

// Seconds that the collectives of `tp` (one micro-batch, or the per-step gradient all-reduces) take
// on the tensor-parallel group's link, each by the communicator's own alpha-beta model.
double tensor_parallel_seconds(const TensorParallelPrediction& tp, const LinkModel& link, double activation_bytes,
                               double rows_bytes, int t) {
  const double ms = tp.all_reduces * modelled_ms(link, CollectiveKind::AllReduce, int64_t(activation_bytes), t) +
                    tp.all_gathers * modelled_ms(link, CollectiveKind::AllGather, int64_t(activation_bytes), t) +
                    tp.reduce_scatters * modelled_ms(link, CollectiveKind::ReduceScatter, int64_t(activation_bytes), t) +
                    tp.loss_all_reduces * modelled_ms(link, CollectiveKind::AllReduce, int64_t(rows_bytes), t);
  return ms / 1e3;
}

// Layouts are the costliest thing to build (a list of every tensor); a search asks for the same few
// again and again.
const ParamLayout& cached_layout(const GPT2Config& cfg, int dp, int tp, const std::vector<ModelPart>& parts) {
  static std::map<std::string, ParamLayout> cache;
  std::ostringstream key;
  key << cfg.L << ' ' << cfg.C << ' ' << cfg.NH << ' ' << cfg.T << ' ' << cfg.V << ' ' << cfg.experts << ' '
      << cfg.top_k << ' ' << dp << ' ' << tp;
  for (const ModelPart& part : parts) key << ' ' << part.first_unit << ':' << part.last(cfg);
  auto it = cache.find(key.str());
  if (it != cache.end()) return it->second;
  if (cache.size() > 4096) cache.clear();
  return cache.emplace(key.str(), build_gpt2_layout(cfg, dp, TensorParallelism{tp, 0, false}, parts)).first->second;
}

const std::vector<int>& cached_partition(const GPT2Config& cfg, int virtual_stages) {
  static std::map<std::string, std::vector<int>> cache;
  std::ostringstream key;
  key << cfg.L << ' ' << cfg.C << ' ' << cfg.T << ' ' << cfg.V << ' ' << cfg.experts << ' ' << cfg.top_k << ' '
      << virtual_stages;
  auto it = cache.find(key.str());
  if (it != cache.end()) return it->second;
  return cache.emplace(key.str(), balanced_partition(cfg, virtual_stages)).first->second;
}

bool flash_applies(const PlanInputs& in) {
  const int head = in.model.C / in.model.NH;
  return in.flash_attention && in.cluster.device == Device::CUDA && in.cluster.dtype == DType::BF16 &&
         (head == 16 || head == 32 || head == 64 || head == 128);
}

std::string invalid_reason(const PlanInputs& in, const PlanConfig& c) {
  const GPT2Config& m = in.model;
  const std::string model_problem = plan_model_problem(m);
  if (!model_problem.empty()) return model_problem;
  if (c.gpus() != in.gpus) return "dp x tp x pp = " + std::to_string(c.gpus()) + ", not the " + std::to_string(in.gpus) + " GPUs";
  if (long(c.dp) * c.micro_batch * c.micro_batches != in.batch)
    return "dp x B x m = " + std::to_string(long(c.dp) * c.micro_batch * c.micro_batches) + ", not the batch " +
           std::to_string(in.batch);
  const std::string tp_problem =
      tensor_parallel_size_problem(m, TensorParallelism{c.tp, 0, c.sequence_parallel}, c.micro_batch);
  if (!tp_problem.empty()) return tp_problem;
  if (c.sequence_parallel && c.tp == 1) return "sequence parallelism needs tp > 1";
  if (c.zero < 0 || c.zero > 3) return "ZeRO stage " + std::to_string(c.zero) + " (0..3)";
  if (c.zero > 0 && c.dp == 1) return "ZeRO shards over the data-parallel group: dp = 1";
  if (c.pp > 1 && c.zero > 1) return "ZeRO-2/3 communicate every micro-batch: not with a pipeline (use ZeRO-1)";
  if (c.pp * c.virtual_stages > m.L) return "more virtual stages than blocks";
  if (c.pp > 1 && c.schedule == Schedule::ZBH1 && c.recompute == Recompute::Full)
    return "full recomputation keeps no product's input for zb-h1's later weight pass";
  if (c.pp > 1) {
    const std::string shape_error =
        schedule_shape_error(c.schedule, PipelineShape{c.pp, c.micro_batches, c.virtual_stages});
    if (!shape_error.empty()) return shape_error;
  } else if (c.virtual_stages != 1) {
    return "virtual stages need a pipeline";
  }
  return "";
}

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
  } else if (name == "dgx-h100") {
    c.description = "DGX H100, NVLink in a node, InfiniBand between nodes";
    c.gpus_per_node = 8, c.memory_bytes = 80 * GiB, c.peak_flops = 989e12;
    c.intra_node = {3600, 5}, c.inter_node = {400, 10};
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
  // measured, not a data sheet's: build/comm_bench, 2 ranks on one host without a link model, our
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

const char* cluster_names() { return "dgx-a100, dgx-h100, emulated, namespaces"; }

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
    {"llama-70b-like", 80, 8192, 64, 4096, 32000,
     "Llama 2 70B's L, C, NH, T and V in GPT-2's architecture (GELU MLP of 4C, learned positions, no "
     "grouped-query attention): 65B parameters, not 70B"},
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
  return names;
}

std::string plan_model_problem(const GPT2Config& model) {
  if (!model.moe()) return "";
  return "--model " + model.preset + " is a mixture of experts: the planner predicts dense models on DP x TP x PP "
         "grids only (chapter 11 trains this one, with expert parallelism)";
}

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

std::string PlanConfig::describe() const {
  std::ostringstream s;
  s << "dp " << dp << " tp " << tp << " pp " << pp;
  if (pp > 1) s << ' ' << schedule_name(schedule) << (virtual_stages > 1 ? " v " + std::to_string(virtual_stages) : "");
  s << " B " << micro_batch << " m " << micro_batches;
  if (zero > 0) s << " ZeRO-" << zero;
  if (recompute != Recompute::None) s << " recompute " << recompute_name(recompute);
  if (sequence_parallel) s << " SP";
  return s.str();
}

namespace {
// A pipeline rank's model parts, as 08 builds them: the balanced partition of blocks, the schedule's
// activation slots per chunk; none (the whole model) without a pipeline.
std::vector<ModelPart> stage_parts(const GPT2Config& cfg, const PlanConfig& c, int rank) {
  std::vector<ModelPart> parts;
  if (c.pp == 1) return parts;
  const PipelineShape shape{c.pp, c.micro_batches, c.virtual_stages};
  parts = parts_of_rank(cfg, cached_partition(cfg, c.pp * c.virtual_stages), c.pp, rank);
  for (int ch = 0; ch < c.virtual_stages; ch++) {
    parts[ch].slots = theory_in_flight(c.schedule, shape, rank, ch);
    parts[ch].split_backward = c.schedule == Schedule::ZBH1;
  }
  return parts;
}
}  // namespace

std::string not_runnable_here(const PlanConfig& c) {
  if (c.zero >= 2 && (c.tp > 1 || c.pp > 1))
    return "ZeRO-" + std::to_string(c.zero) + " runs in 0" + std::to_string(c.zero + 3) + " only, without TP or a pipeline";
  return "";
}

StageMemory stage_memory(const PlanInputs& in, const PlanConfig& c, int stage) {
  GPT2Config cfg = in.model;
  cfg.recompute = c.recompute;
  const bool flash = flash_applies(in);
  cfg.flash_attention = flash;
  const std::vector<ModelPart> parts = stage_parts(cfg, c, stage);
  const ParamLayout& layout = cached_layout(cfg, c.dp, c.tp, parts);
  const Strategy strategy = strategy_of(c.zero);
  const TensorParallelism tp{c.tp, 0, c.sequence_parallel};
  StageMemory sm;
  sm.memory = forecast_memory(strategy, layout, cfg, c.micro_batch, c.micro_batches, in.cluster.dtype, in.cluster.device,
                              flash, false, in.data_bytes, tp, PipelineParallelism{c.pp, stage, parts, false, {}});
  const Prediction pr = predict(strategy, layout, c.micro_batches, in.cluster.dtype);
  const double padding = double(layout.padded_size) / double(layout.num_params);
  sm.params_bytes = pr.params_bytes * padding, sm.grads_bytes = pr.grads_bytes * padding;
  sm.optim_bytes = pr.optim_bytes * padding;
  return sm;
}

PlanResult evaluate_plan(const PlanInputs& in, const PlanConfig& c, bool simulate_pipeline) {
  PlanResult r;
  r.config = c;
  r.invalid = invalid_reason(in, c);
  if (!r.invalid.empty()) return r;
  const Cluster& k = in.cluster;
  GPT2Config cfg = in.model;
  cfg.recompute = c.recompute;
  cfg.flash_attention = flash_applies(in);
  const DType dtype = k.dtype;
  const double w = double(dtype_size(dtype));
  const TensorParallelism tp{c.tp, 0, c.sequence_parallel};
  const int p = c.pp, v = c.virtual_stages, m = c.micro_batches, B = c.micro_batch;
  const PipelineShape shape{p, m, v};
  const std::vector<int>* blocks = p > 1 ? &cached_partition(cfg, p * v) : nullptr;
  auto parts_of = [&](int rank) { return stage_parts(cfg, c, rank); };

  // Memory: forecast_memory() of every rank; for the estimate, the first, the second, the last and
  // the one with the most blocks stand for all of them (slots fall from the first rank on, the head's
  // logits sit on the last).
  std::vector<int> ranks;
  if (p == 1) {
    ranks = {0};
  } else if (simulate_pipeline) {
    for (int rank = 0; rank < p; rank++) ranks.push_back(rank);
  } else {
    ranks = {0, p - 1};
    if (p > 2) ranks.push_back(1);
    int most = 0, most_blocks = -1;
    for (int rank = 0; rank < p; rank++) {
      int b = 0;
      for (int ch = 0; ch < v; ch++) b += (*blocks)[ch * p + rank];
      if (b > most_blocks) most = rank, most_blocks = b;
    }
    if (std::find(ranks.begin(), ranks.end(), most) == ranks.end()) ranks.push_back(most);
  }
  double worst_peak = -1;
  std::vector<ModelPart> worst_parts;
  for (int rank : ranks) {
    const StageMemory sm = stage_memory(in, c, rank);
    if (sm.memory.peak() <= worst_peak) continue;
    worst_peak = sm.memory.peak();
    r.stage = rank, r.memory = sm.memory, worst_parts = parts_of(rank);
    r.params_bytes = sm.params_bytes, r.grads_bytes = sm.grads_bytes, r.optim_bytes = sm.optim_bytes;
  }
  r.fits = r.memory.peak() <= k.memory_bytes;
  if (!r.fits) {
    std::ostringstream s;
    s << "needs " << format_bytes(r.memory.peak()) << " of " << format_bytes(k.memory_bytes) << " (stage " << r.stage
      << ": model state " << format_bytes(r.memory.model_state) << ", activations " << format_bytes(r.memory.activations)
      << ", buffers " << format_bytes(std::max(r.memory.transient, r.memory.checkpoint)) << ")";
    if (r.memory.model_state > k.memory_bytes) s << ": the model state alone overflows";
    r.overflow = s.str();
  }

  // Time. Per micro-batch and virtual stage: its forward FLOPs (unit_costs, cut by TP), backward
  // twice that, recomputation's extra forward; on the dense math's `efficiency` x peak. TP's
  // collectives sit on the critical path of every pass (split between forward and backward as the
  // compute is). Under zb-h1 the backward's two halves (input, weights) take a forward each.
  // With an elementwise rate (a CPU cluster): the matrix products' FLOPs only at that rate, and the
  // rest of the work (attention, its products with it, which the CPU runs fused with the softmax)
  // as the activation bytes the pass writes, as if nothing were recomputed, at the elementwise rate:
  // a third in the forward, two in the backward; recomputation adds the bytes it does not keep.
  const double rate = k.peak_flops * in.efficiency;
  const bool elementwise_apart = k.elementwise_rate > 0;
  GPT2Config kept_all = cfg;
  kept_all.recompute = Recompute::None;
  const std::vector<double> unit_cost = unit_costs(cfg);
  const LinkModel& tp_link = link_for(k, c.tp);
  const LinkModel& dp_link = link_for(k, c.tp * c.dp);
  const LinkModel& pp_link = link_for(k, c.gpus());
  const double tokens = double(B) * cfg.T;
  const double stream_bytes = tokens * cfg.C * w;
  ActionCosts costs;
  double slowest_compute = 0, slowest_tp = 0;  // per micro-batch, summed over a rank's chunks
  std::vector<double> rank_compute(p, 0), rank_tp(p, 0);
  // The simulator needs every virtual stage's costs; the estimate only the slowest rank's, which is
  // one of those whose memory was forecast (the most blocks, or the head's): the same ranks.
  const std::vector<int>& timed = ranks;
  for (int rank : timed) {
    const std::vector<ModelPart> parts = p == 1 ? std::vector<ModelPart>{ModelPart{}} : parts_of(rank);
    for (size_t ch = 0; ch < parts.size(); ch++) {
      const ModelPart& part = parts[ch];
      double forward_flops = 0, recompute_flops = recompute_flops_per_token(cfg, tp, part);
      for (int u = part.first_unit; u <= part.last(cfg); u++) forward_flops += unit_cost[u];
      double elementwise = 0, recompute_elementwise = 0;  // seconds per micro-batch
      if (elementwise_apart) {
        const int blocks = std::min(part.last(cfg), cfg.L) - (std::max(part.first_unit, 1) - 1);
        forward_flops -= blocks * attention_flops_per_token(cfg);
        if (cfg.recompute != Recompute::None) recompute_flops -= blocks * attention_flops_per_token(cfg) / c.tp;
        ModelPart one = part;
        one.slots = 1;
        const double bytes = activation_bytes(kept_all, B, dtype, cfg.flash_attention, tp, one);
        elementwise = bytes / k.elementwise_rate;
        recompute_elementwise =
            (bytes - activation_bytes(cfg, B, dtype, cfg.flash_attention, tp, one)) / k.elementwise_rate / 3;
      }
      const double forward = tokens * forward_flops / c.tp / rate + elementwise / 3;
      const double recompute = tokens * recompute_flops / rate + recompute_elementwise;
      const TensorParallelPrediction tpp =
          predict_tensor_parallel(cfg, B, tp, dtype, p == 1 ? std::vector<ModelPart>{} : std::vector<ModelPart>{part});
      const double tp_time = tensor_parallel_seconds(tpp, tp_link, stream_bytes, tokens * 4, c.tp);
      const double work = 3 * forward + recompute;
      const double f = forward + tp_time * forward / work, b = 2 * forward + recompute + tp_time * (work - forward) / work;
      if (p > 1) {
        const int s = virtual_stage(shape, rank, int(ch));
        if (costs.forward.empty()) costs.forward.assign(p * v, 0), costs.backward.assign(p * v, 0), costs.weight.assign(p * v, 0);
        if (c.schedule == Schedule::ZBH1) {
          costs.forward[s] = f, costs.backward[s] = b - forward * (1 + tp_time / work), costs.weight[s] = forward * (1 + tp_time / work);
        } else {
          costs.forward[s] = f, costs.backward[s] = b;
        }
      }
      rank_compute[rank] += work, rank_tp[rank] += tp_time;
    }
    if (rank_compute[rank] + rank_tp[rank] > slowest_compute + slowest_tp)
      slowest_compute = rank_compute[rank], slowest_tp = rank_tp[rank];
  }
  r.compute_s = m * slowest_compute;
  r.tp_s = m * slowest_tp;
  // Under sequence parallelism the gradients of the parameters every TP rank holds whole are summed
  // once a step.
  if (c.sequence_parallel) {
    const TensorParallelPrediction tpp = predict_tensor_parallel(cfg, B, tp, dtype, worst_parts);
    const double payload = tpp.partial_grad_bytes * c.tp / (2.0 * (c.tp - 1));  // bytes sent -> payload
    r.tp_s += (modelled_ms(tp_link, CollectiveKind::AllReduce, int64_t(payload), c.tp) +
               (tpp.partial_grad_all_reduces - 1) * modelled_ms(tp_link, CollectiveKind::AllReduce, 0, c.tp)) / 1e3;
  }
  const double busy = r.compute_s + r.tp_s;
  double pipeline_s = busy;
  if (p > 1) {
    // One micro-batch's stream between stages: under sequence parallelism a TP rank's rows only (09).
    const double message = stream_bytes / (c.sequence_parallel ? c.tp : 1);
    costs.p2p = modelled_ms(pp_link, CollectiveKind::SendRecv, int64_t(message), 2) / 1e3;
    double without_p2p = 0;
    if (simulate_pipeline) {
      pipeline_s = simulate(c.schedule, shape, costs).makespan;
      ActionCosts free_links = costs;
      free_links.p2p = 0;
      without_p2p = simulate(c.schedule, shape, free_links).makespan;
      r.simulated = true;
    } else {
      // The slowest stage's F, B, W in theory_bubble's formula, plus the p2p hops of the fill and drain.
      const double per_micro = busy / m;
      const double f = per_micro / 3, bubble = theory_bubble(c.schedule, shape, f, c.schedule == Schedule::ZBH1 ? f : 2 * f, c.schedule == Schedule::ZBH1 ? f : 0);
      without_p2p = busy / (1 - bubble);
      pipeline_s = without_p2p + 2 * (p - 1) * costs.p2p;
    }
    // What the messages between stages add to the step: the pipeline group's exposed communication.
    r.pp_s = std::max(0.0, pipeline_s - without_p2p);
  }
  r.bubble_s = std::max(0.0, pipeline_s - busy - r.pp_s);

  // Data parallelism over this stage's DP group: the bytes of predict() on the worst stage's layout,
  // at the link's bandwidth, plus each collective's latency (one per unit of the layout). What
  // overlaps: DP and ZeRO-1's gradients go out during the last micro-batch's backward (buckets, 03);
  // ZeRO-2's reduce-scatters during every backward; ZeRO-3's gathers and reduce-scatters during every
  // forward and backward; ZeRO-1's all-gather of the updated parameters is exposed.
  if (c.dp > 1) {
    const ParamLayout& layout = cached_layout(cfg, c.dp, c.tp, worst_parts);
    const double shard_all = w * double(layout.padded_size);
    const int collectives = layout.num_units();
    auto ring = [&](CollectiveKind kind) {
      return (modelled_ms(dp_link, kind, int64_t(shard_all), c.dp) +
              (collectives - 1) * modelled_ms(dp_link, kind, 0, c.dp)) / 1e3;
    };
    const double hidden = in.dp_overlap ? 1 : 0;
    const double last_backward = hidden * (slowest_compute + slowest_tp) * 2 / 3;
    const double per_micro = hidden * (slowest_compute + slowest_tp);
    switch (c.zero) {
      case 0: r.dp_s = std::max(0.0, ring(CollectiveKind::AllReduce) - last_backward); break;
      case 1:
        r.dp_s = std::max(0.0, ring(CollectiveKind::ReduceScatter) - last_backward) + ring(CollectiveKind::AllGather);
        break;
      case 2:
        r.dp_s = m * std::max(0.0, ring(CollectiveKind::ReduceScatter) - 2 * per_micro / 3) + ring(CollectiveKind::AllGather);
        break;
      case 3:
        r.dp_s = m * std::max(0.0, 2 * ring(CollectiveKind::AllGather) + ring(CollectiveKind::ReduceScatter) - per_micro);
        break;
    }
  }
  // The tied wte's two copies (first and last stage) summed once a step, on the pipeline's link.
  if (p > 1)
    r.embedding_s = modelled_ms(pp_link, CollectiveKind::AllReduce, int64_t(w * double(cfg.V) / c.tp * cfg.C), 2) / 1e3;
  r.step_s = pipeline_s + r.dp_s + r.embedding_s;

  const double step_tokens = double(in.batch) * cfg.T;
  r.tokens_per_s = step_tokens / r.step_s;
  const ParamLayout& whole = cached_layout(in.model, 1, 1, {});
  const double model_flops = 6.0 * double(flops_params(whole)) + 12.0 * cfg.L * cfg.C * cfg.T;
  r.mfu = r.tokens_per_s * model_flops / (double(in.gpus) * k.peak_flops);
  // Counting recomputation's FLOPs too (per token, over the whole model): what the GPUs computed.
  r.flops_per_gpu = r.tokens_per_s * (model_flops + recompute_flops_per_token(cfg, TensorParallelism{}, ModelPart{})) / in.gpus;
  return r;
}

namespace {
std::vector<int> powers_of_two_dividing(int n, int at_most) {
  std::vector<int> out;
  for (int x = 1; x <= at_most; x *= 2)
    if (n % x == 0) out.push_back(x);
  return out;
}

// Among configurations equally fast (within 0.1%: ZeRO's traffic hidden behind the compute, say),
// the simpler: less sharding, less recomputation, no sequence parallelism, fewer model-parallel ranks.
bool faster(const PlanResult& a, const PlanResult& b) {
  if (std::fabs(a.step_s - b.step_s) > 1e-3 * std::max(a.step_s, b.step_s)) return a.step_s < b.step_s;
  const PlanConfig &x = a.config, &y = b.config;
  if (x.zero != y.zero) return x.zero < y.zero;
  if (x.recompute != y.recompute) return int(x.recompute) < int(y.recompute);
  if (x.sequence_parallel != y.sequence_parallel) return !x.sequence_parallel;
  if (x.tp * x.pp != y.tp * y.pp) return x.tp * x.pp < y.tp * y.pp;
  return a.step_s < b.step_s;
}

bool better(const PlanResult& a, const PlanResult& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.fits) return faster(a, b);
  return a.memory.peak() < b.memory.peak();
}
}  // namespace

std::vector<PlanResult> search_plans(const PlanInputs& in, const SearchSpace& space, int simulate_top) {
  const GPT2Config& m = in.model;
  std::vector<int> tps = space.tp.empty() ? powers_of_two_dividing(in.gpus, 64) : space.tp;
  std::vector<int> pps = space.pp;
  if (pps.empty())
    for (int p = 1; p <= m.L; p++)
      if (in.gpus % p == 0 && (is_power_of_two(p) || m.L % p == 0)) pps.push_back(p);
  std::vector<PlanResult> results;
  for (int t : tps) {
    for (int p : pps) {
      if (in.gpus % (t * p)) continue;
      const int dp = in.gpus / (t * p);
      if (in.batch % dp) continue;
      for (bool sp : space.sequence_parallel) {
        if (sp && t == 1) continue;
        std::vector<std::pair<Schedule, int>> schedules;
        if (p == 1) {
          schedules.push_back({Schedule::OneFOneB, 1});
        } else {
          for (Schedule s : space.schedules) {
            if (s != Schedule::Interleaved) schedules.push_back({s, 1});
            else
              for (int v : space.virtual_stages) schedules.push_back({s, v});
          }
        }
        for (auto [schedule, v] : schedules) {
          for (int zero : space.zero) {
            for (Recompute rc : space.recompute) {
              PlanResult overflowing;
              bool any = false, overflow_kept = false;
              for (int B : space.micro_batch) {
                if ((in.batch / dp) % B) continue;
                PlanConfig c{dp, t, p, schedule, v, B, in.batch / dp / B, zero, rc, sp};
                if (space.runnable_here_only && !not_runnable_here(c).empty()) continue;
                PlanResult r = evaluate_plan(in, c, false);
                if (!r.invalid.empty()) continue;
                if (!space.require_fit) {
                  results.push_back(r);
                  continue;
                }
                if (!r.fits) {  // a larger micro-batch needs more still
                  if (!any && !overflow_kept) overflowing = r, overflow_kept = true;
                  break;
                }
                any = true;
                results.push_back(r);
              }
              if (!any && overflow_kept) results.push_back(overflowing);
            }
          }
        }
      }
    }
  }
  auto order = [&](const PlanResult& a, const PlanResult& b) {
    return space.require_fit ? better(a, b) : faster(a, b);
  };
  std::sort(results.begin(), results.end(), order);
  // The best by the estimate, simulated; then the order by the simulation.
  const int n = std::min(int(results.size()), simulate_top);
  for (int i = 0; i < n; i++)
    if (results[i].fits || !space.require_fit) results[i] = evaluate_plan(in, results[i].config, true);
  std::stable_sort(results.begin(), results.end(), order);
  return results;
}

std::vector<PlanResult> best_per_grid(const PlanInputs& in, const std::vector<PlanResult>& sorted) {
  std::vector<PlanResult> out;
  for (const PlanResult& r : sorted) {
    bool seen = false;
    for (const PlanResult& o : out) seen = seen || (o.config.tp == r.config.tp && o.config.pp == r.config.pp);
    if (!seen) out.push_back(r.fits && !r.simulated ? evaluate_plan(in, r.config, true) : r);
  }
  std::stable_sort(out.begin(), out.end(), better);
  return out;
}
