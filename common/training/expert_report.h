// expert_report.h: what chapter 11 shows of its experts besides the step line (docs/theory.md, 14):
// per step, per layer and expert, the assignments routed and dropped, the balance loss, the
// all-to-all bytes and time next to their predictions; once, after step 1, the memory per rank by
// category with the experts apart, and each group's gradient bytes next to theory. The same numbers
// go into JSON records ("experts" per step, "routing" per micro-batch and layer, "memory_ep" once), next
// to their theory (theory.h, ExpertTheory). Defines ExpertStep and report_expert_step().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"          // Communicator, CollectiveCounters
#include "model/model.h"         // GPT2: its routing statistics
#include "model/param_layout.h"  // ParamLayout
#include "parallel/theory.h"        // ExpertTheory
#include "training/training_run.h"  // TrainingRun: the JSON records

// One step's measurements on this rank.
struct ExpertStep {
  int step = 0;
  // Per micro-batch (--grad-accum), per layer: the routing of the global micro-batch (capacity and
  // balance loss are per micro-batch). The step's record sums routed and dropped over them, and each
  // micro-batch's layer gets a "routing" record with every rank's counts.
  std::vector<std::vector<RoutingStats>> routing;
  double balance_loss = 0;            // global (the average of the ranks' shares)
  CollectiveCounters a2a;             // the EP group's all-to-alls this step
  int64_t a2a_predicted_bytes = 0;    // what the routing counts say this rank sends
  double a2a_link_model_ms = 0;       // their modelled time on the emulated link
  int64_t world_all_reduce_bytes = 0, expert_dp_all_reduce_bytes = 0;
};

// Writes the step's record (and, with memory_too, the memory record) on rank 0 and, unless quiet,
// prints them. Collective over the EP group (the largest bytes over its ranks are printed).
void report_expert_step(TrainingRun& run, Communicator& ep_group, const GPT2& model, const ExpertStep& s,
                        const ExpertTheory& theory, int ep, int dp, bool memory_too, bool quiet);
