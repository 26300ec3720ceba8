// gradient_router.h: where each gradient goes once the backward has made it, read from the
// parameter's placement (ParamInfo::copies, grid_axes.h) rather than decided again by each chapter.
// Defines GradientRouter, which 08, 09 and 12 attach to their pipeline's chunks.
//
// A gradient is final on the last micro-batch's backward (or weight pass, under zb-h1); ZeRO-2's rule
// (--zero2) hands every micro-batch's to data parallelism instead. Then, by its copies:
//   TP, under sequence parallelism: the TP ranks held other rows, so their copies' gradients are
//       partial sums: summed over the TP group first (07), while the layer's backward goes on (an
//       expert has no TP copies: its TP ranks hold other experts, or other tokens' gradients of it);
//   PP (the tied wte, on the first and the last stage): summed over the embedding group (08), once a
//       step; in a V one rank holds both ends and sums nothing;
//   then the data replicas (DP x CP; an expert's: EDP) through GradientSync (data_parallel.h).
#pragma once
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "parallel/data_parallel.h"  // GradientSync
#include "model/model.h"          // GPT2's hooks
#include "model/param_layout.h"
#include "pipeline/pipeline.h"  // PipelineExecutor::before_compute

class GradientRouter {
 public:
  // `grads`: the flat gradient buffer of `layout`. `tp_sums`: the TP group where its copies must be
  // summed (sequence parallelism), else null. `embedding`: the group that sums the tied wte's two
  // copies, or null (one stage, a V, a stage between). `micro_batches`: a step's, whose last is final.
  GradientRouter(const ParamLayout& layout, Tensor grads, GradientSync& data_parallel, int micro_batches,
                 bool every_micro_batch, Communicator* tp_sums, Communicator* embedding);
  // Hooks every chunk's gradients (and, where TP sums travel, each layer's end to wait for them), and
  // the executor's passes (which micro-batch is the last; ZeRO-2's turn between micro-batches).
  void attach(PipelineExecutor& pipeline, const std::vector<GPT2*>& chunks);
  // What attach() sets as the executor's before_compute, for a chapter that sets its own around it.
  void before_compute(const Action& a);
  // After the step's passes: the sums in flight land in data parallelism, which then finishes.
  void finish();

 private:
  void ready(int param, bool wte_not_final_here);
  void finish_tp_sums();

  const ParamLayout& layout_;
  Tensor grads_;
  GradientSync& data_parallel_;
  int micro_batches_;
  bool every_micro_batch_;
  Communicator* tp_sums_;
  Communicator* embedding_;
  int wte_;
  bool last_micro_batch_ = false;  // (set by the backward's passes alone: one lane)
  std::vector<std::pair<int, CommHandle>> summing_;  // the TP sums in flight
  CommHandle wte_sum_;
};
