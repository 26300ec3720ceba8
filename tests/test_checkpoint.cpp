// test_checkpoint.cpp: the checkpoint format and its collective save and load, run on several ranks:
//   mpiexec -n 1 ./test_checkpoint && mpiexec -n 2 ./test_checkpoint
// A round trip must be bit-exact (memcmp, no tolerance): resuming is only honest if the resumed run
// continues exactly where the saved one stopped. A load that fails ends the whole job, so the
// failures are tested through validate_checkpoint_bytes(), the pure check load_checkpoint() runs:
// every message is produced here from a real checkpoint with one thing changed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "training/checkpoint.h"
#include "model/model_config.h"
#include "mpi_test_env.h"
#include "model/param_layout.h"
#include "test_util.h"

namespace {

constexpr int64_t kBatch = 8;

GPT2Config preset(const char* name) {
  GPT2Config cfg;
  EXPECT_TRUE(find_preset(name, &cfg)) << name;
  return cfg;
}

// What a checkpoint holds: the three padded flat arrays of a training run.
struct TrainingState {
  std::vector<float> params, adam_m, adam_v;

  // Random real elements, zero padding, the same on every rank for the same seed.
  TrainingState(const ParamLayout& layout, uint64_t seed)
      : params(size_t(layout.padded_size)), adam_m(params.size()), adam_v(params.size()) {
    Rng rng(seed);
    for (std::vector<float>* array : {&params, &adam_m, &adam_v})
      for (const ParamInfo& p : layout.params)
        for (int64_t i = 0; i < p.size; i++) (*array)[size_t(p.offset + i)] = rng.uniform(-1.0f, 1.0f);
  }
  // Every byte set to 0xFF (a NaN), so that an element the load forgets to write shows.
  explicit TrainingState(const ParamLayout& layout)
      : params(size_t(layout.padded_size)), adam_m(params.size()), adam_v(params.size()) {
    for (std::vector<float>* array : {&params, &adam_m, &adam_v})
      std::memset(array->data(), 0xFF, array->size() * sizeof(float));
  }

