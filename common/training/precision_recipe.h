// precision_recipe.h: a mixed-precision recipe (which format each tensor of a matrix product takes, and
// how fp8 scales it), and LowPrecisionMatmuls, the MatmulEmulation (matmul_emulation.h) that carries
// the recipe out on the CPU, with its amax history. Chapter 13 builds one from its flags.
//
// The recipes, by --precision (docs/mixed_precision.md):
//   fp32: no emulation at all; every product as in chapters 01-12.
//   bf16: activations and weights rounded to bf16, gradients too; outputs in bf16. No scale: bf16 has
//         fp32's exponent range.
//   fp16: the same in fp16, whose range (6e-8 .. 65504) is what the chapter's loss scale is for.
//   fp8:  activations and weights in E4M3, gradients in E5M2 (or E4M3), each tensor scaled (Fp8Scaling)
//         and saturating; outputs in bf16; the LM head (the tied embedding) stays in bf16, as
//         DeepSeek-V3 and Transformer Engine keep the first and last layers out of fp8.
// Every product: the fp32 results of the weight gradient go straight into the fp32 gradient buffer
// (Megatron's main_grad), the input gradient is rounded to the layer's dtype before it is added.
//
// On a GPU (the model's fp32 tensors on the device, a CUDA build) the same object carries the recipe
// out: it decides each operand's format and scale as on the CPU (plan_operand: one implementation of
// the scaling, the histories and their reduction), and the device does the cast, the amax and the
// product (ops/matmul_recipe_cuda.h: cuBLASLt, fp32 accumulation). Per-row and block scales have no
// place in cuBLASLt's per-tensor scales on Hopper: the flags refuse them on a GPU.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/float_formats.h"
#include "ops/matmul_emulation.h"
#include "ops/memory.h"  // Buffer: the products' scratch, counted
#include "ops/quantize.h"

enum class Precision { FP32, BF16, FP16, FP8 };
enum class Fp8Scaling {
  None,     // scale 1: what fp8 does without scaling (the lesson's failure)
  Current,  // per tensor, from this tensor's amax now
  Delayed,  // per tensor, from the largest amax of the last amax_history steps (Transformer Engine)
  Row,      // per row: one scale per token of an activation, per output channel of a weight
  Blocks,   // DeepSeek-V3: 1 x 128 tiles of activations and gradients, 128 x 128 blocks of weights
};
enum class TensorKind { Weights, Activations, Gradients };
constexpr int kTensorKinds = 3;
const char* tensor_kind_name(TensorKind k);  // "weights", "activations", "gradients"

struct PrecisionRecipe {
  Precision precision = Precision::FP32;
  Fp8Scaling scaling = Fp8Scaling::Delayed;
  NumberFormat fp8_gradient = NumberFormat::E5M2;
  Accumulate accumulate = Accumulate::Fp32;
  int amax_history = 16;

  NumberFormat format_of(TensorKind kind) const;  // the format a product's operand of this kind takes
  NumberFormat output_format() const;             // the layer's dtype: fp16 under fp16, else bf16
  int bytes_per_value(TensorKind kind) const;     // of format_of(kind): 2 or 1; 4 under fp32
  std::string describe() const;                   // "fp8 (e4m3 forward, e5m2 gradients, delayed scaling, ...)"
};

const char* precision_name(Precision p);    // "fp32", "bf16", "fp16", "fp8"
const char* fp8_scaling_name(Fp8Scaling s); // "none", "current", "delayed", "row", "blocks"
bool parse_precision(const std::string& name, Precision* out);
bool parse_fp8_scaling(const std::string& name, Fp8Scaling* out);
bool parse_accumulate(const std::string& name, Accumulate* out);

class LowPrecisionMatmuls : public MatmulEmulation {
 public:
  // params and grads: the flat buffers the model's weights and their gradients live in (a weight is
  // known by its offset in them: one product's history is the same on every rank); both null: the
  // offsets the model's bindings report (note_bound_memory), wherever a chapter keeps its weights
  // (ZeRO-3's gathered layers, a pipeline stage's, a tensor-parallel slice's). reduce_max: the
  // all-reduce (Max) of a vector over the ranks that share the tensors' amaxes (the data-parallel
  // group), called by end_step() under delayed scaling.
  LowPrecisionMatmuls(const PrecisionRecipe& recipe, const float* params, const float* grads,
                      std::function<void(std::vector<float>&)> reduce_max);
  // The product whose weight starts at this offset of params stays in the output format (bf16).
  void keep_in_output_format(int64_t weight_offset) { kept_.push_back(weight_offset); }
  // The products whose weights start at these offsets reduce their amaxes with `reduce_max` instead
  // of the constructor's: a mixture of experts' experts, whose copies live on the ranks of their
  // expert-data-parallel group, not on every data-parallel rank. Under delayed scaling their
  // histories exist from this call on, whether or not a step runs them (an expert may receive rows
  // on one rank of its group and none on another): every rank of the group reduces the same list.
  void reduce_apart(const std::vector<int64_t>& weight_offsets, std::function<void(std::vector<float>&)> reduce_max);
  // The loss scale as the products see it (chapters 01-12 under fp16, mixed_precision.h): each
  // gradient operand is multiplied by `scale` before it is rounded to the format, each gradient
  // product divided by it after. Everything else computes in fp32, where a power of two scales
  // exactly, so this is the arithmetic of scaling the loss (chapter 13's way), overflows included.
  void set_gradient_scale(float scale) { gradient_scale_ = scale; }

