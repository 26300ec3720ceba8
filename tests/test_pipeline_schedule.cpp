// test_pipeline_schedule.cpp: chapter 08's schedules as data, without a model or MPI. Every schedule (zb-v in its V)
// on 1, 2 and 4 stages with several micro-batch counts: each micro-batch gets one F and one B (and
// one W under zb-h1) per chunk, in order; sends meet receives; the simulation completes and its
// bubble is the theory's; the activation slots are the theory's. Then hand-checked orders and
// timings, and broken lists that check_pipeline must catch. The same lists built for NCCL's
// matching by call order: every schedule sound (a V's from one global order of its messages, for
// every p and m swept), and the lists that would hang on it, pair the wrong messages or post a
// receive with no buffer free caught.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "schedule/pipeline_schedule.h"
#include "schedule/pipeline_simulate.h"

namespace {

struct Case {
  Schedule schedule;
  PipelineShape shape;
};

std::string name_of(const Case& c) {
  return std::string(schedule_name(c.schedule)) + " p=" + std::to_string(c.shape.stages) +
         " m=" + std::to_string(c.shape.micro_batches) + " v=" + std::to_string(c.shape.chunks);
}

// Every schedule at p = 1, 2, 4; m = p, 2p, 4p, and 1..3 where the schedule allows; interleaved
// with v = 2 and 3 (it needs m a multiple of p); zb-v with its V's 2 chunks, and m = 2p-1 too, the
// least its order is written for.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int p : {1, 2, 4}) {
    std::set<int> counts = {1, 2, 3, p, 2 * p, 4 * p};
    for (Schedule s : {Schedule::AFAB, Schedule::OneFOneB, Schedule::ZBH1})
      for (int m : counts) cases.push_back({s, {p, m, 1}});
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) cases.push_back({Schedule::Interleaved, {p, m, v}});
    counts.insert(2 * p - 1);
    for (int m : counts) cases.push_back({Schedule::ZBV, {p, m, 2, Placement::V}});
    for (int m : {2 * p, 2 * p + 1, 4 * p}) cases.push_back({Schedule::DualPipeV, {p, m, 2, Placement::V}});
  }
  return cases;
}

std::vector<std::vector<Action>> build_all(const Case& c, Matching matching = Matching::ByTag) {
  std::vector<std::vector<Action>> per_rank;
  for (int rank = 0; rank < c.shape.stages; rank++)
    per_rank.push_back(build_schedule(c.schedule, c.shape, rank, matching));
  return per_rank;
}

// F, B and W only: what a diagram of the schedule shows.
std::string passes(const std::vector<Action>& actions) {
  std::vector<Action> compute;
  for (const Action& a : actions)
    if (a.op == Op::F || a.op == Op::B || a.op == Op::W) compute.push_back(a);
  return describe(compute);
}

int index_of(const std::vector<Action>& actions, const Action& wanted) {
  auto it = std::find(actions.begin(), actions.end(), wanted);
  return it == actions.end() ? -1 : int(it - actions.begin());
}

// The calls between two ranks in list order, each named as the receiving rank names it: `from`'s
// sends to `to`, and `to`'s receives from `from`. NCCL pairs the k-th of one with the k-th of the other.
std::pair<std::vector<Action>, std::vector<Action>> calls_between(const PipelineShape& shape,
                                                                  const std::vector<std::vector<Action>>& per_rank,
                                                                  int from, int to) {
  std::vector<Action> sent, received;
  for (const Action& a : per_rank[from]) {
    const int s = virtual_stage(shape, from, a.chunk);
    const int next = a.op == Op::SendActivation ? s + 1 : s - 1;
    if ((a.op == Op::SendActivation || a.op == Op::SendGradient) && rank_of_stage(shape, next) == to)
      sent.push_back({a.op == Op::SendActivation ? Op::RecvActivation : Op::RecvGradient, a.micro,
                      chunk_of_stage(shape, next)});
  }
  for (const Action& a : per_rank[to]) {
    const int s = virtual_stage(shape, to, a.chunk);
    if ((a.op == Op::RecvActivation && rank_of_stage(shape, s - 1) == from) ||
        (a.op == Op::RecvGradient && rank_of_stage(shape, s + 1) == from))
      received.push_back(a);
  }
  return {sent, received};
}

TEST(PipelineSchedule, NamesRoundTrip) {
  for (Schedule s : {Schedule::AFAB, Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZBH1, Schedule::ZBV,
                     Schedule::DualPipeV}) {
    Schedule parsed = Schedule::AFAB;
    EXPECT_TRUE(parse_schedule(schedule_name(s), &parsed)) << schedule_name(s);
    EXPECT_EQ(parsed, s);
  }
  Schedule unchanged = Schedule::ZBH1;
  EXPECT_FALSE(parse_schedule("gpipe", &unchanged));
  EXPECT_FALSE(parse_schedule("", &unchanged));
  EXPECT_EQ(unchanged, Schedule::ZBH1);
  EXPECT_EQ(schedule_names(), "afab, 1f1b, interleaved, zb-h1, zb-v, dualpipev");
}

TEST(PipelineSchedule, ShapeErrorsSayWhatWouldBeRight) {
  EXPECT_EQ(schedule_shape_error(Schedule::OneFOneB, {4, 3, 1}), "");
  EXPECT_EQ(schedule_shape_error(Schedule::Interleaved, {4, 8, 2}), "");
  std::string not_multiple = schedule_shape_error(Schedule::Interleaved, {4, 6, 2});
  EXPECT_NE(not_multiple.find("use 4 or 8"), std::string::npos) << not_multiple;
  EXPECT_NE(schedule_shape_error(Schedule::Interleaved, {4, 8, 1}), "");
  EXPECT_NE(schedule_shape_error(Schedule::AFAB, {4, 8, 2}), "");
  EXPECT_NE(schedule_shape_error(Schedule::ZBH1, {4, 0, 1}), "");
}

TEST(PipelineSchedule, DescribeNamesEachAction) {
  EXPECT_EQ(describe(Action{Op::F, 3, 1}), "F3.c1");
  EXPECT_EQ(describe(Action{Op::B, 3, 1}), "B3.c1");
  EXPECT_EQ(describe(Action{Op::W, 3, 1}), "W3.c1");
  EXPECT_EQ(describe(Action{Op::SendActivation, 3, 1}), "sendA3.c1");
  EXPECT_EQ(describe(Action{Op::RecvActivation, 3, 1}), "recvA3.c1");
  EXPECT_EQ(describe(Action{Op::SendGradient, 3, 1}), "sendG3.c1");
  EXPECT_EQ(describe(Action{Op::RecvGradient, 3, 0}), "recvG3.c0");
  EXPECT_EQ(describe(std::vector<Action>{{Op::F, 0, 0}, {Op::B, 0, 0}}), "F0.c0 B0.c0");
}

