// model.cpp: GPT-2 forward and backward over the ops of ops.h, with the hooks of model.h.
// The activation layout follows llm.c: every intermediate a backward needs is kept, per layer, for
// micro-batches of up to max_B sequences, in one arena counted as "activations". Under tensor
// parallelism the arena holds this rank's part: its heads' qkv and attention, its MLP channels, its
// vocabulary's logits, and, under sequence parallelism, its slice of the rows between the parallel
// layers (docs/theory.md, "Activation memory" gives every term).
#include "model.h"

#include <cmath>

#include "ops.h"
#include "trace.h"

// Every activation the backward pass reads, plus the scratch gradients it writes. Shapes in comments:
// R = B*T positions; r = R/t rows under sequence parallelism, else R; C' = C/t, NH' = NH/t, F' = 4C/t,
// V' = V/t on a tensor-parallel rank (t = 1: the whole model). A smaller batch uses a prefix of each.
struct GPT2::Activations {
  Buffer arena;
  // void*: the model's dtype (fp32, or bf16 in mixed precision). float*: fp32 always (statistics
  // that feed a division, and the losses).
  void* encoded;    // (r,C) embeddings; the residual stream entering block 0
  struct Layer {
    void* ln1; float *ln1_mean, *ln1_rstd;   // (r,C), (r), (r)
    void* qkv;                               // (R,3C')  this rank's heads' q, k, v
    void* atty;                              // (R,C')   attention output, this rank's heads
    void *preatt, *att;                      // (B,NH',T,T); not allocated with FlashAttention
    float* lse;                              // (B,NH',T); FlashAttention only
    void* attproj;                           // (r,C)
    void* residual2;                         // (r,C)    stream after attention
    void* ln2; float *ln2_mean, *ln2_rstd;   // (r,C), (r), (r)
    void *fch, *fch_gelu;                    // (R,F')
    void* fcproj;                            // (r,C)
    void* residual3;                         // (r,C)    stream after the MLP
  };
  std::vector<Layer> layers;
  void* lnf; float *lnf_mean, *lnf_rstd;     // (r,C), (r), (r)
  void *logits, *probs;                      // (R,V')
  float* losses;                             // (R)
  float *row_max, *row_sum, *target_logit;   // (R); the vocabulary-parallel cross-entropy (t > 1)
  // Backward scratch, reused by every layer.
  void *dresidual, *dln;                     // (r,C)
  void* datty;                               // (R,C')
  void* dqkv;                                // (R,3C')
  void *dpreatt, *datt;                      // (B,NH',T,T); not allocated with FlashAttention
  void *dfch, *dfch_gelu;                    // (R,F')
  void* dlogits;                             // (R,V')
  // Sequence parallelism only (else these are the local tensors themselves): a full-rows input of a
  // column-parallel layer (gathered, in forward and again in backward), a row-parallel layer's full
  // partial output, and a full-rows gradient (an f's input in backward, a g's output).
  void *gathered, *partial, *dfull;          // (R,C)
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

// The sizes of one rank's tensors (see Activations).
struct Dims {
  int64_t B, T, C, R, r, Cl, NHl, Fl, Vl;
  bool sp;
};
Dims dims_for(const GPT2Config& cfg, int B, const TensorParallelism& tp) {
  Dims d;
  d.B = B, d.T = cfg.T, d.C = cfg.C, d.R = int64_t(B) * cfg.T;
  d.sp = tp.size > 1 && tp.sequence_parallel;
  d.r = d.sp ? d.R / tp.size : d.R;
  d.Cl = cfg.C / tp.size, d.NHl = cfg.NH / tp.size, d.Fl = 4 * int64_t(cfg.C) / tp.size, d.Vl = cfg.V / tp.size;
  return d;
}

// Called twice: once to count the arena's size, once to hand out its pieces. theory.cpp's
// activation_bytes() is this listing as a formula.
void carve(GPT2::Activations& a, Carver& c, const GPT2Config& cfg, int B, bool flash, const TensorParallelism& tp) {
  const Dims d = dims_for(cfg, B, tp);
  const int64_t C = d.C, R = d.R, r = d.r;
  const int64_t att = flash ? 0 : d.B * d.NHl * d.T * d.T, lse = flash ? d.B * d.NHl * d.T : 0;
  a.encoded = c.take(r * C);
  a.layers.resize(cfg.L);
  for (auto& l : a.layers) {
    l.ln1 = c.take(r * C); l.ln1_mean = c.take_f32(r); l.ln1_rstd = c.take_f32(r);
    l.qkv = c.take(R * 3 * d.Cl);
    l.atty = c.take(R * d.Cl);
    l.preatt = c.take(att); l.att = c.take(att); l.lse = c.take_f32(lse);
    l.attproj = c.take(r * C);
    l.residual2 = c.take(r * C);
    l.ln2 = c.take(r * C); l.ln2_mean = c.take_f32(r); l.ln2_rstd = c.take_f32(r);
    l.fch = c.take(R * d.Fl); l.fch_gelu = c.take(R * d.Fl);
    l.fcproj = c.take(r * C);
    l.residual3 = c.take(r * C);
  }
  a.lnf = c.take(r * C); a.lnf_mean = c.take_f32(r); a.lnf_rstd = c.take_f32(r);
  a.logits = c.take(R * d.Vl); a.probs = c.take(R * d.Vl);
  a.losses = c.take_f32(R);
  const bool vocab_parallel = tp.size > 1;
  a.row_max = c.take_f32(vocab_parallel ? R : 0);
  a.row_sum = c.take_f32(vocab_parallel ? R : 0);
  a.target_logit = c.take_f32(vocab_parallel ? R : 0);
  a.dresidual = c.take(r * C); a.dln = c.take(r * C);
  a.datty = c.take(R * d.Cl);
  a.dqkv = c.take(R * 3 * d.Cl);
  a.dpreatt = c.take(att); a.datt = c.take(att);
  a.dfch = c.take(R * d.Fl); a.dfch_gelu = c.take(R * d.Fl);
  a.dlogits = c.take(R * d.Vl);
  a.gathered = c.take(d.sp ? R * C : 0);
  a.partial = c.take(d.sp ? R * C : 0);
  a.dfull = c.take(d.sp ? R * C : 0);
}
}  // namespace

