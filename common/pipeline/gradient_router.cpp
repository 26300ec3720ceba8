// gradient_router.cpp: see gradient_router.h.
#include "pipeline/gradient_router.h"

#include "comm/wire_format.h"  // the TP sums and the tied wte's, in the recipe's gradient format

GradientRouter::GradientRouter(const ParamLayout& layout, Tensor grads, GradientSync& data_parallel,
                               int micro_batches, bool every_micro_batch, Communicator* tp_sums,
                               Communicator* embedding)
    : layout_(layout), grads_(grads), data_parallel_(data_parallel), micro_batches_(micro_batches),
      every_micro_batch_(every_micro_batch), tp_sums_(tp_sums), embedding_(embedding), wte_(layout.find("wte")) {
  // ZeRO-2's rule, but wte's bucket (summed over the stages first) goes once, at the end.
  if (every_micro_batch_) data_parallel_.set_every_micro_batch(embedding_ && layout_.params[wte_].held() ? wte_ : -1);
}

void GradientRouter::before_compute(const Action& a) {
  if (a.op != Op::F) last_micro_batch_ = a.micro == micro_batches_ - 1;
  if (every_micro_batch_ && a.op == Op::B) data_parallel_.micro_batch_done();
}

void GradientRouter::attach(PipelineExecutor& pipeline, const std::vector<GPT2*>& chunks) {
  pipeline.before_compute = [this](const Action& a) { before_compute(a); };
  // With one stage and several chunks, or in a V, the embedding's chunk and the head's share this
  // rank's one wte: its gradient is final after the embedding's backward, the later of the two.
  const bool rank_holds_embedding = chunks.front()->has_embedding();
  for (GPT2* chunk : chunks) {
    const bool wte_not_final_here = rank_holds_embedding && !chunk->has_embedding();
    chunk->hooks.grad_ready = [this, wte_not_final_here](int param) { ready(param, wte_not_final_here); };
    // The TP sums travel while a layer's backward runs.
    if (tp_sums_) chunk->hooks.after_backward = [this](int) { finish_tp_sums(); };
  }
}

void GradientRouter::ready(int param, bool wte_not_final_here) {
  if (param == wte_ && wte_not_final_here) return;
  if (!last_micro_batch_ && !every_micro_batch_) return;  // no_sync (unless ZeRO-2's rule)
  const ParamInfo& info = layout_.params[size_t(param)];
  if (tp_sums_ && (info.copies & kAxisTP)) {
    // In the recipe's gradient format, as the data-parallel buckets they then join travel (wte's
    // sum over the stages too).
    summing_.emplace_back(param, wire_all_reduce_async(*tp_sums_, grads_.slice1d(info.offset, info.size), ReduceOp::Sum,
                                                       collective_formats(*tp_sums_).gradients));
    return;
  }
  if (embedding_ && (info.copies & kAxisPP)) {
    if (!last_micro_batch_) return;
    wte_sum_ = wire_all_reduce_async(*embedding_, grads_.slice1d(info.offset, info.size), ReduceOp::Sum,
                                     collective_formats(*embedding_).gradients);
    return;
  }
  data_parallel_.gradient_ready(param);
}

void GradientRouter::finish_tp_sums() {
  for (auto& [param, handle] : summing_) {
    handle.wait();
    data_parallel_.gradient_ready(param);
  }
  summing_.clear();
}

void GradientRouter::finish() {
  finish_tp_sums();  // (those of a last weight pass)
  if (wte_sum_.valid()) {
    wte_sum_.wait();
    wte_sum_ = CommHandle();
    data_parallel_.gradient_ready(wte_);
  }
  data_parallel_.finish();
}
