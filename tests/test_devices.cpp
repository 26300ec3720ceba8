// test_devices.cpp: the chapters on the device --device picks, end to end through the real trainer
// binaries. Without a GPU: --device cuda ends every rank quickly with the reason, and auto picks
// the CPU. With a GPU: the CUDA fp32 model's losses match the CPU's, bf16 mixed precision tracks
// fp32, NCCL works at one rank, every chapter at 2 ranks on one GPU (the host-staged fallback)
// matches one rank in fp32 and in bf16, bf16 memory and bytes match docs/theory.md's mixed-precision
// column, a bf16 checkpoint resumes exactly, and the memory counters agree with what the driver
// reports; freed GPU memory is reused, zeroed; chapter 10's ring and 11's experts on CUDA buffers match;
// a mixed-precision recipe's layers on cuBLASLt train like its CPU emulation, and what the GPU path
// cannot run is refused naming the flag.
// With two GPUs: NCCL between ranks, a pipeline's grouped messages matched by call order, and the
// emulated link on NCCL. Each test that needs the other situation skips and says why. Everywhere: the watchdog of the host's waits on a GPU,
// and cuBLAS loaded at its first call, not at the start.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ops/device.h"
#include "ops/memory.h"
#include "training_harness.h"
#include "base/watchdog.h"
#ifdef GPT_WITH_CUDA
#include <cublas_v2.h>  // cublasGetStatusName, the on-demand loading's test
#include "ops/matmul_cublaslt.h"  // gpu_has_fp8_tensor_cores: which refusal fp8 gets
#include <cuda_runtime_api.h>
#endif

namespace {

// cuBLAS and the CUDA reductions sum in other orders than the CPU code: each op differs from the
// CPU by fp32 rounding (about 1e-6 relative), and 10 AdamW steps carry that into the weights. The
// losses then agree to about 1e-5; 1e-4 leaves room without hiding a wrong kernel, whose error is
// of the order of the loss itself.
constexpr double kGpuVsCpuTolerance = 1e-4;
// Ranks against one rank on the same device: the project's truth, as on the CPU.
constexpr double kRankTolerance = 1e-5;
// bf16 keeps 8 significant bits: every stored activation, weight and gradient is rounded to about
// 4e-3 relative. Over 10 steps of the tiny model the loss of a mixed-precision run stays within about
// 1e-3 of fp32's (measured); 2e-2 still fails a broken bf16 kernel, whose loss does not fall like
// fp32's. Two ranks in bf16 differ from one rank by where the gradient is rounded (each rank's half,
// then their bf16 average, against one bf16 sum), the same order of difference.
constexpr double kBf16VsFp32Tolerance = 2e-2;
constexpr double kBf16RankTolerance = 1e-2;
constexpr int kSteps = 10;

bool gpu_visible(std::string* why) { return cuda_device_count(why) > 0; }

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    std::string why_;                                                          \
    if (!gpu_visible(&why_)) GTEST_SKIP() << "no CUDA device: " << why_;       \
  } while (0)

#define SKIP_WITH_GPU()                                                                             \
  do {                                                                                              \
    if (gpu_visible(nullptr)) GTEST_SKIP() << "a GPU is visible; this test checks the run without one"; \
  } while (0)

LossCurve train(const std::string& chapter, int ranks, const std::string& args, std::string* output = nullptr) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer(chapter, ranks, "--steps " + std::to_string(kSteps) + " --json " + dir + "/run.jsonl " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (output) *output = r.output;
  return read_losses(dir + "/run.jsonl");
}

// cuBLAS is opened at its first call (common/ops/cublas_on_demand.cpp), not when a program starts:
// a rank on the CPU never pays for loading it. First in this file, before any test that could call
// it in this process.
TEST(CublasOnDemand, LoadedAtTheFirstCallAndNotBefore) {
#ifndef GPT_WITH_CUDA
  GTEST_SKIP() << "a build without CUDA";
#else
  auto mapped = [](const std::string& library) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.find(library) != std::string::npos) return true;
    return false;
  };
  EXPECT_FALSE(mapped("libcublasLt.so")) << "cuBLASLt was loaded at the start";
  EXPECT_FALSE(mapped("libcublas.so")) << "cuBLAS was loaded at the start";
  // A call that needs no GPU, answered by the library itself.
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_TRUE(mapped("libcublasLt.so"));
  EXPECT_TRUE(mapped("libcublas.so"));
