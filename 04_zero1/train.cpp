// Chapter 04: ZeRO-1: shard the optimizer state.
//
// The idea. In chapters 01-03 every rank keeps the whole AdamW state (m and v: 8 bytes per
// parameter, twice the parameters themselves) and every rank computes the same update. That is N
// copies of the same work and of the largest memory category. ZeRO-1 splits it: rank r owns the
// flat slice [r*S, (r+1)*S), S = padded parameters / N, and keeps m and v for that slice only.
// Each step, after backward:
//   1. reduce-scatter the gradients, bucket by bucket: each bucket's owners receive their piece of
//      it, averaged over ranks (ShardPlan splits a bucket by owner);
//   2. AdamW updates only this rank's slice of the parameters;
//   3. all-gather the updated slices, so every rank again holds all parameters.
// A reduce-scatter plus an all-gather moves exactly what one all-reduce moves (an all-reduce IS a
// reduce-scatter followed by an all-gather), so the memory is saved for free in bytes.
//
// What changed since 03: the bucketed all-reduce became a bucketed reduce-scatter after backward,
// the optimizer runs on a shard, and an all-gather of parameters follows it. Gradient clipping needs
// the global norm, but each rank now sees only its shard: one scalar all-reduce of the sums of
// squares gives it. What stayed: full parameters and full gradients on every rank (05 shards those).
// What to notice: "optimizer state" in the theory table drops to 8Ψ/N; bytes per step equal 01's.
// The reduce-scatters start only after backward, so 03's overlap is gone: exposed comm is again the
// whole of it (bucketing here only pipelines the messages). 05 moves them back into backward.
//
// Run:
//   make 04_zero1
//   mpiexec -n 4 ./04_zero1/train                  # optimizer state: a quarter per rank
//   mpiexec -n 2 ./04_zero1/train --bucket-mb 0.05 --link-gbps 0.5
// Output: as 01; in the theory table optimizer state is 8Ψ/N and comm bytes equal the DP row:
//   optimizer state            241.2 KB     241.2 KB      (4 ranks, tiny)
#include <cmath>
#include <vector>

#include "buckets.h"
#include "comm.h"
#include "comm_factory.h"
#include "device.h"
#include "flags.h"
#include "memory.h"
#include "model.h"
#include "ops.h"
#include "optimizer.h"
#include "shards.h"
#include "training_run.h"

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  double bucket_mb = 0.125;
  flags.add("--bucket-mb", &bucket_mb, "target bucket size in MB for the gradient reduce-scatter");
  if (!parse_train_flags(argc, argv, "04_zero1", "Chapter 04: ZeRO-1, optimizer state sharded over ranks.", flags,
                         &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  if (!(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  comm = communicator_for(pick_device(cfg.device), std::move(comm));  // NCCL on GPUs (comm_factory.h)
  TrainingRun run(*comm, cfg, Strategy::ZeRO1);
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();
  const ShardPlan shard(layout, comm->rank());

  // Every rank holds all parameters and all gradients, but optimizer state for its shard only.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  AdamW optimizer(layout, shard.begin(), shard.end(), cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);
  const GradientBuckets buckets(layout, bucket_mb * 1e6, dtype_size(dtype));

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grads.view());
    float loss = 0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
      MicroBatch batch = run.micro_batch(step, micro);
      loss += model.forward(batch.inputs, batch.targets, batch.B) / cfg.grad_accum;
      model.backward(1.0f / cfg.grad_accum);
    }

    // The lesson, 1: reduce-scatter each bucket; this rank receives the average of its piece. The
    // pieces of all buckets tile this rank's shard, so they land side by side in one shard-sized
    // buffer (a separate one: MPI may not receive into the buffer it sends from).
    Buffer grad_shard(shard.size(), MemCategory::CommBuffers, dtype, device);
    std::vector<CommHandle> in_flight;
    for (int b = 0; b < buckets.count(); b++) {
      const int64_t lo = shard.piece_begin(buckets.begin(b), buckets.end(b));
      const int64_t hi = shard.piece_end(buckets.begin(b), buckets.end(b));
      in_flight.push_back(comm->reduce_scatter_v_async(grads.view().slice1d(buckets.begin(b), buckets.size(b)),
                                                       grad_shard.view().slice1d(lo - shard.begin(), hi - lo),
                                                       shard.counts(buckets.begin(b), buckets.end(b)), ReduceOp::Avg));
    }
    for (CommHandle& handle : in_flight) handle.wait();

    // The lesson, 2: the global gradient norm from every shard's sum of squares, then AdamW on
    // this rank's slice only.
    const double norm = std::sqrt(comm->all_reduce_scalar(sum_of_squares(grad_shard.view()), ReduceOp::Sum));
    optimizer.update(params.view().slice1d(shard.begin(), shard.size()), grad_shard.view(), step + 1, run.lr(step),
                     clip_factor(norm, cfg.grad_clip));

    // The lesson, 3: every rank gathers everyone's updated slice, in place.
    comm->all_gather(params.view().slice1d(shard.begin(), shard.size()), params.view());

    run.end_step(step, loss, norm);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
  }
  run.finish();
  shutdown_mpi(std::move(comm));
  return 0;
}
