// test_5d_parallel.cpp: chapter 12 end to end, through the real trainer binary. Each grid trains to
// one rank's losses and final parameters: 01's for a dense preset, 11's (one rank, the same
// micro-batches) for moe-tiny, whose routed and dropped assignments per layer and expert must equal
// one rank's too. The grids are those where composition goes wrong silently: CP's ring over TP's
// heads, CP's T/cp rows down a pipeline, EP folded over TP ranks that route their own rows under SP,
// routing kept per micro-batch in flight, capacity claimed in the global token order across CP's
// interleaved positions, and all five at 16 ranks with ZeRO-1 and recomputation. A MoE model under
// ZeRO-1 (and --zero2) shards its dense state over DP x CP and its experts' over their replicas: the
// plan is checked without MPI, the runs against one rank of 11, their memory and bytes against the
// formulas, and their checkpoints across grids (with their own micro-batches). The memory forecast
// holds every rank's peak with experts down a pipeline.
// dualpipev's F&B pairs run at once (two lanes, common/comm/lanes.h): the same training, and the trace
// shows one micro-batch's all-to-all travelling while another micro-batch's backward computes.
#include <gtest/gtest-spi.h>  // EXPECT_NONFATAL_FAILURE: a check that must fail
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <ostream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "parallel/buckets.h"
#include "parallel/data_parallel.h"  // GradientSync::zero1_plan
#include "model/model_config.h"
#include "model/param_layout.h"
#include "training_harness.h"

namespace {

constexpr double kTolerance = 1e-5;  // fp32, relative

struct FiveDCase {
  int ranks;
  std::string preset;
  std::string flags;
  std::string name;
  int micro_batches = 2;  // 12's --micro-batches (the reference's --grad-accum for a MoE preset)
};

void PrintTo(const FiveDCase& c, std::ostream* out) { *out << c.ranks << " ranks, " << c.preset << ", " << c.flags; }

// Every rank's bytes in every group of the grid (and its expert parameters) equal their formulas.
void expect_groups_match_theory(const std::string& jsonl, int ranks, const std::vector<std::string>& names) {
  const std::string groups = read_record(jsonl, "groups");
  ASSERT_FALSE(groups.empty()) << "no groups record in " << jsonl;
  for (int q = 0; q < ranks; q++)
    for (const std::string& name : names) {
      const std::string key = "rank" + std::to_string(q) + "_" + name;
      const double measured = number_field(groups, key), theory = number_field(groups, key + "_theory");
      EXPECT_NEAR(measured, theory, 1e-9 * theory + 0.5) << key << " in " << groups;
    }
}

// The runs of the global micro-batch's token order (sequence, then position) that the rank at data,
// context and tensor rank (d, c, r) routes: its data rank's micro_B sequences of T tokens, at its CP
// rank's positions (zigzag: chunks c and 2cp-1-c of T/2cp; the chapter's default split), and under
// SP its TP rank's 1/tp of those rows. (first token, length) each.
std::vector<std::pair<int64_t, int64_t>> routed_token_runs(int d, int c, int r, int micro_B, int T, int cp, int tp,
                                                           bool sequence_parallel) {
  std::vector<int64_t> positions;
  for (int x = 0; x < T; x++) {
    const int chunk = cp > 1 ? x / (T / (2 * cp)) : c;
    if (chunk == c || chunk == 2 * cp - 1 - c) positions.push_back(x);
  }
  const int64_t rows = int64_t(micro_B) * int64_t(positions.size()), mine = sequence_parallel ? rows / tp : rows;
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t i = sequence_parallel ? r * mine : 0, n = 0; n < mine; i++, n++) {
    const int64_t token = (int64_t(d) * micro_B + i / int64_t(positions.size())) * T + positions[size_t(i % int64_t(positions.size()))];
    if (!runs.empty() && runs.back().first + runs.back().second == token) runs.back().second++;
    else runs.push_back({token, 1});
  }
  return runs;
}

