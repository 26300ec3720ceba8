// test_training.cpp: the project's central truth, end to end through the real trainer binaries:
// every chapter on 2 and 4 ranks trains to the same losses (relative difference <= 1e-5) and the
// same final parameters as one rank of 01 with the same global batch, with and without gradient
// accumulation. Also: resuming a checkpoint continues bit-exactly, measured memory and bytes agree
// with theory, and bad input ends every rank quickly with a clear message.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "test_util.h"
#include "training_harness.h"

namespace {

constexpr int kSteps = 20;
constexpr double kLossTolerance = 1e-5;  // fp32, relative, per step

// The one-rank run of 01 every other run is compared with, made once per test binary.
struct Baseline {
  LossCurve losses;
  std::vector<float> params;
};

const Baseline& baseline() {
  static Baseline b = [] {
    std::string dir = temp_dir();
    RunResult r = run_trainer("01_vanilla_dp", 1,
                              "--steps " + std::to_string(kSteps) + " --json " + dir + "/base.jsonl --save " + dir + "/base.ckpt");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return Baseline{read_losses(dir + "/base.jsonl"), checkpoint_params(dir + "/base.ckpt")};
  }();
  return b;
}

struct Case {
  std::string chapter;
  int ranks;
  int grad_accum;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.chapter.substr(0, 2) + "_n" + std::to_string(info.param.ranks) + "_k" +
         std::to_string(info.param.grad_accum);
}

class RankEquivalence : public testing::TestWithParam<Case> {};

TEST_P(RankEquivalence, SameLossesAndParametersAsOneRank) {
  const Case c = GetParam();
  std::string dir = temp_dir();
  RunResult r = run_trainer(c.chapter, c.ranks,
                            "--steps " + std::to_string(kSteps) + " --grad-accum " + std::to_string(c.grad_accum) +
                                " --json " + dir + "/run.jsonl --save " + dir + "/run.ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  LossCurve curve = read_losses(dir + "/run.jsonl");
  ASSERT_EQ(int(curve.losses.size()), kSteps);
  EXPECT_LE(max_relative_difference(curve, baseline().losses), kLossTolerance);
  std::vector<float> params = checkpoint_params(dir + "/run.ckpt");
  ASSERT_EQ(params.size(), baseline().params.size());
  EXPECT_TRUE(allclose(params.data(), baseline().params.data(), params.size(), 1e-5, 1e-4));
  // The loss must actually fall, or equality would prove little.
  EXPECT_LT(curve.losses.back(), curve.losses.front() - 0.5);
}

std::vector<Case> equivalence_cases() {
  std::vector<Case> cases;
  for (const char* chapter : {"01_vanilla_dp"})
    for (int ranks : {2, 4})
      for (int k : {1, 2}) cases.push_back({chapter, ranks, k});
  cases.push_back({"01_vanilla_dp", 1, 4});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Chapters, RankEquivalence, testing::ValuesIn(equivalence_cases()), case_name);

TEST(Checkpoint, ResumeContinuesBitExactly) {
  std::string dir = temp_dir();
  std::string common = "--steps " + std::to_string(kSteps);
  RunResult full = run_trainer("01_vanilla_dp", 2,
                               common + " --json " + dir + "/full.jsonl --save " + dir + "/ck_{step}.bin --save-every 10");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  RunResult resumed = run_trainer("01_vanilla_dp", 2, common + " --resume " + dir + "/ck_10.bin --json " + dir + "/resumed.jsonl");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  LossCurve a = read_losses(dir + "/full.jsonl"), b = read_losses(dir + "/resumed.jsonl");
  ASSERT_EQ(int(a.losses.size()), kSteps);
  ASSERT_EQ(int(b.losses.size()), kSteps - 10);
  for (int i = 0; i < kSteps - 10; i++) {
    EXPECT_EQ(b.steps[i], 10 + i);
    EXPECT_EQ(b.losses[i], a.losses[10 + i]) << "step " << 10 + i;  // bit-exact
  }
  // The final parameters too.
  RunResult again = run_trainer("01_vanilla_dp", 2, common + " --resume " + dir + "/ck_10.bin --save " + dir + "/end.bin");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(checkpoint_params(dir + "/end.bin"), checkpoint_params(dir + "/ck_20.bin"));
}

TEST(Theory, MeasuredMemoryAndBytesMatchTheDPFormulas) {
  for (int ranks : {1, 2, 4}) {
    std::string dir = temp_dir();
    RunResult r = run_trainer("01_vanilla_dp", ranks, "--steps 3 --json " + dir + "/run.jsonl");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string t = read_record(dir + "/run.jsonl", "theory");
    ASSERT_FALSE(t.empty()) << "no theory record";
    const double psi = number_field(t, "params"), padded = number_field(t, "padded_params");
    const double padding_bytes = 4 * (padded - psi);
    // Measured equals the formula up to padding: parameters, gradients (4 bytes each), m and v (8).
    for (auto [what, copies] : std::map<std::string, double>{{"params", 1}, {"grads", 1}, {"optim", 2}}) {
      const double measured = number_field(t, "measured_" + what + "_bytes");
      const double theory = number_field(t, "theory_" + what + "_bytes");
      EXPECT_GE(measured, theory) << what;
      EXPECT_LE(measured - theory, copies * padding_bytes) << what;
    }
    // Bytes on the wire: one all-reduce of the padded gradient, 2(N-1)/N x 4 bytes per element.
    const double measured_comm = number_field(t, "measured_comm_bytes");
    EXPECT_EQ(measured_comm, 2.0 * (ranks - 1) / ranks * 4 * padded);
    EXPECT_NEAR(measured_comm, number_field(t, "theory_comm_bytes"), 2.0 * padding_bytes + 1);
  }
}

// Bad input: a clear message and a non-zero exit on every rank within seconds, no rank hanging.
struct BadInput {
  std::string name, args, message;
};

class BadInputTest : public testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, FailsFastWithAClearMessage) {
  const BadInput c = GetParam();
  RunResult r = run_trainer("01_vanilla_dp", 2, c.args, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung";
  EXPECT_NE(r.output.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << r.output;
  EXPECT_LT(r.seconds, 15.0);
}

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

std::vector<BadInput> bad_inputs() {
  return {
      {"MissingDataFile", "--data /nonexistent/corpus.txt", "cannot open '/nonexistent/corpus.txt'"},
      {"BatchNotDivisible", "--batch 6 --grad-accum 2", "not divisible by ranks x grad-accum"},
      {"UnknownFlag", "--bogus 3", "unknown flag '--bogus'"},
      {"BadValue", "--steps ten", "--steps"},
      {"TruncatedCheckpoint", "--resume " + bad_checkpoint("truncated"), "truncated"},
      {"CorruptedCheckpoint", "--resume " + bad_checkpoint("corrupted"), "corrupted"},
      {"CheckpointOfAnotherConfig", "--resume " + bad_checkpoint("small"), "L=4 C=128"},
      {"MissingCheckpoint", "--resume /nonexistent.ckpt", "cannot open '/nonexistent.ckpt'"},
  };
}

INSTANTIATE_TEST_SUITE_P(Trainer, BadInputTest, testing::ValuesIn(bad_inputs()),
                         [](const testing::TestParamInfo<BadInput>& info) { return info.param.name; });

}  // namespace
