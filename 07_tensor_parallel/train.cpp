// Chapter 07: tensor parallelism (Megatron-LM), with sequence parallelism.
//
// The idea. Chapters 01-06 split the batch; every rank still runs every matrix product of the whole
// model. Tensor parallelism (TP) splits the products themselves over a group of t ranks. In each
// block two matrix products are paired so that only one collective separates them:
//   column-parallel first (attn.qkv by heads: rank r holds the q, k and v rows of its NH/t heads;
//     mlp.fc by channels): each rank computes its slice of the output from the whole input, and
//     attention and GELU act on slices alone;
//   row-parallel second (attn.proj, mlp.proj): rank r holds the matching columns, so its product is
//     a partial sum of the whole output; "g" sums the partials, then the bias is added, once.
// "f", before each column-parallel product, is its mirror: nothing in forward, the sum of the
// input's gradient in backward. The embedding and the tied LM head split the vocabulary: V/t rows a
// rank, and the cross-entropy combines each row's maximum, sum of exponentials and target logit over
// the group, never the (B,T,V) logits. Each rank keeps 1/t of the matrices, their gradients and
// AdamW state, and does 1/t of their FLOPs. The price: per block two all-reduces of a (B,T,C)
// activation in forward and two in backward, on the critical path: TP lives inside a node.
// wpe, the layernorms and the row-parallel biases stay whole on every rank. Their gradients agree
// across the group with no communication: they act on the stream between the products, which every
// rank holds whole and alike (g's sum made it so), and the stream's gradient is alike too (f's sum).
//
// Sequence parallelism (--sequence-parallel, Korthikanti et al. 2022) stops repeating that work t
// times: rank r keeps rows [r BT/t, (r+1) BT/t) of the stream, flattened to (B*T, C) rows. Any split
// of rows is as good as a split along T, with no transpose, because everything between the products
// (layernorms, residual adds, biases) is computed row by row. g becomes a reduce-scatter of rows, f
// an all-gather: the same bytes, and the activations between the products shrink t-fold. The
// tensors held whole now get, on each rank, its rows' share of their gradient: summed over the
// group before the optimizer, the final layernorm's and wpe's included (wpe is added after the
// split, to this rank's rows, so its gradient is summed like the others).
//
// --tp-overlap: in backward, the input's gradient is summed while the weight's gradient is computed
// (Megatron's asynchronous all-reduce): the "02" of tensor parallelism. With --tp below the rank
// count, the rest is data parallelism over the grid's DP groups, as 03 (or, --zero1, 04) teaches it.
// What to notice: parameters per rank about 1/t; "TP bytes per step" is (4L+2) all-reduces of
// B*T*C (with SP, as gathers and scatters); "activations" fall t-fold with SP; the losses are 01's.
//
// Base chapter: 03_bucket_dp (docs/diffs/07_tensor_parallel.diff: what this chapter adds to it).
//
// Run:
//   make 07_tensor_parallel
//   mpiexec -n 2 ./07_tensor_parallel/train                                  # TP 2
//   mpiexec -n 4 ./07_tensor_parallel/train --sequence-parallel --tp-overlap # DP 2 x TP 2
//   mpiexec -n 4 ./07_tensor_parallel/train --tp 4 --preset small --trace tp.json
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "comm/comm_factory.h"
#include "comm/wire_format.h"  // activations and gradients in the recipe's formats (fp32: as they are)
#include "ops/device.h"
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

// The chapter's own flags (the common ones are TrainConfig's, flags.h).
struct Options {
  int tp = 0;  // 0: 2 where the rank count is even, else 1
  bool sequence_parallel = false, overlap = false, zero1 = false;
  double bucket_mb = 0;
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
  Communicator& tp_group = grid.tp();
  Communicator& dp_group = grid.dp();

  // Every rank holds its slices of the parameters, plus the tensors held whole, and their gradients.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype), opt.zero1 ? BucketCut::AtLayers : BucketCut::AtTensors);
  const ShardPlan plan = opt.zero1 ? GradientSync::zero1_plan(buckets, dp_group) : ShardPlan::unsharded(layout);
  Buffer grad_shard(opt.zero1 ? plan.size() : 0, MemCategory::CommBuffers, dtype, device);
  GradientSync data_parallel(dp_group, buckets, grads.view(), opt.zero1 ? &plan : nullptr, grad_shard.view());
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
  // over the TP group first, and its bucket is told once the sum has arrived (at the end of the
  // parameter's layer, so that the sum travels while the layer's backward goes on).
  bool last_micro_batch = false;
  std::vector<std::pair<int, CommHandle>> summing;
  model.hooks.grad_ready = [&](int p) {
    if (!last_micro_batch) return;  // no_sync: gradients are not final until the last micro-batch
    const ParamInfo& info = layout.params[p];
    if (sequence_parallel && info.shard.whole()) {
      summing.emplace_back(p, tp_group.all_reduce_async(grads.view().slice1d(info.offset, info.size), ReduceOp::Sum));
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

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  flags.add("--tp", &opt.tp, "ranks in a tensor-parallel group (default: 2 on an even rank count); the rest is "
                            "data-parallel");
  flags.add_switch("--sequence-parallel", &opt.sequence_parallel,
                   "split the rows between the parallel products too (gathers and scatters for all-reduces)");
  flags.add_switch("--tp-overlap", &opt.overlap,
                   "in backward, sum the input's gradient while the weight's gradient is computed");
  flags.add_switch("--zero1", &opt.zero1, "shard the optimizer state over the data-parallel group (chapter 04)");
  flags.add("--bucket-mb", &opt.bucket_mb, "data-parallel bucket size in MB (default: an eighth of the gradient)");
  flags.add("--tp-link-gbps", &cfg.tp_link_gbps, "the tensor-parallel group's emulated link, 0.001 to 100000 Gbit/s, 0 "
                                                "= unlimited (default: --link-gbps's)");
  flags.add("--tp-link-latency-us", &cfg.tp_link_latency_us, "its latency, 0 to 1000000 us (default: --link-latency-us's)");
  if (!parse_train_flags(argc, argv, "07_tensor_parallel",
                         "Chapter 07: Megatron tensor parallelism and sequence parallelism, on a DP x TP grid.", flags, &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  if (cfg.was_given("--bucket-mb") && !(opt.bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  if (cfg.was_given("--tp") && opt.tp < 1) config_error("--tp must be >= 1");
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);  // NCCL on GPUs (comm_factory.h)
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
