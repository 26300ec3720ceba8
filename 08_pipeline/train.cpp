// Chapter 08: pipeline parallelism: stages, micro-batches, and six schedules.
//
// The idea. Split the model by depth over p ranks, and each step's batch into m micro-batches that
// flow through the stages, activations forward and their gradients back. The bubble (the idle time
// while the pipeline fills and drains) depends on the schedule: afab, 1f1b, interleaved, zb-h1,
// zb-v, dualpipev, each a plain list of actions per rank that one executor runs.
// What to notice: the bubble next to its theory and a simulation; activations per micro-batch in flight.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Base chapter: 03_bucket_dp (docs/diffs/08_pipeline.diff: what this chapter adds to it).
//
// Run:
//   make 08_pipeline && mpiexec -n 4 ./08_pipeline/train --preset deep --schedule interleaved --micro-batches 8
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "parallel/data_parallel.h"
#include "ops/device.h"
#include "training/chapter_main.h"  // run_chapter: main(), flags and checks
#include "training/flags.h"
#include "pipeline/gradient_router.h"  // each gradient to its group, by its copies
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/grid_flags.h"  // GridFlags: the flags 08, 09 and 12 share
#include "pipeline/pipeline_flags.h"
#include "pipeline/pipeline_report.h"
#include "schedule/pipeline_schedule.h"
#include "comm/process_grid.h"
#include "parallel/shards.h"
#include "training/training_run.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked. The
// pipeline's, the schedule's and --bucket-mb are the block 08, 09 and 12 share (grid_flags.h).
struct Options : GridFlags {
  Options() : GridFlags(1) {}  // no --tp: a tensor-parallel group of one rank

  void declare(FlagParser& flags, TrainConfig& cfg) {
    GridFlagHelp help;
    help.pp = "pipeline stages (default: every rank); the rest is data-parallel";
    declare_grid(flags, cfg, help);
  }
  void check(TrainConfig& cfg, int /*ranks*/) { check_grid(cfg); }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  // Every flag checked against the others, the ranks, the model and the batch (a resumed run's is the
  // checkpoint's, checked by the run), before any schedule, model or buffer exists.
  GPT2Config model_cfg;
  if (!find_preset(cfg.preset, &model_cfg)) config_error("--preset: unknown preset '" + cfg.preset + "'");
  const int batch = cfg.was_given("--batch") ? cfg.batch : cfg.resume.empty() ? model_cfg.default_batch : 0;
  const PipelineFlags& flags = opt.pipeline;  // tp 1: no tensor parallelism here
  PipelinePlan pipe;
  const std::string flags_problem = pipeline_flags_problem(flags, world.size(), model_cfg, batch, &pipe);
  if (!flags_problem.empty()) config_error(flags_problem);
  const Schedule schedule = pipe.schedule;
  const int t = flags.tp, p = pipe.shape.stages, m = pipe.shape.micro_batches, v = pipe.shape.chunks;
  const std::vector<int>& blocks = pipe.blocks;  // per virtual stage, the head's cost weighed in
  const bool zero1 = flags.zero1, zero2 = flags.zero2;
  cfg.grad_accum = m;
  ProcessGrid grid(world, grid_shape(world.size(), t, p));

  // How a receive finds its message: MPI matches tags, so every receive can be posted at the start;
  // NCCL has none and matches by call order, which the lists are then built for.
  const PipelineShape& shape = pipe.shape;  // with the schedule's placement (zb-v, dualpipev: a V)
  const Matching matching = pipeline_matching(opt.matching, grid.pp(), shape);

  // The schedule: this rank's actions, and every rank's, checked before any work.
  const int rank = grid.coords().pp;
  std::vector<std::vector<Action>> every_rank;
  for (int r = 0; r < p; r++) every_rank.push_back(build_schedule(schedule, shape, r, matching));
  const std::string problem = check_pipeline(schedule, shape, every_rank, matching);
  if (!problem.empty()) config_error("the " + flags.schedule + " schedule is unsound: " + problem);
  const std::vector<Action>& actions = every_rank[rank];
  std::vector<ModelPart> parts = parts_of_rank(model_cfg, blocks, p, rank, shape.placement);
  for (int c = 0; c < v; c++) {
    parts[c].slots = max_in_flight(actions, c);  // the micro-batches whose activations it holds at once
    parts[c].split_backward = splits_backward(schedule);
  }

