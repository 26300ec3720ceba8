// training_run.h: the mechanics every chapter shares, so a chapter's own file holds only its idea.
// Defines MicroBatch and TrainingRun: the run's settings (from the flags, else the checkpoint being
// resumed, else the preset), every check that can fail before the work (sizes that must divide,
// output paths that must be writable, a memory forecast that must fit), the dtype (--dtype: fp32, or
// bf16 mixed precision on a GPU), the model configuration and flat layout, this rank's micro-batches
// (on the run's device), the learning rate, initial weights or a resumed checkpoint, per-step metrics
// (step line, JSON lines, memory and communication next to theory, MFU on GPUs), periodic
// checkpoints, the trace, and an orderly stop of every rank on Ctrl-C or a diverging loss. Each
// dimension that splits the run (dimension.h) brings its own refusal, its own terms to the forecast
// and its own rows to the theory table. TrainingRun takes the chapter's Parallelism (dimension.h:
// how a run is split) whole, in its one constructor, so that a new dimension is a field there and a
// file of its own, never another constructor or a setter for the chapter to call.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "training/checkpoint.h"
#include "comm/comm.h"
#include "training/data.h"
#include "ops/device.h"
#include "parallel/dimension.h"
#include "training/flags.h"
#include "ops/memory.h"
#include "ops/ops.h"  // MatmulByRows
#include "base/metrics.h"
#include "model/model_config.h"
#include "training/optimizer.h"
#include "model/model.h"  // TensorParallelism
#include "model/moe.h"    // MoESettings
#include "model/param_layout.h"
#include "comm/process_grid.h"
#include "parallel/theory.h"

class MixedPrecision;  // mixed_precision.h: --precision, applied for the chapter

// The micro-batches of a step that resuming cfg.resume keeps for a mixture of experts: the
// checkpoint's, when it was trained with a capacity or a balance loss (both are per micro-batch,
// moe.h, so another count follows another trajectory); 0 when it keeps none (no --resume, a dense
// model or checkpoint, neither setting). A chapter that fixes its micro-batches before the run (12,
// whose pipeline schedule is built for them) takes it as the default of its flag; TrainingRun
// refuses another count it is given. Collective: rank 0 reads the header.
int micro_batches_a_resume_keeps(Communicator& world, const TrainConfig& cfg, const GPT2Config& model);

struct MicroBatch {
  const int* inputs;   // (B,T), on the run's device
  const int* targets;  // (B,T), on the run's device
  int B;
};

class TrainingRun {
 public:
  // Resolves `cfg` in place: where a flag was absent, the checkpoint's value when resuming, else the
  // preset's (or steps/10 for the warm-up). Then validates it for this rank count, checks that every
  // output path can be written, forecasts this rank's peak memory and refuses a run that would not
  // fit, loads the data, opens the JSON output and prints the run header on rank 0. Every check is
  // collective: every rank exits with one clear message. The run computes on the world's device
  // (grid.world().device(): CPU for MPI, CUDA for NCCL, see comm_factory.h).
  // The batch is split over the grid's data-parallel ranks (DP; the world on the grid of 01-06), and
  // `split.strategy` runs over the ranks that hold the same parameters (grid.dp_cp()), whose size
  // pads the layout. The layout is this rank's part: of the tensor-parallel group (split.tp), whose
  // sizes are checked first (heads, vocabulary, 4C; B*T under sequence parallelism), each refusal
  // naming the flag; of the pipeline (split.pp): the units of its parts, whose --grad-accum
  // micro-batches are the pipeline's, and only the last stage has a loss (the step's is its, averaged
  // over the data-parallel groups); of a sequence under context parallelism (split.cp: the batch is
  // split over the DP coordinate alone, a CP ring training on the same sequences), the activations'
  // forecast then the model's on T/cp positions plus the ring's buffers (docs/theory.md, section 13).
  // A MoE model (moe.h; 11, 12) with split.moe given (the capacity factor and balance-loss coefficient
  // asked for; model_config() has the ones the run uses, a resumed run taking the checkpoint's where
  // a flag was left out): its experts are spread over the grid's expert-parallel group (split.ep),
  // every rank holding its E/ep experts of each block it runs; the layout lists every expert, the
  // others' empty, and checkpoints hold every expert whatever ep is. The step then counts the
  // expert-data-parallel group's communication too ("expert_dp").
  TrainingRun(ProcessGrid& grid, TrainConfig& cfg, const Parallelism& split);
  ~TrainingRun();

