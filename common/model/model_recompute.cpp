// model_recompute.cpp: recomputation (GPT2Config::recompute; docs/theory.md, section 12), which
// trades the backward's extra work for activations the slots no longer keep. Selective: attention's
// (B,NH,T,T) softmax is made again in backward from the kept q, k and v. Full: a block keeps only its
// output, and its backward first replays its forward, up to GELU's output, into one workspace that
// every block and slot shares (model_activations.cpp carves it).
#include <string>

#include "model/model_internal.h"
#include "ops/ops.h"
#include "comm/trace.h"

using namespace model_internal;

GPT2::Layer GPT2::forward_layer(Slot& s, int l) {
  if (cfg_.recompute != Recompute::Full) return layer(s, l);
  Layer x = acts_->replay;  // the workspace, but the output the slot keeps
  x.fcproj = x.residual3 = layer(s, l).residual3;
  return x;
}

const GPT2::Layer& GPT2::backward_layer(Slot& s, int l) {
  if (cfg_.recompute != Recompute::Full) return layer(s, l);
  // The block's forward again, from its kept input, into the workspace, which the backward then
  // reads as it reads a kept block.
  block_forward(s, l, acts_->replay, true);
  return acts_->replay;
}

void* GPT2::recompute_attention(Slot& s, int l, const Layer& x) {
  // (FlashAttention and the ring keep no softmax: their backward recomputes it as it goes.)
  if (cfg_.recompute != Recompute::Selective || cp_.lse_attention(flash_)) return x.att;
  // The softmax of the scores again, from the kept q, k and v. Its other outputs land in scratch the
  // backward overwrites: the attention output (already kept) in datty, the scores before the softmax
  // (on the GPU; the CPU does not store them) in dpreatt.
  TraceScope recompute("recompute attention L" + std::to_string(l));
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  attention_forward(v.btc(a.datty, v.d.Cl), v.scores(a.dpreatt), v.bhtt(a.recomputed_att), v.btc(x.qkv, 3 * v.d.Cl),
                    int(v.d.NHl));
  return a.recomputed_att;
}
