// context_report.h: what chapter 10 shows of its ring besides the step line (docs/theory.md, 13):
// once, after step 1, every rank's attention FLOPs next to both splits' formulas, its time in the
// ring's kernels and blocked in the ring against the predicted idle time, and the ring's bytes next
// to 2(cp-1)/cp of K and V; the same numbers as a JSON record ("ring"). Defines RingCounters,
// thread_cpu_ms() and report_ring().
#pragma once
#include <cstdint>

#include "comm/comm.h"           // Communicator
#include "parallel/context_split.h"  // ContextSplit, causal_pairs_formula
#include "training/training_run.h"   // TrainingRun: the model's shape, the JSON records

// What a rank's ring did, summed over a step's layers and micro-batches.
struct RingCounters {
  int64_t forward_pairs = 0, backward_pairs = 0;  // (query, key) pairs computed, over sequences and heads
  int64_t forward_bytes = 0, backward_bytes = 0;  // sent, from the ring communicator's counters
  double forward_idle_ms = 0, backward_idle_ms = 0;  // blocked waiting for a block (its exposed time)
  double compute_ms = 0;                             // in the blocks' kernels, wall-clock
  double compute_cpu_ms = 0;  // the same, this thread's CPU time: what a core spent, however busy the machine
};

// This thread's CPU time in ms: unlike the wall clock, it does not count the time another process had
// the core.
double thread_cpu_ms();

// Collective over `world` (every rank's counters go to rank 0, counted apart from the training
// traffic); rank 0 prints the table and writes the record. cp: the ring's size, CP inside DP
// (process_grid.h), so world rank q is place q % cp of ring q / cp. Under Ulysses (ulysses > 1, inside
// the ring) each ring runs on NH/ulysses heads, and world rank q is place (q % (cp u)) / u.
void report_ring(TrainingRun& run, Communicator& world, int cp, const RingCounters& counters, ContextSplit split,
                 int ulysses = 1);