  const TrainConfig& cfg() const { return cfg_; }
  const GPT2Config& model_config() const { return model_; }
  const ParamLayout& layout() const { return layout_; }  // this rank's (its tensor-parallel slices)
  // The chapter's gradient all-reduces of a step, by element count, where they are not one of the
  // whole buffer: the theory table then predicts each one's bytes under the algorithm that
  // --collectives picks for its size (Parallelism::gradient_all_reduces); a MoE model's experts' own
  // over their group beside them (Parallelism::expert_all_reduces).
  void set_gradient_all_reduces(std::vector<int64_t> elements, std::vector<int64_t> experts = {}) {
    split_.gradient_all_reduces = std::move(elements);
    split_.expert_all_reduces = std::move(experts);
  }
  // What the dimensions read of the run (dimension.h), as it stands: also 12's group rows' (their
  // formulas shared with the table's).
  DimensionContext dimension_context() const;
  int global_batch() const { return cfg_.batch; }
  const PipelineParallelism& pipeline() const { return split_.pp; }
  const MemoryForecast& forecast() const { return forecast_; }  // this rank's, as printed at the start
  bool flash_attention() const { return flash_; }
  // Only the pipeline rank holding the LM head computes the loss: the last stage, or in a V (zb-v) the
  // first (every rank without a pipeline).
  bool holds_loss() const {
    if (split_.pp.size == 1) return true;
    for (const ModelPart& part : split_.pp.parts)
      if (part.last(model_) == model_.L + 1) return true;
    return false;
  }
  // The chapter's own fields for the "run" record (11's experts and capacity), after the grid (dp, cp,
  // tp, pp, ep) and the settings every run records. Before the first begin_step(), which writes the
  // record (or finish(), or the end of a job that failed before its first step).
  void add_to_run_record(const JsonObject& fields);
  // Root only (else nothing): one more JSON record (a chapter's own measurements, 08's bubble).
  void write_record(const JsonObject& record) { if (is_root()) json_.write(record); }
  // A MoE model's layers' activations on this rank (theory.h, moe_schedule_activation_bytes): at the
  // routing the last end_step() was given, else at the bound; 0 for a dense model.
  double moe_activations() const;
  int micro_batch_size() const { return micro_B_; }  // B / (data-parallel ranks x grad_accum)
  const ContextParallelism& context_parallelism() const { return split_.cp; }
  const TensorParallelism& tensor_parallelism() const { return split_.tp; }
  Device device() const { return device_; }
  // What parameters, gradients and activations are kept in: fp32, or bf16 (mixed precision: the
  // optimizer then keeps fp32 master weights, see optimizer.h).
  DType dtype() const { return dtype_; }

  // This rank's micro-batch `micro` (0..grad_accum-1) of global step `step` (data.h's order). For a
  // MoE model, whose capacity and balance loss span the global micro-batch (moe.h), micro-batch m is
  // the same sequences on every grid: the step's m-th B/grad_accum, split over the data ranks in order.
  MicroBatch micro_batch(int step, int micro);
  float lr(int step) const;

  // Either GPT-2 initial weights (returns step 0), the --init-from checkpoint's weights (returns step
  // 0: a new schedule), or the --resume checkpoint (returns its step).
  // `params` is a full flat buffer, or this rank's shard of the optimizer's plan (ZeRO-3); the
  // optimizer's m and v (and master weights) are filled for its shard. Weights are made (or read) in
  // fp32 on the host, then transferred to the device (bf16 parameters receive them rounded; the
  // master weights keep them exact).
  int init_or_resume(Tensor params, AdamW& optimizer);
  int init_or_resume(const Buffer& params, AdamW& optimizer) { return init_or_resume(params.view(), optimizer); }
  // True when a checkpoint is due after step `step`: --save-every, the last step with --save, or a
  // stop after Ctrl-C with --save (the completed steps are kept). Never after a diverging step.
  bool checkpoint_due(int step) const;
  // Collective: writes full tensors whatever is sharded (shards are gathered first), so the file
  // never depends on the rank count, and fp32 weights (the master weights under mixed precision),
  // so it never depends on the dtype either. "{step}" in --save is replaced by next_step. `params`
  // as for init_or_resume.
  void save_checkpoint(int next_step, Tensor params, AdamW& optimizer);
  void save_checkpoint(int next_step, const Buffer& params, AdamW& optimizer) {
    save_checkpoint(next_step, params.view(), optimizer);
  }

