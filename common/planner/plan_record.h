// plan_record.h: the planner (planner.h) against the published record: Table 1 of Narayanan et al.
// 2021 (Megatron-LM on up to 3072 A100s), kept in docs/data/megatron_table1.csv. Defines RecordRow,
// read_megatron_table(), RecordComparison and compare_with_record(): calibrate the planner's one
// efficiency constant on one row, predict every row's per-GPU throughput with the paper's own
// configuration, and search each row's best grids given only its model, GPU count and batch.
#pragma once
#include <string>
#include <vector>

#include "planner/planner.h"

struct RecordRow {
  double params_b = 0;
  int heads = 0, hidden = 0, layers = 0, tp = 1, pp = 1, gpus = 1, batch = 1;
  double tflops_per_gpu = 0;  // the paper's achieved teraFLOP/s per GPU
  std::string name() const;   // "145.6B"
};

// The rows of the CSV (lines starting with '#' are its citation); config_error on a malformed file.
std::vector<RecordRow> read_megatron_table(const std::string& path);

// The paper's model: vocabulary 51,200, sequence 2,048.
GPT2Config record_model(const RecordRow& row);
// The paper's FLOPs per step, 96 B s L h^2 (1 + s/6h + V/16Lh): every block's forward four times
// (forward, recomputation, and twice in backward), the LM head's three times. Our unit_costs() with
// full recomputation counts the blocks' forward as 24h^2 + 4sh per token and replays 16h^2 + 4sh of
// it, so this is what the paper's "achieved" divides, not what we count; predictions use it to compare
// like with like.
double record_flops_per_step(const RecordRow& row);
// What the planner is given for the row: a DGX A100 cluster, the row's GPUs and batch, and the
// paper's implementation where it differs from ours: the matrices of attention (no FlashAttention
// in 2021), the gradients all-reduced after the backward (no overlap).
PlanInputs record_inputs(const RecordRow& row, double efficiency);
// The row's own configuration (t, p, d = GPUs / tp / pp, full recomputation, no ZeRO, no sequence
// parallelism; the interleaved schedule where p > 1), the micro-batch and virtual stages left to the
// planner: its fastest such configuration. Ranked by time whether or not our forecast fits it in 80 GB
// (it fitted in Megatron-LM's; RecordComparison says where ours would not).
PlanResult plan_paper_config(const RecordRow& row, double efficiency);
// The paper's teraFLOP/s per GPU for a predicted step time.
double predicted_tflops(const RecordRow& row, double step_s);
// The efficiency at which the row's own configuration is predicted at the paper's throughput.
double calibrate_efficiency(const RecordRow& row);

struct RecordComparison {
  RecordRow row;
  PlanResult paper_config;         // the paper's configuration, predicted
  double predicted_tflops = 0;
  double relative_error = 0;       // (predicted - paper) / paper
  // Given only the model, the GPUs and the batch: the best configuration per (tp, pp), best first,
  // searched with the paper's techniques (data, tensor and pipeline parallelism, 1f1b or interleaved,
  // recomputation full or none; no ZeRO, no sequence parallelism, no zero-bubble schedule), and where
  // the paper's (tp, pp) stands among them (0 = first; -1: absent, nothing of it fits).
  std::vector<PlanResult> best;
  int paper_grid_rank = -1;
  PlanResult best_today;           // the best with everything the planner knows (ZeRO, SP, zb-h1, selective)
};
// Calibrates on rows[calibration], then compares every row.
std::vector<RecordComparison> compare_with_record(const std::vector<RecordRow>& rows, int calibration,
                                                  double* efficiency);