GPT2::GPT2(const GPT2Config& cfg, const ParamLayout& layout, int max_B, Device device, DType dtype,
           TensorParallelism tp)
    : cfg_(cfg), layout_(layout), max_B_(max_B), device_(device), dtype_(dtype),
      flash_(cfg.flash_attention && flash_attention_available(dtype, device, cfg.C / tp.size, cfg.NH / tp.size)),
      tp_(tp), param_ptr_(layout.params.size(), nullptr), grad_ptr_(layout.params.size(), nullptr),
      acts_(new Activations) {
  ENSURE(dtype == DType::F32 || dtype == DType::BF16, "the model computes in fp32 or bf16");
  ENSURE(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "GPT2: tensor-parallel rank out of range");
  ENSURE(layout.tp.size == tp.size && layout.tp.rank == tp.rank, "GPT2: the layout is for another tensor-parallel rank");
  ENSURE(tp.size == 1 || (cfg.NH % tp.size == 0 && cfg.V % tp.size == 0 && (4 * cfg.C) % tp.size == 0),
         "GPT2: NH, V and 4C must divide by the tensor-parallel size");
  ENSURE(!(tp.size > 1 && tp.sequence_parallel) || (int64_t(max_B) * cfg.T) % tp.size == 0,
         "GPT2: sequence parallelism needs B*T divisible by the tensor-parallel size");
  Carver counter(nullptr, dtype);
  carve(*acts_, counter, cfg, max_B, flash_, tp);
  acts_->arena = Buffer(counter.used_bytes() / 4, MemCategory::Activations, DType::F32, device);  // raw bytes
  Carver carver(static_cast<char*>(acts_->arena.data()), dtype);
  carve(*acts_, carver, cfg, max_B, flash_, tp);
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

void wait(CommHandle& handle) {
  if (handle.valid()) handle.wait();
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Views of the arena for the current batch, and the tensor-parallel collectives (none when t = 1).

namespace {
struct Views {
  Dims d;
  DType dtype;
  Device device;
  Tensor rows(void* p, int64_t n, int64_t cols) const { return make_view(p, {n, cols}, dtype, device); }
  Tensor local(void* p) const { return rows(p, d.r, d.C); }    // (r,C): the stream between the parallel layers
  Tensor full(void* p, int64_t cols) const { return rows(p, d.R, cols); }
  Tensor btc(void* p, int64_t cols) const { return make_view(p, {d.B, d.T, cols}, dtype, device); }
  Tensor stat(float* p, int64_t n) const { return make_view(p, {n}, DType::F32, device); }
  Tensor bhtt(void* p) const { return make_view(p, {d.B, d.NHl, d.T, d.T}, dtype, device); }
  Tensor lse(float* p) const { return make_view(p, {d.B, d.NHl, d.T}, DType::F32, device); }
  // The full-rows form of a local tensor: its own rows without sequence parallelism, else `spare`.
  Tensor full_of(void* local_data, void* spare) const { return full(d.sp ? spare : local_data, d.C); }
};
}  // namespace

// ---------------------------------------------------------------------------------------------
// Forward

float GPT2::forward(const int* inputs, const int* targets, int B) {
  ENSURE(B >= 1 && B <= max_B_, "micro-batch larger than the activations were sized for");
  ENSURE(tp_.size == 1 || (tp_hooks.f_forward && tp_hooks.f_backward && tp_hooks.g_forward && tp_hooks.g_backward &&
                           tp_hooks.vocab_all_reduce),
         "a tensor-parallel model needs all of its TensorParallelHooks");
  B_ = B;
  inputs_ = inputs;
  targets_ = targets;
  call(hooks.before_forward, 0);
  embed_forward();
  call(hooks.after_forward, 0);
  for (int l = 0; l < cfg_.L; l++) {
    call(hooks.before_forward, l + 1);
    block_forward(l);
    call(hooks.after_forward, l + 1);
  }
  const int head = cfg_.L + 1;
  call(hooks.before_forward, head);
  const float loss = head_forward();
  call(hooks.after_forward, head);
  return loss;
}

void GPT2::embed_forward() {
  TraceScope span("forward embed");
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, B_, tp_), dtype_, device_};
  if (tp_.size == 1) {
    encoder_forward(v.btc(a.encoded, v.d.C), inputs_, param(kWte), param(kWpe), B_, cfg_.T);
    return;
  }
  // Vocabulary-parallel: each rank looks up the tokens its slice of wte holds (zeros for the others);
  // "g" sums the partial lookups over the group. The position embeddings are added after, on the
  // rows this rank keeps: whole on every rank, wpe is not split.
  const Tensor partial = v.full_of(a.encoded, a.partial), encoded = v.local(a.encoded);
  embedding_forward(partial, inputs_, param(kWte), tp_.rank * int(v.d.Vl), cfg_.V);
  CommHandle summed = tp_hooks.g_forward(partial, encoded);
  wait(summed);
  position_forward(encoded, param(kWpe), tp_.rank * v.d.r * int64_t(v.d.sp), cfg_.T);
}