// The orders, written by hand from the papers' figures, in the order they were drawn.
TEST(PipelineSchedule, OrdersReadLikeTheirDiagrams) {
  // 1f1b (Narayanan et al. 2021, figure 4 top): rank 1 of 4 warms up with 2 forwards.
  EXPECT_EQ(passes(build_schedule(Schedule::OneFOneB, {4, 6, 1}, 1)),
            "F0.c0 F1.c0 F2.c0 B0.c0 F3.c0 B1.c0 F4.c0 B2.c0 F5.c0 B3.c0 B4.c0 B5.c0");
  // afab: all forwards, then the backwards from micro-batch 0.
  EXPECT_EQ(passes(build_schedule(Schedule::AFAB, {2, 3, 1}, 0)), "F0.c0 F1.c0 F2.c0 B0.c0 B1.c0 B2.c0");
  // zb-h1 (Qi et al. 2024, figure 3): the last rank holds back 3 W's and runs them at the end; the
  // first rank runs each W right after its B.
  EXPECT_EQ(passes(build_schedule(Schedule::ZBH1, {4, 6, 1}, 3)),
            "F0.c0 B0.c0 F1.c0 B1.c0 F2.c0 B2.c0 F3.c0 B3.c0 W0.c0 F4.c0 B4.c0 W1.c0 F5.c0 B5.c0 W2.c0 "
            "W3.c0 W4.c0 W5.c0");
  EXPECT_EQ(passes(build_schedule(Schedule::ZBH1, {4, 6, 1}, 0)),
            "F0.c0 F1.c0 F2.c0 F3.c0 B0.c0 W0.c0 F4.c0 B1.c0 W1.c0 F5.c0 B2.c0 W2.c0 B3.c0 W3.c0 B4.c0 W4.c0 "
            "B5.c0 W5.c0");
  // interleaved (Megatron-LM's order), p = 2, v = 2, m = 4, rank 0: micro-batches two at a time
  // through chunk 0 then chunk 1; backwards from chunk 1; warm-up 2(p-1-r) + (v-1)p = 4.
  EXPECT_EQ(passes(build_schedule(Schedule::Interleaved, {2, 4, 2}, 0)),
            "F0.c0 F1.c0 F0.c1 F1.c1 F2.c0 B0.c1 F3.c0 B1.c1 F2.c1 B0.c0 F3.c1 B1.c0 B2.c1 B3.c1 B2.c0 B3.c0");
}

TEST(PipelineSchedule, ReceivesComeFirstAndSendsRightAfterTheirPass) {
  std::vector<Action> list = build_schedule(Schedule::OneFOneB, {3, 4, 1}, 1);
  // Rank 1 of 3 receives 4 activations and 4 gradients, all posted before its first pass.
  for (int i = 0; i < 8; i++)
    EXPECT_TRUE(list[i].op == Op::RecvActivation || list[i].op == Op::RecvGradient) << describe(list);
  EXPECT_EQ(describe(std::vector<Action>(list.begin(), list.begin() + 3)), "recvA0.c0 recvA1.c0 recvG0.c0");
  for (int micro = 0; micro < 4; micro++) {
    EXPECT_EQ(index_of(list, {Op::SendActivation, micro, 0}), index_of(list, {Op::F, micro, 0}) + 1);
    EXPECT_EQ(index_of(list, {Op::SendGradient, micro, 0}), index_of(list, {Op::B, micro, 0}) + 1);
  }
  // The first rank receives no activation and the last no gradient.
  for (const Action& a : build_schedule(Schedule::OneFOneB, {3, 4, 1}, 0)) EXPECT_NE(a.op, Op::RecvActivation);
  for (const Action& a : build_schedule(Schedule::OneFOneB, {3, 4, 1}, 2)) EXPECT_NE(a.op, Op::RecvGradient);
}

TEST(PipelineSchedule, EveryMicroBatchGetsOneOfEachPassInOrder) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name_of(c));
    std::vector<std::vector<Action>> per_rank = build_all(c);
    const bool split = splits_backward(c.schedule);
    for (int rank = 0; rank < c.shape.stages; rank++) {
      const std::vector<Action>& list = per_rank[rank];
      std::map<std::tuple<int, int, int>, int> count;  // (op, micro, chunk) -> times
      for (const Action& a : list) count[{int(a.op), a.micro, a.chunk}]++;
      for (int chunk = 0; chunk < c.shape.chunks; chunk++) {
        for (int micro = 0; micro < c.shape.micro_batches; micro++) {
          EXPECT_EQ((count[{int(Op::F), micro, chunk}]), 1) << "rank " << rank << ": " << describe(list);
          EXPECT_EQ((count[{int(Op::B), micro, chunk}]), 1) << "rank " << rank << ": " << describe(list);
          EXPECT_EQ((count[{int(Op::W), micro, chunk}]), split ? 1 : 0) << "rank " << rank;
          int f = index_of(list, {Op::F, micro, chunk}), b = index_of(list, {Op::B, micro, chunk});
          EXPECT_LT(f, b) << "rank " << rank << ": " << describe(list);
          if (split) {
            EXPECT_LT(b, index_of(list, {Op::W, micro, chunk})) << "rank " << rank;
          }
        }
      }
    }
  }
}

// Each send is received once by the neighbouring virtual stage, and each receive is sent.
TEST(PipelineSchedule, SendsMatchReceivesBetweenNeighbours) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name_of(c));
    std::vector<std::vector<Action>> per_rank = build_all(c);
    // (is gradient, from virtual stage, to virtual stage, micro)
    std::multiset<std::tuple<bool, int, int, int>> sent, received;
    for (int rank = 0; rank < c.shape.stages; rank++) {
      for (const Action& a : per_rank[rank]) {
        int s = virtual_stage(c.shape, rank, a.chunk);
        if (a.op == Op::SendActivation) sent.insert({false, s, s + 1, a.micro});
        if (a.op == Op::RecvActivation) received.insert({false, s - 1, s, a.micro});
        if (a.op == Op::SendGradient) sent.insert({true, s, s - 1, a.micro});
        if (a.op == Op::RecvGradient) received.insert({true, s + 1, s, a.micro});
      }
    }
    EXPECT_EQ(sent, received);
    int boundaries = c.shape.virtual_stages() - 1;
    EXPECT_EQ(int(sent.size()), 2 * boundaries * c.shape.micro_batches);  // one each way per boundary
    for (const auto& message : sent) {
      EXPECT_GE(std::min(std::get<1>(message), std::get<2>(message)), 0);
      EXPECT_LT(std::max(std::get<1>(message), std::get<2>(message)), c.shape.virtual_stages());
    }
  }
}

TEST(PipelineSchedule, CheckPipelineAcceptsEveryBuiltSchedule) {
  for (const Case& c : all_cases()) {
    EXPECT_EQ(check_pipeline(c.schedule, c.shape, build_all(c)), "") << name_of(c);
    EXPECT_EQ(check_pipeline(c.schedule, c.shape, build_all(c, Matching::ByCallOrder), Matching::ByCallOrder), "")
        << name_of(c) << ", call order";
  }
}

// ---------------------------------------------------------------------------------------------
// Matching by call order (NCCL).

TEST(CallOrder, NamesRoundTrip) {
  for (Matching m : {Matching::ByTag, Matching::ByCallOrder}) {
    Matching parsed = Matching::ByTag;
    EXPECT_TRUE(parse_matching(matching_name(m), &parsed));
    EXPECT_EQ(parsed, m);
  }
  Matching unchanged = Matching::ByCallOrder;
  EXPECT_FALSE(parse_matching("nccl", &unchanged));
  EXPECT_EQ(unchanged, Matching::ByCallOrder);
}

