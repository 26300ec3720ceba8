// pipeline_costs.cpp: see pipeline_costs.h.
#include "pipeline/pipeline_costs.h"

#include <numeric>

#include "base/check.h"
#include "pipeline/pipeline.h"

namespace {

// The units (0 the embedding, 1..L the blocks, L+1 the head) of virtual stage s of a partition.
std::pair<int, int> units_of(const GPT2Config& cfg, const std::vector<int>& blocks, int s) {
  const ModelPart part = parts_of_rank(cfg, blocks, int(blocks.size()), s)[0];
  return {part.first_unit, part.last(cfg)};
}

void check_partition(const GPT2Config& cfg, const std::vector<int>& blocks, const char* what) {
  ENSURE(!blocks.empty() && std::accumulate(blocks.begin(), blocks.end(), 0) == cfg.L,
         std::string("carry_costs: the ") + what + " partition does not hold the model's L blocks");
}

}  // namespace

ActionCosts carry_costs(const GPT2Config& cfg, const std::vector<int>& measured_blocks,
                        const std::vector<PassCosts>& measured, const std::vector<int>& blocks,
                        const PipelineShape& shape, Schedule schedule) {
  check_partition(cfg, measured_blocks, "measured");
  check_partition(cfg, blocks, "target");
  ENSURE(measured.size() == measured_blocks.size(), "carry_costs: one PassCosts per measured virtual stage");
  ENSURE(int(blocks.size()) == shape.virtual_stages(), "carry_costs: one block count per virtual stage");
  const std::vector<double> flops = unit_costs(cfg);
  // Each unit's share of its measured stage's time: its FLOPs over the stage's (the embedding has
  // none: its lookup's time stays with the blocks of its stage).
  std::vector<PassCosts> unit(flops.size());
  for (size_t i = 0; i < measured.size(); i++) {
    const auto [first, last] = units_of(cfg, measured_blocks, int(i));
    double stage_flops = 0;
    for (int u = first; u <= last; u++) stage_flops += flops[u];
    for (int u = first; u <= last; u++) {
      const double share = flops[u] / stage_flops;
      unit[u] = {measured[i].forward * share, measured[i].backward * share, measured[i].weight * share};
    }
  }
  const bool split = splits_backward(schedule);
  ActionCosts costs;
  const int S = shape.virtual_stages();
  costs.forward.assign(S, 0), costs.backward.assign(S, 0), costs.weight.assign(S, 0);
  for (int s = 0; s < S; s++) {
    const auto [first, last] = units_of(cfg, blocks, s);
    for (int u = first; u <= last; u++) {
      costs.forward[s] += unit[u].forward;
      costs.backward[s] += split ? unit[u].backward : unit[u].backward + unit[u].weight;
      if (split) costs.weight[s] += unit[u].weight;
    }
  }
  return costs;
}
