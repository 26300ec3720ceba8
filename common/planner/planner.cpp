// planner.cpp: the clusters, models, cost model and search of planner.h. Each number comes from a
// function the trainers use or print (theory.h, pipeline.h, pipeline_schedule.h, pipeline_simulate.h,
// comm.h); what is added here is only which link each group travels on and what overlaps what
// (docs/planner.md).
#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "ops/device.h"   // memory_per_rank: the namespaces cluster's memory, as its trainers compute it
#include "base/metrics.h"  // format_bytes
#include "model/param_layout.h"
#include "pipeline/pipeline.h"  // unit_costs, balanced_partition, parts_of_rank
#include "schedule/pipeline_simulate.h"  // simulated_makespan, theory_bubble, theory_in_flight
#include "ops/ring_attention.h"  // ring_buffer_bytes
#include "planner/planner_ulysses.h"  // Ulysses' refusal, bytes and buffers

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
// MPI's shared memory between two ranks of this machine (namespaces_cluster; measured, see there).
constexpr double kNamespacesSharedMemoryGbps = 16, kNamespacesSharedMemoryLatencyUs = 5;

Strategy strategy_of(int zero) {
  return zero == 0 ? Strategy::DP : zero == 1 ? Strategy::ZeRO1 : zero == 2 ? Strategy::ZeRO2 : Strategy::ZeRO3;
}

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
const ParamLayout& cached_layout(const GPT2Config& cfg, int dp, int tp, const std::vector<ModelPart>& parts,
                                 int ep = 1) {
  // A mixture of experts on 12's grid: a stage's dp x tp ranks (dp here: DP x CP) over ep hold the
  // same experts, which pad (and ZeRO-1 shards) over them (param_layout.h).
  const int replicas = cfg.moe() ? std::max(1, dp * tp / ep) : 1;
  static std::map<std::string, ParamLayout> cache;
  std::ostringstream key;
  key << cfg.L << ' ' << cfg.C << ' ' << cfg.NH << ' ' << cfg.T << ' ' << cfg.V << ' ' << cfg.experts << ' '
      << cfg.top_k << ' ' << dp << ' ' << tp << ' ' << ep << ' ' << replicas;
  for (const ModelPart& part : parts) key << ' ' << part.first_unit << ':' << part.last(cfg);
  auto it = cache.find(key.str());
  if (it != cache.end()) return it->second;
  if (cache.size() > 4096) cache.clear();
  return cache
      .emplace(key.str(),
               build_gpt2_layout(cfg, dp, TensorParallelism{tp, 0, false}, parts, ExpertParallelism{ep, 0, replicas}))
      .first->second;
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
  // Chapter 12 composes CP, EP, TP and PP on one grid; what it refuses, the planner refuses too.
  if (in.ring_attention && c.context() == 1 && (c.tp > 1 || c.pp > 1 || m.moe()))
    return "chapter 10's ring of one (--attention ring at cp 1) runs with data parallelism only, dense";
  if (c.ep > 1 && !m.moe()) return "expert parallelism spreads a mixture of experts: --model " + m.preset + " has none";
  if (m.moe() && c.tp > 1 && !c.sequence_parallel)
    return "a mixture of experts under TP needs sequence parallelism (12): each TP rank routes rows of its own";
  if (m.moe() && c.recompute == Recompute::Full) return "full recomputation would route each block twice (moe.h)";
  if (m.moe() && c.zero > 1)
    return "a mixture of experts shards with ZeRO-1 only (12's --zero1: the experts' state over their replicas, the "
           "rest over DP x CP): ZeRO " + std::to_string(c.zero) + " is not the chapters'";
  if (c.context() > 1 && c.zero > 1) return "chapter 12 shards over DP x CP with ZeRO-1 only";
  const std::string ulysses_problem = ulysses_split_problem(c.ulysses, m.NH, c.tp, m.T, c.cp);
  if (!ulysses_problem.empty()) return ulysses_problem;
  if (c.cp > 1 && (m.T % (2 * c.cp))) return "cp " + std::to_string(c.cp) + ": T does not cut into 2cp chunks (zigzag)";
  if (c.ep > 1 && (m.experts % c.ep || (c.dp * c.context() * c.tp) % c.ep))
    return "ep " + std::to_string(c.ep) + " must divide the experts and a stage's dp x cp x u x tp ranks";
  if (c.gpus() != in.gpus)
    return "dp x tp x pp x cp x u = " + std::to_string(c.gpus()) + ", not the " + std::to_string(in.gpus) + " GPUs";
  if (long(c.dp) * c.micro_batch * c.micro_batches != in.batch)
    return "dp x B x m = " + std::to_string(long(c.dp) * c.micro_batch * c.micro_batches) + ", not the batch " +
           std::to_string(in.batch);
  GPT2Config held = m;  // under CP (and Ulysses), SP splits a rank's T/(cp u) positions
  held.T = m.T / c.context();
  const std::string tp_problem =
      tensor_parallel_size_problem(held, TensorParallelism{c.tp, 0, c.sequence_parallel}, c.micro_batch);
  if (!tp_problem.empty()) return tp_problem;
  if (c.sequence_parallel && c.tp == 1) return "sequence parallelism needs tp > 1";
  if (c.zero < 0 || c.zero > 3) return "ZeRO stage " + std::to_string(c.zero) + " (0..3)";
  if (c.zero > 0 && c.dp * c.context() == 1)
    return "ZeRO shards over the data-parallel group (DP x CP x U): dp x cp x u = 1";
  if (c.pp > 1 && c.zero > 1) return "ZeRO-2/3 communicate every micro-batch: not with a pipeline (use ZeRO-1)";
  if (c.pp * c.virtual_stages > m.L) return "more virtual stages than blocks";
  if (c.pp > 1 && splits_backward(c.schedule) && c.recompute == Recompute::Full)
    return std::string("full recomputation keeps no product's input for ") + schedule_name(c.schedule) +
           "'s later weight pass";
  if (c.pp > 1) {
    const std::string shape_error =
        schedule_shape_error(c.schedule, PipelineShape{c.pp, c.micro_batches, c.virtual_stages, placement_of(c.schedule)});
    if (!shape_error.empty()) return shape_error;
  } else if (c.virtual_stages != 1) {
    return "virtual stages need a pipeline";
  }
  return "";
}

}  // namespace

