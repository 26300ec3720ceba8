// model.cpp: GPT2's construction (its checks, the arena, the routers of a MoE model), where its
// parameters and gradients are bound, and the forward and backward drivers that run a part's units in
// order with the hooks of model.h around each; GPT-2's initialisation. The units themselves are in
// model_ends.cpp (embedding, head) and model_block.cpp (a block's steps), each dimension's part of
// them in a file of its own (model_internal.h lists them).
#include <cmath>

#include "model/model_internal.h"
#include "ops/matmul_emulation.h"  // note_bound_memory: the flat offsets of what is bound, for --precision
#include "ops/ops.h"

using namespace model_internal;

namespace {
// Under context parallelism the model holds T/cp positions: every activation is as long as that.
GPT2Config held_positions(GPT2Config cfg, const ContextParallelism& cp) {
  cfg.T = cp.held_positions(cfg.T);
  return cfg;
}
}  // namespace

GPT2::GPT2(const GPT2Config& cfg, const ParamLayout& layout, int max_B, Device device, DType dtype,
           TensorParallelism tp, ModelPart part, ContextParallelism cp)
    : cfg_(held_positions(cfg, cp)), layout_(layout), max_B_(max_B), device_(device), dtype_(dtype),
      flash_(cfg.flash_attention && flash_attention_available(dtype, device, cfg.C / tp.size, cfg.NH / tp.size)),
      tp_(tp), part_(part), cp_(cp), param_ptr_(layout.params.size(), nullptr),
      grad_ptr_(layout.params.size(), nullptr), acts_(new Activations) {
  ENSURE(dtype == DType::F32 || dtype == DType::BF16, "the model computes in fp32 or bf16");
  ENSURE(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "GPT2: tensor-parallel rank out of range");
  ENSURE(layout.tp.size == tp.size && layout.tp.rank == tp.rank, "GPT2: the layout is for another tensor-parallel rank");
  ENSURE(tp.size == 1 || (cfg.NH % tp.size == 0 && cfg.V % tp.size == 0 && (4 * cfg.C) % tp.size == 0),
         "GPT2: NH, V and 4C must divide by the tensor-parallel size");
  ENSURE(!(tp.size > 1 && tp.sequence_parallel) || (int64_t(max_B) * cfg.T) % tp.size == 0,
         "GPT2: sequence parallelism needs B*T divisible by the tensor-parallel size");
  part_.last_unit = part.last(cfg);
  ENSURE(part_.first_unit >= 0 && part_.first_unit <= part_.last_unit && part_.last_unit <= cfg.L + 1 &&
             part_.slots >= 1,
         "GPT2: a part must be a non-empty run of the units 0..L+1, with at least one slot");
  ENSURE(!part_.split_backward || cfg.recompute != Recompute::Full,
         "GPT2: full recomputation keeps no product's input for a later weight pass (split_backward)");
  for (int u = part_.first_unit; u <= part_.last_unit; u++)
    for (const ParamInfo& p : layout.params)
      ENSURE(p.unit != u || p.held() || p.expert >= 0,  // (another rank's experts: expert parallelism)
             "GPT2: the layout does not hold unit " + std::to_string(u) + " (" + p.name + ")");
  ENSURE(!cp.on() || (!flash_ && cfg.T % int(cp.positions.size()) == 0),
         "GPT2: context parallelism runs its own attention (not FlashAttention) on T/cp positions");
  // Attention through the context-parallel hooks keeps what FlashAttention keeps: a log-sum-exp per query.
  const bool lse_only = cp.lse_attention(flash_);
  if (cfg_.moe()) init_experts(max_B);
  allocate_activations(*acts_, cfg_, max_B, lse_only, tp, part_, dtype, device);
}

GPT2::~GPT2() = default;

namespace {
void bind_range(const ParamLayout& layout, int64_t begin, int64_t end, void* base, size_t element_bytes,
                std::vector<char*>& where) {
  for (size_t p = 0; p < layout.params.size(); p++) {
    const ParamInfo& info = layout.params[p];
    const bool inside = info.offset >= begin && info.offset + info.size <= end;
    const bool outside = info.offset + info.size <= begin || info.offset >= end;
    ENSURE(inside || outside, "a bound range must not cut through " + info.name);
    if (inside) where[p] = base ? static_cast<char*>(base) + (info.offset - begin) * int64_t(element_bytes) : nullptr;
  }
}
}  // namespace

void GPT2::bind_params(int64_t begin, int64_t end, void* base) {
  bind_range(layout_, begin, end, base, dtype_size(dtype_), param_ptr_);
  note_bound_memory(false, begin, end, base, dtype_size(dtype_));  // --precision knows a weight by its offset
}
void GPT2::bind_grads(int64_t begin, int64_t end, void* base) {
  bind_range(layout_, begin, end, base, dtype_size(dtype_), grad_ptr_);
  note_bound_memory(true, begin, end, base, dtype_size(dtype_));
}

void GPT2::bind_unit_params(int u, void* base) {
  bind_params(layout_.unit_begin[u], layout_.unit_begin[u + 1], base);
}

void GPT2::bind_unit_grads(int u, void* base) { bind_grads(layout_.unit_begin[u], layout_.unit_begin[u + 1], base); }

void GPT2::bind_all(void* params, void* grads) {
  bind_params(0, layout_.padded_size, params);
  bind_grads(0, layout_.padded_size, grads);
}

