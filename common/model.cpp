// model.cpp: GPT-2 forward and backward over the ops of ops.h, with the hooks of model.h.
// The activation layout follows llm.c: every intermediate a backward needs is kept, per layer, for
// micro-batches of up to max_B sequences, in one arena counted as "activations".
#include "model.h"

#include <cmath>

#include "ops.h"
#include "trace.h"

// Every activation the backward pass reads, plus the scratch gradients it writes. Shapes in
// comments use the largest micro-batch B; a smaller batch uses a prefix of each buffer.
struct GPT2::Activations {
  Buffer arena;
  // void*: the model's dtype (fp32, or bf16 in mixed precision). float*: fp32 always (statistics
  // that feed a division, and the losses).
  void* encoded;    // (B,T,C) embeddings; the residual stream entering block 0
  struct Layer {
    void* ln1; float *ln1_mean, *ln1_rstd;   // (B,T,C), (B,T), (B,T)
    void* qkv;                               // (B,T,3C)
    void* atty;                              // (B,T,C)  attention output, heads concatenated
    void *preatt, *att;                      // (B,NH,T,T); not allocated with FlashAttention
    float* lse;                              // (B,NH,T); FlashAttention only
    void* attproj;                           // (B,T,C)
    void* residual2;                         // (B,T,C)  stream after attention
    void* ln2; float *ln2_mean, *ln2_rstd;   // (B,T,C), (B,T), (B,T)
    void *fch, *fch_gelu;                    // (B,T,4C)
    void* fcproj;                            // (B,T,C)
    void* residual3;                         // (B,T,C)  stream after the MLP
  };
  std::vector<Layer> layers;
  void* lnf; float *lnf_mean, *lnf_rstd;     // (B,T,C), (B,T), (B,T)
  void *logits, *probs;                      // (B,T,V)
  float* losses;                             // (B,T)
  // Backward scratch, reused by every layer.
  void *dresidual, *dln, *datty;             // (B,T,C)
  void* dqkv;                                // (B,T,3C)
  void *dpreatt, *datt;                      // (B,NH,T,T); not allocated with FlashAttention
  void *dfch, *dfch_gelu;                    // (B,T,4C)
  void* dlogits;                             // (B,T,V)
};

namespace {

// Hands out consecutive pieces of one allocation; first counts (arena == nullptr), then carves.
// take() gives pieces of the model's dtype, take_f32() fp32 pieces.
class Carver {
 public:
  Carver(char* arena, DType dtype) : next_(arena), dtype_(dtype) {}
  void* take(int64_t count) { return take_bytes(count * int64_t(dtype_size(dtype_))); }
  float* take_f32(int64_t count) { return static_cast<float*>(take_bytes(count * int64_t(sizeof(float)))); }
  int64_t used_bytes() const { return used_; }

 private:
  void* take_bytes(int64_t bytes) {
    void* p = next_ ? next_ + used_ : nullptr;
    used_ += (bytes + 63) / 64 * 64;  // keep every piece 64-byte aligned
    return p;
  }
  char* next_;
  DType dtype_;
  int64_t used_ = 0;
};

// Called twice: once to count the arena's size, once to hand out its pieces.
void carve(GPT2::Activations& a, Carver& c, const GPT2Config& cfg, int B, bool flash) {
  const int64_t T = cfg.T, C = cfg.C, BT = B * T;
  const int64_t att = flash ? 0 : int64_t(B) * cfg.NH * T * T, lse = flash ? int64_t(B) * cfg.NH * T : 0;
  a.encoded = c.take(BT * C);
  a.layers.resize(cfg.L);
  for (auto& l : a.layers) {
    l.ln1 = c.take(BT * C); l.ln1_mean = c.take_f32(BT); l.ln1_rstd = c.take_f32(BT);
    l.qkv = c.take(BT * 3 * C);
    l.atty = c.take(BT * C);
    l.preatt = c.take(att); l.att = c.take(att); l.lse = c.take_f32(lse);
    l.attproj = c.take(BT * C);
    l.residual2 = c.take(BT * C);
    l.ln2 = c.take(BT * C); l.ln2_mean = c.take_f32(BT); l.ln2_rstd = c.take_f32(BT);
    l.fch = c.take(BT * 4 * C); l.fch_gelu = c.take(BT * 4 * C);
    l.fcproj = c.take(BT * C);
    l.residual3 = c.take(BT * C);
  }
  a.lnf = c.take(BT * C); a.lnf_mean = c.take_f32(BT); a.lnf_rstd = c.take_f32(BT);
  a.logits = c.take(BT * cfg.V); a.probs = c.take(BT * cfg.V);
  a.losses = c.take_f32(BT);
  a.dresidual = c.take(BT * C); a.dln = c.take(BT * C); a.datty = c.take(BT * C);
  a.dqkv = c.take(BT * 3 * C);
  a.dpreatt = c.take(att); a.datt = c.take(att);
  a.dfch = c.take(BT * 4 * C); a.dfch_gelu = c.take(BT * 4 * C);
  a.dlogits = c.take(BT * cfg.V);
}
}  // namespace

