// mixed_precision.cpp: MixedPrecision (mixed_precision.h).
//
// Why the loss scale may sit at the products. Scaling the loss by S (a power of two) multiplies every
// gradient of backward by S. On the CPU only the products' operands are rounded to fp16: every other
// op of backward computes in fp32 and is linear in the gradient it receives (layernorm, GELU,
// attention, the residual adds, the cross-entropy's dlogits), and fp32 rounds S*x to exactly S times
// the rounding of x. So multiplying a product's gradient operand by S before it is rounded to fp16,
// and its result by 1/S after, gives bit for bit the values that scaling the loss and unscaling the
// gradients at the end gives, fp16's overflows and underflows included (test_mixed_precision checks
// chapter 03 under fp16 against chapter 13, which scales the loss).
#include "training/mixed_precision.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "training/training_run.h"

CollectiveFormats collective_formats_of(const PrecisionRecipe& recipe, float gradient_scale) {
  CollectiveFormats f;
  if (recipe.precision == Precision::FP32) return f;
  const NumberFormat layer = recipe.output_format();  // bf16, fp16 under fp16
  f.gradients = Wire::in(layer, layer == NumberFormat::FP16 ? gradient_scale : 1.0f);
  f.activations = Wire::in(layer);
  if (recipe.precision != Precision::FP8) {
    f.weights = Wire::in(layer);
  } else if (recipe.scaling == Fp8Scaling::Row || recipe.scaling == Fp8Scaling::Blocks) {
    f.weights = Wire::in(NumberFormat::BF16);
  } else {
    f.weights = Wire::in(NumberFormat::E4M3);
    f.weight_scale_per_tensor = recipe.scaling != Fp8Scaling::None;
  }
  return f;
}

MixedPrecision::MixedPrecision(const PrecisionRecipe& recipe, const PrecisionFlags& flags, TrainingRun& run,
                               Communicator& world, std::vector<Communicator*> amax_groups, int64_t lm_head_offset)
    : recipe_(recipe),
      world_(world),
      products_(recipe, nullptr, nullptr,
                [groups = std::move(amax_groups)](std::vector<float>& amaxes) {
                  for (Communicator* group : groups)
                    for (float& amax : amaxes) amax = float(group->all_reduce_scalar(amax, ReduceOp::Max));
                }),
      log_(recipe, run, world) {
  if (lm_head_offset >= 0) products_.keep_in_output_format(lm_head_offset);  // the LM head stays in bf16 (fp8)
  if (recipe_.precision == Precision::FP16) {
    dynamic_ = flags.loss_scale == 0;
    loss_scale_ = float(dynamic_ ? flags.loss_scale_init : flags.loss_scale);
    window_ = flags.loss_scale_window;
  }
  products_.set_gradient_scale(loss_scale_);
  set_cpu_matmul_emulation(&products_);
  set_collective_formats(world_, collective_formats_of(recipe_, loss_scale_));  // the collectives move the format's bytes
  installed_ = true;
  if (run.is_root()) std::printf("precision: %s\n", recipe_.describe().c_str());
}

void MixedPrecision::reduce_experts_over(const std::vector<int64_t>& expert_weights, Communicator& holders) {
  products_.reduce_apart(expert_weights, [&holders](std::vector<float>& amaxes) {
    for (float& amax : amaxes) amax = float(holders.all_reduce_scalar(amax, ReduceOp::Max));
  });
}

MixedPrecision::~MixedPrecision() {
  if (installed_) set_cpu_matmul_emulation(nullptr), set_collective_formats(world_, {});
}

double MixedPrecision::after_step(int step, double grad_norm) {
  bool applied = true;
  if (recipe_.precision == Precision::FP16) {
    applied = std::isfinite(grad_norm);
    if (!applied) {
      if (dynamic_) loss_scale_ = std::max(loss_scale_ / 2, 1.0f);
      clean_steps_ = 0;
    } else if (dynamic_ && ++clean_steps_ == window_) {
      loss_scale_ *= 2, clean_steps_ = 0;
    }
    products_.set_gradient_scale(loss_scale_);
    set_collective_formats(world_, collective_formats_of(recipe_, loss_scale_));
  }
  products_.end_step();  // the amax histories (delayed fp8), reduced over the groups
  log_.after_step(step, applied, loss_scale_, products_);
  return applied ? grad_norm : 0.0;
}

void MixedPrecision::finish(int64_t params, int L, int C, int V, int64_t tokens_per_step, int micro_batches,
                            bool operands_formula, bool model_state_formula) {
  if (installed_) set_cpu_matmul_emulation(nullptr), set_collective_formats(world_, {}), installed_ = false;
  log_.summary(products_, params, L, C, V, tokens_per_step, micro_batches, operands_formula,
               operands_formula && model_state_formula);
}

void MixedPrecision::save(const std::string& checkpoint, const ParamLayout& layout, Communicator& world) const {
  save_precision_state(checkpoint, recipe_, loss_scale_, clean_steps_, products_, layout, world);
}

void MixedPrecision::load(const std::string& checkpoint, const ParamLayout& layout, Communicator& world) {
  if (load_precision_state(checkpoint, recipe_, &loss_scale_, &clean_steps_, products_, layout, world)) {
    products_.set_gradient_scale(loss_scale_);
    set_collective_formats(world_, collective_formats_of(recipe_, loss_scale_));
  }
}
