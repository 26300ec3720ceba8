// Chapter 06: ZeRO-3: shard the parameters too, and gather each layer just in time.
//
// The idea. Rank r keeps only piece r of every layer's parameters. Before a layer's forward, and
// again before its backward, the ranks all-gather it into a layer-sized buffer, released after use;
// the next layer's gather is launched first (prefetched) to hide it.
// What to notice: parameters at 4Ψ/N; 1.5x DP's bytes; --no-prefetch exposes the gathers.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 06_zero3 && mpiexec -n 2 ./06_zero3/train --link-gbps 0.5 --no-prefetch   # the gathers exposed
#include <cmath>

#include "comm/comm.h"
#include "ops/device.h"
#include "training/chapter_main.h"  // run_chapter: main(), flags and checks
#include "training/flags.h"
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/shards.h"
#include "training/training_run.h"

#include "parallel/layer_gather.h"
#include "parallel/layer_grads.h"
#include "training/zero3_report.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  bool no_prefetch = false;

  void declare(FlagParser& flags, TrainConfig&) {
    flags.add_switch("--no-prefetch", &no_prefetch, "gather each layer only when it is needed (no overlap)");
  }
  void check(TrainConfig&, int /*ranks*/) {}
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  TrainingRun run(grid, cfg, Parallelism{Strategy::ZeRO3});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();

  // Every rank holds only its shard of parameters, gradients and optimizer state.
  const ShardPlan shard = ShardPlan::per_unit(layout, world.size(), world.rank());  // piece r of every layer
  Buffer param_shard(shard.size(), MemCategory::Params, dtype, device);
  Buffer grad_shard(shard.size(), MemCategory::Grads, dtype, device);
  AdamW optimizer(layout, shard, cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  // Nothing bound to the model: its layers come and go.
  const int start = run.init_or_resume(param_shard, optimizer);
  const int head = layout.num_units() - 1;  // final layernorm + tied LM head

  // The lesson, 1: a layer is gathered into a layer-sized buffer, every rank giving its piece
  // (GatheredLayers in common/ holds the buffers, binds each to the model and counts the peak).
  GatheredLayers layers(world, model, shard, param_shard.view(), dtype, device);
  auto prefetch = [&](int u) {
    if (!opt.no_prefetch) layers.gather(u);
  };

  // The lesson, 2: forward gathers layer u, prefetches u+1, and releases u after its forward.
  model.hooks.before_forward = [&](int u) {
    layers.use(u);
    prefetch(u + 1);
  };
  model.hooks.after_forward = [&](int u) {
    if (u == 0) return;  // wte is needed again by the tied head
    layers.release(u);
    if (u == head) layers.release(0);
  };

  // The lesson, 3: backward gathers again, walking down, and reduce-scatters each layer's gradients
  // to their owners as 05 does.
  LayerGradReducer reducer(world, model, shard, grad_shard.view());
  model.hooks.before_backward = [&](int u) {
    layers.use(u);
    reducer.open(u);
    if (u == head) {  // the tied head reads wte and writes its gradient
      layers.use(0);
      reducer.open(0);
    }
    prefetch(u - 1);  // unit 0 is already there when u - 1 == 0
  };
  model.hooks.after_backward = [&](int u) {
    reducer.reduce_scatter(u);
    layers.release(u);  // unit 0 (wte) goes only after its own backward, the last
  };

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
    // this rank's pieces only. No all-gather: the next forward gathers each layer when it needs it.
    const double norm = std::sqrt(world.all_reduce_scalar(sum_of_squares(grad_shard.view()), ReduceOp::Sum));
    optimizer.update(param_shard.view(), grad_shard.view(), step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));

    run.end_step(step, loss, norm);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, param_shard, optimizer);
    if (run.stopping()) break;  // Ctrl-C or a diverging loss: every rank agreed to stop here
  }
  report_zero3_peak(run, shard, layers.peak());  // next to its prediction from the layout (zero3_report.h)
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "06_zero3",
                     "Chapter 06: ZeRO-3, parameters, gradients and optimizer state sharded.", train);
}
