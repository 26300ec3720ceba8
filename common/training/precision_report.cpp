// precision_report.cpp: chapter 13's flags, cast and reports (precision_report.h).
#include "training/precision_report.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"   // config_error
#include "ops/device.h"  // pick_device
#include "ops/matmul_cublaslt.h"
#include "ops/memory.h"  // memory_stats
#include "base/metrics.h" // JsonObject
#include "model/model_config.h"  // find_preset: the sizes fp8 products need on a GPU
#include "training/precision_state.h"  // loss_scale_text
#include "training/training_run.h"

void add_precision_flags(FlagParser& flags, PrecisionFlags* pf) {
  pf->registered = true;
  flags.add("--precision", &pf->precision, "fp32 | bf16 | fp16 | fp8: the format of every matrix product's inputs "
                                           "(master weights and AdamW stay fp32; default fp32)", "FORMAT");
  flags.add("--fp8-scaling", &pf->fp8_scaling, "none | current | delayed | row | blocks (fp8; default delayed)", "HOW");
  flags.add("--fp8-grad", &pf->fp8_grad, "e5m2 | e4m3: the gradients' fp8 format (default e5m2)", "FORMAT");
  flags.add("--fp8-accumulate", &pf->fp8_accumulate, "fp32 | tensor-core | promote128: how fp8 products are summed "
                                                     "(default fp32)", "HOW");
  flags.add("--amax-history", &pf->amax_history, "steps of amaxes delayed scaling keeps (default 16)");
  flags.add("--loss-scale", &pf->loss_scale, "fp16: a fixed loss scale (1: none); default dynamic");
  flags.add("--loss-scale-init", &pf->loss_scale_init, "fp16: the dynamic scale's first value (default 65536)");
  flags.add("--loss-scale-window", &pf->loss_scale_window, "fp16: clean steps before the dynamic scale doubles (default 50)");
}

namespace {

// The recipes the GPU path (precision_recipe_cuda.cpp) cannot run, each refused in one line naming
// the flag: fp8 without fp8 tensor cores; per-row and block scales, which cuBLASLt's per-tensor fp8
// scales cannot express on Hopper; fp8 products whose sizes cuBLASLt's fp8 kernels do not take.
void refuse_what_the_gpu_cannot_run(const PrecisionRecipe& r, const PrecisionFlags& pf, const TrainConfig& cfg) {
  if (r.precision != Precision::FP8) return;
#ifdef GPT_WITH_CUDA
  std::string why;
  if (!gpu_has_fp8_tensor_cores(&why))
    config_error("--precision fp8 needs fp8 tensor cores (compute capability 8.9+: Ada, Hopper); this GPU has " + why);
#endif
  if (r.scaling == Fp8Scaling::Row || r.scaling == Fp8Scaling::Blocks)
    config_error("--fp8-scaling " + pf.fp8_scaling + " runs on the CPU only: cuBLASLt's fp8 products on Hopper take "
                 "one scale per tensor (per-row and 1x128/128x128 block scales need their own kernels); use "
                 "--fp8-scaling current or delayed on a GPU, or --device cpu");
  // cuBLASLt's fp8 needs every size of a product in multiples of 16: C, 3C, 4C and the tokens of a
  // micro-batch (the LM head stays in bf16, so V may be anything). One rank on a GPU (TrainingRun).
  GPT2Config model;
  if (!find_preset(cfg.preset, &model)) return;  // TrainingRun names the unknown preset
  const int batch = cfg.batch > 0 ? cfg.batch : model.default_batch;
  const int64_t tokens = cfg.grad_accum > 0 ? int64_t(batch / cfg.grad_accum) * model.T : 0;
  if (model.C % 16 != 0 || tokens % 16 != 0)
    config_error("--precision fp8 on a GPU needs the model's width C (" + std::to_string(model.C) +
                 ") and the tokens of a micro-batch (" + std::to_string(tokens) + ") in multiples of 16, which "
                 "cuBLASLt's fp8 products require; use another --preset or --batch, or --device cpu");
}

}  // namespace

