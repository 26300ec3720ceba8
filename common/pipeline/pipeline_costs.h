// pipeline_costs.h: one set of measured pass times carried over to any partition of the model and
// any schedule, so that schedules are compared on the same costs (make schedules' ideal panels).
// Defines PassCosts and carry_costs().
//
// Each schedule's run of chapter 08 measures its own pass times, and two runs of the same model never
// time alike (noise, cores shared): simulated each with its own, zb-h1 could come out slower than
// 1f1b only because its run was. Measured once instead, on one partition (a run with one chunk per
// rank), each stage's time is spread over its units in proportion to their forward FLOPs (unit_costs
// in pipeline.h), and any other partition's virtual stage costs the sum over the units it holds.
#pragma once
#include <vector>

#include "model/model_config.h"
#include "schedule/pipeline_schedule.h"
#include "schedule/pipeline_simulate.h"  // ActionCosts

// One micro-batch's passes through one stage, in ms: forward, the inputs' gradients (B), the weights'
// gradients (W). The whole backward is B + W; a run that does not split it has W = 0.
struct PassCosts {
  double forward = 0, backward = 0, weight = 0;
};

// measured[i]: the pass times of virtual stage i of the partition `measured_blocks` (blocks per
// virtual stage, as balanced_partition gives them). Returns the costs of every virtual stage of
// `blocks` over `shape.stages` ranks (indexed by virtual stage, ActionCosts' per-stage form) for
// `schedule`: under zb-h1 B and W apart, under the others B is the whole backward (B + W) and W is
// empty. The totals over the model are the measured totals, whatever the partitions.
// ENSURE: both partitions hold cfg.L blocks, measured has one entry per measured virtual stage,
// blocks one per virtual stage of shape.
ActionCosts carry_costs(const GPT2Config& cfg, const std::vector<int>& measured_blocks,
                        const std::vector<PassCosts>& measured, const std::vector<int>& blocks,
                        const PipelineShape& shape, Schedule schedule);