// Each receive right before its pass, after the sends of the pass before: one group between passes.
// Written by hand: 1f1b on 2 ranks, 3 micro-batches.
TEST(CallOrder, ReceivesComeRightBeforeTheirPassInOneGroupWithTheSendsBefore) {
  const PipelineShape shape{2, 3, 1};
  const std::vector<Action> first = build_schedule(Schedule::OneFOneB, shape, 0, Matching::ByCallOrder);
  const std::vector<Action> last = build_schedule(Schedule::OneFOneB, shape, 1, Matching::ByCallOrder);
  EXPECT_EQ(describe(first),
            "F0.c0 sendA0.c0 F1.c0 sendA1.c0 recvG0.c0 B0.c0 F2.c0 sendA2.c0 recvG1.c0 B1.c0 recvG2.c0 B2.c0");
  EXPECT_EQ(describe(last),
            "recvA0.c0 F0.c0 B0.c0 sendG0.c0 recvA1.c0 F1.c0 B1.c0 sendG1.c0 recvA2.c0 F2.c0 B2.c0 sendG2.c0");
  // Rank 0's send of micro-batch 1 and its receive of micro-batch 0's gradient go out together.
  const std::vector<std::pair<int, int>> groups = message_groups(first);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[1], std::make_pair(3, 4));
  EXPECT_EQ(message_groups(std::vector<Action>{{Op::F, 0, 0}}).size(), 0u);
}

// The lists MPI runs post every receive first. On one NCCL stream those receives would hold back the
// rank's own sends, which its neighbour waits for: every schedule hangs. In a V most do not get
// that far: up front, in the order the passes consume them, a rank's receives from a neighbour
// already disagree with the order it sends them in (two kinds each way, interleaved differently).
TEST(CallOrder, ReceivesPostedUpFrontWouldHang) {
  for (const Case& c : all_cases()) {
    if (c.shape.stages < 2) continue;
    SCOPED_TRACE(name_of(c));
    const std::string problem = check_pipeline(c.schedule, c.shape, build_all(c), Matching::ByCallOrder);
    const bool pairs_wrong = c.shape.placement == Placement::V && problem.find("in call order") == 0;
    EXPECT_TRUE(problem.find("deadlock") == 0 || pairs_wrong) << problem;
  }
}

// Interleaved with a group per pass, as 1f1b has: every rank's gradient send waits for a neighbour
// whose group waits in turn, round the ring. Megatron-LM's four messages of a steady pair in one
// group (what build_schedule does) are what make it sound.
TEST(CallOrder, InterleavedNeedsItsSteadyPairsMessagesInOneGroup) {
  const PipelineShape shape{4, 8, 2};
  std::vector<std::vector<Action>> per_pass;
  for (int rank = 0; rank < shape.stages; rank++) {
    // The same passes, each with its receive right before it and its send right after it.
    std::vector<Action> list;
    for (const Action& a : build_schedule(Schedule::Interleaved, shape, rank, Matching::ByCallOrder)) {
      if (a.op != Op::F && a.op != Op::B) continue;
      const int s = virtual_stage(shape, rank, a.chunk);
      const bool first = s == 0, last = s == shape.virtual_stages() - 1;
      if (a.op == Op::F && !first) list.push_back({Op::RecvActivation, a.micro, a.chunk});
      if (a.op == Op::B && !last) list.push_back({Op::RecvGradient, a.micro, a.chunk});
      list.push_back(a);
      if (a.op == Op::F && !last) list.push_back({Op::SendActivation, a.micro, a.chunk});
      if (a.op == Op::B && !first) list.push_back({Op::SendGradient, a.micro, a.chunk});
    }
    per_pass.push_back(list);
  }
  EXPECT_EQ(check_pipeline(Schedule::Interleaved, shape, per_pass), "") << "sound under tags";
  const std::string problem = check_pipeline(Schedule::Interleaved, shape, per_pass, Matching::ByCallOrder);
  EXPECT_NE(problem.find("deadlock: rank 0's group [sendG0.c1] waits for rank 3's group"), std::string::npos)
      << problem;
}

// NCCL pairs the k-th send with the k-th receive whatever they carry: two sends swapped deliver
// each micro-batch's activations into the other's buffer, silently. check_pipeline names it.
TEST(CallOrder, MessagesOutOfOrderAreCaught) {
  const Case c{Schedule::AFAB, {2, 2, 1}};
  std::vector<std::vector<Action>> swapped = build_all(c, Matching::ByCallOrder);
  std::swap(swapped[0][index_of(swapped[0], {Op::SendActivation, 0, 0})],
            swapped[0][index_of(swapped[0], {Op::SendActivation, 1, 0})]);
  std::swap(swapped[0][index_of(swapped[0], {Op::F, 0, 0})], swapped[0][index_of(swapped[0], {Op::F, 1, 0})]);
  EXPECT_EQ(check_pipeline(c.schedule, c.shape, swapped), "") << "tags tell the two apart";
  EXPECT_EQ(check_pipeline(c.schedule, c.shape, swapped, Matching::ByCallOrder),
            "in call order, rank 0's send number 0 to rank 1 is for recvA1.c0, but rank 1's receive number 0 from it "
            "is recvA0.c0");
}

// With messages that take no time, grouping costs nothing: the same bubble as by tag, the theory's.
// With time, a group holds its stream until its last message has gone, and the step grows. (A V's
// lists follow its timeline at F = B = W: VListsFollowTheirTimeline.)
TEST(CallOrder, SameBubbleAsByTagWhenMessagesAreFree) {
  for (const Case& c : all_cases()) {
    if (c.shape.placement == Placement::V && c.shape.stages > 1) continue;
    SCOPED_TRACE(name_of(c));
    const ActionCosts costs = uniform_costs(c.shape, 1, 2, splits_backward(c.schedule) ? 1 : 0);
    const Simulation by_tag = simulate(c.schedule, c.shape, costs);
    const Simulation by_order = simulate(c.schedule, c.shape, costs, Matching::ByCallOrder);
    ASSERT_EQ(by_order.deadlock, "");
    EXPECT_NEAR(by_order.makespan, by_tag.makespan, 1e-9);
    EXPECT_NEAR(by_order.bubble(), by_tag.bubble(), 1e-9);
  }
  const PipelineShape shape{4, 8, 1};
  const ActionCosts slow = uniform_costs(shape, 1, 2, 0, 0.5);
  EXPECT_GT(simulate(Schedule::OneFOneB, shape, slow, Matching::ByCallOrder).makespan,
            simulate(Schedule::OneFOneB, shape, slow).makespan);
}

// A V's lists under call order, written out: zb-v on 2 ranks, 3 micro-batches. The passes are the
// tag-matched lists'; every message has one place in one global order (its send's time in the
// schedule's timeline), and each rank calls its sends and receives in that order, each receive as
// soon as its sender's pass is under way. So rank 1 receives micro-batch 2's activation down the
// first arm in one group with its send of micro-batch 0's back up the second (recvA2.c0 sendA0.c1),
// rank 0 posts that receive right after F2.c0, as both ends of the pair agree; the turn at rank 1,
// sendA0.c0 then recvA0.c1, is a copy between its chunks, in no group.
TEST(CallOrder, VListsCallInOneGlobalOrder) {
  const PipelineShape shape{2, 3, 2, Placement::V};
  EXPECT_EQ(describe(build_schedule(Schedule::ZBV, shape, 0, Matching::ByCallOrder)),
            "F0.c0 sendA0.c0 F1.c0 sendA1.c0 F2.c0 sendA2.c0 recvA0.c1 F0.c1 B0.c1 sendG0.c1 recvA1.c1 W0.c1 F1.c1 "
            "B1.c1 sendG1.c1 W1.c1 recvG0.c0 B0.c0 W0.c0 recvA2.c1 F2.c1 B2.c1 sendG2.c1 W2.c1 recvG1.c0 B1.c0 W1.c0 "
            "recvG2.c0 B2.c0 W2.c0");
  EXPECT_EQ(describe(build_schedule(Schedule::ZBV, shape, 1, Matching::ByCallOrder)),
            "recvA0.c0 F0.c0 recvA1.c0 sendA0.c0 recvA0.c1 F0.c1 recvA2.c0 sendA0.c1 F1.c0 sendA1.c0 recvA1.c1 F1.c1 "
            "recvG0.c1 sendA1.c1 B0.c1 sendG0.c1 W0.c1 F2.c0 recvG1.c1 sendA2.c0 recvG0.c0 B0.c0 sendG0.c0 W0.c0 "
            "recvA2.c1 F2.c1 sendA2.c1 B1.c1 sendG1.c1 W1.c1 recvG2.c1 recvG1.c0 B1.c0 sendG1.c0 B2.c1 sendG2.c1 "
            "recvG2.c0 B2.c0 sendG2.c0 W1.c0 W2.c1 W2.c0");
}

