// Chapter 12: five-dimensional parallelism: data x context x tensor x pipeline x expert, composed on
// one process grid.
//
// The idea. Each chapter since 07 taught one way to split the work: 07 the products (TP), 08 the
// layers (PP), 10 the sequence (CP), 11 the experts (EP); 09 composed TP and PP with data
// parallelism. The runs this course leads to use all of them at once (Llama 3 405B: TP 8 x CP 16 x
// PP 16 x DP 8; DeepSeek-V3: PP 16 x EP 64 x DP). Composition is placement again, on one grid
// (common/process_grid.h):
//     world rank = ((pp x DP + dp) x CP + cp) x TP + tp,
// TP innermost (a node's fast links), then CP, DP, and PP outermost. Experts fold over the same
// ranks: inside a pipeline stage, its DP x CP x TP ranks are re-split as EDP x EP, EP innermost, so
// that the all-to-alls stay on the fastest links. Each dimension then only needs its own lesson, wired
// into the one model:
//   TP  07's f and g collectives (09's hooks, unchanged): under CP, on this rank's T/cp positions;
//   CP  10's ring (ring_attention_protocol.h), carrying this rank's NH/t heads under TP;
//   PP  08's executor, its messages the B*T/(cp t) rows of the stream a rank holds;
//   EP  11's exchange (expert_exchange.h), per micro-batch in flight: each rank routes the rows it
//       holds (under TP that needs sequence parallelism: each TP rank its own B*T/t rows), and its
//       tokens claim capacity in the one global order a single rank would use (moe.h).
// With --schedule dualpipev the pipeline runs each F&B pair's forward and backward at once, on two
// lanes (common/lanes.h): one micro-batch's all-to-alls travel while the other micro-batch computes,
// which is what DualPipe is for in DeepSeek-V3. Every group a pass talks to (TP, CP, EP, EDP) is then
// reached through a LaneCommunicator, each lane on its own copy of the group, and the ring and the
// exchange keep their scratch per lane.
// Gradients, each to its group: under SP the tensors held whole summed over TP, wte over the
// embedding group, experts averaged over their expert-data-parallel group, the rest over DP x CP.
// ZeRO-1 (--zero1) shards each where it averages: the dense optimizer state over DP x CP, the
// experts' over their expert-data-parallel group (one plan, two groups: GradientSync::zero1_plan).
// The losses and final parameters are one rank's.
//
// Base chapter: 09_3d_parallel (docs/diffs/12_5d_parallel.diff: what composing 10 and 11 into it adds).
//
// Run:
//   make 12_5d_parallel
//   mpiexec -n 4 ./12_5d_parallel/train --tp 2 --cp 2                                   # TP 2 x CP 2
//   mpiexec -n 4 ./12_5d_parallel/train --preset moe-tiny --tp 2 --pp 2 --ep 2 --sequence-parallel
//   mpiexec -n 8 ./12_5d_parallel/train --preset moe-tiny --cp 2 --tp 2 --pp 2 --ep 4 --sequence-parallel
//       (and --capacity-factor 1.0 to drop what overflows an expert)
//   mpiexec -n 4 ./12_5d_parallel/train --preset moe-tiny --ep 2 --zero1   # dense state over DP 4, experts' over 2
// Output: as 09, plus (MoE) per step the routed and dropped assignments per layer and expert and the
// balance loss, the same numbers as one rank of 11.
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "../10_context_parallel/ring_attention_protocol.h"  // RingAttention: 10's lesson
#include "../11_expert_parallel/expert_exchange.h"           // ExpertExchange: 11's lesson
#include "buckets.h"
#include "comm.h"
#include "comm_factory.h"
#include "context_split.h"
#include "data_parallel.h"
#include "device.h"
#include "grid_report.h"  // report_groups
#include "flags.h"
#include "lanes.h"  // lane_of, kLanes: dualpipev's F&B pairs at once
#include "memory.h"
#include "model.h"
#include "ops.h"
#include "optimizer.h"
#include "pipeline.h"
#include "pipeline_flags.h"
#include "pipeline_report.h"
#include "pipeline_schedule.h"
#include "process_grid.h"
#include "routing_log.h"  // RoutingLog: the ep row's theory from the routing
#include "shards.h"
#include "tensor_parallel_hooks.h"  // 07's collectives, for every chunk
#include "theory.h"  // predict_tensor_parallel, ring_sent_bytes, routing_counts_bytes
#include "training_run.h"

