// apply_dimensions.h: chapter 12's dimensions applied to a pipeline stage's model chunks, each a step
// of its own, as torchtitan's parallelize_llama applies one after another: 10's ring (CP), 11's
// exchange (EP) on the grid, each handing its pieces to its dimension's apply function
// (common/parallel/parallelize.h), and what each group sends in a step next to its formula; before
// them, the flags of CP and EP and every refusal of the composition, with 08's plan of the pipeline.
// (TP is 07's collectives, apply_tensor_parallel in train.cpp; the gradients' groups are every
// pipeline chapter's router, common/pipeline/gradient_router.h.) Defines ContextExpertFlags,
// check_context_and_expert_flags, refuse_what_this_composition_cannot_run, plan_pipeline,
// plan_composition, every_ranks_positions, context_axis_positions, context_of, ContextRings,
// GridExperts and GroupBytes.
#pragma once
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../10_context_parallel/ring_attention_protocol.h"  // RingAttention: 10's lesson
#include "../11_expert_parallel/expert_exchange.h"           // ExpertExchange: 11's lesson
#include "parallel/context_split.h"   // gather_positions, parse_context_split, context_split_problem
#include "parallel/data_parallel.h"   // GradientSync
#include "parallel/weight_gather.h"   // is_product_weight: what a recipe's gathers move in its format
#include "ops/device.h"          // pick_device
#include "training/flags.h"           // TrainConfig, config_error
#include "pipeline/gradient_router.h"  // GradientRouter: the passes' turn, beside the experts'
#include "training/grid_report.h"     // GroupRow
#include "comm/lanes.h"           // lane_of, lane_index, kLanes: dualpipev's F&B pairs at once
#include "model/model.h"
#include "parallel/parallelize.h"  // ChunkTransform, apply_context_parallel, apply_ulysses, apply_expert_parallel
#include "pipeline/pipeline_flags.h"  // PipelineFlags, pipeline_flags_problem: 08's plan
#include "comm/process_grid.h"
#include "training/routing_log.h"  // RoutingLog: the ep row's theory from the routing
#include "parallel/theory.h"  // predict_tensor_parallel, ring_sent_bytes, routing_counts_bytes
#include "training/training_run.h"
#include "parallel/ulysses_attention.h"  // UlyssesAttention: positions traded for heads around the ring

// 10's and 11's flags as 12 takes them: the ring's size and split, the experts' group and routing.
struct ContextExpertFlags {
  int cp = 1;
  int ulysses = 1;  // ranks of a Ulysses group inside each ring place
  std::string split = "zigzag";
  int ep = 1;
  double capacity_factor = 0, aux_loss_coef = 0.01;

  void add_context_flags(FlagParser& flags) {
    flags.add("--cp", &cp, "ranks in a context-parallel ring, next to TP (default 1)");
    flags.add("--ulysses", &ulysses, "ranks of a Ulysses group inside each CP ring place: they split its positions "
                                    "and trade them for heads around attention (default 1)");
    flags.add("--cp-split", &split, "which positions a CP rank holds: zigzag (default) or contiguous", "SPLIT");
  }
  void add_expert_flags(FlagParser& flags) {
    flags.add("--ep", &ep, "expert-parallel group size, folded over each stage's DP x CP x TP ranks (MoE presets; "
                           "default 1)");
    flags.add("--capacity-factor", &capacity_factor, "an expert takes at most factor x tokens x k / E assignments "
                                                     "of a global micro-batch (0: unlimited)");
    flags.add("--aux-loss-coef", &aux_loss_coef, "coefficient of the load-balancing loss E x sum_e f_e P_e");
  }
};