// Every rank's bytes in its EP group (the groups record's ep entry, step 1) equal what the routing
// records imply (training_harness.h, a2a_bytes_from_routing): for rank w, its stage's records (PP is
// outermost: stage w / (W/pp)), its routing rank w % (W/pp) in the stage's order (edp x ep + its
// place), its EP group the ep routing ranks around it. Plus the counts' first gather, L' m (ep-1) x
// rec x 4 with rec = 1 + R(2 + E) int32 and R the most runs any rank routes (docs/theory.md, 17). The
// runs each record places are checked first against the tokens each rank routes under CP and SP.
void expect_ep_bytes_match_routing(const std::string& jsonl) {
  const std::string run = read_record(jsonl, "run"), groups = read_record(jsonl, "groups");
  ASSERT_FALSE(run.empty()) << "no run record in " << jsonl;
  ASSERT_FALSE(groups.empty()) << "no groups record in " << jsonl;
  const int W = int(number_field(run, "ranks")), pp = int(number_field(run, "pp")), ep = int(number_field(run, "ep"));
  const int dp = int(number_field(run, "dp")), cp = int(number_field(run, "cp")), tp = int(number_field(run, "tp"));
  const int L = int(number_field(run, "L")), E = int(number_field(run, "experts")), C = int(number_field(run, "C"));
  const int T = int(number_field(run, "T")), micro_B = int(number_field(run, "micro_batch"));
  const int m = int(number_field(run, "grad_accum"));
  const bool sp = run.find("\"sequence_parallel\":true") != std::string::npos;
  const int stage_ranks = W / pp, step = 1;  // (12 reports its groups after step 1)
  ASSERT_EQ(stage_ranks, dp * cp * tp) << run;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> tokens;  // per routing rank of a stage
  size_t most_runs = 0;
  for (int q = 0; q < stage_ranks; q++) {
    tokens.push_back(routed_token_runs(q / (tp * cp), q / tp % cp, q % tp, micro_B, T, cp, tp, sp));
    most_runs = std::max(most_runs, tokens.back().size());
  }
  const double rec = 1 + double(most_runs) * (2 + E);
  std::vector<int> records_of_stage(size_t(pp), 0);
  for (const std::string& record : read_records(jsonl, "routing")) {
    if (number_field(record, "step") != step) continue;
    const int stage = int(number_field(record, "stage"));
    ASSERT_TRUE(stage >= 0 && stage < pp) << record;
    records_of_stage[size_t(stage)]++;
    ASSERT_EQ(number_field(record, "ranks"), stage_ranks) << record;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> placed{size_t(stage_ranks)};
    for (const RoutedRun& r : routed_runs(record)) placed[size_t(r.rank)].push_back({r.start, r.length});
    for (int q = 0; q < stage_ranks; q++) EXPECT_EQ(placed[size_t(q)], tokens[size_t(q)]) << "routing rank " << q << " in " << record;
  }
  int records = 0;
  for (int n : records_of_stage) records += n;
  EXPECT_EQ(records, L * m) << "every layer routed once per micro-batch, by one stage, in " << jsonl;
  for (int w = 0; w < W; w++) {
    const int stage = w / stage_ranks;
    const double predicted = a2a_bytes_from_routing(jsonl, step, w % stage_ranks, ep, E, C, stage) +
                             records_of_stage[size_t(stage)] * (ep - 1) * rec * 4;
    EXPECT_EQ(number_field(groups, "rank" + std::to_string(w) + "_ep"), predicted) << "rank " << w << " in " << groups;
  }
}

// Each pipeline stage's activations (T/cp positions, this rank's heads and rows, the schedule's
// micro-batches in flight, a MoE model's routing replayed in the schedule's order) and point-to-point
// bytes equal their formulas; so does this rank's activation peak in the theory table.
// A run that wrote no records fails: 12 writes one pipeline_stage record per stage of its pipeline
// (one at --pp 1), so an empty list is a missing report, not a pass.
void expect_activations_match_theory(const std::string& jsonl) {
  const std::string theory = read_record(jsonl, "theory"), run = read_record(jsonl, "run");
  ASSERT_FALSE(theory.empty()) << "no theory record in " << jsonl;
  ASSERT_FALSE(run.empty()) << "no run record in " << jsonl;
  EXPECT_EQ(number_field(theory, "measured_activations_bytes"), number_field(theory, "theory_activations_bytes"))
      << theory;
  const std::vector<std::string> stages = read_records(jsonl, "pipeline_stage");
  EXPECT_EQ(double(stages.size()), number_field(run, "pp")) << "one pipeline_stage record per stage in " << jsonl;
  for (const std::string& stage : stages) {
    EXPECT_EQ(number_field(stage, "measured_activations_bytes"), number_field(stage, "theory_activations_bytes"))
        << stage;
    EXPECT_EQ(number_field(stage, "measured_p2p_bytes"), number_field(stage, "theory_p2p_bytes")) << stage;
  }
}

// The check fails a run that reports no stage (it once passed one, having nothing to compare).
TEST(FiveDChecks, ARunWithoutPipelineStageRecordsFailsTheActivationsCheck) {
  const std::string jsonl = temp_dir() + "/run.jsonl";
  std::ofstream(jsonl) << "{\"type\":\"run\",\"pp\":2}\n"
                       << "{\"type\":\"theory\",\"measured_activations_bytes\":1024,\"theory_activations_bytes\":1024}\n";
  EXPECT_NONFATAL_FAILURE(expect_activations_match_theory(jsonl), "one pipeline_stage record per stage");
}

