// Chapter 05: ZeRO-2: shard the gradients too.
//
// The idea. ZeRO-1 still holds a full gradient buffer. ZeRO-2 never builds it: a layer's gradients
// live in a transient buffer while its backward runs and are reduce-scattered the moment they are
// final, rank r adding piece r of every layer into its gradient shard (under --grad-accum, each time).
// What to notice: gradients at 4Ψ/N in the theory table; bytes per step still DP's (with K = 1).
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 05_zero2 && mpiexec -n 4 ./05_zero2/train --grad-accum 2   # gradients and state: 1/4 per rank
#include <cmath>
#include <vector>

#include "comm/comm.h"
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

#include "parallel/layer_grads.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  void declare(FlagParser&, TrainConfig&) {}
  void check(TrainConfig&, int /*ranks*/) {}
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options&) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  TrainingRun run(grid, cfg, Parallelism{Strategy::ZeRO2});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();

  // Every rank holds all parameters, but gradients and optimizer state for its shard only.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  const ShardPlan shard = ShardPlan::per_unit(layout, world.size(), world.rank());  // piece r of every layer
  Buffer grad_shard(shard.size(), MemCategory::Grads, dtype, device);
  AdamW optimizer(layout, shard, cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_params(0, layout.padded_size, params.data());  // gradients are bound layer by layer below
  const int start = run.init_or_resume(params, optimizer);
  const int head = layout.num_units() - 1;  // final layernorm + tied LM head

  // The lesson: a layer's gradients get a transient buffer when its backward starts, and are
  // reduce-scattered to their owners the moment its backward ends (LayerGradReducer in common/
  // holds the buffers, the in-flight limit, and adds each received piece into grad_shard).
  std::vector<CommHandle> in_flight;
  LayerGradReducer reducer(world, model, shard, grad_shard.view());
  model.hooks.before_backward = [&](int u) {
    reducer.open(u);
    if (u == head) reducer.open(0);  // the tied head writes wte's gradient, final only after unit 0
  };
  model.hooks.after_backward = [&](int u) { reducer.reduce_scatter(u); };

  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    fill_zero(grad_shard.view());
    float loss = 0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
      MicroBatch batch = run.micro_batch(step, micro);
      loss += model.forward(batch.inputs, batch.targets, batch.B) / cfg.grad_accum;
      model.backward(1.0f / cfg.grad_accum);
      reducer.finish();  // this micro-batch's pieces are now in the shard
    }

    // As in 04: the global gradient norm from every shard's sum of squares, then AdamW on
    // this rank's pieces only.
    const double norm = std::sqrt(world.all_reduce_scalar(sum_of_squares(grad_shard.view()), ReduceOp::Sum));
    optimizer.update(params.view(), grad_shard.view(), step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));

    // As in 04: every rank gathers everyone's updated pieces, layer by layer, in place.
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
  return run_chapter(argc, argv, "05_zero2",
                     "Chapter 05: ZeRO-2, optimizer state and gradients sharded.", train);
}
