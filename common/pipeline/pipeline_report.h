// pipeline_report.h: what chapter 08 prints next to theory: the partition of the blocks over the
// stages, and, at the end of the run, per rank, the bubble (measured, simulated with the measured
// times, and by the schedule's formula), the activations held against the schedule's count of
// micro-batches in flight, the point-to-point bytes and the message buffers against their formulas,
// and the embedding group's bytes (the tied wte's gradient summed over the first and last stage)
// against theirs; with dualpipev's F&B pairs run at once, per rank the time the two lanes of its pairs
// ran side by side. Defines print_partition() and PipelineReport.
#pragma once
#include <vector>

#include "pipeline/pipeline.h"
#include "schedule/pipeline_schedule.h"
#include "schedule/pipeline_simulate.h"  // SimulatedAction
#include "comm/process_grid.h"
#include "training/training_run.h"

// Root prints one line per virtual stage: its rank and chunk, its units, parameters and share of the
// forward FLOPs (the embedding's lookup costs nothing, the LM head over V costs blocks' worth).
void print_partition(const TrainingRun& run, const GPT2Config& cfg, const std::vector<int>& blocks, int stages,
                     Placement placement = Placement::Loop);

// One action of a simulated step as a JSON record ("simulated_action": stage, op, micro, chunk,
// start_ms, end_ms), the form the pipeline diagrams read (scripts/bench/plot_pipeline.py), for 08's
// measured runs and for make schedules' ideal ones alike.
JsonObject simulated_action_record(const SimulatedAction& action);

class PipelineReport {
 public:
  // parts: this rank's model parts, as its chunks run them (with their slots).
  PipelineReport(TrainingRun& run, const ProcessGrid& grid, const PipelineShape& shape, Schedule schedule,
                 Matching matching, std::vector<ModelPart> parts);
  // After each step's pipeline: its times (step 0, the warm-up, is left out) and point-to-point bytes.
  void add_step(int step, const PipelineExecutor::Times& times);
  // Collective: every rank's averages to root, which prints the table and writes JSON records
  // ("pipeline", "pipeline_stage" per stage, and "simulated_action" per action of the simulated
  // step, for the diagram). `wte_copies_equal`: root's pipeline's two copies of wte, compared.
  void finish(bool wte_copies_equal);

 private:
  TrainingRun& run_;
  Communicator& world_;
  Communicator& pipeline_;
  PipelineShape shape_;
  Schedule schedule_;
  Matching matching_;  // the simulation runs the lists the executor ran
  std::vector<ModelPart> parts_;
  int steps_ = 0;
  std::vector<double> forward_, backward_, weight_;  // per chunk, summed over the measured steps
  std::vector<double> pair_;                          // per chunk of a pair's forward, likewise
  double pairs_ = 0, pair_ms_ = 0, pair_passes_ms_ = 0;  // F&B pairs run at once (PipelineExecutor::Times)
  double waiting_ = 0, step_ = 0, p2p_bytes_ = 0, embedding_bytes_ = 0;
  double buffer_bytes_ = 0;  // the executor's message buffers
  Communicator* embedding_;  // the first and last stage's group (wte's two copies); null elsewhere
  CommStats pipeline_before_, embedding_before_;
};