// Rank 0's model state by category against the formula (theory.h, predict: a MoE model's experts,
// Ψe, average over their D replicas and a ZeRO shard holds Ψe/D of them, the rest's 1/N), up to the
// padding, and exactly as allocated: the forecast's model state, and under ZeRO-1 an optimizer state
// of 8 x ((padded - experts' ranges)/N + experts' ranges/D). Its DP x CP bytes: the dense gradients'.
void expect_moe_model_state_matches_theory(const std::string& jsonl) {
  const std::string t = read_record(jsonl, "theory"), run = read_record(jsonl, "run");
  ASSERT_FALSE(t.empty()) << "no theory record in " << jsonl;
  const double psi = number_field(t, "params"), padded = number_field(t, "padded_params");
  const double padding = padded - psi, experts_range = number_field(t, "padded_expert_params");
  for (auto [what, slack] : std::vector<std::pair<std::string, double>>{
           {"params", 4 * padding}, {"grads", 4 * padding}, {"optim", 8 * padding}}) {
    const double measured = number_field(t, "measured_" + what + "_bytes");
    const double theory = number_field(t, "theory_" + what + "_bytes");
    EXPECT_GE(measured, theory) << what << " in " << t;
    EXPECT_LE(measured - theory, slack) << what << " in " << t;
  }
  EXPECT_EQ(number_field(t, "measured_model_state_bytes"), number_field(run, "forecast_model_state_bytes")) << run;
  const double N = number_field(run, "dp") * number_field(run, "cp"), D = number_field(t, "expert_replicas");
  const bool sharded = t.find("\"strategy\":\"ZeRO-1\"") != std::string::npos;
  EXPECT_EQ(number_field(t, "measured_optim_bytes"),
            sharded ? 8 * ((padded - experts_range) / N + experts_range / D) : 8 * padded)
      << t;
  const double measured_comm = number_field(t, "measured_comm_bytes");
  const double theory_comm = number_field(t, "theory_comm_bytes");
  EXPECT_GE(measured_comm + 0.5, theory_comm) << t;
  EXPECT_LE(measured_comm - theory_comm, 2 * (N - 1) / N * 4 * padding + 0.5) << t;
}

// dualpipev runs its F&B pairs at once unless --fb-overlap off: then every stage reports them.
void expect_pairs_as_asked(const std::string& jsonl, const std::string& flags) {
  const bool overlapped = flags.find("dualpipev") != std::string::npos && flags.find("--fb-overlap off") == std::string::npos;
  const std::vector<std::string> pairs = read_records(jsonl, "pipeline_pairs");
  EXPECT_EQ(!pairs.empty(), overlapped) << flags;
  for (const std::string& stage : pairs) EXPECT_GT(number_field(stage, "pairs"), 0) << stage;
}

class DenseGrid : public testing::TestWithParam<FiveDCase> {};
class MoEGrid : public testing::TestWithParam<FiveDCase> {};

TEST_P(DenseGrid, TrainsLikeOneRankOf01) {
  const FiveDCase c = GetParam();
  const std::string jsonl = expect_trains_like_one_rank_of_01(
      "12_5d_parallel", c.ranks, c.flags + " --micro-batches " + std::to_string(c.micro_batches), c.preset, "", 10,
      kTolerance);
  // Memory by category, activations on T/cp positions of this rank's heads, TP bytes at T/cp, DP x CP bytes:
  // each its formula.
  expect_theory_matches(jsonl, /*param_bytes=*/4);
  expect_groups_match_theory(jsonl, c.ranks, {"tp", "cp", "dp_cp"});
  expect_activations_match_theory(jsonl);
  expect_pairs_as_asked(jsonl, c.flags);
}

struct Trained {
  std::string jsonl, checkpoint;
};

Trained train(const std::string& chapter, int ranks, const std::string& flags) {
  const std::string dir = temp_dir();
  Trained run{dir + "/run.jsonl", dir + "/final.bin"};
  const RunResult result = run_trainer(chapter, ranks, "--steps 3 " + flags + " --json " + run.jsonl +
                                                           " --save " + run.checkpoint);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return run;
}

// The one-rank reference of 11 with these flags, trained once per binary: most MoE grids share one
// (the preset, the micro-batches and the capacity are all they pass it), and each is read, never written.
const Trained& one_rank_of_11(const std::string& flags) {
  static std::map<std::string, Trained> trained;
  auto found = trained.find(flags);
  if (found == trained.end()) found = trained.emplace(flags, train("11_expert_parallel", 1, flags)).first;
  return found->second;
}

TEST_P(MoEGrid, TrainsLikeOneRankOf11WithTheSameTokensDropped) {
  const FiveDCase c = GetParam();
  std::string moe_flags;  // the capacity and the balance loss, for both runs
  for (const std::string flag : {"--capacity-factor", "--aux-loss-coef"}) {
    const size_t at = c.flags.find(flag);
    if (at == std::string::npos) continue;
    const size_t value_end = c.flags.find(' ', c.flags.find(' ', at) + 1);
    moe_flags += " " + c.flags.substr(at, value_end == std::string::npos ? std::string::npos : value_end - at);
  }
  const std::string preset = "--preset " + c.preset + " ";
  const Trained& one = one_rank_of_11(preset + "--grad-accum " + std::to_string(c.micro_batches) + moe_flags);
  const Trained grid =
      train("12_5d_parallel", c.ranks, preset + c.flags + " --micro-batches " + std::to_string(c.micro_batches));
  const LossCurve reference = read_losses(one.jsonl), got = read_losses(grid.jsonl);
  ASSERT_EQ(got.losses.size(), 3u);
  EXPECT_LE(max_relative_difference(got, reference), kTolerance);
  EXPECT_LE(relative_l2_difference(checkpoint_params(grid.checkpoint), checkpoint_params(one.checkpoint)), kTolerance);
  EXPECT_EQ(expert_counts(grid.jsonl, "routed"), expert_counts(one.jsonl, "routed"));
  const std::vector<double> dropped = expert_counts(grid.jsonl, "dropped");
  EXPECT_EQ(dropped, expert_counts(one.jsonl, "dropped"));
  expect_groups_match_theory(grid.jsonl, c.ranks, {"tp", "cp", "dp_cp", "expert_dp", "ep", "expert_params"});
  expect_ep_bytes_match_routing(grid.jsonl);
  expect_activations_match_theory(grid.jsonl);
  expect_moe_model_state_matches_theory(grid.jsonl);
  expect_pairs_as_asked(grid.jsonl, c.flags);
  if (moe_flags.find("--capacity-factor") != std::string::npos) {
    double total = 0;
    for (double d : dropped) total += d;
    EXPECT_GT(total, 0) << "the capacity factor should drop some assignments";
  }
}

