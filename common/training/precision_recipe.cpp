// precision_recipe.cpp: the recipes of precision_recipe.h and LowPrecisionMatmuls.
#include "training/precision_recipe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "base/check.h"  // ENSURE
#include "ops/ops.h"    // bias_backward: the bias gradient stays in fp32

const char* tensor_kind_name(TensorKind k) {
  return k == TensorKind::Weights ? "weights" : k == TensorKind::Activations ? "activations" : "gradients";
}
const char* precision_name(Precision p) {
  const char* names[] = {"fp32", "bf16", "fp16", "fp8"};
  return names[int(p)];
}
const char* fp8_scaling_name(Fp8Scaling s) {
  const char* names[] = {"none", "current", "delayed", "row", "blocks"};
  return names[int(s)];
}
bool parse_precision(const std::string& name, Precision* out) {
  for (Precision p : {Precision::FP32, Precision::BF16, Precision::FP16, Precision::FP8})
    if (name == precision_name(p)) return *out = p, true;
  return false;
}
bool parse_fp8_scaling(const std::string& name, Fp8Scaling* out) {
  for (Fp8Scaling s : {Fp8Scaling::None, Fp8Scaling::Current, Fp8Scaling::Delayed, Fp8Scaling::Row, Fp8Scaling::Blocks})
    if (name == fp8_scaling_name(s)) return *out = s, true;
  return false;
}
bool parse_accumulate(const std::string& name, Accumulate* out) {
  for (Accumulate a : {Accumulate::Fp32, Accumulate::TensorCore, Accumulate::Promote128})
    if (name == accumulate_name(a)) return *out = a, true;
  return false;
}

NumberFormat PrecisionRecipe::format_of(TensorKind kind) const {
  switch (precision) {
    case Precision::FP16: return NumberFormat::FP16;
    case Precision::FP8: return kind == TensorKind::Gradients ? fp8_gradient : NumberFormat::E4M3;
    default: return NumberFormat::BF16;
  }
}
NumberFormat PrecisionRecipe::output_format() const {
  return precision == Precision::FP16 ? NumberFormat::FP16 : NumberFormat::BF16;
}
int PrecisionRecipe::bytes_per_value(TensorKind kind) const {
  return precision == Precision::FP32 ? 4 : format_bits(format_of(kind)) / 8;
}
std::string PrecisionRecipe::describe() const {
  switch (precision) {
    case Precision::FP32: return "fp32";
    case Precision::BF16: return "bf16 (products in bf16, fp32 accumulation, fp32 master weights and AdamW)";
    case Precision::FP16: return "fp16 (products in fp16, fp32 accumulation, dynamic loss scale, fp32 master weights and AdamW)";
    default:
      return std::string("fp8 (e4m3 forward, ") + format_name(fp8_gradient) + " gradients, " +
             fp8_scaling_name(scaling) + " scaling, " + accumulate_name(accumulate) + " accumulation" +
             (scaling == Fp8Scaling::Delayed ? ", amax history " + std::to_string(amax_history) : "") + ")";
  }
}

LowPrecisionMatmuls::LowPrecisionMatmuls(const PrecisionRecipe& recipe, const float* params, const float* grads,
                                         std::function<void(std::vector<float>&)> reduce_max)
    : recipe_(recipe), params_(params), grads_(grads), reduce_max_(std::move(reduce_max)) {}

bool LowPrecisionMatmuls::kept(int64_t site) const {
  return std::find(kept_.begin(), kept_.end(), site) != kept_.end();
}

void LowPrecisionMatmuls::reduce_apart(const std::vector<int64_t>& weight_offsets,
                                       std::function<void(std::vector<float>&)> reduce_max) {
  apart_ = weight_offsets;
  std::sort(apart_.begin(), apart_.end());
  reduce_apart_ = std::move(reduce_max);
  if (recipe_.precision != Precision::FP8 || recipe_.scaling != Fp8Scaling::Delayed) return;
  const std::pair<Role, TensorKind> operands[] = {{FwdInput, TensorKind::Activations}, {FwdWeight, TensorKind::Weights},
                                                  {DgradOut, TensorKind::Gradients},  {DgradWeight, TensorKind::Weights},
                                                  {WgradOut, TensorKind::Gradients},  {WgradInput, TensorKind::Activations}};
  for (int64_t site : apart_)
    for (const auto& [role, kind] : operands) histories_[{site, int(role)}].kind = kind;
}

bool LowPrecisionMatmuls::is_apart(int64_t site) const {
  return std::binary_search(apart_.begin(), apart_.end(), site);
}

int64_t LowPrecisionMatmuls::site_of(const float* address, bool grads) const {
  const float* base = grads ? grads_ : params_;
  const int64_t site = base ? address - base : bound_flat_offset(grads, address);
  ENSURE(site >= 0, "LowPrecisionMatmuls: a product's weight is not in the model's bound parameters");
  return site;
}

