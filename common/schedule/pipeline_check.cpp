// pipeline_check.cpp: what the lists of pipeline_schedule.h mean together. Defines message_of()
// and call_order() (pipeline_schedule_internal.h: both ends of a message, the pairs NCCL matches),
// fb_pairs() and message_groups() (a list's F&B pairs and its group calls), check_pipeline() (are all
// ranks' lists sound together: counts and order, call-order pairing, no deadlock, a buffer for every
// receive), and max_in_flight() and max_awaiting_backward() (a chunk's activation slots).
#include "schedule/pipeline_schedule.h"

#include <algorithm>

#include "schedule/pipeline_schedule_internal.h"
#include "schedule/pipeline_simulate.h"  // check_pipeline runs the lists together

using namespace pipeline_internal;

Message pipeline_internal::message_of(const PipelineShape& shape, int rank, const Action& a) {
  const int s = virtual_stage(shape, rank, a.chunk);
  auto at = [&](Op op, int stage) { return Message{rank_of_stage(shape, stage), {op, a.micro, chunk_of_stage(shape, stage)}}; };
  switch (a.op) {
    case Op::SendActivation: return at(Op::RecvActivation, s + 1);
    case Op::SendGradient: return at(Op::RecvGradient, s - 1);
    case Op::RecvActivation: return {rank_of_stage(shape, s - 1), a};
    case Op::RecvGradient: return {rank_of_stage(shape, s + 1), a};
    default: return {rank, a};
  }
}

namespace {

// How many times a rank's list must hold `op` for one micro-batch of the chunk at virtual stage
// `stage`, and why, for check_pipeline's messages.
int expected_count(Schedule schedule, const PipelineShape& shape, Op op, int stage, std::string* why) {
  const int last = shape.virtual_stages() - 1;
  auto on = [&](int s) {
    return "virtual stage " + std::to_string(s) + " on rank " + std::to_string(rank_of_stage(shape, s));
  };
  switch (op) {
    case Op::F:
    case Op::B: *why = "one per micro-batch and chunk"; return 1;
    case Op::W:
      if (splits_backward(schedule)) {
        *why = std::string(schedule_name(schedule)) + " splits every backward into B and W";
        return 1;
      }
      *why = "only zb-h1 and zb-v split the backward";
      return 0;
    case Op::SendActivation:
      *why = stage < last ? on(stage + 1) + " needs it" : "no virtual stage after the last needs it";
      return stage < last ? 1 : 0;
    case Op::RecvActivation:
      *why = stage > 0 ? on(stage - 1) + " sends it" : "virtual stage 0 reads tokens, from no neighbour";
      return stage > 0 ? 1 : 0;
    case Op::SendGradient:
      *why = stage > 0 ? on(stage - 1) + " needs it" : "no virtual stage before the first needs it";
      return stage > 0 ? 1 : 0;
    case Op::RecvGradient:
      *why = stage < last ? on(stage + 1) + " sends it" : "the last virtual stage starts from its own loss";
      return stage < last ? 1 : 0;
  }
  return 0;
}

}  // namespace

std::vector<FBPair> fb_pairs(const std::vector<Action>& actions) {
  const int n = int(actions.size());
  // The next pass after position i, if only sends lie between (a receive between breaks a pair).
  auto next_pass = [&](int i) {
    for (int j = i + 1; j < n; j++) {
      if (is_pass(actions[j].op)) return j;
      if (actions[j].op != Op::SendActivation && actions[j].op != Op::SendGradient) return -1;
    }
    return -1;
  };
  std::vector<FBPair> pairs;
  for (int i = 0; i < n; i++) {
    if (actions[i].op != Op::F) continue;
    const int b = next_pass(i);
    if (b < 0 || actions[b].op != Op::B || actions[b].chunk == actions[i].chunk) continue;
    const int w = next_pass(b);
    if (w < 0 || actions[w].op != Op::W || actions[w].micro != actions[b].micro || actions[w].chunk != actions[b].chunk)
      continue;
    pairs.push_back({i, b, w});
    i = w;
  }
  return pairs;
}

std::vector<std::pair<int, int>> message_groups(const std::vector<Action>& actions) {
  std::vector<std::pair<int, int>> groups;
  for (int i = 0; i < int(actions.size()); i++) {
    if (is_pass(actions[i].op)) continue;
    if (i > 0 && !is_pass(actions[i - 1].op))
      groups.back().second = i;
    else
      groups.push_back({i, i});
  }
  return groups;
}

