// test_context_parallel.cpp: chapter 10 end to end, through the real trainer binary. On CP 1 (one
// rank and two), CP 2, CP 4 and DP 2 x CP 2, contiguous and zigzag, with gradient accumulation, it
// trains to the same losses, gradient norms and final parameters as one rank of 01 with the same
// global batch. Every figure theory predicts equals the measurement: the model state, the DP x CP
// group's bytes, the activations on T/cp positions with the ring's blocks in flight, each rank's
// attention FLOPs (zigzag's equal on every rank, contiguous's growing with the rank), the ring's
// bytes, forward 2(cp-1)/cp of K and V, backward twice that, and under each --recompute the memory
// and FLOPs it prints. Checkpoints stay layout-free: 10's
// resume in 01 and in 10 on another grid, 01's in 10. The ring's kernels alone:
// test_ring_attention.cpp; the refusals: test_refusals.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <ostream>
#include <regex>
#include <algorithm>
#include <string>
#include <vector>

#include "training_harness.h"

namespace {

constexpr double kTolerance = 1e-5;  // fp32, relative

struct CpCase {
  int ranks;
  std::string flags;
  std::string name;
  int cp;
};

void PrintTo(const CpCase& c, std::ostream* out) { *out << c.ranks << " ranks, " << c.flags; }

class ContextParallelEquivalence : public testing::TestWithParam<CpCase> {};

// What context parallelism can get wrong, each silently: a position embedding at the local index
// rather than the absolute position; a causal mask by local index (a zigzag rank would let early
// queries see late keys); a key's gradient left at the rank that computed it instead of its owner;
// the loss or the gradient averaged over DP only, or summed over CP.
TEST_P(ContextParallelEquivalence, SameTrainingAsOneRankOf01AndEveryFigureIsItsFormula) {
  const CpCase c = GetParam();
  const std::string jsonl =
      expect_trains_like_one_rank_of_01("10_context_parallel", c.ranks, c.flags, "tiny", "", 6, kTolerance);
  expect_theory_matches(jsonl, /*param_bytes=*/4);
  const std::string ring = read_record(jsonl, "ring");
  ASSERT_FALSE(ring.empty()) << "no ring record in " << jsonl;
  EXPECT_EQ(number_field(ring, "cp"), c.cp);
  std::vector<double> flops;
  for (int q = 0; q < c.ranks; q++) {
    const std::string k = "rank" + std::to_string(q) + "_";
    flops.push_back(number_field(ring, k + "flops"));
    EXPECT_GT(flops.back(), 0) << ring;
    EXPECT_EQ(flops.back(), number_field(ring, k + "theory_flops")) << "rank " << q << ": " << ring;
    EXPECT_EQ(number_field(ring, k + "forward_bytes"), number_field(ring, "theory_forward_bytes")) << ring;
    EXPECT_EQ(number_field(ring, k + "backward_bytes"), number_field(ring, "theory_backward_bytes")) << ring;
  }
  // The backward sends twice the forward's bytes; full recomputation runs the forward's ring twice.
  const double forward_passes = c.flags.find("--recompute full") != std::string::npos ? 2 : 1;
  EXPECT_EQ(number_field(ring, "theory_backward_bytes") * forward_passes, 2 * number_field(ring, "theory_forward_bytes"))
      << ring;
  if (c.cp > 1) {
    EXPECT_GT(number_field(ring, "theory_forward_bytes"), 0) << ring;
  }
  // The balance: zigzag gives every rank the same work; contiguous the last rank of a ring the most.
  const bool zigzag = c.flags.find("contiguous") == std::string::npos;
  for (int q = 1; q < c.ranks; q++) {
    if (zigzag) {
      EXPECT_EQ(flops[size_t(q)], flops[0]) << ring;
    } else if (q % c.cp != 0) {
      EXPECT_GT(flops[size_t(q)], flops[size_t(q - 1)]) << ring;
    }
  }
}

std::vector<CpCase> cases() {
  return {
      {1, "--cp 1", "cp1_ring_of_one", 1},
      {2, "--cp 1", "dp2_rings_of_one", 1},  // each rank its own ring of one, the two data-parallel
      {2, "--cp 2", "cp2_zigzag", 2},
      {2, "--cp 2 --cp-split contiguous --grad-accum 2", "cp2_contiguous_accum", 2},
      {4, "--cp 4 --cp-split contiguous", "cp4_contiguous", 4},
      {4, "--cp 4 --grad-accum 2", "cp4_zigzag_accum", 4},
      {4, "--cp 2 --grad-accum 2 --bucket-mb 0.05", "dp2_cp2_zigzag_accum", 2},
      {4, "--cp 2 --cp-split contiguous", "dp2_cp2_contiguous", 2},
      {2, "--cp 2 --recompute full", "cp2_zigzag_recompute_full", 2},
  };
}

INSTANTIATE_TEST_SUITE_P(Grids, ContextParallelEquivalence, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<CpCase>& info) { return info.param.name; });