#endif
}

TEST(DeviceChoice, CudaWithoutGpuEndsEveryRankWithTheReason) {
  SKIP_WITH_GPU();
  RunResult r = run_trainer("01_vanilla_dp", 2, "--device cuda", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung";
  EXPECT_NE(r.output.find("--device cuda: no CUDA device is available ("), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 15.0);
}

TEST(DeviceChoice, AutoPicksCudaExactlyWhenAGpuIsVisible) {
  RunResult r = run_trainer("01_vanilla_dp", 1, "--device auto --steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string& output = r.output;
  const bool on_gpu = output.find("device cuda") != std::string::npos;
  const bool on_cpu = output.find("device cpu | communicator mpi") != std::string::npos;
  EXPECT_EQ(on_gpu, gpu_visible(nullptr)) << output;
  EXPECT_NE(on_gpu, on_cpu) << output;
}

// The dtype rule knows the recipe: under one the model's tensors stay fp32 on either device, so
// --dtype auto means fp32 there (bf16 on a GPU without one), and the flag itself is never rewritten.
TEST(DeviceChoice, DtypeAutoIsFp32UnderARecipe) {
  EXPECT_EQ(pick_dtype("auto", Device::CUDA), DType::BF16);
  EXPECT_EQ(pick_dtype("auto", Device::CUDA, /*recipe=*/true), DType::F32);
  EXPECT_EQ(pick_dtype("auto", Device::CPU, /*recipe=*/true), DType::F32);
  EXPECT_EQ(pick_dtype("fp32", Device::CUDA, /*recipe=*/true), DType::F32);
}

TEST(OnGpu, Fp32LossesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const LossCurve cpu = train("01_vanilla_dp", 1, "--device cpu");
  const LossCurve gpu = train("01_vanilla_dp", 1, "--device cuda --dtype fp32");
  EXPECT_EQ(gpu.losses.size(), size_t(kSteps));
  EXPECT_LE(max_relative_difference(gpu, cpu), kGpuVsCpuTolerance);
}

TEST(OnGpu, Bf16IsTheDefaultAndTracksFp32) {
  SKIP_WITHOUT_GPU();
  std::string output;
  const LossCurve bf16 = train("01_vanilla_dp", 1, "--device cuda", &output);
  EXPECT_NE(output.find("bf16 mixed precision"), std::string::npos) << output;
  const LossCurve fp32 = train("01_vanilla_dp", 1, "--device cuda --dtype fp32");
  ASSERT_EQ(bf16.losses.size(), size_t(kSteps));
  const double difference = max_relative_difference(bf16, fp32);
  std::printf("bf16 vs fp32 losses over %d steps: max relative difference %.2e\n", kSteps, difference);
  EXPECT_LE(difference, kBf16VsFp32Tolerance);
  EXPECT_GT(difference, 0.0) << "bf16 gave fp32's losses bit for bit: is it really computing in bf16?";
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.3);
}

TEST(OnGpu, FlashAttentionTrainsLikeMaterializedAttention) {
  SKIP_WITHOUT_GPU();
  std::string flash_output, materialized_output;
  const LossCurve flash = train("01_vanilla_dp", 1, "--device cuda --dtype bf16 --attention flash", &flash_output);
  const LossCurve materialized =
      train("01_vanilla_dp", 1, "--device cuda --dtype bf16 --attention materialized", &materialized_output);
  EXPECT_NE(flash_output.find("attention flash"), std::string::npos) << flash_output;
  EXPECT_NE(materialized_output.find("attention materialized"), std::string::npos) << materialized_output;
  const double difference = max_relative_difference(flash, materialized);
  std::printf("flash vs materialized attention, bf16, %d steps: max relative loss difference %.2e\n", kSteps,
              difference);
  EXPECT_LE(difference, kBf16VsFp32Tolerance);
}

TEST(OnGpu, Bf16CheckpointResumesExactly) {
  SKIP_WITHOUT_GPU();
  const std::string dir = temp_dir();
  const LossCurve whole = train("01_vanilla_dp", 1, "--device cuda --save-every 5 --save " + dir + "/s{step}.ckpt");
  // The checkpoint holds the fp32 master weights; bf16 weights are their rounding, so the resumed
  // run continues exactly where the uninterrupted one was.
  const LossCurve resumed = train("01_vanilla_dp", 1, "--device cuda --resume " + dir + "/s5.ckpt");
  ASSERT_EQ(resumed.losses.size(), size_t(kSteps - 5));
  for (size_t i = 0; i < resumed.losses.size(); i++) EXPECT_EQ(resumed.losses[i], whole.losses[i + 5]) << i;
  // And a CPU fp32 run can take the same file.
  const LossCurve on_cpu = train("01_vanilla_dp", 1, "--device cpu --resume " + dir + "/s5.ckpt");
  EXPECT_EQ(on_cpu.losses.size(), size_t(kSteps - 5));
}

TEST(OnGpu, NcclAtOneRankTrainsEndToEnd) {
  SKIP_WITHOUT_GPU();
#ifndef GPT_WITH_NCCL
  GTEST_SKIP() << "built without NCCL (the Makefile found no nccl.h): CUDA runs use the host-staged MPI fallback";
#endif
  std::string output;
  // 02 issues one asynchronous all-reduce per gradient: NCCL's stream and events, at one rank.
  const LossCurve gpu = train("02_overlap_dp", 1, "--device cuda --dtype fp32", &output);
  EXPECT_NE(output.find("communicator nccl"), std::string::npos) << output;
  const LossCurve cpu = train("01_vanilla_dp", 1, "--device cpu");
  EXPECT_LE(max_relative_difference(gpu, cpu), kGpuVsCpuTolerance);
  ASSERT_FALSE(gpu.losses.empty());
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
}

class TwoRanksOnOneGpu : public testing::TestWithParam<std::string> {};

TEST_P(TwoRanksOnOneGpu, MatchOneRank) {
  SKIP_WITHOUT_GPU();
  static const LossCurve one_rank = train("01_vanilla_dp", 1, "--device cuda --dtype fp32");
  std::string output;
  const LossCurve two_ranks = train(GetParam(), 2, "--device cuda --dtype fp32", &output);
  // Both ranks see the one GPU, which NCCL refuses: the framework falls back to MPI through the host.
  EXPECT_NE(output.find("host-staged"), std::string::npos) << output;
  EXPECT_LE(max_relative_difference(two_ranks, one_rank), kRankTolerance);
}

// bf16 mixed precision: the same, within bf16's tolerance, and the memory and bytes of docs/theory.md's
// mixed-precision column (2Ψ parameters, 2Ψ gradients, 12Ψ optimizer state, bf16 on the wire).
TEST_P(TwoRanksOnOneGpu, MatchOneRankInBf16WithTheoryMemory) {
  SKIP_WITHOUT_GPU();
  static const LossCurve one_rank = train("01_vanilla_dp", 1, "--device cuda --dtype bf16");
  const std::string dir = temp_dir();
  RunResult r = run_trainer(GetParam(), 2, "--device cuda --dtype bf16 --steps " + std::to_string(kSteps) +
                                               " --json " + dir + "/run.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double difference = max_relative_difference(read_losses(dir + "/run.jsonl"), one_rank);
  std::printf("%s, 2 ranks vs 1, bf16: max relative loss difference %.2e\n", GetParam().c_str(), difference);
  EXPECT_LE(difference, kBf16RankTolerance);
  expect_theory_matches(dir + "/run.jsonl", /*param_bytes=*/2);
}

INSTANTIATE_TEST_SUITE_P(Chapters, TwoRanksOnOneGpu,
                         testing::Values("01_vanilla_dp", "02_overlap_dp", "03_bucket_dp", "04_zero1", "05_zero2",
                                         "06_zero3", "07_tensor_parallel", "08_pipeline"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param.substr(0, 2); });

// Tensor parallelism's own CUDA kernels (vocabulary-sliced embedding and cross-entropy, position
// runs, the split matrix-product backward, bias ops) under sequence parallelism, on two ranks.
TEST(OnGpu, SequenceParallelMatchesOneRank) {
  SKIP_WITHOUT_GPU();
  const LossCurve one_rank = train("01_vanilla_dp", 1, "--device cuda --dtype fp32");
  const LossCurve split = train("07_tensor_parallel", 2, "--device cuda --dtype fp32 --sequence-parallel");
  EXPECT_LE(max_relative_difference(split, one_rank), kRankTolerance);
}

// Ring attention on CUDA buffers (chapter 10, ring_attention_cuda.cu): two ranks of a ring on the one
// GPU, in fp32, train like one rank with the model's own attention; bf16 is refused before the work,
// on every rank, naming the flag.
TEST(OnGpu, RingAttentionMatchesOneRank) {
  SKIP_WITHOUT_GPU();
  const LossCurve one_rank = train("01_vanilla_dp", 1, "--device cuda --dtype fp32");
  const LossCurve ring = train("10_context_parallel", 2, "--device cuda --dtype fp32 --cp 2");
  EXPECT_LE(max_relative_difference(ring, one_rank), kRankTolerance);
  RunResult refused = run_trainer("10_context_parallel", 2, "--device cuda --dtype bf16 --cp 2", 60);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("--dtype bf16 with --cp 2 on a GPU"), std::string::npos) << refused.output;
}

// The MoE layer on CUDA buffers (chapter 11, moe_rows_cuda.cu; the routing's decisions on the host):
// two ranks of expert parallelism on the one GPU, fp32, train like the CPU run of the same chapter on
// one rank, capacity dropping tokens; bf16 is refused before the work.
TEST(OnGpu, ExpertParallelMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const LossCurve cpu = train("11_expert_parallel", 1, "--device cpu --capacity-factor 1.0");
  const LossCurve gpu = train("11_expert_parallel", 2, "--device cuda --dtype fp32 --ep 2 --capacity-factor 1.0");
  EXPECT_LE(max_relative_difference(gpu, cpu), kGpuVsCpuTolerance);
  RunResult refused = run_trainer("11_expert_parallel", 1, "--device cuda --dtype bf16", 60);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("--dtype bf16 with a mixture of experts on a GPU"), std::string::npos)
      << refused.output;
}

