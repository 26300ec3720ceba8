// checkpoint_scale.h: the sharded checkpoint's arithmetic at a scale we cannot run (docs/theory.md,
// section 19), for the published shapes. Defines CheckpointScale and checkpoint_at_scale().
#pragma once
#include <string>

// What one save of a model of `params` parameters on `gpus` GPUs costs, every element written once in
// three fp32 arrays (12 bytes a parameter).
struct CheckpointScale {
  double bytes = 0;              // 12 Psi: the whole checkpoint
  double bytes_per_gpu = 0;      // 12 Psi / gpus: each GPU's owned slices (and its staged copy)
  double sharded_s = 0;          // every GPU writing its slices at once, at the storage's aggregate bandwidth
  double single_writer_s = 0;    // the single file: one writer, at one node's bandwidth
};
// `aggregate_bytes_per_s`: the storage's sustained write bandwidth, all nodes together;
// `writer_bytes_per_s`: what one node can write alone.
CheckpointScale checkpoint_at_scale(double params, int gpus, double aggregate_bytes_per_s, double writer_bytes_per_s);
