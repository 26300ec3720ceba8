// 09_3d_parallel/plan_records.cpp: the planner against a whole table at once: Megatron-LM's Table 1,
// each row's own configuration predicted on dgx-a100 with its `plan --one` command (run_megatron), and
// the heat map of the best configuration per model, node count and sequence length (run_heatmap).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"    // config_error, ENSURE
#include "base/metrics.h"  // format_count
#include "planner/plan_published.h"  // one_command
#include "planner/plan_record.h"     // read_megatron_table, compare_with_record, record_inputs
#include "planner/planner.h"
#include "plan_options.h"

int run_megatron(const Options& opt) {
  const std::vector<RecordRow> rows = read_megatron_table(opt.megatron);
  if (opt.calibration_row < 0 || opt.calibration_row >= int(rows.size()))
    config_error("--calibration-row " + std::to_string(opt.calibration_row) + ": the table has rows 0.." +
                 std::to_string(rows.size() - 1));
  double efficiency = 0;
  const std::vector<RecordComparison> cmp = compare_with_record(rows, opt.calibration_row, &efficiency);
  Cluster a100;
  find_cluster("dgx-a100", &a100);
  std::printf("Megatron-LM, Table 1 (Narayanan et al. 2021) against the planner: DGX A100 80GB, 312 TFLOP/s bf16, "
              "NVLink in a node, 8 x 200 Gb/s InfiniBand a node\n");
  std::printf("efficiency calibrated on the %s row (t %d, p %d, %d GPUs): %.4f (plan's default: %.4f)\n",
              rows[opt.calibration_row].name().c_str(), rows[opt.calibration_row].tp, rows[opt.calibration_row].pp,
              rows[opt.calibration_row].gpus, efficiency, a100.efficiency);
  std::printf("the paper's configuration: its t, p, d and batch, full recomputation, interleaved where p > 1, the "
              "gradients all-reduced after the backward, attention's matrices; micro-batch and v the planner's fastest\n\n");
  std::printf("%-8s %3s %3s %4s %5s %5s | %8s %9s %7s | %-19s %-6s | %-7s %s\n", "model", "t", "p", "d", "GPUs", "batch",
              "paper TF", "predicted", "error", "predicted (B m v)", "fits?", "(t,p) #", "planner's best with the paper's techniques");
  int within = 0, in_top5 = 0;
  for (const RecordComparison& c : cmp) {
    const RecordRow& r = c.row;
    const PlanConfig& pc = c.paper_config.config;
    char chosen[64];
    std::snprintf(chosen, sizeof(chosen), "B %d m %d v %d", pc.micro_batch, pc.micro_batches, pc.virtual_stages);
    const std::string rank = c.paper_grid_rank < 0 ? "-" : "#" + std::to_string(c.paper_grid_rank + 1);
    const std::string best = c.best.empty() || !c.best.front().fits ? "nothing fits" : c.best.front().config.describe();
    std::printf("%-8s %3d %3d %4d %5d %5d | %8.0f %9.1f %+6.1f%% | %-19s %-6s | %-7s %s\n", r.name().c_str(), r.tp, r.pp,
                r.gpus / (r.tp * r.pp), r.gpus, r.batch, r.tflops_per_gpu, c.predicted_tflops, 100 * c.relative_error,
                chosen, c.paper_config.fits ? "yes" : "no", rank.c_str(), best.c_str());
    std::printf("    $ %s\n", one_command(record_inputs(r, efficiency), pc).c_str());
    within += std::abs(c.relative_error) <= 0.15;
    in_top5 += c.paper_grid_rank >= 0 && c.paper_grid_rank < 5;
  }
  std::printf("\n%d of %zu rows predicted within 15%%; the paper's (t, p) among the planner's top five (t, p) in %d of %zu "
              "(searched with the paper's techniques, given only model, GPUs and batch)\n",
              within, cmp.size(), in_top5, cmp.size());
  for (const RecordComparison& c : cmp) {
    if (!c.paper_config.fits)
      std::printf("%s: our trainers' forecast does not fit the paper's configuration: %s\n", c.row.name().c_str(),
                  c.paper_config.overflow.c_str());
    if (c.paper_grid_rank >= 0 && c.paper_grid_rank < 5) continue;
    const PlanResult& best = c.best.front();
    if (!best.fits) {
      std::printf("%s: with the paper's techniques nothing fits our trainers' forecast (the least short: %s, %s)\n",
                  c.row.name().c_str(), best.config.describe().c_str(), best.overflow.c_str());
      continue;
    }
    std::printf("%s: the planner prefers %s, predicted %s a step against %s for the paper's configuration%s\n",
                c.row.name().c_str(), best.config.describe().c_str(), seconds(best.step_s).c_str(),
                seconds(c.paper_config.step_s).c_str(), c.paper_config.fits ? "" : " (which our forecast does not fit)");
  }
  std::printf("\nwith every technique the planner knows (ZeRO, sequence parallelism, zb-h1, selective recomputation):\n");
  for (const RecordComparison& c : cmp)
    std::printf("  %-8s %-62s %s a step (%+.0f%% against the paper's configuration)\n", c.row.name().c_str(),
                c.best_today.config.describe().c_str(), seconds(c.best_today.step_s).c_str(),
                100 * (c.best_today.step_s / c.paper_config.step_s - 1));
  return within == int(cmp.size()) ? 0 : 1;
}