// A mixed-precision recipe on the GPU (docs/mixed_precision.md, "On a GPU"): the layers' products
// go through cuBLASLt (precision_recipe_cuda.cpp) and train like the same recipe's CPU emulation, in
// 13's own lines (bf16, fp16, fp8 delayed and current) and in 01's (fp16, fp8 delayed). The tolerance is the format's (the table beside --precision: the same
// flips of a rounding that a change in the order of fp32 sums causes between ranks), or the GPU's
// fp32 spread from the CPU, whichever is larger.
TEST(OnGpu, PrecisionRecipesTrainLikeTheCpuEmulation) {
  SKIP_WITHOUT_GPU();
  std::string why;
#ifdef GPT_WITH_CUDA
  const bool fp8_cores = gpu_has_fp8_tensor_cores(&why);
#else
  const bool fp8_cores = false;  // (never reached: no build without CUDA sees a GPU)
#endif
  struct Case {
    std::string recipe;
    double tolerance;
  };
  const Case cases[] = {{"--precision bf16", std::ldexp(1.0, -10)},
                        {"--precision fp16", std::ldexp(1.0, -13)},
                        {"--precision fp8 --fp8-scaling delayed", std::ldexp(1.0, -6)},
                        {"--precision fp8 --fp8-scaling current", std::ldexp(1.0, -6)}};
  const std::string dir = temp_dir();
  for (const char* chapter : {"13_mixed_precision", "01_vanilla_dp"})
    for (const Case& c : cases) {
      // 01 takes the recipe through TrainingRun's MixedPrecision: its loss scale at the products
      // (fp16) and the delayed histories are the cases 13 does not share; the others are 13's.
      const bool in_01 = c.recipe == "--precision fp16" || c.recipe.find("delayed") != std::string::npos;
      if (std::string(chapter) == "01_vanilla_dp" && !in_01) continue;
      if (c.recipe.find("fp8") != std::string::npos && !fp8_cores) {
        std::printf("%s skipped: no fp8 tensor cores (%s)\n", c.recipe.c_str(), why.c_str());
        continue;
      }
      RunResult cpu = run_trainer(chapter, 1, "--steps 5 --device cpu --json " + dir + "/cpu.jsonl " + c.recipe);
      RunResult gpu = run_trainer(chapter, 1, "--steps 5 --device cuda --json " + dir + "/gpu.jsonl " + c.recipe);
      ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
      ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
      EXPECT_NE(gpu.output.find("precision summary"), std::string::npos) << gpu.output;
      const LossCurve on_cpu = read_losses(dir + "/cpu.jsonl"), on_gpu = read_losses(dir + "/gpu.jsonl");
      ASSERT_EQ(on_gpu.losses.size(), size_t(5)) << gpu.output;
      const double difference = max_relative_difference(on_gpu, on_cpu);
      std::printf("%s %s: GPU against the CPU's emulation over 5 steps: %.2e\n", chapter, c.recipe.c_str(), difference);
      EXPECT_LE(difference, std::max(c.tolerance, kGpuVsCpuTolerance)) << chapter << " " << c.recipe;
      EXPECT_LT(on_gpu.losses.back(), on_gpu.losses.front()) << chapter << " " << c.recipe;
    }
}

