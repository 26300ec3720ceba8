// scripts/bench/checkpoint_scale.cpp: the sharded checkpoint at the published scales (make
// bench-checkpoint prints it after its measurements). The model sizes and GPU counts are the papers';
// the storage bandwidths too where published (Llama 3: 2 TB/s sustained; DeepSeek's 3FS: 6.6 TiB/s,
// measured reading), and one node writing alone is taken at one 400 Gb/s NIC (50 GB/s).
#include <cstdio>

#include "planner/checkpoint_scale.h"

int main() {
  struct Shape {
    const char* name;
    double params;
    int gpus;
    double aggregate;  // bytes/s
  };
  const Shape shapes[] = {{"Llama 3 405B", 405e9, 16384, 2e12}, {"DeepSeek-V3 671B", 671e9, 2048, 6.6 * 1099511627776.0}};
  const double one_node = 50e9;
  std::printf("%-18s %7s %12s %14s %16s %18s\n", "model", "GPUs", "12 Psi", "per GPU", "sharded save", "single writer");
  for (const Shape& s : shapes) {
    const CheckpointScale c = checkpoint_at_scale(s.params, s.gpus, s.aggregate, one_node);
    std::printf("%-18s %7d %9.2f TB %11.1f MB %14.1f s %16.0f s\n", s.name, s.gpus, c.bytes / 1e12,
                c.bytes_per_gpu / 1e6, c.sharded_s, c.single_writer_s);
  }
  std::printf("(12 bytes a parameter: fp32 weights, AdamW m and v; per GPU: its slices and its staged copy under "
              "--async-save; sharded: all GPUs at the storage's aggregate bandwidth; single writer: one node at 50 GB/s)\n");
  return 0;
}