// zb-v and dualpipev under call order on 2 to 6 ranks, from the fewest micro-batches each allows
// to 4p+1: sound (pairs, no deadlock, a free buffer for every receive), the same passes as by tag,
// and between every two ranks the sends of one in the order the other receives them (counted here,
// not by check_pipeline); the copy at the V's point received right before its pass.
TEST(CallOrder, VListsAreSoundForEveryShape) {
  for (Schedule schedule : {Schedule::ZBV, Schedule::DualPipeV})
    for (int p = 2; p <= 6; p++)
      for (int m = schedule == Schedule::ZBV ? 1 : 2 * p; m <= 4 * p + 1; m++) {
        const Case c{schedule, {p, m, 2, Placement::V}};
        SCOPED_TRACE(name_of(c));
        const std::vector<std::vector<Action>> by_tag = build_all(c), by_order = build_all(c, Matching::ByCallOrder);
        EXPECT_EQ(check_pipeline(schedule, c.shape, by_tag), "");
        ASSERT_EQ(check_pipeline(schedule, c.shape, by_order, Matching::ByCallOrder), "");
        for (int rank = 0; rank < p; rank++) {
          EXPECT_EQ(passes(by_order[rank]), passes(by_tag[rank])) << "rank " << rank;
          for (int peer = 0; peer < p; peer++) {
            if (peer == rank) continue;
            const auto [sent, received] = calls_between(c.shape, by_order, rank, peer);
            EXPECT_EQ(describe(sent), describe(received)) << "from rank " << rank << " to rank " << peer;
          }
        }
        const std::vector<Action>& turn = by_order[p - 1];
        for (int micro = 0; micro < m; micro++) {
          EXPECT_EQ(index_of(turn, {Op::RecvActivation, micro, 1}) + 1, index_of(turn, {Op::F, micro, 1}));
          EXPECT_EQ(index_of(turn, {Op::RecvGradient, micro, 0}) + 1, index_of(turn, {Op::B, micro, 0}));
        }
      }
}

// The lists follow the timeline they were ordered by: with its costs (F = B = W, messages free) a
// V's step under call order is the tag-matched step, to the last unit; with a backward twice the
// forward, the order fits less well and the step is at most a few percent longer.
TEST(CallOrder, VListsFollowTheirTimeline) {
  for (const Case& c : all_cases()) {
    if (c.shape.placement != Placement::V || c.shape.stages < 2) continue;
    SCOPED_TRACE(name_of(c));
    const ActionCosts equal = uniform_costs(c.shape, 1, 1, 1);
    const Simulation by_order = simulate(c.schedule, c.shape, equal, Matching::ByCallOrder);
    ASSERT_EQ(by_order.deadlock, "");
    EXPECT_NEAR(by_order.makespan, simulate(c.schedule, c.shape, equal).makespan, 1e-9);
    const ActionCosts longer = uniform_costs(c.shape, 1, 2, 1);
    const double by_tag = simulate(c.schedule, c.shape, longer).makespan;
    EXPECT_GE(simulate(c.schedule, c.shape, longer, Matching::ByCallOrder).makespan, by_tag - 1e-9);
    EXPECT_LE(simulate(c.schedule, c.shape, longer, Matching::ByCallOrder).makespan, 1.06 * by_tag);
  }
}

// The first way one would try: the V's passes with each receive right before its pass, as the
// round-robin schedules have them. Sound by tag; under call order the ends of a pair disagree
// (zb-v: rank 1 expects micro-batch 0's gradient up the second arm where rank 0 sends micro-batch
// 2's activation down the first), or agree and still wait for each other in a cycle of group calls
// (dualpipev), which only running the groups shows.
TEST(CallOrder, VReceivesRightBeforeTheirPassesAreCaught) {
  auto per_pass = [](const Case& c) {
    std::vector<std::vector<Action>> per_rank;
    for (int rank = 0; rank < c.shape.stages; rank++) {
      std::vector<Action> list;
      for (const Action& a : build_schedule(c.schedule, c.shape, rank)) {
        if (a.op == Op::RecvActivation || a.op == Op::RecvGradient) continue;
        const int s = virtual_stage(c.shape, rank, a.chunk);
        if (a.op == Op::F && s > 0) list.push_back({Op::RecvActivation, a.micro, a.chunk});
        if (a.op == Op::B && s < c.shape.virtual_stages() - 1) list.push_back({Op::RecvGradient, a.micro, a.chunk});
        list.push_back(a);
      }
      per_rank.push_back(list);
    }
    return per_rank;
  };
  const Case zbv{Schedule::ZBV, {2, 4, 2, Placement::V}}, dualpipev{Schedule::DualPipeV, {2, 4, 2, Placement::V}};
  EXPECT_EQ(check_pipeline(zbv.schedule, zbv.shape, per_pass(zbv)), "") << "sound under tags";
  EXPECT_EQ(check_pipeline(zbv.schedule, zbv.shape, per_pass(zbv), Matching::ByCallOrder),
            "in call order, rank 0's send number 2 to rank 1 is for recvA2.c0, but rank 1's receive number 2 from it "
            "is recvG0.c1");
  EXPECT_EQ(check_pipeline(dualpipev.schedule, dualpipev.shape, per_pass(dualpipev)), "") << "sound under tags";
  EXPECT_EQ(check_pipeline(dualpipev.schedule, dualpipev.shape, per_pass(dualpipev), Matching::ByCallOrder),
            "deadlock: rank 0's group [sendG0.c1] waits for rank 1's group [recvG0.c1]; rank 1's group [sendA1.c1 "
            "recvA2.c0] waits for rank 0's group [recvA1.c1]");
}

// Under call order a receive's place among the calls is its match, so it cannot wait for a buffer
// as it does by tag: posted while the chunk's buffers are all lent, it is caught. Rank 0's loss
// chunk holds one micro-batch at a time, so one buffer: micro-batch 1's activation posted with
// micro-batch 0's, before F0.c1 has read it, finds none. And the copy at the V's point listed
// after the pass that reads it leaves that pass waiting for itself.
TEST(CallOrder, AReceiveWithNoFreeBufferAndACopyTooLateAreCaught) {
  const Case c{Schedule::ZBV, {2, 3, 2, Placement::V}};
  std::vector<std::vector<Action>> early = build_all(c, Matching::ByCallOrder);
  std::vector<Action>& rank0 = early[0];
  ASSERT_EQ(max_in_flight(rank0, 1), 1);
  rank0.erase(rank0.begin() + index_of(rank0, {Op::RecvActivation, 1, 1}));
  rank0.insert(rank0.begin() + index_of(rank0, {Op::RecvActivation, 0, 1}) + 1, {Op::RecvActivation, 1, 1});
  EXPECT_EQ(check_pipeline(c.schedule, c.shape, early), "") << "by tag it waits for the buffer";
  EXPECT_EQ(check_pipeline(c.schedule, c.shape, early, Matching::ByCallOrder),
            "rank 0 posts recvA1.c1 while all 1 of chunk 1's activation buffers (one per activation slot) are lent");

  std::vector<std::vector<Action>> late_copy = build_all(c, Matching::ByCallOrder);
  std::vector<Action>& turn = late_copy[1];
  turn.erase(turn.begin() + index_of(turn, {Op::SendActivation, 0, 0}));
  turn.insert(turn.begin() + index_of(turn, {Op::F, 0, 1}) + 1, {Op::SendActivation, 0, 0});
  const std::string problem = check_pipeline(c.schedule, c.shape, late_copy, Matching::ByCallOrder);
  EXPECT_NE(problem.find("rank 1 waits at F0.c1 for data that nothing listed before it brings"), std::string::npos)
      << problem;
}

