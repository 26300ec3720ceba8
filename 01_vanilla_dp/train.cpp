// Chapter 01: vanilla data parallelism: all-reduce the gradients after backward.
//
// The idea. Every rank holds a full copy of the model and of the optimizer. Each step, the global
// batch of B sequences is split evenly: rank r of N trains on samples [r*B/N, (r+1)*B/N). After
// backward, every rank holds the gradient of ITS samples only; one all-reduce that averages every
// gradient over the ranks gives each rank the gradient of the whole batch. Every rank then takes
// the same AdamW step from the same weights, so the copies never drift apart, and the losses are
// those of one rank training on the whole batch (the tests check it to 1e-5).
//
// What changed: this is the first chapter; everything it does not teach lives in common/ (the
// model, ops, flat buffers, AdamW, data, checkpoints, the MPI and NCCL communicators, metrics).
// --device (auto by default) picks the CPU or a GPU; the lesson is the same on both. On a GPU the
// default --dtype is bf16 mixed precision: the buffers below then hold bf16, and AdamW keeps fp32
// master weights (optimizer.h), so the all-reduce moves half the bytes.
// What to notice: communication starts only once backward has finished, so every millisecond of it
// is exposed: "exposed comm" in the step line equals the all-reduce's whole time.
// With --grad-accum K, each rank runs K micro-batches and accumulates before the single all-reduce.
//
// Run:
//   make 01_vanilla_dp
//   mpiexec -n 2 ./01_vanilla_dp/train                    # tiny preset, 20 steps, 2 ranks
//   mpiexec -n 4 ./01_vanilla_dp/train --grad-accum 2 --json results/run.jsonl --trace results/trace.json
//   mpiexec -n 8 ./01_vanilla_dp/train --preset gpt2 --device cuda   # one GPU per rank, over NCCL
// Output: a run header, one line per step, then measured memory and bytes next to theory:
//   step 5/20 | loss 4.3105 | lr 2.7e-3 | grad norm 1.52 | 12.3 ms | 41.7k tok/s | exposed comm 0.9 ms | mem 7.7 MB
//   (2 ranks; lr and grad norm: this step's learning rate and gradient norm, before clipping)
// Loss falls from about 5.5 (= ln 256, uniform over bytes) as the model learns the text.
#include <cmath>

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
#include "training/training_run.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h).
struct Options {
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

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  if (!parse_train_flags(argc, argv, "01_vanilla_dp",
                         "Chapter 01: data parallelism, one all-reduce after backward.", flags, &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);  // NCCL on GPUs (comm_factory.h)
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
