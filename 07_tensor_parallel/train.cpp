// Chapter 07: tensor parallelism (Megatron-LM), with sequence parallelism.
//
// The idea. Split the matrix products over t ranks: a column-parallel product (qkv by heads, fc by
// channels) then a row-parallel one (the projections), so that one collective separates them: "g"
// sums the partial outputs, "f" is its mirror in backward. --sequence-parallel splits the rows
// between the products too (g a reduce-scatter, f an all-gather). The rest is 03's (or 04's) DP.
// What to notice: parameters per rank about 1/t; TP bytes (4L+2) x B*T*C; the losses 01's.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Base chapter: 03_bucket_dp (docs/diffs/07_tensor_parallel.diff: what this chapter adds to it).
//
// Run:
//   make 07_tensor_parallel && mpiexec -n 4 ./07_tensor_parallel/train --sequence-parallel --tp-overlap
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "comm/wire_format.h"  // activations and gradients in the recipe's formats (fp32: as they are)
#include "ops/device.h"
#include "training/chapter_main.h"  // run_chapter: main(), flags and checks
#include "training/flags.h"
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/shards.h"
#include "training/training_run.h"

#include "parallel/data_parallel.h"
#include "parallel/parallelize.h"  // apply_tensor_parallel: the collectives installed on the model
#include "comm/process_grid.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  int tp = 0;  // 0: 2 where the rank count is even, else 1
  bool sequence_parallel = false, overlap = false, zero1 = false;
  double bucket_mb = 0;

  void declare(FlagParser& flags, TrainConfig& cfg) {
    flags.add("--tp", &tp, "ranks in a tensor-parallel group (default: 2 on an even rank count); the rest is "
                           "data-parallel");
    flags.add_switch("--sequence-parallel", &sequence_parallel,
                     "split the rows between the parallel products too (gathers and scatters for all-reduces)");
    flags.add_switch("--tp-overlap", &overlap,
                     "in backward, sum the input's gradient while the weight's gradient is computed");
    flags.add_switch("--zero1", &zero1, "shard the optimizer state over the data-parallel group (chapter 04)");
    flags.add("--bucket-mb", &bucket_mb, "data-parallel bucket size in MB (default: an eighth of the gradient)");
    flags.add("--tp-link-gbps", &cfg.tp_link_gbps,
              "the tensor-parallel group's emulated link, 0.001 to 100000 Gbit/s, 0 = unlimited (default: --link-gbps's)");
    flags.add("--tp-link-latency-us", &cfg.tp_link_latency_us,
              "its latency, 0 to 1000000 us (default: --link-latency-us's)");
  }
  void check(TrainConfig& cfg, int /*ranks*/) {
    if (cfg.was_given("--bucket-mb") && !(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
    if (cfg.was_given("--tp") && tp < 1) config_error("--tp must be >= 1");
  }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  // The grid: consecutive ranks form a TP group; ranks with the same TP rank form a DP group.
  const int tp_size = opt.tp ? opt.tp : world.size() % 2 == 0 ? 2 : 1;
  ProcessGrid grid(world, grid_shape(world.size(), tp_size, 1));
  // At --tp 1 a group is one rank, which holds every row already: sequence parallelism has nothing to
  // split. A note rather than an error, so that one command line runs on any --tp.
  const bool sequence_parallel = opt.sequence_parallel && grid.shape().tp > 1;
  if (opt.sequence_parallel && !sequence_parallel && world.rank() == 0)
    std::printf("note: --sequence-parallel does nothing at --tp 1 (one rank per tensor-parallel group holds every "
                "row); running without it\n");
  const TensorParallelism tp{grid.shape().tp, grid.coords().tp, sequence_parallel};
  TrainingRun run(grid, cfg, Parallelism{opt.zero1 ? Strategy::ZeRO1 : Strategy::DP, tp});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();
  Communicator& replicas = grid.dp();  // every rank that holds the same parameters
  Communicator& tp_group = grid.tp();

  // Every rank holds its slices of the parameters, plus the tensors held whole, and their gradients.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype), opt.zero1 ? BucketCut::AtLayers : BucketCut::AtTensors);
  if (!opt.zero1) run.set_gradient_all_reduces(buckets.sizes());  // the theory table's: one all-reduce a bucket
  const ShardPlan plan = opt.zero1 ? GradientSync::zero1_plan(buckets, replicas) : ShardPlan::unsharded(layout);
  Buffer grad_shard(opt.zero1 ? plan.size() : 0, MemCategory::CommBuffers, dtype, device);
  GradientSync data_parallel(replicas, buckets, grads.view(), opt.zero1 ? &plan : nullptr, grad_shard.view());
  AdamW optimizer(layout, plan, cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype, tp);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);

  // The lesson: the four collectives of tensor parallelism. "f" precedes a column-parallel product,
  // "g" follows a row-parallel one; each is the other's mirror in backward. The dimension installs
  // them around the model's split products (apply_tensor_parallel, parallelize.h).
  ProductHooks collectives;
  auto started = [&](CommHandle handle) {  // without --tp-overlap, nothing runs behind the computation
    if (!opt.overlap) {
      handle.wait();
      return CommHandle();
    }
    return handle;
  };
  if (!sequence_parallel) {
    // Without sequence parallelism every rank holds all rows: local and full are the same tensor.
    collectives.f_forward = [](Tensor, Tensor) { return CommHandle(); };  // identity
    collectives.f_backward = [&](Tensor full, Tensor) {                   // sum the input's gradient
      return started(wire_all_reduce_async(tp_group, full, ReduceOp::Sum, collective_formats(tp_group).gradients));
    };
    collectives.g_forward = [&](Tensor partial, Tensor) {  // sum the partial outputs
      return wire_all_reduce_async(tp_group, partial, ReduceOp::Sum, collective_formats(tp_group).activations);
    };
    collectives.g_backward = [](Tensor, Tensor) { return CommHandle(); };  // identity
  } else {
    // With it, each all-reduce is split in its two halves, on either side of the row-wise work.
    collectives.f_forward = [&](Tensor local, Tensor full) {  // gather all rows
      return started(wire_all_gather_async(tp_group, local, full, collective_formats(tp_group).activations));
    };
    collectives.f_backward = [&](Tensor full, Tensor local) {  // sum, keep this rank's rows
      return started(wire_reduce_scatter_async(tp_group, full, local, ReduceOp::Sum, collective_formats(tp_group).gradients));
    };
    collectives.g_forward = [&](Tensor partial, Tensor local) {
      return wire_reduce_scatter_async(tp_group, partial, local, ReduceOp::Sum, collective_formats(tp_group).activations);
    };
    collectives.g_backward = [&](Tensor local, Tensor full) {
      return wire_all_gather_async(tp_group, local, full, collective_formats(tp_group).gradients);
    };
  }
  collectives.vocab_all_reduce = [&](Tensor values, ReduceOp op) { tp_group.all_reduce(values, op); };
  parallelize({&model}, {apply_tensor_parallel(collectives)});

  // Data parallelism over the DP group, on the last micro-batch (03/04). Under sequence parallelism a
  // parameter held whole has only this rank's rows' share of its gradient: the shares are summed
  // over the TP group first (in the recipe's gradient format, as DP's buckets travel), and its bucket
  // is told once the sum has arrived (at the end of the parameter's layer, so that the sum travels
  // while the layer's backward goes on).
  bool last_micro_batch = false;
  std::vector<std::pair<int, CommHandle>> summing;
  model.hooks.grad_ready = [&](int p) {
    if (!last_micro_batch) return;  // no_sync: gradients are not final until the last micro-batch
    const ParamInfo& info = layout.params[p];
    if (sequence_parallel && info.shard.whole()) {
      summing.emplace_back(p, wire_all_reduce_async(tp_group, grads.view().slice1d(info.offset, info.size), ReduceOp::Sum,
                                                    collective_formats(tp_group).gradients));
      return;
    }
    data_parallel.gradient_ready(p);
  };
  model.hooks.after_backward = [&](int) {
    for (auto& [p, handle] : summing) {
      handle.wait();
      data_parallel.gradient_ready(p);
    }
    summing.clear();
  };

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grads.view());
    float loss = 0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
      last_micro_batch = micro == cfg.grad_accum - 1;
      MicroBatch batch = run.micro_batch(step, micro);
      loss += model.forward(batch.inputs, batch.targets, batch.B) / cfg.grad_accum;
      model.backward(1.0f / cfg.grad_accum);
    }

    // Most of them finished while backward ran; wait for the rest.
    data_parallel.finish();

    // The global norm: each TP rank's slices, plus the tensors held whole counted by one rank of the
    // group; summed over TP (and over DP, whose ranks hold different pieces under ZeRO-1).
    const Tensor my_grads = opt.zero1 ? grad_shard.view() : grads.view();
    const double squares = gradient_squares(layout, plan, my_grads, grid.coords(), kAxisTP);
    Communicator& holders = opt.zero1 ? grid.world() : tp_group;
    const double norm = std::sqrt(holders.all_reduce_scalar(squares, ReduceOp::Sum));
    optimizer.update(params.view(), my_grads, step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    if (opt.zero1) data_parallel.gather_parameters(params.view());

    run.end_step(step, loss, norm);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;  // Ctrl-C or a diverging loss: every rank agreed to stop here
  }
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "07_tensor_parallel",
                     "Chapter 07: Megatron tensor parallelism and sequence parallelism, on a DP x TP grid.", train);
}