TEST(PipelineSchedule, SimulatedBubbleIsTheTheory) {
  for (const Case& c : all_cases()) {
    if (splits_backward(c.schedule)) continue;  // below, with their own costs
    SCOPED_TRACE(name_of(c));
    // Unit costs, then a backward twice the forward as in a real model: the fraction is the same.
    for (double backward : {1.0, 2.0}) {
      Simulation sim = simulate(c.schedule, c.shape, uniform_costs(c.shape, 1, backward));
      ASSERT_EQ(sim.deadlock, "");
      EXPECT_NEAR(sim.bubble(), theory_bubble(c.schedule, c.shape, 1, backward, 0), 1e-9);
      // Equal stages: every rank idles as long as every other.
      for (double idle : sim.idle) EXPECT_NEAR(idle, sim.idle[0], 1e-9);
    }
  }
}

// With F = B = W = 1 zb-h1 idles (p-1)(F+B-W) per rank once m >= p, where 1f1b, whose backward is
// B + W in one action, idles (p-1)(F+B+W).
TEST(PipelineSchedule, ZeroBubbleH1IdlesLessThan1F1B) {
  const double F = 1, B = 1, W = 1;
  for (const Case& c : all_cases()) {
    if (c.schedule != Schedule::ZBH1) continue;
    SCOPED_TRACE(name_of(c));
    const int p = c.shape.stages, m = c.shape.micro_batches;
    Simulation zb = simulate(Schedule::ZBH1, c.shape, uniform_costs(c.shape, F, B, W));
    Simulation one_f_one_b = simulate(Schedule::OneFOneB, c.shape, uniform_costs(c.shape, F, B + W));
    ASSERT_EQ(zb.deadlock, "");
    ASSERT_EQ(one_f_one_b.deadlock, "");
    EXPECT_NEAR(zb.bubble(), theory_bubble(Schedule::ZBH1, c.shape, F, B, W), 1e-9);
    for (int rank = 0; rank < p; rank++) {
      EXPECT_NEAR(zb.idle[rank], (p - 1) * (F + B) - std::min(m - 1, p - 1) * W, 1e-9) << "rank " << rank;
      if (m >= p) {
        EXPECT_NEAR(zb.idle[rank], (p - 1) * (F + B - W), 1e-9) << "rank " << rank;
      }
      EXPECT_NEAR(one_f_one_b.idle[rank], (p - 1) * (F + B + W), 1e-9) << "rank " << rank;
      if (p > 1) {
        EXPECT_LT(zb.idle[rank], one_f_one_b.idle[rank]) << "rank " << rank;
      }
    }
  }
  // Unequal costs in the paper's setting (W no longer than F or B) follow the same formula.
  for (PipelineShape shape : {PipelineShape{4, 8, 1}, PipelineShape{4, 2, 1}}) {
    Simulation zb = simulate(Schedule::ZBH1, shape, uniform_costs(shape, 1.5, 2, 1));
    EXPECT_NEAR(zb.bubble(), theory_bubble(Schedule::ZBH1, shape, 1.5, 2, 1), 1e-9);
  }
}

// The same work cut into v chunks per rank fills and drains the pipeline v times faster.
// ZB-V (Qi et al. 2024): its steady state has no bubble, so the idle time per rank does not grow with
// m; with F = B = W it is (p-1)F on every rank, the fill of the V's first arm, which no order avoids
// (rank p-1 cannot start before p-1 forwards reached it, and every rank does the same work).
// Checked against the formula for m >= 2p-1 and F <= B (docs/theory.md, section 10), where it is
// exact, and with messages that take time not below the bound.
TEST(PipelineSchedule, ZeroBubbleVIdlesOnlyTheFillOfItsFirstArm) {
  for (int p : {2, 3, 4, 6}) {
    for (int m : {2 * p - 1, 2 * p, 3 * p, 5 * p}) {
      const PipelineShape shape{p, m, 2, Placement::V};
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Simulation equal = simulate(Schedule::ZBV, shape, uniform_costs(shape, 1, 1, 1));
      ASSERT_EQ(equal.deadlock, "");
      for (double idle : equal.idle) EXPECT_NEAR(idle, p - 1, 1e-9) << "only the fill: (p-1)F";
      EXPECT_NEAR(equal.makespan, 6 * m + (p - 1), 1e-9);
      EXPECT_NEAR(equal.bubble(), theory_bubble(Schedule::ZBV, shape, 1, 1, 1), 1e-9);
      // Other costs with F <= B: (p-1) max(B, 2(B-W)) per rank, whatever m.
      for (const auto& [F, B, W] : {std::tuple{1.0, 2.0, 1.0}, {1.0, 1.0, 0.25}, {0.5, 1.0, 0.8}, {1.0, 3.0, 1.0}}) {
        const Simulation sim = simulate(Schedule::ZBV, shape, uniform_costs(shape, F, B, W));
        for (double idle : sim.idle) EXPECT_NEAR(idle, (p - 1) * std::max(B, 2 * (B - W)), 1e-9) << F << " " << B << " " << W;
        EXPECT_NEAR(sim.bubble(), theory_bubble(Schedule::ZBV, shape, F, B, W), 1e-9);
      }
      // The same model on p ranks under zb-h1, each rank's two chunks one stage (2F, 2B, 2W): 2(p-1)F idle.
      const PipelineShape h1{p, m, 1};
      const Simulation zb_h1 = simulate(Schedule::ZBH1, h1, uniform_costs(h1, 2, 2, 2));
      EXPECT_GT(zb_h1.idle[0], equal.idle[0]);
      EXPECT_NEAR(zb_h1.makespan - equal.makespan, p - 1, 1e-9);
    }
  }
  // Fewer micro-batches than its order is written for: sound, and no better than the bound.
  const PipelineShape few{4, 3, 2, Placement::V};
  const Simulation sim = simulate(Schedule::ZBV, few, uniform_costs(few, 1, 1, 1));
  EXPECT_EQ(sim.deadlock, "");
  EXPECT_GT(sim.idle[0], 3.0);
}

