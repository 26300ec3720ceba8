// model.cpp: GPT-2 forward and backward over the ops of ops.h, with the hooks of model.h.
// The activation layout follows llm.c: every intermediate a backward needs is kept, per layer, for
// micro-batches of up to max_B sequences, in one arena counted as "activations". Under tensor
// parallelism the arena holds this rank's part: its heads' qkv and attention, its MLP channels, its
// vocabulary's logits, and, under sequence parallelism, its slice of the rows between the parallel
// layers (docs/theory.md, "Activation memory" gives every term). Under recomputation (GPT2Config::
// recompute) the slots hold less, and one workspace, shared by every block and slot, receives what
// the backward recomputes (docs/theory.md, section 12).
#include "model.h"

#include <cmath>

#include "ops.h"
#include "trace.h"

// The activations, per slot. Shapes in comments: R = B*T positions; r = R/t rows under sequence
// parallelism, else R; C' = C/t, NH' = NH/t, F' = 4C/t, V' = V/t on a tensor-parallel rank (t = 1:
// the whole model). A smaller batch uses a prefix of each. A slot holds one micro-batch's
// activations for the units the model runs (its ModelPart): the whole model in chapters 01-07, a
// pipeline stage's units in 08, one slot per micro-batch in flight. void*: the model's dtype (fp32,
// or bf16 in mixed precision); float*: fp32 always (statistics that feed a division, the losses).
struct GPT2::Layer {
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
  // split_backward only: the gradients of the four products' outputs, kept from backward() for
  // backward_weights(): qkv's and fc's (written there directly), the projections' (copied; all R
  // rows, as the row-parallel products read them).
  void *dqkv, *dattproj, *dfch, *dfcproj;  // (R,3C'), (R,C), (R,F'), (R,C)
};

struct GPT2::Slot {
  void* encoded;    // (r,C) the stream entering the part's first block: embeddings, or received
  std::vector<Layer> layers;                 // the part's blocks
  void* lnf; float *lnf_mean, *lnf_rstd;     // (r,C), (r), (r)       the head's part only
  void *logits, *probs;                      // (R,V')
  float* losses;                             // (R)
  float *row_max, *row_sum, *target_logit;   // (R); the vocabulary-parallel cross-entropy (t > 1)
  void* dlogits;                             // (R,V') split_backward only (else the scratch's)
  // The micro-batch in this slot (forward), and what its backward left for backward_weights().
  const int* inputs = nullptr;
  const int* targets = nullptr;
  int B = 0;
  struct WeightGradient {  // dweight (, dbias) of one product: from its output's gradient and input
    int weight, bias;      // parameter indices; bias -1: none
    Tensor dout, inp;
    Tensor inp_local;      // sequence parallelism: the rows kept of inp, gathered again when it is due
  };
  std::vector<WeightGradient> weight_gradients;
};