  // A group a chapter splits off itself (10's and 12's Ulysses groups and rings): it gets the run's
  // emulated link, and its traffic counts in the step's communication and the theory table's measure.
  void add_group(const std::string& name, Communicator& comm);

  void begin_step(int step);
  // Ends the step: waits for the device to finish its queued work (synchronize, device.h), averages
  // the loss over ranks, records time, exposed and total communication, bytes and memory; prints the
  // step line on rank 0 and writes the JSON record. After the first measured step, also prints
  // memory and communication next to theory. Then every rank agrees whether to stop (stopping()).
  // `expert_rows`: a MoE model's routing this step, for the activations' theory (theory.h,
  // moe_schedule_activation_bytes): per micro-batch, the rows this rank's experts ran per block (0 for
  // the blocks of other stages), replayed in the schedule's order; the exchange buffers' at the most
  // rows of any. Empty: the table takes the bound (moe_expert_rows_at_most_of).
  void end_step(int step, float local_loss, double grad_norm,
                const std::vector<std::vector<int64_t>>& expert_rows = {});
  // True once every rank agreed to stop after the last step: Ctrl-C (SIGINT, SIGTERM or SIGHUP)
  // reached a rank, or the loss or the gradient norm stopped being finite. The chapter's loop then breaks.
  bool stopping() const { return stop_ != Stop::No; }
  // Prints the averages over the measured steps (step 0 is warm-up) with, on a GPU whose peak is
  // known, the MFU; writes the trace, closes JSON. Returns the process's exit status: 0, 1 for a
  // diverged run, 130 for an interrupted one (each with its summary and trace written).
  int finish();

  bool is_root() const { return world_.rank() == 0; }

 private:
  enum class Stop { No, Interrupted, Diverged };
  CommStats all_stats() const;  // summed over the run's communicators
  LinkModel tensor_parallel_link() const;  // --tp-link-*, else --link-*
  JsonObject moe_run_fields() const;       // the run record's for a MoE model (experts, top_k, ...)
  // "2 data-parallel x 2 tensor-parallel x 2 pipeline stages | 1234 parameters on rank 0"
  std::string grid_line() const;
  void write_run_record();  // once, on rank 0
  // Between the whole model's fp32 flat arrays (global_layout_) and this rank's (layout_).
  Buffer to_local(Buffer global) const;
  Buffer to_global(Buffer local) const;
  // Sharded checkpoints (training_run_sharded.cpp): elements [begin, end) of this rank's part of
  // tensor `tensor`; which ones this rank alone writes; the collective save and load (a folder).
  struct Span {
    int tensor;
    int64_t begin, end;
  };
  bool saves_copy(const ParamInfo& p, bool replicas_split) const;
  std::vector<Span> owned_spans(const ShardPlan& plan) const;
  void save_sharded_checkpoint(const std::string& path, int next_step, Tensor params, AdamW& optimizer);
  int load_sharded_checkpoint(const std::string& path, bool weights_only, Tensor params, AdamW& optimizer);
  // Asynchronous saving (--async-save): the writer thread writes from the staged copy over a
  // communicator of its own; the next save and the end of the run wait for it (the wait reported).
  void wait_for_save(const char* before);
  void count_step_during_save(int step, double step_ms);  // step times with a save in flight and without
  void report_async_saves();
  void report_save();  // the "checkpoint" record of the last save (root)
  struct AsyncSave {
    std::unique_ptr<Communicator> comm;  // world's duplicate: the writer's collectives never meet the step's
    std::thread writer;
    Buffer staged;
    std::atomic<bool> in_flight{false};
    std::atomic<double> done_ms{0};
    std::string path;
    int step = 0;
    double started_ms = 0, written_ms = 0, wait_ms = 0;
    int64_t meta_bytes = 0, total_bytes = 0;
    // Steps (after warm-up) during which a save was in flight, and the others.
    int saving_steps = 0, other_steps = 0;
    double saving_ms = 0, other_ms = 0, waited_ms = 0;
  } async_;
  void resolve_settings(const CheckpointHeader* resumed);
  void resolve_moe_settings(const CheckpointHeader& resumed);
  void check_outputs();
  void check_memory();
  void report_vs_theory(const StepMeasure& step);
  TrainingSettings settings() const;