void GPT2::block_forward(int l) {
  TraceScope span("forward L" + std::to_string(l));
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, B_, tp_), dtype_, device_};
  const bool tensor_parallel = tp_.size > 1;
  Activations::Layer& x = a.layers[l];
  void* residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
  auto P = [&](BlockParam w) { return param(block_param(l, w)); };
  auto f = [&](void* local, void* spare) {  // the input of a column-parallel layer, all rows
    const Tensor full = v.full_of(local, spare);
    if (tensor_parallel) {
      CommHandle gathered = tp_hooks.f_forward(v.local(local), full);
      wait(gathered);
    }
    return full;
  };
  auto g = [&](Tensor partial, void* out) {  // a row-parallel layer's partial sums, reduced, + bias
    if (!tensor_parallel) return;
    CommHandle reduced = tp_hooks.g_forward(partial, v.local(out));
    wait(reduced);
  };
  // A row-parallel layer's bias is added once, after the reduction (added before it on every rank,
  // it would count t times); with one rank the GEMM adds it.
  auto row_bias = [&](BlockParam bias) { return tensor_parallel ? Tensor() : P(bias); };

  layernorm_forward(v.local(x.ln1), v.stat(x.ln1_mean, v.d.r), v.stat(x.ln1_rstd, v.d.r), v.local(residual),
                    P(LN1_W), P(LN1_B));
  matmul_forward(v.btc(x.qkv, 3 * v.d.Cl), f(x.ln1, a.gathered), P(QKV_W), P(QKV_B));  // column-parallel
  if (flash_) {
    attention_forward_flash(v.btc(x.atty, v.d.Cl), v.lse(x.lse), v.btc(x.qkv, 3 * v.d.Cl), int(v.d.NHl));
  } else {
    attention_forward(v.btc(x.atty, v.d.Cl), v.bhtt(x.preatt), v.bhtt(x.att), v.btc(x.qkv, 3 * v.d.Cl), int(v.d.NHl));
  }
  const Tensor attproj_partial = v.full_of(x.attproj, a.partial);
  matmul_forward(attproj_partial, v.full(x.atty, v.d.Cl), P(PROJ_W), row_bias(PROJ_B));  // row-parallel
  g(attproj_partial, x.attproj);
  if (tensor_parallel) add_bias(v.local(x.attproj), P(PROJ_B));
  residual_forward(v.local(x.residual2), v.local(residual), v.local(x.attproj));
  layernorm_forward(v.local(x.ln2), v.stat(x.ln2_mean, v.d.r), v.stat(x.ln2_rstd, v.d.r), v.local(x.residual2),
                    P(LN2_W), P(LN2_B));
  matmul_forward(v.full(x.fch, v.d.Fl), f(x.ln2, a.gathered), P(FC_W), P(FC_B));  // column-parallel
  gelu_forward(v.full(x.fch_gelu, v.d.Fl), v.full(x.fch, v.d.Fl));
  const Tensor fcproj_partial = v.full_of(x.fcproj, a.partial);
  matmul_forward(fcproj_partial, v.full(x.fch_gelu, v.d.Fl), P(FCPROJ_W), row_bias(FCPROJ_B));  // row-parallel
  g(fcproj_partial, x.fcproj);
  if (tensor_parallel) add_bias(v.local(x.fcproj), P(FCPROJ_B));
  residual_forward(v.local(x.residual3), v.local(x.residual2), v.local(x.fcproj));
}