// Every activation the backward pass reads, in one arena: a slot per micro-batch in flight, plus
// the scratch gradients the backward writes.
struct GPT2::Activations {
  Buffer arena;
  std::vector<Slot> slots;
  // Backward scratch, reused by every layer and slot.
  void *dresidual, *dln;                     // (r,C)
  void* datty;                               // (R,C')
  void* dqkv;                                // (R,3C')  (split_backward: the layer's, kept)
  void *dpreatt, *datt;                      // (B,NH',T,T); not allocated with FlashAttention
  void *dfch, *dfch_gelu;                    // (R,F')   (split_backward: dfch is the layer's)
  void* dlogits;                             // (R,V')
  // Sequence parallelism only (else these are the local tensors themselves): a full-rows input of a
  // column-parallel layer (gathered, in forward and again in backward), a row-parallel layer's full
  // partial output, and a full-rows gradient (an f's input in backward, a g's output).
  void *gathered, *partial, *dfull;          // (R,C)
  // Recomputation's workspace (docs/theory.md, section 12). Selective: the recomputed softmax, the
  // scores before it written into dpreatt (the backward reads them never and overwrites dpreatt).
  // Full: a whole block replayed in its backward, up to GELU's output (recomputed_att its softmax,
  // dpreatt its scores; no fcproj, no residual3: the replay stops before them).
  void* recomputed_att;                      // (B,NH',T,T)
  Layer replay;
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

// The blocks [begin, end) a part runs: unit u > 0 is block u - 1.
struct BlockRange {
  int begin, end;
};
BlockRange blocks_of(const GPT2Config& cfg, const ModelPart& part) {
  return {std::max(part.first_unit, 1) - 1, std::min(part.last(cfg), cfg.L)};
}

// Called twice: once to count the arena's size, once to hand out its pieces. theory.cpp's
// activation_bytes() is this listing as a formula.
void carve(GPT2::Activations& a, Carver& c, const GPT2Config& cfg, int B, bool flash, const TensorParallelism& tp,
           const ModelPart& part) {
  const Dims d = dims_for(cfg, B, tp);
  const int64_t C = d.C, R = d.R, r = d.r;
  const int64_t att = flash ? 0 : d.B * d.NHl * d.T * d.T, lse = flash ? d.B * d.NHl * d.T : 0;
  const BlockRange blocks = blocks_of(cfg, part);
  const bool head = part.holds(cfg, cfg.L + 1), split = part.split_backward;
  const int64_t kept = split ? 1 : 0;  // the kept gradients exist under split_backward only
  const bool selective = cfg.recompute == Recompute::Selective, full = cfg.recompute == Recompute::Full;
  // The tensors of a block up to GELU's output: kept per slot, or (full) the replay's workspace.
  auto replayed = [&](GPT2::Layer& l) {
    l.ln1 = c.take(r * C); l.ln1_mean = c.take_f32(r); l.ln1_rstd = c.take_f32(r);
    l.qkv = c.take(R * 3 * d.Cl);
    l.atty = c.take(R * d.Cl);
    l.lse = c.take_f32(lse);
    l.attproj = c.take(r * C);
    l.residual2 = c.take(r * C);
    l.ln2 = c.take(r * C); l.ln2_mean = c.take_f32(r); l.ln2_rstd = c.take_f32(r);
    l.fch = c.take(R * d.Fl); l.fch_gelu = c.take(R * d.Fl);
  };
  a.slots.resize(part.slots);
  for (auto& s : a.slots) {
    s.encoded = c.take(r * C);
    s.layers.resize(blocks.end - blocks.begin);
    for (auto& l : s.layers) {
      l = GPT2::Layer{};  // (full: every tensor but the output lives in the workspace)
      if (!full) {
        replayed(l);
        if (!selective) { l.preatt = c.take(att); l.att = c.take(att); }
        l.fcproj = c.take(r * C);
      }
      l.residual3 = c.take(r * C);
      l.dqkv = c.take(kept * R * 3 * d.Cl); l.dattproj = c.take(kept * R * C);
      l.dfch = c.take(kept * R * d.Fl); l.dfcproj = c.take(kept * R * C);
      if (full) l.fcproj = l.residual3;  // written where the output goes; the residual is added in place
    }
    const int64_t h = head ? 1 : 0, vocab_parallel = head && tp.size > 1 ? 1 : 0;
    s.lnf = c.take(h * r * C); s.lnf_mean = c.take_f32(h * r); s.lnf_rstd = c.take_f32(h * r);
    s.logits = c.take(h * R * d.Vl); s.probs = c.take(h * R * d.Vl);
    s.losses = c.take_f32(h * R);
    s.row_max = c.take_f32(vocab_parallel * R);
    s.row_sum = c.take_f32(vocab_parallel * R);
    s.target_logit = c.take_f32(vocab_parallel * R);
    s.dlogits = c.take(kept * h * R * d.Vl);
  }
  a.dresidual = c.take(r * C); a.dln = c.take(r * C);
  a.datty = c.take(R * d.Cl);
  a.dqkv = c.take((1 - kept) * R * 3 * d.Cl);
  a.dpreatt = c.take(att); a.datt = c.take(att);
  a.dfch = c.take((1 - kept) * R * d.Fl); a.dfch_gelu = c.take(R * d.Fl);
  a.dlogits = c.take((head ? 1 - kept : 0) * R * d.Vl);
  a.gathered = c.take(d.sp ? R * C : 0);
  a.partial = c.take(d.sp ? R * C : 0);
  a.dfull = c.take(d.sp ? R * C : 0);
  a.recomputed_att = nullptr;
  a.replay = GPT2::Layer{};
  if (blocks.end > blocks.begin && (selective || full)) {
    a.recomputed_att = c.take(att);
    // The forward still computes the scores and their softmax: into the workspace, where nothing
    // keeps them beyond the block.
    for (auto& s : a.slots)
      for (auto& l : s.layers)
        if (selective) l.preatt = a.dpreatt, l.att = a.recomputed_att;
    if (full) {
      replayed(a.replay);
      a.replay.preatt = a.dpreatt;
      a.replay.att = a.recomputed_att;
    }
  }
}
}  // namespace