// The flags of CP, Ulysses and EP, each alone (main, before the device is chosen): on a GPU the ring
// and the experts run in fp32 (docs/context_parallel.md, moe.h), so `--dtype` auto becomes fp32 there;
// Ulysses' exchange runs on the CPU only.
inline void check_context_and_expert_flags(TrainConfig& cfg, int world, const ContextExpertFlags& dims) {
  const int cp = dims.cp, ep = dims.ep;
  const std::string& split_flag = dims.split;
  const double capacity_factor = dims.capacity_factor, aux_loss_coef = dims.aux_loss_coef;
  if (cp < 1) config_error("--cp must be >= 1");
  if (ep < 1) config_error("--ep must be >= 1");
  if (!(capacity_factor >= 0)) config_error("--capacity-factor must be >= 0 (0: unlimited)");
  if (!(aux_loss_coef >= 0)) config_error("--aux-loss-coef must be >= 0");
  ContextSplit split;
  if (!parse_context_split(split_flag, &split))
    config_error("--cp-split: '" + split_flag + "' is neither zigzag nor contiguous");
  GPT2Config preset;
  if (!find_preset(cfg.preset, &preset))
    config_error("--preset: unknown preset '" + cfg.preset + "' (choose from " + preset_names() + ")");
  const std::string split_problem = context_split_problem(preset.T, cp, split, world);
  if (!split_problem.empty()) config_error(split_problem);
  // On a GPU the ring (ring_attention_cuda.cu) and the MoE layer (moe.h) run in fp32.
  if ((cp > 1 || preset.moe()) && pick_device(cfg.device) == Device::CUDA) {
    if (cfg.dtype == "bf16")
      config_error("--dtype bf16 with " + std::string(cp > 1 ? "--cp " + std::to_string(cp) : "a MoE preset") +
                   " on a GPU: the " + (cp > 1 ? "ring's CUDA kernels" : "MoE layer") + " runs in fp32; pass --dtype fp32");
    cfg.dtype = "fp32";
    const std::string ring_problem = cp > 1 ? ring_attention_problem(Device::CUDA, preset.C, preset.NH) : "";
    if (!ring_problem.empty()) config_error(ring_problem + "; pass --device cpu");
  }
  if (dims.ulysses < 1) config_error("--ulysses must be >= 1");
  if (dims.ulysses > 1 && pick_device(cfg.device) == Device::CUDA)
    config_error("--ulysses " + std::to_string(dims.ulysses) + " runs on the CPU (its exchange has no CUDA kernels "
                 "yet): pass --device cpu, or --ulysses 1");
}

// The refusals only this composition has, before any group exists: a MoE model under TP needs SP
// (each TP rank routes rows of its own), EP and the routing's flags need a MoE model, --cp-split a ring.
inline void refuse_what_this_composition_cannot_run(const TrainConfig& cfg, const GPT2Config& model_cfg, int tp,
                                                    bool sequence_parallel, int cp, int ep, bool root) {
  const bool moe = model_cfg.moe();
  if (moe && tp > 1 && !sequence_parallel)
    config_error("--preset " + cfg.preset + " is a mixture of experts: with --tp " + std::to_string(tp) +
                 " each rank of a tensor-parallel group must route rows of its own; add --sequence-parallel");
  if (!moe && ep > 1)
    config_error("--ep " + std::to_string(ep) + " spreads a mixture of experts: pass a MoE --preset (moe-tiny, "
                 "moe-small) or --ep 1");
  for (const char* flag : {"--capacity-factor", "--aux-loss-coef"})
    if (!moe && cfg.was_given(flag))
      config_error(std::string(flag) + " sets a mixture of experts' routing: --preset " + cfg.preset +
                   " is dense; pass a MoE --preset (moe-tiny, moe-small) or leave it out");
  if (cp == 1 && cfg.was_given("--cp-split"))
    config_error("--cp-split chooses which positions each of --cp ranks holds: at --cp 1 one rank holds them all; "
                 "leave it out or pass --cp 2 or more");
  if (tp == 1 && root)
    for (const char* flag : {"--sequence-parallel", "--tp-overlap"})
      if (cfg.was_given(flag))
        std::printf("note: %s does nothing at --tp 1 (one rank per tensor-parallel group holds every row and "
                    "product); running without it\n", flag);
}

// The pipeline's plan from its flags (pipeline_flags.h). A mixture of experts resumes with its
// checkpoint's micro-batches, unless --micro-batches is given: its capacity and balance loss are per
// micro-batch (training_run.h), and the schedule is built for the count.
inline PipelinePlan plan_pipeline(Communicator& world, const TrainConfig& cfg, const GPT2Config& model, int batch,
                                  PipelineFlags flags) {
  const int kept = cfg.was_given("--micro-batches") ? 0 : micro_batches_a_resume_keeps(world, cfg, model);
  if (kept > 0) flags.micro_batches = kept;
  PipelinePlan plan, unused;
  std::string problem = pipeline_flags_problem(flags, world.size(), model, batch, &plan);
  PipelineFlags by_default = flags;
  by_default.micro_batches = 0;
  if (kept > 0 && !problem.empty() && pipeline_flags_problem(by_default, world.size(), model, batch, &unused).empty())
    problem = "checkpoint '" + cfg.resume + "' was trained with " + std::to_string(kept) +
              (kept == 1 ? " micro-batch" : " micro-batches") +
              " a step, which its capacity and balance loss need on resuming: " + problem;
  if (!problem.empty()) config_error(problem);
  if (kept > 0 && kept != 2 * flags.pp && world.rank() == 0)
    std::printf("note: --micro-batches %d, the checkpoint's (its capacity and balance loss are per micro-batch)\n", kept);
  return plan;
}

