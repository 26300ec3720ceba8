// test_run_guards.cpp: what a run does when something is wrong, through the real trainer binaries:
// bad input is refused before the work, on every rank, within seconds, with a clear message (flags,
// sizes, files, output paths, a run that will not fit in memory, a resumed run that would follow
// another trajectory, a finished run resumed), output paths that would replace an input, another
// output or a device; a diverging loss, Ctrl-C (and SIGTERM, SIGHUP), a failed write and a stopped
// rank end every rank with a non-zero exit and keep what was measured; a save removes what an
// interrupted save left behind, and a kill during a save keeps the checkpoint it replaces.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/peer_state.h"  // set_world_processes, for the GPU watchdog's message
#include "training_harness.h"
#include "base/watchdog.h"    // device_wait_message

namespace {

// These tests wait for other processes, on a machine whose cores may all be busy (make test-busy):
// kStartSeconds for a job to start and train 3 steps (about a second when the machine is quiet),
// kEndSeconds for a job to end after the watchdog's 3 s or a signal, and for its ranks to be gone.
// Generous bounds, polled (wait_until): a job that behaves ends the wait at once.
constexpr double kStartSeconds = 60;
constexpr double kEndSeconds = 30;

// ---------------------------------------------------------------------------------------------
// Bad input: a clear message and a non-zero exit on every rank within seconds, no rank hanging.

// In args, "{KIND.ckpt}" stands for a damaged checkpoint (bad_checkpoint(KIND)), made when the test
// runs: the list is built when the binary starts, where making it would run trainers even for
// --gtest_list_tests or a filter that leaves these cases out.
struct BadInput {
  std::string name, args, message;
  std::string chapter = "01_vanilla_dp";
  int ranks = 2;
};

std::string bad_checkpoint(const std::string& kind) {
  // A good checkpoint of the tiny preset, then damaged.
  static std::string dir = temp_dir();
  static bool made = [] {
    RunResult r = run_trainer("01_vanilla_dp", 1, "--steps 2 --save " + dir + "/good.ckpt");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    RunResult s = run_trainer("01_vanilla_dp", 1, "--steps 2 --preset small --save " + dir + "/small.ckpt");
    EXPECT_EQ(s.exit_code, 0) << s.output;
    return true;
  }();
  (void)made;
  std::ifstream in(dir + "/good.ckpt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string path = dir + "/" + kind + ".ckpt";
  if (kind == "truncated") bytes.resize(bytes.size() / 2);
  if (kind == "corrupted") bytes[bytes.size() / 2] ^= 0x40;
  if (kind == "small") return dir + "/small.ckpt";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// BadInput's args with each "{KIND.ckpt}" replaced by the path of bad_checkpoint(KIND).
std::string resolve_checkpoints(std::string args) {
  for (size_t open; (open = args.find('{')) != std::string::npos;) {
    const size_t close = args.find(".ckpt}", open);
    if (close == std::string::npos) break;
    args.replace(open, close + 6 - open, bad_checkpoint(args.substr(open + 1, close - open - 1)));
  }
  return args;
}

// What GoogleTest prints for a case (else the struct's bytes).
void PrintTo(const BadInput& c, std::ostream* os) { *os << c.chapter << " on " << c.ranks << " ranks: " << c.args; }

class BadInputTest : public testing::TestWithParam<BadInput> {};

// Every case runs 100000 steps if nothing stops it: a check made after the work instead of before
// it would time out. With a damaged checkpoint that --steps also contradicts the file's 2: the damage
// must be found first (a file's settings are believed only once its hash vouched for them).
TEST_P(BadInputTest, FailsBeforeTheWorkWithAClearMessage) {
  const BadInput c = GetParam();
  RunResult r = run_trainer(c.chapter, c.ranks, "--steps 100000 " + resolve_checkpoints(c.args), 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung, or the check came after the work";
  EXPECT_NE(r.output.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << r.output;
  EXPECT_LT(r.seconds, 15.0);
}

std::vector<BadInput> bad_inputs() {
  return {
      {"MissingDataFile", "--data /nonexistent/corpus.txt", "cannot open '/nonexistent/corpus.txt'"},
      {"DataIsAFolder", "--data /proc", "cannot open '/proc': it is a folder, not a regular file"},
      {"BatchNotDivisible", "--batch 6 --grad-accum 2", "not divisible by ranks x grad-accum"},
      {"UnknownFlag", "--bogus 3", "unknown flag '--bogus'"},
      {"BadValue", "--steps ten", "--steps"},
      {"ZeroLearningRate", "--lr 0", "--lr must be > 0"},
      {"LearningRateBelowFp32", "--lr 1e-50", "--lr: '1e-50' is too small for fp32"},
      {"TruncatedCheckpoint", "--resume {truncated.ckpt}", "truncated.ckpt' is truncated"},
      {"CorruptedCheckpoint", "--resume {corrupted.ckpt}", "corrupted.ckpt' is corrupted"},
      {"CheckpointOfAnotherConfig", "--resume {small.ckpt}", "L=4 C=128"},
      {"MissingCheckpoint", "--resume /nonexistent.ckpt", "cannot open '/nonexistent.ckpt'"},
      {"UnknownDevice", "--device tpu", "--device tpu: unknown device; choose auto, cpu or cuda"},
      {"UnknownDtype", "--dtype fp8", "--dtype fp8: unknown dtype; choose auto, fp32 or bf16"},
      {"Bf16OnTheCpu", "--device cpu --dtype bf16", "--dtype bf16 needs a GPU (--device cuda)"},
      {"SaveIntoAMissingFolder", "--save /nonexistent/ck.bin", "--save /nonexistent/ck.bin: the folder '/nonexistent' does not exist"},
      {"TraceIntoAReadOnlyFolder", "--trace /proc/trace.json", "--trace /proc/trace.json: cannot write in '/proc'"},
      {"JsonIntoAMissingFolder", "--json /nonexistent/run.jsonl", "--json /nonexistent/run.jsonl: the folder"},
      {"WillNotFitInMemory", "--batch 100000000", "this run would need about"},
      // Tensor parallelism: a grid that does not divide the ranks, a model that does not divide.
      {"TensorParallelGroupsDoNotDivideTheRanks", "--tp 3", "the 2 ranks do not divide into tensor-parallel groups of --tp 3",
       "07_tensor_parallel"},
      {"HeadsDoNotSplit", "--preset odd", "--tp 2 must divide the number of heads NH = 3", "07_tensor_parallel"},
      {"PositionsDoNotSplit", "--preset odd --batch 1 --tp 3 --sequence-parallel", "--sequence-parallel splits the B*T = 1 x 17",
       "07_tensor_parallel", 3},
      {"TensorParallelSizeBelowOne", "--tp 0", "--tp must be >= 1", "07_tensor_parallel"},
      // Pipelines: stages without a block, schedules whose shapes do not work, flags that contradict.
      {"FewerBlocksThanStages", "--preset tiny --pp 4", "but --preset tiny has 2 blocks", "08_pipeline", 4},
      {"FewerBlocksThanVirtualStages", "--preset tiny --schedule interleaved",
       "--pp 2 x --virtual-stages 2 = 4 virtual stages, but --preset tiny has 2 blocks", "08_pipeline"},
      {"InterleavedMicroBatchesNotAMultipleOfStages", "--preset tall --schedule interleaved --micro-batches 3",
       "--micro-batches 3 must be a multiple of it", "08_pipeline"},
      {"VirtualStagesWithoutInterleaving", "--preset tall --virtual-stages 2", "--virtual-stages 2 needs --schedule interleaved",
       "08_pipeline"},
      {"UnknownSchedule", "--schedule gpipe", "--schedule gpipe: choose afab, 1f1b, interleaved, zb-h1, zb-v or dualpipev", "08_pipeline"},
      {"PartitionThatDoesNotAddUp", "--preset tall --partition 3,4", "block counts that add up to L = 8", "08_pipeline"},
      {"ZeroTwoWithZeroBubble", "--preset tall --pp 1 --zero2 --schedule zb-h1", "(use afab or 1f1b)", "08_pipeline"},
      {"GradAccumInAPipeline", "--preset tall --grad-accum 2", "use --micro-batches", "08_pipeline"},
      {"UnknownMatching", "--preset tall --p2p-matching nccl", "--p2p-matching nccl: choose auto, tag or call-order",
       "08_pipeline"},
      {"StagesDoNotDivideTheRanks", "--preset tall --pp 3", "--pp 3", "08_pipeline", 4},
      {"MicroBatchesDoNotDivideTheBatch", "--preset tall --micro-batches 3",
       "--batch 8 is not divisible by data-parallel ranks x micro-batches = 1 x 3", "08_pipeline"},
  };
}

INSTANTIATE_TEST_SUITE_P(Trainer, BadInputTest, testing::ValuesIn(bad_inputs()),
                         [](const testing::TestParamInfo<BadInput>& info) { return info.param.name; });

// A file whose size is known only at its end (a /proc file reports 0 bytes and cannot seek) is read to
// its end: the run trains, where it used to die of an uncaught std::length_error.
TEST(DataFiles, AnUnseekableFileIsReadToItsEnd) {
  RunResult r = run_trainer("01_vanilla_dp", 1, "--steps 2 --data /proc/cpuinfo", 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("BAD TERMINATION"), std::string::npos) << r.output;
}

// --sequence-parallel at --tp 1 has nothing to split: a note on rank 0, not an error, and then the
// run is the run without it, to its losses and collectives (no sums over a group of one).
TEST(TensorParallelNotes, SequenceParallelAtTpOneIsANoteAndChangesNothing) {
  const std::string dir = temp_dir();
  const std::string note = "note: --sequence-parallel does nothing at --tp 1";
  RunResult with =
      run_trainer("07_tensor_parallel", 2, "--steps 3 --tp 1 --sequence-parallel --json " + dir + "/with.jsonl");
  ASSERT_EQ(with.exit_code, 0) << with.output;
  EXPECT_NE(with.output.find(note), std::string::npos) << with.output;
  EXPECT_EQ(with.output.find(note), with.output.rfind(note)) << "printed by more than rank 0:\n" << with.output;
  RunResult without = run_trainer("07_tensor_parallel", 2, "--steps 3 --tp 1 --json " + dir + "/without.jsonl");
  ASSERT_EQ(without.exit_code, 0) << without.output;
  EXPECT_EQ(without.output.find(note), std::string::npos) << without.output;
  EXPECT_EQ(read_losses(dir + "/with.jsonl").losses, read_losses(dir + "/without.jsonl").losses);
  const std::vector<std::string> with_steps = read_records(dir + "/with.jsonl", "step");
  const std::vector<std::string> without_steps = read_records(dir + "/without.jsonl", "step");
  ASSERT_EQ(with_steps.size(), without_steps.size());
  for (size_t i = 0; i < with_steps.size(); i++)
    EXPECT_EQ(number_field(with_steps[i], "collectives"), number_field(without_steps[i], "collectives")) << "step " << i;
}

// The forecast is printed before the work, in every run.
TEST(MemoryForecast, IsPrintedBeforeTheFirstStep) {
  RunResult r = run_trainer("06_zero3", 2, "--steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t forecast = r.output.find("memory forecast per rank:");
  ASSERT_NE(forecast, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("available"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Output paths: no output replaces an input, another output, or something that is not a file.

// A folder and (where this user may make one) a character device other than the null device at an
// output's path: refused before the work, naming the path and what it is, and left as they were.
TEST(OutputPaths, ANonRegularFileAtAnOutputPathIsRefusedAndKept) {
  const std::string dir = temp_dir();
  std::vector<std::pair<std::string, std::string>> paths = {{dir + "/folder", "a folder"}};
  ASSERT_EQ(mkdir(paths[0].first.c_str(), 0755), 0);
  if (mknod((dir + "/zero").c_str(), S_IFCHR | 0666, makedev(1, 5)) == 0) paths.push_back({dir + "/zero", "a character device"});
  for (const auto& [path, kind] : paths) {
    for (const std::string flag : {"--json", "--save", "--trace"}) {
      RunResult r = run_trainer("01_vanilla_dp", 2, "--steps 3 " + flag + " " + path, 60);
      EXPECT_NE(r.exit_code, 0) << r.output;
      EXPECT_NE(r.exit_code, 124) << "timed out";
      EXPECT_NE(r.output.find(flag + " " + path + ": that is " + kind + ", not a regular file"), std::string::npos)
          << r.output;
      EXPECT_LT(r.seconds, 15.0);
      struct stat info;
      ASSERT_EQ(stat(path.c_str(), &info), 0);
      EXPECT_FALSE(S_ISREG(info.st_mode)) << path << " was replaced by a file";
    }
  }
}

// `--json /dev/null` discards the records (scripts/bench/bench.sh times runs so), and a FIFO the user names
// passes them to its reader: both written to directly, the run ends 0, the FIFO stays a FIFO.
TEST(OutputPaths, TheNullDeviceAndAFifoAreWrittenToDirectly) {
  RunResult discarded = run_trainer("01_vanilla_dp", 2, "--steps 2 --json /dev/null --trace /dev/null", 60);
  EXPECT_EQ(discarded.exit_code, 0) << discarded.output;
  const std::string dir = temp_dir();
  const std::string fifo = dir + "/records";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  RunResult piped = run_command("sh -c 'cat " + fifo + " > " + dir + "/received & mpiexec -n 2 ./01_vanilla_dp/train "
                                "--quiet --device cpu --steps 2 --json " + fifo + "; status=$?; wait; exit $status'", 60);
  EXPECT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_TRUE(wait_until([&] { return !read_record(dir + "/received", "summary").empty(); }, kEndSeconds))
      << "the reader did not get the records";
  EXPECT_EQ(read_records(dir + "/received", "step").size(), 2u);
  struct stat info;
  ASSERT_EQ(stat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode)) << "the FIFO was replaced";
}

// Two runs with one --json at once: the second is refused before its work, naming the first's process
// and command line, and the first goes on and writes its own records. They used to share one
// temporary (PATH.partial): the first ended 0 with the second's records in its file.
TEST(OutputPaths, AnOutputThatAnotherRunWritesIsRefused) {
  const std::string dir = temp_dir();
  const std::string json = dir + "/run.jsonl";
  BackgroundRun first = start_trainer("10_context_parallel", 2, "--steps 100000 --json " + json);
  const bool trains = wait_until([&] { return read_records(json_being_written(json), "step").size() >= 2; },
                                 kStartSeconds);
  const std::vector<int> first_ranks = rank_pids(dir);
  RunResult second = run_trainer("10_context_parallel", 2, "--steps 3 --seed 7 --json " + json, 60);
  kill(first.pid, SIGINT);
  RunResult r = wait_for(first, 60);
  ASSERT_TRUE(trains) << r.output;
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_LT(second.seconds, 15.0);
  EXPECT_NE(second.output.find("--json " + json + ": another run is writing it (pid "), std::string::npos) << second.output;
  bool names_the_first = false;
  for (int pid : first_ranks)
    names_the_first |= second.output.find("(pid " + std::to_string(pid) + " on ") != std::string::npos;
  EXPECT_TRUE(names_the_first) << second.output;
  EXPECT_NE(second.output.find("10_context_parallel/train"), std::string::npos) << second.output;
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(read_record(json, "summary").find("\"ended\":\"interrupted\""), std::string::npos);
  EXPECT_GT(read_records(json, "step").size(), 3u) << "the file holds another run's records";
  EXPECT_FALSE(file_exists(json + ".lock")) << "the lock file was left";
}

TEST(OutputPaths, FlagsThatNameOneFileAreRefusedBeforeTheWork) {
  const std::string dir = temp_dir();
  const std::string data = dir + "/data.txt";
  const std::string text(5000, 'x');
  std::ofstream(data) << text;
  const std::pair<std::string, std::string> cases[] = {
      {"--data " + data + " --save " + data, "the output --save would overwrite the input --data"},
      {"--save " + dir + "/x --json " + dir + "/x", "one output would replace the other"},
      {"--json " + dir + "/y --trace " + dir + "/./y", "one output would replace the other"},
      {"--data " + data + " --save " + dir + "/ck_{step}.bin --json " + dir + "/ck_3.bin", "can name the same file"},
  };
  for (const auto& [args, message] : cases) {
    RunResult r = run_trainer("01_vanilla_dp", 2, "--steps 3 " + args, 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "timed out";
    EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in:\n" << r.output;
    EXPECT_LT(r.seconds, 15.0);
  }
  std::ifstream in(data);
  EXPECT_TRUE(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()) == text)
      << "the training data was overwritten";
}

// The writer checks the path again when it writes: a checkpoint path that became a socket while the job
// ran is not replaced, and the failure, which rank 0 alone sees, ends every rank within seconds.
TEST(OutputPaths, AWriteThatFailsOnRankZeroEndsEveryRank) {
  const std::string dir = temp_dir();
  const std::string ckpt = dir + "/ck.bin";
  BackgroundRun run = start_trainer("01_vanilla_dp", 2, "--steps 100000 --save-every 2 --save " + ckpt);
  ASSERT_TRUE(wait_until_file_exists(ckpt, kStartSeconds)) << "no checkpoint was saved";
  // Made aside, then renamed over the checkpoint: the next save finds a socket there, never a gap.
  ASSERT_TRUE(make_socket(dir + "/socket"));
  ASSERT_EQ(std::rename((dir + "/socket").c_str(), ckpt.c_str()), 0);
  const auto made = std::chrono::steady_clock::now();
  RunResult r = wait_for(run, 30);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - made).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job went on (or hung) after a failed write";
  EXPECT_LT(seconds, 15.0);
  EXPECT_NE(r.output.find("cannot write '" + ckpt + "': '" + ckpt + "' is a socket"), std::string::npos) << r.output;
  struct stat info;
  ASSERT_EQ(stat(ckpt.c_str(), &info), 0);
  EXPECT_TRUE(S_ISSOCK(info.st_mode)) << "the socket was replaced";
  EXPECT_TRUE(wait_until([&] { return rank_pids(dir).empty(); }, kEndSeconds)) << "a rank was left behind";
  for (int pid : rank_pids(dir)) kill(pid, SIGKILL);
}

// ---------------------------------------------------------------------------------------------
// A resumed run continues the trajectory its checkpoint belongs to, or is refused.

struct Resumable {
  std::string dir, checkpoint;
};

const Resumable& resumable() {
  static Resumable r = [] {
    Resumable made{temp_dir(), ""};
    made.checkpoint = made.dir + "/ck_10.bin";
    RunResult run = run_trainer("01_vanilla_dp", 2, "--steps 20 --lr 2e-3 --warmup 4 --json " + made.dir +
                                                        "/full.jsonl --save " + made.dir + "/ck_{step}.bin --save-every 10");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return made;
  }();
  return r;
}

TEST(Resume, AbsentFlagsTakeTheCheckpointsSettings) {
  const Resumable& r = resumable();
  // No --steps, --lr or --warmup: the checkpoint's 20, 2e-3 and 4, so the losses continue exactly.
  RunResult run = run_trainer("01_vanilla_dp", 2, "--resume " + r.checkpoint + " --json " + r.dir + "/resumed.jsonl");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const LossCurve full = read_losses(r.dir + "/full.jsonl"), resumed = read_losses(r.dir + "/resumed.jsonl");
  ASSERT_EQ(resumed.losses.size(), 10u);
  for (size_t i = 0; i < resumed.losses.size(); i++) EXPECT_EQ(resumed.losses[i], full.losses[10 + i]) << i;
}

TEST(Resume, AContradictingFlagIsRefusedNamingBothValues) {
  const Resumable& r = resumable();
  const std::pair<std::string, std::string> cases[] = {
      {"--lr 1e-3", "--lr 0.001 differs from the 0.002 that checkpoint"},
      {"--steps 30", "--steps 30 differs from the 20 that checkpoint"},
      {"--warmup 2", "--warmup 2 differs from the 4 that checkpoint"},
      {"--weight-decay 0.2", "--weight-decay 0.2 differs from the 0.1 that checkpoint"},
      {"--grad-clip 2", "--grad-clip 2 differs from the 1 that checkpoint"},
  };
  for (const auto& [flag, message] : cases) {
    RunResult run = run_trainer("01_vanilla_dp", 2, "--resume " + r.checkpoint + " " + flag, 60);
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << "expected '" << message << "' in:\n" << run.output;
    EXPECT_LT(run.seconds, 15.0);
  }
  // The same values, given explicitly, are fine.
  RunResult same = run_trainer("01_vanilla_dp", 2, "--resume " + r.checkpoint + " --lr 2e-3 --steps 20 --warmup 4");
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

TEST(Resume, OtherDataIsRefused) {
  const Resumable& r = resumable();
  const std::string other = r.dir + "/other.txt";
  std::ofstream(other) << std::string(5000, 'x');
  RunResult run = run_trainer("01_vanilla_dp", 2, "--resume " + r.checkpoint + " --data " + other, 60);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("was trained on other data"), std::string::npos) << run.output;
}

// The final checkpoint of a finished run has nothing left to run: refused before any work, saying
// how a longer run starts (a new schedule from its weights), with no summary of a run that did not
// happen.
TEST(Resume, AFinishedRunIsRefusedAndSaysHowToGoOn) {
  const Resumable& r = resumable();
  const std::string json = r.dir + "/finished.jsonl";
  RunResult run = run_trainer("01_vanilla_dp", 2, "--resume " + r.dir + "/ck_20.bin --json " + json, 60);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 124) << "timed out";
  EXPECT_LT(run.seconds, 15.0);
  EXPECT_NE(run.output.find("already holds all 20 steps of its schedule"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("--init-from " + r.dir + "/ck_20.bin --steps N"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("final loss"), std::string::npos) << run.output;
  EXPECT_FALSE(file_exists(json)) << "a JSON of a run that did not happen";
}

// --init-from: a new schedule (step 0, its own warm-up) from a checkpoint's weights. Its first loss
// is the trained model's, far below a fresh model's; with --resume it is refused.
TEST(Resume, InitFromStartsANewScheduleFromTheWeights) {
  const Resumable& r = resumable();
  const std::string json = r.dir + "/init.jsonl";
  RunResult run = run_trainer("01_vanilla_dp", 2, "--init-from " + r.dir + "/ck_20.bin --steps 4 --json " + json);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("started from the weights of " + r.dir + "/ck_20.bin (after its 20 steps)"),
            std::string::npos) << run.output;
  const LossCurve full = read_losses(r.dir + "/full.jsonl"), init = read_losses(json);
  ASSERT_EQ(init.losses.size(), 4u);
  ASSERT_EQ(full.losses.size(), 20u);
  EXPECT_EQ(init.steps.front(), 0);
  EXPECT_LT(init.losses[0], full.losses[0] - 0.5) << "the weights were not taken";
  EXPECT_LT(std::abs(init.losses[0] - full.losses[19]), 0.5) << "not where the trained run ended";
  RunResult both = run_trainer("01_vanilla_dp", 2, "--init-from " + r.checkpoint + " --resume " + r.checkpoint, 60);
  EXPECT_NE(both.exit_code, 0) << both.output;
  EXPECT_NE(both.output.find("--resume and --init-from together"), std::string::npos) << both.output;
}

// --resume R --save R: each save replaces R only once complete, so a job killed (SIGKILL, every
// process at once) while it saves leaves R a checkpoint that resumes.
TEST(Resume, AKillWhileSavingOverTheResumedCheckpointLeavesItResumable) {
  const std::string dir = temp_dir();
  const std::string ckpt = dir + "/ck.bin";
  auto saved_step = [&] {  // the step in R's header (docs/checkpoint.md), or -1
    std::ifstream in(ckpt, std::ios::binary);
    char header[40] = {};
    in.read(header, sizeof header);
    int64_t step = -1;
    if (in.gcount() == sizeof header) std::memcpy(&step, header + 32, sizeof step);
    return step;
  };
  auto wait_for_a_save_after = [&](int64_t step) {
    return wait_until([&] { return saved_step() > step; }, kStartSeconds);
  };
  // A checkpoint of a long schedule: a first run saves every step, and Ctrl-C ends it.
  BackgroundRun first = start_trainer("01_vanilla_dp", 2, "--steps 100000 --save-every 1 --save " + ckpt);
  ASSERT_TRUE(wait_for_a_save_after(0));
  kill(first.pid, SIGINT);
  ASSERT_EQ(wait_for(first, 60).exit_code, 130);
  // A temporary beside R: a save is under way (or was, when its job was killed).
  auto temporary_exists = [&] {
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().filename().string().rfind("ck.bin.tmp.", 0) == 0) return true;
    return false;
  };
  int kills_during_a_save = 0;
  for (int attempt = 0; attempt < 6 && kills_during_a_save < 2; attempt++) {
    SCOPED_TRACE("kill " + std::to_string(attempt));
    const int64_t before = saved_step();
    BackgroundRun run = start_trainer("01_vanilla_dp", 2, "--resume " + ckpt + " --save-every 1 --save " + ckpt);
    ASSERT_TRUE(wait_for_a_save_after(before)) << "it never saved";
    const std::vector<int> ranks = rank_pids(dir);
    // The next save's temporary appears (watched without a pause: a save takes milliseconds), and
    // then every process dies at once.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!temporary_exists() && std::chrono::steady_clock::now() < give_up) {
    }
    for (int pid : ranks) kill(pid, SIGKILL);
    kill(run.pid, SIGKILL);
    wait_for(run, 30);
    if (temporary_exists()) kills_during_a_save++;  // else the save finished first
  }
  EXPECT_GE(kills_during_a_save, 1) << "no kill came during a save: the test proved nothing";
  // It resumes: the whole file is checked when it is loaded.
  BackgroundRun resumed = start_trainer("01_vanilla_dp", 2, "--resume " + ckpt + " --json " + dir + "/resumed.jsonl");
  wait_until([&] { return !read_records(json_being_written(dir + "/resumed.jsonl"), "step").empty(); }, kStartSeconds);
  kill(resumed.pid, SIGINT);
  RunResult r = wait_for(resumed, 60);
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt), std::string::npos) << r.output;
}

// A batch of 8 cannot be split over 3 ranks: say so, and which rank counts can take it, instead of
// suggesting another batch that the checkpoint would then refuse.
TEST(Resume, ABatchThatCannotBeSplitSaysWhichRankCountsCan) {
  const Resumable& r = resumable();
  RunResult run = run_trainer("01_vanilla_dp", 3, "--resume " + r.checkpoint, 60);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("was trained with a global batch of 8 sequences, which cannot be split over 3 ranks"),
            std::string::npos) << run.output;
  EXPECT_NE(run.output.find("1, 2, 4 or 8 ranks"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("try --batch"), std::string::npos) << run.output;
}

// ---------------------------------------------------------------------------------------------
// Stops: every rank ends, non-zero, keeping what was measured.

TEST(Stops, ADivergingLossStopsEveryRankNamingTheStep) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer("03_bucket_dp", 2, "--steps 100000 --lr 1e30 --json " + dir + "/run.jsonl", 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is not finite at step"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 15.0);
  const std::string summary = read_record(dir + "/run.jsonl", "summary");
  EXPECT_NE(summary.find("\"ended\":\"diverged\""), std::string::npos) << summary;
}

// An interrupted job ends through MPI_Abort (its exit status survives the launcher), whose banner
// ("Abort(130) on node 0 ...: application called MPI_Abort") used to be the user's last line: the
// last line is the run's own summary.
void expect_our_last_line(const std::string& output) {
  EXPECT_EQ(output.find("MPI_Abort"), std::string::npos) << output;
  std::string last = output.substr(0, output.find_last_not_of('\n') + 1);
  last = last.substr(last.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("model FLOPs: ", 0), 0u) << "the last line is not the run's: " << last;
}

// Ctrl-C: mpiexec passes SIGINT to every rank; they finish the step, agree to stop, write the JSON
// (complete, marked interrupted), the trace and a checkpoint of the completed steps, and exit 130.
TEST(Stops, CtrlCWritesWhatWasMeasuredAndExitsNonZero) {
  const std::string dir = temp_dir();
  BackgroundRun run = start_trainer("02_overlap_dp", 2, "--steps 100000 --json " + dir + "/run.jsonl --trace " + dir +
                                                            "/trace.json --save " + dir + "/ck.bin");
  // Wait until it trains (the JSON has step records), then press Ctrl-C.
  const bool trains = wait_until([&] { return read_records(json_being_written(dir + "/run.jsonl"), "step").size() >= 3; },
                                 kStartSeconds);
  kill(run.pid, SIGINT);
  RunResult r = wait_for(run, 60);
  ASSERT_TRUE(trains) << "no 3 steps within " << kStartSeconds << " s:\n" << r.output;
  EXPECT_EQ(r.exit_code, 130) << r.output;
  expect_our_last_line(r.output);
  EXPECT_TRUE(file_exists(dir + "/run.jsonl")) << "the JSON was not closed";
  EXPECT_FALSE(file_exists(json_being_written(dir + "/run.jsonl"))) << "a temporary was left";
  EXPECT_NE(read_record(dir + "/run.jsonl", "summary").find("\"ended\":\"interrupted\""), std::string::npos);
  EXPECT_TRUE(file_exists(dir + "/trace.json")) << r.output;
  EXPECT_TRUE(file_exists(dir + "/ck.bin")) << r.output;
}

// The MPI rank of a process, from the environment mpiexec (hydra) gives it.
int mpi_rank_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  std::string environ((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = environ.find(std::string("PMI_RANK=", 9));
  return at == std::string::npos ? -1 : std::atoi(environ.c_str() + at + 9);
}

// Starts `chapter` on 2 ranks in the background (100000 steps, --timeout 3, JSON into `dir`).
BackgroundRun start_a_long_job(const std::string& chapter, const std::string& flags, const std::string& dir) {
  return start_trainer(chapter, 2, "--steps 100000 --timeout 3 --json " + dir + "/run.jsonl " + flags);
}

// The process id of the rank 1 of the job writing into `dir`, once both ranks run and 3 steps are
// done; -1 if that does not happen within kStartSeconds (the test then fails).
int rank_one_once_running(const std::string& dir) {
  std::vector<int> ranks;
  wait_until([&] {
    ranks = rank_pids(dir);
    return ranks.size() == 2 && read_records(json_being_written(dir + "/run.jsonl"), "step").size() >= 3;
  }, kStartSeconds);
  if (ranks.size() != 2) return -1;
  const int one = mpi_rank_of(ranks[0]) == 1 ? ranks[0] : ranks[1];
  return mpi_rank_of(one) == 1 ? one : -1;
}

// A rank stopped with SIGSTOP: the others would wait forever in the next collective. The watchdog
// (--timeout) ends the job, naming the collective, the step and the rank that is stopped (which MPI
// cannot say: the node can), and rank 0 closes its JSON. In 01 the collective is an all-reduce; in 11,
// an all-to-all of the experts' group, where the waiting ranks used to say only "a peer rank". The two
// jobs start, run and wait out their watchdogs' 3 s at once.
TEST(Stops, TheWatchdogEndsAJobWithAStoppedRank) {
  struct Job {
    std::string chapter, collective, dir{};
    BackgroundRun run{};
    int victim = -1;
  };
  std::vector<Job> jobs = {{"01_vanilla_dp", "watchdog: all_reduce"}, {"11_expert_parallel", "watchdog: "}};
  for (Job& job : jobs) {
    job.dir = temp_dir();
    job.run = start_a_long_job(job.chapter, "", job.dir);  // rank 0 writes the JSON
  }
  for (Job& job : jobs) job.victim = rank_one_once_running(job.dir);
  for (const Job& job : jobs)
    if (job.victim <= 0) {
      std::string outputs;
      for (Job& other : jobs) outputs += wait_for(other.run, 1).output;  // (ends both)
      FAIL() << job.chapter << " did not start: " << outputs;
    }
  const auto stopped = std::chrono::steady_clock::now();
  for (Job& job : jobs) kill(job.victim, SIGSTOP);
  for (Job& job : jobs) {
    SCOPED_TRACE(job.chapter);
    RunResult r = wait_for(job.run, 120);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "the job hung";
    EXPECT_LT(seconds, 3 + kEndSeconds) << "the watchdog should end it a little after its 3 s";
    EXPECT_NE(r.output.find(job.collective), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("group (world ranks 0, 1)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("in step"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("world rank 1 (pid " + std::to_string(job.victim) + ") is stopped"), std::string::npos)
        << r.output;
    // mpiexec may return before the kernel has ended the stopped rank that it killed.
    EXPECT_TRUE(wait_until_ranks_gone(job.dir, kEndSeconds)) << "a rank was left behind";
    for (int pid : rank_pids(job.dir)) kill(pid, SIGKILL);
    EXPECT_NE(read_record(job.dir + "/run.jsonl", "summary").find("\"ended\":\"aborted\""), std::string::npos);
  }
}

// A stuck receive names its peer by world rank, and its group by the members' world ranks, which
// differ from their ranks in the group: test_comm's DISABLED_WatchdogEndsAReceiveThatNoOneSends, on
// 4 ranks in a job of its own (the watchdog ends it), where world rank 3 waits for rank 0 of the odd
// ranks' group.
TEST(Stops, TheWatchdogNamesThePeerOfAStuckReceiveAndItsGroup) {
  RunResult r = run_command("mpiexec -n 4 build/tests/test_comm --gtest_also_run_disabled_tests "
                            "--gtest_filter=CommTest.DISABLED_WatchdogEndsAReceiveThatNoOneSends", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung";
  EXPECT_NE(r.output.find("[rank 3@"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("watchdog: recv of "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" from world rank 1 over the pipeline group (world ranks 1, 3)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("world rank 1 is stopped, dead or stuck"), std::string::npos) << r.output;
}

// The GPU watchdog (a host blocked in a CUDA synchronize that NCCL's collective holds) names the
// stopped or ended rank as the MPI one does; it once always said "a peer rank". Its message comes from
// the same look at /proc: here world rank 1 is a stopped child process, then an ended one.
TEST(Stops, TheGpuWatchdogNamesTheStoppedRankAsTheMpiOneDoes) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  kill(child, SIGSTOP);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);  // returns once it is stopped
  ASSERT_TRUE(WIFSTOPPED(status));
  set_world_processes({int(getpid()), int(child)}, {0, 0}, 0);
  const std::string pid = std::to_string(child);
  const std::string stopped = device_wait_message("waiting for the GPU to finish its work", "step 5", 3.04);
  EXPECT_EQ(stopped, "watchdog: waiting for the GPU to finish its work in step 5 has not returned after 3.0 s "
                     "(--timeout): world rank 1 (pid " + pid + ") is stopped (SIGSTOP, Ctrl-Z or a debugger) (a "
                     "collective on the GPU waits for every rank of its group). Ending the job.");
  kill(child, SIGKILL);
  ASSERT_TRUE(wait_until([&] { return device_wait_message("w", "", 1).find(pid + ") has ended") != std::string::npos; }, 30));
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_NE(device_wait_message("w", "", 1).find("world rank 1 (pid " + pid + ") has ended"), std::string::npos);
  // On another node, the rank is out of sight: the message blames no one by name.
  set_world_processes({int(getpid()), int(child)}, {0, 1}, 0);
  EXPECT_NE(device_wait_message("w", "", 1).find(": a peer rank is stopped, dead or stuck ("), std::string::npos)
      << device_wait_message("w", "", 1);
  set_world_processes({}, {}, -1);
}

// A pipeline stage that dies mid-step (SIGKILL: no handler runs) or stops (SIGSTOP) while its
// neighbours wait in a receive for its activations or gradients: the whole job ends within seconds,
// with a non-zero exit, and no rank is left blocked. The two jobs start and run at once, and are
// signalled together.
TEST(Stops, AStageThatDiesOrStopsEndsThePipeline) {
  struct Job {
    int signal;
    std::string dir{};
    BackgroundRun run{};
    int victim = -1;
  };
  std::vector<Job> jobs = {{SIGKILL}, {SIGSTOP}};
  for (Job& job : jobs) {
    job.dir = temp_dir();
    job.run = start_a_long_job("08_pipeline", "--preset tall", job.dir);
  }
  for (Job& job : jobs) job.victim = rank_one_once_running(job.dir);  // the last stage
  for (const Job& job : jobs)
    if (job.victim <= 0) {
      std::string outputs;
      for (Job& other : jobs) outputs += wait_for(other.run, 1).output;  // (ends both)
      FAIL() << "a pipeline did not start: " << outputs;
    }
  const auto signalled = std::chrono::steady_clock::now();
  for (Job& job : jobs) kill(job.victim, job.signal);
  for (Job& job : jobs) {
    SCOPED_TRACE(job.signal == SIGKILL ? "killed" : "stopped");
    RunResult r = wait_for(job.run, 120);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "the job hung";
    EXPECT_LT(seconds, 3 + kEndSeconds) << r.output;
    if (job.signal == SIGSTOP) {
      // Rank 0 waits in a receive from the stopped stage, or in a collective of the step's end.
      EXPECT_NE(r.output.find("watchdog:"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("group (world ranks 0, 1)"), std::string::npos) << r.output;
      if (r.output.find("watchdog: recv") != std::string::npos) {
        EXPECT_NE(r.output.find("from world rank 1 over the pipeline group"), std::string::npos) << r.output;
      }
    }
    EXPECT_TRUE(wait_until_ranks_gone(job.dir, kEndSeconds)) << "a rank was left behind";
    for (int pid : rank_pids(job.dir)) kill(pid, SIGKILL);
  }
}

// A save killed half-way leaves PATH.tmp.<host>.<pid>; the next save of PATH removes it (its process
// is gone), but never the file of a writer that is still alive, nor another host's (a folder shared
// by the nodes of a cluster: only that node can tell).
TEST(Stops, ASaveRemovesWhatAKilledSaveLeftBehind) {
  const std::string dir = temp_dir();
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const std::string mine = dir + "/ck.bin.tmp." + host + ".";
  const std::string stale = mine + "999999999", live = mine + std::to_string(getpid());
  const std::string other_host = dir + "/ck.bin.tmp.another-node.999999999";
  for (const std::string& path : {stale, live, other_host}) std::ofstream(path) << "part of a checkpoint";
  RunResult r = run_trainer("01_vanilla_dp", 2, "--steps 2 --save " + dir + "/ck.bin");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(file_exists(stale));
  EXPECT_TRUE(file_exists(live));
  EXPECT_TRUE(file_exists(other_host));
  EXPECT_TRUE(file_exists(dir + "/ck.bin"));
}

// SIGTERM (what `kill` and job schedulers send) to mpiexec, and SIGHUP (a closed terminal) to the
// ranks, stop the job as Ctrl-C does: the "interrupted" line, the summary, the JSON marked, 130.
// (SIGHUP to mpiexec itself ends MPICH's mpiexec at once, with the ranks: docs/files_and_signals.md.)
TEST(Stops, SigtermAndSighupStopLikeCtrlC) {
  for (int signal : {SIGTERM, SIGHUP}) {
    SCOPED_TRACE(signal == SIGTERM ? "SIGTERM to mpiexec" : "SIGHUP to the ranks");
    const std::string dir = temp_dir();
    BackgroundRun run = start_trainer("01_vanilla_dp", 2, "--steps 100000 --json " + dir + "/run.jsonl");
    std::vector<int> ranks;
    wait_until([&] {
      ranks = rank_pids(dir);
      return ranks.size() >= 2 && read_records(json_being_written(dir + "/run.jsonl"), "step").size() >= 3;
    }, kStartSeconds);
    ASSERT_EQ(ranks.size(), 2u);
    if (signal == SIGTERM) kill(run.pid, SIGTERM);
    else for (int pid : ranks) kill(pid, SIGHUP);
    RunResult r = wait_for(run, 30);
    EXPECT_EQ(r.exit_code, 130) << r.output;
    EXPECT_NE(r.output.find("interrupted after step"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("average over"), std::string::npos) << r.output;
    expect_our_last_line(r.output);
    EXPECT_NE(read_record(dir + "/run.jsonl", "summary").find("\"ended\":\"interrupted\""), std::string::npos);
  }
}

// One step is all warm-up: say that nothing was measured, rather than print averages of nothing.
TEST(Stops, OneStepSaysThatNothingWasMeasured) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer("01_vanilla_dp", 2, "--steps 1 --json " + dir + "/run.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no measured steps"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("average over 0"), std::string::npos) << r.output;
  const std::string summary = read_record(dir + "/run.jsonl", "summary");
  EXPECT_EQ(number_field(summary, "measured_steps"), 0.0) << summary;
}

}  // namespace
