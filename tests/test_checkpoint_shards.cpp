// test_checkpoint_shards.cpp: the sharded checkpoint (--save DIR/, checkpoint_sharded.h) through the
// real trainers: a folder saved on one grid resumes on others with the uninterrupted run's losses;
// the bytes each rank writes are its owned slices and sum to 12 Psi; a missing or corrupted shard, or
// a folder whose save was cut short, is refused in one sentence naming the file and the tensor; and
// the previous checkpoint survives a save that did not finish, one whose rank was killed mid-save too; build/checkpoint_convert turns a folder
// into one file and back. Tiny presets, four steps.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "parallel/shards.h"
#include "training_harness.h"

namespace {

constexpr int kSteps = 4;  // saved after step 2, resumed for steps 2 and 3
constexpr double kTolerance = 1e-5;

struct Source {
  std::string name;
  Grid grid;
  std::string preset;
};

// Trains `source` kSteps steps saving a folder half-way (DIR_2/); returns the losses of the steps after it.
LossCurve train_and_save(const Source& source, const std::string& at) {
  const std::string flags = "--preset " + source.preset + " --steps " + std::to_string(kSteps) + " " + source.grid.flags +
                            " --json " + at + ".jsonl --save " + at + "_{step}/ --save-every " + std::to_string(kSteps / 2);
  const RunResult run = run_trainer(source.grid.chapter, source.grid.ranks, flags);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  LossCurve curve = read_losses(at + ".jsonl");
  EXPECT_EQ(int(curve.losses.size()), kSteps);
  curve.steps.erase(curve.steps.begin(), curve.steps.begin() + kSteps / 2);
  curve.losses.erase(curve.losses.begin(), curve.losses.begin() + kSteps / 2);
  return curve;
}

RunResult resume(const Grid& into, const std::string& preset, const std::string& folder, const std::string& jsonl) {
  return run_trainer(into.chapter, into.ranks,
                     "--preset " + preset + " --steps " + std::to_string(kSteps) + " " + into.flags + " --resume " +
                         folder + " --json " + jsonl);
}

int64_t file_size(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 ? int64_t(info.st_size) : -1;
}

GPT2Config preset(const std::string& name) {
  GPT2Config cfg;
  EXPECT_TRUE(find_preset(name, &cfg)) << name;
  return cfg;
}

// One source, saved once, resumed on every grid of `into`.
// (`at`: where the files go, a fresh temporary folder's by default.)
void expect_reshards(const Source& source, const std::vector<Grid>& into, std::string at = "") {
  if (at.empty()) at = temp_dir() + "/" + source.name;
  const LossCurve reference = train_and_save(source, at);
  const std::string folder = at + "_" + std::to_string(kSteps / 2) + "/";
  for (const Grid& grid : into) {
    const std::string jsonl = at + "_into_" + grid.chapter + std::to_string(grid.ranks) + ".jsonl";
    const RunResult run = resume(grid, source.preset, folder, jsonl);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_LE(max_relative_difference(read_losses(jsonl), reference), kTolerance)
        << source.name << " resumed in " << grid.chapter << " on " << grid.ranks << " ranks " << grid.flags;
  }
}

// Saved under ZeRO-3 on 4 ranks: resumed by one rank, by TP + SP, by a V pipeline, by CP, by ZeRO-2
// (ZeRO-1's folders are the refusals test's, resumed there). And the bytes written per rank: 12 x the real elements of its ZeRO pieces (docs/theory.md, the
// sharded checkpoint), computed here from the layout; their sum is 12 Psi, the three fp32 arrays.
TEST(ShardedCheckpoint, ZeRO3FolderResumesOnEveryGridAndWroteItsOwnedBytes) {
  const Source source{"zero3", {"06_zero3", 4, ""}, "tall"};
  const std::string at = temp_dir() + "/" + source.name;
  expect_reshards(source, {{"01_vanilla_dp", 1, ""},
                           {"07_tensor_parallel", 2, "--tp 2 --sequence-parallel"},
                           {"08_pipeline", 2, "--pp 2 --schedule zb-v"},
                           {"10_context_parallel", 2, "--cp 2"},
                           {"05_zero2", 4, ""}},
                  at);
  const ParamLayout layout = build_gpt2_layout(preset(source.preset), 4);
  int64_t sum = 0;
  for (int rank = 0; rank < 4; rank++) {
    const ShardPlan plan = ShardPlan::per_unit(layout, 4, rank);
    int64_t owned = 0;
    for (int i = 0; i < plan.count(); i++)
      for (const ParamInfo& p : layout.params) {
        const FlatRange piece = plan.piece(i);
        owned += std::max<int64_t>(0, std::min(p.offset + p.size, piece.end) - std::max(p.offset, piece.begin));
      }
    const int64_t bytes = file_size(at + "_2/step2.rank" + std::to_string(rank) + ".bin");
    EXPECT_EQ(bytes, 12 * owned) << "rank " << rank;
    sum += bytes;
  }
  EXPECT_EQ(sum, 12 * layout.num_params);
  // The run printed the same numbers beside the formula, and recorded them.
  const std::string record = read_record(at + ".jsonl", "checkpoint");
  EXPECT_EQ(number_field(record, "bytes_total"), double(12 * layout.num_params)) << record;
  EXPECT_EQ(number_field(record, "bytes_predicted"), double(12 * layout.num_params)) << record;
  EXPECT_EQ(number_field(record, "meta_bytes"), double(file_size(at + "_2/checkpoint.meta"))) << record;
}

// Saved by TP x CP (and PP x CP x EP for a mixture of experts) in 12: resumed on other grids and chapters.
TEST(ShardedCheckpoint, FiveDAndExpertFoldersResumeElsewhere) {
  expect_reshards({"tp_cp", {"12_5d_parallel", 4, "--tp 2 --cp 2 --sequence-parallel"}, "tiny"},
                  {{"06_zero3", 2, ""}, {"12_5d_parallel", 4, "--pp 2 --cp 2"}});
  expect_reshards({"moe", {"12_5d_parallel", 4, "--cp 2 --pp 2 --ep 2 --micro-batches 2"}, "moe-tiny"},
                  {{"11_expert_parallel", 2, "--ep 2 --grad-accum 2"},
                   {"12_5d_parallel", 4, "--tp 2 --pp 2 --ep 2 --sequence-parallel --micro-batches 2"}});
}

// The refusals: one line, the file and the tensor named, non-zero exit.
TEST(ShardedCheckpoint, MissingCorruptAndIncompleteFoldersAreRefused) {
  const Source source{"refusals", {"04_zero1", 2, ""}, "tiny"};
  const std::string at = temp_dir() + "/refusals";
  const LossCurve reference = train_and_save(source, at);
  const std::string folder = at + "_2/";
  auto refused = [&](const std::string& what, const std::vector<std::string>& words) {
    const RunResult run = resume({"04_zero1", 2, ""}, "tiny", folder, at + ".refused.jsonl");
    EXPECT_NE(run.exit_code, 0) << what << ": " << run.output;
    for (const std::string& word : words) EXPECT_NE(run.output.find(word), std::string::npos) << what << ": " << run.output;
    EXPECT_EQ(run.output.find("internal error"), std::string::npos) << run.output;
  };
  const std::string shard = folder + "step2.rank1.bin";
  // Corrupted: one byte of rank 1's file changed.
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 100u);
  std::string flipped = bytes;
  flipped[100] = char(flipped[100] ^ 0x40);
  std::ofstream(shard, std::ios::binary).write(flipped.data(), std::streamsize(flipped.size()));
  refused("a flipped byte", {"step2.rank1.bin", "is corrupted: tensor '", "does not match its hash"});
  // Missing.
  std::remove(shard.c_str());
  refused("a missing file", {"is missing its shard file", "step2.rank1.bin", "which holds tensor '"});
  std::ofstream(shard, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  // Cut short: a save that never wrote its metadata.
  const std::string meta = folder + "checkpoint.meta";
  std::rename(meta.c_str(), (meta + ".aside").c_str());
  refused("no metadata", {"is incomplete: it has no checkpoint.meta"});
  std::rename((meta + ".aside").c_str(), meta.c_str());
  // Restored, it resumes exactly; and so do its conversion to one file and that file's back to a folder.
  const RunResult to_file = run_command("build/checkpoint_convert " + folder + " " + at + ".ckpt", 60);
  ASSERT_EQ(to_file.exit_code, 0) << to_file.output;
  const RunResult to_folder = run_command("build/checkpoint_convert " + at + ".ckpt " + at + "_converted/", 60);
  ASSERT_EQ(to_folder.exit_code, 0) << to_folder.output;
  for (const std::string& path : {folder, at + ".ckpt", at + "_converted/"}) {
    const RunResult run = resume({"04_zero1", 2, ""}, "tiny", path, at + ".restored.jsonl");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_LE(max_relative_difference(read_losses(at + ".restored.jsonl"), reference), kTolerance) << path;
  }
}

// A save into a folder that already holds a checkpoint writes files of its own step's names and
// replaces the metadata last: a save cut short (its shard files written, no new metadata) leaves the
// previous checkpoint whole, and the next complete save removes the leftovers.
TEST(ShardedCheckpoint, PreviousCheckpointSurvivesASaveCutShort) {
  const std::string at = temp_dir() + "/survives";
  const std::string folder = at + "_2/";
  const LossCurve reference = train_and_save({"survives", {"05_zero2", 2, ""}, "tiny"}, at);
  // What a killed save of step 4 leaves: its shard files, not its metadata.
  std::ofstream(folder + "step4.rank0.bin") << "half-written";
  std::ofstream(folder + "step4.rank1.bin") << "half";
  const RunResult run = resume({"05_zero2", 2, ""}, "tiny", folder, at + ".after_cut.jsonl");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LE(max_relative_difference(read_losses(at + ".after_cut.jsonl"), reference), kTolerance);
  // A complete save into the folder: its own files and metadata, nothing else left.
  const RunResult again = run_trainer("05_zero2", 2, "--preset tiny --steps 4 --resume " + folder + " --save " + folder);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(file_size(folder + "step4.rank0.bin"), file_size(at + "_4/step4.rank0.bin"));
  EXPECT_EQ(file_size(folder + "step2.rank0.bin"), -1);
  EXPECT_EQ(file_size(folder + "step4.rank1.bin"), file_size(at + "_4/step4.rank1.bin"));
}

// A rank really killed in the middle of a save: GPT_CHECKPOINT_HOLD_STEP holds the save of step 4 once
// every shard file is written and before the metadata (checkpoint_sharded.cpp), and the test kills a
// rank there. The folder of that save is refused in one sentence; the previous one (step 2) resumes
// with the uninterrupted run's losses.
TEST(ShardedCheckpoint, ARankKilledDuringASaveLeavesThePreviousCheckpoint) {
  const std::string at = temp_dir() + "/killed";
  const RunResult full = run_trainer("04_zero1", 2, "--preset tiny --steps 4 --json " + at + ".full.jsonl");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  LossCurve reference = read_losses(at + ".full.jsonl");
  ASSERT_EQ(reference.losses.size(), 4u);
  reference.steps.erase(reference.steps.begin(), reference.steps.begin() + 2);
  reference.losses.erase(reference.losses.begin(), reference.losses.begin() + 2);

  setenv("GPT_CHECKPOINT_HOLD_STEP", "4", 1);
  BackgroundRun run = start_trainer("04_zero1", 2, "--preset tiny --steps 4 --save " + at + "_{step}/ --save-every 2");
  unsetenv("GPT_CHECKPOINT_HOLD_STEP");
  // Shard files appear by rename, whole: both there means the save holds before its metadata.
  const bool holding = wait_until([&] {
    return file_exists(at + "_4/step4.rank0.bin") && file_exists(at + "_4/step4.rank1.bin");
  }, 120);
  const std::vector<int> ranks = rank_pids(at);
  if (holding && !ranks.empty()) kill(ranks.back(), SIGKILL);
  const RunResult killed = wait_for(run, 120);
  ASSERT_TRUE(holding) << killed.output;
  ASSERT_EQ(ranks.size(), 2u) << killed.output;
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("holds before its metadata"), std::string::npos) << killed.output;
  EXPECT_FALSE(file_exists(at + "_4/checkpoint.meta"));