namespace {

// One product at a time: dualpipev's F&B pairs run two passes on two threads (comm/lanes.h), and both
// would round their operands into the same scratch (and grow the same histories). Each product is
// whole either way, its amaxes taken by a max and its counts by a sum, so the order the two lanes
// take changes no value. (Process-wide: a process installs one recipe's products.)
std::mutex g_one_product;

// `scratch`, at least n floats long: grown only when a product needs more than any before it, so the
// buffers reach the largest product's sizes in the first step and are never allocated again.
float* at_least(Buffer& scratch, int64_t n) {
  if (scratch.count() < n) scratch = Buffer(n, MemCategory::Other);
  return scratch.f32();
}

// dst(cols x rows) = src(rows x cols)^T.
void transpose(float* dst, const float* src, int rows, int cols) {
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) dst[int64_t(c) * rows + r] = src[int64_t(r) * cols + c];
}

int last_dim(const Tensor& t) { return int(t.shape[t.ndim - 1]); }

}  // namespace

int64_t LowPrecisionMatmuls::scratch_bytes() const {
  return 4 * (a_.count() + b_.count() + transposed_.count() + product_.count() + scaled_.count());
}

const float* LowPrecisionMatmuls::scaled_gradient(const float* values, int64_t n) {
  if (gradient_scale_ == 1) return values;
  float* scaled = at_least(scaled_, n);
  for (int64_t i = 0; i < n; i++) scaled[i] = values[i] * gradient_scale_;
  return scaled;
}

LowPrecisionMatmuls::OperandPlan LowPrecisionMatmuls::plan_operand(int64_t site, Role role, TensorKind kind,
                                                                   int64_t elements,
                                                                   const std::function<float()>& amax) {
  const bool fp8 = recipe_.precision == Precision::FP8 && !kept(site);
  if (!fp8) {  // bf16 and fp16 (and the kept products): no scale; IEEE overflow, so fp16's infinities show
    const NumberFormat format = recipe_.precision == Precision::FP8 ? recipe_.output_format() : recipe_.format_of(kind);
    bytes_[int(kind)] += elements * (format_bits(format) / 8);
    return {format, Overflow::Ieee, Tiling{}, 1.0f};
  }
  OperandPlan plan{recipe_.format_of(kind), Overflow::Saturate, Tiling{}, 0.0f};  // per tensor, current amax
  bytes_[int(kind)] += elements * (format_bits(plan.format) / 8);
  switch (recipe_.scaling) {
    case Fp8Scaling::None: plan.scale = 1.0f; break;
    case Fp8Scaling::Current: break;
    case Fp8Scaling::Row: plan.tiling = Tiling{1, 0}; break;
    case Fp8Scaling::Blocks: plan.tiling = kind == TensorKind::Weights ? Tiling{128, 128} : Tiling{1, 128}; break;
    case Fp8Scaling::Delayed: {
      History& h = histories_[{site, int(role)}];
      h.kind = kind;
      h.step_amax = std::max(h.step_amax, amax());
      plan.scale = h.scale;  // 0 on the first step, which has no history yet: current scaling then
      break;
    }
  }
  return plan;
}

const float* LowPrecisionMatmuls::quantize(const float* values, int rows, int cols, int64_t site, Role role,
                                           TensorKind kind, Buffer& scratch_owner) {
  float* scratch = at_least(scratch_owner, int64_t(rows) * cols);
  const OperandPlan plan =
      plan_operand(site, role, kind, int64_t(rows) * cols, [&] { return matrix_amax(values, rows, cols); });
  quantize_matrix(scratch, values, rows, cols, false, plan.tiling, plan.format, plan.overflow, plan.scale,
                  &counts_[int(kind)]);
  return scratch;
}

void LowPrecisionMatmuls::forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const std::lock_guard<std::mutex> one_at_a_time(g_one_product);
  if (out.device == Device::CUDA) return forward_on_device(out, inp, weight, bias);
  const int C = last_dim(weight), OC = int(weight.numel() / C), N = int(inp.numel() / C);
  const int64_t site = site_of(weight.f32(), false);
  const float* a = quantize(inp.f32(), N, C, site, FwdInput, TensorKind::Activations, a_);
  const float* b = quantize(weight.f32(), OC, C, site, FwdWeight, TensorKind::Weights, b_);
  float* o = out.f32();
  emulated_product(o, a, b, N, OC, C, recipe_.accumulate);
  const float* bias_values = bias.empty() ? nullptr : bias.f32();
  const NumberFormat output = recipe_.output_format();
  for (int n = 0; n < N; n++) {
    for (int j = 0; j < OC; j++) {
      float& y = o[int64_t(n) * OC + j];
      y = round_to_format(output, bias_values ? y + bias_values[j] : y);  // the bias in fp32, as an epilogue adds it
    }
  }
}