// What the GPU path cannot run is refused in one line naming the flag, before the work, on every
// rank: fp8 without fp8 tensor cores; per-row and block fp8 scales (cuBLASLt's fp8 scales are per
// tensor); fp8 products whose sizes are not multiples of 16 (the "odd" preset, C = 15); a recipe on
// more than one rank (its collectives encode on the host).
TEST(OnGpu, PrecisionRecipesTheGpuCannotRunAreRefusedNamingTheFlag) {
  SKIP_WITHOUT_GPU();
  std::string why;
#ifdef GPT_WITH_CUDA
  const bool fp8_cores = gpu_has_fp8_tensor_cores(&why);
#else
  const bool fp8_cores = false;
#endif
  struct Case {
    int ranks;
    std::string args, names;
  };
  std::vector<Case> cases = {{2, "--precision bf16", "--precision other than fp32 on a GPU trains on one rank"},
                             {1, "--dtype bf16 --precision bf16", "--dtype bf16 with --precision bf16"}};
  if (!fp8_cores) {
    cases.push_back({1, "--precision fp8", "--precision fp8 needs fp8 tensor cores"});
  } else {
    cases.push_back({1, "--precision fp8 --fp8-scaling row", "--fp8-scaling row runs on the CPU only"});
    cases.push_back({1, "--precision fp8 --fp8-scaling blocks", "--fp8-scaling blocks runs on the CPU only"});
    cases.push_back({1, "--precision fp8 --preset odd", "--precision fp8 on a GPU needs the model's width C (15)"});
  }
  for (const char* chapter : {"01_vanilla_dp", "13_mixed_precision"})
    for (const Case& c : cases) {
      RunResult r = run_trainer(chapter, c.ranks, "--device cuda --steps 2 " + c.args, 60);
      EXPECT_NE(r.exit_code, 0) << chapter << " " << c.args << ": " << r.output;
      EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung";
      EXPECT_NE(r.output.find(c.names), std::string::npos) << chapter << " " << c.args << ": " << r.output;
      EXPECT_EQ(r.output.find("step 0"), std::string::npos) << r.output;
    }
}

