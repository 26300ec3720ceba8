// mixed_precision.h: --precision in every chapter. Mixed precision is a property of the model and
// the optimizer, not of how a run is split, so TrainingRun applies the recipe for chapters 01-12
// (chapter 13 teaches the same steps in its own lines). Defines MixedPrecision: the recipe's
// products (LowPrecisionMatmuls, installed as the CPU matmul emulation), fp16's loss scale, the amax
// histories reduced over the ranks that hold parts of the same tensors, and the per-rank records.
//
// What a chapter sees: nothing. The products round their operands as the recipe says; under fp16
// the loss scale multiplies each gradient operand before it is rounded to fp16 and divides the
// product after (mixed_precision.cpp says why that is the arithmetic of scaling the loss); a step
// whose gradient norm is not finite is skipped by AdamW (clip_factor is then NaN, optimizer.h) and
// TrainingRun::end_step, told by after_step(), counts it as skipped, not diverged.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/wire_format.h"  // CollectiveFormats
#include "model/param_layout.h"
#include "training/precision_flags.h"
#include "training/precision_recipe.h"
#include "training/precision_report.h"  // PrecisionLog
#include "training/precision_state.h"   // save_precision_state, load_precision_state

class TrainingRun;

// The formats the recipe's collectives take (wire_format.h), for gradients whose loss scale, if any,
// is `gradient_scale` (chapters 01-12 under fp16: the scale sits at the products and the gradient
// buffer holds unscaled values, so the wire multiplies them by it again; 13 scales the loss itself
// and passes 1). fp32: fp32 everywhere. Gradients: bf16, fp16 under fp16 (the layer's dtype: fp8
// reduces in bf16, as DeepSeek-V3 and torchtitan do). Activations: the layer's dtype. ZeRO-3's
// weights: the products' format, fp8 (E4M3) with a per-tensor scale where the recipe scales per
// tensor (current, delayed; none: scale 1), bf16 under row and block scaling (a gathered weight
// quantized with one scale per tensor would be coarser than its rows' or blocks' own).
CollectiveFormats collective_formats_of(const PrecisionRecipe& recipe, float gradient_scale);

class MixedPrecision {
 public:
  // Installs the recipe's products, and its collective formats on `world` and every group split from
  // it (Communicator::formats). amax_groups: the communicators over which a tensor's amax is
  // reduced (the data-parallel group, the tensor-parallel group: the ranks whose tensors are parts
  // of the same one-rank tensor); lm_head_offset: wte's flat offset, whose product stays in the
  // output format (-1: this rank has none).
  MixedPrecision(const PrecisionRecipe& recipe, const PrecisionFlags& flags, TrainingRun& run, Communicator& world,
                 std::vector<Communicator*> amax_groups, int64_t lm_head_offset);
  ~MixedPrecision();
  const PrecisionRecipe& recipe() const { return recipe_; }
  // A mixture of experts' experts (the weights at these flat offsets): their amaxes are reduced over
  // `holders`, the ranks that hold copies of the same experts (the expert-data-parallel group), not
  // over amax_groups (LowPrecisionMatmuls::reduce_apart). Call before the first step.
  void reduce_experts_over(const std::vector<int64_t>& expert_weights, Communicator& holders);

  // After the chapter's optimizer step, on every rank (collective): fp16's scaler learns whether the
  // gradients overflowed (a non-finite norm, equal on every rank), the amax histories take this
  // step's amaxes, and the "precision" records are written. Returns the norm the step reports: 0 for
  // a step skipped for overflow (so the run goes on), else grad_norm.
  double after_step(int step, double grad_norm);
  float loss_scale() const { return loss_scale_; }
  // What the emulated products' scratch holds now (LowPrecisionMatmuls::scratch_bytes).
  int64_t scratch_bytes() const { return products_.scratch_bytes(); }
  // Checkpoints (collective, every rank): the loss scale, its clean steps and the delayed amax
  // histories go to a small text file beside the checkpoint (precision_state_path), every stage's
  // histories by parameter name, so that a resumed run (on any grid) continues with the scales the
  // uninterrupted one would have (precision_state.h). load() of a file that is absent, or of another
  // recipe, keeps the fresh state and says so.
  void save(const std::string& checkpoint, const ParamLayout& layout, Communicator& world) const;
  void load(const std::string& checkpoint, const ParamLayout& layout, Communicator& world);
  // Rank 0 prints the underflows and overflows per tensor kind and the operands' bytes against their
  // formula (precision_report.h); then the plain fp32 products are restored.
  // operands_formula: the whole model's products on every rank (no TP, PP or CP), a dense model's;
  // model_state_formula: an unsharded state too (01-03).
  void finish(int64_t params, int L, int C, int V, int64_t tokens_per_step, int micro_batches, bool operands_formula,
              bool model_state_formula);

 private:
  PrecisionRecipe recipe_;
  Communicator& world_;  // where the formats are installed (and, at the end, fp32 again)
  LowPrecisionMatmuls products_;
  PrecisionLog log_;
  // fp16's loss scale: halved (not below 1) after an overflow, doubled after `window_` clean steps
  // when dynamic; fixed by --loss-scale. 1 for the other formats.
  float loss_scale_ = 1;
  bool dynamic_ = false;
  int window_ = 0, clean_steps_ = 0;
  bool installed_ = false;
};
