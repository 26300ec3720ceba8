// dimension.h: one interface through which each way of splitting the work (data, tensor, pipeline,
// context and expert parallelism) brings its own parts to TrainingRun: its refusal of a model it
// cannot split, its terms of the memory forecast and of the activations' formula, its groups'
// scratch buffers under --collectives, and its rows of the theory table (what it measured next to
// its formula) with their fields of the "theory" record. Each dimension lives in a file of its own
// (dimension_data.cpp, dimension_tensor.cpp, ...), so that adding one adds a file and a line in
// make_dimensions(), not a branch in TrainingRun (docs/five_d_parallel.md, "Adding a dimension").
// Defines Parallelism (how a chapter splits a run), DimensionContext,
// StepMeasure, ReportTable, Dimension, DimensionSizes (each one's run-record fields and header words),
// make_dimensions(), activations_by_formula(), report_line(),
// report_row(), the expert dimension's refusal (expert_count_problem()) and the MoE helpers the run
// reads (moe_routed_tokens(), moe_activations_at()).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"          // CommStats
#include "comm/comm_p2p.h"      // CollectivesChoice: which algorithms --collectives runs
#include "comm/wire_format.h"   // CollectiveFormats: the recipe's bytes on the wire
#include "base/metrics.h"       // JsonObject
#include "model/model_config.h"  // GPT2Config, Recompute
#include "model/param_layout.h"  // ParamLayout, TensorParallelism, PipelineParallelism, ...
#include "parallel/theory.h"        // MemoryForecast, Prediction, Strategy

struct MoESettings;  // moe.h

// How a run is split: the data-parallel strategy and this rank's part of every other dimension. A
// field left at its default does not split the run, so a chapter names only its own dimensions:
// 01-06 a strategy, 07 the tensor split too, 08 its pipeline, 10 the positions, 11 the experts.
struct Parallelism {
  // Over the data-parallel group (grid.dp_cp(): under CP, the DP x CP ranks that hold the same
  // parameters), which splits the batch (under CP, its DP coordinate alone).
  Strategy strategy = Strategy::DP;
  // This rank's part of the model: its tensor-parallel slices, its pipeline stage (ZeRO-2's rule
  // there too, reduce_every_micro_batch), its positions, its experts. Each size is the grid's. (Each
  // initialised, {}, so that a chapter may name the first fields alone without a warning.)
  TensorParallelism tp{};
  PipelineParallelism pp{};
  ContextParallelism cp{};
  ExpertParallelism ep{};
  // A MoE model trained with a capacity and a balance loss (11, 12; moe.h), read while the run is
  // built: its experts are spread over the grid's expert-parallel group, and their gradients averaged
  // over its expert-data-parallel group. Null: a dense model, or a MoE preset on one rank of 01-07.
  const MoESettings* moe = nullptr;
  // The element counts of the gradient all-reduces a step issues over the data-parallel group, where
  // they are not one of the whole buffer (02: one a tensor; 03: one a bucket): under chapter 00's
  // collectives each one's algorithm follows its size (TrainingRun::set_gradient_all_reduces).
  std::vector<int64_t> gradient_all_reduces{};
  // Likewise a MoE model's all-reduces of its experts' gradients over their expert-data-parallel
  // group (11's runs of expert tensors, 12's expert buckets).
  std::vector<int64_t> expert_all_reduces{};
};

// Everything a dimension reads of the run, as TrainingRun resolved it: the chapter's split whole (a
// new dimension's field of Parallelism reaches its file with no line here), and what the run derived.
struct DimensionContext : Parallelism {
  GPT2Config model;  // the run's (its capacity factor and recomputation included)
  GPT2Config held;   // what this rank's model computes on: T is the positions it holds (T/cp under CP)
  const ParamLayout* layout = nullptr;         // this rank's (its tensor-parallel slices, its stage)
  const ParamLayout* global_layout = nullptr;  // the whole model's
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int micro_B = 0;          // sequences of a micro-batch
  int micro_batches = 1;    // of a step (--grad-accum, a pipeline's --micro-batches)
  std::string micro_batches_flag = "--grad-accum";  // the chapter's flag for them, which refusals name
  bool lse_attention = false;  // a log-sum-exp per query, no (B,NH,T,T) scores (ContextParallelism::lse_attention)
  int world_size = 1;
  int dp_size = 1;                   // the group the strategy runs over (under CP: DP x CP)
  bool dp_apart = false;             // that group is a communicator apart from the world's
  bool embedding_group = false;      // this rank sums the tied wte with another stage (08)
  bool expert_group = false;         // the experts are spread over an expert-parallel group (11, 12)
  CollectiveFormats formats;         // what the collectives move (a mixed-precision recipe's formats)
  CollectivesChoice collectives;     // --collectives: the library's, or chapter 00's (comm_p2p.h)
  int dp_rank = 0;                   // this rank's place in the data-parallel group
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
  // Its refusal of the run, before the layout is built and before any step: one sentence naming its
  // flag and what would be right, or "" when it can split this model (sizes that must divide).
  virtual std::string problem(const DimensionContext&) const { return ""; }
  // Its terms beside the model's own forecast (forecast_memory: the strategy's model state over the
  // layout, the arena of the positions held).
  virtual void add_memory(const DimensionContext&, MemoryForecast&) const {}
  // What it keeps beside the model's arena, in bytes, were the model's tensors split over t ranks
  // (activations_by_formula; add_memory counts the same at t = the run's TP).
  virtual double activations_beside_model(const DimensionContext&, int /*t*/) const { return 0; }
  // What its groups' staging buffers hold at most where a recipe's collectives move codes
  // (wire_format.h; docs/theory.md, section 3), under `formats`; 0 under fp32.
  virtual double wire_staging_at_most(const DimensionContext&, const CollectiveFormats&) const { return 0; }
  // Its groups that carry collectives: each gets --collectives' scratch buffers.
  virtual int collective_groups(const DimensionContext&) const { return 0; }
  // Its rows of the theory table and fields of the record.
  virtual void report_rows(const DimensionContext&, const StepMeasure&, ReportTable&) const {}
};