void LowPrecisionMatmuls::backward_input(Tensor dinp, Tensor dout, Tensor weight) {
  const std::lock_guard<std::mutex> one_at_a_time(g_one_product);
  if (dinp.device == Device::CUDA) return backward_input_on_device(dinp, dout, weight);
  const int C = last_dim(weight), OC = int(weight.numel() / C), N = int(dout.numel() / OC);
  const int64_t site = site_of(weight.f32(), false);
  const float* a = quantize(scaled_gradient(dout.f32(), int64_t(N) * OC), N, OC, site, DgradOut, TensorKind::Gradients, a_);
  float* transposed = at_least(transposed_, int64_t(C) * OC);
  transpose(transposed, weight.f32(), OC, C);  // the sum runs over OC now
  const float* b = quantize(transposed, C, OC, site, DgradWeight, TensorKind::Weights, b_);
  float* product = at_least(product_, int64_t(N) * C);
  emulated_product(product, a, b, N, C, OC, recipe_.accumulate);
  const NumberFormat output = recipe_.output_format();
  float* d = dinp.f32();
  const float unscale = 1.0f / gradient_scale_;  // exact: a power of two
  for (int64_t i = 0; i < int64_t(N) * C; i++) d[i] += round_to_format(output, product[i]) * unscale;
}

void LowPrecisionMatmuls::backward_weight(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp) {
  const std::lock_guard<std::mutex> one_at_a_time(g_one_product);
  if (dweight.device == Device::CUDA) return backward_weight_on_device(dweight, dbias, dout, inp);
  const int C = last_dim(inp), N = int(inp.numel() / C), OC = int(dout.numel() / N);
  const int64_t site = site_of(dweight.f32(), true);
  float* transposed = at_least(transposed_, int64_t(std::max(OC, C)) * N);  // dout's, then inp's
  transpose(transposed, scaled_gradient(dout.f32(), int64_t(N) * OC), N, OC);  // the sum runs over the N tokens
  const float* a = quantize(transposed, OC, N, site, WgradOut, TensorKind::Gradients, a_);
  transpose(transposed, inp.f32(), N, C);
  const float* b = quantize(transposed, C, N, site, WgradInput, TensorKind::Activations, b_);
  float* product = at_least(product_, int64_t(OC) * C);
  emulated_product(product, a, b, OC, C, N, recipe_.accumulate);
  float* d = dweight.f32();
  const float unscale = 1.0f / gradient_scale_;
  for (int64_t i = 0; i < int64_t(OC) * C; i++) d[i] += product[i] * unscale;
  if (!dbias.empty()) bias_backward(dbias, dout);
}

void LowPrecisionMatmuls::end_step() {
  if (used_device_) drain_device_counts();  // the step's underflows and overflows, counted on the GPU
  if (recipe_.precision != Precision::FP8 || recipe_.scaling != Fp8Scaling::Delayed) return;
  // Two lists, each reduced over its own group: the ranks holding the same experts reduce theirs apart.
  std::vector<float> amaxes, apart;
  for (auto& [key, h] : histories_) (is_apart(key.first) ? apart : amaxes).push_back(h.step_amax);
  reduce_max_(amaxes);
  if (reduce_apart_) reduce_apart_(apart);
  size_t i = 0, j = 0;
  for (auto& [key, h] : histories_) {
    const float amax = is_apart(key.first) ? apart[j++] : amaxes[i++];
    if (std::isfinite(amax)) h.amaxes.push_back(amax);  // an overflowed step teaches nothing about the range
    while (int(h.amaxes.size()) > recipe_.amax_history) h.amaxes.pop_front();
    take_scale_from_history(h);
    h.step_amax = 0;
  }
}

void LowPrecisionMatmuls::take_scale_from_history(History& h) const {
  const float largest = h.amaxes.empty() ? 0 : *std::max_element(h.amaxes.begin(), h.amaxes.end());
  h.scale = largest > 0 ? power_of_two_scale(recipe_.format_of(h.kind), largest) : 0;
}

std::vector<LowPrecisionMatmuls::SavedHistory> LowPrecisionMatmuls::saved_histories() const {
  std::vector<SavedHistory> saved;
  for (const auto& [key, h] : histories_)
    saved.push_back({key.first, key.second, h.kind, std::vector<float>(h.amaxes.begin(), h.amaxes.end())});
  return saved;
}

void LowPrecisionMatmuls::restore_histories(const std::vector<SavedHistory>& saved) {
  histories_.clear();
  for (const SavedHistory& s : saved) {
    History& h = histories_[{s.site, s.role}];
    h.kind = s.kind;
    h.amaxes.assign(s.amaxes.begin(), s.amaxes.end());
    while (int(h.amaxes.size()) > recipe_.amax_history) h.amaxes.pop_front();
    take_scale_from_history(h);
  }
}

std::vector<float> LowPrecisionMatmuls::delayed_scales() const {
  std::vector<float> scales;
  for (const auto& [key, h] : histories_) scales.push_back(h.scale);
  return scales;
}

float LowPrecisionMatmuls::first_delayed_scale(TensorKind kind) const {
  for (const auto& [key, h] : histories_)
    if (h.kind == kind && !kept(key.first)) return h.scale;
  return 0;
}
