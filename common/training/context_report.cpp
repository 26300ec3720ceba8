// context_report.cpp: see context_report.h.
#include "training/context_report.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "base/metrics.h"  // JsonObject, format_bytes

double thread_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

void report_ring(TrainingRun& run, Communicator& world, int cp, const RingCounters& c, ContextSplit split, int u) {
  const GPT2Config& m = run.model_config();
  const int K = run.cfg().grad_accum, B = run.micro_batch_size();
  const double passes = m.recompute == Recompute::Full ? 2 : 1;  // full recomputation replays the forward
  // FLOPs per (query, key) pair and channel of a head: forward 4 (q.k, p v), backward 10 (q.k again to
  // recompute p, then dP, dV, dQ, dK), per layer, micro-batch, sequence and head.
  const double hs = double(m.C) / m.NH, per_pair = hs * (4 * passes + 10), layers = double(m.L) * K * B * (m.NH / u);
  auto flops_formula = [&](int cp_rank, ContextSplit s) {
    return layers * double(causal_pairs_formula(m.T, cp, cp_rank, s)) * per_pair;
  };
  const double kv = double(m.L) * K * B * m.T * (m.C / u) * 4;  // K (or V) over a step: L K B T C fp32 values
  const double forward_formula = passes * 2.0 * (cp - 1) / cp * kv, backward_formula = 2 * 2.0 * (cp - 1) / cp * kv;
  // Every rank's numbers, to rank 0 (scalars, counted apart from the training traffic).
  const std::vector<double> mine = {double(c.forward_pairs) * hs * 4 + double(c.backward_pairs) * hs * 10,
                                    c.compute_ms, c.forward_idle_ms, c.backward_idle_ms, double(c.forward_bytes),
                                    double(c.backward_bytes), c.compute_cpu_ms};
  std::vector<std::vector<double>> all(size_t(world.size()));
  for (int q = 0; q < world.size(); q++)
    for (double x : mine) all[size_t(q)].push_back(world.all_reduce_scalar(world.rank() == q ? x : 0.0, ReduceOp::Sum));
  if (!run.is_root()) return;
  // A rank's place in its ring and its ring's number: CP inside DP (grid_coords), Ulysses inside CP.
  auto place_of = [&](int q) { return q % (cp * u) / u; };
  auto ring_of = [&](int q) { return q / (cp * u) * u + q % u; };
  // The busiest rank of each ring sets the pace: a rank with less work waits, in the ring, for the
  // difference, predicted as the busiest's measured time in the kernels x (1 - its work / the busiest's).
  double most = 0;
  for (int r = 0; r < cp; r++) most = std::max(most, flops_formula(r, split));
  std::vector<double> pace(size_t(world.size() / cp), 0.0);  // per ring: the busiest rank's kernel time
  for (int q = 0; q < world.size(); q++) {
    double& ring_pace = pace[size_t(ring_of(q))];
    if (flops_formula(place_of(q), split) == most) ring_pace = std::max(ring_pace, all[size_t(q)][1]);
  }
  std::printf("ring attention per rank, step 1 (CP %d, %s; docs/theory.md, section 13):\n", cp,
              context_split_name(split));
  std::printf("  %4s %14s %14s %24s %11s %8s %22s %15s\n", "rank", "attn FLOPs", "formula", "(contiguous | zigzag)",
              "compute ms", "cpu ms", "idle in ring fwd+bwd", "predicted idle");
  JsonObject record;
  record.add("type", "ring").add("cp", cp).add("split", context_split_name(split))
      .add("theory_forward_bytes", forward_formula).add("theory_backward_bytes", backward_formula);
  if (u > 1) record.add("ulysses", u);
  for (int q = 0; q < world.size(); q++) {
    const std::vector<double>& x = all[size_t(q)];
    const int r = place_of(q);
    const double predicted_idle = pace[size_t(ring_of(q))] * (1 - flops_formula(r, split) / most);
    std::printf("  %4d %14.4g %14.4g %11.4g | %-10.4g %11.2f %8.2f %13.2f + %-8.2f %12.2f\n", q, x[0],
                flops_formula(r, split), flops_formula(r, ContextSplit::Contiguous),
                flops_formula(r, ContextSplit::Zigzag), x[1], x[6], x[2], x[3], predicted_idle);
    const std::string k = "rank" + std::to_string(q) + "_";
    record.add(k + "flops", x[0]).add(k + "theory_flops", flops_formula(r, split))
        .add(k + "compute_ms", x[1]).add(k + "compute_cpu_ms", x[6])
        .add(k + "idle_forward_ms", x[2]).add(k + "idle_backward_ms", x[3])
        .add(k + "predicted_idle_ms", predicted_idle).add(k + "forward_bytes", x[4]).add(k + "backward_bytes", x[5]);
  }
  std::printf("  ring bytes per rank: forward %s (theory %s2(cp-1)/cp x L K B T C x 4 = %s: (cp-1)/cp of K and V) | "
              "backward %s (theory 2 x 2(cp-1)/cp x L K B T C x 4 = %s: the blocks again and their gradients)\n",
              format_bytes(all[0][4]).c_str(), passes > 1 ? "2 passes x " : "", format_bytes(forward_formula).c_str(),
              format_bytes(all[0][5]).c_str(), format_bytes(backward_formula).c_str());
  std::fflush(stdout);
  run.write_record(record);
}
