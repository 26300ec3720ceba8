// model_block.cpp: one GPT-2 block, forward and backward, as the sequence of its steps: layernorm 1,
// the attention's input product (qkv), attention, its output product and the residual add, layernorm
// 2, the MLP (or a MoE model's experts) and the second residual add. Each dimension's part of a step
// lives in that dimension's file: the collectives of tensor parallelism around the products
// (model_tensor_parallel.cpp), the ring of context parallelism inside attention
// (model_context_parallel.cpp), the experts (model_experts.cpp), recomputation (model_recompute.cpp)
// and the weight gradients a split backward defers (model_split_backward.cpp).
#include <string>

#include "model/model_internal.h"
#include "ops/ops.h"
#include "comm/trace.h"

using namespace model_internal;

void GPT2::block_forward(Slot& s, int l, const Layer& x, bool replay) {
  TraceScope span((replay ? "recompute L" : "forward L") + std::to_string(l));
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  auto P = [&](BlockParam w) { return block_param(cfg_, l, w); };
  void* residual = stream_into(s, l);

  // Attention: residual2 = residual + proj(attention(qkv(ln1(residual)))).
  layernorm_forward(v.local(x.ln1), v.stat(x.ln1_mean, v.d.r), v.stat(x.ln1_rstd, v.d.r), v.local(residual),
                    param(P(LN1_W)), param(P(LN1_B)));
  column_parallel_forward(s, v.btc(x.qkv, 3 * v.d.Cl), x.ln1, P(QKV_W), P(QKV_B));
  self_attention_forward(s, x);
  row_parallel_forward(s, x.attproj, v.full(x.atty, v.d.Cl), P(PROJ_W), P(PROJ_B));

  // MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))), or the experts instead. The
  // residual add and layernorm 2 are one call: each row is normalised as soon as it is summed.
  residual_layernorm_forward(v.local(x.residual2), v.local(x.ln2), v.stat(x.ln2_mean, v.d.r),
                             v.stat(x.ln2_rstd, v.d.r), v.local(residual), v.local(x.attproj), param(P(LN2_W)),
                             param(P(LN2_B)));
  if (cfg_.moe()) {
    moe_mlp_forward(s, l, x);
  } else {
    column_parallel_forward(s, v.full(x.fch, v.d.Fl), x.ln2, P(FC_W), P(FC_B), v.full(x.fch_gelu, v.d.Fl));
    // A replay stops here: the MLP's projection and the residual add make only the block's output,
    // which the backward does not read, and which full recomputation keeps.
    if (replay) return;
    row_parallel_forward(s, x.fcproj, v.full(x.fch_gelu, v.d.Fl), P(FCPROJ_W), P(FCPROJ_B));
  }
  residual_forward(v.local(x.residual3), v.local(x.residual2), v.local(x.fcproj));
}

// The same steps in reverse. dresidual carries the stream's gradient: on entry residual3's, which is
// also fcproj's; after the MLP residual2's, also attproj's; on exit the block input's.
void GPT2::block_backward(Slot& s, int l) {
  TraceScope span("backward L" + std::to_string(l));
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  auto P = [&](BlockParam w) { return block_param(cfg_, l, w); };
  // A layernorm's backward adds its branch's gradient (in dln) to dresidual.
  auto layernorm_back = [&](void* inp, float* mean, float* rstd, BlockParam w, BlockParam b) {
    layernorm_backward(v.local(a.dresidual), grad(P(w)), grad(P(b)), v.local(a.dln), v.local(inp), param(P(w)),
                       v.stat(mean, v.d.r), v.stat(rstd, v.d.r));
    call(hooks.grad_ready, P(b));
    call(hooks.grad_ready, P(w));
  };
  const Layer& x = backward_layer(s, l);
  void* residual = stream_into(s, l);
  // Under split_backward the products' output gradients are written where they are kept.
  void* dfch = part_.split_backward ? x.dfch : a.dfch;
  void* dqkv = part_.split_backward ? x.dqkv : a.dqkv;

  // MLP, into dln, then layernorm 2.
  if (cfg_.moe()) {
    moe_mlp_backward(s, l, x);
  } else {
    // GELU's backward inside the projection's: dfch directly, from fch.
    row_parallel_backward(s, v.full(dfch, v.d.Fl), P(FCPROJ_W), P(FCPROJ_B), v.full(x.fch_gelu, v.d.Fl), x.dfcproj,
                          v.full(x.fch, v.d.Fl));
    column_parallel_backward(s, v.local(a.dln), P(FC_W), P(FC_B), v.full(dfch, v.d.Fl), v.local(x.ln2), dfch);
  }
  layernorm_back(x.residual2, x.ln2_mean, x.ln2_rstd, LN2_W, LN2_B);

  // Attention, into dln, then layernorm 1.
  void* att = recompute_attention(s, l, x);
  row_parallel_backward(s, v.full(a.datty, v.d.Cl), P(PROJ_W), P(PROJ_B), v.full(x.atty, v.d.Cl), x.dattproj);
  self_attention_backward(s, x, dqkv, att);
  column_parallel_backward(s, v.local(a.dln), P(QKV_W), P(QKV_B), v.full(dqkv, 3 * v.d.Cl), v.local(x.ln1), dqkv);
  layernorm_back(residual, x.ln1_mean, x.ln1_rstd, LN1_W, LN1_B);
}