  // ZeRO-1's memory and plan under either flag: --zero2 keeps the full gradient buffer (it shows
  // ZeRO-2's communication, not its memory).
  const bool sharded = zero1 || zero2;
  const TensorParallelism tp;  // none: each rank holds its stage's layers whole (09 splits them)
  TrainingRun run(grid, cfg, Parallelism{sharded ? Strategy::ZeRO1 : Strategy::DP, tp,
                                         PipelineParallelism{p, rank, parts, zero2, {}}});
  const Device device = run.device();
  const DType dtype = run.dtype();
  const ParamLayout& layout = run.layout();  // this stage's units; the others' have size 0
  Communicator& dp_group = grid.dp();
  print_partition(run, model_cfg, blocks, p, shape.placement);

  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype), sharded ? BucketCut::AtLayers : BucketCut::AtTensors);
  if (!sharded) run.set_gradient_all_reduces(buckets.sizes());  // the theory table's: one all-reduce a bucket
  const ShardPlan plan = sharded ? GradientSync::zero1_plan(buckets, dp_group) : ShardPlan::unsharded(layout);
  Buffer grad_shard(sharded ? plan.size() : 0, MemCategory::CommBuffers, dtype, device);
  GradientSync data_parallel(dp_group, buckets, grads.view(), sharded ? &plan : nullptr, grad_shard.view());
  AdamW optimizer(layout, plan, cfg.weight_decay, device, dtype);
  std::vector<std::unique_ptr<GPT2>> models;  // one per chunk, over the same flat buffers
  std::vector<GPT2*> chunks;
  for (const ModelPart& part : parts) {
    models.push_back(std::make_unique<GPT2>(run.model_config(), layout, run.micro_batch_size(), device, dtype, tp,
                                            part));
    models.back()->bind_all(params.data(), grads.data());
    chunks.push_back(models.back().get());
  }
  const int start = run.init_or_resume(params, optimizer);
  PipelineExecutor pipeline(grid.pp(), chunks, shape, actions, matching, run.micro_batch_size(), model_cfg.T,
                            model_cfg.C, device, dtype);
  // dualpipev: each F&B pair's forward and backward at once, on two lanes (pipeline.h). Here no pass
  // talks to a group but the backward's gradients to the DP group, so the lanes share no communicator.
  pipeline.overlap_pairs(fb_overlap_runs(pipe, matching, device, run.is_root()));
  PipelineReport report(run, grid, shape, schedule, matching, parts);

  // Gradients, on the last micro-batch's backward (or weight pass, under zb-h1): data parallelism
  // over this stage's DP group (03), except wte, whose two copies are summed over the embedding
  // group first.
  // In a V the embedding and the head are both rank 0's: one wte, nothing to sum over the stages.
  Communicator* embedding = shape.placement == Placement::V ? nullptr : grid.embedding();
  // --zero2: each micro-batch's gradients are reduce-scattered as they are made (05's rule), wte's
  // bucket excepted (summed over the stages first, it goes once, at the end); a backward waits for
  // the previous micro-batch's reduce-scatters before it writes into their buckets again. The rule
  // every pipeline chapter follows (gradient_router.h), read from each parameter's copies.
  GradientRouter router(layout, grads.view(), data_parallel, m, zero2, /*tp_sums*/ nullptr, embedding);
  router.attach(pipeline, chunks);

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grads.view());
    if (zero2) fill_zero(grad_shard.view());  // the micro-batches' pieces add up in it
    const float loss = pipeline.run([&](int micro) { return run.micro_batch(step, micro); });
    router.finish();

    // The global norm: every stage's own gradients, wte counted once (on the first stage); summed
    // over the pipeline (and over DP, whose ranks hold different pieces under ZeRO-1).
    const Tensor my_grads = sharded ? grad_shard.view() : grads.view();
    const double squares = gradient_squares(layout, plan, my_grads, grid.coords(), kAxisPP);
    Communicator& holders = sharded ? grid.world() : grid.pp();
    const double norm = std::sqrt(holders.all_reduce_scalar(squares, ReduceOp::Sum));
    optimizer.update(params.view(), my_grads, step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    if (sharded) data_parallel.gather_parameters(params.view());

    report.add_step(step, pipeline.times());
    run.end_step(step, loss, norm);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;
  }
  report.finish(tied_copies_equal(embedding, params.view(), layout));
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "08_pipeline",
                     "Chapter 08: pipeline parallelism, six schedules.", train);
}
