// plan_record.cpp: the Megatron-LM Table 1 comparison of plan_record.h.
#include "planner/plan_record.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/check.h"

std::string RecordRow::name() const {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1fB", params_b);
  return text;
}

namespace {

// What makes a row no configuration at all, or "": sizes that must be positive and divide.
std::string row_problem(const RecordRow& r) {
  if (r.heads < 1 || r.hidden < 1 || r.layers < 1) return "heads, hidden size and layers must be positive";
  if (r.hidden % r.heads) return "the hidden size " + std::to_string(r.hidden) + " does not divide by the heads";
  if (r.tp < 1 || r.pp < 1) return "t = " + std::to_string(r.tp) + " and p = " + std::to_string(r.pp) + " must be >= 1";
  if (r.gpus < 1 || r.gpus % (r.tp * r.pp))
    return std::to_string(r.gpus) + " GPUs do not divide into t x p = " + std::to_string(r.tp * r.pp);
  if (r.pp > r.layers) return "p = " + std::to_string(r.pp) + " stages for " + std::to_string(r.layers) + " layers";
  if (r.batch < 1 || r.batch % (r.gpus / (r.tp * r.pp)))
    return "the batch " + std::to_string(r.batch) + " does not divide over d = " + std::to_string(r.gpus / (r.tp * r.pp));
  if (!(r.tflops_per_gpu > 0) || !(r.params_b > 0)) return "the parameters and teraFLOP/s must be positive";
  return "";
}

}  // namespace

std::vector<RecordRow> read_megatron_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) config_error("cannot read " + path + " (the Megatron-LM Table 1 data, docs/data/megatron_table1.csv)");
  std::vector<RecordRow> rows;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {  // the column names
      header = false;
      continue;
    }
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream fields(line);
    RecordRow r;
    double percent = 0, aggregate = 0;
    if (!(fields >> r.params_b >> r.heads >> r.hidden >> r.layers >> r.tp >> r.pp >> r.gpus >> r.batch >>
          r.tflops_per_gpu >> percent >> aggregate))
      config_error(path + ": cannot read the row '" + line + "'");
    const std::string problem = row_problem(r);
    if (!problem.empty()) config_error(path + ": the row '" + line + "': " + problem);
    rows.push_back(r);
  }
  if (rows.empty()) config_error(path + ": no rows");
  return rows;
}

GPT2Config record_model(const RecordRow& row) {
  GPT2Config c;
  c.preset = "megatron-" + row.name();
  c.L = row.layers, c.C = row.hidden, c.NH = row.heads, c.T = 2048, c.V = 51200;
  // The planner's name for it (megatron-146b, ...), so that a printed command can name it.
  std::istringstream names(plan_model_names());
  std::string name;
  while (std::getline(names >> std::ws, name, ',')) {
    GPT2Config named;
    if (name.rfind("megatron-", 0) == 0 && find_plan_model(name, &named) && named.L == c.L && named.C == c.C &&
        named.NH == c.NH && named.T == c.T && named.V == c.V)
      c.preset = name;
  }
  return c;
}

double record_flops_per_step(const RecordRow& row) {
  const double B = row.batch, s = 2048, L = row.layers, h = row.hidden, V = 51200;
  return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
}

PlanInputs record_inputs(const RecordRow& row, double efficiency) {
  PlanInputs in;
  in.model = record_model(row);
  find_cluster("dgx-a100", &in.cluster);
  in.gpus = row.gpus, in.batch = row.batch, in.efficiency = efficiency;
  in.flash_attention = false;
  in.dp_overlap = false;
  return in;
}

PlanResult plan_paper_config(const RecordRow& row, double efficiency) {
  SearchSpace space;
  space.tp = {row.tp}, space.pp = {row.pp};
  space.zero = {0}, space.recompute = {Recompute::Full}, space.sequence_parallel = {false};
  space.schedules = {row.pp > 1 ? Schedule::Interleaved : Schedule::OneFOneB};
  space.require_fit = false;
  const std::vector<PlanResult> results = search_plans(record_inputs(row, efficiency), space, 4);
  ENSURE(!results.empty(), "plan_paper_config: no configuration for the row " + row.name());
  return results.front();
}

double predicted_tflops(const RecordRow& row, double step_s) {
  return record_flops_per_step(row) / step_s / row.gpus / 1e12;
}

double calibrate_efficiency(const RecordRow& row) {
  // Throughput grows with the efficiency: bisect.
  double low = 0.05, high = 1.0;
  for (int i = 0; i < 30; i++) {  // to 1e-9
    const double mid = (low + high) / 2;
    const PlanResult r = plan_paper_config(row, mid);
    (predicted_tflops(row, r.step_s) < row.tflops_per_gpu ? low : high) = mid;
  }
  return std::round((low + high) / 2 * 1e4) / 1e4;  // what a printed command carries
}

std::vector<RecordComparison> compare_with_record(const std::vector<RecordRow>& rows, int calibration,
                                                  double* efficiency) {
  ENSURE(calibration >= 0 && calibration < int(rows.size()), "compare_with_record: no such calibration row");
  const double e = calibrate_efficiency(rows[calibration]);
  if (efficiency) *efficiency = e;
  std::vector<RecordComparison> out;
  for (const RecordRow& row : rows) {
    RecordComparison c;
    c.row = row;
    c.paper_config = plan_paper_config(row, e);
    c.predicted_tflops = predicted_tflops(row, c.paper_config.step_s);
    c.relative_error = (c.predicted_tflops - row.tflops_per_gpu) / row.tflops_per_gpu;
    // Given only the model, the GPUs and the batch, on the paper's hardware and attention.
    const PlanInputs in = record_inputs(row, e);
    SearchSpace paper_techniques;
    paper_techniques.zero = {0};
    paper_techniques.recompute = {Recompute::None, Recompute::Full};
    paper_techniques.sequence_parallel = {false};
    paper_techniques.schedules = {Schedule::OneFOneB, Schedule::Interleaved};
    c.best = best_per_grid(in, search_plans(in, paper_techniques));
    c.best_today = search_plans(in).front();
    for (size_t i = 0; i < c.best.size(); i++)
      if (c.best[i].fits && c.best[i].config.tp == row.tp && c.best[i].config.pp == row.pp) {
        c.paper_grid_rank = int(i);
        break;
      }
    out.push_back(c);
  }
  return out;
}