std::string PlanConfig::describe() const {
  std::ostringstream s;
  s << "dp " << dp << " tp " << tp << " pp " << pp;
  if (cp > 1) s << " cp " << cp;
  if (ulysses > 1) s << " u " << ulysses;
  if (ep > 1) s << " ep " << ep;
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
  // zb-v and dualpipev fold the stages into a V (08): chunk 0 runs down the ranks, chunk 1 back up.
  const PipelineShape shape{c.pp, c.micro_batches, c.virtual_stages, placement_of(c.schedule)};
  parts = parts_of_rank(cfg, cached_partition(cfg, c.pp * c.virtual_stages), c.pp, rank, shape.placement);
  for (int ch = 0; ch < c.virtual_stages; ch++) {
    parts[ch].slots = theory_in_flight(c.schedule, shape, rank, ch);
    parts[ch].split_backward = splits_backward(c.schedule);
  }
  return parts;
}

// The rows a rank routes per micro-batch (TrainingRun::routed_tokens): its T/(cp u) positions of B
// sequences, and under sequence parallelism its TP rank's share of them (12).
int64_t routed_tokens(const GPT2Config& cfg, const PlanConfig& c) {
  return int64_t(c.micro_batch) * (cfg.T / c.context()) / (c.sequence_parallel ? c.tp : 1);
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
  // Chapter 10 averages over DP x CP; chapter 11 holds E/ep experts a rank (ep ranks of the world).
  // (The whole model's length first: a later call may empty the cache under the reference.)
  const int64_t whole_model_size = cached_layout(cfg, 1, 1, {}).padded_size;
  const ParamLayout& layout = cached_layout(cfg, c.dp * c.context(), c.tp, parts, c.ep);
  const Strategy strategy = strategy_of(c.zero);
  const TensorParallelism tp{c.tp, 0, c.sequence_parallel};
  StageMemory sm;
  // As TrainingRun::check_memory forecasts it: under CP the model holds T/cp positions and keeps a
  // log-sum-exp per query, and the ring adds its blocks of this rank's NH/t heads (ring_buffer_bytes);
  // a mixture of experts adds the routers' buffers per slot and block and its experts' rows replayed
  // in the schedule's order, at the bound (the routing is not known before the step), and the
  // exchange's buffers at the same bound (chapter 11 and 12, even at ep 1). Ulysses (10, 12): the
  // model on T/(cp u) positions, the ring's blocks as many values as on them, and the exchange's
  // buffers (docs/theory.md, section 13b).
  GPT2Config held = cfg;
  const bool ring = c.context() > 1 || in.ring_attention;
  if (ring) held.T = cfg.T / c.context();
  const PipelineParallelism pp{c.pp, stage, parts, false, {}};
  sm.memory = forecast_memory(strategy, layout, whole_model_size, held, c.micro_batch, c.micro_batches,
                              in.cluster.dtype, in.cluster.device, flash || ring, false, in.data_bytes, tp, pp);
  if (ring) sm.memory.activations += ring_buffer_bytes(c.cp, c.micro_batch, held.T, cfg.C / c.tp, cfg.NH / c.tp);
  if (c.ulysses > 1)
    sm.memory.activations += ulysses_exchange_buffer_bytes(double(c.micro_batch) * held.T, double(cfg.C) / c.tp,
                                                           double(dtype_size(in.cluster.dtype)));
  if (cfg.moe()) {
    const int64_t tokens = routed_tokens(cfg, c);
    const int64_t most = moe_expert_rows_at_most_of(cfg, tokens, c.ep, c.dp * c.context() * c.tp);
    const std::vector<Action> actions =
        c.pp > 1 ? build_schedule(c.schedule, PipelineShape{c.pp, c.micro_batches, c.virtual_stages, placement_of(c.schedule)}, stage)
                 : std::vector<Action>{};
    const std::vector<std::vector<int64_t>> rows(size_t(c.micro_batches), std::vector<int64_t>(size_t(cfg.L), most));
    sm.memory.activations += moe_schedule_activation_bytes(cfg, tokens, parts, actions, rows);
    sm.memory.transient += moe_exchange_buffer_bytes(cfg, std::vector<int64_t>(size_t(cfg.L), most));
  }
  const ModelStateBytes state = model_state_bytes(strategy, layout, in.cluster.dtype);  // as allocated
  sm.params_bytes = state.params, sm.grads_bytes = state.grads, sm.optim_bytes = state.optim;
  return sm;
}