std::vector<FiveDCase> dense_cases() {
  return {
      {4, "tall", "--tp 2 --cp 2", "tp2_cp2"},
      {4, "tall", "--tp 2 --cp 2 --sequence-parallel --recompute selective", "tp2_cp2_sp_selective"},
      {4, "tall", "--cp 2 --pp 2 --schedule interleaved", "cp2_pp2_interleaved", 4},
      {16, "tall", "--cp 2 --tp 2 --pp 2 --zero1 --recompute selective", "dp2_cp2_tp2_pp2_zero1_selective"},
      // Chapter 00's collectives under all of it: the ring's own sums, a pipeline's sends beside them.
      {8, "tall", "--cp 2 --tp 2 --pp 2 --collectives ring", "cp2_tp2_pp2_our_ring"},
      // dualpipev's pairs at once: a ring per lane, each on its own copy of the CP group.
      {4, "tall", "--cp 2 --pp 2 --schedule dualpipev", "cp2_pp2_dualpipev", 4},
  };
}

std::vector<FiveDCase> moe_cases() {
  return {
      {4, "moe-tiny", "--tp 2 --pp 2 --ep 2 --sequence-parallel --recompute selective", "moe_tp2_pp2_ep2_sp_selective"},
      {4, "moe-tiny", "--cp 2 --ep 2 --capacity-factor 1.0 --recompute selective", "moe_cp2_ep2_capacity_selective"},
      {8, "moe-tiny", "--cp 2 --tp 2 --pp 2 --ep 4 --sequence-parallel --capacity-factor 1.0 --aux-loss-coef 0.01",
       "moe_cp2_tp2_pp2_ep4_capacity"},
      // The V schedules (08): the embedding and the head on rank 0, experts in every stage.
      {4, "moe-small", "--tp 2 --pp 2 --ep 2 --sequence-parallel --schedule zb-v", "moe_tp2_pp2_ep2_zbv", 4},
      {4, "moe-small", "--tp 2 --pp 2 --ep 2 --sequence-parallel --schedule dualpipev --capacity-factor 1.0",
       "moe_tp2_pp2_ep2_dualpipev_capacity", 4},
      // ZeRO-1 over two groups: the dense state over DP x CP = 4, the experts' over their 2 replicas.
      {4, "moe-tiny", "--ep 2 --zero1", "moe_dp4_ep2_zero1"},
      // Groups of one rank each (N = D = 1), down a pipeline, with a capacity.
      {4, "moe-tiny", "--tp 2 --pp 2 --ep 2 --sequence-parallel --zero1 --capacity-factor 1.0",
       "moe_tp2_pp2_ep2_zero1_capacity"},
      // More expert replicas than dense ones (N = 2, D = 4: the experts' ranges pad to 4 x 16), and
      // ZeRO-2's rule: every micro-batch reduce-scattered, each bucket over its own group.
      {4, "moe-tiny", "--cp 2 --tp 2 --sequence-parallel --zero2", "moe_cp2_tp2_sp_zero2"},
      // dualpipev's pairs at once (its default) with the experts alone in the stages, and then under
      // chapter 00's collectives (each lane's TP group with a worker of its own); one run with its
      // pairs one pass after the other.
      {4, "moe-small", "--pp 2 --ep 2 --schedule dualpipev", "moe_pp2_ep2_dualpipev", 4},
      {4, "moe-small", "--tp 2 --pp 2 --ep 2 --sequence-parallel --schedule dualpipev --collectives ring",
       "moe_tp2_pp2_ep2_dualpipev_our_ring", 4},
      {4, "moe-small", "--pp 2 --ep 2 --schedule dualpipev --fb-overlap off", "moe_pp2_ep2_dualpipev_sequenced", 4},
  };
}

std::string name_of(const testing::TestParamInfo<FiveDCase>& info) { return info.param.name; }
INSTANTIATE_TEST_SUITE_P(Grids, DenseGrid, testing::ValuesIn(dense_cases()), name_of);
INSTANTIATE_TEST_SUITE_P(Grids, MoEGrid, testing::ValuesIn(moe_cases()), name_of);

