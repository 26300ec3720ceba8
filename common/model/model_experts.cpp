// model_experts.cpp: a MoE model's MLP step (chapter 11): in each block the router and its experts
// (moe.h) take the MLP's place, on the rows this rank holds. Expert parallelism hands the experts'
// work to the chapter through ExpertHooks; left empty, the experts this rank holds run here. Also
// the routing statistics a chapter reports.
#include <string>

#include "model/model_internal.h"
#include "ops/ops.h"

using namespace model_internal;

void GPT2::init_experts(int max_B) {
  ENSURE(dtype_ == DType::F32, "GPT2: a MoE model runs in fp32");
  // Each rank routes the rows it holds: under tensor parallelism only sequence parallelism gives the
  // ranks of a group rows of their own (without it they would route the same tokens t times).
  ENSURE(tp_.size == 1 || tp_.sequence_parallel, "GPT2: a tensor-parallel MoE model needs sequence parallelism");
  ENSURE(cfg_.recompute != Recompute::Full, "GPT2: full recomputation would route a MoE block twice");
  // A router and its experts' activations per block and per micro-batch in flight (a pipeline's
  // schedule keeps several alive, each with its own routing until its backward).
  const BlockRange blocks = blocks_of(cfg_, part_);
  const Dims d = dims_for(cfg_, max_B, tp_);
  for (int slot = 0; slot < part_.slots; slot++) {
    for (int l = blocks.begin; l < blocks.end; l++)
      moe_.push_back(std::make_unique<MoELayer>(cfg_.C, cfg_.experts, cfg_.top_k, cfg_.capacity_factor,
                                                cfg_.aux_loss_coef, d.r, slot, device_));
    experts_.push_back(std::make_unique<ExpertMLPs>(cfg_.L, cfg_.C, device_));
  }
  reset_routing_totals();
}

size_t GPT2::moe_index(int slot, int l) const {
  const BlockRange blocks = blocks_of(cfg_, part_);
  return size_t(slot * (blocks.end - blocks.begin) + l - blocks.begin);
}

MoELayer& GPT2::moe_layer(const Slot& s, int l) { return *moe_[moe_index(slot_of(s), l)]; }

// fcproj = the experts' outputs, weighted by the router, for ln2's rows.
void GPT2::moe_mlp_forward(Slot& s, int l, const Layer& x) {
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
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
}

void GPT2::moe_mlp_backward(Slot& s, int l, const Layer& x) {
  Activations& a = *acts_;
  const Views v{dims_for(cfg_, s.B, tp_), dtype_, device_};
  auto run_here = [&](Tensor dout, Tensor drows) {
    experts_[size_t(slot_of(s))]->backward(l, held_experts(l), dout, drows);
  };
  fill_zero(v.local(a.dln));
  const int router = block_param(cfg_, l, kRouter);
  // The balance loss's gradient is each rank's share (moe.h); under tensor parallelism the router's
  // gradient is then summed over the group like every tensor held whole, so each share counts 1/t.
  moe_layer(s, l).backward(v.local(a.dresidual), v.local(x.ln2), param(router), v.local(a.dln), grad(router),
                           loss_weight_ / float(tp_.size), expert_hooks, l, run_here);
  for (int e = cfg_.experts - 1; e >= 0; e--)
    for (int w = kExpertParams - 1; w >= 0; w--)
      if (layout_.params[size_t(expert_param(cfg_, l, e, w))].held()) call(hooks.grad_ready, expert_param(cfg_, l, e, w));
  call(hooks.grad_ready, router);
}

void GPT2::reset_routing_totals() {
  routed_total_.assign(size_t(cfg_.L), std::vector<int64_t>(size_t(cfg_.experts), 0));
  dropped_total_ = routed_total_;
}

const RoutingStats& GPT2::routing(int l, int slot) const {
  const BlockRange blocks = blocks_of(cfg_, part_);
  ENSURE(cfg_.moe() && l >= blocks.begin && l < blocks.end && slot >= 0 && slot < part_.slots,
         "GPT2::routing: no such MoE block or slot here");
  return moe_[moe_index(slot, l)]->stats();
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