PlanResult evaluate_plan(const PlanInputs& in, const PlanConfig& c, bool simulate_pipeline) {
  if (!in.chapters_model) return evaluate_shape_plan(in, c, simulate_pipeline);
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
  const PipelineShape shape{p, m, v, placement_of(c.schedule)};
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
      for (int ch = 0; ch < v; ch++) b += (*blocks)[size_t(virtual_stage(shape, rank, ch))];
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
  // On a GPU cluster with a kernel-rate table (planner_kernel_rates.h) the FLOPs run at the share of
  // peak the model's products reach at their depths on this TP rank, times the residual efficiency.
  const double rate = k.peak_flops * in.efficiency *
                      dense_product_share(shape_of(cfg), k.gpu, c.tp, double(B) * cfg.T / c.context());
  const bool elementwise_apart = k.elementwise_rate > 0;
  GPT2Config kept_all = cfg;
  kept_all.recompute = Recompute::None;
  const std::vector<double> unit_cost = unit_costs(cfg);
  const LinkModel& tp_link = link_for(k, c.tp);
  const LinkModel& dp_link = link_for(k, c.tp * c.dp * c.context());
  const LinkModel& pp_link = link_for(k, c.gpus());
  // What a rendezvous with the peer costs (Cluster::sync_s), once for each blocking collective or
  // message on a rank's path, besides the link's alpha-beta time: 0 but on CPU ranks whose cores other
  // processes share, where each waits for the peer to be scheduled again (docs/planner.md, plan-check).
  const double sync = k.sync_s;
  const double tokens = double(B) * cfg.T / c.context();  // a rank's positions of a micro-batch (chapter 10: T/(cp u))
  const double stream_bytes = tokens * cfg.C * w;
  // A mixture of experts (chapter 11): each token's MLP is its top_k experts' (at most the capacity's
  // share of them) and the router's product, at balanced routing.
  const double routed_share = cfg.capacity_factor > 0 ? std::min(1.0, cfg.capacity_factor) : 1.0;
  // The experts' rows are timed at the measured load (PlanInputs::expert_load; memory keeps the bound).
  const double timed_share = routed_share * in.expert_load;
  const double moe_extra = cfg.moe() ? (timed_share * cfg.top_k - 1) * 16.0 * cfg.C * cfg.C + 2.0 * cfg.C * cfg.experts : 0.0;
  // The rows a rank's experts run per block at balanced routing: the rows it routes, k each (12: B
  // T/cp, and under SP a TP rank's share of them).
  const int64_t routed = cfg.moe() ? routed_tokens(cfg, c) : 0;
  const std::vector<int64_t> balanced_rows(size_t(cfg.L), int64_t(timed_share * double(routed) * cfg.top_k));
  // The products' rates (PlanInputs::product_rates): by their rows where measured, else `rate`.
  const double dense_rate = in.product_rates.empty() ? rate : in.product_rates.at(tokens);
  const double expert_rate =
      in.product_rates.empty() || !cfg.moe() ? rate : in.product_rates.at(double(balanced_rows[0]) * c.ep / cfg.experts);
  // Under CP, the model runs on T/(cp u) positions (and TP's collectives carry those: 12).
  GPT2Config held = cfg, held_kept = kept_all;
  const bool ring = c.context() > 1 || in.ring_attention;
  if (ring) held.T = held_kept.T = cfg.T / c.context();
  // per micro-batch and block: the context axis's exposed time, forward and backward apart
  double cp_forward_per_block = 0, cp_backward_per_block = 0, ep_per_block = 0;
  if (c.cp > 1) {
    // Chapter 10's ring, per block: cp - 1 hops of a K and V block (this rank's NH/t heads under TP,
    // 12) forward, each hidden behind the attention on the block it sends; backward the blocks again
    // and their gradients' accumulators, as ring_exposed() (planner_cpu_rates.h) lays them on the
    // steps. Under Ulysses the ring's ranks are u apart, and its blocks of T/cp positions on C/u
    // channels hold as many values as T/(cp u) positions on C. A step's attention is 1/cp of the
    // rank's causal pairs, 4 hs FLOPs a pair and head forward, 10 backward (docs/theory.md, section
    // 13), at the attention kernel's rate where one was measured, else the products'. (Timed once at
    // the products' rate on a CPU, where attention runs some 10 times slower a FLOP, the hops came out
    // all exposed, while the loaded rows hid most of them: cp2-slow +1% to +42%.)
    const double hop =
        modelled_ms(link_for(k, c.cp * c.ulysses), CollectiveKind::SendRecv, int64_t(2 * stream_bytes / c.tp), 2) / 1e3 +
        sync;
    const double attention_rate = in.attention_rate > 0 ? in.attention_rate : rate;
    const double forward_step = tokens * attention_flops_per_token(cfg) / 2 / attention_rate / c.cp / c.tp;
    const RingExposure exposed = ring_exposed(c.cp, hop, forward_step, forward_step * 10 / 4);
    cp_forward_per_block = exposed.forward;
    cp_backward_per_block = exposed.backward;
  }
  // Ulysses, per block: its all-to-alls on the critical path (attention waits for its heads), over
  // the u innermost ranks of the context axis (docs/theory.md, section 13b).
  const UlyssesExchange ulysses{c.ulysses, tokens, double(cfg.C) / c.tp, w};
  const int forward_passes = cfg.recompute == Recompute::Full ? 2 : 1;
  double ulysses_per_block = 0;
  if (c.ulysses > 1) {
    const LinkModel& ulysses_link = link_for(k, c.ulysses);
    // (2 all-to-alls a forward pass, 4 a backward: {3, 1} and {3, 1, 1, 3} parts, planner_ulysses.h)
    const double forward = ulysses.forward_seconds(ulysses_link, forward_passes) + 2 * forward_passes * sync;
    const double backward = ulysses.backward_seconds(ulysses_link, false) + 4 * sync;
    cp_forward_per_block += forward, cp_backward_per_block += backward;
    ulysses_per_block = forward + backward;
  }
  if (cfg.moe() && c.ep > 1) {
    // Chapter 11, per block: the routing counts, then the rows out and back, forward and backward.
    const LinkModel& ep_link = link_for(k, c.ep);
    const double rows = double(balanced_rows[0]) * cfg.C * w;
    ep_per_block = (4 * modelled_ms(ep_link, CollectiveKind::AllToAll, int64_t(rows), c.ep) +
                    modelled_ms(ep_link, CollectiveKind::AllToAll, int64_t(4 * cfg.experts), c.ep)) / 1e3 +
                   5 * sync;
  }
  // A pass's activation bytes (the elementwise work's measure): the arena of its part, on T/cp
  // positions with the ring's blocks under CP, and a mixture of experts' routers and rows.
  auto pass_bytes = [&](const GPT2Config& g, const ModelPart& one) {
    double bytes = ring ? activation_bytes(g, B, dtype, true, tp, one) +
                              ring_buffer_bytes(c.cp, B, g.T, cfg.C / c.tp, cfg.NH / c.tp)
                        : activation_bytes(g, B, dtype, cfg.flash_attention, tp, one);
    if (cfg.moe())
      bytes += moe_schedule_activation_bytes(cfg, routed, p == 1 ? std::vector<ModelPart>{} : std::vector<ModelPart>{one},
                                             {}, {balanced_rows});
    return bytes;
  };
  ActionCosts costs;
  // per micro-batch, summed over a rank's chunks
  double slowest_compute = 0, slowest_tp = 0, slowest_cp = 0, slowest_ep = 0, slowest_ulysses = 0;
  std::vector<double> rank_compute(p, 0), rank_tp(p, 0), rank_cp(p, 0), rank_ep(p, 0), rank_ulysses(p, 0);
  double first_stage_blocks = 0;  // Ulysses' bytes are reported for a rank of stage 0 (world rank 0)
  // The simulator needs every virtual stage's costs; the estimate only the slowest rank's, which is
  // one of those whose memory was forecast (the most blocks, or the head's): the same ranks.
  const std::vector<int>& timed = ranks;
  for (int rank : timed) {
    const std::vector<ModelPart> parts = p == 1 ? std::vector<ModelPart>{ModelPart{}} : parts_of(rank);
    for (size_t ch = 0; ch < parts.size(); ch++) {
      const ModelPart& part = parts[ch];
      const int blocks = std::min(part.last(cfg), cfg.L) - (std::max(part.first_unit, 1) - 1);
      double forward_flops = 0, recompute_flops = recompute_flops_per_token(cfg, tp, part);
      for (int u = part.first_unit; u <= part.last(cfg); u++) forward_flops += unit_cost[u] + (u >= 1 && u <= cfg.L ? moe_extra : 0);
      double elementwise = 0, recompute_elementwise = 0;  // seconds per micro-batch
      if (elementwise_apart) {
        forward_flops -= blocks * attention_flops_per_token(cfg);
        if (cfg.recompute != Recompute::None) recompute_flops -= blocks * attention_flops_per_token(cfg) / c.tp;
        ModelPart one = part;
        one.slots = 1;
        const double bytes = pass_bytes(held_kept, one);
        // The backward's scratch (activation_bytes with no slot: nothing is recomputed here) is held once
        // a rank but written by every block's backward: as work it counts once a block. Counted once a
        // pass, as memory counts it, a pipeline's stage, which runs its blocks in m passes (and v chunks
        // each), was charged m v times the scratch for the calibration's once: 1.22 times the bytes of the
        // same work at pp 2 and m 4, 1.57 interleaved, and its rest came out 1.6 to 2.6 times what its
        // ranks spent besides the products (plan-check's pipelines, +12% to +34%).
        ModelPart none = one;
        none.slots = 0;
        const double scratch = activation_bytes(held_kept, B, dtype, ring || cfg.flash_attention, tp, none);
        elementwise = (bytes + std::max(0, blocks - 1) * scratch) / k.elementwise_rate;
        recompute_elementwise = (bytes - pass_bytes(held, one)) / k.elementwise_rate / 3;
      }
      // Under Ulysses the exchanges' packing and unpacking, per block: memcpy at the memory's bandwidth
      // (planner_ulysses.h). They were once priced as activation bytes at the elementwise rate, which
      // on this machine's CPU is about 60 times slower a byte than a copy: ulysses2 came out +27% to
      // +123% in every plan-check run. The CPU clusters give no bandwidth: a few ms a step, left out.
      double copies = 0;
      if (c.ulysses > 1 && k.memory_bandwidth > 0)
        copies = blocks * (forward_passes * ulysses.forward_copy_bytes() + ulysses.backward_copy_bytes(false)) /
                 k.memory_bandwidth / 3;
      // The products, each at its rows' rate where rates by rows were measured: the dense ones on the
      // micro-batch's B T/cp rows, an expert's on its share of the slowest EP rank's routed rows.
      const double expert_flops = cfg.moe() ? blocks * timed_share * cfg.top_k * 16.0 * cfg.C * cfg.C : 0.0;
      const double product_s = (forward_flops - expert_flops) / dense_rate + expert_flops / expert_rate;
      const double forward = tokens * product_s / c.tp + elementwise / 3 + copies;
      const double recompute = tokens * recompute_flops / dense_rate + recompute_elementwise;
      const TensorParallelPrediction tpp =
          predict_tensor_parallel(held, B, tp, dtype, p == 1 ? std::vector<ModelPart>{} : std::vector<ModelPart>{part});
      const int tp_collectives = tpp.all_reduces + tpp.all_gathers + tpp.reduce_scatters + tpp.loss_all_reduces;
      const double tp_time =
          tensor_parallel_seconds(tpp, tp_link, stream_bytes, tokens * 4, c.tp) + (c.tp > 1 ? tp_collectives * sync : 0);
      // The ring's (and Ulysses') and the experts' exchanges of this part's blocks: the context
      // axis's each in its pass; the all-to-alls half and half.
      const double cp_time = blocks * (cp_forward_per_block + cp_backward_per_block), ep_time = blocks * ep_per_block;
      const double work = 3 * forward + recompute;
      const double f = forward + tp_time * forward / work + blocks * cp_forward_per_block + ep_time / 2,
                   b = 2 * forward + recompute + tp_time * (work - forward) / work + blocks * cp_backward_per_block +
                       ep_time / 2;
      rank_ulysses[rank] += blocks * ulysses_per_block;
      if (rank == 0) first_stage_blocks += blocks;
      if (p > 1) {
        const int s = virtual_stage(shape, rank, int(ch));
        if (costs.forward.empty()) costs.forward.assign(p * v, 0), costs.backward.assign(p * v, 0), costs.weight.assign(p * v, 0);
        if (splits_backward(c.schedule)) {
          costs.forward[s] = f, costs.backward[s] = b - forward * (1 + tp_time / work), costs.weight[s] = forward * (1 + tp_time / work);
        } else {
          costs.forward[s] = f, costs.backward[s] = b;
        }
      }
      rank_compute[rank] += work, rank_tp[rank] += tp_time, rank_cp[rank] += cp_time, rank_ep[rank] += ep_time;
    }
    if (rank_compute[rank] + rank_tp[rank] + rank_cp[rank] + rank_ep[rank] >
        slowest_compute + slowest_tp + slowest_cp + slowest_ep)
      slowest_compute = rank_compute[rank], slowest_tp = rank_tp[rank], slowest_cp = rank_cp[rank], slowest_ep = rank_ep[rank],
      slowest_ulysses = rank_ulysses[rank];
  }
  r.compute_s = m * slowest_compute;
  r.ulysses_s = m * slowest_ulysses;
  r.ulysses_bytes =
      m * first_stage_blocks * (ulysses.forward_bytes(forward_passes) + ulysses.backward_bytes(false));
  r.tp_s = m * slowest_tp;
  r.cp_s = m * slowest_cp, r.ep_s = m * slowest_ep;
  // Under sequence parallelism the gradients of the parameters every TP rank holds whole are summed
  // once a step.
  if (c.sequence_parallel) {
    const TensorParallelPrediction tpp = predict_tensor_parallel(held, B, tp, dtype, worst_parts);
    const double payload = tpp.partial_grad_bytes * c.tp / (2.0 * (c.tp - 1));  // bytes sent -> payload
    r.tp_s += (modelled_ms(tp_link, CollectiveKind::AllReduce, int64_t(payload), c.tp) +
               (tpp.partial_grad_all_reduces - 1) * modelled_ms(tp_link, CollectiveKind::AllReduce, 0, c.tp)) / 1e3;
    // Those sums travel while the backward goes on and are waited for once a block (07, 09), and once
    // for what the embedding and the final layernorm hold: a rendezvous each wait, not each sum.
    int waits = worst_parts.empty() ? cfg.L : 0;  // (no parts: the whole model)
    for (const ModelPart& part : worst_parts) waits += std::min(part.last(cfg), cfg.L) - (std::max(part.first_unit, 1) - 1);
    r.tp_s += (waits + 1) * sync;
  }
  const double busy = r.compute_s + r.tp_s + r.cp_s + r.ep_s;
  double pipeline_s = busy;
  if (p > 1) {
    // One micro-batch's stream between stages: under sequence parallelism a TP rank's rows only (09).
    const double message = stream_bytes / (c.sequence_parallel ? c.tp : 1);
    costs.p2p = modelled_ms(pp_link, CollectiveKind::SendRecv, int64_t(message), 2) / 1e3 + sync;
    double without_p2p = 0;
    if (simulate_pipeline) {
      pipeline_s = simulated_makespan(c.schedule, shape, costs, &without_p2p);
      r.simulated = true;
    } else {
      // The slowest stage's F, B, W in theory_bubble's formula, plus the p2p hops of the fill and drain.
      const double per_micro = busy / m;
      const bool split = splits_backward(c.schedule);
      const double f = per_micro / 3, bubble = theory_bubble(c.schedule, shape, f, split ? f : 2 * f, split ? f : 0);
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
  // Chapter 10's gradients average over DP x CP; chapter 11's experts' over the ranks holding the
  // same experts (dp / ep), the rest over every rank.
  const int group = c.dp * c.context();
  // 12: the experts' replicas are a stage's dp x cp x tp ranks over ep (under TP with ep 1, a TP
  // group's ranks hold the same experts and average them, with no dense replica to sum with).
  const int expert_group = cfg.moe() ? group * c.tp / c.ep : 1;
  if (group > 1 || expert_group > 1) {
    const ParamLayout& layout = cached_layout(cfg, group, c.tp, worst_parts, c.ep);
    double experts = 0;  // elements, held by this rank
    if (cfg.moe() && (c.ep > 1 || c.tp > 1))
      for (const ParamInfo& q : layout.params)
        if (q.held() && q.expert >= 0) experts += double(q.size);
    const double shard_all = w * (double(layout.padded_size) - experts);
    const int collectives = layout.num_units();
    auto ring = [&](CollectiveKind kind) {
      double ms = 0;
      if (group > 1)
        ms += modelled_ms(dp_link, kind, int64_t(shard_all), group) + (collectives - 1) * modelled_ms(dp_link, kind, 0, group) +
              collectives * sync * 1e3;
      if (experts > 0 && expert_group > 1) ms += modelled_ms(dp_link, kind, int64_t(w * experts), expert_group) + sync * 1e3;
      return ms / 1e3;
    };
    const double hidden = in.dp_overlap ? 1 : 0;
    const double micro_busy = slowest_compute + slowest_tp + slowest_cp + slowest_ep;
    const double last_backward = hidden * micro_busy * 2 / 3;
    const double per_micro = hidden * micro_busy;
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
  // The tied wte's two copies (first and last stage) summed once a step, on the pipeline's link; a
  // V puts both ends on rank 0, one copy.
  if (p > 1 && rank_of_stage(shape, 0) != rank_of_stage(shape, p * v - 1))
    r.embedding_s = modelled_ms(pp_link, CollectiveKind::AllReduce, int64_t(w * double(cfg.V) / c.tp * cfg.C), 2) / 1e3 + sync;
  r.step_s = pipeline_s + r.dp_s + r.embedding_s;
  if (sync > 0) {
    // What the rendezvous add to the step, against the same configuration without them.
    PlanInputs without = in;
    without.cluster.sync_s = 0;
    r.sync_added_s = r.step_s - evaluate_plan(without, c, simulate_pipeline).step_s;
  }

  const double step_tokens = double(in.batch) * cfg.T;
  r.tokens_per_s = step_tokens / r.step_s;
  const ParamLayout& whole = cached_layout(in.model, 1, 1, {});
  // A mixture of experts counts the experts a token passes through (top_k of E), not all of them.
  const double idle_experts = cfg.moe() ? double(cfg.L) * (cfg.experts - cfg.top_k) * 8.0 * cfg.C * cfg.C : 0.0;
  const double model_flops = 6.0 * (double(flops_params(whole)) - idle_experts) + 12.0 * cfg.L * cfg.C * cfg.T;
  r.mfu = r.tokens_per_s * model_flops / (double(in.gpus) * k.peak_flops);
  // Counting recomputation's FLOPs too (per token, over the whole model): what the GPUs computed.
  r.flops_per_gpu = r.tokens_per_s * (model_flops + recompute_flops_per_token(cfg, TensorParallelism{}, ModelPart{})) / in.gpus;
  return r;
}
