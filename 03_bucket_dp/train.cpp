// Chapter 03: bucket the gradients, then overlap each bucket's all-reduce with backward.
//
// The idea. All-reduce buckets of about --bucket-mb (ranges of the gradient buffer), each the moment
// its last gradient is final: 8 collectives per step here, not one per tensor (02: 28), each a latency.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 03_bucket_dp && mpiexec -n 2 ./03_bucket_dp/train --preset deep --link-gbps 2 --link-latency-us 50
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
#include "training/training_run.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  double bucket_mb = 0;

  void declare(FlagParser& flags, TrainConfig&) {
    flags.add("--bucket-mb", &bucket_mb, "target bucket size in MB, a bucket holding whole tensors (default: an "
                                         "eighth of the gradient)");
  }
  void check(TrainConfig& cfg, int /*ranks*/) {
    if (cfg.was_given("--bucket-mb") && !(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  TrainingRun run(grid, cfg, Parallelism{Strategy::DP});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();
  Communicator& replicas = grid.dp();  // every rank that holds the same parameters

  // Every rank holds all parameters, all gradients and the whole optimizer state.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype));
  run.set_gradient_all_reduces(buckets.sizes());  // the theory table's: one all-reduce a bucket
  AdamW optimizer(layout, ShardPlan::unsharded(layout), cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);
  if (run.is_root()) std::printf("%s\n", buckets.describe(bucket_bytes).c_str());

  // The lesson: when a bucket's last gradient is final, start averaging the whole bucket.
  std::vector<CommHandle> in_flight;
  bool last_micro_batch = false;
  model.hooks.grad_ready = [&](int p) {
    if (!last_micro_batch) return;  // no_sync: gradients are not final until the last micro-batch
    const int b = buckets.mark_ready(p);
    if (b < 0) return;  // the bucket still waits for other gradients
    in_flight.push_back(wire_all_reduce_async(replicas, grads.view().slice1d(buckets.begin(b), buckets.size(b)),
                                              ReduceOp::Avg, collective_formats(replicas).gradients));
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

    // Every rank now holds the same full gradient, so its norm is already global.
    const double norm = std::sqrt(sum_of_squares(grads.view()));
    optimizer.update(params.view(), grads.view(), step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    run.end_step(step, loss, norm);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;  // Ctrl-C or a diverging loss: every rank agreed to stop here
  }
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "03_bucket_dp",
                     "Chapter 03: data parallelism with bucketed all-reduces overlapping backward.", train);
}