// The lesson of the memory: on T = 1024 positions a rank of a ring of 2 keeps about half the
// activations of a ring of one (the formula's T/cp terms; the ring's blocks in flight add the rest),
// and far less than 01's materialized (B,NH,T,T) attention. Measured, and each equal to its formula.
TEST(ContextParallelMemory, ActivationsFallWithTheRingAndEqualTheFormula) {
  std::vector<double> held;
  for (int cp : {1, 2}) {
    const std::string dir = temp_dir();
    RunResult r = run_trainer("10_context_parallel", cp,
                              "--preset long --steps 2 --batch 2 --cp " + std::to_string(cp) + " --json " + dir + "/run.jsonl");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string theory = read_record(dir + "/run.jsonl", "theory");
    held.push_back(number_field(theory, "measured_activations_bytes"));
    EXPECT_EQ(held.back(), number_field(theory, "theory_activations_bytes")) << theory;
    EXPECT_NE(r.output.find("(by the formula: CP " + std::to_string(cp) + ": the arena on T/cp = " +
                            std::to_string(1024 / cp) + " positions"),
              std::string::npos)
        << r.output;
  }
  EXPECT_LT(held[1], 0.6 * held[0]);
  EXPECT_GT(held[1], 0.5 * held[0]);
}

// What --recompute changes under ring attention, as printed and measured. The ring keeps a
// log-sum-exp per query, never the (B,NH,T,T) scores, and its backward recomputes each block's scores
// in every mode: selective has nothing to drop, so it keeps what none keeps and adds no FLOPs; full
// keeps each block's input and replays the rest. In each mode the measured activations equal the
// formula, and the line "(recompute none | selective | full)" prints the three measured figures.
TEST(ContextParallelRecompute, EachModePrintsWhatItKeepsAndRecomputes) {
  const std::string dir = temp_dir();
  const std::regex measured_line(R"(\n  activations +([0-9.]+ [KMG]?B) )");
  const std::regex modes_line(R"(\(recompute none ([0-9.]+ [KMG]?B) \| selective ([0-9.]+ [KMG]?B) \| full ([0-9.]+ [KMG]?B))");
  std::vector<std::string> measured, printed;
  std::vector<double> bytes, flops;
  for (const char* mode : {"none", "selective", "full"}) {
    const std::string json = dir + "/" + mode + ".jsonl";
    RunResult r = run_trainer("10_context_parallel", 2,
                              "--preset tiny --steps 3 --cp 2 --recompute " + std::string(mode) + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string theory = read_record(json, "theory");
    bytes.push_back(number_field(theory, "measured_activations_bytes"));
    EXPECT_EQ(bytes.back(), number_field(theory, "theory_activations_bytes")) << mode << ": " << theory;
    const std::string summary = read_record(json, "summary");
    flops.push_back(summary.find("recompute_flops_per_token") == std::string::npos
                        ? 0.0 : number_field(summary, "recompute_flops_per_token"));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, measured_line)) << r.output;
    measured.push_back(m[1]);
    if (std::string(mode) == "none") continue;  // (the line is printed where a mode is chosen)
    ASSERT_TRUE(std::regex_search(r.output, m, modes_line)) << r.output;
    printed = {m[1], m[2], m[3]};
    if (std::string(mode) == "selective") {
      EXPECT_NE(r.output.find("recompute selective: + 0 FLOPs per token"), std::string::npos) << r.output;
    }
  }
  EXPECT_EQ(printed, measured);
  EXPECT_EQ(bytes[1], bytes[0]);  // selective keeps what none keeps
  EXPECT_LT(bytes[2], bytes[0]);
  EXPECT_EQ(flops[1], 0.0);
  EXPECT_GT(flops[2], 0.0);
}