  CheckpointData data(int64_t step) const {
    CheckpointData d;
    d.step = step;
    d.global_batch = kBatch;
    d.seed = 1337;
    d.settings.steps = 50;
    d.settings.warmup = 5;
    d.settings.lr = 3e-3;
    d.settings.weight_decay = 0.1f;
    d.settings.grad_clip = 1.0;
    d.settings.data_length = 123456;
    d.settings.data_hash = 0xFEEDFACECAFEBEEFull;
    d.settings.capacity_factor = 1.25;
    d.settings.aux_loss_coef = 0.02;
    d.settings.grad_accum = 2;
    d.params = params.data();
    d.adam_m = adam_m.data();
    d.adam_v = adam_v.data();
    return d;
  }
};

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A path in the temporary folder that every rank agrees on (rank 0's process id makes it unique
// to this job, so concurrent test runs do not share files).
std::string shared_path(const std::string& name) {
  int64_t pid = getpid();
  test_comm().broadcast_bytes(&pid, sizeof(pid), 0);
  return ::testing::TempDir() + "test_checkpoint_" + std::to_string(pid) + "_" + name;
}

int64_t save_and_load(const std::string& path, const GPT2Config& cfg, const ParamLayout& save_layout,
                      const TrainingState& saved, const ParamLayout& load_layout, TrainingState* loaded,
                      int64_t step) {
  Communicator& comm = test_comm();
  save_checkpoint(comm, path, cfg, save_layout, saved.data(step));
  const int64_t resumed = load_checkpoint(comm, path, cfg, load_layout, kBatch, loaded->params.data(),
                                          loaded->adam_m.data(), loaded->adam_v.data());
  comm.barrier();  // nobody still reads the file when rank 0 removes it
  if (comm.rank() == 0) std::remove(path.c_str());
  return resumed;
}

TEST(Checkpoint, RoundTripIsBitExact) {
  const GPT2Config cfg = preset("tiny");
  const ParamLayout layout = build_gpt2_layout(cfg, test_comm().size());
  const TrainingState saved(layout, 42);
  TrainingState loaded(layout);
  const int64_t step = save_and_load(shared_path("round_trip.bin"), cfg, layout, saved, layout, &loaded, 17);
  EXPECT_EQ(step, 17);
  // Padding included: the saved state has zero padding, so the loaded one must too.
  EXPECT_TRUE(same_bytes(loaded.params, saved.params));
  EXPECT_TRUE(same_bytes(loaded.adam_m, saved.adam_m));
  EXPECT_TRUE(same_bytes(loaded.adam_v, saved.adam_v));
}

TEST(Checkpoint, ResumesUnderAnotherPadding) {
  // Saved by a run on one rank count, resumed on another: the flat layouts differ in their
  // padding, the tensors must not. Odd sizes, so that the padding really differs (the tiny
  // preset's units happen to divide by 64 already).
  GPT2Config cfg;
  cfg.preset = "custom";
  cfg.L = 1, cfg.C = 20, cfg.NH = 2, cfg.T = 9, cfg.V = 37;
  for (auto ranks : {std::make_pair(2, 4), std::make_pair(2, 3), std::make_pair(4, 1)}) {
    SCOPED_TRACE("saved with the layout of " + std::to_string(ranks.first) + " ranks, loaded with that of " +
                 std::to_string(ranks.second));
    const ParamLayout saved_layout = build_gpt2_layout(cfg, ranks.first);
    const ParamLayout loaded_layout = build_gpt2_layout(cfg, ranks.second);
    ASSERT_NE(saved_layout.padded_size, loaded_layout.padded_size);  // or this test would prove nothing
    const TrainingState saved(saved_layout, 7);
    TrainingState loaded(loaded_layout);
    const int64_t step =
        save_and_load(shared_path("padding.bin"), cfg, saved_layout, saved, loaded_layout, &loaded, 3);
    EXPECT_EQ(step, 3);

    // The same values, placed by the other layout, with zero padding.
    const TrainingState expected(loaded_layout, 7);
    EXPECT_TRUE(same_bytes(loaded.params, expected.params));
    EXPECT_TRUE(same_bytes(loaded.adam_m, expected.adam_m));
    EXPECT_TRUE(same_bytes(loaded.adam_v, expected.adam_v));
    for (const ParamInfo& p : loaded_layout.params) {
      const ParamInfo& q = saved_layout.params[size_t(saved_layout.find(p.name))];
      EXPECT_EQ(0, std::memcmp(&loaded.params[size_t(p.offset)], &saved.params[size_t(q.offset)],
                               size_t(p.size) * sizeof(float)))
          << p.name;
    }
  }
}

// ---- The format, byte by byte, as checkpoint.h documents it. ----

// Little-endian integers of `bytes` bytes at `at`.
uint64_t read_le(const std::string& bytes, size_t at, int width) {
  uint64_t x = 0;
  for (int i = 0; i < width; i++) x |= uint64_t(uint8_t(bytes[at + i])) << (8 * i);
  return x;
}
uint32_t read_u32(const std::string& bytes, size_t at) { return uint32_t(read_le(bytes, at, 4)); }
uint64_t read_u64(const std::string& bytes, size_t at) { return read_le(bytes, at, 8); }
void write_u32(std::string* bytes, size_t at, uint32_t x) {
  for (int i = 0; i < 4; i++) (*bytes)[at + i] = char(x >> (8 * i));
}
double read_f64(const std::string& bytes, size_t at) {
  const uint64_t bits = read_u64(bytes, at);
  double x;
  std::memcpy(&x, &bits, 8);
  return x;
}

// FNV-1a, 64-bit, written here again from its definition, not taken from checkpoint.cpp.
uint64_t fnv1a(const std::string& bytes, size_t n) {
  uint64_t hash = 14695981039346656037ULL;
  for (size_t i = 0; i < n; i++) hash = (hash ^ uint8_t(bytes[i])) * 1099511628211ULL;
  return hash;
}
// After an edit, a valid trailer again, so that the check under test is not the hash.
void rehash(std::string* bytes) {
  const uint64_t hash = fnv1a(*bytes, bytes->size() - 8);
  for (int i = 0; i < 8; i++) (*bytes)[bytes->size() - 8 + i] = char(hash >> (8 * i));
}

TEST(CheckpointFormat, HeaderTableDataAndTrailerAsDocumented) {
  const GPT2Config cfg = preset("tiny");
  const ParamLayout layout = build_gpt2_layout(cfg, 1);
  const TrainingState state(layout, 1);
  const std::string bytes = serialize_checkpoint(cfg, layout, state.data(5));

  EXPECT_EQ(bytes.substr(0, 8), "GPT2CKPT");
  EXPECT_EQ(read_u32(bytes, 8), 3u);  // version
  EXPECT_EQ(read_u32(bytes, 12), uint32_t(cfg.L));
  EXPECT_EQ(read_u32(bytes, 16), uint32_t(cfg.C));
  EXPECT_EQ(read_u32(bytes, 20), uint32_t(cfg.NH));
  EXPECT_EQ(read_u32(bytes, 24), uint32_t(cfg.T));
  EXPECT_EQ(read_u32(bytes, 28), uint32_t(cfg.V));
  EXPECT_EQ(read_u64(bytes, 32), 5u);           // step
  EXPECT_EQ(read_u64(bytes, 40), 8u);           // global batch
  EXPECT_EQ(read_u64(bytes, 48), 5u * 8u);      // data position
  EXPECT_EQ(read_u64(bytes, 56), 1337u);        // seed
  // The training settings (version 2).
  EXPECT_EQ(read_u64(bytes, 64), 50u);          // steps
  EXPECT_EQ(read_u64(bytes, 72), 5u);           // warmup
  EXPECT_EQ(read_f64(bytes, 80), 3e-3);         // lr
  EXPECT_EQ(read_f64(bytes, 88), double(0.1f)); // weight decay
  EXPECT_EQ(read_f64(bytes, 96), 1.0);          // grad clip
  EXPECT_EQ(read_u64(bytes, 104), 123456u);     // data length
  EXPECT_EQ(read_u64(bytes, 112), 0xFEEDFACECAFEBEEFull);  // data hash
  // The mixture of experts (version 3): a dense model's kind, and the settings as given.
  EXPECT_EQ(read_u32(bytes, 120), 0u);          // experts
  EXPECT_EQ(read_u32(bytes, 124), 0u);          // top-k
  EXPECT_EQ(read_f64(bytes, 128), 1.25);        // capacity factor
  EXPECT_EQ(read_f64(bytes, 136), 0.02);        // balance-loss coefficient
  EXPECT_EQ(read_u64(bytes, 144), 2u);          // grad accum
  EXPECT_EQ(read_u32(bytes, 152), uint32_t(layout.params.size()));

  size_t at = 156;
  for (const ParamInfo& p : layout.params) {
    ASSERT_EQ(read_u32(bytes, at), p.name.size());
    EXPECT_EQ(bytes.substr(at + 4, p.name.size()), p.name);
    at += 4 + p.name.size();
    ASSERT_EQ(read_u32(bytes, at), uint32_t(p.ndim));
    for (int d = 0; d < p.ndim; d++) EXPECT_EQ(read_u64(bytes, at + 4 + 8 * d), uint64_t(p.shape[d])) << p.name;
    at += 4 + 8 * size_t(p.ndim);
  }
  // Parameters, m, v: each in table order, without padding.
  for (const std::vector<float>* array : {&state.params, &state.adam_m, &state.adam_v}) {
    for (const ParamInfo& p : layout.params) {
      EXPECT_EQ(0, std::memcmp(&bytes[at], &(*array)[size_t(p.offset)], size_t(p.size) * 4)) << p.name;
      at += size_t(p.size) * 4;
    }
  }
  ASSERT_EQ(bytes.size(), at + 8);
  EXPECT_EQ(read_u64(bytes, at), fnv1a(bytes, at));
}

TEST(CheckpointFormat, DoesNotDependOnTheRankCount) {
  const GPT2Config cfg = preset("tiny");
  const ParamLayout one = build_gpt2_layout(cfg, 1);
  const std::string reference = serialize_checkpoint(cfg, one, TrainingState(one, 9).data(2));
  for (int ranks : {2, 3, 4, 8}) {
    const ParamLayout layout = build_gpt2_layout(cfg, ranks);
    EXPECT_TRUE(serialize_checkpoint(cfg, layout, TrainingState(layout, 9).data(2)) == reference)
        << "saved with the layout of " << ranks << " ranks";
  }
}

// ---- Every way a checkpoint can be refused, through the check load_checkpoint() runs. ----

class CheckpointValidation : public ::testing::Test {
 protected:
  GPT2Config cfg = preset("tiny");
  ParamLayout layout = build_gpt2_layout(cfg, 2);
  std::string bytes = serialize_checkpoint(cfg, layout, TrainingState(layout, 3).data(10));

  std::string validate(const std::string& file) const {
    return validate_checkpoint_bytes("run.ckpt", file, cfg, layout, kBatch);
  }
};

// gtest's HasSubstr without gmock: the message itself is printed when it fails.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

TEST_F(CheckpointValidation, AnIntactFileIsAccepted) { EXPECT_EQ(validate(bytes), ""); }

TEST_F(CheckpointValidation, Truncated) {
  const std::string cut = bytes.substr(0, bytes.size() - 1000);
  EXPECT_CONTAINS(validate(cut), "checkpoint 'run.ckpt' is truncated: expected " + std::to_string(bytes.size()) +
                                     " bytes, found " + std::to_string(cut.size()));
  EXPECT_CONTAINS(validate(bytes.substr(0, 30)), "is truncated");   // inside the header
  EXPECT_CONTAINS(validate(bytes.substr(0, 4)), "is truncated");    // inside the magic
  EXPECT_CONTAINS(validate(""), "is truncated: expected");
}

TEST_F(CheckpointValidation, Corrupted) {
  for (size_t at : {size_t(40), bytes.size() / 2, bytes.size() - 1}) {  // header, data, trailer
    std::string damaged = bytes;
    damaged[at] ^= 0x10;
    EXPECT_CONTAINS(validate(damaged), "checkpoint 'run.ckpt' is corrupted: hash mismatch") << " byte " << at;
  }
  EXPECT_CONTAINS(validate(bytes + "x"), "is corrupted: hash mismatch");
}

TEST_F(CheckpointValidation, NotACheckpoint) {
  EXPECT_CONTAINS(validate("hello, this is a text file and no checkpoint at all"),
                  "checkpoint 'run.ckpt' is not a checkpoint (bad magic");
  std::string renamed = bytes;
  renamed[0] = 'g';
  EXPECT_CONTAINS(validate(renamed), "is not a checkpoint (bad magic");
}

TEST_F(CheckpointValidation, AnotherFormatVersion) {
  std::string future = bytes;
  write_u32(&future, 8, 4);
  rehash(&future);
  EXPECT_CONTAINS(validate(future), "has format version 4, but this build reads versions 1 to 3");
}

// Version 1 had no settings: the same file without bytes 64..152, which still loads.
std::string as_version_1(const std::string& v3) {
  std::string v1 = v3.substr(0, 64) + v3.substr(152);
  write_u32(&v1, 8, 1);
  rehash(&v1);
  return v1;
}
// Version 2 had no mixture of experts: the same file without bytes 120..152.
std::string as_version_2(const std::string& v3) {
  std::string v2 = v3.substr(0, 120) + v3.substr(152);
  write_u32(&v2, 8, 2);
  rehash(&v2);
  return v2;
}

TEST_F(CheckpointValidation, VersionTwoStillLoads) {
  const std::string v2 = as_version_2(bytes);
  EXPECT_EQ(validate(v2), "");
  EXPECT_CONTAINS(validate(v2.substr(0, v2.size() - 100)), "is truncated: expected " + std::to_string(v2.size()));
}

TEST_F(CheckpointValidation, VersionOneStillLoads) {
  const std::string v1 = as_version_1(bytes);
  EXPECT_EQ(validate(v1), "");
  EXPECT_CONTAINS(validate(v1.substr(0, v1.size() - 100)), "is truncated: expected " + std::to_string(v1.size()));
}

TEST(Checkpoint, VersionOneLoadsTheSameTensors) {
  Communicator& comm = test_comm();
  const GPT2Config cfg = preset("tiny");
  const ParamLayout layout = build_gpt2_layout(cfg, comm.size());
  const TrainingState saved(layout, 5);
  const std::string path = shared_path("v1.bin");
  if (comm.rank() == 0) {
    const std::string v1 = as_version_1(serialize_checkpoint(cfg, layout, saved.data(4)));
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(v1.data(), 1, v1.size(), f);
    std::fclose(f);
  }
  comm.barrier();
  const CheckpointHeader header = read_checkpoint_header(comm, path);
  EXPECT_EQ(header.version, 1u);
  EXPECT_FALSE(header.has_settings);
  EXPECT_EQ(header.step, 4);
  TrainingState loaded(layout);
  EXPECT_EQ(load_checkpoint(comm, path, cfg, layout, kBatch, loaded.params.data(), loaded.adam_m.data(),
                            loaded.adam_v.data()),
            4);
  EXPECT_TRUE(same_bytes(loaded.params, saved.params));
  comm.barrier();
  if (comm.rank() == 0) std::remove(path.c_str());
}

// The header a resumed run reads first carries the settings it must continue with.
TEST(Checkpoint, HeaderCarriesTheTrainingSettings) {
  Communicator& comm = test_comm();
  const GPT2Config cfg = preset("tiny");
  const ParamLayout layout = build_gpt2_layout(cfg, comm.size());
  const TrainingState saved(layout, 6);
  const std::string path = shared_path("settings.bin");
  save_checkpoint(comm, path, cfg, layout, saved.data(9));
  const CheckpointHeader header = read_checkpoint_header(comm, path);
  EXPECT_EQ(header.version, 3u);
  EXPECT_TRUE(header.has_settings);
  EXPECT_TRUE(header.has_moe_settings);
  EXPECT_EQ(header.experts, 0);
  EXPECT_EQ(header.settings.capacity_factor, 1.25);
  EXPECT_EQ(header.settings.aux_loss_coef, 0.02);
  EXPECT_EQ(header.settings.grad_accum, 2);
  EXPECT_EQ(header.step, 9);
  EXPECT_EQ(header.global_batch, kBatch);
  EXPECT_EQ(header.L, cfg.L);
  EXPECT_EQ(header.settings.steps, 50);
  EXPECT_EQ(header.settings.warmup, 5);
  EXPECT_EQ(header.settings.lr, 3e-3);
  EXPECT_EQ(header.settings.weight_decay, double(0.1f));
  EXPECT_EQ(header.settings.data_length, 123456u);
  EXPECT_EQ(header.settings.data_hash, 0xFEEDFACECAFEBEEFull);
  comm.barrier();
  if (comm.rank() == 0) std::remove(path.c_str());
}

// A MoE model's kind is in the header: the dense model of the same shape is told which preset
// the checkpoint needs, rather than that its tensor table differs.
TEST(Checkpoint, HeaderTellsAMixtureOfExpertsApart) {
  Communicator& comm = test_comm();
  const GPT2Config moe = preset("moe-tiny"), dense = preset("tiny");
  const ParamLayout layout = build_gpt2_layout(moe, comm.size());
  const std::string path = shared_path("moe.bin");
  save_checkpoint(comm, path, moe, layout, TrainingState(layout, 8).data(3));
  const CheckpointHeader header = read_checkpoint_header(comm, path);
  EXPECT_EQ(header.experts, moe.experts);
  EXPECT_EQ(header.top_k, moe.top_k);
  EXPECT_EQ(checkpoint_model_problem(path, header, moe), "");
  const std::string problem = checkpoint_model_problem(path, header, dense);
  EXPECT_NE(problem.find("with 4 experts, top-2"), std::string::npos) << problem;
  EXPECT_NE(problem.find("pass --preset moe-tiny"), std::string::npos) << problem;
  comm.barrier();
  if (comm.rank() == 0) std::remove(path.c_str());
}

TEST_F(CheckpointValidation, AnotherModel) {
  const GPT2Config small = preset("small");
  const ParamLayout small_layout = build_gpt2_layout(small, 2);
  const std::string other = serialize_checkpoint(small, small_layout, TrainingState(small_layout, 3).data(10));
  EXPECT_CONTAINS(validate(other),
                  "checkpoint 'run.ckpt' was saved with model L=4 C=128 NH=4 T=128 V=256 but this run is "
                  "L=2 C=64 NH=4 T=64 V=256 (pass --preset small to resume it)");

  GPT2Config custom = cfg;
  custom.L = 1;
  const ParamLayout custom_layout = build_gpt2_layout(custom, 2);
  const std::string unnamed = serialize_checkpoint(custom, custom_layout, TrainingState(custom_layout, 3).data(1));
  EXPECT_CONTAINS(validate(unnamed), "saved with model L=1 C=64");
  EXPECT_CONTAINS(validate(unnamed), "no preset has the checkpoint's shape");
}

TEST_F(CheckpointValidation, AnotherBatch) {
  EXPECT_EQ(validate_checkpoint_bytes("run.ckpt", bytes, cfg, layout, kBatch), "");
  EXPECT_CONTAINS(validate_checkpoint_bytes("run.ckpt", bytes, cfg, layout, 16),
                  "checkpoint 'run.ckpt' was trained with --batch 8; pass --batch 8 to resume");
}

TEST_F(CheckpointValidation, AnotherTensorName) {
  ParamLayout renamed = layout;
  ASSERT_EQ(renamed.params[4].name, "h0.attn.qkv.weight");
  renamed.params[4].name = "h0.attn.qkv.w";
  const std::string other = serialize_checkpoint(cfg, renamed, TrainingState(renamed, 3).data(10));
  EXPECT_CONTAINS(validate(other), "does not match this model: tensor 4 is 'h0.attn.qkv.w' [192, 64] in the "
                                   "checkpoint but 'h0.attn.qkv.weight' [192, 64] in this model");
}

TEST_F(CheckpointValidation, AnotherTensorShape) {
  // The same model config, but a table that shapes a tensor differently (another code version).
  ParamLayout reshaped = layout;
  ParamInfo& qkv = reshaped.params[size_t(reshaped.find("h0.attn.qkv.weight"))];
  std::swap(qkv.shape[0], qkv.shape[1]);
  const std::string other = serialize_checkpoint(cfg, reshaped, TrainingState(reshaped, 3).data(10));
  EXPECT_CONTAINS(validate(other), "tensor 4 is 'h0.attn.qkv.weight' [64, 192] in the checkpoint but "
                                   "'h0.attn.qkv.weight' [192, 64] in this model");
}

TEST_F(CheckpointValidation, AHugeSizeInTheTableIsNotBelieved) {
  // A name length of 4 GB with a valid hash: the check must refuse it without allocating it.
  std::string forged = bytes;
  write_u32(&forged, 156, 0xFFFFFFFFu);
  rehash(&forged);
  EXPECT_CONTAINS(validate(forged), "checkpoint 'run.ckpt' is malformed: its tensor table does not fit");

  std::string many_tensors = bytes;
  write_u32(&many_tensors, 152, 0xFFFFFFFFu);
  rehash(&many_tensors);
  EXPECT_CONTAINS(validate(many_tensors), "has 4294967295 tensors but this model has");
}

TEST_F(CheckpointValidation, ADataPositionThatIsNotStepTimesBatch) {
  std::string forged = bytes;
  write_u32(&forged, 48, 81);  // step 10 x batch 8 would be 80
  rehash(&forged);
  EXPECT_CONTAINS(validate(forged), "is inconsistent: data position 81 is not step 10 x batch 8");
}

}  // namespace