struct Options {
  int tp = 1;
  // --pp (default 1), --micro-batches, --schedule, --virtual-stages, --partition, --zero1: 08's
  PipelineFlags pipeline;
  bool sequence_parallel = false, overlap = false;
  std::string matching = "auto";
  double bucket_mb = 0;
  int cp = 1;
  std::string split = "zigzag";
  int ep = 1;
  double capacity_factor = 0, aux_loss_coef = 0.01;
};

namespace {

// Where each row a rank routes stands in the global micro-batch's token order (moe.h): its data
// rank's sequences come after the data ranks before it; under CP it holds `positions` of each, and
// under SP its TP rank's slice of those rows.
std::vector<int64_t> token_index_of(int data_rank, int micro_B, int T, const std::vector<int>& positions, int tp_rank,
                                    int tp_size, bool sequence_parallel) {
  const int64_t held = positions.empty() ? T : int64_t(positions.size()), rows = int64_t(micro_B) * held;
  const int64_t mine = sequence_parallel ? rows / tp_size : rows, first = sequence_parallel ? tp_rank * mine : 0;
  std::vector<int64_t> index;
  for (int64_t i = first; i < first + mine; i++) {
    const int64_t b = i / held, j = i % held;
    index.push_back((int64_t(data_rank) * micro_B + b) * T + (positions.empty() ? j : positions[size_t(j)]));
  }
  return index;
}

int runs_of(const std::vector<int64_t>& index) {
  int runs = 0;
  for (size_t i = 0; i < index.size(); i++) runs += i == 0 || index[i] != index[i - 1] + 1;
  return runs;
}

}  // namespace