// Every flag's refusal before any group exists, in order: Ulysses' heads and positions, an --ep that
// cannot divide the experts (it fits no rank count: the expert dimension's refusal), then 08's plan of
// the pipeline (with the grid's groups), then what only this composition cannot run.
inline PipelinePlan plan_composition(Communicator& world, const TrainConfig& cfg, const GPT2Config& model, int batch,
                                     const PipelineFlags& flags, bool sequence_parallel, const ContextExpertFlags& dims) {
  const int ranks_per_stage = flags.pp > 0 && world.size() % flags.pp == 0 ? world.size() / flags.pp : 0;
  ContextSplit split;
  parse_context_split(dims.split, &split);  // (checked in main)
  // Ulysses inside each ring place: its heads (after TP's split) and the place's positions must divide.
  const std::string ulysses_refusal = ulysses_problem(dims.ulysses, model.NH, flags.tp, model.T, dims.cp, split,
                                                      ranks_per_stage);
  if (!ulysses_refusal.empty()) config_error(ulysses_refusal);
  const std::string experts_problem = expert_count_problem(model, dims.ep, ranks_per_stage, flags.pp);
  if (!experts_problem.empty()) config_error(experts_problem);
  const PipelinePlan plan = plan_pipeline(world, cfg, model, batch, flags);
  refuse_what_this_composition_cannot_run(cfg, model, flags.tp, sequence_parallel, dims.cp, dims.ep, world.rank() == 0);
  return plan;
}

// Every CP rank's positions of a sequence of T (context_split.h; --cp-split checked in main).
inline std::vector<std::vector<int>> every_ranks_positions(const ContextExpertFlags& dims, int T) {
  ContextSplit split;
  parse_context_split(dims.split, &split);
  std::vector<std::vector<int>> positions;
  for (int r = 0; r < dims.cp; r++) positions.push_back(context_positions(T, dims.cp, r, split));
  return positions;
}

// Every rank's positions along the context axis (cp x u ranks, ring place x u + Ulysses rank): its
// ring place's, or under Ulysses its slice of them.
inline std::vector<std::vector<int>> context_axis_positions(const ContextExpertFlags& dims, int T) {
  const std::vector<std::vector<int>> places = every_ranks_positions(dims, T);
  std::vector<std::vector<int>> held_by;
  for (int c = 0; c < dims.cp * dims.ulysses; c++)
    held_by.push_back(ulysses_positions(places[size_t(c / dims.ulysses)], dims.ulysses, c % dims.ulysses));
  return held_by;
}

// The context split of the rank at place `c` of that axis (context_rank, grid_axes.h): none on an
// axis of one rank.
inline ContextParallelism context_of(const ContextExpertFlags& dims, int T, int c) {
  const int ranks = dims.cp * dims.ulysses;
  if (ranks == 1) return ContextParallelism{};
  return ContextParallelism{ranks, c, context_axis_positions(dims, T)[size_t(c)], dims.ulysses};
}

// CP: 10's ring, over this rank's heads (NH/t of them, C/t channels a head group): one per lane with
// pairs at once, each on its lane's communicator, with its own blocks in flight. Also each
// micro-batch's tokens at this rank's positions, kept until its backward. Under Ulysses (10's
// --ulysses u, inside the ring) the grid's Ulysses groups, the u ranks of each ring place, trade
// positions for heads around the rings of those that share a Ulysses rank, on NH/(t u) heads;
// `positions` are the ring places'.
class ContextRings {
 public:
  ContextRings(TrainingRun& run, const ProcessGrid& grid, const ContextExpertFlags& dims, int micro_batches, int lanes)
      : run_(run), held_(run.context_parallelism()), T_(run.model_config().T), ring_group_(grid.ring()),
        ulysses_group_(grid.ulysses()), inputs_(size_t(micro_batches)), targets_(size_t(micro_batches)) {
    if (!held_.on()) return;
    const std::vector<std::vector<int>> positions = every_ranks_positions(dims, T_);  // the ring places'
    const int micro_B = run.micro_batch_size();
    const TensorParallelism& tp = run.tensor_parallelism();
    const GPT2Config& cfg = run.model_config();
    const int u = held_.ulysses;
    if (ulysses_group_) {  // (with pairs at once, the grid gave each lane its copy of both)
      run.add_group("ulysses", *ulysses_group_);
      run.add_group("ring", ring_group_);
    }
    Communicator& ring = ring_group_;
    for (int lane = 0; lane < lanes; lane++) {
      rings_.push_back(std::make_unique<RingAttention>(lane_of(ring, Lane(lane)), positions, micro_B,
                                                       cfg.C / (tp.size * u), cfg.NH / (tp.size * u)));
      RingAttention& lane_ring = *rings_.back();
      if (u > 1)
        ulysses_.push_back(std::make_unique<UlyssesAttention>(
            lane_of(*ulysses_group_, Lane(lane)), micro_B, int(held_.positions.size()), cfg.C / tp.size,
            [&lane_ring](Tensor out, Tensor lse, Tensor qkv, int NH) { lane_ring.forward(out, lse, qkv, NH); },
            [&lane_ring](Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
              lane_ring.backward(dqkv, dout, qkv, out, lse, NH);
            }));
    }
  }