float GPT2::head_forward() {
  TraceScope span("forward head");
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, B_, tp_), dtype_, device_};
  void* residual = cfg_.L ? a.layers[cfg_.L - 1].residual3 : a.encoded;
  layernorm_forward(v.local(a.lnf), v.stat(a.lnf_mean, v.d.r), v.stat(a.lnf_rstd, v.d.r), v.local(residual),
                    param(lnf_param(cfg_, 0)), param(lnf_param(cfg_, 1)));
  const Tensor logits = v.btc(a.logits, v.d.Vl), probs = v.btc(a.probs, v.d.Vl);
  const Tensor losses = make_view(a.losses, {v.d.B, v.d.T}, DType::F32, device_);
  if (tp_.size == 1) {
    matmul_forward(logits, v.btc(a.lnf, v.d.C), param(kWte), Tensor());  // tied LM head
    softmax_crossentropy_forward(losses, probs, logits, targets_);
    return float(mean_of(losses));
  }
  // The head is column-parallel over the vocabulary: V/t logits a rank. Its cross-entropy combines
  // the rows' maxima, sums of exponentials and target logits over the group, never the logits.
  const Tensor lnf_full = v.full_of(a.lnf, a.gathered);
  CommHandle gathered = tp_hooks.f_forward(v.local(a.lnf), lnf_full);
  wait(gathered);
  matmul_forward(logits, lnf_full, param(kWte), Tensor());
  const Tensor row_max = v.stat(a.row_max, v.d.R), row_sum = v.stat(a.row_sum, v.d.R);
  const Tensor target_logit = v.stat(a.target_logit, v.d.R);
  crossentropy_shard_max(row_max, target_logit, logits, targets_, tp_.rank * int(v.d.Vl));
  tp_hooks.vocab_all_reduce(row_max, ReduceOp::Max);
  tp_hooks.vocab_all_reduce(target_logit, ReduceOp::Sum);
  crossentropy_shard_exp(probs, row_sum, logits, row_max);
  tp_hooks.vocab_all_reduce(row_sum, ReduceOp::Sum);
  crossentropy_shard_finish(losses, probs, row_max, row_sum, target_logit);
  return float(mean_of(losses));
}

// ---------------------------------------------------------------------------------------------
// Backward

