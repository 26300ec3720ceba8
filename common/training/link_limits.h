// link_limits.h: an emulated link too slow for the watchdog is refused before step 0, with the
// arithmetic. Defines LinkTransfer, step_transfers() and link_timeout_problem().
// The watchdog (--timeout) ends a job whose op waits longer than the timeout, and the emulated link
// makes each op wait its modelled time (comm.h, modelled_ms). When one transfer that every step
// makes is modelled longer than the timeout by itself, the run can only end at the watchdog: say so
// before the work, showing alpha-beta's sum with the run's numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"          // LinkModel, CollectiveKind, modelled_ms
#include "model/model_config.h"  // GPT2Config
#include "model/param_layout.h"  // ParamLayout, TensorParallelism
#include "parallel/theory.h"        // Strategy

struct LinkTransfer {
  std::string what;   // "the all-reduce of the largest gradient (wte) over the 2 data-parallel ranks"
  CollectiveKind kind = CollectiveKind::AllReduce;
  int64_t bytes = 0;  // S, the payload
  int ranks = 1;      // N, the group's
  LinkModel link;
  std::string flags;  // the chapter's flags that set `link`: "--link-gbps, --link-latency-us"
};

// Transfers every step makes, at least as large as each kind's largest (a lower bound, so that no
// run that could finish is refused): the loss's scalar all-reduce over every rank; the largest
// gradient tensor's all-reduce (DP) or reduce-scatter (ZeRO) over the data-parallel group, which
// every bucket holds at least once; under tensor parallelism a micro-batch's (B,T,C) activation
// summed over its group; in a pipeline the same activation sent to the next stage.
std::vector<LinkTransfer> step_transfers(const ParamLayout& layout, const GPT2Config& model, Strategy strategy,
                                         int dtype_bytes, int micro_batch, int world, int data_parallel,
                                         const TensorParallelism& tp, int pipeline_stages, const LinkModel& link,
                                         const LinkModel& tp_link);

// "" when timeout_s is 0 (no watchdog) or every transfer's modelled time is within it; else the
// refusal for the longest, naming its flags, the formula and the numbers in it.
std::string link_timeout_problem(const std::vector<LinkTransfer>& transfers, double timeout_s);
