// Chapter 12: five-dimensional parallelism: data x context x tensor x pipeline x expert, composed on
// one process grid, and activation recomputation.
//
// The idea. Large models use all three at once: TP innermost (a node's links), PP outermost, DP over
// the rest. Composition is mostly placement: each chunk (08's) is this rank's TP slice (07's), with
// 07's f and g over the TP group. --recompute trades compute for activations. The largest runs add
// 10's context and 11's experts, applied to every chunk in turn (apply_dimensions.h).
// What to notice: model state 1/(t p) of 01's; each group's bytes next to its formula; the losses 01's.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Base chapter: 09_3d_parallel (docs/diffs/12_5d_parallel.diff: what composing 10 and 11 into it adds).
//
// Run:
//   make 12_5d_parallel && mpiexec -n 4 ./12_5d_parallel/train --preset moe-tiny --tp 2 --ep 2 --sequence-parallel
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "apply_dimensions.h"  // 10's and 11's lessons on the grid, each group's bytes
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
#include "parallel/parallelize.h"  // apply_tensor_parallel: 07's collectives, for every chunk
#include "training/training_run.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked. The
// pipeline's, the schedule's and --bucket-mb are the block 08, 09 and 12 share (grid_flags.h).
struct Options : GridFlags {
  Options() : GridFlags(1) {}  // --tp 1 unless given: 12 composes only the dimensions asked for
  ContextExpertFlags dims;  // --cp, --cp-split, --ep, --capacity-factor, --aux-loss-coef: 10's and 11's

  void declare(FlagParser& flags, TrainConfig& cfg) {
    GridFlagHelp help;
    help.tp = "ranks in a tensor-parallel group, innermost (default 1)";
    help.pp = "pipeline stages, outermost (default 1); the rest is data-parallel";
    help.sequence_parallel = "split the rows between the parallel products too (a MoE preset with --tp needs it)";
    declare_grid(flags, cfg, help, [&] { dims.add_context_flags(flags); }, [&] { dims.add_expert_flags(flags); });
  }
  void check(TrainConfig& cfg, int ranks) {
    check_grid(cfg);
    check_context_and_expert_flags(cfg, ranks, dims);  // and --ulysses'
  }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  // Every flag checked against the others, the ranks, the model and the batch (a resumed run's is the
  // checkpoint's, checked by the run), before any schedule, model or buffer exists.
  GPT2Config model_cfg;
  if (!find_preset(cfg.preset, &model_cfg)) config_error("--preset: unknown preset '" + cfg.preset + "'");
  const int batch = cfg.was_given("--batch") ? cfg.batch : cfg.resume.empty() ? model_cfg.default_batch : 0;
  PipelineFlags flags = opt.pipeline;
  flags.tp = opt.tp, flags.cp = opt.dims.cp * opt.dims.ulysses, flags.ep = opt.dims.ep, flags.splits_experts = true;
  if (!flags.pp) flags.pp = 1;
  const PipelinePlan pipe = plan_composition(world, cfg, model_cfg, batch, flags, opt.sequence_parallel, opt.dims);
  const Schedule schedule = pipe.schedule;
  const int t = flags.tp, p = pipe.shape.stages, m = pipe.shape.micro_batches, v = pipe.shape.chunks;
  const std::vector<int>& blocks = pipe.blocks;  // per virtual stage, the head's cost weighed in
  const bool zero1 = flags.zero1, zero2 = flags.zero2;
  const bool moe = model_cfg.moe();
  cfg.grad_accum = m;
  // The grid: TP innermost (a node's fast links), PP outermost, data parallelism over the rest.
  // CP between TP and DP, with Ulysses' axis inside it (--ulysses); EP folded over each stage.
  ProcessGrid grid(world, grid_shape(world.size(), t, p, opt.dims.cp, opt.dims.ep, opt.dims.ulysses));
  const bool sequence_parallel = opt.sequence_parallel && t > 1;
  const TensorParallelism tp{t, grid.coords().tp, sequence_parallel};
  const ContextParallelism held = context_of(opt.dims, model_cfg.T, context_rank(grid.shape(), grid.coords()));

  // How a receive finds its message: MPI matches tags, so every receive can be posted at the start;
  // NCCL has none and matches by call order, which the lists are then built for.
  const PipelineShape& shape = pipe.shape;  // with the schedule's placement (zb-v, dualpipev: a V)
  const Matching matching = pipeline_matching(opt.matching, grid.pp(), shape);
  // dualpipev runs each F&B pair's forward and backward at once (pipeline.h), both talking to the TP
  // group: each lane then on its own copy of it (lanes.h), which the grid keeps beside the group.
  const bool fb_overlap = fb_overlap_runs(pipe, matching, world.device(), world.rank() == 0);
  if (fb_overlap) grid.give_each_lane_its_groups();

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

