// model_split_backward.cpp: the backward split in two for zero-bubble pipelines (chapter 08,
// ModelPart::split_backward). backward() computes only the inputs' gradients, the critical path that
// the previous stage waits for; each product's weight gradient is kept as its output's gradient and
// input, and backward_weights() computes them later, where the schedule has room.
#include "model/model_internal.h"
#include "ops/ops.h"
#include "comm/trace.h"

using namespace model_internal;

void GPT2::weight_gradient(Slot& s, int weight, int bias, Tensor dout, Tensor inp, void* kept, Tensor inp_local) {
  if (!part_.split_backward) {
    matmul_backward_weight(grad(weight), bias >= 0 ? grad(bias) : Tensor(), dout, inp);
    if (bias >= 0) call(hooks.grad_ready, bias);
    if (weight != kWte) call(hooks.grad_ready, weight);  // (wte: see head_backward)
    return;
  }
  // Keep the output's gradient (unless backward wrote it where it is kept already).
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
      CommHandle gathered = product_hooks.f_forward(w.inp_local, w.inp);
      wait(gathered);
    }
    matmul_backward_weight(grad(w.weight), w.bias >= 0 ? grad(w.bias) : Tensor(), w.dout, w.inp);
    if (w.bias >= 0) call(hooks.grad_ready, w.bias);
    if (w.weight != kWte) call(hooks.grad_ready, w.weight);
  }
  s.weight_gradients.clear();
  if (has_head()) call(hooks.grad_ready, kWte);  // the head's product was wte's last use
}
