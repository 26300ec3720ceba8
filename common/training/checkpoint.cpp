// checkpoint.cpp: the checkpoint format of checkpoint.h, its writer, its validator and the
// collective save/load. Rank 0 does all file work; the other ranks only take part in the barrier
// (save) or the agreement and broadcasts (load), so a bad file stops every rank with one message.
#include "training/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/check.h"   // ENSURE
#include "training/checkpoint_sharded.h"  // a folder's header
#include "base/fileio.h"  // read_whole_file, write_file_atomically

// The float arrays are copied to and from the file with memcpy, which writes little-endian only on
// a little-endian machine. Every machine we run on (x86-64, aarch64) is one; a big-endian port
// would swap bytes in ByteWriter::floats and ByteReader::floats.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint.cpp assumes a little-endian host");

namespace {

constexpr char kMagic[8] = {'G', 'P', 'T', '2', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 3;  // what this build writes; it reads 1 to 3
// magic, version, L C NH T V, step, batch, data position, seed, [v2: 7 settings], [v3: experts, top-k,
// capacity factor, balance-loss coefficient, grad accum], tensor count
constexpr size_t kSettingsBytes = 7 * 8;
constexpr size_t kMoEBytes = 2 * 4 + 3 * 8;
size_t header_bytes(uint32_t version) {
  return sizeof(kMagic) + 4 + 5 * 4 + 4 * 8 + (version >= 2 ? kSettingsBytes : 0) + (version >= 3 ? kMoEBytes : 0) + 4;
}
constexpr size_t kTrailerBytes = 8;  // the hash

// Integers are written byte by byte, least significant first: the file is little-endian whatever
// the machine, and the code shows the format.
class ByteWriter {
 public:
  explicit ByteWriter(size_t capacity) { bytes_.reserve(capacity); }
  void u32(uint32_t x) {
    for (int i = 0; i < 4; i++) bytes_.push_back(char(x >> (8 * i)));
  }
  void u64(uint64_t x) {
    for (int i = 0; i < 8; i++) bytes_.push_back(char(x >> (8 * i)));
  }
  void f64(double x) {
    uint64_t bits;
    std::memcpy(&bits, &x, 8);
    u64(bits);
  }
  void raw(const void* data, size_t n) { bytes_.append(static_cast<const char*>(data), n); }
  void floats(const float* data, int64_t count) { raw(data, size_t(count) * sizeof(float)); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

// Reads what ByteWriter wrote. Reading past the end returns zeros and clears ok(), so a parser can
// read a whole header and check once; nothing is ever allocated from a size it has not checked.
class ByteReader {
 public:
  ByteReader(const std::string& bytes, size_t end) : bytes_(bytes), end_(end) {}
  bool ok() const { return ok_; }
  size_t position() const { return pos_; }
  size_t remaining() const { return end_ - pos_; }

  void skip(size_t n) { take(n); }
  uint32_t u32() { return uint32_t(little_endian(4)); }
  uint64_t u64() { return little_endian(8); }
  double f64() {
    const uint64_t bits = u64();
    double x;
    std::memcpy(&x, &bits, 8);
    return x;
  }
  std::string text(size_t n) {
    if (!take(n)) return std::string();
    return bytes_.substr(pos_ - n, n);
  }
  void floats(float* out, int64_t count) {
    size_t n = size_t(count) * sizeof(float);
    if (take(n)) std::memcpy(out, bytes_.data() + pos_ - n, n);
  }

 private:
  bool take(size_t n) {
    if (!ok_ || n > remaining()) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  uint64_t little_endian(int n) {
    if (!take(size_t(n))) return 0;
    uint64_t x = 0;
    for (int i = 0; i < n; i++) x |= uint64_t(uint8_t(bytes_[pos_ - n + i])) << (8 * i);
    return x;
  }

  const std::string& bytes_;
  size_t end_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// The length of a checkpoint of this layout's model: what an intact file must measure.
size_t checkpoint_size(const ParamLayout& layout, uint32_t version) {
  size_t table = 0;
  for (const ParamInfo& p : layout.params) table += 4 + p.name.size() + 4 + 8 * size_t(p.ndim);
  return header_bytes(version) + table + 3 * size_t(layout.num_params) * sizeof(float) + kTrailerBytes;
}

// The settings of a version-2 header, in file order.
void write_settings(ByteWriter& out, const TrainingSettings& s) {
  out.u64(uint64_t(s.steps));
  out.u64(uint64_t(s.warmup));
  out.f64(s.lr);
  out.f64(s.weight_decay);
  out.f64(s.grad_clip);
  out.u64(s.data_length);
  out.u64(s.data_hash);
}
TrainingSettings read_settings(ByteReader& in) {
  TrainingSettings s;
  s.steps = int64_t(in.u64());
  s.warmup = int64_t(in.u64());
  s.lr = in.f64();
  s.weight_decay = in.f64();
  s.grad_clip = in.f64();
  s.data_length = in.u64();
  s.data_hash = in.u64();
  return s;
}

// The mixture of experts of a version-3 header, in file order: the model's kind, then its settings.
void write_moe(ByteWriter& out, const GPT2Config& cfg, const TrainingSettings& s) {
  out.u32(uint32_t(cfg.experts));
  out.u32(uint32_t(cfg.top_k));
  out.f64(s.capacity_factor);
  out.f64(s.aux_loss_coef);
  out.u64(uint64_t(s.grad_accum));
}
void read_moe(ByteReader& in, CheckpointHeader* h) {
  h->experts = int64_t(in.u32());
  h->top_k = int64_t(in.u32());
  h->settings.capacity_factor = in.f64();
  h->settings.aux_loss_coef = in.f64();
  h->settings.grad_accum = int64_t(in.u64());
}

// "has format version 7, but this build reads versions 1 to 3", or "" for a version it reads.
std::string version_problem(const std::string& file, uint32_t version) {
  if (version >= 1 && version <= kVersion) return "";
  return file + " has format version " + std::to_string(version) + ", but this build reads versions 1 to " +
         std::to_string(kVersion);
}

std::string model_text(uint64_t L, uint64_t C, uint64_t NH, uint64_t T, uint64_t V, int64_t experts, int64_t top_k) {
  std::ostringstream s;
  s << "L=" << L << " C=" << C << " NH=" << NH << " T=" << T << " V=" << V;
  if (experts > 0) s << " with " << experts << " experts, top-" << top_k;
  return s.str();
}

std::string shape_text(int ndim, const uint64_t* dims) {
  std::string s = "[";
  for (int d = 0; d < ndim; d++) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + "]";
}

// The preset whose shape is L C NH T V (and, where known, whose experts and top-k are these), for
// the hint "pass --preset NAME"; "" when none is.
std::string preset_with_shape(uint64_t L, uint64_t C, uint64_t NH, uint64_t T, uint64_t V, bool kind_known,
                              int64_t experts, int64_t top_k) {
  std::istringstream names(preset_names());  // "tiny, small, gpt2"
  std::string name;
  while (std::getline(names >> std::ws, name, ',')) {
    GPT2Config preset;
    if (find_preset(name, &preset) && uint64_t(preset.L) == L && uint64_t(preset.C) == C &&
        uint64_t(preset.NH) == NH && uint64_t(preset.T) == T && uint64_t(preset.V) == V &&
        (!kind_known || (preset.experts == experts && preset.top_k == top_k))) {
      return name;
    }
  }
  return "";
}

// What the header holds once it has been checked against the run.
struct CheckedHeader {
  int64_t step = 0;
  size_t data_offset = 0;  // where the parameter array starts
};

// The validator behind validate_checkpoint_bytes() and load_checkpoint(). The order of the checks
// decides which message a damaged file gets: magic and version first (is this our format at all?),
// then the hash over the whole file (is it intact?), and only then the header's meaning (does it
// fit this run?). A header is not believed before the hash vouched for it.
std::string truncated_message(const std::string& file, size_t expected, size_t found) {
  return file + " is truncated: expected " + std::to_string(expected) + " bytes, found " + std::to_string(found) +
         " (an incomplete copy? saves themselves are atomic)";
}
std::string corrupted_message(const std::string& file) {
  return file + " is corrupted: hash mismatch (the file changed after it was written)";
}

std::string check_checkpoint(const std::string& path, const std::string& bytes, const GPT2Config& cfg,
                             const ParamLayout& layout, int64_t expected_batch, CheckedHeader* out) {
  const std::string file = "checkpoint '" + path + "'";
  size_t expected_size = checkpoint_size(layout, kVersion);
  auto truncated = [&]() { return truncated_message(file, expected_size, bytes.size()); };

  const size_t magic_bytes = std::min(bytes.size(), sizeof(kMagic));
  if (bytes.compare(0, magic_bytes, kMagic, magic_bytes) != 0)
    return file + " is not a checkpoint (bad magic: it does not start with \"GPT2CKPT\")";
  if (bytes.size() < header_bytes(1) + kTrailerBytes) return truncated();

  ByteReader in(bytes, bytes.size() - kTrailerBytes);
  in.skip(sizeof(kMagic));
  const uint32_t version = in.u32();
  const std::string unreadable = version_problem(file, version);
  if (!unreadable.empty()) return unreadable;
  expected_size = checkpoint_size(layout, version);
  if (bytes.size() < header_bytes(version) + kTrailerBytes) return truncated();

  ByteReader trailer(bytes, bytes.size());
  trailer.skip(bytes.size() - kTrailerBytes);
  if (trailer.u64() != fnv1a(bytes.data(), bytes.size() - kTrailerBytes)) {
    // A shorter file than this model needs was most likely cut off; otherwise bytes changed.
    if (bytes.size() < expected_size) return truncated();
    return corrupted_message(file);
  }

  const uint64_t L = in.u32(), C = in.u32(), NH = in.u32(), T = in.u32(), V = in.u32();
  const uint64_t step = in.u64(), batch = in.u64(), data_position = in.u64();
  in.u64();  // the seed: informative only, a resumed run may change it
  if (version >= 2) in.skip(kSettingsBytes);  // checked against the run by read_checkpoint_header's caller
  CheckpointHeader shape;
  shape.version = version;
  if (version >= 3) read_moe(in, &shape);  // the settings likewise; the model's kind here
  const uint64_t tensor_count = in.u32();
  shape.L = int64_t(L), shape.C = int64_t(C), shape.NH = int64_t(NH), shape.T = int64_t(T), shape.V = int64_t(V);
  const std::string other_model = checkpoint_model_problem(path, shape, cfg);
  if (!other_model.empty()) return other_model;
  if (tensor_count != layout.params.size())
    return file + " has " + std::to_string(tensor_count) + " tensors but this model has " +
           std::to_string(layout.params.size()) + " (saved by another version of the code?)";

  // With a valid hash, a table that does not fit the file was not written by save_checkpoint().
  auto malformed = [&]() {
    return file + " is malformed: its tensor table does not fit its length of " +
           std::to_string(bytes.size()) + " bytes";
  };
  for (size_t i = 0; i < layout.params.size(); i++) {
    const ParamInfo& expected = layout.params[i];
    const uint32_t name_length = in.u32();
    if (name_length > in.remaining()) return malformed();  // before allocating the name
    const std::string name = in.text(name_length);
    const uint32_t ndim = in.u32();
    if (ndim > 2 || ndim * 8 > in.remaining()) return malformed();
    uint64_t dims[2] = {0, 0};
    for (uint32_t d = 0; d < ndim; d++) dims[d] = in.u64();
    uint64_t expected_dims[2] = {uint64_t(expected.shape[0]), uint64_t(expected.shape[1])};
    bool same_shape = int(ndim) == expected.ndim;
    for (int d = 0; same_shape && d < expected.ndim; d++) same_shape = dims[d] == expected_dims[d];
    if (name != expected.name || !same_shape)
      return file + " does not match this model: tensor " + std::to_string(i) + " is '" + name + "' " +
             shape_text(int(ndim), dims) + " in the checkpoint but '" + expected.name + "' " +
             shape_text(expected.ndim, expected_dims) + " in this model (saved by another version of the code?)";
  }
  // The table equals this model's, so the arrays that follow must have exactly its sizes.
  if (!in.ok() || bytes.size() != expected_size) return malformed();

  if (batch != uint64_t(expected_batch))
    return file + " was trained with --batch " + std::to_string(batch) + "; pass --batch " +
           std::to_string(batch) + " to resume (another batch would change the data order)";
  if (step > uint64_t(INT64_MAX) / (batch ? batch : 1) || data_position != step * batch)
    return file + " is inconsistent: data position " + std::to_string(data_position) + " is not step " +
           std::to_string(step) + " x batch " + std::to_string(batch);

  out->step = int64_t(step);
  out->data_offset = in.position();
  return "";
}

// Copies one array of the file (table order, no padding) into a padded flat array.
void read_array(ByteReader& in, const ParamLayout& layout, float* flat) {
  std::memset(flat, 0, size_t(layout.padded_size) * sizeof(float));  // padding stays zero
  for (const ParamInfo& p : layout.params) in.floats(flat + p.offset, p.size);
}

}  // namespace

std::string serialize_checkpoint(const GPT2Config& cfg, const ParamLayout& layout,
                                 const CheckpointData& data) {
  ENSURE(data.params && data.adam_m && data.adam_v, "serialize_checkpoint needs all three arrays");
  ENSURE(data.step >= 0 && data.global_batch >= 1, "checkpoint step or batch out of range");
  ByteWriter out(checkpoint_size(layout, kVersion));
  out.raw(kMagic, sizeof(kMagic));
  out.u32(kVersion);
  for (int dim : {cfg.L, cfg.C, cfg.NH, cfg.T, cfg.V}) out.u32(uint32_t(dim));
  out.u64(uint64_t(data.step));
  out.u64(uint64_t(data.global_batch));
  out.u64(uint64_t(data.step) * uint64_t(data.global_batch));  // global samples consumed
  out.u64(data.seed);
  write_settings(out, data.settings);
  write_moe(out, cfg, data.settings);
  out.u32(uint32_t(layout.params.size()));
  for (const ParamInfo& p : layout.params) {
    out.u32(uint32_t(p.name.size()));
    out.raw(p.name.data(), p.name.size());
    out.u32(uint32_t(p.ndim));
    for (int d = 0; d < p.ndim; d++) out.u64(uint64_t(p.shape[d]));
  }
  // Tensor by tensor, leaving out the padding: the file does not depend on the rank count.
  for (const float* flat : {data.params, data.adam_m, data.adam_v})
    for (const ParamInfo& p : layout.params) out.floats(flat + p.offset, p.size);
  out.u64(fnv1a(out.bytes().data(), out.bytes().size()));
  ENSURE(out.bytes().size() == checkpoint_size(layout, kVersion), "checkpoint size differs from its layout");
  return std::move(out.bytes());
}

std::string validate_checkpoint_bytes(const std::string& path, const std::string& bytes,
                                      const GPT2Config& cfg, const ParamLayout& layout,
                                      int64_t expected_batch) {
  CheckedHeader header;
  return check_checkpoint(path, bytes, cfg, layout, expected_batch, &header);
}

std::string checkpoint_model_problem(const std::string& path, const CheckpointHeader& h, const GPT2Config& cfg) {
  const bool kind_known = h.version >= 3;  // before, the tensor table tells a MoE model apart
  const bool same_kind = !kind_known || (h.experts == cfg.experts && h.top_k == cfg.top_k);
  if (h.L == cfg.L && h.C == cfg.C && h.NH == cfg.NH && h.T == cfg.T && h.V == cfg.V && same_kind) return "";
  const uint64_t L = uint64_t(h.L), C = uint64_t(h.C), NH = uint64_t(h.NH), T = uint64_t(h.T), V = uint64_t(h.V);
  const std::string preset = preset_with_shape(L, C, NH, T, V, kind_known, h.experts, h.top_k);
  return "checkpoint '" + path + "' was saved with model " + model_text(L, C, NH, T, V, h.experts, h.top_k) +
         " but this run is " + model_text(cfg.L, cfg.C, cfg.NH, cfg.T, cfg.V, kind_known ? cfg.experts : 0, cfg.top_k) +
         (preset.empty() ? " (no preset has the checkpoint's shape)" : " (pass --preset " + preset + " to resume it)");
}

namespace {

// Whether the file is as long as its header's model needs and its hash matches, read a few MB at a
// time: this runs before the memory forecast, so the file is never held whole. Dimensions are read
// before the hash vouched for them: a layout is built from them only if they are a plausible model's.
std::string intactness_problem(const std::string& path, const std::string& file, const CheckpointHeader& header) {
  GPT2Config shape;
  shape.L = int(header.L), shape.C = int(header.C), shape.NH = int(header.NH), shape.T = int(header.T);
  shape.V = int(header.V);
  shape.experts = int(header.experts), shape.top_k = int(header.top_k);
  const bool plausible = shape.L > 0 && shape.L <= 4096 && shape.C > 0 && shape.C <= 65536 && shape.NH > 0 &&
                         shape.C % shape.NH == 0 && shape.T > 0 && shape.T <= (1 << 20) && shape.V > 0 &&
                         shape.V <= (1 << 24) && shape.experts >= 0 && shape.experts <= 4096 &&
                         shape.top_k >= 0 && shape.top_k <= shape.experts && (shape.experts == 0) == (shape.top_k == 0);
  if (!plausible)
    return file + " is corrupted: its header names no model (L=" + std::to_string(header.L) + " C=" +
           std::to_string(header.C) + " NH=" + std::to_string(header.NH) + ")";
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "cannot open '" + path + "'; pass --resume PATH with a file written by --save";
  const size_t size = size_t(in.tellg());
  const size_t expected = checkpoint_size(build_gpt2_layout(shape, 1), header.version);
  if (size < expected) return truncated_message(file, expected, size);
  in.seekg(0);
  std::vector<char> piece(size_t(4) << 20);
  uint64_t hash = kFnv1aStart;
  for (size_t left = size - kTrailerBytes; left > 0;) {
    const size_t n = std::min(left, piece.size());
    if (!in.read(piece.data(), std::streamsize(n))) return "cannot read '" + path + "'";
    hash = fnv1a(piece.data(), n, hash);
    left -= n;
  }
  std::string trailer(kTrailerBytes, '\0');
  if (!in.read(&trailer[0], kTrailerBytes)) return "cannot read '" + path + "'";
  ByteReader stored(trailer, trailer.size());
  return stored.u64() == hash ? "" : corrupted_message(file);
}

}  // namespace

std::string read_checkpoint_file_header(const std::string& path, CheckpointHeader* out) {
  CheckpointHeader header;
  std::string error;
  const std::string file = "checkpoint '" + path + "'";
  std::string bytes;
  if (!read_file_prefix(path, header_bytes(kVersion), &bytes, &error)) {
    error += "; pass --resume PATH with a file written by --save";
  } else if (bytes.compare(0, std::min(bytes.size(), sizeof(kMagic)), kMagic, std::min(bytes.size(), sizeof(kMagic))) != 0) {
    error = file + " is not a checkpoint (bad magic: it does not start with \"GPT2CKPT\")";
  } else if (bytes.size() < header_bytes(1)) {
    error = file + " is truncated: it ends inside its header";
  } else {
    ByteReader in(bytes, bytes.size());
    in.skip(sizeof(kMagic));
    header.version = in.u32();
    error = version_problem(file, header.version);
    if (error.empty() && bytes.size() < header_bytes(header.version)) error = file + " is truncated: it ends inside its header";
    if (error.empty()) {
      header.L = in.u32(), header.C = in.u32(), header.NH = in.u32(), header.T = in.u32(), header.V = in.u32();
      header.step = int64_t(in.u64());
      header.global_batch = int64_t(in.u64());
      in.u64();  // data position: checked with the whole file when it is loaded
      header.seed = in.u64();
      header.has_settings = header.version >= 2;
      if (header.has_settings) header.settings = read_settings(in);
      header.has_moe_settings = header.version >= 3;
      if (header.has_moe_settings) read_moe(in, &header);
    }
    // The settings are believed only once the hash has vouched for the whole file, as it will when
    // the file is loaded: a damaged checkpoint is called damaged, not a run with other settings.
    if (error.empty()) error = intactness_problem(path, file, header);
  }
  *out = header;
  return error;
}

CheckpointHeader read_checkpoint_header(Communicator& comm, const std::string& path) {
  if (is_sharded_path(path)) return broadcast_sharded_meta(comm, path).header;
  CheckpointHeader header;
  std::string error;
  if (comm.rank() == 0) error = read_checkpoint_file_header(path, &header);
  comm.agree_or_die(error.empty(), error);
  comm.broadcast_bytes(&header, sizeof header, 0);  // plain numbers: the same layout on every rank
  return header;
}

void save_checkpoint(Communicator& comm, const std::string& path, const GPT2Config& cfg,
                     const ParamLayout& layout, const CheckpointData& data) {
  if (comm.rank() == 0) {
    const std::string bytes = serialize_checkpoint(cfg, layout, data);
    write_file_atomically(path, bytes.data(), bytes.size());
  }
  // No rank may go on (and perhaps read the file, or exit) before it is complete.
  comm.barrier();
}

std::string read_checkpoint_file(const std::string& path, const GPT2Config& cfg, const ParamLayout& layout,
                                 int64_t expected_batch, float* params, float* adam_m, float* adam_v, int64_t* step) {
  std::string bytes, error;
  if (!read_whole_file(path, &bytes, &error)) return error + "; pass --resume PATH with a file written by --save";
  CheckedHeader header;
  error = check_checkpoint(path, bytes, cfg, layout, expected_batch, &header);
  if (!error.empty()) return error;
  ByteReader in(bytes, bytes.size() - kTrailerBytes);
  in.skip(header.data_offset);
  for (float* flat : {params, adam_m, adam_v}) read_array(in, layout, flat);
  ENSURE(in.ok() && in.remaining() == 0, "checkpoint arrays do not fill the checked length");
  *step = header.step;
  return "";
}

int64_t load_checkpoint(Communicator& comm, const std::string& path, const GPT2Config& cfg,
                        const ParamLayout& layout, int64_t expected_batch, float* params, float* adam_m,
                        float* adam_v) {
  ENSURE(params && adam_m && adam_v, "load_checkpoint needs all three arrays on every rank");
  std::string error;
  int64_t step = 0;
  if (comm.rank() == 0) error = read_checkpoint_file(path, cfg, layout, expected_batch, params, adam_m, adam_v, &step);
  // Only rank 0 saw the file: everyone learns here whether to go on, before any broadcast.
  comm.agree_or_die(error.empty(), error);
  comm.broadcast_bytes(&step, sizeof(step), 0);
  for (float* flat : {params, adam_m, adam_v}) comm.broadcast(make_view(flat, {layout.padded_size}), 0);
  return step;
}