  void forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) override;
  void backward_input(Tensor dinp, Tensor dout, Tensor weight) override;
  void backward_weight(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp) override;
  bool runs_on_gpu() const override;  // true in a CUDA build: the device path below

  // Delayed scaling: this step's amaxes, reduced (Max) over the group, join every tensor's history;
  // the next step's scales come from the histories. Call on every rank after each step (also a skipped one).
  void end_step();
  // Every per-tensor scale the next step will use (delayed scaling), in a fixed order of the products;
  // empty under other scalings. Equal on every rank: the histories are reduced.
  std::vector<float> delayed_scales() const;
  // The delayed scale of the first product's operand of this kind (the first block's qkv): one
  // trajectory per kind for the plots. 0 before the first end_step() or under other scalings.
  float first_delayed_scale(TensorKind kind) const;
  const QuantCounts& counts(TensorKind kind) const { return counts_[int(kind)]; }
  // The bytes of the codes this kind's operands were rounded to, each in the format it took (under
  // fp8 the LM head's in bf16): what the products read, counted as they read it.
  int64_t operand_bytes(TensorKind kind) const { return bytes_[int(kind)]; }
  // The bytes its scratch holds: each product's operands rounded (and transposed, scaled, its
  // result before rounding), five fp32 buffers, each grown to the largest product's and then kept,
  // allocated through the framework's allocator ("other"). Theory: precision_scratch_bytes (theory.h).
  int64_t scratch_bytes() const;

  // The delayed histories, for checkpoints (mixed_precision.h): one per operand of a product, by the
  // weight's offset and the operand's role, with its amaxes, oldest first.
  struct SavedHistory {
    int64_t site;
    int role;
    TensorKind kind;
    std::vector<float> amaxes;
  };
  std::vector<SavedHistory> saved_histories() const;
  // Replaces the histories with these (a resumed run's), and their scales with what they give.
  void restore_histories(const std::vector<SavedHistory>& saved);

 private:
  // One operand of one product: the forward's input and weight, the input gradient's dout and weight,
  // the weight gradient's dout and input.
  enum Role { FwdInput, FwdWeight, DgradOut, DgradWeight, WgradOut, WgradInput };
  struct History {
    std::deque<float> amaxes;  // newest last, at most recipe.amax_history
    float step_amax = 0;       // this step's largest so far (over micro-batches)
    float scale = 0;           // from the history; 0 until it has one
    TensorKind kind = TensorKind::Activations;
    int device_slot = -1;      // on a GPU: where the device gathers this step's amax (matmul_recipe_cuda.h)
  };
  // What the recipe makes of one operand, on either device: its format, what overflow does, which
  // values share a scale (Tiling) and the scale (0: each group's own current amax).
  struct OperandPlan {
    NumberFormat format;
    Overflow overflow;
    Tiling tiling;
    float scale;
  };
  // `amax` gives the operand's amax where the plan needs it now (delayed scaling's history), computed
  // on whichever device holds the values.
  OperandPlan plan_operand(int64_t site, Role role, TensorKind kind, int64_t elements,
                           const std::function<float()>& amax);  // counts the operand's bytes in its format
  // values (rows x cols, the product's contraction along cols), rounded into `scratch` as the recipe says.
  const float* quantize(const float* values, int rows, int cols, int64_t site, Role role, TensorKind kind,
                        Buffer& scratch);
  // The device path (precision_recipe_cuda.cpp): the three products with CUDA tensors.
  struct DeviceOperand {
    const void* codes;    // on the device, with the contraction along their rows
    NumberFormat format;
    float unscale;        // 1 / the operand's scale: the product's factor
  };
  // values (rows x cols on the device; `transposed`: their transpose is the operand), times `pre` (the
  // gradient scale), cast into operand slot `slot` (0: A, 1: B) as the plan says.
  DeviceOperand cast_on_device(const float* values, int rows, int cols, bool transposed, float pre, int64_t site,
                               Role role, TensorKind kind, int slot);
  void forward_on_device(Tensor out, Tensor inp, Tensor weight, Tensor bias);
  void backward_input_on_device(Tensor dinp, Tensor dout, Tensor weight);
  void backward_weight_on_device(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp);
  void drain_device_counts();  // the device's underflow and overflow counts (and delayed amaxes) into counts_
  bool used_device_ = false;
  int device_slots_ = 0;  // the amax slots handed to histories so far
  bool kept(int64_t site) const;
  void take_scale_from_history(History& h) const;  // the largest amax of the history, or 0 for none
  int64_t site_of(const float* address, bool grads) const;  // the flat offset of a weight (or its gradient)
  // values, or a copy multiplied by the gradient scale.
  const float* scaled_gradient(const float* values, int64_t n);

  PrecisionRecipe recipe_;
  const float* params_;
  const float* grads_;
  std::function<void(std::vector<float>&)> reduce_max_;
  std::vector<int64_t> kept_;
  std::vector<int64_t> apart_;  // reduce_apart's weight offsets, sorted
  std::function<void(std::vector<float>&)> reduce_apart_;
  bool is_apart(int64_t site) const;
  std::map<std::pair<int64_t, int>, History> histories_;  // by (weight offset, role)
  QuantCounts counts_[kTensorKinds];
  int64_t bytes_[kTensorKinds] = {};
  float gradient_scale_ = 1;
  Buffer a_, b_, transposed_, product_, scaled_;  // scratch, grown on demand (counted, never per call)
};
