// checkpoint.h: saving and resuming training, bit-exactly. Defines TrainingSettings, CheckpointData,
// CheckpointHeader, save_checkpoint(), read_checkpoint_header() and load_checkpoint(). The format
// (little-endian) is documented in docs/checkpoint.md:
//   header: magic "GPT2CKPT", u32 version, u32 L, C, NH, T, V, u64 step (the next step to run),
//           u64 global batch, u64 data position (global samples consumed = step x batch),
//           u64 seed, [version 2: the training settings: u64 steps, u64 warmup, f64 lr, f64 weight
//           decay, f64 grad clip, u64 data length, u64 data hash], [version 3: the mixture of
//           experts: u32 experts, u32 top-k (0 0: a dense model), f64 capacity factor, f64 balance-loss
//           coefficient, u64 grad accum], u32 tensor count
//   table:  per tensor: u32 name length, name bytes, u32 ndim, u64 dims[ndim]
//   data:   parameters (fp32, table order), then AdamW m, then AdamW v (same order and sizes)
//   trailer: u64 FNV-1a hash of every byte before it
// A checkpoint holds full tensors in table order, never a rank-dependent layout, so one saved on N
// ranks resumes on M ranks and in any chapter that trains the same way (a MoE model with a capacity or a
// balance loss: chapter 11 only). Version 1 and 2 files (without settings, without the MoE ones) still load.
#pragma once
#include <cstdint>
#include <string>

#include "comm/comm.h"
#include "model/param_layout.h"

// What decides a run's trajectory besides the weights: a resumed run must continue with the same.
struct TrainingSettings {
  int64_t steps = 0, warmup = 0;
  double lr = 0, weight_decay = 0, grad_clip = 0;
  uint64_t data_length = 0, data_hash = 0;  // the training data: its size and FNV-1a hash (data.h)
  // A MoE model's (moe.h; version 3): its capacity and balance loss are per micro-batch, so with
  // either, --grad-accum decides which tokens they count.
  double capacity_factor = 0, aux_loss_coef = 0;
  int64_t grad_accum = 1;
};

struct CheckpointData {
  int64_t step = 0;          // next step to run
  int64_t global_batch = 0;
  uint64_t seed = 0;
  TrainingSettings settings;
  // Full padded flat arrays (layout.padded_size elements): parameters and AdamW moments.
  const float* params = nullptr;
  const float* adam_m = nullptr;
  const float* adam_v = nullptr;
};

// The whole file for `data` (header, table, arrays, trailer), built from the padded flat arrays
// tensor by tensor. save_checkpoint() writes exactly these bytes; tests use them directly.
std::string serialize_checkpoint(const GPT2Config& cfg, const ParamLayout& layout,
                                 const CheckpointData& data);

// Checks a whole checkpoint file (`bytes`, read from `path`) against this run: magic, version,
// length, hash, model config, tensor names and shapes, batch. Returns "" when it can be loaded,
// else the message to print, naming the file, what is wrong and, where possible, what to pass.
// Pure (no MPI, no files), so every error message can be tested; sizes written in the file are
// only believed after they matched this run's layout.
std::string validate_checkpoint_bytes(const std::string& path, const std::string& bytes,
                                      const GPT2Config& cfg, const ParamLayout& layout,
                                      int64_t expected_batch);

// The header of a checkpoint, which a resumed run reads first: its settings replace the defaults of
// absent flags, and a batch that cannot be split is refused before anything is allocated.
struct CheckpointHeader {
  uint32_t version = 0;
  int64_t L = 0, C = 0, NH = 0, T = 0, V = 0;
  int64_t experts = 0, top_k = 0;  // version 3 and later (0 0: dense; unknown before)
  int64_t step = 0, global_batch = 0;
  uint64_t seed = 0;  // informative: a resumed run may change it
  bool has_settings = false;  // version 2 and later
  bool has_moe_settings = false;  // version 3 and later: experts, top_k and settings' MoE fields
  TrainingSettings settings;
};
// Collective: rank 0 reads the first bytes of `path` and every rank returns the header. A file that
// cannot be read or is no checkpoint of a version this build reads stops every rank with the reason.
CheckpointHeader read_checkpoint_header(Communicator& comm, const std::string& path);
// The same, not collective, for one process (the converter): "" and *header, or the reason.
std::string read_checkpoint_file_header(const std::string& path, CheckpointHeader* header);
// "" when the header's model is this run's (its shape, and from version 3 its experts and top-k), else
// the message (naming the preset to pass, if any).
std::string checkpoint_model_problem(const std::string& path, const CheckpointHeader& header, const GPT2Config& cfg);

// Called on every rank; rank 0 writes `path` atomically (temporary file, then rename); the others
// may pass null arrays. A collective: everyone returns once the file is complete.
void save_checkpoint(Communicator& comm, const std::string& path, const GPT2Config& cfg,
                     const ParamLayout& layout, const CheckpointData& data);

// Called on every rank. Rank 0 reads and validates every field and size (magic, version, model
// config, tensor names and shapes, file length, hash, batch) and broadcasts the arrays; each rank
// receives full padded flat arrays into params, adam_m, adam_v (layout.padded_size elements each,
// padding zeroed) and the step. On any problem every rank exits with a message naming the file and
// what is wrong. `expected_batch` is the run's --batch: resuming with another batch would break the
// data order, so it is refused.
// What rank 0 of load_checkpoint does, for one process (the converter): "" with the arrays and *step
// filled, or the reason.
std::string read_checkpoint_file(const std::string& path, const GPT2Config& cfg, const ParamLayout& layout,
                                 int64_t expected_batch, float* params, float* adam_m, float* adam_v, int64_t* step);
int64_t load_checkpoint(Communicator& comm, const std::string& path, const GPT2Config& cfg,
                        const ParamLayout& layout, int64_t expected_batch, float* params, float* adam_m,
                        float* adam_v);
