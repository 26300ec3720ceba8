// grid_flags.cpp: the shared flag block of grid_flags.h, declared in the order --help lists it.
#include "pipeline/grid_flags.h"

#include "base/check.h"  // config_error

void GridFlags::declare_grid(FlagParser& flags, TrainConfig& cfg, const GridFlagHelp& help,
                             const std::function<void()>& after_tp, const std::function<void()>& after_pp) {
  const bool tensor_parallel = help.tp != nullptr;
  if (tensor_parallel) flags.add("--tp", &tp, help.tp);
  if (after_tp) after_tp();
  flags.add("--pp", &pipeline.pp, help.pp);
  if (after_pp) after_pp();
  if (tensor_parallel) {
    flags.add_switch("--sequence-parallel", &sequence_parallel, help.sequence_parallel);
    flags.add_switch("--tp-overlap", &overlap,
                     "in backward, sum the input's gradient while the weight's gradient is computed");
  }
  add_schedule_flags(flags, &pipeline, &matching);  // --micro-batches, --schedule, ... (pipeline_flags.h)
  flags.add("--bucket-mb", &bucket_mb, "data-parallel bucket size in MB (default: an eighth of the gradient)");
  if (tensor_parallel) {
    flags.add("--tp-link-gbps", &cfg.tp_link_gbps, "the tensor-parallel group's emulated link (default: --link-gbps's)");
    flags.add("--tp-link-latency-us", &cfg.tp_link_latency_us, "its latency (default: --link-latency-us's)");
  }
}

void GridFlags::check_grid(const TrainConfig& cfg) const {
  check_schedule_flags(cfg, pipeline);
  if (cfg.was_given("--bucket-mb") && !(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  if (cfg.was_given("--tp") && tp < 1) config_error("--tp must be >= 1");
}
