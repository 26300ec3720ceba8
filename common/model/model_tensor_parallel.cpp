// model_tensor_parallel.cpp: GPT2's products and what tensor parallelism (chapter 07) puts around
// them. A column-parallel product (qkv, mlp.fc, the LM head) holds a slice of its output columns and
// reads all rows of its input: "f" gathers them under sequence parallelism, and in backward sums the
// input's gradient over the group. A row-parallel product (attn.proj, mlp.proj) makes a partial sum
// of its output: "g" reduces it. The embedding and the cross-entropy are split over the vocabulary.
// On one rank every collective is skipped and each function is the plain product.
#include "model/model_internal.h"
#include "ops/ops.h"

using namespace model_internal;

void GPT2::column_parallel_forward(Slot& s, Tensor out, void* inp_local, int weight, int bias, Tensor gelu_out) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  const Tensor inp = v.full_of(inp_local, acts_->gathered);
  if (tp_.size > 1) {
    CommHandle gathered = product_hooks.f_forward(v.local(inp_local), inp);
    wait(gathered);
  }
  if (gelu_out.empty()) {
    matmul_forward(out, inp, param(weight), param(bias));
  } else {
    matmul_forward_gelu(out, gelu_out, inp, param(weight), param(bias));
  }
}

void GPT2::row_parallel_forward(Slot& s, void* out_local, Tensor inp, int weight, int bias) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  const Tensor partial = v.full_of(out_local, acts_->partial);
  if (tp_.size == 1) {  // the GEMM adds the bias
    matmul_forward(partial, inp, param(weight), param(bias));
    return;
  }
  // The bias is added once, after the reduction (added before it on every rank, it would count t times).
  matmul_forward(partial, inp, param(weight), Tensor());
  CommHandle reduced = product_hooks.g_forward(partial, v.local(out_local));
  wait(reduced);
  add_bias(v.local(out_local), param(bias));
}

void GPT2::column_parallel_backward(Slot& s, Tensor dinp_local, int weight, int bias, Tensor dout,
                                    Tensor inp_local, void* kept) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  Activations& a = *acts_;
  // The product is the first to write the input's gradient (Overwrite: no zeroing before it); under
  // sequence parallelism "f" writes dinp_local from the full-length partial sums.
  if (tp_.size == 1) {
    matmul_backward_input(dinp_local, dout, param(weight), GradWrite::Overwrite);
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
  CommHandle regathered = later ? CommHandle() : product_hooks.f_forward(inp_local, inp_full);
  const Tensor dinp_partial = v.d.sp ? dinp_full : dinp_local;
  matmul_backward_input(dinp_partial, dout, param(weight), GradWrite::Overwrite);
  CommHandle summed = product_hooks.f_backward(dinp_partial, dinp_local);
  wait(regathered);
  weight_gradient(s, weight, bias, dout, inp_full, kept, later ? inp_local : Tensor());
  wait(summed);
}

void GPT2::row_parallel_backward(Slot& s, Tensor dinp_full, int weight, int bias, Tensor inp_full, void* kept,
                                 Tensor gelu_inp) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  Activations& a = *acts_;
  const Tensor dout_local = v.local(a.dresidual);
  Tensor dout_full = dout_local;
  if (tp_.size > 1) {
    // The bias's gradient from this rank's rows (it was added after the reduction in forward), then
    // "g"'s backward brings the output's gradient to all rows, for the product's.
    bias_backward(grad(bias), dout_local);
    call(hooks.grad_ready, bias);
    dout_full = v.full_of(a.dresidual, a.dfull);
    CommHandle gathered = product_hooks.g_backward(dout_local, dout_full);
    wait(gathered);
  }
  if (gelu_inp.empty()) {
    matmul_backward_input(dinp_full, dout_full, param(weight), GradWrite::Overwrite);  // its first writer
  } else {
    matmul_backward_input_gelu(dinp_full, dout_full, param(weight), gelu_inp);
  }
  weight_gradient(s, weight, tp_.size > 1 ? -1 : bias, dout_full, inp_full, kept);
}

// Each rank looks up the tokens its slice of wte holds (zeros for the others); "g" sums the partial
// lookups over the group.
void GPT2::vocab_parallel_embedding_forward(Slot& s) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  const Tensor partial = v.full_of(s.encoded, acts_->partial);
  embedding_forward(partial, s.inputs, param(kWte), tp_.rank * int(v.d.Vl), cfg_.V);
  CommHandle summed = product_hooks.g_forward(partial, v.local(s.encoded));
  wait(summed);
}

void GPT2::vocab_parallel_embedding_backward(Slot& s) {
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  const Tensor dfull = v.full_of(a.dresidual, a.dfull);
  CommHandle gathered = product_hooks.g_backward(v.local(a.dresidual), dfull);
  wait(gathered);
  embedding_backward(grad(kWte), dfull, s.inputs, tp_.rank * int(v.d.Vl), cfg_.V);
}

// The head is column-parallel over the vocabulary: V/t logits a rank. Its cross-entropy combines
// the rows' maxima, sums of exponentials and target logits over the group, never the logits.
float GPT2::vocab_parallel_head(Slot& s) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  const Tensor logits = v.btc(s.logits, v.d.Vl), probs = v.btc(s.probs, v.d.Vl);
  const Tensor losses = make_view(s.losses, {v.d.B, v.d.T}, DType::F32, device_);
  const Tensor lnf_full = v.full_of(s.lnf, acts_->gathered);
  CommHandle gathered = product_hooks.f_forward(v.local(s.lnf), lnf_full);
  wait(gathered);
  matmul_forward(logits, lnf_full, param(kWte), Tensor());
  const Tensor row_max = v.stat(s.row_max, v.d.R), row_sum = v.stat(s.row_sum, v.d.R);
  const Tensor target_logit = v.stat(s.target_logit, v.d.R);
  crossentropy_shard_max(row_max, target_logit, logits, s.targets, tp_.rank * int(v.d.Vl));
  product_hooks.vocab_all_reduce(row_max, ReduceOp::Max);
  product_hooks.vocab_all_reduce(target_logit, ReduceOp::Sum);
  crossentropy_shard_exp(probs, row_sum, logits, row_max);
  product_hooks.vocab_all_reduce(row_sum, ReduceOp::Sum);
  crossentropy_shard_finish(losses, probs, row_max, row_sum, target_logit);
  return float(mean_of(losses));
}
