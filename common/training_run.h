// training_run.h: the mechanics every chapter shares, so a chapter's own file holds only its idea.
// Defines TrainingRun: flag validation against the model and rank count, the dtype (--dtype: fp32,
// or bf16 mixed precision on a GPU), the model configuration
// and flat layout, this rank's micro-batches (on the run's device), the learning rate, initial
// weights or a resumed checkpoint, per-step metrics (step line, JSON lines, memory and
// communication next to theory, MFU on GPUs), periodic checkpoints and the trace.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "data.h"
#include "device.h"
#include "flags.h"
#include "memory.h"
#include "metrics.h"
#include "model_config.h"
#include "optimizer.h"
#include "param_layout.h"
#include "theory.h"

struct MicroBatch {
  const int* inputs;   // (B,T), on the run's device
  const int* targets;  // (B,T), on the run's device
  int B;
};

class TrainingRun {
 public:
  // Validates cfg for this rank count (collectively: every rank exits with one clear message),
  // loads the data, opens the JSON output and prints the run header on rank 0. The run computes on
  // the communicator's device (comm.device(): CPU for MPI, CUDA for NCCL, see comm_factory.h).
  TrainingRun(Communicator& comm, const TrainConfig& cfg, Strategy strategy);
  ~TrainingRun();

  const TrainConfig& cfg() const { return cfg_; }
  const GPT2Config& model_config() const { return model_; }
  const ParamLayout& layout() const { return layout_; }
  int global_batch() const { return batch_; }
  int micro_batch_size() const { return micro_B_; }  // B / (ranks x grad_accum)
  Device device() const { return device_; }
  // What parameters, gradients and activations are kept in: fp32, or bf16 (mixed precision: the
  // optimizer then keeps fp32 master weights, see optimizer.h).
  DType dtype() const { return dtype_; }

  // This rank's micro-batch `micro` (0..grad_accum-1) of global step `step` (data.h's order).
  MicroBatch micro_batch(int step, int micro);
  float lr(int step) const;

  // Either GPT-2 initial weights (returns step 0) or the --resume checkpoint (returns its step).
  // `params` holds flat elements [params_begin, params_begin + params.numel()): all of them, or this
  // rank's shard (ZeRO-3). The optimizer's m and v (and master weights) are filled for its range.
  // Weights are made (or read) in fp32 on the host, then transferred to the device (bf16 parameters
  // receive them rounded; the master weights keep them exact).
  int init_or_resume(Tensor params, int64_t params_begin, AdamW& optimizer);
  int init_or_resume(const Buffer& full_params, AdamW& optimizer) {
    return init_or_resume(full_params.view(), 0, optimizer);
  }
  // True when a checkpoint is due after step `step` (--save-every, or the last step with --save).
  bool checkpoint_due(int step) const;
  // Collective: writes full tensors whatever is sharded (shards are gathered first), so the file
  // never depends on the rank count, and fp32 weights (the master weights under mixed precision),
  // so it never depends on the dtype either. "{step}" in --save is replaced by next_step.
  void save_checkpoint(int next_step, Tensor params, int64_t params_begin, AdamW& optimizer);
  void save_checkpoint(int next_step, const Buffer& full_params, AdamW& optimizer) {
    save_checkpoint(next_step, full_params.view(), 0, optimizer);
  }

  void begin_step(int step);
  // Ends the step: waits for the device to finish its queued work (synchronize, device.h), averages the loss over ranks, records time, exposed and total communication,
  // bytes and memory; prints the step line on rank 0 and writes the JSON record. After the first
  // measured step, also prints memory and communication next to `prediction`.
  void end_step(int step, float local_loss, double grad_norm);
  // Prints the averages over the measured steps (step 0 is warm-up) with, on a GPU whose peak is
  // known, the MFU; writes the trace, closes JSON.
  void finish();

  bool is_root() const { return comm_.rank() == 0; }

 private:
  void report_vs_theory(const CommStats& step_comm);

  Communicator& comm_;
  TrainConfig cfg_;
  Strategy strategy_;
  Device device_;
  DType dtype_;
  DeviceInfo device_info_;  // its name and peak FLOP/s for dtype_, for the header and MFU
  GPT2Config model_;
  ParamLayout layout_;
  TokenData data_;
  int batch_ = 0, micro_B_ = 0;
  std::vector<int> inputs_, targets_;  // one micro-batch, on the host
  Buffer device_tokens_;               // the same inputs then targets on a GPU (unused on the CPU)
  JsonLinesWriter json_;
  double step_start_ms_ = 0;
  CommStats comm_at_step_start_;
  int64_t launched_before_last_micro_ = 0;  // collectives issued before the last micro-batch began
  struct Totals {
    int steps = 0;
    double step_ms = 0, exposed_ms = 0, comm_ms = 0, tokens_per_s = 0;
    double collectives = 0, comm_bytes = 0;
    float last_loss = 0;
  } totals_;
  bool reported_theory_ = false;
};
