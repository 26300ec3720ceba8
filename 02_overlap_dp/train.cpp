// Chapter 02: overlap gradient communication with backward.
//
// The idea. Backward finishes the gradients one parameter at a time, and a finished gradient never
// changes again: the moment it is final, start averaging it asynchronously, and wait for every
// handle only before the optimizer step. With --grad-accum K only the last micro-batch communicates.
// What to notice: "exposed comm" below the total communication; one collective per tensor.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 02_overlap_dp && mpiexec -n 2 ./02_overlap_dp/train --link-gbps 0.25   # overlap shows
#include <cmath>
#include <vector>

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
  void declare(FlagParser&, TrainConfig&) {}
  void check(TrainConfig&, int /*ranks*/) {}
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options&) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  TrainingRun run(grid, cfg, Parallelism{Strategy::DP});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();
  std::vector<int64_t> per_tensor;  // the theory table's: one all-reduce a tensor (chapter 00's pick by size)
  for (const ParamInfo& info : layout.params) per_tensor.push_back(info.size);
  run.set_gradient_all_reduces(per_tensor);

  // Every rank holds all parameters, all gradients and the whole optimizer state.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  AdamW optimizer(layout, ShardPlan::unsharded(layout), cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);

  // The lesson: as soon as a parameter's gradient is final, start averaging it, without waiting.
  std::vector<CommHandle> in_flight;
  bool last_micro_batch = false;
  model.hooks.grad_ready = [&](int p) {
    if (!last_micro_batch) return;  // no_sync: gradients are not final until the last micro-batch
    const ParamInfo& info = layout.params[p];
    in_flight.push_back(wire_all_reduce_async(world, grads.view().slice1d(info.offset, info.size), ReduceOp::Avg,
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
  return run_chapter(argc, argv, "02_overlap_dp",
                     "Chapter 02: data parallelism with each gradient's all-reduce overlapping backward.", train);
}