  // Each chunk is this rank's tensor-parallel slice of its pipeline part. ZeRO-1's memory and plan
  // under either ZeRO flag, as in 08. Under CP, on its positions; under EP, with its experts.
  const bool sharded = zero1 || zero2;
  const MoESettings moe_settings{opt.dims.capacity_factor, opt.dims.aux_loss_coef};
  TrainingRun run(grid, cfg, Parallelism{sharded ? Strategy::ZeRO1 : Strategy::DP, tp,
                                         PipelineParallelism{p, rank, parts, zero2, actions, fb_overlap}, held,
                                         ExpertParallelism{opt.dims.ep, grid.coords().ep}, moe ? &moe_settings : nullptr});
  const Device device = run.device();
  const DType dtype = run.dtype();
  const ParamLayout& layout = run.layout();  // this stage's units, this TP rank's slices of them
  Communicator& dp_group = grid.dp_cp();     // the ranks that hold this rank's dense parameters: DP x CP
  print_partition(run, model_cfg, blocks, p, shape.placement);
  Communicator& tp_group = grid.tp();

  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype), sharded ? BucketCut::AtLayers : BucketCut::AtTensors,
                          /*experts_apart=*/moe);
  if (!sharded)  // the theory's: one all-reduce a bucket, the experts' over their own group
    run.set_gradient_all_reduces(buckets.sizes(/*without_experts=*/true), buckets.expert_sizes());
  // ZeRO-1: the dense buckets sharded over DP x CP, a MoE model's expert buckets over their replicas.
  const ShardPlan plan = sharded ? GradientSync::zero1_plan(buckets, dp_group, moe ? &grid.expert_dp() : nullptr)
                                 : ShardPlan::unsharded(layout);
  Buffer grad_shard(sharded ? plan.size() : 0, MemCategory::CommBuffers, dtype, device);
  GradientSync data_parallel(dp_group, buckets, grads.view(), sharded ? &plan : nullptr, grad_shard.view());
  // An expert's gradient sums its EP group's tokens; its EDP mean must be the DP x CP one: x EDP/(DP x CP) = TP/EP.
  if (moe) data_parallel.set_expert_group(grid.expert_dp(), float(t) / float(opt.dims.ep));
  AdamW optimizer(layout, plan, cfg.weight_decay, device, dtype);
  std::vector<std::unique_ptr<GPT2>> models;  // one per chunk, over the same flat buffers
  std::vector<GPT2*> chunks;
  for (const ModelPart& part : parts) {
    models.push_back(std::make_unique<GPT2>(run.model_config(), layout, run.micro_batch_size(), device, dtype, tp,
                                            part, held));
    models.back()->bind_all(params.data(), grads.data());
    chunks.push_back(models.back().get());
  }
  const int start = run.init_or_resume(params, optimizer);
  PipelineExecutor pipeline(grid.pp(), chunks, shape, actions, matching, run.micro_batch_size(),
                            held.held_positions(model_cfg.T), model_cfg.C, device, dtype);
  pipeline.overlap_pairs(fb_overlap);
  PipelineReport report(run, grid, shape, schedule, matching, parts);

  // The lesson: each dimension applied to every chunk in turn (parallelize.h). TP: 07's collectives;
  // CP: 10's ring on NH/t heads, one per lane, Ulysses around it; EP: 11's exchange per micro-batch.
  ContextRings rings(run, grid, opt.dims, m, fb_overlap ? kLanes : 1);
  GridExperts experts(run, grid, chunks, parts, opt.dims, m);
  parallelize(chunks, {apply_tensor_parallel(tp_group, sequence_parallel, opt.overlap), rings.context_parallel(),
                       rings.ulysses(), experts.expert_parallel()});

  // Gradients, on the last micro-batch's backward (or weight pass, under zb-h1), each by its copies
  // (gradient_router.h): under sequence parallelism the tensors held whole are summed over the TP
  // group (07); wte's two copies (vocabulary slices) over the embedding group (08); then data
  // parallelism over this stage's DP group (03, or ZeRO-1: 04; --zero2: every micro-batch, as in 08).
  // In a V (zb-v, dualpipev) the embedding and the head are both on pipeline rank 0: one wte slice.
  Communicator* embedding = shape.placement == Placement::V ? nullptr : grid.embedding();
  GradientRouter router(layout, grads.view(), data_parallel, m, zero2, sequence_parallel ? &tp_group : nullptr,
                        embedding);
  router.attach(pipeline, chunks);
  experts.attach(pipeline, router);  // before each pass: what its experts record under, then the router's turn
  GroupBytes bytes(run, grid, parts, experts, rings, m, sharded);  // each group's, against its formula

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grads.view());
    if (zero2) fill_zero(grad_shard.view());  // the micro-batches' pieces add up in it
    rings.begin_step(), experts.begin_step(), bytes.begin_step();
    const float loss = pipeline.run([&](int micro) { return rings.micro_batch(step, micro); });
    router.finish();

    // The global norm: every stage's own gradients, wte counted once (on the first stage), the
    // tensors held whole once per TP group; summed over the grid, from one DP replica (under ZeRO-1
    // each DP rank holds its own piece: all of them).
    const Tensor my_grads = sharded ? grad_shard.view() : grads.view();
    const double squares =
        gradient_squares(layout, plan, my_grads, grid.coords(), counted_along(kEveryAxis, sharded));
    const double norm = std::sqrt(grid.world().all_reduce_scalar(squares, ReduceOp::Sum));
    optimizer.update(params.view(), my_grads, step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    if (sharded) data_parallel.gather_parameters(params.view());

    experts.write_routing(step);  // MoE: the step's routing, a record of every layer and expert, as 11's
    report.add_step(step, pipeline.times());
    run.end_step(step, loss, norm, experts.expert_rows());
    bytes.report(run, world, step, start, cfg.steps);  // after step 1, every rank's groups next to their formulas
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;
  }
  report.finish(tied_copies_equal(embedding, params.view(), layout));
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "12_5d_parallel",
                     "Chapter 12: data x context x tensor x pipeline x expert parallelism on one grid.", train);
}
