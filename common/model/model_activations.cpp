// model_activations.cpp: GPT2's activation arena. carve() lists every tensor a slot keeps and the
// backward's scratch, once to count the arena's bytes and once to point into it; the layout follows
// llm.c (every intermediate a backward reads is kept, per layer, for micro-batches of up to max_B
// sequences) and docs/theory.md, "Activation memory", gives every term. Under tensor parallelism the
// arena holds this rank's part: its heads' qkv and attention, its MLP channels, its vocabulary's
// logits, and, under sequence parallelism, its slice of the rows between the parallel layers. Under
// recomputation (GPT2Config::recompute) the slots hold less, and one workspace, shared by every block
// and slot, receives what the backward recomputes (docs/theory.md, section 12). Also defines where a
// block's activations and its input stream are, and a pipeline stage's input and output.
#include <algorithm>

#include "model/model_internal.h"

using namespace model_internal;

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
  a.dfch = c.take((1 - kept) * R * d.Fl);
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

namespace model_internal {

Dims dims_for(const GPT2Config& cfg, int B, const TensorParallelism& tp) {
  Dims d;
  d.B = B, d.T = cfg.T, d.C = cfg.C, d.R = int64_t(B) * cfg.T;
  d.sp = tp.size > 1 && tp.sequence_parallel;
  d.r = d.sp ? d.R / tp.size : d.R;
  d.Cl = cfg.C / tp.size, d.NHl = cfg.NH / tp.size, d.Fl = 4 * int64_t(cfg.C) / tp.size, d.Vl = cfg.V / tp.size;
  return d;
}

BlockRange blocks_of(const GPT2Config& cfg, const ModelPart& part) {
  return {std::max(part.first_unit, 1) - 1, std::min(part.last(cfg), cfg.L)};
}

void allocate_activations(GPT2::Activations& a, const GPT2Config& cfg, int max_B, bool lse_only,
                          const TensorParallelism& tp, const ModelPart& part, DType dtype, Device device) {
  Carver counter(nullptr, dtype);
  carve(a, counter, cfg, max_B, lse_only, tp, part);
  a.arena = Buffer(counter.used_bytes() / 4, MemCategory::Activations, DType::F32, device);  // raw bytes
  Carver carver(static_cast<char*>(a.arena.data()), dtype);
  carve(a, carver, cfg, max_B, lse_only, tp, part);
}

}  // namespace model_internal

GPT2::Layer& GPT2::layer(Slot& s, int l) { return s.layers[size_t(l - blocks_of(cfg_, part_).begin)]; }

void* GPT2::stream_into(Slot& s, int l) {
  return l == blocks_of(cfg_, part_).begin ? s.encoded : layer(s, l - 1).residual3;
}

int GPT2::slot_of(const Slot& s) const { return int(&s - acts_->slots.data()); }

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
