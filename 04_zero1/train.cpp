// Chapter 04: ZeRO-1: shard the optimizer state.
//
// The idea. In chapters 01-03 every rank keeps the whole AdamW state (m and v: 8 bytes per
// parameter, twice the parameters themselves) and every rank computes the same update. That is N
// copies of the same work and of the largest memory category. ZeRO-1 splits it: each bucket of
// gradients is cut into N equal pieces and rank r owns piece r of every bucket (ShardPlan, common/
// shards.h), keeping m and v for its pieces only. Each step:
//   1. when a bucket's gradients are final, reduce-scatter it (during backward, as 03 all-reduced
//      it): rank r receives piece r, averaged over ranks, into its gradient shard;
//   2. AdamW updates only this rank's pieces of the parameters;
//   3. all-gather every bucket's updated pieces, so every rank again holds all parameters.
// A reduce-scatter plus an all-gather moves exactly what one all-reduce moves (an all-reduce IS a
// reduce-scatter followed by an all-gather), so the memory is saved for free in bytes. Every rank
// owns a piece of every bucket, so each collective is balanced: every rank sends and receives
// (N-1)/N of the bucket, as Megatron-LM's distributed optimizer does. (Owning one contiguous slice
// of the whole buffer would turn a bucket's reduce-scatter into a reduce to its one or two owners.)
// Buckets are cut between layers, where the layout pads to a multiple of N: each splits evenly.
//
// What changed since 03: the bucket's all-reduce became a reduce-scatter into a shard-sized buffer,
// the optimizer runs on the shard, and an all-gather of parameters follows it. Gradient clipping
// needs the global norm, but each rank now sees only its shard: one scalar all-reduce of the sums of
// squares gives it. What stayed: full parameters and full gradients on every rank (05 shards those).
// What to notice: "optimizer state" in the theory table drops to 8Ψ/N; bytes per step equal 01's;
// the reduce-scatters still hide under backward, but the all-gather after the optimizer is exposed:
// the price of the memory, paid in time on a slow link.
//
// Run:
//   make 04_zero1
//   mpiexec -n 4 ./04_zero1/train                  # optimizer state: a quarter per rank
//   mpiexec -n 2 ./04_zero1/train --bucket-mb 0.05 --link-gbps 0.5
// Output: as 01; in the theory table optimizer state is 8Ψ/N and comm bytes equal the DP row:
//   optimizer state            241.2 KB     241.2 KB      (4 ranks, tiny)
#include <cmath>
#include <cstdio>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "comm/comm_factory.h"
#include "comm/wire_format.h"  // the gradients in the recipe's format (fp32: as they are)
#include "ops/device.h"
#include "training/flags.h"
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/shards.h"
#include "parallel/weight_gather.h"  // gather_updated_async: the parameters in the recipe's format
#include "training/training_run.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h).
struct Options {
  double bucket_mb = 0;
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  TrainingRun run(grid, cfg, Parallelism{Strategy::ZeRO1});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();

  // Every rank holds all parameters and all gradients, but optimizer state for its shard only:
  // buckets of whole layers, rank r owning piece r of each.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype), BucketCut::AtLayers);
  const ShardPlan shard(buckets.ranges_in_flat_order(), world.size(), world.rank());
  AdamW optimizer(layout, shard, cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);
  if (run.is_root()) std::printf("%s; each cut into %d pieces\n", buckets.describe(bucket_bytes).c_str(), world.size());

  // This rank's averaged pieces of every bucket, side by side (a separate buffer: MPI may not
  // receive into the buffer it sends from).
  Buffer grad_shard(shard.size(), MemCategory::CommBuffers, dtype, device);

  // The lesson, 1: when a bucket's last gradient is final, reduce-scatter it; piece r to rank r.
  std::vector<CommHandle> in_flight;
  bool last_micro_batch = false;
  model.hooks.grad_ready = [&](int p) {
    if (!last_micro_batch) return;  // no_sync: gradients are not final until the last micro-batch
    const int b = buckets.mark_ready(p);
    if (b < 0) return;  // the bucket still waits for other gradients
    const int i = shard.range_index(buckets.begin(b));
    in_flight.push_back(wire_reduce_scatter_async(world, grads.view().slice1d(buckets.begin(b), buckets.size(b)),
                                                  shard.piece_of_shard(grad_shard.view(), i), ReduceOp::Avg,
                                                  collective_formats().gradients));
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
    for (CommHandle& handle : in_flight) handle.wait();
    in_flight.clear();
    buckets.reset();

    // The lesson, 2: the global gradient norm from every shard's sum of squares, then AdamW on
    // this rank's pieces only.
    const double norm = std::sqrt(world.all_reduce_scalar(sum_of_squares(grad_shard.view()), ReduceOp::Sum));
    optimizer.update(params.view(), grad_shard.view(), step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));

    // The lesson, 3: every rank gathers everyone's updated pieces, bucket by bucket, in place.
    for (int i = 0; i < shard.count(); i++) {
      const FlatRange range = shard.range(i);
      in_flight.push_back(gather_updated_async(world, layout, range, shard.piece_of_full(params.view(), i), params.view()));
    }
    for (CommHandle& handle : in_flight) handle.wait();
    in_flight.clear();

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
  flags.add("--bucket-mb", &opt.bucket_mb, "target bucket size in MB, a bucket holding whole layers (default: an "
                                          "eighth of the gradient)");
  if (!parse_train_flags(argc, argv, "04_zero1",
                         "Chapter 04: ZeRO-1, optimizer state sharded over ranks.", flags, &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  if (cfg.was_given("--bucket-mb") && !(opt.bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);  // NCCL on GPUs (comm_factory.h)
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
