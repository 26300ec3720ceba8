// pipeline_flags.h: chapter 08's flags, checked together before anything is built. Defines
// PipelineFlags, PipelinePlan and pipeline_flags_problem().
// Every check here is arithmetic on the flags, the rank count, the model's depth and the batch, so
// that a refusal costs nothing whatever the numbers (--micro-batches 10000000 is refused at once,
// not after every rank built and simulated a schedule of that length), and a test walks every
// combination of small values to prove that whatever it accepts builds a sound schedule.
#pragma once
#include <string>
#include <vector>

#include "model_config.h"
#include "pipeline_schedule.h"

struct PipelineFlags {
  int pp = 0;              // --pp; 0: every rank
  int micro_batches = 0;   // --micro-batches; 0: 2 x the stages
  int virtual_stages = 0;  // --virtual-stages; 0: 2 for interleaved, else 1
  std::string schedule = "1f1b";
  std::string partition;   // --partition "3,3,3,3"; empty: balanced by FLOPs (pipeline.h)
  bool zero1 = false, zero2 = false;
};

struct PipelinePlan {
  Schedule schedule = Schedule::OneFOneB;
  PipelineShape shape;      // p stages, m micro-batches, v chunks a rank
  std::vector<int> blocks;  // blocks per virtual stage
  int data_parallel = 1;    // the ranks / p
};

// "" with *plan filled in when the flags make a pipeline of `model` on `world` ranks whose global
// batch of `batch` sequences splits over the data-parallel ranks x micro-batches (batch 0: not known
// yet, as for a resumed run, whose checkpoint holds it: TrainingRun checks it then). Else the
// refusal, naming only 08's flags and what would be right.
std::string pipeline_flags_problem(const PipelineFlags& flags, int world, const GPT2Config& model, int batch,
                                   PipelinePlan* plan);
