// model_ends.cpp: the two ends of GPT2. The embedding: token plus position embeddings into the
// residual stream. The head: the final layernorm, the LM head tied to the token embedding, and the
// cross-entropy. Under tensor parallelism both are split over the vocabulary
// (model_tensor_parallel.cpp); under context parallelism the positions are the rank's own
// (model_context_parallel.cpp).
#include "model/model_internal.h"
#include "ops/ops.h"
#include "comm/trace.h"

using namespace model_internal;

void GPT2::embed_forward(Slot& s) {
  TraceScope span("forward embed");
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  if (tp_.size == 1 && !cp_.on()) {  // one op: every token at positions 0..T-1
    encoder_forward(v.btc(s.encoded, v.d.C), s.inputs, param(kWte), param(kWpe), s.B, cfg_.T);
    return;
  }
  if (tp_.size == 1) {
    embedding_forward(v.local(s.encoded), s.inputs, param(kWte), 0, cfg_.V);
  } else {
    vocab_parallel_embedding_forward(s);
  }
  position_embedding_forward(s);
}

float GPT2::head_forward(Slot& s) {
  TraceScope span("forward head");
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  void* residual = s.layers.empty() ? s.encoded : s.layers.back().residual3;
  layernorm_forward(v.local(s.lnf), v.stat(s.lnf_mean, v.d.r), v.stat(s.lnf_rstd, v.d.r), v.local(residual),
                    param(lnf_param(cfg_, 0)), param(lnf_param(cfg_, 1)));
  if (tp_.size > 1) return vocab_parallel_head(s);
  const Tensor logits = v.btc(s.logits, v.d.Vl), probs = v.btc(s.probs, v.d.Vl);
  const Tensor losses = make_view(s.losses, {v.d.B, v.d.T}, DType::F32, device_);
  matmul_forward(logits, v.btc(s.lnf, v.d.C), param(kWte), Tensor());  // tied LM head
  softmax_crossentropy_forward(losses, probs, logits, s.targets);
  return float(mean_of(losses));
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

void GPT2::embed_backward(Slot& s) {
  TraceScope span("backward embed");
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  if (tp_.size == 1 && !cp_.on()) {
    encoder_backward(grad(kWte), grad(kWpe), v.btc(a.dresidual, v.d.C), s.inputs, s.B, cfg_.T);
  } else {
    position_embedding_backward(s);
    if (tp_.size == 1) {
      embedding_backward(grad(kWte), v.local(a.dresidual), s.inputs, 0, cfg_.V);
    } else {
      vocab_parallel_embedding_backward(s);
    }
  }
  call(hooks.grad_ready, kWpe);
  if (!(part_.split_backward && has_head())) call(hooks.grad_ready, kWte);  // (see head_backward)
}