void GPT2::backward(float loss_weight) {
  ENSURE(B_ > 0, "backward() needs a forward() first");
  const int head = cfg_.L + 1;
  call(hooks.before_backward, head);
  head_backward(loss_weight);
  call(hooks.after_backward, head);
  for (int l = cfg_.L - 1; l >= 0; l--) {
    call(hooks.before_backward, l + 1);
    block_backward(l);
    call(hooks.after_backward, l + 1);
  }
  call(hooks.before_backward, 0);
  embed_backward();
  call(hooks.after_backward, 0);
}

void GPT2::column_parallel_backward(Tensor dinp_local, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp_local,
                                    Tensor weight) {
  const Views v{dims_for(cfg_, B_, tp_), dtype_, device_};
  Activations& a = *acts_;
  if (tp_.size == 1) return matmul_backward(dinp_local, dweight, dbias, dout, inp_local, weight);
  // The input's gradient first: each rank's part comes from its own slice of the weight, so "f"
  // sums them over the group. Its collective is started here, and the weight's gradient computed
  // while it travels (the chapter decides whether it really runs in the background: --tp-overlap).
  // Under sequence parallelism the layer's input is re-gathered for the weight's gradient (it was
  // kept as this rank's rows only, the point of sequence parallelism), also in the background.
  const Tensor dinp_full = v.full_of(dinp_local.data, a.dfull);
  const Tensor inp_full = v.full_of(inp_local.data, a.gathered);
  CommHandle regathered = tp_hooks.f_forward(inp_local, inp_full);
  if (v.d.sp) fill_zero(dinp_full);  // (dinp_local itself is zero on entry: f overwrites it)
  const Tensor dinp_partial = v.d.sp ? dinp_full : dinp_local;
  matmul_backward_input(dinp_partial, dout, weight);
  CommHandle summed = tp_hooks.f_backward(dinp_partial, dinp_local);
  wait(regathered);
  matmul_backward_weight(dweight, dbias, dout, inp_full);
  wait(summed);
}

void GPT2::head_backward(float loss_weight) {
  TraceScope span("backward head");
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, B_, tp_), dtype_, device_};
  const int B = B_;
  // Cross-entropy, the tied LM head (wte's gradient is not final until the embedding's backward),
  // the final layernorm. dresidual then carries the gradient of the residual stream down the blocks.
  softmax_crossentropy_backward(v.btc(a.dlogits, v.d.Vl), v.btc(a.probs, v.d.Vl), targets_,
                                loss_weight / float(B * cfg_.T), tp_.rank * int(v.d.Vl));
  fill_zero(v.local(a.dln));
  column_parallel_backward(v.local(a.dln), grad(kWte), Tensor(), v.full(a.dlogits, v.d.Vl), v.local(a.lnf),
                           param(kWte));
  fill_zero(v.local(a.dresidual));
  void* residual = cfg_.L ? a.layers[cfg_.L - 1].residual3 : a.encoded;
  const int lnf_w = lnf_param(cfg_, 0), lnf_b = lnf_param(cfg_, 1);
  layernorm_backward(v.local(a.dresidual), grad(lnf_w), grad(lnf_b), v.local(a.dln), v.local(residual), param(lnf_w),
                     v.stat(a.lnf_mean, v.d.r), v.stat(a.lnf_rstd, v.d.r));
  call(hooks.grad_ready, lnf_b);
  call(hooks.grad_ready, lnf_w);
}