namespace {

// One cell of the heat map: the best configuration for `in`, as a CSV row under `panel`.
void heatmap_cell(std::FILE* out, const char* panel, const std::string& label, const PlanInputs& in, int nodes) {
  SearchSpace space;
  space.recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  space.ulysses = {1};  // a cell names five degrees (t c p d e): the map is drawn without Ulysses
  const std::vector<PlanResult> results = search_plans(in, space, 8);
  const ModelShape m = plan_shape(in);
  std::fprintf(out, "%s,%s,%g,%d,%d,%d,%d,%g,", panel, label.c_str(), total_params(m), m.T, nodes, in.gpus, in.batch,
               in.efficiency);
  if (results.empty() || !results.front().fits) {
    std::fprintf(out, "0,,,,,,,,,,,,,,,0,%g\n", results.empty() ? 0.0 : results.front().memory.peak());
    return;
  }
  const PlanResult& r = results.front();
  const PlanConfig& c = r.config;
  std::fprintf(out, "1,%d,%d,%d,%d,%d,%s,%d,%d,%d,%d,%s,%d,%g,%g,%g\n", c.dp, c.tp, c.pp, c.cp, c.ep,
               c.pp > 1 ? schedule_name(c.schedule) : "-", c.virtual_stages, c.micro_batch, c.micro_batches, c.zero,
               recompute_name(c.recompute), c.sequence_parallel ? 1 : 0, r.step_s, r.mfu, r.memory.peak());
}

}  // namespace

// Three panels on nodes of 8 H100s, 16M tokens a batch (Llama 3 405B's): dense models and mixtures of
// experts over 1 to 512 nodes, and one model over the sequence length on 64 nodes.
int run_heatmap(const Options& opt) {
  std::FILE* out = std::fopen(opt.heatmap.c_str(), "w");
  if (!out) config_error("--heatmap: cannot write " + opt.heatmap);
  Cluster h100;
  find_cluster("dgx-h100", &h100);
  const double efficiency = opt.efficiency > 0 ? opt.efficiency : h100.efficiency;
  const double tokens = 16.0 * 1024 * 1024;
  std::fprintf(out, "panel,model,params,T,nodes,gpus,batch,efficiency,fits,dp,tp,pp,cp,ep,schedule,v,micro_batch,"
                    "micro_batches,zero,recompute,sp,step_s,mfu,peak_bytes\n");
  std::printf("heat map: nodes of 8 H100s, %s tokens a batch, efficiency %.3f\n", format_count(tokens).c_str(),
              efficiency);
  auto inputs = [&](const std::string& model, int T, int nodes) {
    PlanInputs in;
    if (model == "gpt-1t") {  // Megatron-LM's proportions at 1T (gpt_like_model), as a published GPT
      in.shape = shape_of(gpt_like_model(1e12));
      in.shape.name = model, in.shape.tied = false, in.shape.learned_positions = false, in.shape.T = 4096;
      in.shape.V = 131072;
      in.chapters_model = false;
    } else {
      ENSURE(set_plan_model(model, &in), "heat map: no model " + model);
    }
    if (T > 0) set_sequence_length(&in, T);
    find_cluster("dgx-h100", &in.cluster);
    in.gpus = nodes * in.cluster.gpus_per_node;
    in.batch = int(tokens / in.shape.T);
    in.efficiency = efficiency;
    in.tp_overlap = true;
    return in;
  };
  const std::vector<std::pair<std::string, std::string>> dense = {
      {"llama3-8b", "Llama 3 8B"}, {"llama3-70b", "Llama 3 70B"}, {"mcore-177b", "GPT 177B"},
      {"llama3-405b", "Llama 3 405B"}, {"gpt-1t", "GPT 1T"}};
  const std::vector<std::pair<std::string, std::string>> moe = {{"gpt-oss-120b", "GPT-OSS 120B"},
                                                                {"deepseek-v3", "DeepSeek-V3 671B"}};
  for (const auto& panel : {std::make_pair("dense", dense), std::make_pair("moe", moe)}) {
    for (const auto& [model, label] : panel.second) {
      for (int nodes = 1; nodes <= 512; nodes *= 2) heatmap_cell(out, panel.first, label, inputs(model, 0, nodes), nodes);
      std::printf("  %s done\n", label.c_str());
      std::fflush(stdout);
    }
  }
  for (int T = 8192; T <= 131072; T *= 2) heatmap_cell(out, "sequence", "Llama 3 70B", inputs("llama3-70b", T, 64), 64);
  std::printf("  Llama 3 70B over the sequence length done\n");
  std::fclose(out);
  std::printf("wrote %s\n", opt.heatmap.c_str());
  return 0;
}
