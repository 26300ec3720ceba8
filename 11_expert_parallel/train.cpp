// Chapter 11: expert parallelism. A mixture-of-experts GPT-2 whose experts are spread over ranks,
// tokens travelling to their experts and back by all-to-all.
//
// The idea. The ep ranks of a group hold E/ep experts each, and each MoE layer moves the tokens, not
// the weights: an all-to-all dispatches each token's rows to its experts' ranks, another combines
// the outputs back (expert_exchange.h). An expert's gradient is averaged over its holders only.
// What to notice: per step, each expert's tokens and drops, and the all-to-all bytes next to theory.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Base chapter: 03_bucket_dp (docs/diffs/11_expert_parallel.diff: what this chapter adds to it).
//
// Run:
//   make 11_expert_parallel && mpiexec -n 4 ./11_expert_parallel/train --ep 2   # DP 2 x EP 2, moe-tiny
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "comm/wire_format.h"  // the gradients in the recipe's format (fp32: as they are)
#include "ops/device.h"
#include "training/chapter_main.h"  // run_chapter: main(), flags and checks
#include "training/flags.h"
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/parallelize.h"  // apply_expert_parallel: the exchange installed on the model
#include "parallel/shards.h"
#include "training/training_run.h"

#include "expert_exchange.h"  // ExpertExchange: the lesson's all-to-alls
#include "training/expert_report.h"
#include "model/moe.h"
#include "comm/process_grid.h"