// DualPipe's point (DeepSeek-V3): with experts in the stages, the all-to-all of one micro-batch hides
// under another's compute. On a slow emulated link (every all-to-all held for its modelled time),
// the trace of each rank shows an all-to-all of the forward lane's EP group (issued by a pair's F) in
// flight while the backward lane computes a B or W of another micro-batch; and the executor's own
// measure, per rank, the pairs' passes against the pairs' wall time, shows the time the two lanes
// ran side by side. Both are measured within the one run, so a busy machine slows both sides alike.
// (The step time itself is not compared with --fb-overlap off: on more ranks than cores it hardly
// changes, docs/five_d_parallel.md.)
TEST(FiveDOverlap, OneMicroBatchsAllToAllTravelsWhileAnothersBackwardComputes) {
  const std::string dir = temp_dir();
  const RunResult r = run_trainer("12_5d_parallel", 4,
                                  "--preset moe-small --pp 2 --ep 2 --schedule dualpipev --micro-batches 4 --steps 3 "
                                  "--link-gbps 0.2 --link-latency-us 500 --trace " + dir + "/t.json --json " + dir +
                                      "/run.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("F&B pairs at once"), std::string::npos) << r.output;
  struct Span {
    int pid, tid;
    double start, end;
    std::string name, line;
  };
  std::vector<Span> spans;
  const std::regex event(R"re(\{"ph":"X","pid":(\d+),"tid":(\d+),"ts":([0-9.]+),"dur":([0-9.]+),"name":"([^"]*)")re");
  std::ifstream in(dir + "/t.json");
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, event)) continue;
    spans.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stod(m[3]), std::stod(m[3]) + std::stod(m[4]), m[5], line});
  }
  // F, B and W spans are the executor's passes ("F3.c0"): the forward lane's on the compute track,
  // the backward lane's on a track of their own.
  auto pass = [](const Span& s, char op) { return s.name.size() > 1 && s.name[0] == op && std::isdigit(s.name[1]); };
  auto micro = [](const Span& s) { return std::stoi(s.name.substr(1, s.name.find('.') - 1)); };
  for (int pid = 0; pid < 4; pid++) {
    double overlap = 0;
    int backward_lane = 0, begun_inside = 0;
    for (const Span& b : spans) {
      if (b.pid != pid || !(pass(b, 'B') || pass(b, 'W'))) continue;
      backward_lane += b.tid == 4;  // Track::BackwardLane
      for (const Span& f : spans) {
        if (f.pid != pid || !pass(f, 'F') || micro(f) == micro(b) || f.end <= b.start || b.end <= f.start) continue;
        // An order of events, not a length: one lane's pass begins while the other's has begun and
        // not ended. In sequence, every pass would begin after the one before it ended.
        begun_inside += b.tid == 4 && ((f.start < b.start && b.start < f.end) || (b.start < f.start && f.start < b.end));
        // The forward lane's all-to-alls: the group itself (", ep"), not the backward lane's copy.
        for (const Span& a : spans)
          if (a.pid == pid && a.name.rfind("all_to_all", 0) == 0 && a.line.find(" B, ep\"") != std::string::npos &&
              a.start >= f.start && a.start <= f.end)
            overlap += std::max(0.0, std::min({a.end, b.end, f.end}) - std::max(a.start, b.start));
      }
    }
    EXPECT_GT(backward_lane, 0) << "rank " << pid << ": no pass on the backward lane's track";
    EXPECT_GT(overlap, 0) << "rank " << pid << ": no forward all-to-all in flight during another micro-batch's backward";
    EXPECT_GT(begun_inside, 0) << "rank " << pid << ": no pass of one lane began while the other lane's ran";
  }
  // Two lanes blocked on one link at once count their union, as its time in flight does: exposed
  // never exceeds the total, per group and for the step.
  for (const std::string& step : read_records(dir + "/run.jsonl", "step"))
    for (const std::string prefix : {"", "ep_", "pp_", "dp_"})
      EXPECT_LE(number_field(step, prefix + "exposed_comm_ms"), number_field(step, prefix + "comm_ms") + 0.01)
          << prefix << " in " << step;
  const std::vector<std::string> pairs = read_records(dir + "/run.jsonl", "pipeline_pairs");
  ASSERT_EQ(pairs.size(), 2u) << "one record per stage";
  for (const std::string& stage : pairs) {
    // The lanes ran at once (the trace's order of events above says so on every rank); the record
    // agrees: some of the pairs' time was hidden, so their wall time is under their passes' sum. How
    // much (about 40% on an idle machine) is the machine's load, not the schedule's, and is not asserted.
    EXPECT_GT(number_field(stage, "pairs"), 0) << stage;
    EXPECT_GT(number_field(stage, "hidden_ms"), 0) << stage;
    EXPECT_LT(number_field(stage, "pair_wall_ms"), number_field(stage, "pair_passes_ms")) << stage;
  }
}

// The checkpoint tests train 4 steps, save at 2 and resume for the last 2: two updates from the saved
// state (parameters, Adam's moments, the step) show a resume that lost or misplaced any of it.
constexpr int kCheckpointSteps = 4;

