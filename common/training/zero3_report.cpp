// zero3_report.cpp: see zero3_report.h.
#include "training/zero3_report.h"

#include <algorithm>
#include <cstdio>

#include "base/metrics.h"  // format_bytes

void report_zero3_peak(const TrainingRun& run, const ShardPlan& shard, int64_t gathered_peak) {
  if (!run.is_root()) return;
  const ParamLayout& layout = run.layout();
  const int head = layout.num_units() - 1;  // final layernorm + tied LM head
  int64_t largest = 0, second = 0;
  for (int u = 1; u < head; u++) {  // the blocks; the embedding is counted apart
    second = std::max(second, std::min(largest, layout.unit_size(u)));
    largest = std::max(largest, layout.unit_size(u));
  }
  const double w = double(dtype_size(run.dtype()));  // bytes per parameter
  std::printf("peak parameter memory: shard %s + gathered layers %s (theory: shard + two largest blocks %s + "
              "the tied embedding, held for the head, %s)\n",
              format_bytes(w * shard.size()).c_str(), format_bytes(w * gathered_peak).c_str(),
              format_bytes(w * (largest + second)).c_str(), format_bytes(w * layout.unit_size(0)).c_str());
}