namespace {

// A bucket's ranges by group: runs of expert tensors go to the expert-data-parallel group, the rest
// to the world. Padding between tensors travels with the run before it (it is zero either way).
struct Segment {
  int64_t begin, end;
  bool experts;
};
std::vector<Segment> segments_of(const ParamLayout& layout, int64_t begin, int64_t end) {
  std::vector<Segment> out;
  for (const ParamInfo& p : layout.params) {
    if (!p.held() || p.offset < begin || p.offset >= end) continue;
    const bool experts = p.expert >= 0;
    if (out.empty() || out.back().experts != experts) out.push_back({p.offset, p.offset, experts});
  }
  if (out.empty()) return {{begin, end, false}};
  out.front().begin = begin;
  for (size_t i = 0; i + 1 < out.size(); i++) out[i].end = out[i + 1].begin;
  out.back().end = end;
  return out;
}

}  // namespace

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  double bucket_mb = 0;
  double capacity_factor = 0, aux_loss_coef = 0.01;
  int ep = 1;

  void declare(FlagParser& flags, TrainConfig& cfg) {
    cfg.preset = "moe-tiny";  // a mixture of experts by default
    cfg.device = "cpu";       // the lesson runs on the CPU; --device cuda moves it, in fp32, to a GPU
    flags.add("--bucket-mb", &bucket_mb, "target bucket size in MB, a bucket holding whole tensors (default: an "
                                         "eighth of the gradient)");
    flags.add("--ep", &ep, "expert-parallel group size: each of its ranks holds E/ep experts of every block; "
                           "the world is expert-DP x EP");
    flags.add("--capacity-factor", &capacity_factor, "an expert takes at most factor x tokens x k / E assignments "
                                                     "of a global micro-batch, the rest are dropped (0: unlimited)");
    flags.add("--aux-loss-coef", &aux_loss_coef, "coefficient of the load-balancing loss E x sum_e f_e P_e");
  }
  void check(TrainConfig& cfg, int ranks) {
    if (cfg.was_given("--bucket-mb") && !(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
    if (!(capacity_factor >= 0)) config_error("--capacity-factor must be >= 0 (0: unlimited)");
    if (!(aux_loss_coef >= 0)) config_error("--aux-loss-coef must be >= 0");
    // Every check before the first collective, the same on every rank.
    GPT2Config preset;
    if (!find_preset(cfg.preset, &preset))
      config_error("--preset: unknown preset '" + cfg.preset + "' (choose from " + preset_names() + ")");
    // The experts first (the expert dimension's refusal, 12's too), then the ranks.
    std::string grid_problem = expert_count_problem(preset, ep, ranks);
    if (grid_problem.empty()) grid_problem = expert_grid_problem(ranks, ep, preset.experts, cfg.preset);
    if (!grid_problem.empty()) config_error(grid_problem);
    const std::string moe_problem = moe_run_problem(cfg.preset, "11_expert_parallel", pick_device(cfg.device), true,
                                                    ranks, 1, 1, cfg.recompute);
    if (!moe_problem.empty()) config_error(moe_problem);
    const Device device = pick_device(cfg.device);
    if (device == Device::CUDA) {  // the MoE layer runs in fp32 on a GPU too (moe.h)
      if (cfg.dtype == "bf16")
        config_error("--dtype bf16 with a mixture of experts on a GPU: the MoE layer runs in fp32; pass --dtype fp32");
      cfg.dtype = "fp32";
    }
  }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  const int ep = opt.ep;
  ProcessGrid grid(world, grid_shape(world.size(), /*tp*/ 1, /*pp*/ 1, /*cp*/ 1, ep));
  // The capacity factor and balance loss the run trains with: the flags', or a resumed checkpoint's.
  const MoESettings moe{opt.capacity_factor, opt.aux_loss_coef};
  Parallelism parallelism;  // data parallelism (DP), each rank holding E/ep experts
  // gather_counts, below, runs over everyone: the data-parallel group carries the routing counts.
  parallelism.ep = {ep, grid.ep().rank(), /*replicas*/ 1, /*routing_counts_over_data_group*/ true};
  parallelism.moe = &moe;
  TrainingRun run(grid, cfg, parallelism);
  Communicator& everyone = grid.dp();  // (TP, CP and PP are 1: every rank is a data rank)
  const ParamLayout& layout = run.layout();
  const GPT2Config& model_cfg = run.model_config();
  const int L = model_cfg.L, E = model_cfg.experts;

  // Every rank holds the non-expert parameters and its E/ep experts, with their gradients and state.
  Buffer params(layout.padded_size, MemCategory::Params);
  Buffer grads(layout.padded_size, MemCategory::Grads);
  AdamW optimizer(layout, ShardPlan::unsharded(layout), cfg.weight_decay, Device::CPU, DType::F32);
  GPT2 model(model_cfg, layout, run.micro_batch_size());
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);

  // The lesson, 1: the model's MoE layers hand their tokens to the exchange.
  ExpertExchange exchange(grid.ep(), model, L, E, model_cfg.C);
  ExpertHooks expert_hooks;
  expert_hooks.rank = everyone.rank();  // the data order: rank 0's sequences first (data.h)
  expert_hooks.ranks = everyone.size();
  expert_hooks.gather_counts = [&](Tensor mine, Tensor all) { everyone.all_gather(mine, all); };
  expert_hooks.experts_forward = [&](int slot, int l, Tensor rows, const std::vector<int64_t>& counts, Tensor out) {
    exchange.forward(slot, l, rows, counts, out);
  };
  expert_hooks.experts_backward = [&](int slot, int l, Tensor dout, Tensor drows) {
    exchange.backward(slot, l, dout, drows);
  };
  parallelize({&model}, {apply_expert_parallel({expert_hooks})});  // installed on the model (parallelize.h)

  const double bucket_bytes = cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, 4);
  GradientBuckets buckets(layout, bucket_bytes, 4);
  if (run.is_root()) {
    // The world as the experts see it, expert-DP x EP (the rest of the model is data-parallel over all of it).
    const std::string expert_grid =
        "DP " + std::to_string(grid.expert_dp().size()) + " x EP " + std::to_string(grid.ep().size());
    const int64_t micro_tokens = int64_t(cfg.batch / cfg.grad_accum) * model_cfg.T;  // the capacity's (moe.h)
    const int64_t capacity = MoELayer::capacity_of(model_cfg.capacity_factor, micro_tokens, model_cfg.top_k, E);
    std::printf("grid: %s (TP 1, PP 1, CP 1 here: 12_5d_parallel composes them with experts) | %d experts per block, %d on each rank | "
                "top-%d | capacity factor %g (%s) | balance loss x %g | %d buckets\n",
                expert_grid.c_str(), E, E / ep, model_cfg.top_k, model_cfg.capacity_factor,
                capacity < 0 ? "unlimited"
                             : (std::to_string(capacity) + " per expert of the " + std::to_string(micro_tokens) +
                                " tokens of a global micro-batch").c_str(),
                model_cfg.aux_loss_coef, buckets.count());
  }
  const int W = world.size();
  // The theory's calls, as the lesson below issues them: each bucket's runs, the experts' over their
  // group, the rest over everyone (under --collectives each call's algorithm follows its size).
  ExpertGradientCalls calls{run.dimension_context().collectives, {}, {}, everyone.rank(), grid.expert_dp().rank()};
  for (int b = 0; b < buckets.count(); b++)
    for (const Segment& s : segments_of(layout, buckets.begin(b), buckets.end(b)))
      (s.experts ? calls.expert_dp : calls.world).push_back(s.end - s.begin);
  run.set_gradient_all_reduces(calls.world, calls.expert_dp);
  const ExpertTheory theory = expert_theory(layout, model_cfg, W, ep, run.micro_batch_size(), cfg.grad_accum,
                                            collective_formats(world), calls);

  // The lesson, 2: when a bucket is final, average its expert ranges over the ranks that hold the
  // same experts, and the rest over everyone.
  std::vector<CommHandle> in_flight;
  std::vector<Segment> expert_segments;
  bool last_micro_batch = false;
  model.hooks.grad_ready = [&](int p) {
    if (!last_micro_batch) return;  // no_sync: gradients are not final until the last micro-batch
    const int b = buckets.mark_ready(p);
    if (b < 0) return;
    for (const Segment& s : segments_of(layout, buckets.begin(b), buckets.end(b))) {
      Communicator& group = s.experts ? grid.expert_dp() : everyone;
      in_flight.push_back(wire_all_reduce_async(group, grads.view().slice1d(s.begin, s.end - s.begin), ReduceOp::Avg,
                                                collective_formats(group).gradients));
      if (s.experts) expert_segments.push_back(s);
    }
  };

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grads.view());
    exchange.reset_predictions();
    const CommStats ep_before = grid.ep().stats(), world_before = everyone.stats(), edp_before = grid.expert_dp().stats();
    // Each micro-batch is routed on its own: its capacity and balance loss are its own (moe.h).
    ExpertStep measured;
    std::vector<std::vector<int64_t>> expert_rows;
    float loss = 0;
    double aux = 0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
      last_micro_batch = micro == cfg.grad_accum - 1;
      MicroBatch batch = run.micro_batch(step, micro);
      loss += model.forward(batch.inputs, batch.targets, batch.B) / cfg.grad_accum;
      aux += model.aux_loss() / cfg.grad_accum;
      measured.routing.emplace_back();
      for (int l = 0; l < L; l++) measured.routing.back().push_back(model.routing(l));
      model.backward(1.0f / cfg.grad_accum);
      expert_rows.push_back(exchange.expert_rows());
    }
    exchange.release_buffers();
    const double balance = world.all_reduce_scalar(aux, ReduceOp::Sum) / W;

    for (CommHandle& handle : in_flight) handle.wait();
    in_flight.clear();
    buckets.reset();
    // An expert's gradient summed the losses of the ep ranks whose tokens it served: averaged over
    // its dp group, it is still ep times the world's average.
    for (const Segment& s : expert_segments) scale_inplace(grads.view().slice1d(s.begin, s.end - s.begin), 1.0f / ep);
    expert_segments.clear();

    // The norm: the shared gradient is the same everywhere, the experts' parts add over the EP group.
    double dense_sq = 0, expert_sq = 0;
    for (const Segment& s : segments_of(layout, 0, layout.padded_size))
      (s.experts ? expert_sq : dense_sq) += sum_of_squares(grads.view().slice1d(s.begin, s.end - s.begin));
    const double norm = std::sqrt(dense_sq + grid.ep().all_reduce_scalar(expert_sq, ReduceOp::Sum));
    optimizer.update(params.view(), grads.view(), step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    run.end_step(step, loss, norm, expert_rows);

    // What the reader sees: routing per layer and expert, the balance loss, the all-to-alls, and
    // after step 1 the memory per rank and each group's gradient bytes (expert_report.h).
    measured.step = step;
    measured.balance_loss = balance;
    measured.a2a = grid.ep().stats().since(ep_before).kind[int(CollectiveKind::AllToAll)];
    measured.a2a_predicted_bytes = exchange.predicted_sent_bytes();
    measured.a2a_link_model_ms = exchange.predicted_link_ms();
    measured.world_all_reduce_bytes = everyone.stats().since(world_before).kind[int(CollectiveKind::AllReduce)].sent_bytes;
    measured.expert_dp_all_reduce_bytes =
        grid.expert_dp().stats().since(edp_before).kind[int(CollectiveKind::AllReduce)].sent_bytes;
    const bool memory_too = step == start + 1 || (start + 1 >= cfg.steps && step == start);
    report_expert_step(run, grid.ep(), model, measured, theory, ep, grid.expert_dp().size(), memory_too, cfg.quiet);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;  // Ctrl-C or a diverging loss: every rank agreed to stop here
  }
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "11_expert_parallel",
                     "Chapter 11: expert parallelism, a mixture of experts over ranks by all-to-all.", train);
}