// Checkpoints stay layout-free: 12's resume in 01 and 07-10, and on another grid of 12; 01's resume in 12.
TEST(FiveDCheckpoints, ResumeAcrossGridsAndChapters) {
  expect_checkpoints_cross_grids({"12_5d_parallel", 4, "--tp 2 --cp 2 --sequence-parallel"},
                                 {{"01_vanilla_dp", 1, ""},
                                  {"07_tensor_parallel", 2, "--tp 2"},
                                  {"08_pipeline", 2, "--pp 2 --schedule zb-v"},
                                  {"09_3d_parallel", 4, "--tp 2 --pp 2"},
                                  {"10_context_parallel", 2, "--cp 2"},
                                  {"12_5d_parallel", 4, "--cp 2 --pp 2"}},
                                 {"12_5d_parallel", 4, "--cp 2 --tp 2"}, "--preset tall", kCheckpointSteps, kTolerance);
}

// And theirs resume in 12: 07-10's on a grid of all their dimensions at once.
TEST(FiveDCheckpoints, ResumesTheOtherChapters) {
  expect_resumes_checkpoints_of({"12_5d_parallel", 8, "--cp 2 --tp 2 --pp 2 --schedule dualpipev --micro-batches 4"},
                                {{"07_tensor_parallel", 2, "--tp 2 --sequence-parallel"},
                                 {"08_pipeline", 2, "--pp 2 --schedule interleaved"},
                                 {"09_3d_parallel", 4, "--tp 2 --pp 2 --zero1"},
                                 {"10_context_parallel", 2, "--cp 2 --cp-split contiguous"}},
                                "--preset tall", kCheckpointSteps, kTolerance);
}

// A mixture of experts' checkpoints move between 11 and 12 both ways, whatever the grid.
TEST(FiveDCheckpoints, MixtureOfExpertsBetween11And12) {
  // (The balance loss spans a micro-batch: both sides split the batch into the same two.)
  expect_resumes_checkpoints_of({"12_5d_parallel", 4, "--tp 2 --pp 2 --ep 2 --sequence-parallel --micro-batches 2"},
                                {{"11_expert_parallel", 2, "--ep 2 --grad-accum 2"}}, "--preset moe-tiny", kCheckpointSteps,
                                kTolerance);
  expect_resumes_checkpoints_of({"11_expert_parallel", 2, "--ep 2 --grad-accum 2"},
                                {{"12_5d_parallel", 4, "--cp 2 --pp 2 --ep 2 --micro-batches 2"}}, "--preset moe-tiny",
                                kCheckpointSteps, kTolerance);
}

// A MoE checkpoint resumes in 12 with its own micro-batches, whatever 12's default on the grid (2 x
// --pp): its capacity and balance loss are per micro-batch (moe.h). 11's, saved with one, continues
// 11's losses on 2 ranks and down a pipeline; another count given is refused, naming --micro-batches,
// on every rank before the work. (The forecast replayed the schedule's micro-batches over the
// checkpoint's count, and read past it: a segmentation fault.)
TEST(FiveDCheckpoints, MoEResumesWithTheCheckpointsMicroBatches) {
  const std::string dir = temp_dir(), half = dir + "/m11_2.bin";
  const RunResult saved = run_trainer("11_expert_parallel", 1, "--preset moe-tiny --steps 4 --save-every 2 --save " +
                                                                   dir + "/m11_{step}.bin --json " + dir + "/full.jsonl");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  LossCurve reference = read_losses(dir + "/full.jsonl");
  ASSERT_EQ(reference.losses.size(), 4u);
  reference.steps.erase(reference.steps.begin(), reference.steps.begin() + 2);
  reference.losses.erase(reference.losses.begin(), reference.losses.begin() + 2);
  for (const auto& [ranks, flags] : std::vector<std::pair<int, std::string>>{
           {2, ""}, {4, "--tp 2 --pp 2 --sequence-parallel --ep 2"}}) {
    const RunResult resumed = run_trainer("12_5d_parallel", ranks, "--preset moe-tiny " + flags + " --resume " + half +
                                                                       " --json " + dir + "/resumed.jsonl");
    ASSERT_EQ(resumed.exit_code, 0) << flags << "\n" << resumed.output;
    EXPECT_NE(resumed.output.find("in 1 micro-batch of"), std::string::npos) << resumed.output;
    EXPECT_LE(max_relative_difference(read_losses(dir + "/resumed.jsonl"), reference), kTolerance) << flags;
  }
  const RunResult refused = run_trainer("12_5d_parallel", 2, "--preset moe-tiny --micro-batches 2 --resume " + half, 60);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.exit_code, 124) << "timed out: " << refused.output;
  EXPECT_NE(refused.output.find("--micro-batches 2 differs from the 1 that checkpoint"), std::string::npos)
      << refused.output;
  EXPECT_EQ(refused.output.find("internal error"), std::string::npos) << refused.output;
  EXPECT_EQ(refused.output.find("step 2"), std::string::npos) << "refused after the work began: " << refused.output;
}