  // What CP installs on a chunk (parallelize.h): attention around the calling lane's ring. Then
  // Ulysses': its exchanges, each around its lane's ring (none without Ulysses).
  ChunkTransform context_parallel() {
    if (!held_.on()) return ChunkTransform();
    AttentionHooks ring;
    ring.attention_forward = [this](Tensor out, Tensor lse, Tensor qkv, int NH) {
      rings_[size_t(lane_index())]->forward(out, lse, qkv, NH);
    };
    ring.attention_backward = [this](Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
      rings_[size_t(lane_index())]->backward(dqkv, dout, qkv, out, lse, NH);
    };
    return apply_context_parallel(ring);
  }
  ChunkTransform ulysses() const {
    std::vector<UlyssesAttention*> exchange_of_lane;
    for (const auto& exchange : ulysses_) exchange_of_lane.push_back(exchange.get());
    return apply_ulysses(exchange_of_lane);
  }

  void begin_step() {
    for (auto& ring : rings_) ring->counters = RingCounters{};
  }

  // The ring's group (the context axis itself without Ulysses) and the Ulysses group (null without).
  const Communicator& ring_group() const { return ring_group_; }
  const Communicator* ulysses_group() const { return ulysses_group_; }

  MicroBatch micro_batch(int step, int micro) {
    MicroBatch batch = run_.micro_batch(step, micro);
    if (!held_.on()) return batch;
    std::vector<int>& in = inputs_[size_t(micro)];
    std::vector<int>& out = targets_[size_t(micro)];
    in.resize(size_t(batch.B) * held_.positions.size()), out.resize(in.size());
    gather_positions(batch.inputs, batch.B, T_, held_.positions, in.data());
    gather_positions(batch.targets, batch.B, T_, held_.positions, out.data());
    batch.inputs = in.data(), batch.targets = out.data();
    return batch;
  }

 private:
  TrainingRun& run_;
  const ContextParallelism& held_;
  int T_;
  Communicator& ring_group_;     // the grid's
  Communicator* ulysses_group_;  // the grid's (null without Ulysses)
  std::vector<std::unique_ptr<RingAttention>> rings_;
  std::vector<std::unique_ptr<UlyssesAttention>> ulysses_;  // one per lane, around that lane's ring
  std::vector<std::vector<int>> inputs_, targets_;
};

