// link_limits.cpp: the transfers of a step and the emulated link's refusal (link_limits.h).
#include "training/link_limits.h"

#include <algorithm>
#include <cstdio>

#include "base/metrics.h"  // format_bytes

namespace {

std::string g(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", x);
  return text;
}

// "2(N-1) (alpha + S/N x 8/beta) = 2 x 1 x (50 us + 4 MB / 2 at 0.001 Gbit/s) = 3.2e+04 s"
std::string arithmetic(const LinkTransfer& t) {
  const int n = t.ranks;
  std::string factor, formula, hop_bytes;
  double per_hop_bytes = double(t.bytes);
  switch (t.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::Scalar:
      formula = "2(N-1)(alpha + S/N / beta)", factor = "2 x " + std::to_string(n - 1), per_hop_bytes /= n;
      break;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather:
      formula = "(N-1)(alpha + S/N / beta)", factor = std::to_string(n - 1), per_hop_bytes /= n;
      break;
    default: formula = "alpha + S / beta", factor = "1"; break;
  }
  const std::string bandwidth = t.link.gbps > 0 ? " at " + g(t.link.gbps) + " Gbit/s" : " at unlimited bandwidth";
  return formula + " = " + factor + " x (" + g(t.link.latency_us) + " us + " + format_bytes(per_hop_bytes) +
         bandwidth + ") = " + g(modelled_ms(t.link, t.kind, t.bytes, t.ranks) / 1e3) + " s";
}

}  // namespace

std::vector<LinkTransfer> step_transfers(const ParamLayout& layout, const GPT2Config& model, Strategy strategy,
                                         int dtype_bytes, int micro_batch, int world, int data_parallel,
                                         const TensorParallelism& tp, int pipeline_stages, const LinkModel& link,
                                         const LinkModel& tp_link) {
  const std::string link_flags =
      std::string(link.flags) + "-gbps " + g(link.gbps) + ", " + link.flags + "-latency-us " + g(link.latency_us);
  std::vector<LinkTransfer> transfers;
  if (world > 1)
    transfers.push_back({"the loss's all-reduce of one number over the " + std::to_string(world) + " ranks",
                         CollectiveKind::Scalar, 8, world, link, link_flags});
  if (data_parallel > 1) {
    const ParamInfo* largest = nullptr;
    for (const ParamInfo& p : layout.params)
      if (!largest || p.size > largest->size) largest = &p;
    if (largest && largest->size > 0) {
      const bool sharded = strategy != Strategy::DP;
      transfers.push_back({std::string("the ") + (sharded ? "reduce-scatter" : "all-reduce") +
                               " of the largest gradient (" + largest->name + ") over the " +
                               std::to_string(data_parallel) + " data-parallel ranks",
                           sharded ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce,
                           largest->size * dtype_bytes, data_parallel, link, link_flags});
    }
  }
  const int64_t activation = int64_t(micro_batch) * model.T * model.C * dtype_bytes;
  if (tp.size > 1) {
    const std::string flags = std::string(tp_link.flags) + "-gbps " + g(tp_link.gbps) + ", " + tp_link.flags +
                              "-latency-us " + g(tp_link.latency_us);
    transfers.push_back({"the all-reduce of a micro-batch's (B,T,C) activation over the " + std::to_string(tp.size) +
                             " tensor-parallel ranks",
                         CollectiveKind::AllReduce, activation, tp.size, tp_link, flags});
  }
  if (pipeline_stages > 1)
    transfers.push_back({"the send of a micro-batch's (B,T,C) activation to the next pipeline stage",
                         CollectiveKind::SendRecv, activation, 2, link, link_flags});
  return transfers;
}

std::string link_timeout_problem(const std::vector<LinkTransfer>& transfers, double timeout_s) {
  if (timeout_s <= 0 || transfers.empty()) return "";
  auto seconds = [](const LinkTransfer& t) { return modelled_ms(t.link, t.kind, t.bytes, t.ranks) / 1e3; };
  const LinkTransfer& longest = *std::max_element(
      transfers.begin(), transfers.end(), [&](const LinkTransfer& a, const LinkTransfer& b) { return seconds(a) < seconds(b); });
  if (seconds(longest) <= timeout_s) return "";
  return "the emulated link (" + longest.flags + ") makes " + longest.what + ", S = " +
         format_bytes(double(longest.bytes)) + ", take " + arithmetic(longest) + " by itself, longer than --timeout " +
         g(timeout_s) + " s: the watchdog would end the run in its first step. Raise the bandwidth, lower the "
         "latency, or raise --timeout (0 = no watchdog)";
}
