// planner_shape_refusals.cpp: a published shape's refusals (planner_shape_refusals.h), in the order a
// reader checks a grid: the model, the GPUs and the batch, the heads and the MLP under TP, CP's chunks,
// Ulysses' heads and positions, EP, ZeRO, the pipeline's schedule.
#include "planner/planner_shape_refusals.h"

#include "planner/planner_ulysses.h"  // ulysses_split_problem
#include "schedule/pipeline_schedule.h"  // schedule_shape_error, splits_backward

std::string shape_invalid_reason(const PlanInputs& in, const PlanConfig& c) {
  const ModelShape& s = in.shape;
  const std::string problem = model_shape_problem(s);
  if (!problem.empty()) return "--model " + s.name + ": " + problem;
  if (c.gpus() != in.gpus)
    return "tp x cp x u x pp x dp = " + std::to_string(c.gpus()) + ", not the " + std::to_string(in.gpus) + " GPUs";
  if (long(c.dp) * c.micro_batch * c.micro_batches != in.batch)
    return "dp x B x m = " + std::to_string(long(c.dp) * c.micro_batch * c.micro_batches) + ", not the batch " +
           std::to_string(in.batch);
  const int heads = s.mla() ? s.NH : s.kv();
  if (s.NH % c.tp || heads % c.tp)
    return "tp " + std::to_string(c.tp) + " does not divide the " + std::to_string(s.NH) + " query and " +
           std::to_string(heads) + " key/value heads";
  if ((s.ffn % c.tp) || (s.moe() && s.expert_ffn % c.tp)) return "tp " + std::to_string(c.tp) + " does not divide the MLP's width";
  if (c.sequence_parallel && c.tp == 1) return "sequence parallelism needs tp > 1";
  if (c.cp > 1 && s.T % (2 * c.cp)) return "cp " + std::to_string(c.cp) + ": T = " + std::to_string(s.T) + " does not cut into 2cp chunks";
  // Ulysses splits the query heads NH/(t u) whole; key/value heads fewer than u a TP rank are sent
  // whole to each rank whose query heads share them (kv_heads_after_ulysses).
  const std::string ulysses_problem = ulysses_split_problem(c.ulysses, s.NH, c.tp, s.T, c.cp);
  if (!ulysses_problem.empty()) return ulysses_problem;
  if (c.ulysses > 1 && (heads / c.tp) % c.ulysses && c.ulysses % (heads / c.tp))
    return "--ulysses " + std::to_string(c.ulysses) + ": the " + std::to_string(heads / c.tp) + " key/value heads a TP "
           "rank holds neither split into u groups nor divide u";
  if (c.ep > 1 && !s.moe()) return "expert parallelism needs experts";
  if (c.ep > 1 && (s.experts % c.ep || (c.dp * c.context()) % c.ep))
    return "ep " + std::to_string(c.ep) + " must divide the " + std::to_string(s.experts) + " experts and dp x cp x u = " +
           std::to_string(c.dp * c.context());
  if (c.zero < 0 || c.zero > 3) return "ZeRO stage " + std::to_string(c.zero) + " (0..3)";
  if (c.zero > 0 && c.dp * c.context() == 1) return "ZeRO shards over the data-parallel group: dp x cp x u = 1";
  if (c.pp > 1 && c.zero > 2) return "ZeRO-3 gathers every micro-batch's parameters: not with a pipeline (use 1 or 2)";
  if (c.pp * c.virtual_stages > s.L) return "more virtual stages than layers";
  if (c.pp > 1 && splits_backward(c.schedule) && c.recompute == Recompute::Full)
    return "full recomputation keeps no product's input for the later weight pass";
  if (c.pp > 1) {
    PipelineShape shape{c.pp, c.micro_batches, c.virtual_stages, placement_of(c.schedule)};
    const std::string shape_error = schedule_shape_error(c.schedule, shape);
    if (!shape_error.empty()) return shape_error;
  } else if (c.virtual_stages != 1) {
    return "virtual stages need a pipeline";
  }
  return "";
}