// A MoE checkpoint is layout-free under ZeRO-1 too: saved from shards over two groups (DP x CP = 4,
// experts over 2), it resumes without ZeRO on another grid and on ZeRO-1 grids of other groups (N 2
// and D 4; N = D = 1 down a pipeline); one saved without ZeRO resumes into ZeRO-1. Each continues the
// same losses.
TEST(FiveDCheckpoints, MoEUnderZeRO1ResumesOnOtherGrids) {
  const std::string dir = temp_dir();
  const std::string common = "--preset moe-tiny --steps 4 --micro-batches 2 --capacity-factor 1.0";
  auto run_12 = [&](int ranks, const std::string& flags, const std::string& out) {
    const RunResult r = run_trainer("12_5d_parallel", ranks, common + " " + flags + " --json " + dir + "/" + out);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    return read_losses(dir + "/" + out);
  };
  LossCurve reference = run_12(4, "--ep 2 --zero1 --save " + dir + "/zero1_{step}.bin --save-every 2", "full.jsonl");
  ASSERT_EQ(reference.losses.size(), 4u);
  reference.steps.erase(reference.steps.begin(), reference.steps.begin() + 2);
  reference.losses.erase(reference.losses.begin(), reference.losses.begin() + 2);
  for (const auto& [ranks, flags] : std::vector<std::pair<int, std::string>>{
           {4, "--tp 2 --pp 2 --ep 2 --sequence-parallel"},
           {4, "--tp 2 --sequence-parallel --zero1"},
           {4, "--tp 2 --pp 2 --ep 2 --sequence-parallel --zero1"}}) {
    const LossCurve resumed = run_12(ranks, flags + " --resume " + dir + "/zero1_2.bin", "resumed.jsonl");
    EXPECT_LE(max_relative_difference(resumed, reference), kTolerance) << flags;
  }
  // Saved without ZeRO, resumed into ZeRO-1 over two groups.
  run_12(4, "--tp 2 --pp 2 --ep 2 --sequence-parallel --save " + dir + "/plain_{step}.bin --save-every 2",
         "plain.jsonl");
  const LossCurve resumed = run_12(4, "--ep 2 --zero1 --resume " + dir + "/plain_2.bin", "into_zero1.jsonl");
  EXPECT_LE(max_relative_difference(resumed, reference), kTolerance);
}