  // The half-written folder: refused, in one line, before any work.
  const RunResult refused = resume({"04_zero1", 2, ""}, "tiny", at + "_4/", at + ".refused.jsonl");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("_4/' is incomplete: it has no checkpoint.meta"), std::string::npos) << refused.output;
  std::string text = refused.output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 0) << "one line:\n" << refused.output;
  EXPECT_FALSE(file_exists(at + ".refused.jsonl"));
  EXPECT_EQ(refused.output.find("internal error"), std::string::npos) << refused.output;
  // The previous checkpoint resumes exactly.
  const RunResult resumed = resume({"04_zero1", 2, ""}, "tiny", at + "_2/", at + ".resumed.jsonl");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_LE(max_relative_difference(read_losses(at + ".resumed.jsonl"), reference), kTolerance);
}

// Saving in the background while the next steps run changes no loss, bit for bit: the writer reads a
// staged copy. The run reports the staged copy beside its forecast, the step times with a save in
// flight and without, and waits for its last save before it ends (the folder is then complete).
TEST(ShardedCheckpoint, AsynchronousSavingChangesNoLoss) {
  const std::string at = temp_dir() + "/async";
  const std::string common = "--preset tiny --steps 6 --json ";
  const RunResult plain = run_trainer("04_zero1", 2, common + at + ".plain.jsonl");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const RunResult saving = run_trainer(
      "04_zero1", 2, common + at + ".saving.jsonl --save " + at + "/ --save-every 1 --async-save");
  ASSERT_EQ(saving.exit_code, 0) << saving.output;
  const LossCurve a = read_losses(at + ".plain.jsonl"), b = read_losses(at + ".saving.jsonl");
  ASSERT_EQ(a.losses.size(), 6u);
  EXPECT_EQ(a.losses, b.losses);  // exactly
  for (const char* line : {"staged save", "(in the background)", "step time with an asynchronous save in flight",
                           "before the end of the run for the checkpoint of step 6"})
    EXPECT_NE(saving.output.find(line), std::string::npos) << line << "\n" << saving.output;
  const std::string record = read_record(at + ".saving.jsonl", "checkpoint");
  // The staged copy is rank 0's file (12 x its owned elements): at most the forecast, which differs
  // from it by the padding only (docs/theory.md, section 19).
  const double staged = double(file_size(at + "/step6.rank0.bin")), forecast = number_field(record, "staged_forecast_bytes");
  EXPECT_LE(staged, forecast) << record;
  EXPECT_GE(staged, 0.95 * forecast) << record;
  EXPECT_TRUE(file_exists(at + "/checkpoint.meta"));
  EXPECT_TRUE(file_exists(at + "/step6.rank1.bin"));
}

