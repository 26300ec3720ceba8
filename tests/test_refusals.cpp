// test_refusals.cpp: a refusal is a message for the user, never an internal error, and it ends the
// job cleanly, at once. Walks every small combination of 07's and 08's size flags through their
// checks (pure functions: thousands of combinations in about a second) and builds what each accepted
// one builds, so that no accepted combination reaches an internal check; then runs the trainers'
// refusals as processes: every rank exits non-zero within seconds, without MPI_Abort's report,
// rank 0 printing the message once, naming only flags that the chapter's --help lists; and the
// emulated link: refused with its arithmetic when the watchdog would end the run, interrupted by
// Ctrl-C, watched by the watchdog with a message that blames the link, not a rank.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "training/link_limits.h"
#include "model/param_layout.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_flags.h"
#include "schedule/pipeline_schedule.h"
#include "comm/process_grid.h"
#include "training_harness.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Every combination of small sizes: refused with a message, or sound to build.

// 08: --pp, --micro-batches, --virtual-stages and --batch from 0 (not given) to 5, every schedule,
// the ZeRO switches, on 1 to 5 ranks, for a shallow and a deep model. Whatever the checks accept is
// built as 08 builds it: every rank's schedule with either matching, checked together, and each
// rank's model parts with the activation slots its schedule needs. An internal check (ENSURE) that
// fails ends this test binary, which fails the test. (Before the checks were one function, the
// interleaved schedule with --virtual-stages 1 reached pipeline_schedule.cpp's ENSURE.)
TEST(EveryCombination, OfThePipelinesFlagsIsRefusedOrBuilds) {
  std::set<std::tuple<int, int, int, int>> built;  // (schedule, p, m, v): each shape built once
  int accepted = 0, refused = 0;
  for (const char* preset : {"tiny", "tall"}) {
    GPT2Config model;
    ASSERT_TRUE(find_preset(preset, &model));
    for (const char* schedule : {"afab", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"})
      for (int world = 1; world <= 5; world++)
        for (int pp = 0; pp <= 5; pp++)
          for (int m = 0; m <= 5; m++)
            for (int v = 0; v <= 5; v++)
              for (int batch = 0; batch <= 5; batch++)
                for (int zero = 0; zero < 3; zero++) {
                  PipelineFlags flags;
                  flags.schedule = schedule, flags.pp = pp, flags.micro_batches = m, flags.virtual_stages = v;
                  flags.zero1 = zero == 1, flags.zero2 = zero == 2;
                  PipelinePlan plan;
                  const std::string problem = pipeline_flags_problem(flags, world, model, batch, &plan);
                  if (!problem.empty()) {
                    refused++;
                    // Each refusal names flags; the last check (the schedule's own shape rule, which
                    // build_schedule enforces with an internal check) is never the one that refuses.
                    EXPECT_EQ(problem.find("cannot run this shape"), std::string::npos) << problem;
                    continue;
                  }
                  accepted++;
                  const PipelineShape& s = plan.shape;
                  ASSERT_EQ(world % s.stages, 0);
                  ASSERT_EQ(int(plan.blocks.size()), s.stages * s.chunks);
                  if (batch > 0) {
                    EXPECT_EQ(batch % (plan.data_parallel * s.micro_batches), 0);
                  }
                  if (!built.insert({int(plan.schedule), s.stages, s.micro_batches, s.chunks}).second) continue;
                  for (Matching matching : {Matching::ByTag, Matching::ByCallOrder}) {
                    std::vector<std::vector<Action>> every_rank;
                    for (int r = 0; r < s.stages; r++) every_rank.push_back(build_schedule(plan.schedule, s, r, matching));
                    EXPECT_EQ(check_pipeline(plan.schedule, s, every_rank, matching), "")
                        << schedule << " p " << s.stages << " m " << s.micro_batches << " v " << s.chunks << " "
                        << matching_name(matching);
                    for (int r = 0; r < s.stages; r++) {
                      std::vector<ModelPart> parts = parts_of_rank(model, plan.blocks, s.stages, r, s.placement);
                      ASSERT_EQ(int(parts.size()), s.chunks);
                      for (int c = 0; c < s.chunks; c++) EXPECT_GE(max_in_flight(every_rank[r], c), 1);
                    }
                  }
                }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

// The reported case, and 08's other refusals that once came after expensive work or named no flag.
TEST(PipelineFlags, RefusalsNameTheFlagsAndCostNothing) {
  GPT2Config tall;
  ASSERT_TRUE(find_preset("tall", &tall));
  PipelinePlan plan;
  auto problem = [&](PipelineFlags f, int world, int batch) { return pipeline_flags_problem(f, world, tall, batch, &plan); };
  PipelineFlags interleaved_v1;
  interleaved_v1.schedule = "interleaved", interleaved_v1.virtual_stages = 1;
  EXPECT_EQ(problem(interleaved_v1, 2, 8),
            "--schedule interleaved needs --virtual-stages 2 or more (with one chunk a rank, it is 1f1b: use "
            "--schedule 1f1b)");
  // A V has two arms: zb-v sets --virtual-stages 2, and refuses any other count.
  PipelineFlags v_three;
  v_three.schedule = "zb-v", v_three.virtual_stages = 3;
  EXPECT_EQ(problem(v_three, 2, 8),
            "--schedule zb-v runs 2 chunks a rank, the two arms of its V: --virtual-stages 2 (or leave it out), not 3");
  PipelineFlags v_default;
  v_default.schedule = "zb-v";
  EXPECT_EQ(problem(v_default, 4, 8), "");
  EXPECT_EQ(plan.shape.chunks, 2);
  EXPECT_EQ(plan.shape.placement, Placement::V);
  PipelineFlags dualpipev_few;
  dualpipev_few.schedule = "dualpipev", dualpipev_few.micro_batches = 6;
  EXPECT_EQ(problem(dualpipev_few, 4, 24),
            "--schedule dualpipev fills its V with 2 x --pp 4 micro-batches before its steady state: --micro-batches 6 "
            "must be at least 8");
  // dualpipev's F&B pairs run at once by default; --fb-overlap says on or off, for dualpipev alone.
  PipelineFlags pairs = dualpipev_few;
  pairs.micro_batches = 8;
  EXPECT_EQ(problem(pairs, 4, 8), "");
  EXPECT_TRUE(plan.fb_overlap);
  pairs.fb_overlap = "off";
  EXPECT_EQ(problem(pairs, 4, 8), "");
  EXPECT_FALSE(plan.fb_overlap);
  pairs.fb_overlap = "yes";
  EXPECT_EQ(problem(pairs, 4, 8), "--fb-overlap yes: choose on or off");
  v_default.fb_overlap = "on";
  EXPECT_EQ(problem(v_default, 4, 8),
            "--fb-overlap runs dualpipev's forward-backward pairs at once: --schedule zb-v has none (pass --schedule "
            "dualpipev, or leave --fb-overlap out)");
  v_default.fb_overlap = "";
  v_default.zero2 = true;
  EXPECT_NE(problem(v_default, 4, 8).find("--zero2 reduce-scatters"), std::string::npos);
  // Ten million micro-batches: refused by arithmetic, before any schedule of that length exists.
  // Not timed: at 2^31 - 1 micro-batches a schedule built first would need hundreds of gigabytes (an
  // exception, or a hang that the runner's bound ends), so a refusal at all shows the order.
  PipelineFlags many;
  many.micro_batches = 10000000;
  EXPECT_EQ(problem(many, 2, 8),
            "--batch 8 is not divisible by data-parallel ranks x micro-batches = 1 x 10000000 = 10000000; try --batch "
            "10000000 or fewer --micro-batches");
  many.micro_batches = 2147483647;
  EXPECT_NE(problem(many, 2, 8).find("--micro-batches"), std::string::npos);
  PipelineFlags three;
  three.pp = 3;
  EXPECT_EQ(problem(three, 4, 8), "the 4 ranks do not divide into pipelines of --pp 3 stages: run on a multiple of 3 ranks, "
                                  "or change --pp");
  // 09's --tp: the data-parallel ranks are what TP x PP leave, and the grid's refusal names both.
  PipelineFlags tp2;
  tp2.tp = 2, tp2.pp = 2, tp2.zero2 = true;
  EXPECT_EQ(problem(tp2, 8, 8), "");
  EXPECT_EQ(plan.data_parallel, 2);
  EXPECT_EQ(problem(tp2, 6, 8), "the 6 ranks do not divide into tensor-parallel groups of --tp 2 times pipelines of --pp "
                                "2 stages: run on a multiple of 4 ranks, or change --tp or --pp");
  // A mixture of experts: no pipeline splits its blocks.
  GPT2Config moe;
  ASSERT_TRUE(find_preset("moe-tiny", &moe));
  EXPECT_NE(pipeline_flags_problem(PipelineFlags{}, 1, moe, 8, &plan).find("--preset moe-tiny is a mixture of experts"),
            std::string::npos);
}

// A suggestion must be able to help: never the preset in use, a preset of the other kind, one as
// shallow, or an example of the wrong length. (These once said "try --preset deep or tall" to a
// tall model on 16 virtual stages, the dense presets to moe-tiny, and "e.g. 3,4,5" for 4 stages.)
TEST(PipelineFlags, SuggestionsCanHelp) {
  GPT2Config tall, moe_tiny;
  ASSERT_TRUE(find_preset("tall", &tall));
  ASSERT_TRUE(find_preset("moe-tiny", &moe_tiny));
  PipelinePlan plan;
  PipelineFlags zbv8;
  zbv8.schedule = "zb-v", zbv8.pp = 8;
  EXPECT_EQ(pipeline_flags_problem(zbv8, 8, tall, 16, &plan),
            "--pp 8 x --virtual-stages 2 = 16 virtual stages, but --preset tall has 8 blocks: every stage needs one "
            "(try --pp 4 or fewer)");
  PipelineFlags zbv4 = zbv8;
  zbv4.pp = 4;
  GPT2Config tiny;
  ASSERT_TRUE(find_preset("tiny", &tiny));
  EXPECT_EQ(pipeline_flags_problem(zbv4, 4, tiny, 8, &plan),
            "--pp 4 x --virtual-stages 2 = 8 virtual stages, but --preset tiny has 2 blocks: every stage needs one "
            "(try --preset deep, gpt2, tall or gpt2-wide, or --pp 1)");
  for (const char* schedule : {"zb-v", "dualpipev", "interleaved"}) {
    PipelineFlags moe;
    moe.schedule = schedule, moe.pp = 2, moe.micro_batches = 4, moe.splits_experts = true;
    EXPECT_EQ(pipeline_flags_problem(moe, 2, moe_tiny, 8, &plan),
              "--pp 2 x --virtual-stages 2 = 4 virtual stages, but --preset moe-tiny has 2 blocks: every stage needs "
              "one (try --preset moe-small, or --pp 1)")
        << schedule;
  }
  PipelineFlags partition;
  partition.pp = 4, partition.partition = "8,0,0,0";
  EXPECT_EQ(pipeline_flags_problem(partition, 4, tall, 8, &plan),
            "--partition 8,0,0,0: 4 block counts that add up to L = 8 (each >= 1, e.g. 2,2,2,2)");
}

// Matched by tag, a step's largest tag is 2 p v m - 1, checked against the communicator's bound (the
// standard guarantees 32767; this MPICH's MPI_TAG_UB is 2^28 - 1, which 08 once passed unchecked).
TEST(PipelineFlags, TheLargestTagIsCheckedAgainstTheBound) {
  EXPECT_EQ(largest_pipeline_tag(PipelineShape{2, 4, 1}), 15);
  EXPECT_EQ(pipeline_tag_problem(PipelineShape{2, 8192, 1}, 32767), "");  // tags 0 .. 32767
  EXPECT_EQ(pipeline_tag_problem(PipelineShape{2, 8193, 1}, 32767),
            "--micro-batches 8193: matched by tag, a step's messages carry tags up to 2 x 2 stages x 1 chunks x 8193 "
            "micro-batches - 1 = 32771, past this MPI's largest tag (MPI_TAG_UB) 32767: pass --micro-batches 8192 or "
            "fewer, or --p2p-matching call-order");
  EXPECT_EQ(pipeline_tag_problem(PipelineShape{4, 2048, 2}, 32767), "");  // 2 x 4 x 2 x 2048 - 1 = 32767
  EXPECT_NE(pipeline_tag_problem(PipelineShape{4, 2049, 2}, 32767), "");
}

// 07: --tp and --grad-accum from 1 to 5, --batch from 1 to 5, with and without sequence
// parallelism, on 1 to 5 ranks, for models whose sizes divide by little: the grid, the batch split
// and the tensor sizes are checked as TrainingRun checks them; what passes, every rank's layout is
// built, and the link's transfers counted, without an internal check failing.
TEST(EveryCombination, OfTheTensorParallelFlagsIsRefusedOrBuilds) {
  int accepted = 0;
  for (const char* preset : {"tiny", "odd"}) {
    GPT2Config model;
    ASSERT_TRUE(find_preset(preset, &model));
    for (int world = 1; world <= 5; world++)
      for (int tp = 0; tp <= 5; tp++)
        for (int accumulation = 1; accumulation <= 5; accumulation++)
          for (int batch = 1; batch <= 5; batch++)
            for (bool sequence_parallel : {false, true}) {
              const std::string grid = grid_shape_problem(world, tp, 1);
              if (!grid.empty()) {
                EXPECT_EQ(grid.find("--pp"), std::string::npos) << grid;  // 07 has no --pp
                continue;
              }
              const int dp = world / tp;
              if (batch % (dp * accumulation)) continue;  // TrainingRun's refusal, tested as a process below
              const int micro_batch = batch / (dp * accumulation);
              for (int rank = 0; rank < tp; rank++) {
                const TensorParallelism split{tp, rank, sequence_parallel && tp > 1};
                if (!tensor_parallel_size_problem(model, split, micro_batch).empty()) continue;
                const ParamLayout layout = build_gpt2_layout(model, dp, split);
                EXPECT_GT(layout.num_params, 0);
                step_transfers(layout, model, Strategy::DP, 4, micro_batch, world, dp, split, 1, {1, 1}, {1, 1});
                accepted++;
              }
            }
  }
  EXPECT_GT(accepted, 50);
}

// ---------------------------------------------------------------------------------------------
// The emulated link

// Before the work: a link on which one transfer of every step outlasts --timeout, with the sum.
TEST(EmulatedLink, ATransferLongerThanTheTimeoutIsRefusedWithItsArithmetic) {
  GPT2Config model;
  ASSERT_TRUE(find_preset("tiny", &model));
  const ParamLayout layout = build_gpt2_layout(model, 2);
  const LinkModel slow{0.001, 0};  // 1 Mbit/s
  const std::string problem =
      link_timeout_problem(step_transfers(layout, model, Strategy::DP, 4, 4, 2, 2, {}, 1, slow, slow), 0.2);
  EXPECT_NE(problem.find("the emulated link (--link-gbps 0.001, --link-latency-us 0) makes the all-reduce of the "
                         "largest gradient (wte) over the 2 data-parallel ranks"),
            std::string::npos)
      << problem;
  // wte's gradient: V x C x 4 bytes = 256 x 64 x 4 = 65.5 KB, half of it a hop, 8 bits a byte at 1e6 bit/s.
  EXPECT_NE(problem.find("2(N-1)(alpha + S/N / beta) = 2 x 1 x (0 us + 32.8 KB at 0.001 Gbit/s) = 0.5243 s by itself, "
                         "longer than --timeout 0.2 s"),
            std::string::npos)
      << problem;
  // The same link with no watchdog, or a timeout above the sum, runs.
  EXPECT_EQ(link_timeout_problem(step_transfers(layout, model, Strategy::DP, 4, 4, 2, 2, {}, 1, slow, slow), 0), "");
  EXPECT_EQ(link_timeout_problem(step_transfers(layout, model, Strategy::DP, 4, 4, 2, 2, {}, 1, slow, slow), 0.6), "");
  // Latency alone: the loss's all-reduce of 8 bytes waits 2(N-1) latencies.
  const std::string far = link_timeout_problem(
      step_transfers(layout, model, Strategy::DP, 4, 4, 4, 4, {}, 1, {0, 1e6}, {0, 1e6}), 5);
  EXPECT_NE(far.find("= 2 x 3 x (1e+06 us + 2 B at unlimited bandwidth) = 6 s"), std::string::npos) << far;
}

// ---------------------------------------------------------------------------------------------
// Refusals as the user meets them: every rank ends, non-zero, at once, cleanly, with one message
// that names only the chapter's own flags.

// The --xxx words of a text.
std::set<std::string> flags_named(const std::string& text) {
  std::set<std::string> flags;
  static const std::regex flag("--[a-z][a-z0-9]*(-[a-z0-9]+)*");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), flag); it != std::sregex_iterator(); ++it)
    flags.insert(it->str());
  return flags;
}

// A chapter's --help, once per test binary.
const std::set<std::string>& help_flags(const std::string& chapter) {
  static std::map<std::string, std::set<std::string>> cache;
  auto found = cache.find(chapter);
  if (found != cache.end()) return found->second;
  RunResult help = run_command("mpiexec -n 1 ./" + chapter + "/train --help", 60);
  EXPECT_EQ(help.exit_code, 0) << help.output;
  return cache[chapter] = flags_named(help.output);
}

struct Refusal {
  std::string chapter;
  int ranks;
  std::string args, message;  // the message's start, after "error: "
};

void PrintTo(const Refusal& r, std::ostream* os) { *os << r.chapter << " on " << r.ranks << " ranks: " << r.args; }

class RefusalTest : public testing::TestWithParam<Refusal> {};

size_t count(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) n++;
  return n;
}

