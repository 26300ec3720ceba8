// checkpoint_sharded.h: the sharded checkpoint, a folder that every rank writes its own part of
// (`--save DIR/`, a path ending in '/'). Defines SliceKey, SavedSlice, SliceRequest, ShardedMeta and
// the collective save_sharded() and load_sharded(), plus the metadata's reader (read_sharded_meta).
// The format is documented in docs/checkpoint.md:
//   DIR/step<S>.rank<r>.bin   rank r's slices, one after another, raw fp32 (no header)
//   DIR/checkpoint.meta       text: the run's header, every tensor's global shape, every file (bytes,
//                             FNV-1a hash) and every slice (tensor, array, cut, elements, file,
//                             offset, hash), then the hash of all lines before; written LAST, by
//                             rank 0, as a temporary renamed into place
// A slice is the elements [begin, end) (row-major) of one rank's part of one tensor, the part cut from
// the global tensor as its TensorShard says (param_layout.h). So slices do not depend on the padding,
// the bucket plan or the stage of the rank that wrote them: a loader on any grid maps both its own
// parts and the saved slices to global elements and copies where they meet.
// The folder is complete only once checkpoint.meta is there: the shard files of a save that was cut
// short are named by no metadata, and the previous save's stay, named by the previous metadata, until
// the new metadata has replaced it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "training/checkpoint.h"  // CheckpointHeader, TrainingSettings
#include "comm/comm.h"
#include "model/param_layout.h"

// Which array of the training state a slice holds.
enum SlicedArray { kParams = 0, kAdamM = 1, kAdamV = 2 };
const char* sliced_array_name(int array);  // "parameters", "AdamW m", "AdamW v"

// A slice: elements [begin, end) of the part of tensor `tensor` (its index in the layout's table) cut
// as `shard` says, whose shape is rows x cols (cols 1 for a vector).
struct SliceKey {
  int tensor = 0, array = kParams;
  TensorShard shard;
  int64_t rows = 0, cols = 1;
  int64_t begin = 0, end = 0;
  int64_t count() const { return end - begin; }
};

// A slice as the metadata lists it: where its bytes are, and their hash.
struct SavedSlice {
  SliceKey key;
  int file = 0;          // index into ShardedMeta::files
  int64_t offset = 0;    // in bytes, into that file
  uint64_t hash = 0;     // FNV-1a of its bytes
};

struct ShardFile {
  std::string name;  // within the folder
  int64_t bytes = 0;
  uint64_t hash = 0;
};

// What checkpoint.meta holds.
struct ShardedMeta {
  CheckpointHeader header;  // version 3's fields; has_settings and has_moe_settings true
  uint64_t seed = 0;
  std::vector<std::string> names;                // the tensors', in table order
  std::vector<std::vector<int64_t>> shapes;      // their global shapes
  std::vector<ShardFile> files;
  std::vector<SavedSlice> slices;
};

// The metadata's name in the folder, and whether a checkpoint path names a sharded checkpoint: a path
// ending in '/', or an existing folder.
extern const char* const kShardedMetaName;  // "checkpoint.meta"
bool is_sharded_path(const std::string& path);
std::string sharded_folder(const std::string& path);  // the path with one trailing '/'

// What a save wrote: every rank's shard file's bytes (rank 0 only; in rank order) and the metadata's.
struct ShardedSaveSizes {
  std::vector<int64_t> rank_bytes;
  int64_t meta_bytes = 0;
};

// Collective over `comm` (every rank of the job): each rank writes its slices (`keys`, their elements
// one after another in `staged`, fp32 on the host) to its own file; rank 0 gathers every rank's list
// and writes checkpoint.meta last, then removes the shard files no metadata names any more (the
// previous save's, and those of a save that was cut short). `data` gives the header fields (its
// arrays are unused). Everyone returns once the metadata is in place.
ShardedSaveSizes save_sharded(Communicator& comm, const std::string& folder, const GPT2Config& cfg,
                              const ParamLayout& global, const CheckpointData& data,
                              const std::vector<SliceKey>& keys, const float* staged);

// The pieces save_sharded() is made of, for the converter: one shard file's slices written (returns
// the file's entry, and appends its slices, with `file_index`, to *slices), and the metadata.
ShardFile write_shard_file(const std::string& folder, const std::string& name, int file_index,
                           const std::vector<SliceKey>& keys, const float* staged, std::vector<SavedSlice>* slices);
ShardedMeta sharded_meta_for(const GPT2Config& cfg, const ParamLayout& global, const CheckpointData& data);
// Writes checkpoint.meta (temporary, then rename); returns its length in bytes.
int64_t write_sharded_meta(const std::string& folder, const ShardedMeta& meta);

// Reads and checks checkpoint.meta (its own hash, its version, every shard file there with its listed
// size). "" and *meta filled, or the one-sentence reason, naming the file (and for a missing or short
// shard file, the first tensor it holds). Not collective.
std::string read_sharded_meta(const std::string& folder, ShardedMeta* meta);

// Collective: rank 0 reads the metadata (read_sharded_meta), every rank receives it; stops every
// rank with the reason when it cannot be used.
ShardedMeta broadcast_sharded_meta(Communicator& comm, const std::string& folder);

// "" when the metadata's tensors are `global`'s (names and global shapes), else the message.
std::string sharded_model_problem(const std::string& folder, const ShardedMeta& meta, const ParamLayout& global);

// What a rank needs: a slice of its own part, to be written to `dst` (count() floats, host).
struct SliceRequest {
  SliceKey key;
  float* dst = nullptr;
};

// Fills every request from whichever saved slices hold its elements, reading only those slices and
// checking each one's hash. "" when every element was found, else the one-sentence reason (the file
// and the tensor: a missing, short or corrupted shard file, or elements no slice holds). Not
// collective: callers agree on the result (Communicator::agree_or_die).
std::string load_sharded_slices(const std::string& folder, const ShardedMeta& meta,
                                const std::vector<SliceRequest>& requests);

// The whole model's padded flat arrays (global.padded_size each, padding zero) from the folder: for
// the converter, which may hold the whole model. "" or the reason.
std::string read_sharded_whole(const std::string& folder, const ShardedMeta& meta, const ParamLayout& global,
                               float* params, float* adam_m, float* adam_v);