// EP: 11's exchange, one routing per micro-batch in flight: per chunk and activation slot, so that the
// two passes of a pair (another chunk each) never share one. Every rank of the stage routes its own
// rows; their counts are gathered over the stage (EP, then EDP: edp x EP + ep is the stage's order),
// and its tokens claim capacity in the one global order a single rank would use (moe.h).
class GridExperts {
 public:
  GridExperts(TrainingRun& run, const ProcessGrid& grid, const std::vector<GPT2*>& chunks,
              const std::vector<ModelPart>& parts, const ContextExpertFlags& dims, int micro_batches)
      : run_(run), grid_(grid), chunks_(chunks), parts_(parts), cfg_(run.model_config()),
        expert_rows_(size_t(micro_batches), std::vector<int64_t>(size_t(cfg_.L), 0)) {
    if (!cfg_.moe()) return;
    const std::vector<std::vector<int>> positions = context_axis_positions(dims, cfg_.T);  // every CP rank's
    for (const ModelPart& part : parts) slots_ = std::max(slots_, part.slots);
    const int micro_B = run.micro_batch_size(), t = grid.shape().tp, cp = grid.shape().cp * grid.shape().u;
    const bool sp = run.tensor_parallelism().sequence_parallel;
    const GridCoords& at = grid.coords();
    exchange_ = std::make_unique<ExpertExchange>(grid.ep(), *chunks.front(), cfg_.L, cfg_.experts, cfg_.C,
                                                 int(chunks.size()) * slots_);
    int max_runs = 1;  // the most runs of any rank of the stage: the records' common size
    for (int d = 0; d < grid.shape().dp; d++)
      for (int c = 0; c < cp; c++)
        for (int r = 0; r < t; r++)
          max_runs = std::max(max_runs, runs_of(token_index_of(d, micro_B, cfg_.T,
                                                               cp > 1 ? positions[size_t(c)] : std::vector<int>{}, r, t, sp)));
    routing_ = std::make_unique<RoutingLog>(micro_batches, cfg_.L, cfg_.experts, cfg_.top_k, cfg_.capacity_factor,
                                            grid.ep().size() * grid.expert_dp().size(),
                                            1 + int64_t(max_runs) * (2 + cfg_.experts));
    for (size_t c = 0; c < chunks.size(); c++) {
      hooks_.emplace_back();
      ExpertHooks& hooks = hooks_.back();
      hooks.rank = at.edp * grid.shape().ep + at.ep;
      hooks.ranks = grid.ep().size() * grid.expert_dp().size();
      hooks.token_index = token_index_of(at.dp, micro_B, cfg_.T, run.context_parallelism().positions, at.tp, t, sp);
      hooks.max_runs = max_runs;
      const int first_slot = int(c) * slots_;  // chunk c's slot s is the exchange's c x slots + s
      hooks.gather_counts = [this](Tensor mine, Tensor all) {  // (int32 records on the host, as moe.cpp keeps them)
        gathered_in_ep_.resize(size_t(mine.numel() * grid_.ep().size()));  // (the forward's alone: routing)
        const Tensor in_ep = make_view(gathered_in_ep_.data(), {int64_t(gathered_in_ep_.size())}, DType::I32);
        grid_.ep().all_gather(mine, in_ep);
        grid_.expert_dp().all_gather(in_ep, all);
        gathered_in_stage_.assign(all.i32(), all.i32() + all.numel());
      };
      hooks.experts_forward = [this, first_slot](int slot, int l, Tensor rows, const std::vector<int64_t>& counts,
                                                 Tensor out) {
        routing_->keep(running_micro_, l, gathered_in_stage_.data());
        exchange_->forward(first_slot + slot, l, rows, counts, out);
        expert_rows_[size_t(running_micro_)][size_t(l)] = exchange_->expert_rows(first_slot + slot)[size_t(l)];
      };
      hooks.experts_backward = [this, first_slot](int slot, int l, Tensor dout, Tensor drows) {
        exchange_->backward(first_slot + slot, l, dout, drows);
      };
    }
  }

  // What EP installs on each chunk (parallelize.h): its experts through the exchange, in its own slots.
  ChunkTransform expert_parallel() const { return exchange_ ? apply_expert_parallel(hooks_) : ChunkTransform(); }

  // The executor's passes: a forward sets what its experts record under (a pair's backward runs beside it).
  void before_compute(const Action& a) {
    if (a.op == Op::F) running_micro_ = a.micro;
  }
  // The executor's turn before every pass: this, then the router's (whether the backward's gradients
  // communicate). A pair's forward and backward call it at once, each in its lane (pipeline.h).
  void attach(PipelineExecutor& pipeline, GradientRouter& router) {
    pipeline.before_compute = [this, &router](const Action& a) {
      before_compute(a);
      router.before_compute(a);
    };
  }
  void begin_step() {
    if (exchange_) exchange_->reset_predictions(), routing_->clear();
  }
  // The rows this rank's experts ran, per micro-batch and block: the activations' theory at this
  // step's routing (TrainingRun::end_step).
  const std::vector<std::vector<int64_t>>& expert_rows() const { return expert_rows_; }
  // What this rank sends in its EP group's all-to-alls this step, from the routing the stage gathered
  // and the formula (routing_log.h), not from the counts the exchange handed to the calls.
  double predicted_a2a_bytes() const {
    const GridCoords& at = grid_.coords();
    const CollectiveFormats& formats = collective_formats(grid_.world());  // a recipe's rows: its formats' bytes
    return routing_->a2a_sent_bytes(at.edp * grid_.shape().ep + at.ep, grid_.shape().ep, cfg_.C,
                                    double(formats.activations.element_bytes()), double(formats.gradients.element_bytes()));
  }
  int64_t record_size() const { return hooks_.front().record_size(cfg_.experts); }