GPT2::GPT2(const GPT2Config& cfg, const ParamLayout& layout, int max_B, Device device, DType dtype)
    : cfg_(cfg), layout_(layout), max_B_(max_B), device_(device), dtype_(dtype),
      flash_(cfg.flash_attention && flash_attention_available(dtype, device, cfg.C, cfg.NH)),
      param_ptr_(layout.params.size(), nullptr), grad_ptr_(layout.params.size(), nullptr),
      acts_(new Activations) {
  ENSURE(dtype == DType::F32 || dtype == DType::BF16, "the model computes in fp32 or bf16");
  Carver counter(nullptr, dtype);
  carve(*acts_, counter, cfg, max_B, flash_);
  acts_->arena = Buffer(counter.used_bytes() / 4, MemCategory::Activations, DType::F32, device);  // raw bytes
  Carver carver(static_cast<char*>(acts_->arena.data()), dtype);
  carve(*acts_, carver, cfg, max_B, flash_);
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
}
void GPT2::bind_grads(int64_t begin, int64_t end, void* base) {
  bind_range(layout_, begin, end, base, dtype_size(dtype_), grad_ptr_);
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

namespace {
// Index of the first parameter of each unit, and of a block's parameters in the order added by
// build_gpt2_layout: ln1 w,b; qkv w,b; proj w,b; ln2 w,b; fc w,b; mlp proj w,b.
enum BlockParam { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B,
                  kBlockParams };
constexpr int kWte = 0, kWpe = 1;
int block_param(int l, BlockParam which) { return 2 + l * kBlockParams + which; }
int lnf_param(const GPT2Config& cfg, int which) { return 2 + cfg.L * kBlockParams + which; }

void call(const std::function<void(int)>& hook, int arg) {
  if (hook) hook(arg);
}
}  // namespace

float GPT2::forward(const int* inputs, const int* targets, int B) {
  ENSURE(B >= 1 && B <= max_B_, "micro-batch larger than the activations were sized for");
  B_ = B;
  inputs_ = inputs;
  targets_ = targets;
  const int64_t T = cfg_.T, C = cfg_.C, NH = cfg_.NH, V = cfg_.V;
  Activations& a = *acts_;
  auto btc = [&](void* p, int64_t c) { return make_view(p, {B, T, c}, dtype_, device_); };
  auto bt = [&](float* p) { return make_view(p, {B, T}, DType::F32, device_); };  // statistics, losses: fp32
  auto bhtt = [&](void* p) { return make_view(p, {B, NH, T, T}, dtype_, device_); };

  call(hooks.before_forward, 0);
  {
    TraceScope span("forward embed");
    encoder_forward(btc(a.encoded, C), inputs, param(kWte), param(kWpe), B, int(T));
  }
  call(hooks.after_forward, 0);

  for (int l = 0; l < cfg_.L; l++) {
    call(hooks.before_forward, l + 1);
    TraceScope span("forward L" + std::to_string(l));
    Activations::Layer& x = a.layers[l];
    void* residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
    auto P = [&](BlockParam w) { return param(block_param(l, w)); };
    layernorm_forward(btc(x.ln1, C), bt(x.ln1_mean), bt(x.ln1_rstd), btc(residual, C), P(LN1_W), P(LN1_B));
    matmul_forward(btc(x.qkv, 3 * C), btc(x.ln1, C), P(QKV_W), P(QKV_B));
    if (flash_) {
      attention_forward_flash(btc(x.atty, C), make_view(x.lse, {B, NH, T}, DType::F32, device_), btc(x.qkv, 3 * C),
                              int(NH));
    } else {
      attention_forward(btc(x.atty, C), bhtt(x.preatt), bhtt(x.att), btc(x.qkv, 3 * C), int(NH));
    }
    matmul_forward(btc(x.attproj, C), btc(x.atty, C), P(PROJ_W), P(PROJ_B));
    residual_forward(btc(x.residual2, C), btc(residual, C), btc(x.attproj, C));
    layernorm_forward(btc(x.ln2, C), bt(x.ln2_mean), bt(x.ln2_rstd), btc(x.residual2, C), P(LN2_W), P(LN2_B));
    matmul_forward(btc(x.fch, 4 * C), btc(x.ln2, C), P(FC_W), P(FC_B));
    gelu_forward(btc(x.fch_gelu, 4 * C), btc(x.fch, 4 * C));
    matmul_forward(btc(x.fcproj, C), btc(x.fch_gelu, 4 * C), P(FCPROJ_W), P(FCPROJ_B));
    residual_forward(btc(x.residual3, C), btc(x.residual2, C), btc(x.fcproj, C));
    call(hooks.after_forward, l + 1);
  }

  const int head = cfg_.L + 1;
  call(hooks.before_forward, head);
  float loss;
  {
    TraceScope span("forward head");
    void* residual = cfg_.L ? a.layers[cfg_.L - 1].residual3 : a.encoded;
    layernorm_forward(btc(a.lnf, C), bt(a.lnf_mean), bt(a.lnf_rstd), btc(residual, C), param(lnf_param(cfg_, 0)),
                      param(lnf_param(cfg_, 1)));
    matmul_forward(btc(a.logits, V), btc(a.lnf, C), param(kWte), Tensor());  // tied LM head
    softmax_crossentropy_forward(bt(a.losses), btc(a.probs, V), btc(a.logits, V), targets);
    loss = float(mean_of(bt(a.losses)));
  }
  call(hooks.after_forward, head);
  return loss;
}

void GPT2::backward(float loss_weight) {
  ENSURE(B_ > 0, "backward() needs a forward() first");
  const int B = B_;
  const int64_t T = cfg_.T, C = cfg_.C, NH = cfg_.NH, V = cfg_.V;
  Activations& a = *acts_;
  auto btc = [&](void* p, int64_t c) { return make_view(p, {B, T, c}, dtype_, device_); };
  auto bt = [&](float* p) { return make_view(p, {B, T}, DType::F32, device_); };  // statistics, losses: fp32
  auto bhtt = [&](void* p) { return make_view(p, {B, NH, T, T}, dtype_, device_); };
  auto ready = [&](int p) { call(hooks.grad_ready, p); };

  // Head: cross-entropy, tied LM head (wte's gradient is not final until the embedding's backward),
  // final layernorm. dresidual then carries the gradient of the residual stream down the blocks.
  const int head = cfg_.L + 1;
  call(hooks.before_backward, head);
  {
    TraceScope span("backward head");
    softmax_crossentropy_backward(btc(a.dlogits, V), btc(a.probs, V), targets_, loss_weight / float(B * T));
    fill_zero(btc(a.dln, C));
    matmul_backward(btc(a.dln, C), grad(kWte), Tensor(), btc(a.dlogits, V), btc(a.lnf, C), param(kWte));
    fill_zero(btc(a.dresidual, C));
    void* residual = cfg_.L ? a.layers[cfg_.L - 1].residual3 : a.encoded;
    int lnf_w = lnf_param(cfg_, 0), lnf_b = lnf_param(cfg_, 1);
    layernorm_backward(btc(a.dresidual, C), grad(lnf_w), grad(lnf_b), btc(a.dln, C), btc(residual, C),
                       param(lnf_w), bt(a.lnf_mean), bt(a.lnf_rstd));
    ready(lnf_b);
    ready(lnf_w);
  }
  call(hooks.after_backward, head);

  for (int l = cfg_.L - 1; l >= 0; l--) {
    call(hooks.before_backward, l + 1);
    TraceScope span("backward L" + std::to_string(l));
    Activations::Layer& x = a.layers[l];
    void* residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
    auto P = [&](BlockParam w) { return param(block_param(l, w)); };
    auto G = [&](BlockParam w) { return grad(block_param(l, w)); };
    auto both_ready = [&](BlockParam weight, BlockParam bias) {
      ready(block_param(l, bias));
      ready(block_param(l, weight));
    };
    // residual3 = residual2 + fcproj: dresidual is the gradient of both terms.
    fill_zero(btc(a.dfch_gelu, 4 * C));
    matmul_backward(btc(a.dfch_gelu, 4 * C), G(FCPROJ_W), G(FCPROJ_B), btc(a.dresidual, C), btc(x.fch_gelu, 4 * C),
                    P(FCPROJ_W));
    both_ready(FCPROJ_W, FCPROJ_B);
    fill_zero(btc(a.dfch, 4 * C));
    gelu_backward(btc(a.dfch, 4 * C), btc(x.fch, 4 * C), btc(a.dfch_gelu, 4 * C));
    fill_zero(btc(a.dln, C));
    matmul_backward(btc(a.dln, C), G(FC_W), G(FC_B), btc(a.dfch, 4 * C), btc(x.ln2, C), P(FC_W));
    both_ready(FC_W, FC_B);
    // Adds the MLP branch's gradient: dresidual becomes the gradient of residual2.
    layernorm_backward(btc(a.dresidual, C), G(LN2_W), G(LN2_B), btc(a.dln, C), btc(x.residual2, C), P(LN2_W),
                       bt(x.ln2_mean), bt(x.ln2_rstd));
    both_ready(LN2_W, LN2_B);
    // residual2 = residual + attproj.
    fill_zero(btc(a.datty, C));
    matmul_backward(btc(a.datty, C), G(PROJ_W), G(PROJ_B), btc(a.dresidual, C), btc(x.atty, C), P(PROJ_W));
    both_ready(PROJ_W, PROJ_B);
    fill_zero(btc(a.dqkv, 3 * C));
    if (flash_) {
      attention_backward_flash(btc(a.dqkv, 3 * C), btc(a.datty, C), btc(x.qkv, 3 * C), btc(x.atty, C),
                               make_view(x.lse, {B, NH, T}, DType::F32, device_), int(NH));
    } else {  // (dpreatt and datt are scratch the op overwrites)
      attention_backward(btc(a.dqkv, 3 * C), bhtt(a.dpreatt), bhtt(a.datt), btc(a.datty, C), btc(x.qkv, 3 * C),
                         bhtt(x.att), int(NH));
    }
    fill_zero(btc(a.dln, C));
    matmul_backward(btc(a.dln, C), G(QKV_W), G(QKV_B), btc(a.dqkv, 3 * C), btc(x.ln1, C), P(QKV_W));
    both_ready(QKV_W, QKV_B);
    // Adds the attention branch's gradient: dresidual becomes the gradient of the block's input.
    layernorm_backward(btc(a.dresidual, C), G(LN1_W), G(LN1_B), btc(a.dln, C), btc(residual, C), P(LN1_W),
                       bt(x.ln1_mean), bt(x.ln1_rstd));
    both_ready(LN1_W, LN1_B);
    call(hooks.after_backward, l + 1);
  }

  call(hooks.before_backward, 0);
  {
    TraceScope span("backward embed");
    encoder_backward(grad(kWte), grad(kWpe), btc(a.dresidual, C), inputs_, B, int(T));
    ready(kWpe);
    ready(kWte);
  }
  call(hooks.after_backward, 0);
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