// DualPipeV run one pass after another (no overlap of a pair): its idle time does not grow with m
// either, and it is the fill of the V's first arm, (p-1)F, where B <= F and B <= W; more otherwise.
// Each chunk's W's run in micro-batch order (the held ones oldest first), which 08's gradient hooks
// rely on: a chunk's gradients are final at its last micro-batch's W.
TEST(PipelineSchedule, DualPipeVIdlesTheFillWhereBackwardIsNoLonger) {
  for (int p : {2, 3, 4, 6}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p}) {
      const PipelineShape shape{p, m, 2, Placement::V};
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      for (const auto& [F, B, W] : {std::tuple{1.0, 1.0, 1.0}, {2.0, 1.0, 1.0}, {1.0, 1.0, 2.0}}) {
        const Simulation sim = simulate(Schedule::DualPipeV, shape, uniform_costs(shape, F, B, W));
        ASSERT_EQ(sim.deadlock, "");
        for (double idle : sim.idle) EXPECT_NEAR(idle, (p - 1) * F, 1e-9);
        EXPECT_NEAR(sim.bubble(), theory_bubble(Schedule::DualPipeV, shape, F, B, W), 1e-9);
      }
      const Simulation longer = simulate(Schedule::DualPipeV, shape, uniform_costs(shape, 1, 2, 1));
      EXPECT_GT(longer.bubble(), theory_bubble(Schedule::DualPipeV, shape, 1, 2, 1)) << "a floor, not exact";
      for (int rank = 0; rank < p; rank++) {
        int last_weight[2] = {-1, -1};
        for (const Action& a : build_schedule(Schedule::DualPipeV, shape, rank)) {
          if (a.op != Op::W) continue;
          EXPECT_EQ(a.micro, last_weight[a.chunk] + 1) << "rank " << rank << " chunk " << a.chunk;
          last_weight[a.chunk] = a.micro;
        }
      }
    }
  }
  // Rank 0 of 2: the V filled (2p forwards over the two chunks), then the F&B pairs of the steady
  // state, F of one chunk with B (and W) of the other.
  EXPECT_EQ(passes(build_schedule(Schedule::DualPipeV, {2, 4, 2, Placement::V}, 0)),
            "F0.c0 F1.c0 F2.c0 F0.c1 B0.c1 W0.c1 F1.c1 F3.c0 B1.c1 W1.c1 F2.c1 B0.c0 W0.c0 B2.c1 W2.c1 F3.c1 B1.c0 "
            "W1.c0 B3.c1 W3.c1 B2.c0 W2.c0 B3.c0 W3.c0");
  EXPECT_EQ(schedule_shape_error(Schedule::DualPipeV, {4, 7, 2, Placement::V}),
            "dualpipev needs at least 2 x the stages (8) micro-batches, not 7");
}

// DualPipe's F&B pairs: an F, then the other chunk's B and its W with only sends between. dualpipev's
// steps 4 and 5 are made of them, 2m - 3p + r + 1 on rank r; no other schedule has one.
TEST(PipelineSchedule, DualPipeVPairsAForwardWithTheOtherChunksBackward) {
  for (const Case& c : all_cases()) {
    for (int rank = 0; rank < c.shape.stages; rank++) {
      const std::vector<Action> list = build_schedule(c.schedule, c.shape, rank);
      const std::vector<FBPair> pairs = fb_pairs(list);
      if (c.schedule != Schedule::DualPipeV) {
        EXPECT_TRUE(pairs.empty()) << name_of(c) << " rank " << rank;
        continue;
      }
      const int p = c.shape.stages, m = c.shape.micro_batches;
      EXPECT_EQ(int(pairs.size()), 2 * m - 3 * p + rank + 1) << name_of(c) << " rank " << rank;
      for (const FBPair& pair : pairs) {
        const Action &f = list[size_t(pair.forward)], &b = list[size_t(pair.backward)], &w = list[size_t(pair.weight)];
        EXPECT_EQ(f.op, Op::F);
        EXPECT_EQ(b.op, Op::B);
        EXPECT_EQ(w.op, Op::W);
        EXPECT_NE(f.chunk, b.chunk) << "a pair's passes run on the two chunks";
        EXPECT_EQ(w.micro, b.micro);
        EXPECT_EQ(w.chunk, b.chunk);
        for (int i = pair.forward + 1; i < pair.weight; i++) {
          if (i == pair.backward) continue;
          EXPECT_TRUE(list[size_t(i)].op == Op::SendActivation || list[size_t(i)].op == Op::SendGradient);
        }
      }
    }
  }
  // Rank 0 of 2, m 4: F3.c0 with B1.c1, F2.c1 with B0.c0, F3.c1 with B1.c0 (the steady state's two, then
  // step 5's one).
  const std::vector<Action> list = build_schedule(Schedule::DualPipeV, {2, 4, 2, Placement::V}, 0);
  std::string pairs;
  for (const FBPair& pair : fb_pairs(list))
    pairs += describe(list[size_t(pair.forward)]) + "&" + describe(list[size_t(pair.backward)]) + " ";
  EXPECT_EQ(pairs, "F3.c0&B1.c1 F2.c1&B0.c0 F3.c1&B1.c0 ");
}

// With its pairs at once, each taking F&B (ActionCosts::pair), rank r runs 2m - 3p + r + 1 pairs and
// so computes r (F+B+W - F&B) less than rank 0 in the same step: it idles that much more. Rank 0
// idles 2(p-1)(F&B - B - W) where B <= F and B <= W, for every F&B a pair can take, from the longer
// of its two lanes (max(F, B+W)) to both in sequence (F+B+W); more otherwise (the formula a floor).
// The step shrinks by what the pairs save, less what they make the pipeline wait.
TEST(PipelineSchedule, DualPipeVWithPairsAtOnceIdlesAsTheTheorySays) {
  int exact = 0;
  for (int p : {2, 3, 4, 6}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p, 5 * p}) {
      const PipelineShape shape{p, m, 2, Placement::V};
      for (const auto& [F, B, W] : {std::tuple{1.0, 1.0, 1.0}, {2.0, 1.0, 1.0}, {1.0, 1.0, 2.0}, {1.0, 0.5, 0.5},
                                    {1.0, 2.0, 1.0}, {1.0, 1.0, 0.5}, {3.0, 1.0, 1.5}}) {
        const double S = F + B + W, shortest = std::max(F, B + W);
        for (double pair : {shortest, (shortest + S) / 2, S}) {
          SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) + " F,B,W=" + std::to_string(F) + "," +
                       std::to_string(B) + "," + std::to_string(W) + " F&B=" + std::to_string(pair));
          ActionCosts costs = uniform_costs(shape, F, B, W);
          costs.pair.assign(2, pair);
          const Simulation sim = simulate(Schedule::DualPipeV, shape, costs);
          ASSERT_EQ(sim.deadlock, "");
          for (int r = 1; r < p; r++) EXPECT_NEAR(sim.idle[size_t(r)] - sim.idle[0], r * (S - pair), 1e-9);
          const double floor = theory_bubble(Schedule::DualPipeV, shape, F, B, W, pair);
          if (B <= F && B <= W) {
            EXPECT_NEAR(sim.idle[0], 2 * (p - 1) * (pair - B - W), 1e-9);
            EXPECT_NEAR(sim.bubble(), floor, 1e-9);
            exact++;
          } else {
            EXPECT_GE(sim.bubble(), floor - 1e-9);
          }
        }
      }
    }
  }
  EXPECT_GT(exact, 0);
  // At F = B = W the last rank idles (p-1)(F&B - F): DualPipe's (PP/2-1)(F&B + B - 3W), B its whole
  // backward (2F). With the pairs as long as both passes (nothing hidden) the coupling costs: each
  // pair waits for both inputs, and the step is longer than the sequence's.
  const PipelineShape shape{4, 16, 2, Placement::V};
  ActionCosts costs = uniform_costs(shape, 1, 1, 1);
  const double in_sequence = simulate(Schedule::DualPipeV, shape, costs).makespan;
  for (double pair : {2.0, 2.5}) {
    costs.pair.assign(2, pair);
    const Simulation sim = simulate(Schedule::DualPipeV, shape, costs);
    EXPECT_NEAR(sim.idle[3], 3 * (pair + 2 - 3), 1e-9);
    EXPECT_LT(sim.makespan, in_sequence);
    double free_links = 0;  // the planner's question, the pairs at once too
    EXPECT_EQ(simulated_makespan(Schedule::DualPipeV, shape, costs, &free_links), sim.makespan);
    EXPECT_EQ(free_links, sim.makespan);
  }
  costs.pair.assign(2, 3.0);
  EXPECT_GT(simulate(Schedule::DualPipeV, shape, costs).makespan, in_sequence);
  EXPECT_EQ(theory_bubble_formula(Schedule::DualPipeV, true),
            "idle of rank r 2(p-1)(F&B-B-W)+r(F+B+W-F&B), mean over r / step (at least)");
}