// The elastic launcher: a rank killed mid-run at 4 ranks; the launcher restarts from the last complete
// checkpoint on 2 ranks and finishes, with the losses of the uninterrupted run from there on. The link
// is emulated slow so that the run is still going when the test kills a rank.
TEST(ShardedCheckpoint, ElasticLauncherSurvivesAKilledRank) {
  const std::string dir = temp_dir() + "/elastic";
  const std::string flags = "--preset tiny --steps 8 --save-every 2 --quiet --device cpu --link-latency-us 20000";
  const RunResult reference = run_trainer("04_zero1", 2, "--preset tiny --steps 8 --json " + dir + ".reference.jsonl");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  RunResult elastic;
  std::thread launcher([&]() {
    elastic = run_command("scripts/elastic/elastic.sh --grids '4:;2:' --retries 2 --dir " + dir + " 04_zero1 " + flags, 300);
  });
  // Once a checkpoint is complete and the run goes on, one rank dies.
  const bool saved = wait_until([&]() { return file_exists(dir + "/ckpt/checkpoint.meta"); }, 120);
  std::vector<int> ranks = rank_pids(dir);
  if (saved && !ranks.empty()) kill(ranks.back(), SIGKILL);
  launcher.join();
  ASSERT_TRUE(saved) << elastic.output;
  ASSERT_FALSE(ranks.empty()) << elastic.output;
  ASSERT_EQ(elastic.exit_code, 0) << elastic.output;
  EXPECT_NE(elastic.output.find("restart 1: lost rank"), std::string::npos) << elastic.output;
  EXPECT_NE(elastic.output.find("grid 4: -> 2:"), std::string::npos) << elastic.output;
  // The last attempt's losses are the uninterrupted run's at the same steps.
  const LossCurve full = read_losses(dir + ".reference.jsonl");
  const LossCurve resumed = read_losses(dir + "/attempt1.jsonl");
  ASSERT_FALSE(resumed.steps.empty()) << elastic.output;
  LossCurve same_steps;
  for (size_t i = 0; i < full.steps.size(); i++)
    if (full.steps[i] >= resumed.steps.front()) {
      same_steps.steps.push_back(full.steps[i]);
      same_steps.losses.push_back(full.losses[i]);
    }
  EXPECT_LE(max_relative_difference(resumed, same_steps), kTolerance);
}

}  // namespace
