// pipeline_flags.h: the pipeline chapters' flags (08, and 09 with --tp), checked together before
// anything is built. Defines PipelineFlags, PipelinePlan, pipeline_flags_problem(), and
// pipeline_tag_problem() and pipeline_matching() for how a receive finds its message.
// Every check here is arithmetic on the flags, the rank count, the model's depth and the batch, so
// that a refusal costs nothing whatever the numbers (--micro-batches 10000000 is refused at once,
// not after every rank built and simulated a schedule of that length), and a test walks every
// combination of small values to prove that whatever it accepts builds a sound schedule.
#pragma once
#include <string>
#include <vector>

#include "comm/comm.h"  // Communicator::largest_tag
#include "training/flags.h"  // FlagParser, TrainConfig
#include "model/model_config.h"
#include "schedule/pipeline_schedule.h"

struct PipelineFlags {
  int tp = 1;              // 09's --tp (resolved: >= 1); 08 has none
  int pp = 0;              // --pp; 0: every rank (of the tensor-parallel groups' count)
  int micro_batches = 0;   // --micro-batches; 0: 2 x the stages
  int virtual_stages = 0;  // --virtual-stages; 0: 2 for interleaved, else 1
  std::string schedule = "1f1b";
  std::string partition;   // --partition "3,3,3,3"; empty: balanced by FLOPs (pipeline.h)
  bool zero1 = false, zero2 = false;
  // --fb-overlap on|off: dualpipev's F&B pairs run at once (pipeline.h) or one pass after the other;
  // empty: not given, on for dualpipev.
  std::string fb_overlap;
  // 12's other dimensions: its --cp and --ep (the grid's), and whether a MoE preset may be split
  // (12 routes its tokens across any grid; 08 and 09 do not).
  int cp = 1, ep = 1;
  bool splits_experts = false;
};

struct PipelinePlan {
  Schedule schedule = Schedule::OneFOneB;
  PipelineShape shape;      // p stages, m micro-batches, v chunks a rank
  std::vector<int> blocks;  // blocks per virtual stage
  int data_parallel = 1;    // the ranks / (tp x p)
  bool fb_overlap = false;  // dualpipev's pairs at once (--fb-overlap, default on)
};

// "" with *plan filled in when the flags make a pipeline of `model` on `world` ranks whose global
// batch of `batch` sequences splits over the data-parallel ranks x micro-batches (batch 0: not known
// yet, as for a resumed run, whose checkpoint holds it: TrainingRun checks it then). Else the
// refusal, naming only the chapter's flags and what would be right. A mixture-of-experts preset is
// refused: neither a pipeline nor a tensor-parallel group splits its blocks.
std::string pipeline_flags_problem(const PipelineFlags& flags, int world, const GPT2Config& model, int batch,
                                   PipelinePlan* plan);

// Matched by tag, a step's messages carry tags 0 .. 2 x p x v x m - 1 (pipeline.h), which must not
// pass the communicator's largest tag (MPI's MPI_TAG_UB attribute: at least 32767, by the standard).
// "" when they do not, else the refusal naming --micro-batches and the largest that fits.
std::string pipeline_tag_problem(const PipelineShape& shape, int64_t largest_tag);
// --p2p-matching (auto, tag or call-order) resolved on `pipeline`: by tag where it matches by tag
// (MPI), else by call order (NCCL); refused (config_error, on every rank alike) where the flag does
// not parse, asks for tags the communicator has not, or the schedule's tags pass its bound.
Matching pipeline_matching(const std::string& flag, const Communicator& pipeline, const PipelineShape& shape);

// Whether the executor runs the plan's F&B pairs at once: plan.fb_overlap, where it can: on the CPU
// (a GPU would need a compute stream per lane), with messages matched by tag (under call order a
// pass's receive goes out with the sends before it, which a pair would hold back). Elsewhere the
// pairs run one pass after the other, and root (`say`) prints why.
bool fb_overlap_runs(const PipelinePlan& plan, Matching matching, Device device, bool say);

// The flags every pipeline chapter (08, 09, 12) takes alike, registered on `flags`: --micro-batches,
// --schedule, --virtual-stages, --p2p-matching (into `matching`), --partition, --zero1, --zero2,
// --fb-overlap, and --grad-accum refused (a pipeline's micro-batches are its accumulation). --pp is
// each chapter's own: its default differs.
void add_schedule_flags(FlagParser& flags, PipelineFlags* pipe, std::string* matching);
// After parsing: the checks that need the flags alone (each a config_error naming its flag).
void check_schedule_flags(const TrainConfig& cfg, const PipelineFlags& pipe);