// The V placement: chunk 0 of rank r is virtual stage r, chunk 1 is 2p-1-r; the first and the last
// virtual stage on rank 0; the hand-over at the point of the V within rank p-1, a message to itself.
TEST(PipelineSchedule, VPlacementPutsBothEndsOnRankZero) {
  const PipelineShape shape{4, 8, 2, Placement::V};
  for (int r = 0; r < 4; r++) {
    EXPECT_EQ(virtual_stage(shape, r, 0), r);
    EXPECT_EQ(virtual_stage(shape, r, 1), 7 - r);
    for (int c : {0, 1}) {
      EXPECT_EQ(rank_of_stage(shape, virtual_stage(shape, r, c)), r);
      EXPECT_EQ(chunk_of_stage(shape, virtual_stage(shape, r, c)), c);
    }
  }
  const std::vector<Action> rank0 = build_schedule(Schedule::ZBV, shape, 0);
  for (const Action& a : rank0) {  // the loss's chunk sends no activation, the embedding's no gradient
    EXPECT_FALSE(a.op == Op::SendActivation && a.chunk == 1) << describe(a);
    EXPECT_FALSE(a.op == Op::SendGradient && a.chunk == 0) << describe(a);
  }
  // Rank 0: down the V 2p-1 times, then each chunk-1 forward with its B and W, the loss being here.
  EXPECT_EQ(passes(build_schedule(Schedule::ZBV, {2, 4, 2, Placement::V}, 0)),
            "F0.c0 F1.c0 F2.c0 F0.c1 B0.c1 W0.c1 F1.c1 B1.c1 W1.c1 F3.c0 B0.c0 W0.c0 F2.c1 B2.c1 W2.c1 B1.c0 W1.c0 "
            "F3.c1 B3.c1 W3.c1 B2.c0 W2.c0 B3.c0 W3.c0");
  EXPECT_NE(schedule_shape_error(Schedule::ZBV, {4, 8, 2}), "") << "a round-robin shape for a V schedule";
  EXPECT_NE(schedule_shape_error(Schedule::OneFOneB, {4, 8, 1, Placement::V}), "");
  EXPECT_EQ(schedule_shape_error(Schedule::ZBV, {4, 8, 3, Placement::V}),
            "zb-v runs 2 chunks per rank, the two arms of its V, not 3");
}

TEST(PipelineSchedule, InterleavingShortensTheStep) {
  PipelineShape plain{4, 8, 1}, interleaved{4, 8, 2};
  Simulation one_chunk = simulate(Schedule::OneFOneB, plain, uniform_costs(plain, 2, 4));
  Simulation two_chunks = simulate(Schedule::Interleaved, interleaved, uniform_costs(interleaved, 1, 2));
  EXPECT_NEAR(one_chunk.makespan, (8 + 3) * 6.0, 1e-9);           // (m + p-1)(F+B)
  EXPECT_NEAR(two_chunks.makespan, 8 * 6.0 + 3 * 6.0 / 2, 1e-9);  // m(F+B) + (p-1)(F+B)/v
}

// A timing worked out by hand: 1f1b on 2 ranks, 2 micro-batches, F = B = 1, messages take 0.5.
TEST(PipelineSchedule, SimulationMatchesAHandTiming) {
  PipelineShape shape{2, 2, 1};
  Simulation sim = simulate(Schedule::OneFOneB, shape, uniform_costs(shape, 1, 1, 0, 0.5));
  ASSERT_EQ(sim.deadlock, "");
  std::map<std::pair<int, std::string>, std::pair<double, double>> times;
  for (const SimulatedAction& a : sim.actions) times[{a.rank, describe(a.action)}] = {a.start, a.end};
  auto when = [&](int rank, const std::string& action) { return times[{rank, action}]; };
  // rank 0: F0 [0,1], F1 [1,2]; rank 1: F0 after sendA0 at 1 + 0.5, B0 right after it, ...
  EXPECT_EQ(when(0, "F1.c0"), std::make_pair(1.0, 2.0));
  EXPECT_EQ(when(1, "F0.c0"), std::make_pair(1.5, 2.5));
  EXPECT_EQ(when(1, "B0.c0"), std::make_pair(2.5, 3.5));
  EXPECT_EQ(when(1, "F1.c0"), std::make_pair(3.5, 4.5));  // its input arrived at 2.5: it was busy
  EXPECT_EQ(when(0, "B0.c0"), std::make_pair(4.0, 5.0));  // sendG0 at 3.5 + 0.5
  EXPECT_EQ(when(1, "B1.c0"), std::make_pair(4.5, 5.5));
  EXPECT_EQ(when(0, "B1.c0"), std::make_pair(6.0, 7.0));
  EXPECT_DOUBLE_EQ(sim.makespan, 7.0);
  EXPECT_DOUBLE_EQ(sim.idle[0], 3.0);
  EXPECT_DOUBLE_EQ(sim.idle[1], 3.0);
}

TEST(PipelineSchedule, ActivationSlotsAreTheTheorys) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name_of(c));
    const int p = c.shape.stages, m = c.shape.micro_batches;
    std::vector<std::vector<Action>> per_rank = build_all(c);
    for (int rank = 0; rank < p; rank++) {
      for (int chunk = 0; chunk < c.shape.chunks; chunk++) {
        int slots = max_in_flight(per_rank[rank], chunk);
        EXPECT_EQ(slots, theory_in_flight(c.schedule, c.shape, rank, chunk)) << "rank " << rank << " chunk " << chunk;
        const int whole = max_awaiting_backward(per_rank[rank], chunk);
        switch (c.schedule) {
          case Schedule::AFAB: EXPECT_EQ(slots, m); break;
          case Schedule::OneFOneB: EXPECT_EQ(slots, std::min(p - rank, m)); break;
          case Schedule::Interleaved: break;
          case Schedule::ZBH1:
            // Up to p held until their W, but only 1f1b's min(p - r, m) whole: the rest await only W.
            EXPECT_EQ(slots, std::min(p, m));
            EXPECT_EQ(whole, std::min(p - rank, m)) << "rank " << rank;
            break;
          case Schedule::ZBV:
          case Schedule::DualPipeV:
            // Down the V, the ranks nearest its point hold the fewest; back up, the most.
            EXPECT_EQ(slots, std::min(m, chunk == 0 ? 2 * p - rank : rank + 1));
            break;
        }
        if (!splits_backward(c.schedule)) {
          EXPECT_EQ(whole, slots) << "without W, B frees the activations";
        }
      }
    }
  }
}

