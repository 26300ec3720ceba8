// Chapter 06: ZeRO-3: shard the parameters too, and gather each layer just in time.
//
// The idea. After ZeRO-2 every rank still holds all parameters, yet the model computes with one
// layer at a time. ZeRO-3 (FSDP) keeps only this rank's piece of every layer: before a layer's
// forward and again before its backward, the ranks all-gather it into a layer-sized buffer, released
// after use; the next layer's gather is launched first (prefetched) to hide it.
// What changed since 05: the parameters are sharded; hooks gather, prefetch and release layers; no
// all-gather follows the optimizer. The tied wte keeps unit 0 gathered from the embedding to the head.
// What to notice: parameters at 4Ψ/N; the gathered layers as transient buffers; 1.5x DP's bytes;
// --no-prefetch exposes the gathers.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 06_zero3
//   mpiexec -n 4 ./06_zero3/train
//   mpiexec -n 2 ./06_zero3/train --link-gbps 0.5 --no-prefetch    # see the gathers exposed
// Output: as 05, plus the peak of parameter memory: the shard and the gathered layers.
#include <algorithm>
#include <cmath>
#include <map>

#include "comm/comm.h"
#include "ops/device.h"
#include "training/chapter_main.h"  // run_chapter: main(), flags and checks
#include "training/flags.h"
#include "parallel/weight_gather.h"  // gather_unit_async: a layer in the recipe's formats (fp32: as it is)
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/shards.h"
#include "training/training_run.h"

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
  const ShardPlan shard = ShardPlan::per_unit(layout, world.size(), world.rank());  // piece r of every layer
  const int head = layout.num_units() - 1;  // final layernorm + tied LM head

  // Every rank holds only its shard of parameters, gradients and optimizer state.
  Buffer param_shard(shard.size(), MemCategory::Params, dtype, device);
  Buffer grad_shard(shard.size(), MemCategory::Grads, dtype, device);
  AdamW optimizer(layout, shard, cfg.weight_decay, device, dtype);
  // Nothing bound to the model: its layers come and go.
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  const int start = run.init_or_resume(param_shard, optimizer);

  // The lesson, 1: gather a layer's parameters into a layer-sized buffer, every rank giving its piece.
  struct Gathered {
    Buffer params;
    CommHandle handle;
    bool bound = false;
  };
  std::map<int, Gathered> gathered;
  int64_t gathered_now = 0, gathered_peak = 0;  // elements, for the report at the end
  auto gather = [&](int u) {  // launches the all-gather; returns at once
    if (u < 0 || u > head || gathered.count(u)) return;
    Gathered& g = gathered[u];
    g.params = Buffer(layout.unit_size(u), MemCategory::CommBuffers, dtype, device);
    g.handle = gather_unit_async(world, layout, u, shard.piece_of_shard(param_shard.view(), u), g.params.view());
    gathered_now += layout.unit_size(u);
    gathered_peak = std::max(gathered_peak, gathered_now);
  };
  auto use = [&](int u) {  // the layer is about to compute: its gather must be complete
    gather(u);
    Gathered& g = gathered[u];
    if (!g.bound) {
      g.handle.wait();
      model.bind_unit_params(u, g.params.data());
      g.bound = true;
    }
  };
  auto release = [&](int u) {
    model.bind_unit_params(u, nullptr);
    gathered_now -= layout.unit_size(u);
    gathered.erase(u);  // frees the buffer
  };
  auto prefetch = [&](int u) {
    if (!opt.no_prefetch) gather(u);
  };

  // The lesson, 2: forward gathers layer u, prefetches u+1, and releases u after its forward.
  model.hooks.before_forward = [&](int u) {
    use(u);
    prefetch(u + 1);
  };
  model.hooks.after_forward = [&](int u) {
    if (u == 0) return;  // wte is needed again by the tied head
    release(u);
    if (u == head) release(0);
  };

  // The lesson, 3: backward gathers again, walking down, and reduce-scatters each layer's gradients
  // to their owners as 05 does.
  LayerGradReducer reducer(world, model, shard, grad_shard.view());
  model.hooks.before_backward = [&](int u) {
    use(u);
    reducer.open(u);
    if (u == head) {  // the tied head reads wte and writes its gradient
      use(0);
      reducer.open(0);
    }
    prefetch(u - 1);  // unit 0 is already there when u - 1 == 0
  };
  model.hooks.after_backward = [&](int u) {
    reducer.reduce_scatter(u);
    release(u);  // unit 0 (wte) goes only after its own backward, the last
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
  report_zero3_peak(run, shard, gathered_peak);  // next to its prediction from the layout (zero3_report.h)
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "06_zero3",
                     "Chapter 06: ZeRO-3, parameters, gradients and optimizer state sharded.", train);
}
