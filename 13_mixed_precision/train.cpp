// Chapter 13: mixed precision. Products in bf16, fp16 or fp8; master weights and AdamW in fp32.
// Base chapter: 03_bucket_dp
//
// The idea. Products in a low-precision format move fewer bytes and run faster; the training state
// stays fp32 (AdamW updates fp32 master weights, each product casts them as it reads them). fp16
// scales the loss, fp8 every tensor, row or block by its amax; on the CPU every product is emulated
// with the hardware's semantics, on one GPU the products run in cuBLASLt.
// What to notice: the recipe, each skipped step with its scale, the underflows and overflows.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Run:
//   make 13_mixed_precision && mpiexec -n 2 ./13_mixed_precision/train --precision fp8 --fp8-scaling blocks
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "comm/wire_format.h"  // the gradients travel in the recipe's format
#include "ops/device.h"
#include "training/chapter_main.h"  // run_chapter: main(), flags and checks
#include "training/flags.h"
#include "training/mixed_precision.h"  // collective_formats_of: which format each collective moves
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/shards.h"
#include "training/training_run.h"

#include "training/precision_recipe.h"  // PrecisionRecipe, LowPrecisionMatmuls: the products as the format does them
#include "training/precision_report.h"  // PrecisionFlags, precision_recipe_from_flags, PrecisionLog: flags, records, summary
#include "training/precision_state.h"   // save_precision_state, load_precision_state: the scale beside a checkpoint

// The loss scale of fp16: large enough that small gradients survive the format, halved when a step
// overflows, doubled after `window` clean steps. A fixed scale (--loss-scale N) never moves.
struct LossScaler {
  float scale = 1;
  bool dynamic = false;
  int window = 0, clean_steps = 0;
  // Returns true when the step may be applied.
  bool after_backward(bool overflowed) {
    if (overflowed) {
      if (dynamic) scale = std::max(scale / 2, 1.0f);
      clean_steps = 0;
      return false;
    }
    if (dynamic && ++clean_steps == window) scale *= 2, clean_steps = 0;
    return true;
  }
};

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  double bucket_mb = 0;
  PrecisionFlags precision;  // --precision, --fp8-scaling, --loss-scale, ...
  PrecisionRecipe recipe;    // what those flags ask for, checked before the grid

  void declare(FlagParser& flags, TrainConfig&) {
    flags.add("--bucket-mb", &bucket_mb, "target bucket size in MB, a bucket holding whole tensors (default: an "
                                         "eighth of the gradient)");
    add_precision_flags(flags, &precision);
  }
  void check(TrainConfig& cfg, int /*ranks*/) {
    if (cfg.was_given("--bucket-mb") && !(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
    recipe = precision_recipe_from_flags(precision, cfg);  // refuses what cannot run, naming the flag
  }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  ProcessGrid grid(world);  // data parallelism alone: every rank a replica, the world its one group
  // The gradients' all-reduce moves the layer's dtype (bf16; fp16 under fp16, already multiplied by
  // the loss scale: backward starts from the scaled loss), half of fp32's bytes. Installed before
  // the run, whose memory forecast counts the codes the collectives stage on their way.
  set_collective_formats(world, collective_formats_of(opt.recipe, 1.0f));
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
  AdamW optimizer(layout, ShardPlan::unsharded(layout), cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);

  // The fp32 master copy is `params` itself: AdamW updates it in fp32, checkpoints hold it. The cast
  // to the recipe's format happens where the format matters, as each product reads its weight
  // (LowPrecisionMatmuls), as torch.autocast and Transformer Engine do; layernorm's gains and the
  // biases are read in fp32, and the model state stays 4 + 4 + 8 bytes a parameter.
  const PrecisionRecipe& recipe = opt.recipe;
  const bool low_precision = recipe.precision != Precision::FP32;
  // Every product of the model through the recipe; the amax histories are reduced over the data-
  // parallel ranks (every rank's tensors are a slice of the same global batch's), so every rank takes
  // the same scales. A few scalars a step, sent as the loss is (not the gradient traffic of 03's table).
  LowPrecisionMatmuls products(recipe, params.f32(), grads.f32(), [&](std::vector<float>& amaxes) {
    for (float& amax : amaxes) amax = float(world.all_reduce_scalar(amax, ReduceOp::Max));
  });
  products.keep_in_output_format(layout.params[0].offset);  // the LM head (wte, tied) stays in bf16
  if (low_precision) set_cpu_matmul_emulation(&products);
  LossScaler scaler;
  if (recipe.precision == Precision::FP16) {
    scaler.dynamic = opt.precision.loss_scale == 0;
    scaler.scale = scaler.dynamic ? float(opt.precision.loss_scale_init) : float(opt.precision.loss_scale);
    scaler.window = opt.precision.loss_scale_window;
  }
  // A resumed run continues with the loss scale and amax histories the uninterrupted one had: they
  // live beside the checkpoint (PATH.precision), as the weights live in it.
  if (low_precision && !cfg.resume.empty())
    load_precision_state(cfg.resume, recipe, &scaler.scale, &scaler.clean_steps, products, layout, world);
  PrecisionLog log(recipe, run, world);
  if (run.is_root()) std::printf("precision: %s\n", recipe.describe().c_str());

  if (run.is_root()) std::printf("%s\n", buckets.describe(bucket_bytes).c_str());

  // 03's lesson: when a bucket's last gradient is final, start averaging the whole bucket.
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
      model.backward(scaler.scale / cfg.grad_accum);  // the loss scale enters at the top of backward
    }

    // Most of them finished while backward ran; wait for the rest.
    for (CommHandle& handle : in_flight) handle.wait();
    in_flight.clear();
    buckets.reset();

    // The scaler (fp16): an inf or NaN anywhere in the (already averaged, so equal) gradient means the
    // scale was too large for fp16. Skip the step; every rank decides alike. Elsewhere a non-finite
    // gradient is a diverging run, stopped by end_step as in every chapter.
    const float loss_scale = scaler.scale;  // what backward multiplied by
    const bool overflowed = !std::isfinite(sum_of_squares(grads.view()));
    const bool apply = recipe.precision != Precision::FP16 || scaler.after_backward(overflowed);
    // Back to the true gradient (exactly: a power of two) before the clip and AdamW.
    if (apply && loss_scale != 1) scale_inplace(grads.view(), 1.0f / loss_scale);

    // Every rank now holds the same full gradient, so its norm is already global.
    const double norm = std::sqrt(sum_of_squares(grads.view()));
    if (apply) optimizer.update(params.view(), grads.view(), step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    products.end_step();  // the amax history: this step's amaxes, reduced over the ranks, join it
    log.after_step(step, apply, scaler.scale, products);
    run.end_step(step, loss, apply ? norm : 0.0);
    if (run.checkpoint_due(step)) {
      run.save_checkpoint(step + 1, params, optimizer);
      if (low_precision)
        save_precision_state(checkpoint_path(cfg.save, step + 1), recipe, scaler.scale, scaler.clean_steps, products,
                             layout, world);
    }
    if (run.stopping()) break;  // Ctrl-C or a diverging loss: every rank agreed to stop here
  }
  set_cpu_matmul_emulation(nullptr);
  set_collective_formats(world, {});
  const GPT2Config& shape = run.model_config();
  log.summary(products, layout.padded_size, shape.L, shape.C, shape.V,
              int64_t(run.micro_batch_size()) * shape.T * cfg.grad_accum, cfg.grad_accum);
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "13_mixed_precision",
                     "Chapter 13: mixed precision (bf16, fp16 with loss scaling, fp8 with scaling) on 03's data parallelism.",
                     train);
}
