// dimension.h: one interface through which each way of splitting the work (data, tensor, pipeline,
// context and expert parallelism) brings its own parts to TrainingRun: its terms of the memory
// forecast, its groups' scratch buffers under --collectives, and its rows of the theory table (what
// it measured next to its formula) with their fields of the "theory" record. Each dimension lives in
// a file of its own (dimension_data.cpp, dimension_tensor.cpp, ...), so that adding one adds a file
// and a line in make_dimensions(), not a branch in TrainingRun. Defines DimensionContext,
// StepMeasure, ReportTable, Dimension, make_dimensions(), activations_by_formula(), report_line(),
// report_row(), the expert dimension's refusal (expert_count_problem()) and the MoE helpers the run
// reads (moe_routed_tokens(), moe_activations_at()).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"          // CommStats
#include "base/metrics.h"       // JsonObject
#include "model/model_config.h"  // GPT2Config, Recompute
#include "model/param_layout.h"  // ParamLayout, TensorParallelism, PipelineParallelism, ...
#include "parallel/theory.h"        // MemoryForecast, Prediction, Strategy

// Everything a dimension reads of the run, as TrainingRun resolved it.
struct DimensionContext {
  GPT2Config model;  // the run's (its capacity factor and recomputation included)
  GPT2Config held;   // what this rank's model computes on: T is the positions it holds (T/cp under CP)
  const ParamLayout* layout = nullptr;         // this rank's (its tensor-parallel slices, its stage)
  const ParamLayout* global_layout = nullptr;  // the whole model's
  Strategy strategy = Strategy::DP;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int micro_B = 0;          // sequences of a micro-batch
  int micro_batches = 1;    // of a step (--grad-accum, a pipeline's --micro-batches)
  bool lse_attention = false;  // FlashAttention or the ring: a log-sum-exp per query, no (B,NH,T,T) scores
  int world_size = 1;
  int dp_size = 1;                   // the group the strategy runs over (under CP: DP x CP)
  bool dp_apart = false;             // that group is a communicator apart from the world's
  bool embedding_group = false;      // this rank sums the tied wte with another stage (08)
  bool expert_group = false;         // the experts are spread over an expert-parallel group (11, 12)
  TensorParallelism tp;
  PipelineParallelism pp;
  ContextParallelism cp;
  ExpertParallelism ep;
};

// What one step measured, for the theory table.
struct StepMeasure {
  CommStats data;  // the data-parallel group's (the world's where it is the run's only group)
  std::vector<std::pair<std::string, CommStats>> groups;  // every group's, by name ("tp", "pp", ...)
  // A MoE model's routing (TrainingRun::end_step's expert_rows): (micro-batches) x (L); empty: not given.
  std::vector<std::vector<int64_t>> expert_rows;
  const CommStats* group(const std::string& name) const;  // null where the run has no such group
};

// The theory table as the dimensions fill it; TrainingRun prints it in this order: the heading, the
// model state, the activations and the notes under them, the transient buffers, then the
// communication rows; the record takes `json` after the fields every run has.
struct ReportTable {
  Prediction strategy;      // the data-parallel strategy's memory and communication (the data
                            // dimension's own where the gradients travel otherwise: ZeRO-2's rule, 11)
  std::string params_split;  // after "Ψ = N" in the heading: how a dimension splits this rank's Ψ
  double activations = 0;   // theory: the forecast's, unless a dimension knows the step's
  std::string activations_label = "activations";
  std::vector<std::string> activation_notes;  // lines under the activations row
  bool recompute_note = false;  // a dimension that splits the activations asks for the recompute line
  double transient = 0;     // theory: the forecast's bound, unless a dimension knows the step's
  std::string transient_label = "communication buffers";
  std::string transient_theory = "at most";
  std::vector<std::string> comm_rows;  // the last lines: bytes and collectives next to theory
  JsonObject json;
};

class Dimension {
 public:
  virtual ~Dimension();
  virtual const char* name() const = 0;
  // Its terms beside the model's own forecast (forecast_memory: the strategy's model state over the
  // layout, the arena of the positions held).
  virtual void add_memory(const DimensionContext&, MemoryForecast&) const {}
  // Its groups that carry collectives: each gets --collectives' scratch buffers.
  virtual int collective_groups(const DimensionContext&) const { return 0; }
  // Its rows of the theory table and fields of the record.
  virtual void report_rows(const DimensionContext&, const StepMeasure&, ReportTable&) const {}
};

// The run's dimensions, in the order the table lists them: data, expert, context, tensor, pipeline
// (each only where it splits something).
std::vector<std::unique_ptr<Dimension>> make_dimensions(const DimensionContext& ctx);
std::unique_ptr<Dimension> make_data_dimension(const DimensionContext& ctx);
std::unique_ptr<Dimension> make_tensor_dimension(const DimensionContext& ctx);      // or null
std::unique_ptr<Dimension> make_pipeline_dimension(const DimensionContext& ctx);    // or null
std::unique_ptr<Dimension> make_context_dimension(const DimensionContext& ctx);     // or null
std::unique_ptr<Dimension> make_expert_dimension(const DimensionContext& ctx);      // or null

// This rank's activations by the formula (docs/theory.md, sections 9, 12, 13) for another way of
// running its part of the model: a tensor split of t ranks (sp: sequence parallel) and `recompute`,
// the positions held and the ring's blocks under CP, each pipeline part's arena.
double activations_by_formula(const DimensionContext& ctx, int t, bool sp, Recompute recompute);

// The expert dimension's refusal (chapters 11 and 12), before any group exists: an --ep that does not
// divide the model's experts, as one sentence naming --ep and the values that would work: those that
// divide the experts and, given stage_ranks > 0, the ranks the expert-parallel groups fold over (each
// of `stages` pipeline stages' DP x CP x TP). "" when it divides, or for a dense model.
std::string expert_count_problem(const GPT2Config& model, int ep, int stage_ranks, int stages = 1);

// A MoE model: the rows this rank routes per micro-batch (B T, over cp, over t under SP), and its
// layers' activations at `rows` (micro-batches x L; empty: at the bound), 0 for a dense model.
int64_t moe_routed_tokens(const DimensionContext& ctx);
double moe_activations_at(const DimensionContext& ctx, const std::vector<std::vector<int64_t>>& rows);

// A line of the table, printf-style (no newline), and a row: what, measured and theory in bytes.
std::string report_line(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string report_row(const char* what, double measured, double theory);
