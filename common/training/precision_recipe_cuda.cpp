// precision_recipe_cuda.cpp: LowPrecisionMatmuls' products on a GPU (precision_recipe.h), with the
// model's fp32 tensors on the device. The operands' formats and scales come from plan_operand, as on
// the CPU; the device casts them (ops/matmul_recipe_cuda.h), cuBLASLt multiplies them with fp32
// accumulation, and an epilogue puts the fp32 product where the layer wants it, with the CPU path's
// arithmetic: the bias added in fp32 then the output rounded to the layer's dtype; the input
// gradient rounded before it is added; the weight gradient added in fp32; the loss scale undone last.
//
// The operands, with the contraction along their rows (cuBLASLt's fp8 takes only that form):
//   forward          out(N,OC)     = inp(N,C)    . weight(OC,C)^T   both as they are
//   backward_input   dinp(N,C)    += dout(N,OC)  . [weight^T](C,OC)^T   the weight's transposed copy
//   backward_weight  dweight(OC,C) += [dout^T](OC,N) . [inp^T](C,N)^T   two transposed copies
#include "training/precision_recipe.h"

#include <algorithm>
#include <vector>

#include "base/check.h"  // fatal
#include "ops/ops.h"     // bias_backward: the bias gradient stays in fp32

#ifdef GPT_WITH_CUDA
#include "ops/matmul_recipe_cuda.h"

bool LowPrecisionMatmuls::runs_on_gpu() const { return true; }

namespace {
int last_dim(const Tensor& t) { return int(t.shape[t.ndim - 1]); }
}  // namespace

LowPrecisionMatmuls::DeviceOperand LowPrecisionMatmuls::cast_on_device(const float* values, int rows, int cols,
                                                                       bool transposed, float pre, int64_t site,
                                                                       Role role, TensorKind kind, int slot) {
  used_device_ = true;
  const int64_t n = int64_t(rows) * cols;
  // The amax on the device, at most once per operand, where a scale needs it now: a current scale
  // (delayed scaling's first step too). Delayed scaling's history takes it at the step's end: the
  // device raises the history's slot (the host does not wait), end_step() reads the slots.
  float amax = -1;
  auto device_amax = [&] {
    if (amax < 0) amax = recipe_cuda::amax(values, n, pre);
    return amax;
  };
  bool history_wants_amax = false;
  const OperandPlan plan = plan_operand(site, role, kind, n, [&] {
    history_wants_amax = true;
    return 0.0f;  // joins the history's step amax in drain_device_counts()
  });
  if (history_wants_amax) {
    History& h = histories_[{site, int(role)}];
    if (h.device_slot < 0) h.device_slot = device_slots_++;
    if (plan.scale > 0) {
      recipe_cuda::amax_into_slot(values, n, pre, h.device_slot);
    } else {
      h.step_amax = std::max(h.step_amax, device_amax());  // the first step: the current scale needs it now anyway
    }
  }
  if (plan.tiling.across != 0 || plan.tiling.along != 0)
    fatal("--fp8-scaling " + std::string(fp8_scaling_name(recipe_.scaling)) +
          " has no GPU path (cuBLASLt's fp8 scales are per tensor); use --device cpu");
  const float scale = plan.scale > 0 ? plan.scale : power_of_two_scale(plan.format, device_amax());
  const void* codes = recipe_cuda::cast(slot == 0 ? recipe_cuda::Operand::A : recipe_cuda::Operand::B, values, rows,
                                        cols, transposed, plan.format, plan.overflow, pre, scale, int(kind));
  counts_[int(kind)].values += n;
  return {codes, plan.format, 1.0f / scale};  // exact: a power of two
}

