// Chapter 05: ZeRO-2: shard the gradients too.
//
// The idea. After ZeRO-1, every rank still holds a full gradient buffer (4 bytes per parameter),
// although after the reduce-scatter it needs only its own slice. ZeRO-2 never builds the full
// buffer: each layer's gradients go into a transient buffer that exists only while that layer's
// backward runs and its reduce-scatter travels. The moment a layer's gradients are final, they are
// reduce-scattered (during backward, overlapping it): rank r owns piece r of every layer, as in 04
// it owned piece r of every bucket, adds the piece it receives into its gradient shard, and the
// buffer is freed. The only persistent gradient memory is the shard: 4Ψ/N.
//
// What changed since 04: the full gradient buffer is gone; gradients are bound per layer to
// transient buffers (model.bind_unit_grads), and the reduce-scatter moved from the bucket's
// gradient-ready hook to the layer's after_backward hook (common/parallel/layer_grads.h), so the shard is cut
// by layers, not buckets. At most two layers' reduce-scatters are in flight: that bounds the
// transient memory. The tied embedding: the
// LM head writes wte's gradient first and the embedding writes it last, so unit 0's buffer opens
// with the head's backward and closes after the embedding's.
// Gradient accumulation: a micro-batch's gradients cannot wait in a full buffer for the next one
// (there is none), so EVERY micro-batch reduce-scatters and the pieces accumulate into the shard:
// K reduce-scatters per step instead of one. This is why pipeline-parallel frameworks, which run
// many micro-batches per step, stop at ZeRO-1.
// What stayed: the optimizer on a shard, the global norm from one scalar all-reduce, the in-place
// all-gather of parameters. What to notice: gradients at 4Ψ/N in the theory table; bytes per step
// still equal DP's (with K = 1); time and exposed communication about 04's.
//
// Run:
//   make 05_zero2
//   mpiexec -n 4 ./05_zero2/train --grad-accum 2     # gradients and optimizer state: 1/4 per rank
// Output: as 04; the theory table shows gradients at 4Ψ/N, and the layer buffers as transient.
#include <cmath>
#include <vector>

#include "comm/comm.h"
#include "comm/comm_factory.h"
#include "ops/device.h"
#include "training/flags.h"
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/shards.h"
#include "parallel/weight_gather.h"  // gather_updated_async: the parameters in the recipe's format
#include "training/training_run.h"

#include "parallel/layer_grads.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h).
struct Options {
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options&) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  TrainingRun run(grid, cfg, Parallelism{Strategy::ZeRO2});
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();
  const ShardPlan shard = ShardPlan::per_unit(layout, world.size(), world.rank());  // piece r of every layer
  const int head = layout.num_units() - 1;  // final layernorm + tied LM head

  // Every rank holds all parameters, but gradients and optimizer state for its shard only.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grad_shard(shard.size(), MemCategory::Grads, dtype, device);
  AdamW optimizer(layout, shard, cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_params(0, layout.padded_size, params.data());  // gradients are bound layer by layer below
  const int start = run.init_or_resume(params, optimizer);

  // The lesson: a layer's gradients get a transient buffer when its backward starts, and are
  // reduce-scattered to their owners the moment its backward ends (LayerGradReducer in common/
  // holds the buffers, the in-flight limit, and adds each received piece into grad_shard).
  LayerGradReducer reducer(world, model, shard, grad_shard.view());
  model.hooks.before_backward = [&](int u) {
    reducer.open(u);
    if (u == head) reducer.open(0);  // the tied head writes wte's gradient, final only after unit 0
  };
  model.hooks.after_backward = [&](int u) { reducer.reduce_scatter(u); };
  std::vector<CommHandle> in_flight;  // the parameters' all-gathers, after the optimizer

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

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  if (!parse_train_flags(argc, argv, "05_zero2",
                         "Chapter 05: ZeRO-2, optimizer state and gradients sharded.", flags, &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);  // NCCL on GPUs (comm_factory.h)
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