PrecisionRecipe precision_recipe_from_flags(const PrecisionFlags& pf, const TrainConfig& cfg) {
  PrecisionRecipe r;
  if (!parse_precision(pf.precision, &r.precision))
    config_error("--precision " + pf.precision + ": expected fp32, bf16, fp16 or fp8");
  const bool fp8 = r.precision == Precision::FP8, fp16 = r.precision == Precision::FP16;
  for (const char* flag : {"--fp8-scaling", "--fp8-grad", "--fp8-accumulate", "--amax-history"})
    if (cfg.was_given(flag) && !fp8) config_error(std::string(flag) + " applies to --precision fp8 only");
  for (const char* flag : {"--loss-scale", "--loss-scale-init", "--loss-scale-window"})
    if (cfg.was_given(flag) && !fp16) config_error(std::string(flag) + " applies to --precision fp16 only");
  if (!parse_fp8_scaling(pf.fp8_scaling, &r.scaling))
    config_error("--fp8-scaling " + pf.fp8_scaling + ": expected none, current, delayed, row or blocks");
  if (!parse_format(pf.fp8_grad.c_str(), &r.fp8_gradient) ||
      (r.fp8_gradient != NumberFormat::E5M2 && r.fp8_gradient != NumberFormat::E4M3))
    config_error("--fp8-grad " + pf.fp8_grad + ": expected e5m2 or e4m3");
  if (!parse_accumulate(pf.fp8_accumulate, &r.accumulate))
    config_error("--fp8-accumulate " + pf.fp8_accumulate + ": expected fp32, tensor-core or promote128");
  if (pf.amax_history < 1) config_error("--amax-history must be >= 1");
  if (cfg.was_given("--loss-scale") && !(pf.loss_scale >= 1)) config_error("--loss-scale must be >= 1 (1: no scaling)");
  if (!(pf.loss_scale_init >= 1) || pf.loss_scale_init > 1e30) config_error("--loss-scale-init must be in [1, 1e30]");
  if (pf.loss_scale_window < 1) config_error("--loss-scale-window must be >= 1");
  r.amax_history = pf.amax_history;
  if (r.precision == Precision::FP32) return r;
  if (cfg.dtype != "auto" && cfg.dtype != "fp32")
    config_error("--dtype " + cfg.dtype + " with --precision " + pf.precision +
                 ": the recipe sets the products' formats; leave --dtype at fp32");
  // (--dtype auto then means fp32 on either device: pick_dtype, told of the recipe.)
  if (pick_device(cfg.device) == Device::CUDA) refuse_what_the_gpu_cannot_run(r, pf, cfg);
  return r;
}

OperandValues operand_values_per_step(int L, int C, int V, int64_t tokens, int micro_batches) {
  const double N = double(tokens), l = L, c = C, v = V;
  return {2 * N * (7 * l * c + c), 2 * micro_batches * (12 * l * c * c + v * c), 2 * N * (9 * l * c + v)};
}

OperandValues operand_bytes_per_step(const PrecisionRecipe& recipe, int L, int C, int V, int64_t tokens,
                                     int micro_batches) {
  const OperandValues all = operand_values_per_step(L, C, V, tokens, micro_batches);
  const double N = double(tokens), c = C, v = V;
  const OperandValues head = {2 * N * c, 2 * micro_batches * v * c, 2 * N * v};  // the LM head's share
  auto bytes = [&](TensorKind kind) { return double(recipe.bytes_per_value(kind)); };
  const double b_head = recipe.precision == Precision::FP8 ? format_bits(recipe.output_format()) / 8 : 0;
  auto in_formats = [&](double values, double head_values, TensorKind kind) {
    return b_head > 0 ? (values - head_values) * bytes(kind) + head_values * b_head : values * bytes(kind);
  };
  return {in_formats(all.activations, head.activations, TensorKind::Activations),
          in_formats(all.weights, head.weights, TensorKind::Weights),
          in_formats(all.gradients, head.gradients, TensorKind::Gradients)};
}