CallOrder pipeline_internal::call_order(const PipelineShape& shape, const std::vector<std::vector<Action>>& per_rank) {
  const int p = shape.stages;
  CallOrder order;
  order.sends.assign(p, std::vector<std::vector<int>>(p));
  order.receives = order.sends;
  for (int rank = 0; rank < p; rank++)
    for (int i = 0; i < int(per_rank[rank].size()); i++) {
      const Action& a = per_rank[rank][i];
      if (is_pass(a.op)) continue;
      const int peer = message_of(shape, rank, a).peer;
      (a.op == Op::SendActivation || a.op == Op::SendGradient ? order.sends : order.receives)[rank][peer].push_back(i);
    }
  return order;
}

namespace {

// Under call order: the k-th send from rank a to rank b and the k-th receive at b from a must be one
// message, or the data lands in the wrong buffer and nothing says so. "" or the first mismatch. A
// message from a rank to itself is a copy into its micro-batch's buffer, in any order.
std::string call_order_problem(const PipelineShape& shape, const std::vector<std::vector<Action>>& per_rank) {
  const CallOrder order = call_order(shape, per_rank);
  for (int from = 0; from < shape.stages; from++)
    for (int to = 0; to < shape.stages; to++) {
      if (to == from) continue;
      const std::vector<int>&out = order.sends[from][to], &in = order.receives[to][from];
      for (size_t k = 0; k < out.size() && k < in.size(); k++) {
        const Action sent = message_of(shape, from, per_rank[from][out[k]]).as_received;
        const Action& received = per_rank[to][in[k]];
        if (!(sent == received))
          return "in call order, rank " + std::to_string(from) + "'s send number " + std::to_string(k) + " to rank " +
                 std::to_string(to) + " is for " + describe(sent) + ", but rank " + std::to_string(to) +
                 "'s receive number " + std::to_string(k) + " from it is " + describe(received);
      }
    }
  return "";
}

// The executor's message buffers (pipeline.h): each chunk has as many for the activations it
// receives, and as many for the gradients, as it has activation slots (max_in_flight). A buffer is
// lent where a receive is posted, or where a copy from the rank's other chunk is made (its send),
// and comes back after the pass that reads it (F, B). By tag a receive that finds none waits for
// one, in list order; under call order it cannot wait, since its place among the calls is its
// match: it must find one free. So must a copy, under either. "" or the first that finds none.
std::string buffer_problem(const PipelineShape& shape, int rank, const std::vector<Action>& list, Matching matching) {
  const int v = shape.chunks, m = shape.micro_batches;
  // lent[chunk][kind] (0 activations, 1 gradients), and which micro-batches hold one.
  std::vector<std::vector<int>> lent(v, std::vector<int>(2, 0));
  std::vector<std::vector<std::vector<bool>>> holds(v, std::vector<std::vector<bool>>(2, std::vector<bool>(m, false)));
  auto lend = [&](int chunk, int kind, const Action& at) -> std::string {
    const int buffers = max_in_flight(list, chunk);
    const bool copy = at.op == Op::SendActivation || at.op == Op::SendGradient;
    if (lent[chunk][kind] == buffers)
      return "rank " + std::to_string(rank) + (copy ? " copies " : " posts ") + describe(at) + " while all " +
             std::to_string(buffers) + " of chunk " + std::to_string(chunk) + "'s " +
             (kind == 0 ? "activation" : "gradient") + " buffers (one per activation slot) are lent";
    lent[chunk][kind]++;
    holds[chunk][kind][at.micro] = true;
    return "";
  };
  for (const Action& a : list) {
    std::string problem;
    switch (a.op) {
      case Op::RecvActivation:
      case Op::RecvGradient:
        if (matching == Matching::ByCallOrder && message_of(shape, rank, a).peer != rank)
          problem = lend(a.chunk, a.op == Op::RecvGradient, a);
        break;
      case Op::SendActivation:
      case Op::SendGradient: {
        const Message message = message_of(shape, rank, a);
        if (message.peer == rank) problem = lend(message.as_received.chunk, a.op == Op::SendGradient, a);
        break;
      }
      case Op::F:
      case Op::B: {
        const int kind = a.op == Op::B;
        if (holds[a.chunk][kind][a.micro]) holds[a.chunk][kind][a.micro] = false, lent[a.chunk][kind]--;
        break;
      }
      case Op::W: break;
    }
    if (!problem.empty()) return problem;
  }
  return "";
}

}  // namespace