// Megatron-LM's count: rank 0 holds (v+1)p - 1 chunks' activations at the peak, where 1f1b holds
// p micro-batches of v chunks each.
TEST(PipelineSchedule, InterleavedRankZeroHoldsAFewMoreThan1F1B) {
  PipelineShape shape{4, 16, 2};
  std::vector<Action> list = build_schedule(Schedule::Interleaved, shape, 0);
  int held = 0, peak = 0;
  for (const Action& a : list) {
    if (a.op == Op::F) peak = std::max(peak, ++held);
    if (a.op == Op::B) held--;
  }
  EXPECT_EQ(peak, (2 + 1) * 4 - 1);
}

// Broken lists, each with the mistake check_pipeline must name.
TEST(PipelineSchedule, CheckPipelineCatchesBrokenLists) {
  const PipelineShape shape{2, 2, 1};
  const Case c{Schedule::OneFOneB, shape};
  auto expect_caught = [&](const std::vector<std::vector<Action>>& per_rank, Schedule schedule,
                           const std::string& words) {
    const PipelineShape of_schedule{shape.stages, shape.micro_batches, schedule == Schedule::ZBV ? 2 : 1,
                                    placement_of(schedule)};
    std::string problem = check_pipeline(schedule, of_schedule, per_rank);
    EXPECT_NE(problem.find(words), std::string::npos)
        << "expected a message with \"" << words << "\", got \"" << problem << "\"";
  };

  std::vector<std::vector<Action>> dropped_receive = build_all(c);
  dropped_receive[1].erase(dropped_receive[1].begin() + index_of(dropped_receive[1], {Op::RecvActivation, 1, 0}));
  expect_caught(dropped_receive, c.schedule, "rank 1 has 0 x recvA1.c0, not 1: virtual stage 0 on rank 0 sends it");

  std::vector<std::vector<Action>> backward_first = build_all(c);
  std::swap(backward_first[1][index_of(backward_first[1], {Op::F, 0, 0})],
            backward_first[1][index_of(backward_first[1], {Op::B, 0, 0})]);
  expect_caught(backward_first, c.schedule, "rank 1 runs B0.c0 before F0.c0");

  std::vector<std::vector<Action>> late_receive = build_all(c);
  late_receive[0].erase(late_receive[0].begin() + index_of(late_receive[0], {Op::RecvGradient, 0, 0}));
  late_receive[0].push_back({Op::RecvGradient, 0, 0});
  expect_caught(late_receive, c.schedule, "rank 0 posts recvG0.c0 after B0.c0");

  std::vector<std::vector<Action>> early_send = build_all(c);
  std::swap(early_send[0][index_of(early_send[0], {Op::F, 0, 0})],
            early_send[0][index_of(early_send[0], {Op::SendActivation, 0, 0})]);
  expect_caught(early_send, c.schedule, "rank 0 sends sendA0.c0 before F0.c0 computes it");

  std::vector<std::vector<Action>> send_from_last = build_all(c);
  send_from_last[1].push_back({Op::SendActivation, 0, 0});
  expect_caught(send_from_last, c.schedule, "no virtual stage after the last needs it");

  // A W in a schedule that does not split the backward, and none where zb-h1 needs it.
  std::vector<std::vector<Action>> stray_weight = build_all(c);
  stray_weight[0].push_back({Op::W, 1, 0});
  expect_caught(stray_weight, c.schedule, "only zb-h1 and zb-v split the backward");
  std::vector<std::vector<Action>> missing_weight = build_all({Schedule::ZBH1, shape});
  missing_weight[0].erase(missing_weight[0].begin() + index_of(missing_weight[0], {Op::W, 1, 0}));
  expect_caught(missing_weight, Schedule::ZBH1, "rank 0 has 0 x W1.c0, not 1");
  // zb-v: a W of the loss's chunk left out, and the hand-over at the V's point sent to the wrong arm.
  const Case v{Schedule::ZBV, {2, 2, 2, Placement::V}};
  std::vector<std::vector<Action>> v_missing = build_all(v);
  v_missing[0].erase(v_missing[0].begin() + index_of(v_missing[0], {Op::W, 1, 1}));
  expect_caught(v_missing, Schedule::ZBV, "rank 0 has 0 x W1.c1, not 1");
  std::vector<std::vector<Action>> v_reordered = build_all(v);
  std::vector<Action>& bottom = v_reordered[1];
  const int down = index_of(bottom, {Op::F, 0, 0});  // F0.c0 sendA0.c0 F0.c1 sendA0.c1: the turn
  std::rotate(bottom.begin() + down, bottom.begin() + down + 2, bottom.begin() + down + 4);
  expect_caught(v_reordered, Schedule::ZBV, "rank 1 waits at F0.c1 for sendA0.c0 of rank 1");

  // Every list sound on its own, yet together they wait for each other: rank 0 wants micro-batch
  // 0's gradient before it sends micro-batch 1's activation; rank 1 wants that activation first.
  std::vector<std::vector<Action>> cycle = build_all({Schedule::AFAB, shape});
  std::vector<Action>& rank0 = cycle[0];
  rank0.erase(rank0.begin() + index_of(rank0, {Op::F, 1, 0}), rank0.begin() + index_of(rank0, {Op::F, 1, 0}) + 2);
  int b0 = index_of(rank0, {Op::B, 0, 0});
  rank0.insert(rank0.begin() + b0 + 1, {{Op::F, 1, 0}, {Op::SendActivation, 1, 0}});
  EXPECT_EQ(passes(rank0), "F0.c0 B0.c0 F1.c0 B1.c0");
  expect_caught(cycle, Schedule::AFAB,
                "deadlock: rank 0 waits at B0.c0 for sendG0.c0 of rank 1; "
                "rank 1 waits at F1.c0 for sendA1.c0 of rank 0");
  Simulation stuck = simulate(shape, uniform_costs(shape, 1, 1), cycle);
  EXPECT_NE(stuck.deadlock, "");

  EXPECT_NE(check_pipeline(c.schedule, shape, {build_schedule(c.schedule, shape, 0)}), "");  // a rank's list missing
}

TEST(PipelineSchedule, TheoryFormulasForPrinting) {
  EXPECT_EQ(theory_bubble_formula(Schedule::AFAB), "(p-1)/(m+p-1)");
  EXPECT_EQ(theory_bubble_formula(Schedule::OneFOneB), "(p-1)/(m+p-1)");
  EXPECT_EQ(theory_bubble_formula(Schedule::Interleaved), "(p-1)/(v*m+p-1)");
  EXPECT_EQ(theory_bubble_formula(Schedule::ZBH1), "(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W))");
  EXPECT_NEAR(theory_bubble(Schedule::OneFOneB, {4, 8, 1}, 1, 2, 0), 3.0 / 11, 1e-12);
  EXPECT_NEAR(theory_bubble(Schedule::Interleaved, {4, 8, 2}, 1, 2, 0), 3.0 / 19, 1e-12);
  EXPECT_NEAR(theory_bubble(Schedule::ZBH1, {4, 8, 1}, 1, 1, 1), 3.0 / 27, 1e-12);
  EXPECT_EQ(theory_bubble_formula(Schedule::ZBV), "(p-1)max(B,2(B-W))/(2m(F+B+W)+(p-1)max(B,2(B-W)))");
  EXPECT_NEAR(theory_bubble(Schedule::ZBV, {4, 8, 2, Placement::V}, 1, 1, 1), 3.0 / 51, 1e-12);
  EXPECT_EQ(theory_bubble_formula(Schedule::DualPipeV), "(p-1)F/(2m(F+B+W)+(p-1)F) (at least)");
}

}  // namespace
