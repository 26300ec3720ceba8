// Chapter 04: ZeRO-1: shard the optimizer state.
//
// The idea. Rank r keeps AdamW's state for piece r of every bucket only: a final bucket is
// reduce-scattered (piece r, averaged, to rank r), AdamW updates this rank's pieces, and an
// all-gather gives every rank all parameters again: the bytes of one all-reduce, 8Ψ/N of state.
// What to notice: optimizer state at 8Ψ/N in the theory table; the all-gather after it is exposed.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 04_zero1 && mpiexec -n 4 ./04_zero1/train                  # optimizer state: a quarter per rank
#include <cmath>
#include <cstdio>
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
#include "parallel/shards.h"
#include "parallel/weight_gather.h"  // gather_updated_async: the parameters in the recipe's format
#include "training/training_run.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  double bucket_mb = 0;

  void declare(FlagParser& flags, TrainConfig&) {
    flags.add("--bucket-mb", &bucket_mb, "target bucket size in MB, a bucket holding whole layers (default: an "
                                         "eighth of the gradient)");
  }
  void check(TrainConfig& cfg, int /*ranks*/) {
    if (cfg.was_given("--bucket-mb") && !(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  TrainingRun run(grid, cfg, Parallelism{Strategy::ZeRO1});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();

  // Every rank holds all parameters and all gradients, but optimizer state for its shard only.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype), BucketCut::AtLayers);
  const ShardPlan shard(buckets.ranges_in_flat_order(), world.size(), world.rank());  // piece r of every bucket
  // This rank's averaged pieces, side by side (a separate buffer: MPI may not receive where it sends from).
  Buffer grad_shard(shard.size(), MemCategory::CommBuffers, dtype, device);
  AdamW optimizer(layout, shard, cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);
  if (run.is_root()) std::printf("%s; each cut into %d pieces\n", buckets.describe(bucket_bytes).c_str(), world.size());

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
                                                  collective_formats(world).gradients));
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

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "04_zero1",
                     "Chapter 04: ZeRO-1, optimizer state sharded over ranks.", train);
}