void LowPrecisionMatmuls::forward_on_device(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const int C = last_dim(weight), OC = int(weight.numel() / C), N = int(inp.numel() / C);
  const int64_t site = site_of(weight.f32(), false);
  const DeviceOperand a = cast_on_device(inp.f32(), N, C, false, 1.0f, site, FwdInput, TensorKind::Activations, 0);
  const DeviceOperand b = cast_on_device(weight.f32(), OC, C, false, 1.0f, site, FwdWeight, TensorKind::Weights, 1);
  const float* product = recipe_cuda::product(a.codes, a.format, b.codes, b.format, N, OC, C, a.unscale * b.unscale,
                                              recipe_.accumulate == Accumulate::TensorCore);
  const float* bias_values = bias.empty() ? nullptr : bias.f32();
  recipe_cuda::forward_epilogue(out.f32(), product, bias_values, N, OC, recipe_.output_format());
}

void LowPrecisionMatmuls::backward_input_on_device(Tensor dinp, Tensor dout, Tensor weight) {
  const int C = last_dim(weight), OC = int(weight.numel() / C), N = int(dout.numel() / OC);
  const int64_t site = site_of(weight.f32(), false);
  const DeviceOperand a =
      cast_on_device(dout.f32(), N, OC, false, gradient_scale_, site, DgradOut, TensorKind::Gradients, 0);
  const DeviceOperand b = cast_on_device(weight.f32(), OC, C, true, 1.0f, site, DgradWeight, TensorKind::Weights, 1);
  const float* product = recipe_cuda::product(a.codes, a.format, b.codes, b.format, N, C, OC, a.unscale * b.unscale,
                                              recipe_.accumulate == Accumulate::TensorCore);
  recipe_cuda::accumulate(dinp.f32(), product, int64_t(N) * C, true, recipe_.output_format(), 1.0f / gradient_scale_);
}

void LowPrecisionMatmuls::backward_weight_on_device(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp) {
  const int C = last_dim(inp), N = int(inp.numel() / C), OC = int(dout.numel() / N);
  const int64_t site = site_of(dweight.f32(), true);
  const DeviceOperand a =
      cast_on_device(dout.f32(), N, OC, true, gradient_scale_, site, WgradOut, TensorKind::Gradients, 0);
  const DeviceOperand b = cast_on_device(inp.f32(), N, C, true, 1.0f, site, WgradInput, TensorKind::Activations, 1);
  const float* product = recipe_cuda::product(a.codes, a.format, b.codes, b.format, OC, C, N, a.unscale * b.unscale,
                                              recipe_.accumulate == Accumulate::TensorCore);
  recipe_cuda::accumulate(dweight.f32(), product, int64_t(OC) * C, false, recipe_.output_format(),
                          1.0f / gradient_scale_);
  if (!dbias.empty()) bias_backward(dbias, dout);
}

void LowPrecisionMatmuls::drain_device_counts() {
  int64_t nonzero[kTensorKinds] = {}, underflow[kTensorKinds] = {}, overflow[kTensorKinds] = {};
  recipe_cuda::drain_counts(nonzero, underflow, overflow);
  if (device_slots_ > 0) {
    std::vector<float> slots(size_t(device_slots_), 0.0f);
    recipe_cuda::drain_amax_slots(slots.data(), device_slots_);
    for (auto& [key, h] : histories_)
      if (h.device_slot >= 0) h.step_amax = std::max(h.step_amax, slots[size_t(h.device_slot)]);
  }
  for (int k = 0; k < kTensorKinds; k++) {
    counts_[k].nonzero += nonzero[k];
    counts_[k].underflow += underflow[k];
    counts_[k].overflow += overflow[k];
  }
}

#else  // a build without CUDA: no device path (a CUDA tensor never reaches these)

bool LowPrecisionMatmuls::runs_on_gpu() const { return false; }
void LowPrecisionMatmuls::forward_on_device(Tensor, Tensor, Tensor, Tensor) { fatal("built without CUDA"); }
void LowPrecisionMatmuls::backward_input_on_device(Tensor, Tensor, Tensor) { fatal("built without CUDA"); }
void LowPrecisionMatmuls::backward_weight_on_device(Tensor, Tensor, Tensor, Tensor) { fatal("built without CUDA"); }
void LowPrecisionMatmuls::drain_device_counts() {}

#endif