// Before the work, without timing it: on --steps 100000 a check that came after the work would
// hit the bound (60 s, far above an idle machine's second; only a hang or the work reaches it), and
// no step may be recorded, in the records or in their file being written.
TEST_P(RefusalTest, EndsEveryRankCleanlyAtOnceNamingOnlyTheChaptersFlags) {
  const Refusal c = GetParam();
  const std::string jsonl = temp_dir() + "/run.jsonl";
  RunResult r = run_trainer(c.chapter, c.ranks, "--steps 100000 --json " + jsonl + " " + c.args, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung, or the check came after the work";
  EXPECT_TRUE(read_records(jsonl, "step").empty()) << "a step ran before the refusal:\n" << r.output;
  EXPECT_TRUE(read_records(json_being_written(jsonl), "step").empty()) << "a step ran before the refusal:\n" << r.output;
  EXPECT_EQ(count(r.output, "error: " + c.message), 1u) << "expected 'error: " << c.message << "' once in:\n" << r.output;
  EXPECT_EQ(r.output.find("MPI_Abort"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("BAD TERMINATION"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  const std::set<std::string>& help = help_flags(c.chapter);
  const std::set<std::string> typed = flags_named(c.args);  // a mistyped flag is quoted back
  for (const std::string& flag : flags_named(r.output))
    EXPECT_TRUE(help.count(flag) || typed.count(flag)) << flag << " is not a flag of " << c.chapter << ":\n" << r.output;
}

std::vector<Refusal> refusals() {
  return {
      // Found by every rank alike (config_error), at 2 ranks and more.
      {"01_vanilla_dp", 2, "--batch 3", "--batch 3 is not divisible by ranks x grad-accum = 2 x 1 = 2; try --batch 4"},
      {"01_vanilla_dp", 2, "--step 5", "unknown flag '--step'; did you mean --steps?"},
      {"01_vanilla_dp", 2, "--warmup 200000", "--warmup 200000 is longer than the run's 100000 steps"},
      {"01_vanilla_dp", 2, "--link-gbps 1e-300", "--link-gbps 1e-300: an emulated link carries 0.001 to 100000 Gbit/s"},
      {"01_vanilla_dp", 2, "--link-latency-us 1e12 --timeout 5", "--link-latency-us 1e+12: an emulated link's latency"},
      {"01_vanilla_dp", 2, "--link-gbps 0.001 --timeout 0.2", "the emulated link (--link-gbps 0.001, --link-latency-us 0)"},
      {"04_zero1", 2, "--link-latency-us 1000000 --timeout 1", "the emulated link (--link-gbps 0, --link-latency-us 1e+06)"},
      // Found by one rank, agreed by all (agree_or_die): rank 0 cannot write there.
      {"03_bucket_dp", 2, "--save /nonexistent/ck.bin", "--save /nonexistent/ck.bin: the folder"},
      {"07_tensor_parallel", 2, "--tp 2 --tp 1", "--tp is given twice: give it once"},
      {"07_tensor_parallel", 4, "--tp 3", "the 4 ranks do not divide into tensor-parallel groups of --tp 3"},
      {"07_tensor_parallel", 2, "--batch 100000000", "this run would need about"},
      {"07_tensor_parallel", 2, "--tp-link-gbps 0.001 --timeout 0.5", "the emulated link (--tp-link-gbps 0.001"},
      {"08_pipeline", 4, "--preset tall --pp 3", "the 4 ranks do not divide into pipelines of --pp 3 stages"},
      {"08_pipeline", 2, "--preset tall --schedule interleaved --virtual-stages 1",
       "--schedule interleaved needs --virtual-stages 2 or more"},
      {"08_pipeline", 2, "--preset tall --schedule zb-v --virtual-stages 4",
       "--schedule zb-v runs 2 chunks a rank, the two arms of its V"},
      {"09_3d_parallel", 2, "--tp 1 --pp 2 --preset tall --schedule zb-v --recompute full",
       "--recompute full keeps no product's input for the later weight pass of zb-h1, zb-v and dualpipev"},
      {"08_pipeline", 2, "--preset tall --schedule dualpipev --micro-batches 2",
       "--schedule dualpipev fills its V with 2 x --pp 2 micro-batches"},
      {"08_pipeline", 2, "--preset tall --schedule 1f1b --fb-overlap off",
       "--fb-overlap runs dualpipev's forward-backward pairs at once: --schedule 1f1b has none"},
      {"12_5d_parallel", 4, "--preset moe-small --pp 2 --ep 2 --schedule zb-v --fb-overlap on",
       "--fb-overlap runs dualpipev's forward-backward pairs at once: --schedule zb-v has none"},
      {"08_pipeline", 2, "--preset tall --micro-batches 10000000",
       "--batch 8 is not divisible by data-parallel ranks x micro-batches = 1 x 10000000"},
      {"08_pipeline", 2, "--preset tall --batch 100000000", "this run would need about"},
      {"08_pipeline", 2, "--preset tall --batch 3", "--batch 3 is not divisible by data-parallel ranks x micro-batches"},
      // Tags past MPI_TAG_UB (2^28 - 1 here): refused before the memory forecast, or a tag MPI rejects.
      {"08_pipeline", 2, "--preset tall --micro-batches 100000000 --batch 100000000",
       "--micro-batches 100000000: matched by tag, a step's messages carry tags up to"},
      {"08_pipeline", 1, "--preset moe-tiny", "--preset moe-tiny is a mixture of experts, whose blocks neither a pipeline"},
      // 09 checks its flags with 08's code: the same refusals, as fast.
      {"09_3d_parallel", 2, "--tp 1 --pp 2 --preset tall --micro-batches 10000000",
       "--batch 8 is not divisible by data-parallel ranks x micro-batches = 1 x 10000000"},
      {"09_3d_parallel", 2, "--tp 1 --pp 2 --preset tall --micro-batches 100000000 --batch 100000000",
       "--micro-batches 100000000: matched by tag, a step's messages carry tags up to"},
      {"09_3d_parallel", 4, "--tp 2 --pp 2 --preset tall --zero1 --zero2", "--zero1 and --zero2: choose one"},
      {"09_3d_parallel", 1, "--preset moe-tiny", "--preset moe-tiny is a mixture of experts, whose blocks neither a pipeline"},
      {"10_context_parallel", 1, "--preset moe-tiny",
       "--preset moe-tiny is a mixture of experts, whose blocks 10_context_parallel cannot run with ring attention"},
      {"10_context_parallel", 3, "--cp 2", "the 3 ranks do not divide into context-parallel rings of --cp 2"},
      {"10_context_parallel", 2, "--preset odd --cp 2 --cp-split contiguous",
       "the sequence length T = 17 does not divide into --cp 2 equal parts"},
      {"10_context_parallel", 2, "--preset odd --cp 2", "the sequence length T = 17 does not divide into 2 x --cp = 4"},
      {"10_context_parallel", 3, "--cp 3 --cp-split contiguous",  // 2 and 4 divide T = 64, but not 3 ranks
       "the sequence length T = 64 does not divide into --cp 3 equal parts (--cp-split contiguous): use --cp 1 on "
       "these 3 ranks, or another --preset"},
      {"10_context_parallel", 2, "--zero1", "unknown flag '--zero1'"},  // ZeRO over DP x CP: chapter 12
      {"10_context_parallel", 2, "--cp-split diagonal", "--cp-split: 'diagonal' is neither zigzag nor contiguous"},
      {"10_context_parallel", 4, "--cp 2 --batch 3", "--batch 3 is not divisible by data-parallel ranks x grad-accum = 2 x 1"},
      {"10_context_parallel", 3, "--cp 1 --ulysses 3", "--ulysses 3: the 4 heads do not split into 3 groups of whole heads"},
      {"10_context_parallel", 3, "--preset odd --cp 1 --cp-split contiguous --ulysses 3",
       "--ulysses 3: a ring chunk's 17 positions (T = 17 over --cp 1) do not split into 3 equal slices"},
      {"10_context_parallel", 3, "--ulysses 2", "--ulysses 2: the 3 ranks do not divide into groups of --cp x --ulysses = 2"},
      {"12_5d_parallel", 4, "--tp 2 --ulysses 4", "--ulysses 4: the 4 heads, 2 per TP rank, do not split into 4 groups"},
  };
}

std::string refusal_name(const testing::TestParamInfo<Refusal>& info) {
  std::string name = info.param.chapter.substr(0, 2) + "_" + std::to_string(info.index);
  return name;
}

INSTANTIATE_TEST_SUITE_P(Trainer, RefusalTest, testing::ValuesIn(refusals()), refusal_name);

// Chapter 00 measures what ranks send each other: on one rank it once printed a table of zeros
// (alpha 0.00 us "between ranks 0 and 1"). Refused, with the line to run instead.
TEST(Refusals, CollectivesOnOneRankHaveNothingToMeasure) {
  RunResult r = run_command("mpiexec -n 1 ./00_collectives/collectives --max-bytes 64", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_EQ(count(r.output, "error: one rank has no one to send to, so there is nothing to measure: run on 2 ranks or "
                            "more (mpiexec -n 4 ./00_collectives/collectives)"),
            1u)
      << r.output;
  EXPECT_EQ(r.output.find("alpha"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_Abort"), std::string::npos) << r.output;
}

// Chapter 00's --communicator table compares with raw MPI calls on host memory: on a GPU there is
// no raw MPI call to compare with, so it is refused before any work, naming the flag.
TEST(Refusals, TheCommunicatorTableRunsOnTheCpuOnly) {
  RunResult r = run_command("mpiexec -n 2 ./00_collectives/collectives --communicator --device cuda", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_EQ(count(r.output, "error: --communicator compares with raw MPI on the CPU: drop --device cuda"), 1u)
      << r.output;
  EXPECT_EQ(r.output.find("Table 1"), std::string::npos) << r.output;
}

// 08 resumes a checkpoint whose batch its ranks cannot split: the advice names 08's accumulation
// flag, --micro-batches (08 refuses --grad-accum). The checkpoint is one of a run's middle (after
// step 0 of 2): a finished run's would be refused first, for having nothing left to resume.
TEST(Refusals, APipelineResumeAdvisesItsOwnFlags) {
  const std::string dir = temp_dir();
  RunResult made =
      run_trainer("08_pipeline", 2, "--preset tall --steps 2 --save-every 1 --save " + dir + "/ck_{step}.bin", 60);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  RunResult r = run_trainer("08_pipeline", 3, "--preset tall --resume " + dir + "/ck_1.bin", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("with a --micro-batches that divides"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--grad-accum"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_Abort"), std::string::npos) << r.output;
  // And a pipeline's grid line names its own dimensions only.
  EXPECT_NE(made.output.find("grid: 1 data-parallel x 2 pipeline stages"), std::string::npos) << made.output;
  EXPECT_EQ(made.output.find("tensor-parallel"), std::string::npos) << made.output;
}

// Every {step} of --save is filled.
TEST(Refusals, EveryStepOfTheSavePathIsFilled) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer("01_vanilla_dp", 1, "--steps 1 --save " + dir + "/a_{step}_{step}.ckpt", 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(file_exists(dir + "/a_1_1.ckpt")) << r.output;
}

// Ctrl-C during a modelled wait, shown without timing it: each collective of this run is held 2 s
// (1 s latency, 2 ranks), and every tensor of deep's 12 blocks is a bucket of its own, so a step
// makes well over a hundred: a stop that waited out the link would take minutes and hit the bound
// of 60 s (exit 124). The interrupted link lets the step end at once and the run stops as after
// any step (exit 130), its summary saying so.
TEST(EmulatedLink, CtrlCEndsAModelledWait) {
  const std::string dir = temp_dir();
  BackgroundRun run = start_trainer("03_bucket_dp", 2, "--preset deep --bucket-mb 0.000001 --steps 100000 --timeout 0 "
                                                       "--link-latency-us 1000000 --json " + dir + "/run.jsonl");
  for (int i = 0; i < 600 && read_record(json_being_written(dir + "/run.jsonl"), "run").empty(); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // inside step 0, whose collectives are held
  kill(run.pid, SIGINT);
  RunResult r = wait_for(run, 60);
  EXPECT_NE(r.exit_code, 124) << "the stop waited out the modelled link:\n" << r.output;
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(read_record(dir + "/run.jsonl", "summary").find("\"ended\":\"interrupted\""), std::string::npos) << r.output;
}

// The watchdog watches a modelled wait and blames the link: test_comm's
// DISABLED_WatchdogEndsAModelledWaitLongerThanTheTimeout, alone on 2 ranks.
TEST(EmulatedLink, TheWatchdogSaysTheModelledLinkIsSlowNotThatARankIsDead) {
  RunResult r = run_command("mpiexec -n 2 build/tests/test_comm --gtest_also_run_disabled_tests "
                            "--gtest_filter=CommTest.DISABLED_WatchdogEndsAModelledWaitLongerThanTheTimeout", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  // Not timed: the modelled wait is 2 x 1000 s, so only the watchdog ends it within the bound of 60 s.
  EXPECT_NE(r.exit_code, 124) << "the job hung in a modelled wait";
  EXPECT_NE(r.output.find("watchdog: the emulated link holds this all_reduce of 4.1 KB over the world group"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("longer than --timeout 1 s: the modelled link (--link-gbps and --link-latency-us) is that "
                          "slow; no rank is dead"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("dead or stuck"), std::string::npos) << r.output;
}

}  // namespace