PrecisionLog::PrecisionLog(const PrecisionRecipe& recipe, TrainingRun& run, Communicator& comm)
    : recipe_(recipe), run_(run), comm_(comm) {
  run_.add_to_run_record(JsonObject()
                             .add("precision", precision_name(recipe.precision))
                             .add("fp8_scaling", fp8_scaling_name(recipe.scaling))
                             .add("fp8_grad", format_name(recipe.fp8_gradient))
                             .add("fp8_accumulate", accumulate_name(recipe.accumulate))
                             .add("amax_history", recipe.amax_history));
}

void PrecisionLog::after_step(int step, bool applied, float loss_scale, const LowPrecisionMatmuls& products) {
  steps_++;
  if (!applied) {
    skipped_++;
    if (run_.is_root())
      std::printf("step %d: inf/NaN in the gradients: step skipped, loss scale now %s\n", step,
                  loss_scale_text(loss_scale).c_str());
  } else if (last_loss_scale_ > 0 && loss_scale > last_loss_scale_ && run_.is_root()) {
    std::printf("step %d: a window of clean steps: loss scale now %s\n", step, loss_scale_text(loss_scale).c_str());
  }
  last_loss_scale_ = loss_scale;
  if (recipe_.precision == Precision::FP32) return;
  // A fingerprint of every scale the next step will use: powers of two, so sum_i (i+1) log2(scale_i)
  // is an exact integer; two ranks with the same scales have the same fingerprint.
  const std::vector<float> scales = products.delayed_scales();
  double fingerprint = 0;
  for (size_t i = 0; i < scales.size(); i++) fingerprint += double(i + 1) * (scales[i] > 0 ? std::log2(scales[i]) : 0);
  // Every rank's values, gathered by scalar reductions (metrics, not training traffic): its loss
  // scale, the fingerprint of all its scales, and the scales themselves of its first product's
  // operands, one per kind (rank 0's are the plots').
  const int ranks = comm_.size();
  for (int r = 0; r < ranks; r++) {
    const bool me = comm_.rank() == r;
    auto theirs = [&](double mine) { return comm_.all_reduce_scalar(me ? mine : -HUGE_VAL, ReduceOp::Max); };
    const double their_scale = theirs(loss_scale), their_fingerprint = theirs(fingerprint);
    JsonObject record;
    record.add("type", "precision")
        .add("step", step)
        .add("rank", r)
        .add("applied", applied)
        .add("loss_scale", their_scale)
        .add("scales", int64_t(scales.size()))
        .add("scales_fingerprint", their_fingerprint);
    for (TensorKind kind : {TensorKind::Weights, TensorKind::Activations, TensorKind::Gradients})
      record.add(std::string("scale_") + tensor_kind_name(kind), theirs(double(products.first_delayed_scale(kind))));
    run_.write_record(record);
  }
}

