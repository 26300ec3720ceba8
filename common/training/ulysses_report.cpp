// ulysses_report.cpp: see ulysses_report.h.
#include "training/ulysses_report.h"

#include <cstdio>
#include <string>
#include <vector>

#include "base/metrics.h"  // JsonObject, format_bytes

void report_ulysses(TrainingRun& run, Communicator& world, int u, int layers, int T_held, int C_held,
                    const UlyssesCounters& c) {
  const GPT2Config& m = run.model_config();
  const int K = run.cfg().grad_accum, B = run.micro_batch_size();
  const int passes = m.recompute == Recompute::Full ? 2 : 1;  // full recomputation replays the forward
  const double forward = ulysses_forward_bytes(u, layers, K, B, T_held, C_held, passes);
  const double backward = ulysses_backward_bytes(u, layers, K, B, T_held, C_held);
  const std::vector<double> mine = {double(c.forward_bytes), double(c.backward_bytes), double(c.forward_exchanges),
                                    double(c.backward_exchanges), c.forward_idle_ms, c.backward_idle_ms};
  std::vector<std::vector<double>> all(size_t(world.size()));
  for (int q = 0; q < world.size(); q++)
    for (double x : mine) all[size_t(q)].push_back(world.all_reduce_scalar(world.rank() == q ? x : 0.0, ReduceOp::Sum));
  if (!run.is_root()) return;
  std::printf("Ulysses all-to-alls per rank, step 1 (u %d, T/(u cp) = %d positions held; docs/theory.md, section 13b):\n",
              u, T_held);
  std::printf("  %4s %14s %14s %14s %14s %10s %18s\n", "rank", "forward bytes", "theory", "backward bytes", "theory",
              "exchanges", "idle fwd+bwd ms");
  JsonObject record;
  record.add("type", "ulysses").add("ulysses", u).add("held_positions", T_held)
      .add("theory_forward_bytes", forward).add("theory_backward_bytes", backward);
  for (int q = 0; q < world.size(); q++) {
    const std::vector<double>& x = all[size_t(q)];
    std::printf("  %4d %14s %14s %14s %14s %10.0f %9.2f + %-8.2f\n", q, format_bytes(x[0]).c_str(),
                format_bytes(forward).c_str(), format_bytes(x[1]).c_str(), format_bytes(backward).c_str(), x[2] + x[3],
                x[4], x[5]);
    const std::string k = "rank" + std::to_string(q) + "_";
    record.add(k + "forward_bytes", x[0]).add(k + "backward_bytes", x[1]).add(k + "exchanges", x[2] + x[3])
        .add(k + "idle_forward_ms", x[4]).add(k + "idle_backward_ms", x[5]);
  }
  std::printf("  (theory: forward %s4 (u-1)/u x L K B T C x 4: q, k, v to heads, the output back | backward "
              "8 (u-1)/u x L K B T C x 4: q, k, v, the output and its gradient to heads, the gradients back)\n",
              passes > 1 ? "2 passes x " : "");
  std::fflush(stdout);
  run.write_record(record);
}