namespace {
Tensor shaped_view(char* data, const ParamInfo& p, DType dtype, Device device) {
  ENSURE(data != nullptr, p.name + " is not bound to memory (released, or never gathered?)");
  return p.ndim == 2 ? make_view(data, {p.shape[0], p.shape[1]}, dtype, device)
                     : make_view(data, {p.shape[0]}, dtype, device);
}
}  // namespace

Tensor GPT2::param(int p) const { return shaped_view(param_ptr_[p], layout_.params[p], dtype_, device_); }
Tensor GPT2::grad(int p) const { return shaped_view(grad_ptr_[p], layout_.params[p], dtype_, device_); }

// ---------------------------------------------------------------------------------------------
// Forward

float GPT2::forward(const int* inputs, const int* targets, int B) { return forward(0, inputs, targets, B); }

float GPT2::forward(int slot, const int* inputs, const int* targets, int B) {
  ENSURE(B >= 1 && B <= max_B_, "micro-batch larger than the activations were sized for");
  ENSURE(slot >= 0 && slot < part_.slots, "GPT2::forward: no such activation slot");
  ENSURE(tp_.size == 1 || (product_hooks.f_forward && product_hooks.f_backward && product_hooks.g_forward &&
                           product_hooks.g_backward && product_hooks.vocab_all_reduce),
         "a tensor-parallel model needs all of its ProductHooks (apply_tensor_parallel)");
  ENSURE(!cp_.on() || (attention_hooks.attention_forward && attention_hooks.attention_backward),
         "a context-parallel model needs its AttentionHooks (apply_context_parallel)");
  Slot& s = acts_->slots[slot];
  ENSURE(s.weight_gradients.empty(), "GPT2::forward: the slot's weight gradients were never computed");
  s.inputs = inputs;
  s.targets = targets;
  s.B = B;
  const BlockRange blocks = blocks_of(cfg_, part_);
  aux_loss_ = 0;
  if (has_embedding()) {
    call(hooks.before_forward, 0);
    embed_forward(s);
    call(hooks.after_forward, 0);
  }
  for (int l = blocks.begin; l < blocks.end; l++) {
    call(hooks.before_forward, l + 1);
    block_forward(s, l, forward_layer(s, l), false);  // (forward_layer: the slot's, or recomputation's)
    call(hooks.after_forward, l + 1);
  }
  if (!has_head()) return float(aux_loss_);  // a MoE stage's blocks' share of the balance loss
  const int head = cfg_.L + 1;
  call(hooks.before_forward, head);
  const float loss = head_forward(s);
  call(hooks.after_forward, head);
  return loss + float(aux_loss_);
}

// ---------------------------------------------------------------------------------------------
// Backward

void GPT2::backward(float loss_weight) { backward(0, loss_weight); }

void GPT2::backward(int slot, float loss_weight, Tensor output_grad) {
  ENSURE(slot >= 0 && slot < part_.slots, "GPT2::backward: no such activation slot");
  Slot& s = acts_->slots[slot];
  ENSURE(s.B > 0, "backward() needs a forward() first");
  last_backward_B_ = s.B;
  loss_weight_ = loss_weight;
  const BlockRange blocks = blocks_of(cfg_, part_);
  const int head = cfg_.L + 1;
  if (has_head()) {
    call(hooks.before_backward, head);
    head_backward(s, loss_weight);
    call(hooks.after_backward, head);
  } else {  // a pipeline stage before the head: the gradient of its output came from the next stage
    const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
    ENSURE(output_grad.numel() == v.local(acts_->dresidual).numel(), "GPT2::backward: output_grad is not (B,T,C)");
    copy_tensor(v.local(acts_->dresidual), output_grad);
  }
  for (int l = blocks.end - 1; l >= blocks.begin; l--) {
    call(hooks.before_backward, l + 1);
    block_backward(s, l);
    call(hooks.after_backward, l + 1);
  }
  if (has_embedding()) {
    call(hooks.before_backward, 0);
    embed_backward(s);
    call(hooks.after_backward, 0);
  }
}

namespace {

// splitmix64: a tiny, fully specified generator, so initial weights are identical on every machine
// and standard library (std::normal_distribution is not specified bit for bit).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double((next() >> 11) + 1) / 9007199254740993.0; }  // in (0, 1]
  double normal() {  // Box-Muller
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void GPT2::init_weights(const ParamLayout& layout, uint64_t seed, float* params) {
  ENSURE(layout.tp.size == 1, "init_weights makes the whole model; a tensor-parallel rank slices it");
  int L = layout.num_units() - 2;
  for (size_t i = 0; i < layout.params.size(); i++) {
    const ParamInfo& p = layout.params[i];
    float* w = params + p.offset;
    if (p.ndim == 2) {
      // GPT-2 scales the projections that write into the residual stream by 1/sqrt(2L), so the
      // stream's variance does not grow with depth.
      bool residual_proj = ends_with(p.name, "attn.proj.weight") || ends_with(p.name, "mlp.proj.weight");
      double std = 0.02 / (residual_proj ? std::sqrt(2.0 * L) : 1.0);
      SplitMix64 rng{seed * 0x100000001B3ull + i};
      for (int64_t j = 0; j < p.size; j++) w[j] = float(rng.normal() * std);
    } else {
      float value = (ends_with(p.name, "ln1.weight") || ends_with(p.name, "ln2.weight") || p.name == "lnf.weight")
                        ? 1.0f : 0.0f;
      for (int64_t j = 0; j < p.size; j++) w[j] = value;
    }
  }
}