  // The step's routing, summed over its micro-batches, each stage its own blocks: one record of every
  // layer and expert, as 11 writes it.
  void write_routing(int step) {
    if (!exchange_) return;
    const int L = cfg_.L, E = cfg_.experts;
    Buffer counts(2 * int64_t(L) * E, MemCategory::Other);  // routed, then dropped (exact in fp32 below 2^24)
    const GridCoords& at = grid_.coords();
    const bool speaks = at.dp == 0 && at.cp == 0 && at.u == 0 && at.tp == 0;  // one rank per stage
    for (size_t c = 0; c < chunks_.size() && speaks; c++)
      for (int l = 0; l < L; l++) {
        if (!parts_[c].holds(cfg_, l + 1)) continue;
        for (int e = 0; e < E; e++) {
          counts.f32()[l * E + e] += float(chunks_[c]->routed_total(l)[size_t(e)]);
          counts.f32()[L * E + l * E + e] += float(chunks_[c]->dropped_total(l)[size_t(e)]);
        }
      }
    for (GPT2* chunk : chunks_) chunk->reset_routing_totals();
    exchange_->release_buffers();
    grid_.world().all_reduce(counts.view(), ReduceOp::Sum);
    JsonObject record;
    record.add("type", "experts").add("step", step).add("layers", L).add("experts", E);
    for (int l = 0; l < L; l++)
      for (int e = 0; e < E; e++) {
        const std::string at_le = "_L" + std::to_string(l) + "_E" + std::to_string(e);
        record.add("routed" + at_le, double(counts.f32()[l * E + e]));
        record.add("dropped" + at_le, double(counts.f32()[L * E + l * E + e]));
      }
    run_.write_record(record);
    routing_->write_records(run_, grid_.world(), step, at.pp, speaks);
  }

 private:
  // Where each row a rank routes stands in the global micro-batch's token order (moe.h): its data
  // rank's sequences come after the data ranks before it; under CP it holds `positions` of each, and
  // under SP its TP rank's slice of those rows.
  static std::vector<int64_t> token_index_of(int data_rank, int micro_B, int T, const std::vector<int>& positions,
                                             int tp_rank, int tp_size, bool sequence_parallel) {
    const int64_t held = positions.empty() ? T : int64_t(positions.size()), rows = int64_t(micro_B) * held;
    const int64_t mine = sequence_parallel ? rows / tp_size : rows, first = sequence_parallel ? tp_rank * mine : 0;
    std::vector<int64_t> index;
    for (int64_t i = first; i < first + mine; i++) {
      const int64_t b = i / held, j = i % held;
      index.push_back((int64_t(data_rank) * micro_B + b) * T + (positions.empty() ? j : positions[size_t(j)]));
    }
    return index;
  }
  static int runs_of(const std::vector<int64_t>& index) {
    int runs = 0;
    for (size_t i = 0; i < index.size(); i++) runs += i == 0 || index[i] != index[i - 1] + 1;
    return runs;
  }

  TrainingRun& run_;
  const ProcessGrid& grid_;
  std::vector<GPT2*> chunks_;
  std::vector<ModelPart> parts_;
  GPT2Config cfg_;
  int slots_ = 1;  // per chunk
  std::unique_ptr<ExpertExchange> exchange_;
  std::vector<ExpertHooks> hooks_;  // per chunk (a MoE model's)
  std::vector<std::vector<int64_t>> expert_rows_;  // (micro-batches) x (L)
  int running_micro_ = 0;
  std::vector<int32_t> gathered_in_ep_, gathered_in_stage_;
  std::unique_ptr<RoutingLog> routing_;  // the step's routing per micro-batch and block (the "routing" records)
};

// What each group sends in a step, against its formula (grid_report.h; docs/theory.md, section 17):
// every group's counters at the step's start, then its bytes next to theory.
class GroupBytes {
 public:
  GroupBytes(const TrainingRun& run, const ProcessGrid& grid, const std::vector<ModelPart>& parts,
             const GridExperts& experts, const ContextRings& rings, int micro_batches, bool sharded)
      : run_(run), grid_(grid), parts_(parts), experts_(experts), rings_(rings),
        m_(micro_batches),
        sharded_(sharded), zero2_(run.pipeline().reduce_every_micro_batch) {
    const GPT2Config& cfg = run.model_config();
    for (const ModelPart& part : parts)
      for (int u = part.first_unit; u <= part.last(cfg); u++) held_blocks_ += u >= 1 && u <= cfg.L;
  }

  void begin_step() { at_start_ = stats(); }
  // After step 1 (or the only step), every rank's groups next to their formulas.
  void report(TrainingRun& run, Communicator& world, int step, int start, int steps) const {
    if (step == std::max(start, 1) || (start + 1 >= steps && step == start))
      report_groups(run, world, rows(), formulas());
  }