#define SKIP_WITHOUT_TWO_GPUS()                                                                        \
  do {                                                                                                 \
    std::string why_;                                                                                  \
    if (cuda_device_count(&why_) < 2)                                                                  \
      GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one GPU); "                             \
                   << (why_.empty() ? "fewer are visible" : why_);                                     \
  } while (0)

// NCCL between two ranks, one GPU each: a pipeline's messages have no tags there, so the lists are
// built for call order (each pair's sends and receives in one order on both ends); every schedule trains
// like one rank. Run on a two-GPU machine; not on the one-GPU machine this project was measured on.
TEST(OnTwoGpus, EverySchedulesGroupedMessagesMatchOneRank) {
  SKIP_WITHOUT_TWO_GPUS();
  const LossCurve one_rank = train("01_vanilla_dp", 1, "--device cuda --dtype fp32 --preset tall");
  for (const char* schedule : {"afab", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"}) {
    std::string output;
    const LossCurve staged =
        train("08_pipeline", 2, std::string("--device cuda --dtype fp32 --preset tall --schedule ") + schedule, &output);
    EXPECT_NE(output.find("communicator nccl"), std::string::npos) << output;
    EXPECT_NE(output.find("messages matched by call-order"), std::string::npos) << output;
    EXPECT_LE(max_relative_difference(staged, one_rank), kRankTolerance) << schedule;
  }
}

// The emulated link on NCCL: a step's exposed communication grows with the modelled latency alone.
TEST(OnTwoGpus, TheEmulatedLinkHoldsNcclMessages) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string dir = temp_dir();
  RunResult fast = run_trainer("01_vanilla_dp", 2, "--device cuda --steps 4 --json " + dir + "/fast.jsonl");
  RunResult slow = run_trainer("01_vanilla_dp", 2,
                               "--device cuda --steps 4 --link-latency-us 20000 --json " + dir + "/slow.jsonl");
  ASSERT_EQ(fast.exit_code, 0) << fast.output;
  ASSERT_EQ(slow.exit_code, 0) << slow.output;
  const double fast_ms = number_field(read_record(dir + "/fast.jsonl", "summary"), "exposed_comm_ms");
  const double slow_ms = number_field(read_record(dir + "/slow.jsonl", "summary"), "exposed_comm_ms");
  // One all-reduce of 2 ranks: 2(N-1) = 2 messages of 20 ms each.
  EXPECT_GT(slow_ms - fast_ms, 0.9 * 40) << slow.output;
}

