// pipeline_ideal.cpp: the ideal step of one of chapter 08's schedules, simulated (pipeline_simulate.h)
// with pass times given on the command line, so that every schedule can be simulated with the same
// ones (make schedules: the six ideal panels share the pass times measured once, by zb-h1's run,
// the one that times B and W apart; scripts/bench/schedules.sh). Writes JSON lines to stdout in the records
// 08 itself writes: one "pipeline" record (schedule, p, m, v, the simulated step and bubble, the
// theory's bubble) and one "simulated_action" per pass, which scripts/bench/plot_pipeline.py draws.
//
//   build/pipeline_ideal --preset deep --pp 4 --micro-batches 8 --schedule interleaved
//       --measured 1.2/2.0/1.5,1.1/1.9/1.4,1.1/1.9/1.4,1.3/2.1/1.6 --measured-by zb-h1
// --measured: F/B/W in ms per stage of a run with one chunk per rank (B the inputs' gradients, W the
// weights'; W = 0 where the run did not split backward), on --measured-partition (default: balanced
// by FLOPs, as 08 partitions without --partition). pipeline_costs.h carries them to the schedule's
// partition (--partition, default balanced over p x v virtual stages).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "training/flags.h"
#include "base/metrics.h"
#include "model/model_config.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_costs.h"
#include "pipeline/pipeline_report.h"  // simulated_action_record
#include "schedule/pipeline_schedule.h"
#include "schedule/pipeline_simulate.h"

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, separator)) items.push_back(item);
  return items;
}

double parse_number(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(x >= 0)) config_error(flag + ": '" + text + "' is not a time in ms >= 0");
  return x;
}

std::vector<int> parse_blocks(const std::string& text, const std::string& flag) {
  std::vector<int> blocks;
  for (const std::string& item : split(text, ',')) {
    const double n = parse_number(item, flag);
    if (n < 1 || n != int(n)) config_error(flag + " " + text + ": a block count per virtual stage, each >= 1");
    blocks.push_back(int(n));
  }
  return blocks;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "deep", schedule_text = "1f1b", matching_text = "tag", measured_text, partition, measured_partition,
              measured_by = "the measured run";
  int p = 0, m = 0, v = 0;
  FlagParser flags;
  flags.add("--preset", &preset, "the model the passes were measured on");
  flags.add("--pp", &p, "pipeline stages p");
  flags.add("--micro-batches", &m, "micro-batches per step m (default 2 p)");
  flags.add("--schedule", &schedule_text, "afab, 1f1b, interleaved, zb-h1, zb-v or dualpipev");
  flags.add("--virtual-stages", &v, "chunks per rank v (default 2 for interleaved, zb-v and dualpipev, else 1)");
  flags.add("--p2p-matching", &matching_text, "tag or call-order: where the lists post their receives");
  flags.add("--measured", &measured_text, "F/B/W ms per measured stage, comma-separated", "F/B/W,...");
  flags.add("--measured-by", &measured_by, "which run measured them, for the plot's title", "NAME");
  flags.add("--measured-partition", &measured_partition, "blocks per measured stage (default: balanced)", "N,N,...");
  flags.add("--partition", &partition, "blocks per virtual stage of the schedule (default: balanced)", "N,N,...");
  if (!flags.parse(argc, argv, "usage: pipeline_ideal --pp P --measured F/B/W,... [flags]\n")) return 0;

  GPT2Config cfg;
  if (!find_preset(preset, &cfg)) config_error("--preset " + preset + ": choose one of " + preset_names());
  Schedule schedule;
  if (!parse_schedule(schedule_text, &schedule)) config_error("--schedule " + schedule_text + ": choose " + schedule_names());
  Matching matching;
  if (!parse_matching(matching_text, &matching)) config_error("--p2p-matching " + matching_text + ": choose tag or call-order");
  if (p < 1) config_error("--pp: give the pipeline's stages, >= 1");
  PipelineShape shape;
  shape.stages = p;
  shape.micro_batches = m ? m : 2 * p;
  shape.placement = placement_of(schedule);  // zb-v, dualpipev: the V
  shape.chunks = v ? v : schedule == Schedule::Interleaved || shape.placement == Placement::V ? 2 : 1;
  const std::string shape_error = schedule_shape_error(schedule, shape);
  if (!shape_error.empty()) config_error(shape_error);
  if (shape.virtual_stages() > cfg.L)
    config_error("p x v = " + std::to_string(shape.virtual_stages()) + " virtual stages, more than the " +
                 std::to_string(cfg.L) + " blocks of --preset " + preset);

  std::vector<PassCosts> measured;
  for (const std::string& stage : split(measured_text, ',')) {
    const std::vector<std::string> t = split(stage, '/');
    if (t.size() != 3) config_error("--measured " + measured_text + ": F/B/W per stage, e.g. 1.2/2.0/1.5,1.1/1.9/1.4");
    measured.push_back({parse_number(t[0], "--measured"), parse_number(t[1], "--measured"), parse_number(t[2], "--measured")});
  }
  if (measured.empty()) config_error("--measured: give F/B/W per stage of the measured run");
  if (int(measured.size()) > cfg.L) config_error("--measured: more stages than the preset's blocks");
  const std::vector<int> from = measured_partition.empty() ? balanced_partition(cfg, int(measured.size()))
                                                           : parse_blocks(measured_partition, "--measured-partition");
  const std::vector<int> to = partition.empty() ? balanced_partition(cfg, shape.virtual_stages())
                                                : parse_blocks(partition, "--partition");
  int from_sum = 0, to_sum = 0;
  for (int b : from) from_sum += b;
  for (int b : to) to_sum += b;
  if (from.size() != measured.size() || from_sum != cfg.L)
    config_error("--measured-partition: " + std::to_string(measured.size()) + " block counts adding up to L = " + std::to_string(cfg.L));
  if (int(to.size()) != shape.virtual_stages() || to_sum != cfg.L)
    config_error("--partition: " + std::to_string(shape.virtual_stages()) + " block counts adding up to L = " + std::to_string(cfg.L));

  const ActionCosts costs = carry_costs(cfg, from, measured, to, shape, schedule);
  const Simulation sim = simulate(schedule, shape, costs, matching);
  if (!sim.deadlock.empty()) config_error("the simulation deadlocked: " + sim.deadlock);
  double F = 0, B = 0, W = 0;
  const int S = shape.virtual_stages();
  for (int s = 0; s < S; s++) F += costs.forward[s] / S, B += costs.backward[s] / S, W += costs.weight[s] / S;
  std::printf("%s\n", JsonObject()
                          .add("type", "pipeline")
                          .add("schedule", schedule_name(schedule))
                          .add("matching", matching_name(matching))
                          .add("p", p)
                          .add("m", shape.micro_batches)
                          .add("v", shape.chunks)
                          .add("theory_formula", theory_bubble_formula(schedule))
                          .add("theory_bubble", theory_bubble(schedule, shape, F, B, W))
                          .add("simulated_bubble", sim.bubble())
                          .add("simulated_step_ms", sim.makespan)
                          .add("pass_ms_total", (F + B + W) * S * shape.micro_batches)
                          .add("measured_by", measured_by)
                          .str()
                          .c_str());
  for (const SimulatedAction& a : sim.actions) {
    if (a.end <= a.start) continue;  // sends and receive posts take no time
    std::printf("%s\n", simulated_action_record(a).str().c_str());
  }
  return 0;
}
