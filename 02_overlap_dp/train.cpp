// Chapter 02: overlap gradient communication with backward.
//
// The idea. In chapter 01 the all-reduce starts only once backward has finished, so the network
// idles during backward and the cores idle during the all-reduce. But backward finishes the
// gradients one parameter at a time, from the last layer to the first, and a finished gradient
// never changes again. So: the moment a parameter's gradient is final, start averaging it
// asynchronously, and keep computing the rest of backward while it travels. Before the optimizer
// step, wait for every handle. The communication thread of common/comm/comm_engine.cpp makes the async
// all-reduce progress while this thread computes.
//
// What changed since 01: a grad_ready hook launches one async all-reduce per parameter; the
// blocking all-reduce after backward became a wait on all handles. With --grad-accum K, the first
// K-1 micro-batches only accumulate locally and launch nothing ("no_sync"): only the last one
// communicates, once the accumulated gradient is final.
// What stayed: the model, the data split, AdamW; the losses equal 01's (the tests check it).
// What to notice: "exposed comm" falls below the total communication time, and the number of
// collectives per step rises from 1 to one per parameter tensor (2 + 12L + 2), each paying latency.
//
// Run:
//   make 02_overlap_dp
//   mpiexec -n 2 ./02_overlap_dp/train --link-gbps 0.25      # emulated slow link: overlap shows
//   mpiexec -n 2 ./02_overlap_dp/train --trace trace.json    # all-reduces under backward spans
// Output: as 01; the summary line counts collectives per step and splits exposed from total comm:
//   average over 19 measured steps: 24.8 ms/step | ... | exposed comm 11.09 ms | comm 17.70 ms | 28 collectives/step
//   (2 ranks, --link-gbps 0.25: the link is slower than backward, so part stays exposed)
#include <cmath>
#include <vector>

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

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  if (!parse_train_flags(argc, argv, "02_overlap_dp",
                         "Chapter 02: data parallelism with each gradient's all-reduce overlapping backward.", flags, &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);  // NCCL on GPUs (comm_factory.h)
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