  std::vector<std::pair<std::string, std::string>> formulas() const {
    std::vector<std::pair<std::string, std::string>> formulas = {
        {"tp", "per micro-batch 09's TP collectives on T/cp positions, + the tensors held whole, once (every "
               "micro-batch under --zero2; theory.h, predict_tensor_parallel)"},
        {"cp", "(2 x passes + 4) (cp-1)/cp x L' m B T C/t x 4: K and V forward, again with their gradients backward"},
        {"dp_cp", zero2_ ? "m reduce-scatters (wte's bucket: 1) + all-gather over DP x CP: (N-1)/N x (g(m(Ψ'-E) + E) + "
                           "b Ψm + w(Ψ'-Ψm)), Ψ' = padded - experts"
                  : sharded_ ? "reduce-scatter + all-gather over DP x CP: (N-1)/N x (g Ψ' + b Ψm + w(Ψ'-Ψm)), "
                               "Ψ' = padded - experts"
                             : "all-reduce over DP x CP: 2(N-1)/N x g x (padded - experts)"}};
    formulas.push_back({"", "g, b: a recipe's gradient and gathered-weight bytes (else w); Ψm: the blocks' matrices"});
    if (run_.cfg().collectives != "library")  // (the same rule as the table's rows: dimension.h)
      formulas.push_back({"", "under --collectives " + run_.cfg().collectives + ", tp's, dp_cp's and expert_dp's calls and "
                              "the counts' gathers each send what the algorithm their kind and size pick sends from "
                              "this rank (docs/theory.md, section 15); the all-to-alls stay the library's"});
    if (run_.context_parallelism().ulysses > 1)
      formulas.push_back({"ulysses", "(4 x passes + 8) (u-1)/u x L' m B T/(cp u) C/t x 4: q, k, v to heads and the "
                                     "output back, forward; the output's gradient and again q, k, v and the output "
                                     "to heads, their gradients back, backward"});
    if (run_.model_config().moe()) {
      formulas.push_back({"expert_dp", std::string(zero2_     ? "m reduce-scatters + all-gather: (D-1)/D x (m g + w)"
                                                   : sharded_ ? "reduce-scatter + all-gather: (D-1)/D x (g + w)"
                                                              : "all-reduce: 2(D-1)/D x g") +
                                           " x experts' ranges (gathered in w: fp32) + the counts' second gather: L' m "
                                           "(D-1) ep rec x 4"});
      formulas.push_back(
          {"ep", "the all-to-alls at this step's routing (11) + the counts' first gather: L' m (ep-1) rec x 4"});
      formulas.push_back({"expert_params", "L' x E/ep x (8C^2 + 5C) x 4"});
    }
    return formulas;
  }