int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  GPT2Config model_cfg;
  if (!find_preset(cfg.preset, &model_cfg)) config_error("--preset: unknown preset '" + cfg.preset + "'");
  const bool moe = model_cfg.moe();
  const int batch = cfg.was_given("--batch") ? cfg.batch : cfg.resume.empty() ? model_cfg.default_batch : 0;
  PipelineFlags flags = opt.pipeline;
  flags.tp = opt.tp, flags.cp = opt.cp, flags.ep = opt.ep, flags.splits_experts = true;
  if (!flags.pp) flags.pp = 1;
  PipelinePlan pipe;
  const std::string flags_problem = pipeline_flags_problem(flags, world.size(), model_cfg, batch, &pipe);
  if (!flags_problem.empty()) config_error(flags_problem);
  const Schedule schedule = pipe.schedule;
  const int t = flags.tp, p = pipe.shape.stages, m = pipe.shape.micro_batches, v = pipe.shape.chunks, cp = opt.cp;
  const std::vector<int>& blocks = pipe.blocks;
  const bool zero1 = flags.zero1, zero2 = flags.zero2;
  const bool sequence_parallel = opt.sequence_parallel && t > 1;
  // The refusals only this composition has, before any group exists.
  if (moe && t > 1 && !sequence_parallel)
    config_error("--preset " + cfg.preset + " is a mixture of experts: with --tp " + std::to_string(t) +
                 " each rank of a tensor-parallel group must route rows of its own; add --sequence-parallel");
  if (!moe && opt.ep > 1)
    config_error("--ep " + std::to_string(opt.ep) + " spreads a mixture of experts: pass a MoE --preset (moe-tiny, "
                 "moe-small) or --ep 1");
  for (const char* flag : {"--capacity-factor", "--aux-loss-coef"})
    if (!moe && cfg.was_given(flag))
      config_error(std::string(flag) + " sets a mixture of experts' routing: --preset " + cfg.preset +
                   " is dense; pass a MoE --preset (moe-tiny, moe-small) or leave it out");
  if (cp == 1 && cfg.was_given("--cp-split"))
    config_error("--cp-split chooses which positions each of --cp ranks holds: at --cp 1 one rank holds them all; "
                 "leave it out or pass --cp 2 or more");
  if (t == 1 && world.rank() == 0)
    for (const char* flag : {"--sequence-parallel", "--tp-overlap"})
      if (cfg.was_given(flag))
        std::printf("note: %s does nothing at --tp 1 (one rank per tensor-parallel group holds every row and "
                    "product); running without it\n", flag);
  cfg.grad_accum = m;

  // The grid: TP innermost, then CP, DP, PP outermost; experts folded over each stage's ranks.
  ProcessGrid grid(world, grid_shape(world.size(), t, p, cp, opt.ep));
  const GridCoords& at = grid.coords();
  const TensorParallelism tp{t, at.tp, sequence_parallel};
  ContextSplit split;
  parse_context_split(opt.split, &split);  // (checked in main)
  std::vector<std::vector<int>> positions;
  for (int r = 0; r < cp; r++) positions.push_back(context_positions(model_cfg.T, cp, r, split));
  ContextParallelism held;
  if (cp > 1) held = {cp, at.cp, positions[size_t(at.cp)]};
  const int T_held = cp > 1 ? model_cfg.T / cp : model_cfg.T;

  const PipelineShape& shape = pipe.shape;
  const Matching matching = pipeline_matching(opt.matching, grid.pp(), shape);
  const int rank = at.pp;
  std::vector<std::vector<Action>> every_rank;
  for (int r = 0; r < p; r++) every_rank.push_back(build_schedule(schedule, shape, r, matching));
  const std::string problem = check_pipeline(schedule, shape, every_rank, matching);
  if (!problem.empty()) config_error("the " + flags.schedule + " schedule is unsound: " + problem);
  const std::vector<Action>& actions = every_rank[rank];
  std::vector<ModelPart> parts = parts_of_rank(model_cfg, blocks, p, rank, shape.placement);
  for (int c = 0; c < v; c++) {
    parts[c].slots = max_in_flight(actions, c);
    parts[c].split_backward = splits_backward(schedule);
  }
  // dualpipev's F&B pairs at once (--fb-overlap, on by default): a pair's forward and backward talk
  // to the same groups from two threads, so each lane gets its own copy of every group a pass uses
  // (lanes.h; the grid keeps them, and the run counts both under the group's name), and the scratch
  // beside them is per lane. (DP x CP only ever hears from the backward lane.)
  const bool fb_overlap = fb_overlap_runs(pipe, matching, world.device(), world.rank() == 0);
  if (fb_overlap) grid.give_each_lane_its_groups();

  const bool sharded = zero1 || zero2;
  const MoESettings moe_settings{opt.capacity_factor, opt.aux_loss_coef};
  PipelineParallelism pipeline_split{p, rank, parts, zero2, actions};
  pipeline_split.fb_overlap = fb_overlap;
  TrainingRun run(grid, cfg, Parallelism{sharded ? Strategy::ZeRO1 : Strategy::DP, tp, pipeline_split, held,
                              ExpertParallelism{opt.ep, at.ep}, moe ? &moe_settings : nullptr});
  const Device device = run.device();
  const DType dtype = run.dtype();
  const ParamLayout& layout = run.layout();
  const GPT2Config& run_cfg = run.model_config();
  const int micro_B = run.micro_batch_size();
  Communicator& replicas = grid.dp_cp();  // the ranks that hold this rank's dense parameters
  print_partition(run, model_cfg, blocks, p, shape.placement);

  Communicator& tp_group = grid.tp();
  Communicator& cp_group = grid.cp();
  Communicator& ep_group = grid.ep();
  Communicator& expert_dp_group = grid.expert_dp();

  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype), sharded ? BucketCut::AtLayers : BucketCut::AtTensors,
                          /*experts_apart=*/moe);
  // ZeRO-1: the dense buckets sharded over DP x CP, a MoE model's expert buckets over their replicas.
  const ShardPlan plan = sharded ? GradientSync::zero1_plan(buckets, replicas, moe ? &grid.expert_dp() : nullptr)
                                 : ShardPlan::unsharded(layout);
  Buffer grad_shard(sharded ? plan.size() : 0, MemCategory::CommBuffers, dtype, device);
  GradientSync data_parallel(replicas, buckets, grads.view(), sharded ? &plan : nullptr, grad_shard.view());
  // An expert's gradient sums the tokens of its whole EP group; averaged over its EDP replicas it must
  // come out as the mean over the DP x CP data replicas: EDP / (DP x CP) = TP / EP.
  if (moe) data_parallel.set_expert_group(expert_dp_group, float(t) / float(opt.ep));
  AdamW optimizer(layout, plan, cfg.weight_decay, device, dtype);
  std::vector<std::unique_ptr<GPT2>> models;
  std::vector<GPT2*> chunks;
  for (const ModelPart& part : parts) {
    models.push_back(std::make_unique<GPT2>(run_cfg, layout, micro_B, device, dtype, tp, part, held));
    models.back()->bind_all(params.data(), grads.data());
    chunks.push_back(models.back().get());
  }
  const int start = run.init_or_resume(params, optimizer);
  PipelineExecutor pipeline(grid.pp(), chunks, shape, actions, matching, micro_B, T_held, model_cfg.C, device, dtype);
  pipeline.overlap_pairs(fb_overlap);
  PipelineReport report(run, grid, shape, schedule, matching, parts);

  // TP: 07's collectives in every chunk, as 09 wires them (tensor_parallel_hooks.h).
  for (GPT2* chunk : chunks) chunk->tp_hooks = tensor_parallel_hooks(tp_group, sequence_parallel, opt.overlap);

  // CP: 10's ring, over this rank's heads (NH/t of them, C/t channels a head group): one per lane
  // with pairs at once, each on its lane's communicator, with its own blocks in flight.
  std::vector<std::unique_ptr<RingAttention>> rings;
  if (held.on()) {
    for (int lane = 0; lane < (fb_overlap ? kLanes : 1); lane++) {
      rings.push_back(std::make_unique<RingAttention>(lane_of(cp_group, Lane(lane)), positions, micro_B, model_cfg.C / t,
                                                      model_cfg.NH / t));
    }
    for (GPT2* chunk : chunks) {
      chunk->cp_hooks.attention_forward = [&](Tensor out, Tensor lse, Tensor qkv, int NH) {
        rings[size_t(lane_index())]->forward(out, lse, qkv, NH);
      };
      chunk->cp_hooks.attention_backward = [&](Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
        rings[size_t(lane_index())]->backward(dqkv, dout, qkv, out, lse, NH);
      };
    }
  }

  // EP: 11's exchange, one routing per micro-batch in flight: per chunk and activation slot, so that
  // the two passes of a pair (another chunk each) never share one. Every rank of the stage routes its
  // own rows; their counts are gathered over the stage (EP, then EDP: edp x EP + ep is the stage's
  // order).
  std::unique_ptr<ExpertExchange> exchange;
  // The rows this rank's experts ran, per micro-batch and block: the activations' theory at this step's
  // routing (TrainingRun::end_step).
  std::vector<std::vector<int64_t>> expert_rows(size_t(m), std::vector<int64_t>(size_t(run_cfg.L), 0));
  int running_micro = 0;  // the forward's (a pair's backward runs beside it)
  std::vector<int32_t> gathered_in_ep, gathered_in_stage;
  std::unique_ptr<RoutingLog> routing;  // the step's routing per micro-batch and block (the "routing" records)
  const int stage_ranks = grid.ep().size() * grid.expert_dp().size();
  int slots = 1;  // per chunk: chunk c's slot s is the exchange's c x slots + s
  for (const ModelPart& part : parts) slots = std::max(slots, part.slots);
  if (moe) {
    exchange = std::make_unique<ExpertExchange>(ep_group, *chunks.front(), run_cfg.L, run_cfg.experts, run_cfg.C,
                                                v * slots);
    int max_runs = 1;  // the most runs of any rank of the stage: the records' common size
    for (int d = 0; d < grid.shape().dp; d++)
      for (int c = 0; c < cp; c++)
        for (int r = 0; r < t; r++)
          max_runs = std::max(max_runs, runs_of(token_index_of(d, micro_B, model_cfg.T, cp > 1 ? positions[size_t(c)] : std::vector<int>{},
                                                               r, t, sequence_parallel)));
    routing = std::make_unique<RoutingLog>(m, run_cfg.L, run_cfg.experts, run_cfg.top_k, run_cfg.capacity_factor,
                                           stage_ranks, 1 + int64_t(max_runs) * (2 + run_cfg.experts));
    for (int c = 0; c < v; c++) {
      ExpertHooks& hooks = chunks[size_t(c)]->expert_hooks;
      hooks.rank = at.edp * opt.ep + at.ep;
      hooks.ranks = stage_ranks;
      hooks.token_index = token_index_of(at.dp, micro_B, model_cfg.T, held.positions, at.tp, t, sequence_parallel);
      hooks.max_runs = max_runs;
      hooks.gather_counts = [&](Tensor mine, Tensor all) {  // (int32 records on the host, as moe.cpp keeps them)
        gathered_in_ep.resize(size_t(mine.numel() * ep_group.size()));  // (the forward's alone: routing)
        const Tensor in_ep = make_view(gathered_in_ep.data(), {int64_t(gathered_in_ep.size())}, DType::I32);
        ep_group.all_gather(mine, in_ep);
        expert_dp_group.all_gather(in_ep, all);
        gathered_in_stage.assign(all.i32(), all.i32() + all.numel());
      };
      hooks.experts_forward = [&, c](int slot, int l, Tensor rows, const std::vector<int64_t>& counts, Tensor out) {
        routing->keep(running_micro, l, gathered_in_stage.data());
        exchange->forward(c * slots + slot, l, rows, counts, out);
        expert_rows[size_t(running_micro)][size_t(l)] = exchange->expert_rows(c * slots + slot)[size_t(l)];
      };
      hooks.experts_backward = [&, c](int slot, int l, Tensor dout, Tensor drows) {
        exchange->backward(c * slots + slot, l, dout, drows);
      };
    }
  }

  // Gradients: 09's three groups, and the experts' own (set_expert_group above).
  const int wte = layout.find("wte");
  Communicator* embedding = shape.placement == Placement::V ? nullptr : grid.embedding();
  bool last_micro_batch = false;
  CommHandle wte_sum;
  if (zero2) data_parallel.set_every_micro_batch(embedding && layout.params[wte].held() ? wte : -1);
  std::vector<std::pair<int, CommHandle>> summing;  // (backward passes only: one lane at a time)
  auto finish_tp_sums = [&] {
    for (auto& [param, handle] : summing) {
      handle.wait();
      data_parallel.gradient_ready(param);
    }
    summing.clear();
  };
  // A pair's forward and backward call this at once, each in its lane (pipeline.h): the forward sets
  // what its experts record under, the backward passes whether their gradients communicate.
  pipeline.before_compute = [&](const Action& a) {
    if (a.op == Op::F) running_micro = a.micro;
    else last_micro_batch = a.micro == m - 1;
    if (zero2 && a.op == Op::B) data_parallel.micro_batch_done();
  };
  const bool rank_holds_embedding = chunks.front()->has_embedding();
  for (GPT2* chunk : chunks) {
    const bool wte_not_final_here = rank_holds_embedding && !chunk->has_embedding();
    chunk->hooks.grad_ready = [&, wte_not_final_here](int param) {
      if (param == wte && wte_not_final_here) return;
      if (!last_micro_batch && !zero2) return;
      const ParamInfo& info = layout.params[param];
      // An expert is whole on every TP rank but holds other tokens' gradients there: not a TP sum.
      if (sequence_parallel && info.shard.whole() && info.expert < 0) {
        summing.emplace_back(param, tp_group.all_reduce_async(grads.view().slice1d(info.offset, info.size), ReduceOp::Sum));
        return;
      }
      if (param == wte && embedding) {
        if (!last_micro_batch) return;
        wte_sum = embedding->all_reduce_async(grads.view().slice1d(info.offset, info.size), ReduceOp::Sum);
        return;
      }
      data_parallel.gradient_ready(param);
    };
    chunk->hooks.after_backward = [&](int) { finish_tp_sums(); };
  }

  // Under CP, each micro-batch's tokens at this rank's positions, kept until its backward.
  std::vector<std::vector<int>> inputs(static_cast<size_t>(m)), targets(static_cast<size_t>(m));
  auto micro_batch = [&](int step, int micro) {
    MicroBatch batch = run.micro_batch(step, micro);
    if (!held.on()) return batch;
    std::vector<int>& in = inputs[size_t(micro)];
    std::vector<int>& out = targets[size_t(micro)];
    in.resize(size_t(batch.B) * T_held), out.resize(in.size());
    gather_positions(batch.inputs, batch.B, model_cfg.T, held.positions, in.data());
    gather_positions(batch.targets, batch.B, model_cfg.T, held.positions, out.data());
    batch.inputs = in.data(), batch.targets = out.data();
    return batch;
  };

  // What each group sends in a step, against its formula (grid_report.h; docs/theory.md, section 17).
  struct GroupStats {
    CommStats tp, cp, dp_cp, ep, expert_dp;
  };
  auto group_stats = [&] {
    return GroupStats{tp_group.stats(), cp_group.stats(), replicas.stats(), ep_group.stats(), expert_dp_group.stats()};
  };
  int held_blocks = 0;  // this rank's blocks, every chunk
  for (const ModelPart& part : parts)
    for (int u = part.first_unit; u <= part.last(model_cfg); u++) held_blocks += u >= 1 && u <= model_cfg.L;
  const int64_t expert_range = layout.expert_range_size;  // the experts' elements (their tensors and padding)
  const double w = double(dtype_size(dtype));
  const int N = replicas.size(), D = grid.expert_dp().size(), P = grid.ep().size();
  const int64_t record = moe ? chunks.front()->expert_hooks.record_size(run_cfg.experts) : 0;
  GPT2Config held_cfg = run_cfg;  // every TP collective carries this rank's T/cp positions
  held_cfg.T = T_held;
  std::vector<std::pair<std::string, std::string>> formulas = {
      {"tp", "per micro-batch 09's TP collectives on T/cp positions, + the tensors held whole, once (every micro-batch "
             "under --zero2; theory.h, predict_tensor_parallel)"},
      {"cp", "(2 x passes + 4) (cp-1)/cp x L' m B T C/t x 4: K and V forward, again with their gradients backward"},
      {"dp_cp", zero2 ? "m reduce-scatters (wte's bucket: 1) + all-gather over DP x CP: (N-1)/N x w(m(Ψ'-E) + E + Ψ'), "
                        "Ψ' = padded - experts"
                : sharded ? "reduce-scatter + all-gather over DP x CP: 2(N-1)/N x w x (padded - experts)"
                          : "all-reduce over DP x CP: 2(N-1)/N x w x (padded - experts)"}};
  if (moe) {
    formulas.push_back({"expert_dp", std::string(zero2     ? "m reduce-scatters + all-gather: (m+1)(D-1)/D"
                                                 : sharded ? "reduce-scatter + all-gather: 2(D-1)/D"
                                                           : "all-reduce: 2(D-1)/D") +
                                         " x 4 x experts' ranges + the counts' second gather: L' m (D-1) ep rec x 4"});
    formulas.push_back({"ep", "the all-to-alls at this step's routing (11) + the counts' first gather: L' m (ep-1) rec x 4"});
    formulas.push_back({"expert_params", "L' x E/ep x (8C^2 + 5C) x 4"});
  }
  auto group_rows = [&](const GroupStats& at_start) {
    const GroupStats now = group_stats();
    TensorParallelPrediction tp_theory = predict_tensor_parallel(held_cfg, micro_B, tp, dtype, parts);
    const TensorParallelPrediction whole = predict_tensor_parallel(run_cfg, micro_B, tp, dtype, parts);
    const double dense_dp = zero2 ? data_parallel.every_micro_batch_sent_bytes(m, layout.padded_size - expert_range, w)
                                  : 2.0 * (N - 1) / N * w * double(layout.padded_size - expert_range);
    // The experts' buckets: all-reduced, or reduce-scattered (every micro-batch under --zero2) and gathered.
    const double expert_passes = zero2 ? m + 1 : 2;
    std::vector<GroupRow> rows = {
        {"tp", double(now.tp.since(at_start.tp).training_sent_bytes()),
         t > 1 ? m * tp_theory.bytes_per_micro_batch + whole.partial_grad_bytes * (zero2 ? m : 1) : 0.0},
        {"cp", double(now.cp.since(at_start.cp).training_sent_bytes()),
         ring_sent_bytes(run_cfg, held_blocks, m, micro_B, cp, t) * (cp > 1 ? 1 : 0)},
        {"dp_cp", double(now.dp_cp.since(at_start.dp_cp).training_sent_bytes()), dense_dp}};
    if (moe) {
      double expert_params = 0;
      for (const ParamInfo& p : layout.params)
        if (p.expert >= 0) expert_params += 4.0 * double(p.size);
      const double C = run_cfg.C;
      rows.push_back({"expert_dp", double(now.expert_dp.since(at_start.expert_dp).training_sent_bytes()),
                      expert_passes * (D - 1) / D * 4 * double(expert_range) +
                          routing_counts_bytes(held_blocks, m, D, P, record)});
      rows.push_back({"ep", double(now.ep.since(at_start.ep).training_sent_bytes()),
                      routing->a2a_sent_bytes(at.edp * opt.ep + at.ep, opt.ep, run_cfg.C) +
                          routing_counts_bytes(held_blocks, m, P, 1, record)});
      rows.push_back({"expert_params", expert_params,
                      double(held_blocks) * (run_cfg.experts / opt.ep) * (8 * C * C + 5 * C) * 4});
    }
    return rows;
  };

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grads.view());
    if (zero2) fill_zero(grad_shard.view());
    for (auto& ring : rings) ring->counters = RingCounters{};
    if (exchange) exchange->reset_predictions(), routing->clear();
    const GroupStats before = group_stats();
    const float loss = pipeline.run([&](int micro) { return micro_batch(step, micro); });
    finish_tp_sums();
    if (wte_sum.valid()) {
      wte_sum.wait();
      wte_sum = CommHandle();
      data_parallel.gradient_ready(wte);
    }
    data_parallel.finish();

    // The norm: each gradient counted once over the grid. A dense tensor on its first data replica
    // (DP and CP rank 0; under ZeRO-1 every replica's own piece), wte on the first stage, a tensor held
    // whole on TP rank 0; an expert on the first replica of its holders (EDP rank 0; under ZeRO-1
    // every holder's own piece).
    const Tensor my_grads = sharded ? grad_shard.view() : grads.view();
    const bool second_wte = rank != 0 && layout.params[wte].held();
    const bool first_replica = sharded || (at.dp == 0 && at.cp == 0);
    const double squares = gradient_squares(layout, plan, my_grads, [&](const ParamInfo& info) {
      if (info.expert >= 0) return sharded || at.edp == 0;
      return first_replica && !(second_wte && info.name == "wte") && (tp.rank == 0 || !info.shard.whole());
    });
    const double norm = std::sqrt(grid.world().all_reduce_scalar(squares, ReduceOp::Sum));
    optimizer.update(params.view(), my_grads, step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    if (sharded) data_parallel.gather_parameters(params.view());

    // MoE: the step's routing, summed over its micro-batches, each stage its own blocks: one record
    // of every layer and expert, as 11 writes it.
    if (moe) {
      const int L = run_cfg.L, E = run_cfg.experts;
      Buffer counts(2 * int64_t(L) * E, MemCategory::Other);  // routed, then dropped (exact in fp32 below 2^24)
      const bool speaks = at.dp == 0 && at.cp == 0 && at.tp == 0;  // one rank per stage
      for (size_t c = 0; c < chunks.size() && speaks; c++)
        for (int l = 0; l < L; l++) {
          if (!parts[c].holds(run_cfg, l + 1)) continue;
          for (int e = 0; e < E; e++) {
            counts.f32()[l * E + e] += float(chunks[c]->routed_total(l)[size_t(e)]);
            counts.f32()[L * E + l * E + e] += float(chunks[c]->dropped_total(l)[size_t(e)]);
          }
        }
      for (GPT2* chunk : chunks) chunk->reset_routing_totals();
      exchange->release_buffers();
      grid.world().all_reduce(counts.view(), ReduceOp::Sum);
      JsonObject record;
      record.add("type", "experts").add("step", step).add("layers", L).add("experts", E);
      for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
          const std::string at_le = "_L" + std::to_string(l) + "_E" + std::to_string(e);
          record.add("routed" + at_le, double(counts.f32()[l * E + e]));
          record.add("dropped" + at_le, double(counts.f32()[L * E + l * E + e]));
        }
      run.write_record(record);
      routing->write_records(run, grid.world(), step, rank, speaks);
    }

    report.add_step(step, pipeline.times());
    run.end_step(step, loss, norm, expert_rows);
    // After step 1 (or the only step), every rank's groups next to their formulas.
    if (step == std::max(start, 1) || (start + 1 >= cfg.steps && step == start)) report_groups(run, world, group_rows(before), formulas);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;
  }
  report.finish(tied_copies_equal(embedding, params.view(), layout));
  return run.finish();
}

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  PipelineFlags& pipe = opt.pipeline;
  flags.add("--tp", &opt.tp, "ranks in a tensor-parallel group, innermost (default 1)");
  flags.add("--cp", &opt.cp, "ranks in a context-parallel ring, next to TP (default 1)");
  flags.add("--cp-split", &opt.split, "which positions a CP rank holds: zigzag (default) or contiguous", "SPLIT");
  flags.add("--pp", &pipe.pp, "pipeline stages, outermost (default 1); the rest is data-parallel");
  flags.add("--ep", &opt.ep, "expert-parallel group size, folded over each stage's DP x CP x TP ranks (MoE presets; "
                         "default 1)");
  flags.add("--capacity-factor", &opt.capacity_factor, "an expert takes at most factor x tokens x k / E assignments "
                                                   "of a global micro-batch (0: unlimited)");
  flags.add("--aux-loss-coef", &opt.aux_loss_coef, "coefficient of the load-balancing loss E x sum_e f_e P_e");
  flags.add_switch("--sequence-parallel", &opt.sequence_parallel,
                   "split the rows between the parallel products too (a MoE preset with --tp needs it)");
  flags.add_switch("--tp-overlap", &opt.overlap,
                   "in backward, sum the input's gradient while the weight's gradient is computed");
  add_schedule_flags(flags, &pipe, &opt.matching);  // --micro-batches, --schedule, ... (pipeline_flags.h)
  flags.add("--bucket-mb", &opt.bucket_mb, "data-parallel bucket size in MB (default: an eighth of the gradient)");
  flags.add("--tp-link-gbps", &cfg.tp_link_gbps, "the tensor-parallel group's emulated link (default: --link-gbps's)");
  flags.add("--tp-link-latency-us", &cfg.tp_link_latency_us, "its latency (default: --link-latency-us's)");
  if (!parse_train_flags(argc, argv, "12_5d_parallel",
                         "Chapter 12: data x context x tensor x pipeline x expert parallelism on one grid.", flags,
                         &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  check_schedule_flags(cfg, pipe);
  if (cfg.was_given("--bucket-mb") && !(opt.bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  if (opt.tp < 1) config_error("--tp must be >= 1");
  if (opt.cp < 1) config_error("--cp must be >= 1");
  if (opt.ep < 1) config_error("--ep must be >= 1");
  if (!(opt.capacity_factor >= 0)) config_error("--capacity-factor must be >= 0 (0: unlimited)");
  if (!(opt.aux_loss_coef >= 0)) config_error("--aux-loss-coef must be >= 0");
  ContextSplit split;
  if (!parse_context_split(opt.split, &split))
    config_error("--cp-split: '" + opt.split + "' is neither zigzag nor contiguous");
  GPT2Config preset;
  if (!find_preset(cfg.preset, &preset))
    config_error("--preset: unknown preset '" + cfg.preset + "' (choose from " + preset_names() + ")");
  const std::string split_problem = context_split_problem(preset.T, opt.cp, split, comm->size());
  if (!split_problem.empty()) config_error(split_problem);
  // The ring and the experts run on the CPU in this project (docs/context_parallel.md, moe.h).
  if ((opt.cp > 1 || preset.moe()) && cfg.device == "cuda")
    config_error("--device cuda with " + std::string(opt.cp > 1 ? "--cp > 1" : "a MoE preset") +
                 ": ring attention and the experts run on the CPU only in this project; pass --device cpu");
  if ((opt.cp > 1 || preset.moe()) && cfg.device == "auto") cfg.device = "cpu";
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
