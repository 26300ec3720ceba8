// grid_report.cpp: see grid_report.h.
#include "training/grid_report.h"

#include <cstdio>

#include "base/check.h"
#include "base/metrics.h"  // JsonObject, format_bytes

void report_groups(TrainingRun& run, Communicator& world, const std::vector<GroupRow>& mine,
                   const std::vector<std::pair<std::string, std::string>>& formulas) {
  const int W = world.size();
  std::vector<std::vector<GroupRow>> all(size_t(W), mine);
  for (int q = 0; q < W; q++)
    for (size_t i = 0; i < mine.size(); i++) {
      GroupRow& row = all[size_t(q)][i];
      row.measured = world.all_reduce_scalar(world.rank() == q ? mine[i].measured : 0.0, ReduceOp::Sum);
      row.theory = world.all_reduce_scalar(world.rank() == q ? mine[i].theory : 0.0, ReduceOp::Sum);
    }
  if (!run.is_root()) return;
  std::printf("bytes sent per rank and group, one step, next to theory (docs/theory.md, section 17):\n  %4s", "rank");
  for (const GroupRow& row : mine) std::printf(" %25s", row.name.c_str());
  std::printf("\n");
  JsonObject record;
  record.add("type", "groups");
  for (int q = 0; q < W; q++) {
    std::printf("  %4d", q);
    for (const GroupRow& row : all[size_t(q)]) {
      const std::string both = format_bytes(row.measured) + " / " + format_bytes(row.theory);
      std::printf(" %25s", both.c_str());
      record.add("rank" + std::to_string(q) + "_" + row.name, row.measured)
          .add("rank" + std::to_string(q) + "_" + row.name + "_theory", row.theory);
    }
    std::printf("\n");
  }
  std::printf("  (measured / theory)\n");
  for (const auto& [name, formula] : formulas) std::printf("  %-12s %s\n", name.c_str(), formula.c_str());
  std::fflush(stdout);
  run.write_record(record);
}