// The forecast holds every rank's peak. With experts down a pipeline that peak comes as the model is
// initialised: the whole model's fp32 copy (Ψg elements) and this rank's part of it cut from it (its
// own Ψ) at once, far more than a stage's Ψ (docs/theory.md, section 4; the forecast took t x Ψ, and
// fell 5 to 10 MB short). Per rank, on 1f1b and dualpipev: forecast >= the run's peak; the summary
// names the rank with the largest and its forecast; rank 0's copies are 4 (Ψg + Ψ) bytes.
TEST(FiveDMemory, TheForecastHoldsEveryRanksPeakWithExpertsDownAPipeline) {
  GPT2Config cfg;
  ASSERT_TRUE(find_preset("moe-small", &cfg));
  const double whole = double(build_gpt2_layout(cfg, 1).padded_size);
  for (const std::string flags : {"--pp 2 --ep 2", "--pp 2 --ep 2 --schedule dualpipev --micro-batches 4"}) {
    SCOPED_TRACE(flags);
    const std::string json = temp_dir() + "/run.jsonl";
    const RunResult r = run_trainer("12_5d_parallel", 4, "--preset moe-small --steps 1 " + flags + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string summary = read_record(json, "summary"), run = read_record(json, "run");
    for (int q = 0; q < 4; q++) {
      const std::string rank = "rank" + std::to_string(q);
      EXPECT_GE(number_field(summary, rank + "_forecast_peak_bytes"), number_field(summary, rank + "_peak_mem_bytes"))
          << rank << ": " << summary;
    }
    const std::string largest = std::to_string(int(number_field(summary, "peak_mem_rank")));
    EXPECT_EQ(number_field(summary, "peak_mem_bytes"), number_field(summary, "rank" + largest + "_peak_mem_bytes"));
    EXPECT_EQ(number_field(summary, "forecast_peak_bytes"),
              number_field(summary, "rank" + largest + "_forecast_peak_bytes"));
    EXPECT_NE(r.output.find("(rank " + largest + ", the largest of 4; its forecast "), std::string::npos) << r.output;
    EXPECT_EQ(number_field(run, "forecast_checkpoint_bytes"), 4 * (whole + number_field(run, "padded_params"))) << run;
  }
}

// The plan of ZeRO-1 for a MoE model's buckets (GradientSync::zero1_plan), every rank's built on one:
// each dense bucket is group 0's, split over the N ranks of DP x CP, each expert bucket group 1's,
// over the D replicas of its experts; every element of a range is owned by exactly one rank of its
// group, in 64-byte-aligned pieces; a rank's shard is the layout's shard_size (what the memory
// forecast counts), and its groups' parts add up to it.
TEST(FiveDZeRO1Plan, EveryElementIsOwnedOnceByARankOfItsGroup) {
  GPT2Config cfg;
  ASSERT_TRUE(find_preset("moe-tiny", &cfg));
  struct Case {
    int N, D;
    TensorParallelism tp;
    int ep;
    std::vector<ModelPart> parts;
  };
  const std::vector<ModelPart> last_stage = {ModelPart{2, -1}};  // block 1, the final layernorm, the tied wte
  const Case cases[] = {
      {4, 2, {}, 2, {}},                 // 4 ranks, ep 2
      {2, 4, {2, 0, true}, 1, {}},       // DP x CP 2, TP 2, ep 1
      {1, 1, {2, 1, true}, 2, last_stage},  // TP 2 x PP 2, ep 2: groups of one
      {4, 6, {}, 2, {}},                 // replicas that are no multiple of N: lcm(4, 6) x 16
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("N " + std::to_string(c.N) + " D " + std::to_string(c.D) + " tp " + std::to_string(c.tp.size) +
                 " ep " + std::to_string(c.ep));
    const ParamLayout layout = build_gpt2_layout(cfg, c.N, c.tp, c.parts, ExpertParallelism{c.ep, 0, c.D});
    const GradientBuckets buckets(layout, default_bucket_bytes(layout, 4), 4, BucketCut::AtLayers,
                                  /*experts_apart=*/true);
    std::vector<int> owners(size_t(layout.padded_size), 0);  // per element, over every (dense, expert) rank pair
    for (int dense = 0; dense < c.N; dense++)
      for (int expert = 0; expert < c.D; expert++) {
        const ShardPlan plan = GradientSync::zero1_plan(buckets, ShardGroup{c.N, dense}, ShardGroup{c.D, expert});
        ASSERT_EQ(plan.flat_size(), layout.padded_size);
        ASSERT_EQ(plan.size(), layout.shard_size());
        ASSERT_EQ(plan.group_size(0) + plan.group_size(1), plan.size());
        for (int i = 0; i < plan.count(); i++) {
          const FlatRange range = plan.range(i);
          const int b = buckets.count() - 1 - i;  // the ranges are the buckets in flat order
          ASSERT_EQ(range.begin, buckets.begin(b));
          ASSERT_EQ(plan.group_of(i), buckets.holds_experts(b) ? 1 : 0);
          for (const ParamInfo& p : layout.params) {  // a range holds one kind of tensor
            if (p.held() && p.offset < range.end && p.offset + p.size > range.begin) {
              EXPECT_EQ(p.expert >= 0, plan.group_of(i) == 1) << p.name;
            }
          }
          const FlatRange mine = plan.piece(i);
          EXPECT_EQ(mine.begin % 16, 0) << "piece " << i;
          EXPECT_EQ(mine.size(), range.size() / (plan.group_of(i) == 1 ? c.D : c.N));
          // Count each element once per rank of the other group: the sum is then that group's size.
          for (int64_t e = mine.begin; e < mine.end; e++) owners[size_t(e)]++;
        }
      }
    // An element of a dense range is owned by one rank of DP x CP, for each of the D expert ranks the
    // loop paired it with; an expert element by one replica for each of the N dense ranks.
    const ShardPlan any = GradientSync::zero1_plan(buckets, ShardGroup{c.N, 0}, ShardGroup{c.D, 0});
    for (int i = 0; i < any.count(); i++)
      for (int64_t e = any.range(i).begin; e < any.range(i).end; e++)
        ASSERT_EQ(owners[size_t(e)], any.group_of(i) == 1 ? c.N : c.D) << "element " << e << " of range " << i;
  }
}

// A grid that does not fit is refused on every rank at once, naming the flag and what would fit.
struct Refusal {
  int ranks;
  std::string args, expected;
};

TEST(FiveDRefusals, EachNamesTheFlagWithinSeconds) {
  const std::vector<Refusal> refusals = {
      {4, "--preset tall --tp 2 --cp 3", "--cp"},
      {4, "--preset moe-tiny --tp 2 --ep 2", "--sequence-parallel"},
      {4, "--preset moe-tiny --ep 3", "--ep"},
      {4, "--preset tall --ep 2", "MoE --preset"},
      {4, "--preset tall --cp 2 --cp-split diagonal", "--cp-split"},
      // Accepted, they would be ignored: each is refused where it does nothing.
      {4, "--preset tall --tp 2 --capacity-factor 1.0", "--capacity-factor sets a mixture of experts' routing"},
      {4, "--preset tall --tp 2 --aux-loss-coef 0.1", "--aux-loss-coef sets a mixture of experts' routing"},
      {2, "--preset tall --cp-split contiguous", "at --cp 1 one rank holds them all"},
  };
  // --steps 100000: a refusal that came after the work would run into the bound (60 s, which only a
  // failing run waits for: an idle machine refuses in about a second), so no duration is asserted.
  for (const Refusal& r : refusals) {
    const RunResult result = run_trainer("12_5d_parallel", r.ranks, "--steps 100000 " + r.args, 60);
    EXPECT_NE(result.exit_code, 0) << r.args << "\n" << result.output;
    EXPECT_NE(result.exit_code, 124) << r.args << ": timed out, so the check came after the work\n" << result.output;
    EXPECT_NE(result.output.find(r.expected), std::string::npos) << r.args << "\n" << result.output;
  }
}

}  // namespace