std::string check_pipeline(Schedule schedule, const PipelineShape& shape,
                           const std::vector<std::vector<Action>>& per_rank, Matching matching) {
  std::string shape_error = schedule_shape_error(schedule, shape);
  if (!shape_error.empty()) return shape_error;
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  if (int(per_rank.size()) != p)
    return "there are " + std::to_string(per_rank.size()) + " lists for " + std::to_string(p) + " ranks";

  for (int rank = 0; rank < p; rank++) {
    const std::vector<Action>& list = per_rank[rank];
    const std::string on_rank = "rank " + std::to_string(rank) + " ";
    // positions[(op, chunk, micro)]: where the list holds that action
    std::vector<std::vector<int>> positions(size_t(kOps) * v * m);
    auto slot = [&](Op op, int chunk, int micro) -> std::vector<int>& {
      return positions[(size_t(op) * v + chunk) * m + micro];
    };
    for (int i = 0; i < int(list.size()); i++) {
      const Action& a = list[i];
      if (a.micro < 0 || a.micro >= m || a.chunk < 0 || a.chunk >= v)
        return on_rank + "has " + describe(a) + ", outside the " + std::to_string(m) + " micro-batches and " +
               std::to_string(v) + " chunks";
      slot(a.op, a.chunk, a.micro).push_back(i);
    }
    for (int chunk = 0; chunk < v; chunk++) {
      const int stage = virtual_stage(shape, rank, chunk);
      for (int micro = 0; micro < m; micro++) {
        for (int op = 0; op < kOps; op++) {
          std::string why;
          int expected = expected_count(schedule, shape, Op(op), stage, &why);
          int count = int(slot(Op(op), chunk, micro).size());
          if (count != expected)
            return on_rank + "has " + std::to_string(count) + " x " + describe({Op(op), micro, chunk}) + ", not " +
                   std::to_string(expected) + ": " + why;
        }
        // Each action now appears as often as it must; each comes in the right order or not at all.
        auto at = [&](Op op) { return slot(op, chunk, micro).empty() ? -1 : slot(op, chunk, micro)[0]; };
        auto name = [&](Op op) { return describe({op, micro, chunk}); };
        if (at(Op::B) < at(Op::F)) return on_rank + "runs " + name(Op::B) + " before " + name(Op::F);
        if (at(Op::W) >= 0 && at(Op::W) < at(Op::B))
          return on_rank + "runs " + name(Op::W) + " before " + name(Op::B);
        if (at(Op::SendActivation) >= 0 && at(Op::SendActivation) < at(Op::F))
          return on_rank + "sends " + name(Op::SendActivation) + " before " + name(Op::F) + " computes it";
        if (at(Op::SendGradient) >= 0 && at(Op::SendGradient) < at(Op::B))
          return on_rank + "sends " + name(Op::SendGradient) + " before " + name(Op::B) + " computes it";
        if (at(Op::RecvActivation) > at(Op::F))
          return on_rank + "posts " + name(Op::RecvActivation) + " after " + name(Op::F) + ", which waits for it";
        if (at(Op::RecvGradient) > at(Op::B))
          return on_rank + "posts " + name(Op::RecvGradient) + " after " + name(Op::B) + ", which waits for it";
      }
    }
  }
  if (matching == Matching::ByCallOrder && shape.stages > 1) {
    const std::string pairing = call_order_problem(shape, per_rank);
    if (!pairing.empty()) return pairing;
  }
  // Every list is sound on its own and every send meets its receive; what is left is a cycle of
  // ranks each waiting for the next, which only running them together shows.
  Simulation run =
      simulate(shape, uniform_costs(shape, 1, 1, splits_backward(schedule) ? 1 : 0), per_rank, matching);
  if (!run.deadlock.empty()) return "deadlock: " + run.deadlock;
  // And each receive, or copy, must find a buffer for its message where it is listed.
  for (int rank = 0; rank < p; rank++) {
    const std::string buffers = buffer_problem(shape, rank, per_rank[rank], matching);
    if (!buffers.empty()) return buffers;
  }
  return "";
}

namespace {

// The peak count of micro-batches of `chunk` whose F is done and whose freeing pass is not.
int peak_between(const std::vector<Action>& actions, int chunk, Op freed_by) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.chunk != chunk) continue;
    if (a.op == Op::F) peak = std::max(peak, ++held);
    if (a.op == freed_by) held--;
  }
  return peak;
}

}  // namespace

int max_in_flight(const std::vector<Action>& actions, int chunk) {
  bool has_weight_passes = std::any_of(actions.begin(), actions.end(), [](const Action& a) { return a.op == Op::W; });
  return peak_between(actions, chunk, has_weight_passes ? Op::W : Op::B);
}

int max_awaiting_backward(const std::vector<Action>& actions, int chunk) { return peak_between(actions, chunk, Op::B); }
