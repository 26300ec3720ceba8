// zero3_report.h: what chapter 06 prints after its last step: the peak of its gathered parameters
// next to the prediction from the layout alone (docs/theory.md). Defines report_zero3_peak().
#pragma once
#include <cstdint>

#include "parallel/shards.h"        // ShardPlan
#include "training/training_run.h"  // TrainingRun: the layout, the dtype, rank 0

// Rank 0 prints "peak parameter memory: shard S + gathered layers G (theory: shard + two largest blocks
// B + the tied embedding, held for the head, E)". gathered_peak: the most elements the run held gathered
// at once, as the chapter counted them.
void report_zero3_peak(const TrainingRun& run, const ShardPlan& shard, int64_t gathered_peak);