// Checkpoints hold whole tensors, whatever the grid: 10's resumes in 01 and in 10 on another grid and
// split; 01's resumes in 10.
TEST(ContextParallelCheckpoints, ResumeAcrossGridsAndChapters) {
  expect_checkpoints_cross_grids({"10_context_parallel", 2, "--cp 2"},
                                 {{"01_vanilla_dp", 1, ""}, {"10_context_parallel", 4, "--cp 2 --cp-split contiguous"}},
                                 {"10_context_parallel", 2, "--cp 2 --cp-split contiguous"}, "--preset tiny", 6, kTolerance);
}

// The trace shows the ring: each rank computes blocks while its sends are on the (emulated) link. Per
// rank, the time the forward's sends (those issued inside a "forward L" span) were in flight during
// "ring block" spans on the compute track is not zero: the send of a block does not wait for its
// compute, nor the compute for the send.
TEST(ContextParallelTrace, BlocksComputeWhileTheRingSends) {
  const std::string dir = temp_dir();
  RunResult r = run_trainer("10_context_parallel", 2,
                            "--preset small --steps 2 --cp 2 --link-gbps 1 --link-latency-us 50 --trace " + dir + "/t.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir + "/t.json");
  struct Span {
    int pid;
    double start, end;
  };
  std::vector<Span> sends, blocks, forwards;
  const std::regex event(R"re(\{"ph":"X","pid":(\d+),"tid":\d+,"ts":([0-9.]+),"dur":([0-9.]+),"name":"([^"]*)")re");
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, event)) continue;
    const Span span{std::stoi(m[1]), std::stod(m[2]), std::stod(m[2]) + std::stod(m[3])};
    const std::string name = m[4];
    if (name == "send" && line.find(", cp\"") != std::string::npos) sends.push_back(span);
    if (name.rfind("ring block", 0) == 0) blocks.push_back(span);
    if (name.rfind("forward L", 0) == 0) forwards.push_back(span);
  }
  auto in_forward = [&](const Span& s) {
    for (const Span& f : forwards)
      if (f.pid == s.pid && f.start <= s.start && s.start <= f.end) return true;
    return false;
  };
  for (int pid : {0, 1}) {
    double overlap = 0;
    int sent = 0, computed = 0;
    for (const Span& s : sends) {
      if (s.pid != pid || !in_forward(s)) continue;
      sent++;
      for (const Span& b : blocks)
        if (b.pid == pid) overlap += std::max(0.0, std::min(s.end, b.end) - std::max(s.start, b.start));
    }
    for (const Span& b : blocks) computed += b.pid == pid;
    EXPECT_GT(sent, 0) << "rank " << pid;
    EXPECT_GT(computed, 0) << "rank " << pid;
    EXPECT_GT(overlap, 0) << "rank " << pid << ": no block computed while a send was in flight";
  }
}

// The balance plot (scripts/bench/plot_cp_balance.py) draws from the runs' "ring" records, and refuses a
// run that has none, saying so.
TEST(ContextParallelPlot, TheBalancePlotReadsTheRingRecords) {
  const std::string dir = temp_dir();
  std::string runs;
  for (const char* split : {"contiguous", "zigzag"}) {
    const std::string json = dir + "/" + split + ".jsonl";
    RunResult r = run_trainer("10_context_parallel", 2,
                              "--preset tiny --steps 2 --cp 2 --cp-split " + std::string(split) + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs += " " + json;
  }
  RunResult plot = run_command("python3 scripts/bench/plot_cp_balance.py --out " + dir + "/cp_balance.png" + runs, 120);
  EXPECT_EQ(plot.exit_code, 0) << plot.output;
  EXPECT_TRUE(file_exists(dir + "/cp_balance.png")) << plot.output;
  RunResult other = run_trainer("01_vanilla_dp", 1, "--preset tiny --steps 2 --json " + dir + "/01.jsonl");
  ASSERT_EQ(other.exit_code, 0) << other.output;
  RunResult refused = run_command("python3 scripts/bench/plot_cp_balance.py --out " + dir + "/x.png " + dir + "/01.jsonl", 120);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("no ring record"), std::string::npos) << refused.output;
}

}  // namespace
