// expert_report.cpp: chapter 11's report of its experts (expert_report.h).
#include "training/expert_report.h"

#include <cstdio>
#include <string>

#include "ops/memory.h"   // memory_stats
#include "base/metrics.h"  // format_bytes, JsonObject

namespace {
std::string key(const char* what, int l, int e) {
  return std::string(what) + "_L" + std::to_string(l) + "_E" + std::to_string(e);
}
}  // namespace

void report_expert_step(TrainingRun& run, Communicator& ep_group, const GPT2& model, const ExpertStep& s,
                        const ExpertTheory& t, int ep, int dp, bool memory_too, bool quiet) {
  const GPT2Config& cfg = model.config();
  const int L = cfg.L, E = cfg.experts;
  // The step's routing: routed and dropped summed over its micro-batches, each with its own capacity.
  std::vector<RoutingStats> totals(static_cast<size_t>(L));
  for (const std::vector<RoutingStats>& micro : s.routing)
    for (int l = 0; l < L; l++) {
      RoutingStats& sum = totals[size_t(l)];
      const RoutingStats& r = micro[size_t(l)];
      sum.routed.resize(size_t(E), 0), sum.dropped.resize(size_t(E), 0);
      for (int e = 0; e < E; e++) sum.routed[size_t(e)] += r.routed[size_t(e)], sum.dropped[size_t(e)] += r.dropped[size_t(e)];
      sum.capacity = r.capacity;
    }
  const double a2a_sent = ep_group.all_reduce_scalar(double(s.a2a.sent_bytes), ReduceOp::Max);
  const double predicted = ep_group.all_reduce_scalar(double(s.a2a_predicted_bytes), ReduceOp::Max);
  if (!run.is_root()) return;
  JsonObject record;
  record.add("type", "experts").add("step", s.step).add("balance_loss", s.balance_loss).add("ep", ep).add("dp", dp)
      .add("experts", E).add("layers", L).add("aux_loss_coef", cfg.aux_loss_coef)
      .add("capacity_factor", cfg.capacity_factor)
      .add("a2a_sent_bytes", s.a2a.sent_bytes).add("a2a_received_bytes", s.a2a.received_bytes)
      .add("a2a_predicted_bytes", s.a2a_predicted_bytes).add("a2a_calls", s.a2a.calls)
      .add("a2a_balanced_theory_bytes", t.a2a_balanced)
      .add("a2a_busy_ms", s.a2a.busy_ms).add("a2a_link_model_ms", s.a2a_link_model_ms)
      .add("world_all_reduce_bytes", s.world_all_reduce_bytes).add("world_all_reduce_theory", t.world_all_reduce)
      .add("expert_dp_all_reduce_bytes", s.expert_dp_all_reduce_bytes)
      .add("expert_dp_all_reduce_theory", t.expert_dp_all_reduce);
  for (int l = 0; l < L; l++) {
    const RoutingStats& r = totals[size_t(l)];
    record.add("capacity_L" + std::to_string(l), r.capacity);
    for (int e = 0; e < E; e++) record.add(key("routed", l, e), r.routed[size_t(e)]).add(key("dropped", l, e), r.dropped[size_t(e)]);
  }
  run.write_record(record);
  // Every rank's counts before capacity, per micro-batch and layer: what the capacity claimed from.
  for (size_t m = 0; m < s.routing.size(); m++)
    for (int l = 0; l < L; l++) {
      const RoutingStats& r = s.routing[m][size_t(l)];
      const int ranks = int(r.by_rank.size()) / E;
      JsonObject routing;
      routing.add("type", "routing").add("step", s.step).add("micro_batch", int64_t(m)).add("layer", l)
          .add("ranks", ranks).add("capacity", r.capacity);
      for (int q = 0; q < ranks; q++)
        for (int e = 0; e < E; e++)
          routing.add("routed_R" + std::to_string(q) + "_E" + std::to_string(e), r.by_rank[size_t(q * E + e)]);
      run.write_record(routing);
    }
  if (!quiet) {
    for (int l = 0; l < L; l++) {
      const RoutingStats& r = totals[size_t(l)];
      std::printf("  L%d experts routed/dropped:", l);
      for (int e = 0; e < E; e++) std::printf(" %lld/%lld", (long long)r.routed[size_t(e)], (long long)r.dropped[size_t(e)]);
      std::printf(r.capacity < 0 ? " (capacity unlimited)\n" : " (capacity %lld a micro-batch)\n", (long long)r.capacity);
    }
    std::printf("  balance loss %.5f (in the loss) | all-to-all: %lld calls, sent %s (from the counts: %s; "
                "balanced routing: %s), %.2f ms busy (link model %.2f ms)\n",
                s.balance_loss, (long long)s.a2a.calls, format_bytes(a2a_sent).c_str(), format_bytes(predicted).c_str(),
                format_bytes(t.a2a_balanced).c_str(), s.a2a.busy_ms, s.a2a_link_model_ms);
  }
  if (memory_too) {
    const MemoryStats& mem = memory_stats();
    const int64_t non_expert = 4 * (run.layout().padded_size - t.expert_elements);
    if (!quiet) {
      std::printf("  memory per rank (EP %d): parameters %s = non-expert %s + experts %s (theory L x E/ep x "
                  "(8C^2+5C) x 4 B = %s) | gradients %s | optimizer %s | activations %s | comm buffers %s\n",
                  ep, format_bytes(double(mem.current[int(MemCategory::Params)])).c_str(),
                  format_bytes(double(non_expert)).c_str(), format_bytes(4.0 * double(t.expert_elements)).c_str(),
                  format_bytes(t.expert_params).c_str(), format_bytes(double(mem.current[int(MemCategory::Grads)])).c_str(),
                  format_bytes(double(mem.current[int(MemCategory::OptState)])).c_str(),
                  format_bytes(double(mem.peak[int(MemCategory::Activations)])).c_str(),
                  format_bytes(double(mem.peak[int(MemCategory::CommBuffers)])).c_str());
      std::printf("  gradient bytes per step: world all-reduce %s (theory 2(W-1)/W x non-expert: %s) | "
                  "expert-dp all-reduce %s (theory 2(D-1)/D x experts held: %s)\n",
                  format_bytes(double(s.world_all_reduce_bytes)).c_str(), format_bytes(t.world_all_reduce).c_str(),
                  format_bytes(double(s.expert_dp_all_reduce_bytes)).c_str(),
                  format_bytes(t.expert_dp_all_reduce).c_str());
    }
    JsonObject m;
    m.add("type", "memory_ep").add("ep", ep)
        .add("params_bytes", mem.current[int(MemCategory::Params)])
        .add("expert_params_bytes", 4 * t.expert_elements)
        .add("expert_params_theory", t.expert_params)
        .add("non_expert_params_bytes", non_expert)
        .add("grads_bytes", mem.current[int(MemCategory::Grads)])
        .add("optim_bytes", mem.current[int(MemCategory::OptState)])
        .add("activations_bytes", mem.peak[int(MemCategory::Activations)])
        .add("comm_buffers_bytes", mem.peak[int(MemCategory::CommBuffers)]);
    run.write_record(m);
  }
  std::fflush(stdout);
}
