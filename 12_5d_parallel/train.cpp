// Chapter 12: five-dimensional parallelism: data x context x tensor x pipeline x expert, composed on
// one process grid, and activation recomputation.
//
// The idea. Each parallelism so far removes one limit and adds one cost. Data parallelism (01-06)
// multiplies throughput, but every rank holds the whole model (or gathers it: ZeRO-3). Tensor
// parallelism (07) splits every product over t ranks, at the price of collectives on the critical
// path of every layer: it needs a node's fast links, and stops at the node. Pipeline parallelism (08)
// splits the model by depth over p stages for one message per micro-batch and boundary, at the price
// of the bubble. Large models are trained with all three at once (Megatron-LM: t = 8 inside a node,
// p across nodes, d over the rest): each rank holds 1/(t p) of the model, runs its stage's blocks on
// its 1/t of every product, and the d replicas of that grid average their gradients.
// Context parallelism (10) splits the sequence (a ring in every attention), expert parallelism (11) a
// mixture of experts (all-to-alls): Llama 3 405B ran TP 8 x CP 16 x PP 16 x DP 8, DeepSeek-V3 PP 16 x EP 64.
//
// Composition is mostly placement. The process grid puts TP innermost (consecutive ranks: one node)
// and PP outermost, from the order "tp-cp-dp-pp" (common/comm/process_grid.h; EP folded in). Nothing in a stage
// knows about the pipeline's other stages but its neighbours, and nothing in a tensor-parallel group
// knows about the pipeline: a chunk (08's model part) is simply built as this rank's slice (07's
// layout), with 07's f and g collectives over the TP group; the messages between stages are the
// stream between blocks, which under sequence parallelism a rank holds only B*T/t rows of: each TP
// rank sends its own rows to the same TP rank of the next stage, t messages of 1/t each. The tied
// wte's two copies are vocabulary slices now, summed in the embedding group of each (dp, tp)
// coordinate. Gradients: 07's sums over TP of the tensors held whole (under SP), 08's sum of wte over
// the embedding group, then data parallelism over DP x CP (or ZeRO-1), the experts' over expert DP
// (gradient_router.h). Each dimension is applied to every chunk in turn (common/parallel/parallelize.h),
// with its chapter's lesson (apply_dimensions.h). Seven groups, each printed next to its formula.
//
// Activation recomputation (--recompute, in every chapter: it belongs to the model) trades compute
// for the activations that a pipeline multiplies by its micro-batches in flight. selective drops the
// attention's (B,NH,T,T) scores and recomputes them before their backward (a few percent of the
// FLOPs, the term that grows with T^2); full keeps only each block's input and replays the block in
// its backward (about 2/3 of a forward more; under TP, the replay's collectives too). The arena holds
// what each keeps, no more (docs/theory.md, section 12).
//
// What to notice: per rank, the model state is 1/(t p) of 01's (with ZeRO-1 the optimizer's 1/d
// again); activations per stage are the schedule's micro-batches in flight x the per-layer formula
// under TP, SP and recomputation; "TP bytes", "p2p bytes", "DP bytes" and the embedding group's are
// each their formula; the bubble is 08's; the losses are 01's; so are CP's and EP's (docs/five_d_parallel.md).
//
// Base chapter: 09_3d_parallel (docs/diffs/12_5d_parallel.diff: what composing 10 and 11 into it adds).
//
// Run:
//   make 12_5d_parallel
//   mpiexec -n 4 ./12_5d_parallel/train --tp 2 --cp 2                                   # TP 2 x CP 2
//   mpiexec -n 4 ./12_5d_parallel/train --preset moe-tiny --tp 2 --pp 2 --ep 2 --sequence-parallel
//   mpiexec -n 4 ./12_5d_parallel/train --preset moe-tiny --ep 2 --zero1   # dense state over DP 4, experts' over 2
//   mpiexec -n 4 ./12_5d_parallel/train --tp 2 --ulysses 2   # Ulysses (10's --ulysses) on the NH/t heads of TP
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "apply_dimensions.h"  // 10's and 11's lessons on the grid, each group's bytes
#include "parallel/buckets.h"
#include "comm/comm.h"
#include "comm/comm_factory.h"
#include "parallel/data_parallel.h"
#include "ops/device.h"
#include "training/flags.h"
#include "pipeline/gradient_router.h"  // each gradient to its group, by its copies
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_flags.h"
#include "pipeline/pipeline_report.h"
#include "schedule/pipeline_schedule.h"
#include "comm/process_grid.h"
#include "parallel/shards.h"
#include "parallel/parallelize.h"  // apply_tensor_parallel: 07's collectives, for every chunk
#include "training/training_run.h"

struct Options {
  int tp = 1;
  // --pp (default 1), --micro-batches, --schedule, --virtual-stages,
  // --partition, --zero1, --zero2: 08's, checked by the same code (pipeline_flags.h)
  PipelineFlags pipeline;
  bool sequence_parallel = false, overlap = false;
  std::string matching = "auto";  // auto: by tag where the communicator has tags (MPI), else call order
  double bucket_mb = 0;
  ContextExpertFlags dims;  // --cp, --cp-split, --ep, --capacity-factor, --aux-loss-coef: 10's and 11's
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  // Every flag checked against the others, the ranks, the model and the batch, as 08 checks them
  // (with --tp's groups), before any schedule, model or buffer exists.
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
  // CP (u x cp ranks under --ulysses u, Ulysses inside) between TP and DP; EP folded over each stage.
  ProcessGrid grid(world, grid_shape(world.size(), t, p, flags.cp, opt.dims.ep));
  const bool sequence_parallel = opt.sequence_parallel && t > 1;
  const TensorParallelism tp{t, grid.coords().tp, sequence_parallel};
  const ContextParallelism held = context_of(opt.dims, model_cfg.T, grid.coords().cp);  // this rank's positions

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
  ContextRings rings(run, grid.cp(), opt.dims, m, fb_overlap ? kLanes : 1);
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
  GroupBytes bytes(run, grid, parts, data_parallel, experts, rings, m, sharded);  // each group's, against its formula

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

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  PipelineFlags& pipe = opt.pipeline;
  flags.add("--tp", &opt.tp, "ranks in a tensor-parallel group, innermost (default 1)");
  opt.dims.add_context_flags(flags);  // --cp, --cp-split
  flags.add("--pp", &pipe.pp, "pipeline stages, outermost (default 1); the rest is data-parallel");
  opt.dims.add_expert_flags(flags);  // --ep, --capacity-factor, --aux-loss-coef
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
  if (cfg.was_given("--tp") && opt.tp < 1) config_error("--tp must be >= 1");
  check_context_and_expert_flags(cfg, comm->size(), opt.dims);  // and --ulysses'
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);  // NCCL on GPUs (comm_factory.h)
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
