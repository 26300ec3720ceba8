// Chapter 01: vanilla data parallelism: all-reduce the gradients after backward.
//
// The idea. Every rank holds the whole model and optimizer and trains on its B/N sequences of the
// global batch; one all-reduce averages every gradient over the ranks after backward, so every rank
// takes the same AdamW step and the losses are one rank's on the whole batch (to 1e-5).
// What to notice: the all-reduce starts once backward has finished, so all of it is exposed.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 01_vanilla_dp && mpiexec -n 2 ./01_vanilla_dp/train
//   step 5/20 | loss 4.6174 | lr 1.9e-3 | grad norm 1.88 | 6.9 ms | 74.2k tok/s | exposed comm 1.3 ms | mem 7.4 MB
#include <cmath>

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

  // Every rank holds all parameters, all gradients and the whole optimizer state.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  AdamW optimizer(layout, ShardPlan::unsharded(layout), cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grads.view());
    float loss = 0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
      MicroBatch batch = run.micro_batch(step, micro);
      loss += model.forward(batch.inputs, batch.targets, batch.B) / cfg.grad_accum;
      model.backward(1.0f / cfg.grad_accum);
    }

    // The lesson: one blocking all-reduce averages every gradient over the ranks, after backward.
    wire_all_reduce(world, grads.view(), ReduceOp::Avg, collective_formats(world).gradients);

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
  return run_chapter(argc, argv, "01_vanilla_dp",
                     "Chapter 01: data parallelism, one all-reduce after backward.", train);
}