// What a dimension says of every run of a chapter that has it, whatever its size (1 included): its
// sizes in the run record and its words in the header's grid line. Each dimension's file defines its
// own; dimension.cpp lists them in the record's order (context, Ulysses, tensor, pipeline, expert).
struct DimensionSizes {
  const char* flag;  // the flag that sizes it: the header names it only in a chapter that takes it
  void (*record)(const Parallelism&, JsonObject&);  // its fields of the run record ("tp": 2, ...)
  std::string (*grid_words)(const Parallelism&);  // after "N data-parallel": " x 2 tensor-parallel"
};
extern const DimensionSizes kContextSizes, kUlyssesSizes, kTensorSizes, kPipelineSizes, kExpertSizes;
// Every dimension's fields of the run record, in order.
void add_dimension_sizes(const Parallelism& split, JsonObject& record);
// The header's grid after "N data-parallel": the words of each dimension whose flag the chapter takes.
std::string dimension_grid_words(const Parallelism& split, const std::function<bool(const std::string&)>& takes);

// The run's dimensions, in the order the table lists them: data, expert, context, tensor, pipeline
// (each only where it splits something).
std::vector<std::unique_ptr<Dimension>> make_dimensions(const DimensionContext& ctx);
std::unique_ptr<Dimension> make_data_dimension(const DimensionContext& ctx);
std::unique_ptr<Dimension> make_tensor_dimension(const DimensionContext& ctx);      // or null
std::unique_ptr<Dimension> make_pipeline_dimension(const DimensionContext& ctx);    // or null
std::unique_ptr<Dimension> make_context_dimension(const DimensionContext& ctx);     // or null
std::unique_ptr<Dimension> make_expert_dimension(const DimensionContext& ctx);      // or null
std::unique_ptr<Dimension> make_ulysses_dimension(const DimensionContext& ctx);     // or null
// The Ulysses exchange's buffers on this rank's positions, for a tensor split of t (0 without Ulysses).
double ulysses_activation_bytes(const DimensionContext& ctx, int t);

// Where the data-parallel group all-reduces the gradients (no ZeRO), this rank's bytes a step in it:
// the calls TrainingRun::set_gradient_all_reduces lists (else the whole buffer), each by
// collective_sent_bytes (docs/theory.md, section 15). The DP row under chapter 00's collectives, and
// 12's dp_cp group there.
double all_reduces_sent_bytes(const DimensionContext& ctx);

// ZeRO's reduce-scatters of `scattered` bytes a step in all and its gathers of `gathered` (the
// payloads, before any (N-1)/N) over the data-parallel group: this rank's bytes, each kind's by
// collective_sent_bytes, the step's calls added up as one (each algorithm's bytes are linear in the
// payload, but for the rounding of its segments).
double zero_sent_bytes(const DimensionContext& ctx, double scattered, double gathered);
// ZeRO-2's rule over a pipeline (08, 09, 12 --zero2; data_parallel.h, set_every_micro_batch): this
// rank's bytes a step over the data-parallel group, as the DP row predicts them.
double every_micro_batch_bytes(const DimensionContext& ctx);

// This rank's bytes a step in its tensor-parallel group (docs/theory.md, sections 9 and 15): the
// formula of predict_tensor_parallel under the library; under chapter 00's collectives each call's
// algorithm's bytes (collective_sent_bytes). 07's and 09's TP row, and 12's tp group.
double tensor_parallel_step_bytes(const DimensionContext& ctx);

// This rank's activations by the formula (docs/theory.md, sections 9, 12, 13) for another way of
// running its part of the model: a tensor split of t ranks (sp: sequence parallel) and `recompute`,
// on the positions held: each pipeline part's arena, and what each dimension keeps beside it
// (Dimension::activations_beside_model: the ring's blocks under CP).
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