  std::vector<GroupRow> rows() const {
    const Stats now = stats();
    const GPT2Config& run_cfg = run_.model_config();
    const ParamLayout& layout = run_.layout();
    const TensorParallelism& tp = run_.tensor_parallelism();
    const int micro_B = run_.micro_batch_size(), t = tp.size, cp = grid_.shape().cp * grid_.shape().u;
    const int u = run_.context_parallelism().ulysses, ring = cp / u;  // the ring's ranks, on C/(t u) channels
    const int64_t expert_range = layout.expert_range_size;  // the experts' elements (their tensors and padding)
    const double w = double(dtype_size(run_.dtype()));
    const int N = grid_.dp_cp().size(), D = grid_.expert_dp().size(), P = grid_.ep().size();
    GPT2Config held_cfg = run_cfg;  // every TP collective carries this rank's T/cp positions
    held_cfg.T = cp > 1 ? run_cfg.T / cp : run_cfg.T;
    // A recipe's activations, and the sums of the gradients held whole, travel in its formats.
    const CollectiveFormats& formats = collective_formats(grid_.world());
    // TP's and the all-reduced gradients' rows are the table's (dimension.h): under chapter 00's
    // collectives, each call's algorithm's bytes.
    const DimensionContext ctx = run_.dimension_context();
    // A recipe's reductions move its gradient format (g bytes); ZeRO's gather of the updated
    // parameters moves the blocks' matrices (Ψm) in its weights format (b bytes) and the rest in w
    // (docs/theory.md, section 18), here on the padded flat length less the experts' ranges.
    const double g = formats.gradients.fp32 ? w : double(formats.gradients.element_bytes());
    const double b = formats.weights.fp32 ? w : double(formats.weights.element_bytes());
    const double dense = double(layout.padded_size - expert_range);
    double matrices = 0;
    for (const ParamInfo& p : layout.params)
      if (p.held() && is_product_weight(p)) matrices += double(p.size);
    const double gathered = b * matrices + w * (dense - matrices);
    const bool library = ctx.collectives.library;
    const double dense_dp = zero2_     ? every_micro_batch_bytes(ctx)  // the DP row's (dimension_data.cpp)
                            : sharded_ ? (library ? double(N - 1) / N * (g * dense + gathered)
                                                  : zero_sent_bytes(ctx, g * dense, gathered))
                            : library  ? 2.0 * (N - 1) / N * g * dense
                                       : all_reduces_sent_bytes(ctx);
    // The experts' buckets: all-reduced, or reduce-scattered (every micro-batch under --zero2) and
    // gathered, the gradients in g bytes, the gather in w (an expert is no Ψm matrix: fp32). Under
    // chapter 00's collectives each call's algorithm's bytes from this rank of expert DP, as dp_cp's.
    const double expert_bytes = zero2_ ? m_ * g + w : sharded_ ? g + w : 2 * g;
    const int edp_rank = grid_.expert_dp().rank(), ep_rank = grid_.ep().rank();
    const auto expert_sent = [&](CollectiveKind kind, double bytes, int element) {
      return double(collective_sent_bytes(ctx.collectives, kind, int64_t(bytes), element, D, edp_rank));
    };
    // The all-reduces go call by call (the chapter lists them) under the library too: its count
    // rounds each call's share down to whole bytes.
    double expert_grads = expert_bytes * (D - 1) / D * double(expert_range);
    if (!library && sharded_)
      expert_grads = expert_sent(CollectiveKind::ReduceScatter, (zero2_ ? m_ * g : g) * double(expert_range), 1) +
                     expert_sent(CollectiveKind::AllGather, w * double(expert_range), 1);
    else if (!sharded_ && !ctx.expert_all_reduces.empty()) {
      expert_grads = 0;
      for (int64_t n : ctx.expert_all_reduces) expert_grads += expert_sent(CollectiveKind::AllReduce, double(n) * g, int(g));
    }
    std::vector<GroupRow> rows = {
        {"tp", double(now.tp.since(at_start_.tp).training_sent_bytes()), tensor_parallel_step_bytes(ctx)},
        {"cp", double(now.cp.since(at_start_.cp).training_sent_bytes()),
         ring_sent_bytes(run_cfg, held_blocks_, m_, micro_B, ring, t * u) * (ring > 1 ? 1 : 0)},
        {"dp_cp", double(now.dp_cp.since(at_start_.dp_cp).training_sent_bytes()), dense_dp}};
    if (u > 1)  // Ulysses' all-to-alls on this rank's T/(cp u) positions and C/t channels (ulysses_attention.h)
      rows.push_back({"ulysses", double(now.ulysses.since(at_start_.ulysses).training_sent_bytes()),
                      ulysses_forward_bytes(u, held_blocks_, m_, micro_B, held_cfg.T, run_cfg.C / t,
                                            run_cfg.recompute == Recompute::Full ? 2 : 1) +
                          ulysses_backward_bytes(u, held_blocks_, m_, micro_B, held_cfg.T, run_cfg.C / t)});
    if (run_cfg.moe()) {
      const int64_t record = experts_.record_size();
      double expert_params = 0;
      for (const ParamInfo& p : layout.params)
        if (p.expert >= 0) expert_params += 4.0 * double(p.size);
      const double C = run_cfg.C;
      // The counts' two gathers go by chapter 00's algorithms too; the all-to-alls stay the library's.
      rows.push_back({"expert_dp", double(now.expert_dp.since(at_start_.expert_dp).training_sent_bytes()),
                      expert_grads + routing_counts_bytes(ctx.collectives, held_blocks_, m_, D, edp_rank, P, record)});
      rows.push_back({"ep", double(now.ep.since(at_start_.ep).training_sent_bytes()),
                      experts_.predicted_a2a_bytes() +
                          routing_counts_bytes(ctx.collectives, held_blocks_, m_, P, ep_rank, 1, record)});
      rows.push_back({"expert_params", expert_params,
                      double(held_blocks_) * (run_cfg.experts / grid_.shape().ep) * (8 * C * C + 5 * C) * 4});
    }
    return rows;
  }

 private:
  struct Stats {
    CommStats tp, cp, dp_cp, ep, expert_dp, ulysses;
  };
  Stats stats() const {
    return Stats{grid_.tp().stats(), rings_.ring_group().stats(), grid_.dp_cp().stats(), grid_.ep().stats(),
                 grid_.expert_dp().stats(), rings_.ulysses_group() ? rings_.ulysses_group()->stats() : CommStats{}};
  }

  const TrainingRun& run_;
  const ProcessGrid& grid_;
  std::vector<ModelPart> parts_;
  const GridExperts& experts_;
  const ContextRings& rings_;
  int m_;
  bool sharded_, zero2_;
  int held_blocks_ = 0;  // this rank's blocks, every chunk
  Stats at_start_;
};