namespace {
// Under context parallelism the model holds T/cp positions: every activation is as long as that.
GPT2Config held_positions(GPT2Config cfg, const ContextParallelism& cp) {
  if (cp.on()) cfg.T = int(cp.positions.size());
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
  const bool lse_only = flash_ || cp.on();
  if (cfg.moe()) {
    ENSURE(device == Device::CPU && dtype == DType::F32, "GPT2: a MoE model runs on the CPU in fp32");
    // Each rank routes the rows it holds: under tensor parallelism only sequence parallelism gives the
    // ranks of a group rows of their own (without it they would route the same tokens t times).
    ENSURE(tp.size == 1 || tp.sequence_parallel, "GPT2: a tensor-parallel MoE model needs sequence parallelism");
    ENSURE(cfg.recompute != Recompute::Full, "GPT2: full recomputation would route a MoE block twice");
    // A router and its experts' activations per block and per micro-batch in flight (a pipeline's
    // schedule keeps several alive, each with its own routing until its backward).
    const BlockRange blocks = blocks_of(cfg, part_);
    const Dims d = dims_for(held_positions(cfg, cp), max_B, tp);
    for (int slot = 0; slot < part_.slots; slot++) {
      for (int l = blocks.begin; l < blocks.end; l++)
        moe_.push_back(std::make_unique<MoELayer>(cfg.C, cfg.experts, cfg.top_k, cfg.capacity_factor,
                                                  cfg.aux_loss_coef, d.r, slot));
      experts_.push_back(std::make_unique<ExpertMLPs>(cfg.L, cfg.C));
    }
    reset_routing_totals();
  }
  Carver counter(nullptr, dtype);
  carve(*acts_, counter, cfg_, max_B, lse_only, tp, part_);
  acts_->arena = Buffer(counter.used_bytes() / 4, MemCategory::Activations, DType::F32, device);  // raw bytes
  Carver carver(static_cast<char*>(acts_->arena.data()), dtype);
  carve(*acts_, carver, cfg_, max_B, lse_only, tp, part_);
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
// A MoE block (moe.h) lists the same first eight, then the router and each expert's four (fc w, b,
// proj w, b) where the dense block has its MLP's.
constexpr int kRouter = LN2_B + 1, kExpertParams = 4;
int params_per_block(const GPT2Config& cfg) { return cfg.moe() ? kRouter + 1 + kExpertParams * cfg.experts : kBlockParams; }
int block_param(const GPT2Config& cfg, int l, int which) { return 2 + l * params_per_block(cfg) + which; }
int expert_param(const GPT2Config& cfg, int l, int e, int which) {
  return block_param(cfg, l, kRouter + 1 + kExpertParams * e + which);
}
int lnf_param(const GPT2Config& cfg, int which) { return 2 + cfg.L * params_per_block(cfg) + which; }

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

float GPT2::forward(const int* inputs, const int* targets, int B) { return forward(0, inputs, targets, B); }

float GPT2::forward(int slot, const int* inputs, const int* targets, int B) {
  ENSURE(B >= 1 && B <= max_B_, "micro-batch larger than the activations were sized for");
  ENSURE(slot >= 0 && slot < part_.slots, "GPT2::forward: no such activation slot");
  ENSURE(tp_.size == 1 || (tp_hooks.f_forward && tp_hooks.f_backward && tp_hooks.g_forward && tp_hooks.g_backward &&
                           tp_hooks.vocab_all_reduce),
         "a tensor-parallel model needs all of its TensorParallelHooks");
  ENSURE(!cp_.on() || (cp_hooks.attention_forward && cp_hooks.attention_backward),
         "a context-parallel model needs its ContextParallelHooks");
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
    if (cfg_.recompute == Recompute::Full) {  // the workspace, but the output the slot keeps
      Layer x = acts_->replay;
      x.fcproj = x.residual3 = layer(s, l).residual3;
      block_forward(s, l, x, false);
    } else {
      block_forward(s, l, layer(s, l), false);
    }
    call(hooks.after_forward, l + 1);
  }
  if (!has_head()) return float(aux_loss_);  // a MoE stage's blocks' share of the balance loss
  const int head = cfg_.L + 1;
  call(hooks.before_forward, head);
  const float loss = head_forward(s);
  call(hooks.after_forward, head);
  return loss + float(aux_loss_);
}

Tensor GPT2::input(int slot, int B) {
  ENSURE(!has_embedding(), "GPT2::input: the embedding's part makes its own input");
  ENSURE(B >= 1 && B <= max_B_, "GPT2::input: micro-batch larger than the activations were sized for");
  const Views v{dims_for(cfg_, B, tp_), dtype_, device_};
  return v.local(acts_->slots[slot].encoded);
}

Tensor GPT2::output(int slot) {
  ENSURE(!has_head(), "GPT2::output: the head's part ends in the loss");
  const Slot& s = acts_->slots[slot];
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  return v.local(s.layers.back().residual3);
}

Tensor GPT2::input_grad() {
  ENSURE(!has_embedding(), "GPT2::input_grad: the embedding's part has no input to send a gradient to");
  const Views v{dims_for(cfg_, last_backward_B_, tp_), dtype_, device_};
  return v.local(acts_->dresidual);
}

namespace {
// Calls f(rows, position) for each run of `local`'s rows that holds consecutive positions of one
// sequence. The rank's stream is B sequences x `held` positions each (`positions`: their absolute
// positions under context parallelism, else none: 0..held-1), of which it keeps the rows from
// `first_row` on (under sequence parallelism its slice of them, else all). Under CP x SP a rank's
// rows can begin or end inside a run: only the position of each row decides.
template <typename F>
void for_position_runs_of(Tensor local, int64_t first_row, int64_t held, const std::vector<int>& positions, F f) {
  const int64_t n = local.shape[0], C = local.shape[1];
  const size_t row_bytes = size_t(C) * dtype_size(local.dtype);
  auto position_of = [&](int64_t row) {
    const int64_t j = (first_row + row) % held;
    return positions.empty() ? int(j) : positions[size_t(j)];
  };
  for (int64_t begin = 0; begin < n;) {
    int64_t end = begin + 1;
    while (end < n && (first_row + end) % held != 0 && position_of(end) == position_of(end - 1) + 1) end++;
    char* first = static_cast<char*>(local.data) + size_t(begin) * row_bytes;
    f(make_view(first, {end - begin, C}, local.dtype, local.device), position_of(begin));
    begin = end;
  }
}
}  // namespace

void GPT2::embed_forward(Slot& s) {
  TraceScope span("forward embed");
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  if (tp_.size == 1 && !cp_.on()) {
    encoder_forward(v.btc(s.encoded, v.d.C), s.inputs, param(kWte), param(kWpe), s.B, cfg_.T);
    return;
  }
  const Tensor encoded = v.local(s.encoded);
  if (tp_.size == 1) {
    embedding_forward(encoded, s.inputs, param(kWte), 0, cfg_.V);
  } else {
    // Vocabulary-parallel: each rank looks up the tokens its slice of wte holds (zeros for the
    // others); "g" sums the partial lookups over the group.
    const Tensor partial = v.full_of(s.encoded, acts_->partial);
    embedding_forward(partial, s.inputs, param(kWte), tp_.rank * int(v.d.Vl), cfg_.V);
    CommHandle summed = tp_hooks.g_forward(partial, encoded);
    wait(summed);
  }
  // The position embeddings, added to the rows this rank keeps, at their absolute positions (whole
  // on every rank, wpe is not split).
  for_position_runs_of(encoded, tp_.rank * v.d.r * int64_t(v.d.sp), cfg_.T, cp_.positions, [&](Tensor rows, int position) {
    position_forward(rows, param(kWpe), position, int(layout_.params[kWpe].shape[0]));
  });
}

void* GPT2::stream_into(Slot& s, int l) {
  return l == blocks_of(cfg_, part_).begin ? s.encoded : layer(s, l - 1).residual3;
}

GPT2::Layer& GPT2::layer(Slot& s, int l) {
  return s.layers[size_t(l - blocks_of(cfg_, part_).begin)];
}

int GPT2::slot_of(const Slot& s) const { return int(&s - acts_->slots.data()); }

MoELayer& GPT2::moe_layer(const Slot& s, int l) {
  const BlockRange blocks = blocks_of(cfg_, part_);
  return *moe_[size_t(slot_of(s) * (blocks.end - blocks.begin) + l - blocks.begin)];
}

void GPT2::block_forward(Slot& s, int l, const Layer& x, bool replay) {
  TraceScope span((replay ? "recompute L" : "forward L") + std::to_string(l));
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  const bool tensor_parallel = tp_.size > 1;
  void* residual = stream_into(s, l);
  auto P = [&](BlockParam w) { return param(block_param(cfg_, l, w)); };
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
  if (cp_.on()) {  // the ring: this rank's queries meet every rank's keys and values
    cp_hooks.attention_forward(v.btc(x.atty, v.d.Cl), v.lse(x.lse), v.btc(x.qkv, 3 * v.d.Cl), int(v.d.NHl));
  } else if (flash_) {
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
  if (cfg_.moe()) {  // the experts instead of the MLP (moe.h); full recomputation is refused
    auto run_here = [&](Tensor rows, const std::vector<int64_t>& counts, Tensor out) {
      experts_[size_t(slot_of(s))]->forward(l, held_experts(l), rows, counts, out);
    };
    MoELayer& router = moe_layer(s, l);
    aux_loss_ += router.forward(l, v.local(x.ln2), param(block_param(cfg_, l, kRouter)), v.local(x.fcproj),
                                expert_hooks, run_here);
    for (int e = 0; e < cfg_.experts; e++) {
      routed_total_[size_t(l)][size_t(e)] += router.stats().routed[size_t(e)];
      dropped_total_[size_t(l)][size_t(e)] += router.stats().dropped[size_t(e)];
    }
    residual_forward(v.local(x.residual3), v.local(x.residual2), v.local(x.fcproj));
    return;
  }
  matmul_forward(v.full(x.fch, v.d.Fl), f(x.ln2, a.gathered), P(FC_W), P(FC_B));  // column-parallel
  gelu_forward(v.full(x.fch_gelu, v.d.Fl), v.full(x.fch, v.d.Fl));
  // A replay stops here: the MLP's projection and the residual add make only the block's output,
  // which the backward does not read, and which full recomputation keeps.
  if (replay) return;
  const Tensor fcproj_partial = v.full_of(x.fcproj, a.partial);
  matmul_forward(fcproj_partial, v.full(x.fch_gelu, v.d.Fl), P(FCPROJ_W), row_bias(FCPROJ_B));  // row-parallel
  g(fcproj_partial, x.fcproj);
  if (tensor_parallel) add_bias(v.local(x.fcproj), P(FCPROJ_B));
  residual_forward(v.local(x.residual3), v.local(x.residual2), v.local(x.fcproj));
}

float GPT2::head_forward(Slot& s) {
  TraceScope span("forward head");
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  void* residual = s.layers.empty() ? s.encoded : s.layers.back().residual3;
  layernorm_forward(v.local(s.lnf), v.stat(s.lnf_mean, v.d.r), v.stat(s.lnf_rstd, v.d.r), v.local(residual),
                    param(lnf_param(cfg_, 0)), param(lnf_param(cfg_, 1)));
  const Tensor logits = v.btc(s.logits, v.d.Vl), probs = v.btc(s.probs, v.d.Vl);
  const Tensor losses = make_view(s.losses, {v.d.B, v.d.T}, DType::F32, device_);
  if (tp_.size == 1) {
    matmul_forward(logits, v.btc(s.lnf, v.d.C), param(kWte), Tensor());  // tied LM head
    softmax_crossentropy_forward(losses, probs, logits, s.targets);
    return float(mean_of(losses));
  }
  // The head is column-parallel over the vocabulary: V/t logits a rank. Its cross-entropy combines
  // the rows' maxima, sums of exponentials and target logits over the group, never the logits.
  const Tensor lnf_full = v.full_of(s.lnf, acts_->gathered);
  CommHandle gathered = tp_hooks.f_forward(v.local(s.lnf), lnf_full);
  wait(gathered);
  matmul_forward(logits, lnf_full, param(kWte), Tensor());
  const Tensor row_max = v.stat(s.row_max, v.d.R), row_sum = v.stat(s.row_sum, v.d.R);
  const Tensor target_logit = v.stat(s.target_logit, v.d.R);
  crossentropy_shard_max(row_max, target_logit, logits, s.targets, tp_.rank * int(v.d.Vl));
  tp_hooks.vocab_all_reduce(row_max, ReduceOp::Max);
  tp_hooks.vocab_all_reduce(target_logit, ReduceOp::Sum);
  crossentropy_shard_exp(probs, row_sum, logits, row_max);
  tp_hooks.vocab_all_reduce(row_sum, ReduceOp::Sum);
  crossentropy_shard_finish(losses, probs, row_max, row_sum, target_logit);
  return float(mean_of(losses));
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

void GPT2::weight_gradient(Slot& s, int weight, int bias, Tensor dout, Tensor inp, void* kept, Tensor inp_local) {
  if (!part_.split_backward) {
    matmul_backward_weight(grad(weight), bias >= 0 ? grad(bias) : Tensor(), dout, inp);
    if (bias >= 0) call(hooks.grad_ready, bias);
    if (weight != kWte) call(hooks.grad_ready, weight);  // (wte: see wte_ready)
    return;
  }
  // Zero-bubble: keep the output's gradient (unless backward wrote it where it is kept already);
  // backward_weights() computes the product's gradients later, where the schedule has room.
  Tensor stored = dout;
  if (kept != dout.data) {
    stored.data = kept;
    copy_tensor(stored, dout);
  }
  s.weight_gradients.push_back({weight, bias, stored, inp, inp_local});
}

void GPT2::backward_weights(int slot) {
  ENSURE(part_.split_backward, "GPT2::backward_weights: the model was built without split_backward");
  Slot& s = acts_->slots[slot];
  TraceScope span("weights");
  for (const Slot::WeightGradient& w : s.weight_gradients) {
    if (w.inp_local.data) {  // sequence parallelism: this rank's rows of the input, gathered again now
      CommHandle gathered = tp_hooks.f_forward(w.inp_local, w.inp);
      wait(gathered);
    }
    matmul_backward_weight(grad(w.weight), w.bias >= 0 ? grad(w.bias) : Tensor(), w.dout, w.inp);
    if (w.bias >= 0) call(hooks.grad_ready, w.bias);
    if (w.weight != kWte) call(hooks.grad_ready, w.weight);
  }
  s.weight_gradients.clear();
  if (has_head()) call(hooks.grad_ready, kWte);  // the head's product was wte's last use
}

void GPT2::column_parallel_backward(Slot& s, Tensor dinp_local, int weight, int bias, Tensor dout,
                                    Tensor inp_local, void* kept) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  Activations& a = *acts_;
  if (tp_.size == 1) {
    matmul_backward_input(dinp_local, dout, param(weight));
    return weight_gradient(s, weight, bias, dout, inp_local, kept);
  }
  // The input's gradient first: each rank's part comes from its own slice of the weight, so "f"
  // sums them over the group. Its collective is started here, and the weight's gradient computed
  // while it travels (the chapter decides whether it really runs in the background: --tp-overlap).
  // Under sequence parallelism the layer's input is re-gathered for the weight's gradient (it was
  // kept as this rank's rows only, the point of sequence parallelism), also in the background.
  const Tensor dinp_full = v.full_of(dinp_local.data, a.dfull);
  const Tensor inp_full = v.full_of(inp_local.data, a.gathered);
  // Under split_backward the weight's gradient waits for backward_weights(), and so does the
  // re-gathering of its input (the gathered buffer is scratch, reused before then).
  const bool later = part_.split_backward && v.d.sp;
  CommHandle regathered = later ? CommHandle() : tp_hooks.f_forward(inp_local, inp_full);
  if (v.d.sp) fill_zero(dinp_full);  // (dinp_local itself is zero on entry: f overwrites it)
  const Tensor dinp_partial = v.d.sp ? dinp_full : dinp_local;
  matmul_backward_input(dinp_partial, dout, param(weight));
  CommHandle summed = tp_hooks.f_backward(dinp_partial, dinp_local);
  wait(regathered);
  weight_gradient(s, weight, bias, dout, inp_full, kept, later ? inp_local : Tensor());
  wait(summed);
}

void GPT2::head_backward(Slot& s, float loss_weight) {
  TraceScope span("backward head");
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  // Cross-entropy, the tied LM head (wte's gradient is not final until the embedding's backward),
  // the final layernorm. dresidual then carries the gradient of the residual stream down the blocks.
  void* dlogits = part_.split_backward ? s.dlogits : a.dlogits;
  softmax_crossentropy_backward(v.btc(dlogits, v.d.Vl), v.btc(s.probs, v.d.Vl), s.targets,
                                loss_weight / float(s.B * cfg_.T), tp_.rank * int(v.d.Vl));
  fill_zero(v.local(a.dln));
  column_parallel_backward(s, v.local(a.dln), kWte, -1, v.full(dlogits, v.d.Vl), v.local(s.lnf), dlogits);
  // wte (tied) is used twice, by the lookup and by this product: its gradient is final after the
  // later of the two in backward, the lookup, unless this part has none or the product waits for
  // backward_weights().
  if (!has_embedding() && !part_.split_backward) call(hooks.grad_ready, kWte);
  fill_zero(v.local(a.dresidual));
  void* residual = s.layers.empty() ? s.encoded : s.layers.back().residual3;
  const int lnf_w = lnf_param(cfg_, 0), lnf_b = lnf_param(cfg_, 1);
  layernorm_backward(v.local(a.dresidual), grad(lnf_w), grad(lnf_b), v.local(a.dln), v.local(residual), param(lnf_w),
                     v.stat(s.lnf_mean, v.d.r), v.stat(s.lnf_rstd, v.d.r));
  call(hooks.grad_ready, lnf_b);
  call(hooks.grad_ready, lnf_w);
}

void GPT2::block_backward(Slot& s, int l) {
  TraceScope span("backward L" + std::to_string(l));
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  const bool tensor_parallel = tp_.size > 1, split = part_.split_backward;
  // Full recomputation: the block's forward again, from its kept input, into the workspace, which
  // the backward below then reads as it reads a kept block.
  const bool full = cfg_.recompute == Recompute::Full;
  if (full) block_forward(s, l, a.replay, true);
  const Layer& x = full ? a.replay : layer(s, l);
  void* residual = stream_into(s, l);
  auto P = [&](BlockParam w) { return param(block_param(cfg_, l, w)); };
  auto G = [&](BlockParam w) { return grad(block_param(cfg_, l, w)); };
  auto both_ready = [&](BlockParam weight, BlockParam bias) {
    call(hooks.grad_ready, block_param(cfg_, l, bias));
    call(hooks.grad_ready, block_param(cfg_, l, weight));
  };
  // A row-parallel layer: its bias's gradient from this rank's rows (added after the reduction in
  // forward), then "g"'s backward brings the output's gradient to all rows, then the product's.
  auto row_parallel_backward = [&](Tensor dinp_full, BlockParam w, BlockParam b, Tensor inp_full, void* kept) {
    const Tensor dout_local = v.local(a.dresidual);
    Tensor dout_full = dout_local;
    if (tensor_parallel) {
      bias_backward(G(b), dout_local);
      call(hooks.grad_ready, block_param(cfg_, l, b));
      dout_full = v.full_of(a.dresidual, a.dfull);
      CommHandle gathered = tp_hooks.g_backward(dout_local, dout_full);
      wait(gathered);
    }
    matmul_backward_input(dinp_full, dout_full, P(w));
    weight_gradient(s, block_param(cfg_, l, w), tensor_parallel ? -1 : block_param(cfg_, l, b), dout_full, inp_full, kept);
  };
  // Under split_backward the products' output gradients are written where they are kept.
  void* dfch = split ? x.dfch : a.dfch;
  void* dqkv = split ? x.dqkv : a.dqkv;

  // residual3 = residual2 + fcproj: dresidual is the gradient of both terms.
  if (cfg_.moe()) {
    const ExpertHooks& eh = expert_hooks;
    auto run_here = [&](Tensor dout, Tensor drows) {
      experts_[size_t(slot_of(s))]->backward(l, held_experts(l), dout, drows);
    };
    fill_zero(v.local(a.dln));
    const int router = block_param(cfg_, l, kRouter);
    // The balance loss's gradient is each rank's share (moe.h); under tensor parallelism the router's
    // gradient is then summed over the group like every tensor held whole, so each share counts 1/t.
    moe_layer(s, l).backward(v.local(a.dresidual), v.local(x.ln2), param(router), v.local(a.dln), grad(router),
                             loss_weight_ / float(tp_.size), eh, l, run_here);
    for (int e = cfg_.experts - 1; e >= 0; e--)
      for (int w = kExpertParams - 1; w >= 0; w--)
        if (layout_.params[size_t(expert_param(cfg_, l, e, w))].held()) call(hooks.grad_ready, expert_param(cfg_, l, e, w));
    call(hooks.grad_ready, router);
  } else {
    fill_zero(v.full(a.dfch_gelu, v.d.Fl));
    row_parallel_backward(v.full(a.dfch_gelu, v.d.Fl), FCPROJ_W, FCPROJ_B, v.full(x.fch_gelu, v.d.Fl), x.dfcproj);
    fill_zero(v.full(dfch, v.d.Fl));
    gelu_backward(v.full(dfch, v.d.Fl), v.full(x.fch, v.d.Fl), v.full(a.dfch_gelu, v.d.Fl));
    fill_zero(v.local(a.dln));
    column_parallel_backward(s, v.local(a.dln), block_param(cfg_, l, FC_W), block_param(cfg_, l, FC_B),
                             v.full(dfch, v.d.Fl), v.local(x.ln2), dfch);
  }
  // Adds the MLP branch's gradient: dresidual becomes the gradient of residual2.
  layernorm_backward(v.local(a.dresidual), G(LN2_W), G(LN2_B), v.local(a.dln), v.local(x.residual2), P(LN2_W),
                     v.stat(x.ln2_mean, v.d.r), v.stat(x.ln2_rstd, v.d.r));
  both_ready(LN2_W, LN2_B);
  // Selective recomputation: the softmax of the scores again, from the kept q, k and v. Its other
  // outputs land in scratch the backward overwrites: the attention output (already kept) in datty,
  // the scores before the softmax in dpreatt.
  void* att = x.att;
  if (cfg_.recompute == Recompute::Selective && !flash_ && !cp_.on()) {
    TraceScope recompute("recompute attention L" + std::to_string(l));
    att = a.recomputed_att;
    attention_forward(v.btc(a.datty, v.d.Cl), v.bhtt(a.dpreatt), v.bhtt(att), v.btc(x.qkv, 3 * v.d.Cl), int(v.d.NHl));
  }
  // residual2 = residual + attproj.
  fill_zero(v.full(a.datty, v.d.Cl));
  row_parallel_backward(v.full(a.datty, v.d.Cl), PROJ_W, PROJ_B, v.full(x.atty, v.d.Cl), x.dattproj);
  fill_zero(v.full(dqkv, 3 * v.d.Cl));
  if (cp_.on()) {
    cp_hooks.attention_backward(v.btc(dqkv, 3 * v.d.Cl), v.btc(a.datty, v.d.Cl), v.btc(x.qkv, 3 * v.d.Cl),
                                v.btc(x.atty, v.d.Cl), v.lse(x.lse), int(v.d.NHl));
  } else if (flash_) {
    attention_backward_flash(v.btc(dqkv, 3 * v.d.Cl), v.btc(a.datty, v.d.Cl), v.btc(x.qkv, 3 * v.d.Cl),
                             v.btc(x.atty, v.d.Cl), v.lse(x.lse), int(v.d.NHl));
  } else {  // (dpreatt and datt are scratch the op overwrites)
    attention_backward(v.btc(dqkv, 3 * v.d.Cl), v.bhtt(a.dpreatt), v.bhtt(a.datt), v.btc(a.datty, v.d.Cl),
                       v.btc(x.qkv, 3 * v.d.Cl), v.bhtt(att), int(v.d.NHl));
  }
  fill_zero(v.local(a.dln));
  column_parallel_backward(s, v.local(a.dln), block_param(cfg_, l, QKV_W), block_param(cfg_, l, QKV_B), v.full(dqkv, 3 * v.d.Cl),
                           v.local(x.ln1), dqkv);
  // Adds the attention branch's gradient: dresidual becomes the gradient of the block's input.
  layernorm_backward(v.local(a.dresidual), G(LN1_W), G(LN1_B), v.local(a.dln), v.local(residual), P(LN1_W),
                     v.stat(x.ln1_mean, v.d.r), v.stat(x.ln1_rstd, v.d.r));
  both_ready(LN1_W, LN1_B);
}

void GPT2::reset_routing_totals() {
  routed_total_.assign(size_t(cfg_.L), std::vector<int64_t>(size_t(cfg_.experts), 0));
  dropped_total_ = routed_total_;
}

const RoutingStats& GPT2::routing(int l, int slot) const {
  const BlockRange blocks = blocks_of(cfg_, part_);
  ENSURE(cfg_.moe() && l >= blocks.begin && l < blocks.end && slot >= 0 && slot < part_.slots,
         "GPT2::routing: no such MoE block or slot here");
  return moe_[size_t(slot * (blocks.end - blocks.begin) + l - blocks.begin)]->stats();
}

std::vector<ExpertWeights> GPT2::held_experts(int l) const {
  std::vector<ExpertWeights> held;
  for (int e = 0; e < cfg_.experts; e++) {
    auto at = [&](int w) { return expert_param(cfg_, l, e, w); };
    if (!layout_.params[size_t(at(0))].held()) continue;
    held.push_back({param(at(0)), param(at(1)), param(at(2)), param(at(3)), grad(at(0)), grad(at(1)), grad(at(2)),
                    grad(at(3))});
  }
  return held;
}

void GPT2::embed_backward(Slot& s) {
  TraceScope span("backward embed");
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  if (tp_.size == 1 && !cp_.on()) {
    encoder_backward(grad(kWte), grad(kWpe), v.btc(a.dresidual, v.d.C), s.inputs, s.B, cfg_.T);
  } else {
    const Tensor dencoded = v.local(a.dresidual);
    for_position_runs_of(dencoded, tp_.rank * v.d.r * int64_t(v.d.sp), cfg_.T, cp_.positions,
                         [&](Tensor rows, int position) {
                           position_backward(grad(kWpe), rows, position, int(layout_.params[kWpe].shape[0]));
                         });
    if (tp_.size == 1) {
      embedding_backward(grad(kWte), dencoded, s.inputs, 0, cfg_.V);
    } else {
      const Tensor dfull = v.full_of(a.dresidual, a.dfull);
      CommHandle gathered = tp_hooks.g_backward(dencoded, dfull);
      wait(gathered);
      embedding_backward(grad(kWte), dfull, s.inputs, tp_.rank * int(v.d.Vl), cfg_.V);
    }
  }
  call(hooks.grad_ready, kWpe);
  if (!(part_.split_backward && has_head())) call(hooks.grad_ready, kWte);  // (see head_backward)
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
