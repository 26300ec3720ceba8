// grid_flags.h: the flag block the pipeline chapters share (08; 09 and 12 with tensor parallelism),
// declared and checked by one piece of code, so that a chapter's Options names only what is its own.
// Defines GridFlagHelp and GridFlags.
#pragma once
#include <functional>
#include <string>

#include "pipeline/pipeline_flags.h"  // PipelineFlags, add_schedule_flags, check_schedule_flags
#include "training/flags.h"           // FlagParser, TrainConfig

// The help texts that say a chapter's own defaults. No tp text: the chapter has no tensor parallelism
// (08), and none of --tp, --sequence-parallel, --tp-overlap, --tp-link-gbps, --tp-link-latency-us.
struct GridFlagHelp {
  const char* tp = nullptr;
  const char* pp = nullptr;
  const char* sequence_parallel = nullptr;
};

struct GridFlags {
  int tp;  // --tp; the chapter's default (09: 0, resolved from the rank count; 12: 1)
  // --pp, --micro-batches, --schedule, --virtual-stages, --partition, --zero1, --zero2: checked by
  // pipeline_flags.h, and --pp's default the chapter's
  PipelineFlags pipeline;
  bool sequence_parallel = false, overlap = false;
  std::string matching = "auto";  // auto: by tag where the communicator has tags (MPI), else call order
  double bucket_mb = 0;

  explicit GridFlags(int default_tp) : tp(default_tp) {}

  // Adds --tp, --pp, --sequence-parallel, --tp-overlap, the schedule's flags, --bucket-mb,
  // --tp-link-gbps and --tp-link-latency-us, in that order; after_tp and after_pp add a chapter's
  // own between them (12: --cp after --tp, --ep after --pp), so that --help lists kin together.
  void declare_grid(FlagParser& flags, TrainConfig& cfg, const GridFlagHelp& help,
                    const std::function<void()>& after_tp = {}, const std::function<void()>& after_pp = {});
  // The checks that need the flags alone (config_error, naming the flag); the rest, against the
  // ranks and the model, is pipeline_flags_problem()'s.
  void check_grid(const TrainConfig& cfg) const;
};
