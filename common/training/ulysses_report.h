// ulysses_report.h: what chapters 10 and 12 show of Ulysses besides the step line (docs/theory.md,
// section 13b): once, after step 1, every rank's bytes sent in its all-to-alls, forward and backward,
// beside the formula, its exchanges and its time blocked in them; the same numbers as a JSON record
// ("ulysses"). Defines report_ulysses().
#pragma once
#include "comm/comm.h"               // Communicator
#include "training/training_run.h"       // TrainingRun: the model's shape, the JSON records
#include "parallel/ulysses_attention.h"  // UlyssesCounters, the byte formulas

// Collective over `world` (every rank's counters go to rank 0, counted apart from the training
// traffic); rank 0 prints the table and writes the record. u: the Ulysses group's size; T_held and
// C_held: the positions and channels a rank's model holds (C/t under tensor parallelism); layers:
// those a rank runs (its pipeline stage's).
void report_ulysses(TrainingRun& run, Communicator& world, int u, int layers, int T_held, int C_held,
                    const UlyssesCounters& counters);