  Communicator& world_;     // every rank: the loss, the stop, metrics and checkpoints
  Communicator& dp_;        // the data-parallel group: DP and ZeRO (under CP: DP x CP), and the data split
  // The data split: how many ways, and this rank's part (dp_'s, but under CP the DP coordinate only).
  int data_ranks_ = 1, data_rank_ = 0;
  // How the chapter splits the run (its experts' replicas set from the grid): what the dimensions read.
  Parallelism split_;
  const ProcessGrid& grid_;       // (01-06: data parallelism alone, no group but the world)
  TrainConfig cfg_;
  Device device_;
  DType dtype_ = DType::F32;  // pick_dtype's, once the recipe is known
  DeviceInfo device_info_;  // its name and peak FLOP/s for dtype_, for the header and MFU
  GPT2Config model_;
  bool flash_ = false;
  ParamLayout layout_;
  ParamLayout global_layout_;  // the whole model's, for initialisation, checkpoints and FLOPs
  TokenData data_;
  int micro_B_ = 0;
  std::vector<int> inputs_, targets_;  // one micro-batch, on the host
  Buffer device_tokens_;               // the same inputs then targets on a GPU (unused on the CPU)
  // The dimensions that split this run (data parallelism always), each bringing its memory terms and
  // its rows of the theory table.
  std::vector<std::unique_ptr<Dimension>> dimensions_;
  MemoryForecast forecast_;
  double staging_at_most_ = 0;  // of forecast_.transient, a recipe's staged codes (wire_format.h)
  double precision_scratch_ = 0;  // a recipe's emulated products' scratch, forecast (precision_scratch_bytes)
  JsonLinesWriter json_;
  JsonObject run_record_;  // the "run" record until it is written
  std::atomic<bool> run_record_written_{false};
  double step_start_ms_ = 0;
  double matmul_at_step_start_ = 0;  // cpu_matmul_ms() then (ops.h)
  MatmulByRows matmul_by_rows_at_step_start_;  // cpu_matmul_by_rows() then
  // The run's distinct communicators ("world", and "dp", "tp", ..., "expert_dp" where they are other
  // groups: the grid's, process_grid.h), with their statistics when the step began.
  struct Group {
    std::string name;
    Communicator* comm;
    CommStats at_step_start;
  };
  std::vector<Group> groups_;
  Communicator* group(const std::string& name) const;  // the run's group of that name, or null
  CommStats comm_at_step_start_;  // summed over groups_
  int64_t launched_before_last_micro_ = 0;  // collectives issued before the last micro-batch began
  struct Totals {
    int steps = 0;
    double step_ms = 0, exposed_ms = 0, comm_ms = 0, tokens_per_s = 0;
    double collectives = 0, comm_bytes = 0;
    float last_loss = 0;
  } totals_;
  bool reported_theory_ = false;
  std::vector<std::vector<int64_t>> expert_rows_;  // the last end_step's: (micro-batches) x (L)
  Stop stop_ = Stop::No;
  int last_step_ = -1;
  int64_t run_peak_bytes_ = 0;  // the peak before the current step (begin_step resets the counters' peaks)
  int64_t init_from_batch_ = 0;  // the batch --init-from's checkpoint was trained with
  // --precision other than fp32 (mixed_precision.h): the recipe's products, loss scale and amax
  // histories, for every chapter but 13, which applies its own. Null in fp32.
  std::unique_ptr<MixedPrecision> precision_;
};
