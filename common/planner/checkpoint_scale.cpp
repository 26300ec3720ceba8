// checkpoint_scale.cpp: checkpoint_at_scale() of checkpoint_scale.h.
#include "planner/checkpoint_scale.h"

CheckpointScale checkpoint_at_scale(double params, int gpus, double aggregate_bytes_per_s, double writer_bytes_per_s) {
  CheckpointScale s;
  s.bytes = 12.0 * params;  // parameters, AdamW m and v, fp32, each element once
  s.bytes_per_gpu = s.bytes / gpus;
  s.sharded_s = s.bytes / aggregate_bytes_per_s;
  s.single_writer_s = s.bytes / writer_bytes_per_s;
  return s;
}
