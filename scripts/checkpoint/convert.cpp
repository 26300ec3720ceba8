// scripts/checkpoint/convert.cpp: converts a checkpoint between its two forms, both ways, on one
// process (no MPI job): the single file (checkpoint.h) that moves between tools and small runs, and
// the sharded folder (checkpoint_sharded.h) that every rank of a large run writes its part of.
//   build/checkpoint_convert run.ckpt ckpt/     the file's tensors, whole, as one shard file + metadata
//   build/checkpoint_convert ckpt/ run.ckpt     every slice of the folder assembled into one file
// The target's form follows its spelling: a path ending in '/' is a folder. Both directions hold the
// whole model in memory (three fp32 arrays): the converter is for models that fit one machine.
// `make checkpoint-convert` builds it.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "training/checkpoint.h"
#include "training/checkpoint_sharded.h"
#include "base/fileio.h"  // write_file_atomically
#include "model/param_layout.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

GPT2Config model_of(const CheckpointHeader& h) {
  GPT2Config cfg;
  cfg.preset = "custom";
  cfg.L = int(h.L), cfg.C = int(h.C), cfg.NH = int(h.NH), cfg.T = int(h.T), cfg.V = int(h.V);
  cfg.experts = int(h.experts), cfg.top_k = int(h.top_k);
  return cfg;
}

CheckpointData data_of(const CheckpointHeader& h, const std::vector<float>* arrays) {
  CheckpointData data;
  data.step = h.step;
  data.global_batch = h.global_batch;
  data.seed = h.seed;
  data.settings = h.settings;
  data.params = arrays[0].data();
  data.adam_m = arrays[1].data();
  data.adam_v = arrays[2].data();
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3)
    return fail("usage: checkpoint_convert FROM TO (a path ending in '/' is a sharded checkpoint's folder: "
                "file to folder, or folder to file)");
  const std::string from = argv[1], to = argv[2];
  const bool from_folder = is_sharded_path(from), to_folder = !to.empty() && to.back() == '/';
  if (from_folder == to_folder)
    return fail("checkpoint_convert " + from + " " + to + ": one side must be a folder (ending in '/') and the other a file");
  CheckpointHeader header;
  ShardedMeta meta;
  std::string error = from_folder ? read_sharded_meta(from, &meta) : read_checkpoint_file_header(from, &header);
  if (!error.empty()) return fail(error);
  if (from_folder) header = meta.header;
  const GPT2Config cfg = model_of(header);
  const ParamLayout global = build_gpt2_layout(cfg, 1);
  std::vector<float> arrays[3];
  for (std::vector<float>& a : arrays) a.assign(size_t(global.padded_size), 0.0f);
  if (from_folder) {
    error = read_sharded_whole(from, meta, global, arrays[0].data(), arrays[1].data(), arrays[2].data());
    if (!error.empty()) return fail(error);
    const std::string bytes = serialize_checkpoint(cfg, global, data_of(header, arrays));
    write_file_atomically(to, bytes.data(), bytes.size());
  } else {
    int64_t step = 0;
    error = read_checkpoint_file(from, cfg, global, header.global_batch, arrays[0].data(), arrays[1].data(),
                                 arrays[2].data(), &step);
    if (!error.empty()) return fail(error);
    // One shard file: every tensor whole, parameters then m then v, unpadded.
    std::vector<SliceKey> keys;
    std::vector<float> staged;
    for (int array = 0; array < 3; array++)
      for (size_t t = 0; t < global.params.size(); t++) {
        const ParamInfo& p = global.params[t];
        SliceKey k;
        k.tensor = int(t);
        k.array = array;
        k.rows = p.shape[0];
        k.cols = p.ndim == 2 ? p.shape[1] : 1;
        k.end = p.size;
        keys.push_back(k);
        staged.insert(staged.end(), arrays[array].begin() + p.offset, arrays[array].begin() + p.offset + p.size);
      }
    const std::string folder = sharded_folder(to);
    if (mkdir(folder.c_str(), 0777) != 0 && errno != EEXIST)
      return fail("cannot create the folder '" + folder + "': " + std::strerror(errno));
    ShardedMeta out = sharded_meta_for(cfg, global, data_of(header, arrays));
    out.files.push_back(write_shard_file(folder, "step" + std::to_string(header.step) + ".rank0.bin", 0, keys,
                                         staged.data(), &out.slices));
    write_sharded_meta(folder, out);
  }
  std::printf("converted %s (step %lld) to %s\n", from.c_str(), (long long)header.step, to.c_str());
  return 0;
}