// The watchdog of the host's waits on a GPU, which needs none to be tested: a wait that outlasts
// the timeout ends the process with the message, naming what waited.
TEST(DeviceWaitWatchdog, EndsTheJobWhenAWaitOutlastsTheTimeout) {
  EXPECT_EXIT(
      {
        set_device_wait_timeout(0.3);
        BlockedOnDevice blocked("waiting in a test");
        // Far past the 0.3 s: the watchdog's thread may wait for a core (a busy machine).
        std::this_thread::sleep_for(std::chrono::seconds(60));
        std::exit(0);
      },
      testing::ExitedWithCode(1), "watchdog: waiting in a test has not returned after [0-9.]+ s \\(--timeout\\)");
  // Waits within the timeout, and no timeout at all, pass.
  EXPECT_EXIT(
      {
        set_device_wait_timeout(0.3);
        { BlockedOnDevice blocked("a short wait"); }
        std::this_thread::sleep_for(std::chrono::milliseconds(800));  // past the timeout: the wait ended
        set_device_wait_timeout(0);
        BlockedOnDevice unwatched("an unwatched wait");
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
}

TEST(OnGpu, MemoryCountersMatchTheDriver) {
  SKIP_WITHOUT_GPU();
#ifdef GPT_WITH_CUDA
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // creates the context first: its memory is not ours
  { Buffer warm_up(1, MemCategory::Other, Device::CUDA); }  // and the compute stream, made on first use
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  const int64_t counted_before = memory_stats().current[int(MemCategory::Params)];
  const int64_t count = int64_t(64) << 20;  // 256 MiB of fp32
  {
    Buffer buffer(count, MemCategory::Params, Device::CUDA);
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    const int64_t counted = memory_stats().current[int(MemCategory::Params)] - counted_before;
    const int64_t driver = int64_t(free_before) - int64_t(free_after);
    EXPECT_EQ(counted, count * 4);
    // The driver hands out memory in pages (2 MiB): it may report a little more, never less.
    EXPECT_GE(driver, counted);
    EXPECT_LE(driver, counted + (int64_t(4) << 20));
  }
  EXPECT_EQ(memory_stats().current[int(MemCategory::Params)], counted_before);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(OnGpu, FreedMemoryIsReusedAndComesBackZeroed) {
  SKIP_WITHOUT_GPU();
  const int64_t count = 3 << 20;  // an odd size, so no earlier test left a block of it in the cache
  std::vector<float> host(count, 1.0f);
  void* first_address = nullptr;
  {
    Buffer buffer(count, MemCategory::Other, Device::CUDA);
    transfer(buffer.view(), make_view(host.data(), {count}));  // dirty it
    first_address = buffer.data();
  }
  const int64_t cached = cuda_cached_bytes();
  EXPECT_GE(cached, count * 4);
  Buffer again(count, MemCategory::Other, Device::CUDA);
  EXPECT_EQ(again.data(), first_address);  // the cache handed the block back, without cudaMalloc
  EXPECT_EQ(cuda_cached_bytes(), cached - count * 4);
  transfer(make_view(host.data(), {count}), again.view());
  int64_t nonzero = 0;
  for (float x : host) nonzero += x != 0.0f;
  EXPECT_EQ(nonzero, 0) << "a reused block must be zeroed like a new one";
}

}  // namespace
