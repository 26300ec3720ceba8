// checkpoint_sharded.cpp: the sharded checkpoint of checkpoint_sharded.h: slices and their global
// runs, the metadata's text, the collective save, and the loader that copies where a rank's needs and
// the saved slices meet.
#include "training/checkpoint_sharded.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>  // getenv: the test-only hold before the metadata
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/check.h"   // ENSURE, fatal
#include "base/fileio.h"  // write_file_atomically, read_whole_file, fnv1a

const char* const kShardedMetaName = "checkpoint.meta";

namespace {

constexpr const char* kMagicLine = "gpt2-sharded-checkpoint";
constexpr int kShardedVersion = 1;

// A run of elements a slice shares with its global tensor: `n` elements from `global` (offset within
// the global tensor) and from `local` (offset within the slice's elements).
struct Run {
  int64_t global = 0, local = 0, n = 0;
};

// The slice's runs, in increasing global order: the part's rows (or, cut along dim 1, each row's
// columns) as param_layout.cpp cuts them, clipped to the slice's [begin, end).
std::vector<Run> global_runs(const SliceKey& k, const std::vector<int64_t>& global_shape) {
  std::vector<Run> runs;
  auto add = [&](int64_t at_part, int64_t at_global, int64_t n) {
    const int64_t lo = std::max(at_part, k.begin), hi = std::min(at_part + n, k.end);
    if (lo < hi) runs.push_back({at_global + (lo - at_part), lo - k.begin, hi - lo});
  };
  const int64_t global_cols = global_shape.size() == 2 ? global_shape[1] : 1;
  if (k.shard.whole()) {
    add(0, 0, k.rows * k.cols);
  } else if (k.shard.dim == 1) {
    for (int64_t r = 0; r < k.rows; r++) add(r * k.cols, r * global_cols + k.shard.index * k.cols, k.cols);
  } else {
    const int64_t block_rows = global_shape[0] / k.shard.blocks, part_block_rows = k.rows / k.shard.blocks;
    for (int b = 0; b < k.shard.blocks; b++) {
      const int64_t global_row = b * block_rows + k.shard.index * part_block_rows;
      add(b * part_block_rows * k.cols, global_row * global_cols, part_block_rows * k.cols);
    }
  }
  return runs;
}

std::string hex(uint64_t x) {
  char text[32];
  std::snprintf(text, sizeof text, "%016llx", (unsigned long long)x);
  return text;
}
std::string real(double x) {  // %.17g: the same double back
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

std::string slice_line(const SavedSlice& s) {
  const SliceKey& k = s.key;
  std::ostringstream line;
  line << "s " << s.file << ' ' << s.offset << ' ' << hex(s.hash) << ' ' << k.tensor << ' ' << k.array << ' '
       << k.shard.dim << ' ' << k.shard.parts << ' ' << k.shard.index << ' ' << k.shard.blocks << ' ' << k.rows
       << ' ' << k.cols << ' ' << k.begin << ' ' << k.end << '\n';
  return line.str();
}

// A slice line's fields after its "s".
bool read_slice(std::istream& in, SavedSlice* s) {
  SliceKey& k = s->key;
  std::string hash;
  if (!(in >> s->file >> s->offset >> hash >> k.tensor >> k.array >> k.shard.dim >> k.shard.parts >> k.shard.index >>
        k.shard.blocks >> k.rows >> k.cols >> k.begin >> k.end))
    return false;
  s->hash = std::strtoull(hash.c_str(), nullptr, 16);
  return true;
}

std::string meta_text(const ShardedMeta& m) {
  const CheckpointHeader& h = m.header;
  const TrainingSettings& s = h.settings;
  std::ostringstream out;
  out << kMagicLine << ' ' << kShardedVersion << '\n';
  out << "model " << h.L << ' ' << h.C << ' ' << h.NH << ' ' << h.T << ' ' << h.V << ' ' << h.experts << ' '
      << h.top_k << '\n';
  out << "run " << h.step << ' ' << h.global_batch << ' ' << m.seed << '\n';
  out << "settings " << s.steps << ' ' << s.warmup << ' ' << real(s.lr) << ' ' << real(s.weight_decay) << ' '
      << real(s.grad_clip) << ' ' << s.data_length << ' ' << s.data_hash << ' ' << real(s.capacity_factor) << ' '
      << real(s.aux_loss_coef) << ' ' << s.grad_accum << '\n';
  out << "tensors " << m.names.size() << '\n';
  for (size_t i = 0; i < m.names.size(); i++) {
    out << "t " << m.names[i] << ' ' << m.shapes[i].size();
    for (int64_t d : m.shapes[i]) out << ' ' << d;
    out << '\n';
  }
  out << "files " << m.files.size() << '\n';
  for (const ShardFile& f : m.files) out << "f " << f.name << ' ' << f.bytes << ' ' << hex(f.hash) << '\n';
  out << "slices " << m.slices.size() << '\n';
  for (const SavedSlice& s : m.slices) out << slice_line(s);
  std::string text = out.str();
  return text + "end " + hex(fnv1a(text.data(), text.size())) + '\n';
}

// Parses meta_text's output; "" or what is wrong (a short phrase).
std::string parse_meta(const std::string& text, ShardedMeta* m) {
  const size_t end_at = text.rfind("end ");
  if (end_at == std::string::npos || (end_at > 0 && text[end_at - 1] != '\n')) return "it has no end line (cut short)";
  uint64_t stored = 0;
  if (std::sscanf(text.c_str() + end_at, "end %16llx", (unsigned long long*)&stored) != 1) return "its end line is unreadable";
  if (stored != fnv1a(text.data(), end_at)) return "its hash does not match its lines (it changed after it was written)";
  std::istringstream in(text.substr(0, end_at));
  std::string word;
  int version = 0;
  if (!(in >> word >> version) || word != kMagicLine) return "it does not start with \"" + std::string(kMagicLine) + "\"";
  if (version != kShardedVersion)
    return "it has format version " + std::to_string(version) + ", but this build reads version " + std::to_string(kShardedVersion);
  CheckpointHeader& h = m->header;
  TrainingSettings& s = h.settings;
  h.version = 3;
  h.has_settings = h.has_moe_settings = true;
  size_t tensors = 0, files = 0, slices = 0;
  in >> word >> h.L >> h.C >> h.NH >> h.T >> h.V >> h.experts >> h.top_k;
  in >> word >> h.step >> h.global_batch >> m->seed;
  h.seed = m->seed;
  in >> word >> s.steps >> s.warmup >> s.lr >> s.weight_decay >> s.grad_clip >> s.data_length >> s.data_hash >>
      s.capacity_factor >> s.aux_loss_coef >> s.grad_accum;
  if (!(in >> word >> tensors) || word != "tensors" || tensors > (1u << 24)) return "its tensor table is unreadable";
  for (size_t i = 0; i < tensors; i++) {
    std::string name;
    size_t ndim = 0;
    if (!(in >> word >> name >> ndim) || word != "t" || ndim > 2) return "its tensor table is unreadable";
    std::vector<int64_t> shape(ndim);
    for (int64_t& d : shape) in >> d;
    m->names.push_back(name);
    m->shapes.push_back(shape);
  }
  if (!(in >> word >> files) || word != "files" || files > (1u << 24)) return "its file list is unreadable";
  for (size_t i = 0; i < files; i++) {
    ShardFile f;
    std::string hash;
    if (!(in >> word >> f.name >> f.bytes >> hash) || word != "f" || f.name.find('/') != std::string::npos)
      return "its file list is unreadable";
    f.hash = std::strtoull(hash.c_str(), nullptr, 16);
    m->files.push_back(f);
  }
  if (!(in >> word >> slices) || word != "slices" || slices > (1u << 30)) return "its slice list is unreadable";
  for (size_t i = 0; i < slices; i++) {
    SavedSlice s;
    const SliceKey& k = s.key;
    if (!(in >> word) || word != "s" || !read_slice(in, &s)) return "its slice list is unreadable";
    // Every number the loader will index with, checked once here.
    const bool sound = s.file >= 0 && size_t(s.file) < files && k.tensor >= 0 && size_t(k.tensor) < tensors &&
                       k.array >= 0 && k.array <= 2 && k.shard.parts >= 1 && k.shard.blocks >= 1 &&
                       k.shard.index >= 0 && k.shard.index < k.shard.parts && k.rows >= 0 && k.cols >= 1 &&
                       k.begin >= 0 && k.begin <= k.end && k.end <= k.rows * k.cols && s.offset >= 0 &&
                       s.offset + k.count() * 4 <= m->files[size_t(s.file)].bytes;
    if (!sound) return "slice " + std::to_string(i) + " is out of range";
    m->slices.push_back(s);
  }
  if (!in) return "it is cut short";
  return "";
}

std::string meta_path(const std::string& folder) { return folder + kShardedMetaName; }

// "tensor 'h0.mlp.fc.weight' (AdamW m)"
std::string tensor_text(const ShardedMeta& m, const SliceKey& k) {
  return "tensor '" + m.names[size_t(k.tensor)] + "' (" + sliced_array_name(k.array) + ")";
}

// The first tensor a file holds, for messages about the file.
std::string first_tensor_of(const ShardedMeta& m, int file) {
  for (const SavedSlice& s : m.slices)
    if (s.file == file) return tensor_text(m, s.key);
  return "no tensor";
}

// "" when shard file `file` is there with its listed length, else the sentence.
std::string file_problem(const std::string& folder, const ShardedMeta& m, int file) {
  const ShardFile& f = m.files[size_t(file)];
  const std::string path = folder + f.name;
  struct stat info;
  if (stat(path.c_str(), &info) != 0)
    return "checkpoint '" + folder + "' is missing its shard file '" + path + "', which holds " + first_tensor_of(m, file);
  if (int64_t(info.st_size) != f.bytes)
    return "checkpoint '" + folder + "' has a damaged shard file '" + path + "': " + std::to_string(info.st_size) +
           " bytes where " + std::to_string(f.bytes) + " were written, so " + first_tensor_of(m, file) + " cannot be read";
  return "";
}

// The shard files a save leaves (step<S>.rank<r>.bin), named by no metadata when a save was cut short.
bool is_shard_file_name(const std::string& name) {
  return name.compare(0, 4, "step") == 0 && name.size() > 4 && name.find(".rank") != std::string::npos &&
         name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0;
}

}  // namespace

const char* sliced_array_name(int array) {
  return array == kParams ? "parameters" : array == kAdamM ? "AdamW m" : "AdamW v";
}

bool is_sharded_path(const std::string& path) {
  if (!path.empty() && path.back() == '/') return true;
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::string sharded_folder(const std::string& path) {
  std::string folder = path;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  return folder + "/";
}

ShardFile write_shard_file(const std::string& folder, const std::string& name, int file_index,
                           const std::vector<SliceKey>& keys, const float* staged, std::vector<SavedSlice>* slices) {
  ShardFile file;
  file.name = name;
  for (const SliceKey& k : keys) {
    SavedSlice s;
    s.key = k;
    s.file = file_index;
    s.offset = file.bytes;
    const char* bytes = reinterpret_cast<const char*>(staged) + file.bytes;
    s.hash = fnv1a(bytes, size_t(k.count()) * sizeof(float));
    file.bytes += k.count() * int64_t(sizeof(float));
    slices->push_back(s);
  }
  file.hash = fnv1a(reinterpret_cast<const char*>(staged), size_t(file.bytes));
  write_file_atomically(folder + name, staged, size_t(file.bytes));
  return file;
}

ShardedMeta sharded_meta_for(const GPT2Config& cfg, const ParamLayout& global, const CheckpointData& data) {
  ShardedMeta m;
  CheckpointHeader& h = m.header;
  h.version = 3;
  h.L = cfg.L, h.C = cfg.C, h.NH = cfg.NH, h.T = cfg.T, h.V = cfg.V, h.experts = cfg.experts, h.top_k = cfg.top_k;
  h.step = data.step;
  h.global_batch = data.global_batch;
  h.has_settings = h.has_moe_settings = true;
  h.settings = data.settings;
  m.seed = h.seed = data.seed;
  for (const ParamInfo& p : global.params) {
    m.names.push_back(p.name);
    m.shapes.push_back(std::vector<int64_t>(p.global_shape, p.global_shape + p.ndim));
  }
  return m;
}

int64_t write_sharded_meta(const std::string& folder, const ShardedMeta& meta) {
  const std::string text = meta_text(meta);
  write_file_atomically(meta_path(folder), text.data(), text.size());
  return int64_t(text.size());
}

namespace {

// A test's handle on a save cut short (tests/test_checkpoint_shards.cpp): with GPT_CHECKPOINT_HOLD_STEP=S
// in the environment, the save of step S stops for a while after every rank has written its shard file
// and before the metadata, so that a rank killed then dies in the middle of the save, every time. Unset
// (always, outside that test), it does nothing. The hold is bounded: a run nobody kills goes on.
void hold_before_metadata_if_asked(Communicator& comm, int64_t step) {
  const char* hold = std::getenv("GPT_CHECKPOINT_HOLD_STEP");
  if (!hold || std::strtoll(hold, nullptr, 10) != step) return;
  comm.barrier();  // every shard file is in place
  if (comm.rank() == 0)
    std::fprintf(stderr, "GPT_CHECKPOINT_HOLD_STEP: the save of step %lld holds before its metadata\n", (long long)step);
  for (int i = 0; i < 600; i++) usleep(100000);  // 60 s
}

}  // namespace

ShardedSaveSizes save_sharded(Communicator& comm, const std::string& path, const GPT2Config& cfg,
                              const ParamLayout& global, const CheckpointData& data,
                              const std::vector<SliceKey>& keys, const float* staged) {
  const std::string folder = sharded_folder(path);
  if (comm.rank() == 0 && mkdir(folder.c_str(), 0777) != 0 && errno != EEXIST)
    fatal("cannot create the checkpoint folder '" + folder + "': " + std::strerror(errno));
  comm.barrier();  // the folder exists for everyone
  // A name of this save's own: the previous save's files stay intact until the new metadata is in place.
  const std::string name = "step" + std::to_string(data.step) + ".rank" + std::to_string(comm.rank()) + ".bin";
  std::vector<SavedSlice> mine;
  const ShardFile file = write_shard_file(folder, name, 0, keys, staged, &mine);
  hold_before_metadata_if_asked(comm, data.step);

  // Rank 0 learns every rank's file and slices: a length, then the lines, from each rank in turn.
  std::string lines = "f " + file.name + ' ' + std::to_string(file.bytes) + ' ' + hex(file.hash) + '\n';
  for (const SavedSlice& s : mine) lines += slice_line(s);
  ShardedMeta meta = sharded_meta_for(cfg, global, data);
  ShardedSaveSizes sizes;
  for (int r = 0; r < comm.size(); r++) {
    uint64_t length = comm.rank() == r ? lines.size() : 0;
    comm.broadcast_bytes(&length, sizeof length, r);
    std::string text(size_t(length), '\0');
    if (comm.rank() == r) text = lines;
    comm.broadcast_bytes(&text[0], text.size(), r);
    if (comm.rank() != 0) continue;
    std::istringstream in(text);
    std::string word, hash;
    ShardFile f;
    in >> word >> f.name >> f.bytes >> hash;
    f.hash = std::strtoull(hash.c_str(), nullptr, 16);
    sizes.rank_bytes.push_back(f.bytes);
    if (f.bytes == 0) continue;  // an empty file is listed nowhere (it holds nothing)
    const int index = int(meta.files.size());
    meta.files.push_back(f);
    if (r == 0)
      for (SavedSlice s : mine) {
        s.file = index;
        meta.slices.push_back(s);
      }
    if (r == 0) continue;
    SavedSlice slice;
    while (in >> word && word == "s" && read_slice(in, &slice)) {
      slice.file = index;
      meta.slices.push_back(slice);
    }
  }
  if (comm.rank() == 0) {
    // Every rank's file is complete (each rank returned from its write before sending its lines).
    std::set<std::string> keep;
    for (const ShardFile& f : meta.files) keep.insert(f.name);
    sizes.meta_bytes = write_sharded_meta(folder, meta);
    // Now the new checkpoint is the folder's: the files no metadata names go.
    if (DIR* dir = opendir(folder.c_str())) {
      while (dirent* entry = readdir(dir)) {
        const std::string n = entry->d_name;
        if (is_shard_file_name(n) && !keep.count(n)) std::remove((folder + n).c_str());
      }
      closedir(dir);
    }
  }
  comm.barrier();  // no rank goes on (to read it, or to exit) before the metadata is in place
  return sizes;
}

std::string read_sharded_meta(const std::string& path, ShardedMeta* meta) {
  const std::string folder = sharded_folder(path);
  struct stat info;
  if (stat(folder.c_str(), &info) != 0)
    return "cannot open checkpoint folder '" + folder + "': it does not exist; pass --resume DIR/ with a folder written by --save DIR/";
  if (stat(meta_path(folder).c_str(), &info) != 0)
    return "checkpoint '" + folder + "' is incomplete: it has no " + kShardedMetaName +
           " (a save that was cut short writes it last, so this folder holds no usable checkpoint)";
  std::string text, error;
  if (!read_whole_file(meta_path(folder), &text, &error)) return error;
  *meta = ShardedMeta();
  const std::string problem = parse_meta(text, meta);
  if (!problem.empty()) return "checkpoint '" + folder + "' has an unusable " + kShardedMetaName + ": " + problem;
  for (int f = 0; f < int(meta->files.size()); f++) {
    const std::string missing = file_problem(folder, *meta, f);
    if (!missing.empty()) return missing;
  }
  return "";
}

ShardedMeta broadcast_sharded_meta(Communicator& comm, const std::string& path) {
  ShardedMeta meta;
  std::string error, text;
  if (comm.rank() == 0) {
    error = read_sharded_meta(path, &meta);
    if (error.empty()) read_whole_file(meta_path(sharded_folder(path)), &text, &error);
  }
  comm.agree_or_die(error.empty(), error);
  uint64_t length = text.size();
  comm.broadcast_bytes(&length, sizeof length, 0);
  text.resize(size_t(length));
  comm.broadcast_bytes(&text[0], text.size(), 0);
  if (comm.rank() != 0) {
    const std::string problem = parse_meta(text, &meta);
    ENSURE(problem.empty(), "the metadata rank 0 read parses elsewhere too");
  }
  return meta;
}

std::string sharded_model_problem(const std::string& path, const ShardedMeta& meta, const ParamLayout& global) {
  const std::string file = "checkpoint '" + sharded_folder(path) + "'";
  if (meta.names.size() != global.params.size())
    return file + " has " + std::to_string(meta.names.size()) + " tensors but this model has " +
           std::to_string(global.params.size()) + " (saved by another version of the code?)";
  for (size_t i = 0; i < global.params.size(); i++) {
    const ParamInfo& p = global.params[i];
    const std::vector<int64_t> shape(p.global_shape, p.global_shape + p.ndim);
    if (meta.names[i] != p.name || meta.shapes[i] != shape)
      return file + " does not match this model: tensor " + std::to_string(i) + " is '" + meta.names[i] +
             "' in the checkpoint but '" + p.name + "' in this model (saved by another version of the code?)";
  }
  return "";
}

std::string load_sharded_slices(const std::string& path, const ShardedMeta& meta,
                                const std::vector<SliceRequest>& requests) {
  const std::string folder = sharded_folder(path);
  // The saved slices of each (tensor, array), with their runs, made when first asked for.
  std::map<std::pair<int, int>, std::vector<int>> saved_of;
  for (int i = 0; i < int(meta.slices.size()); i++)
    saved_of[{meta.slices[size_t(i)].key.tensor, meta.slices[size_t(i)].key.array}].push_back(i);
  std::map<int, std::vector<Run>> saved_runs;

  // Where a request and a saved slice meet: copy n elements from the saved slice's element `from`
  // to the request's element `to`. Listed per saved slice, so that each is read once.
  struct Copy {
    size_t request;
    int64_t from, to, n;
  };
  std::map<int, std::vector<Copy>> copies;
  std::vector<int64_t> found(requests.size(), 0);
  for (size_t q = 0; q < requests.size(); q++) {
    const SliceKey& want = requests[q].key;
    ENSURE(want.tensor >= 0 && size_t(want.tensor) < meta.names.size(), "a request for a tensor the checkpoint lacks");
    const std::vector<Run> mine = global_runs(want, meta.shapes[size_t(want.tensor)]);
    if (mine.empty()) continue;
    const int64_t lo = mine.front().global, hi = mine.back().global + mine.back().n;
    for (int index : saved_of[{want.tensor, want.array}]) {
      auto at = saved_runs.find(index);
      if (at == saved_runs.end())
        at = saved_runs.emplace(index, global_runs(meta.slices[size_t(index)].key, meta.shapes[size_t(want.tensor)])).first;
      const std::vector<Run>& theirs = at->second;
      if (theirs.empty() || theirs.back().global + theirs.back().n <= lo || theirs.front().global >= hi) continue;
      // Both lists increase in global offset: one sweep finds every overlap.
      size_t a = 0, b = 0;
      while (a < mine.size() && b < theirs.size()) {
        const Run &x = mine[a], &y = theirs[b];
        const int64_t begin = std::max(x.global, y.global), end = std::min(x.global + x.n, y.global + y.n);
        if (begin < end) {
          copies[index].push_back({q, y.local + (begin - y.global), x.local + (begin - x.global), end - begin});
          found[q] += end - begin;
        }
        if (x.global + x.n <= y.global + y.n) a++;
        else b++;
      }
    }
  }
  // Each element is saved once, so a request is complete exactly when it found all of its elements.
  for (size_t q = 0; q < requests.size(); q++)
    if (found[q] != requests[q].key.count())
      return "checkpoint '" + folder + "' holds " + std::to_string(found[q]) + " of the " +
             std::to_string(requests[q].key.count()) + " elements this rank needs of " +
             tensor_text(meta, requests[q].key) + " (a shard file is missing from its metadata)";

  std::vector<float> bytes;
  std::map<int, std::ifstream> open;
  for (const auto& [index, list] : copies) {
    const SavedSlice& s = meta.slices[size_t(index)];
    const std::string file = folder + meta.files[size_t(s.file)].name;
    auto in = open.find(s.file);
    if (in == open.end()) {
      const std::string missing = file_problem(folder, meta, s.file);
      if (!missing.empty()) return missing;
      in = open.emplace(s.file, std::ifstream(file, std::ios::binary)).first;
      if (!in->second) return "cannot open shard file '" + file + "' of checkpoint '" + folder + "'";
    }
    bytes.resize(size_t(s.key.count()));
    in->second.seekg(s.offset);
    if (!in->second.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size() * sizeof(float))))
      return "cannot read " + tensor_text(meta, s.key) + " from shard file '" + file + "' of checkpoint '" + folder + "'";
    if (fnv1a(reinterpret_cast<const char*>(bytes.data()), bytes.size() * sizeof(float)) != s.hash)
      return "shard file '" + file + "' of checkpoint '" + folder + "' is corrupted: " + tensor_text(meta, s.key) +
             " does not match its hash (the file changed after it was written)";
    for (const Copy& c : list)
      std::memcpy(requests[c.request].dst + c.to, bytes.data() + c.from, size_t(c.n) * sizeof(float));
  }
  return "";
}

std::string read_sharded_whole(const std::string& folder, const ShardedMeta& meta, const ParamLayout& global,
                               float* params, float* adam_m, float* adam_v) {
  const std::string model = sharded_model_problem(folder, meta, global);
  if (!model.empty()) return model;
  std::vector<SliceRequest> requests;
  float* arrays[3] = {params, adam_m, adam_v};
  for (int array = 0; array < 3; array++) {
    std::memset(arrays[array], 0, size_t(global.padded_size) * sizeof(float));
    for (size_t i = 0; i < global.params.size(); i++) {
      const ParamInfo& p = global.params[i];
      SliceRequest r;
      r.key.tensor = int(i);
      r.key.array = array;
      r.key.rows = p.shape[0];
      r.key.cols = p.ndim == 2 ? p.shape[1] : 1;
      r.key.end = p.size;
      r.dst = arrays[array] + p.offset;
      requests.push_back(r);
    }
  }
  return load_sharded_slices(folder, meta, requests);
}