void PrecisionLog::summary(const LowPrecisionMatmuls& products, int64_t params, int L, int C, int V,
                           int64_t tokens_per_step, int micro_batches, bool operands_formula, bool model_state_formula) {
  if (!run_.is_root() || recipe_.precision == Precision::FP32) return;
  const int steps = steps_;
  std::printf("precision summary: %s, %d steps, %d skipped for overflow", recipe_.describe().c_str(), steps, skipped_);
  if (recipe_.precision == Precision::FP16) std::printf(", loss scale at the end %s", loss_scale_text(last_loss_scale_).c_str());
  std::printf("\n");
  const OperandValues formula = operand_values_per_step(L, C, V, tokens_per_step, micro_batches);
  const OperandValues bytes_formula = operand_bytes_per_step(recipe_, L, C, V, tokens_per_step, micro_batches);
  const double per_kind[] = {formula.weights, formula.activations, formula.gradients};
  const double bytes_per_kind[] = {bytes_formula.weights, bytes_formula.activations, bytes_formula.gradients};
  std::printf("  %-12s %6s %14s %14s %12s %12s %12s %10s %10s\n", "operands", "format", "values/step", "formula",
              "bytes/step", "formula", "fp32 bytes", "underflow", "overflow");
  for (TensorKind kind : {TensorKind::Weights, TensorKind::Activations, TensorKind::Gradients}) {
    const QuantCounts& q = products.counts(kind);
    const double per_step = steps ? double(q.values) / steps : 0;
    const double bytes = steps ? double(products.operand_bytes(kind)) / steps : 0;
    const std::string formula_text = operands_formula ? std::to_string(int64_t(per_kind[int(kind)])) : "-";
    const std::string bytes_text = operands_formula ? std::to_string(int64_t(bytes_per_kind[int(kind)])) : "-";
    std::printf("  %-12s %6s %14.0f %14s %12.0f %12s %12.3g %9.3g%% %9.3g%%\n", tensor_kind_name(kind),
                format_name(recipe_.format_of(kind)), per_step, formula_text.c_str(), bytes, bytes_text.c_str(),
                per_step * 4, q.nonzero ? 100.0 * q.underflow / q.nonzero : 0.0,
                q.nonzero ? 100.0 * q.overflow / q.nonzero : 0.0);
  }
  if (recipe_.precision == Precision::FP8)
    std::printf("  (the LM head's operands in %s: 2NC activations, 2VC weights a micro-batch, 2NV gradients; "
                "docs/theory.md, section 18)\n", format_name(recipe_.output_format()));
  JsonObject counts;
  for (TensorKind kind : {TensorKind::Weights, TensorKind::Activations, TensorKind::Gradients}) {
    const std::string name = tensor_kind_name(kind);
    counts.add(name + "_values_per_step", steps ? double(products.counts(kind).values) / steps : 0)
        .add(name + "_bytes_per_step", steps ? double(products.operand_bytes(kind)) / steps : 0)
        .add(name + "_underflow", products.counts(kind).underflow)
        .add(name + "_overflow", products.counts(kind).overflow);
    if (operands_formula)
      counts.add(name + "_values_formula", per_kind[int(kind)]).add(name + "_bytes_formula", bytes_per_kind[int(kind)]);
  }
  if (!operands_formula || !model_state_formula) {  // a split model (TP, PP, CP, MoE) or a sharded state (ZeRO)
    std::printf("  %s; the model state per rank: the theory table above\n",
                operands_formula ? "operand formulas: every rank runs the whole model"
                                 : "no operand formula: this rank runs a part of the model (TP, PP or CP), or experts on the "
                                   "rows its routing sends them");
    JsonObject record;
    record.add("type", "precision_summary").add("skipped", skipped_).add(counts);
    run_.write_record(record);
    return;
  }
  const MemoryStats m = memory_stats();
  const double psi = double(params);
  std::printf("  model state per rank (P = %lld parameters, fp32 master; the casts are the products' operands above):\n",
              (long long)params);
  std::printf("    params %10.4g B = 4P %10.4g B | grads %10.4g B = 4P %10.4g B | optim %10.4g B = 8P %10.4g B\n",
              double(m.current[int(MemCategory::Params)]), 4 * psi, double(m.current[int(MemCategory::Grads)]), 4 * psi,
              double(m.current[int(MemCategory::OptState)]), 8 * psi);
  run_.write_record(JsonObject()
                        .add("type", "precision_summary")
                        .add("skipped", skipped_)
                        .add("params_bytes", m.current[int(MemCategory::Params)])
                        .add("params_formula", 4 * psi)
                        .add("grads_bytes", m.current[int(MemCategory::Grads)])
                        .add("grads_formula", 4 * psi)
                        .add("optim_bytes", m.current[int(MemCategory::OptState)])
                        .add("optim_formula", 8 * psi)
                        .add(counts));
}