void GPT2::block_backward(int l) {
  TraceScope span("backward L" + std::to_string(l));
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, B_, tp_), dtype_, device_};
  const bool tensor_parallel = tp_.size > 1;
  Activations::Layer& x = a.layers[l];
  void* residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
  auto P = [&](BlockParam w) { return param(block_param(l, w)); };
  auto G = [&](BlockParam w) { return grad(block_param(l, w)); };
  auto both_ready = [&](BlockParam weight, BlockParam bias) {
    call(hooks.grad_ready, block_param(l, bias));
    call(hooks.grad_ready, block_param(l, weight));
  };
  // A row-parallel layer: its bias's gradient from this rank's rows (added after the reduction in
  // forward), then "g"'s backward brings the output's gradient to all rows, then the product's.
  auto row_parallel_backward = [&](Tensor dinp_full, BlockParam w, BlockParam b, Tensor inp_full) {
    const Tensor dout_local = v.local(a.dresidual);
    Tensor dout_full = dout_local;
    if (tensor_parallel) {
      bias_backward(G(b), dout_local);
      dout_full = v.full_of(a.dresidual, a.dfull);
      CommHandle gathered = tp_hooks.g_backward(dout_local, dout_full);
      wait(gathered);
    }
    matmul_backward(dinp_full, G(w), tensor_parallel ? Tensor() : G(b), dout_full, inp_full, P(w));
    both_ready(w, b);
  };

  // residual3 = residual2 + fcproj: dresidual is the gradient of both terms.
  fill_zero(v.full(a.dfch_gelu, v.d.Fl));
  row_parallel_backward(v.full(a.dfch_gelu, v.d.Fl), FCPROJ_W, FCPROJ_B, v.full(x.fch_gelu, v.d.Fl));
  fill_zero(v.full(a.dfch, v.d.Fl));
  gelu_backward(v.full(a.dfch, v.d.Fl), v.full(x.fch, v.d.Fl), v.full(a.dfch_gelu, v.d.Fl));
  fill_zero(v.local(a.dln));
  column_parallel_backward(v.local(a.dln), G(FC_W), G(FC_B), v.full(a.dfch, v.d.Fl), v.local(x.ln2), P(FC_W));
  both_ready(FC_W, FC_B);
  // Adds the MLP branch's gradient: dresidual becomes the gradient of residual2.
  layernorm_backward(v.local(a.dresidual), G(LN2_W), G(LN2_B), v.local(a.dln), v.local(x.residual2), P(LN2_W),
                     v.stat(x.ln2_mean, v.d.r), v.stat(x.ln2_rstd, v.d.r));
  both_ready(LN2_W, LN2_B);
  // residual2 = residual + attproj.
  fill_zero(v.full(a.datty, v.d.Cl));
  row_parallel_backward(v.full(a.datty, v.d.Cl), PROJ_W, PROJ_B, v.full(x.atty, v.d.Cl));
  fill_zero(v.full(a.dqkv, 3 * v.d.Cl));
  if (flash_) {
    attention_backward_flash(v.btc(a.dqkv, 3 * v.d.Cl), v.btc(a.datty, v.d.Cl), v.btc(x.qkv, 3 * v.d.Cl),
                             v.btc(x.atty, v.d.Cl), v.lse(x.lse), int(v.d.NHl));
  } else {  // (dpreatt and datt are scratch the op overwrites)
    attention_backward(v.btc(a.dqkv, 3 * v.d.Cl), v.bhtt(a.dpreatt), v.bhtt(a.datt), v.btc(a.datty, v.d.Cl),
                       v.btc(x.qkv, 3 * v.d.Cl), v.bhtt(x.att), int(v.d.NHl));
  }
  fill_zero(v.local(a.dln));
  column_parallel_backward(v.local(a.dln), G(QKV_W), G(QKV_B), v.full(a.dqkv, 3 * v.d.Cl), v.local(x.ln1), P(QKV_W));
  both_ready(QKV_W, QKV_B);
  // Adds the attention branch's gradient: dresidual becomes the gradient of the block's input.
  layernorm_backward(v.local(a.dresidual), G(LN1_W), G(LN1_B), v.local(a.dln), v.local(residual), P(LN1_W),
                     v.stat(x.ln1_mean, v.d.r), v.stat(x.ln1_rstd, v.d.r));
  both_ready(LN1_W, LN1_B);
}

void GPT2::embed_backward() {
  TraceScope span("backward embed");
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, B_, tp_), dtype_, device_};
  if (tp_.size == 1) {
    encoder_backward(grad(kWte), grad(kWpe), v.btc(a.dresidual, v.d.C), inputs_, B_, cfg_.T);
  } else {
    const Tensor dencoded = v.local(a.dresidual), dfull = v.full_of(a.dresidual, a.dfull);
    position_backward(grad(kWpe), dencoded, tp_.rank * v.d.r * int64_t(v.d.sp), cfg_.T);
    CommHandle gathered = tp_hooks.g_backward(dencoded, dfull);
    wait(gathered);
    embedding_backward(grad(kWte), dfull, inputs_, tp_.rank * int(v.d.Vl), cfg_.V);
  }
  call(hooks.grad_ready, kWpe);
  call(hooks.grad_ready, kWte);
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
