// pipeline_simulate.cpp: see pipeline_simulate.h. The simulator of the lists, by tag (each message
// arrives p2p after its send) and under call order (each rank's group calls on a lane of their own),
// then the theory it is checked against: the bubble's formulas and the activation slots derived from
// each schedule's order.
#include "schedule/pipeline_simulate.h"

#include <algorithm>

#include "base/check.h"  // ENSURE
#include "schedule/pipeline_schedule_internal.h"

using namespace pipeline_internal;

namespace {

// The time an action takes: its pass's cost for its chunk (every rank alike) or its virtual stage
// (each its own, as measured); sends and receives none.
double action_cost(const PipelineShape& shape, const ActionCosts& costs, int rank, const Action& a) {
  const int i = int(costs.forward.size()) == shape.chunks ? a.chunk : virtual_stage(shape, rank, a.chunk);
  if (a.op == Op::F) return costs.forward[i];
  if (a.op == Op::B) return costs.backward[i];
  if (a.op == Op::W) return costs.weight.empty() ? 0 : costs.weight[i];
  return 0;
}

}  // namespace

ActionCosts uniform_costs(const PipelineShape& shape, double forward, double backward, double weight, double p2p) {
  ActionCosts costs;
  costs.forward.assign(shape.chunks, forward);
  costs.backward.assign(shape.chunks, backward);
  costs.weight.assign(shape.chunks, weight);
  costs.p2p = p2p;
  return costs;
}

double Simulation::bubble() const {
  if (idle.empty() || makespan <= 0) return 0;
  double sum = 0;
  for (double t : idle) sum += t;
  return sum / double(idle.size()) / makespan;
}

double simulated_makespan(Schedule schedule, const PipelineShape& shape, const ActionCosts& costs,
                          double* without_p2p) {
  ActionCosts free_links = costs;
  free_links.p2p = 0;
  *without_p2p = simulate(schedule, shape, free_links).makespan;
  return simulate(schedule, shape, costs).makespan;
}

Simulation simulate(Schedule schedule, const PipelineShape& shape, const ActionCosts& costs, Matching matching) {
  ENSURE(schedule_shape_error(schedule, shape).empty(), schedule_shape_error(schedule, shape));
  std::vector<std::vector<Action>> per_rank;
  for (int rank = 0; rank < shape.stages; rank++) per_rank.push_back(build_schedule(schedule, shape, rank, matching));
  return simulate(shape, costs, per_rank, matching);
}

namespace {

Simulation simulate_call_order(const PipelineShape& shape, const ActionCosts& costs,
                               const std::vector<std::vector<Action>>& per_rank);

}  // namespace

Simulation simulate(const PipelineShape& shape, const ActionCosts& costs,
                    const std::vector<std::vector<Action>>& per_rank, Matching matching) {
  if (matching == Matching::ByCallOrder && shape.stages > 1) return simulate_call_order(shape, costs, per_rank);
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks, stages = shape.virtual_stages();
  ENSURE(int(per_rank.size()) == p, "simulate: one list per rank");
  // A cost per chunk (every rank alike), or per virtual stage (each stage its own, as measured).
  const int per = int(costs.forward.size());
  ENSURE((per == v || per == stages) && int(costs.backward.size()) == per,
         "simulate: a cost per chunk or per virtual stage");
  ENSURE(costs.weight.empty() || int(costs.weight.size()) == per, "simulate: a weight cost for each, or none");
  for (const std::vector<Action>& list : per_rank)
    for (const Action& a : list)
      ENSURE(a.micro >= 0 && a.micro < m && a.chunk >= 0 && a.chunk < v, "simulate: an action outside the shape");

  // done_at[(op, virtual stage, micro)]: when that action ended, -1 until it has run. What the
  // other actions wait for.
  std::vector<double> done_at(size_t(kOps) * stages * m, -1.0);
  auto done = [&](Op op, int stage, int micro) -> double& {
    return done_at[(size_t(op) * stages + stage) * m + micro];
  };

  // When `a` on `rank` may start, or -1 while what it needs has not happened yet.
  auto ready_at = [&](int rank, const Action& a) -> double {
    const int s = virtual_stage(shape, rank, a.chunk);
    auto arrival = [&](Op posted, Op sent, int from) -> double {
      if (done(posted, s, a.micro) < 0) return -1;
      double sent_at = done(sent, from, a.micro);
      return sent_at < 0 ? -1 : sent_at + costs.p2p;
    };
    switch (a.op) {
      case Op::F: return s == 0 ? 0 : arrival(Op::RecvActivation, Op::SendActivation, s - 1);
      case Op::B: return s == stages - 1 ? done(Op::F, s, a.micro) : arrival(Op::RecvGradient, Op::SendGradient, s + 1);
      case Op::W: return done(Op::B, s, a.micro);
      case Op::SendActivation: return done(Op::F, s, a.micro);
      case Op::SendGradient: return done(Op::B, s, a.micro);
      case Op::RecvActivation:
      case Op::RecvGradient: return 0;
    }
    return -1;
  };
  auto cost_of = [&](int rank, const Action& a) { return action_cost(shape, costs, rank, a); };
  // Overlapped F&B pairs: per rank and position, the pair an F starts (-1: none), and the B and W
  // positions a pair has already run.
  const bool overlapped = !costs.pair.empty();
  ENSURE(!overlapped || int(costs.pair.size()) == per, "simulate: a pair cost per chunk or per virtual stage");
  std::vector<std::vector<int>> pair_at(p);
  std::vector<std::vector<FBPair>> pairs(p);
  std::vector<std::vector<bool>> ran_in_pair(p);
  for (int rank = 0; rank < p; rank++) {
    pair_at[rank].assign(per_rank[rank].size(), -1);
    ran_in_pair[rank].assign(per_rank[rank].size(), false);
    if (overlapped) pairs[rank] = fb_pairs(per_rank[rank]);
    for (int k = 0; k < int(pairs[rank].size()); k++) pair_at[rank][size_t(pairs[rank][size_t(k)].forward)] = k;
  }

  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0), computed(p, 0);
  std::vector<std::vector<SimulatedAction>> ran(p);
  // A rank's next action's times depend only on its own clock and on actions already run, so
  // running whichever rank can go on, until none can, gives the same times in any order.
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int rank = 0; rank < p; rank++) {
      const std::vector<Action>& list = per_rank[rank];
      while (next[rank] < list.size()) {
        const Action& a = list[next[rank]];
        if (ran_in_pair[rank][next[rank]]) {  // its pair ran it
          next[rank]++;
          progressed = true;
          continue;
        }
        if (pair_at[rank][next[rank]] >= 0) {  // an F&B pair: both inputs, then both lanes at once
          const FBPair& pair = pairs[rank][size_t(pair_at[rank][next[rank]])];
          const Action &f = list[size_t(pair.forward)], &b = list[size_t(pair.backward)], &w = list[size_t(pair.weight)];
          const double ready_f = ready_at(rank, f), ready_b = ready_at(rank, b);
          if (ready_f < 0 || ready_b < 0) break;
          const int i = per == v ? f.chunk : virtual_stage(shape, rank, f.chunk);
          const double start = std::max({clock[rank], ready_f, ready_b}), cost = costs.pair[size_t(i)];
          clock[rank] = start + cost;
          computed[rank] += cost;
          // Drawn as two lanes over the pair's time: the forward, and B then W in their proportion.
          const double backward = cost_of(rank, b), weight = cost_of(rank, w);
          const double b_end = backward + weight > 0 ? start + cost * backward / (backward + weight) : clock[rank];
          ran[rank].push_back({rank, f, start, clock[rank]});
          ran[rank].push_back({rank, b, start, b_end});
          ran[rank].push_back({rank, w, b_end, clock[rank]});
          for (const Action* x : {&f, &b, &w}) done(x->op, virtual_stage(shape, rank, x->chunk), x->micro) = clock[rank];
          ran_in_pair[rank][size_t(pair.backward)] = ran_in_pair[rank][size_t(pair.weight)] = true;
          next[rank]++;
          progressed = true;
          continue;
        }
        double ready = ready_at(rank, a);
        if (ready < 0) break;
        double start = std::max(clock[rank], ready), cost = cost_of(rank, a);
        if (a.op != Op::F && a.op != Op::B && a.op != Op::W) start = clock[rank];  // no time, no wait
        clock[rank] = start + cost;
        computed[rank] += cost;
        done(a.op, virtual_stage(shape, rank, a.chunk), a.micro) = clock[rank];
        ran[rank].push_back({rank, a, start, clock[rank]});
        next[rank]++;
        progressed = true;
      }
    }
  }

  Simulation sim;
  for (int rank = 0; rank < p; rank++) {
    sim.actions.insert(sim.actions.end(), ran[rank].begin(), ran[rank].end());
    sim.makespan = std::max(sim.makespan, clock[rank]);
  }
  for (int rank = 0; rank < p; rank++) sim.idle.push_back(sim.makespan - computed[rank]);

  for (int rank = 0; rank < p; rank++) {
    if (next[rank] == per_rank[rank].size()) continue;
    const Action& a = per_rank[rank][next[rank]];
    const int s = virtual_stage(shape, rank, a.chunk);
    std::string reason = "rank " + std::to_string(rank) + " waits at " + describe(a) + " for ";
    auto from_neighbour = [&](Op posted, Op sent, int from) {
      if (done(posted, s, a.micro) < 0) return describe({posted, a.micro, a.chunk}) + ", which it has not posted";
      return describe({sent, a.micro, chunk_of_stage(shape, from)}) + " of rank " +
             std::to_string(rank_of_stage(shape, from));
    };
    auto own = [&](Op op) { return "its own " + describe({op, a.micro, a.chunk}) + ", which has not run"; };
    switch (a.op) {
      case Op::F: reason += from_neighbour(Op::RecvActivation, Op::SendActivation, s - 1); break;
      case Op::B:
        reason += s == stages - 1 ? own(Op::F) : from_neighbour(Op::RecvGradient, Op::SendGradient, s + 1);
        break;
      case Op::W:
      case Op::SendGradient: reason += own(Op::B); break;
      case Op::SendActivation: reason += own(Op::F); break;
      case Op::RecvActivation:
      case Op::RecvGradient: break;  // never wait
    }
    sim.deadlock += (sim.deadlock.empty() ? "" : "; ") + reason;
  }
  return sim;
}

namespace {

// The call-order model (simulate()'s comment). Each rank has two lanes: its passes in list order,
// and its message groups in list order. A message's partner is found by counting, as NCCL matches.
// A message between two chunks of one rank is a copy, as the executor makes it: in no group, made
// on the compute lane where its send is listed, and so before the pass that reads it or never.
Simulation simulate_call_order(const PipelineShape& shape, const ActionCosts& costs,
                               const std::vector<std::vector<Action>>& per_rank) {
  const int p = shape.stages, v = shape.chunks;
  ENSURE(int(per_rank.size()) == p, "simulate: one list per rank");
  const int per = int(costs.forward.size());
  ENSURE((per == v || per == shape.virtual_stages()) && int(costs.backward.size()) == per,
         "simulate: a cost per chunk or per virtual stage");
  auto cost_of = [&](int rank, const Action& a) { return action_cost(shape, costs, rank, a); };
  auto is_copy = [&](int rank, const Action& a) { return !is_pass(a.op) && message_of(shape, rank, a).peer == rank; };

  // Per rank and action: its group (messages), the partner (rank, group) of each message, and the
  // group holding each pass's receive.
  struct Lane {
    std::vector<std::vector<int>> groups;  // positions in the list of each group's messages
    std::vector<int> group_of;             // per action, -1 for passes and copies
    std::vector<double> group_start, group_end;
    std::vector<double> pass_end;  // per action, -1 until run
    size_t next_pass = 0;
    size_t next_group = 0;
    double compute_clock = 0, computed = 0;
    std::vector<SimulatedAction> ran;
  };
  std::vector<Lane> lanes(p);
  for (int rank = 0; rank < p; rank++) {
    Lane& lane = lanes[rank];
    const std::vector<Action>& list = per_rank[rank];
    lane.group_of.assign(list.size(), -1);
    for (const auto& [first, last] : message_groups(list)) {
      std::vector<int> group;
      for (int i = first; i <= last; i++)
        if (!is_copy(rank, list[i])) group.push_back(i);
      if (group.empty()) continue;  // copies only: nothing goes out
      for (int i : group) lane.group_of[i] = int(lane.groups.size());
      lane.groups.push_back(group);
    }
    lane.group_start.assign(lane.groups.size(), -1.0);
    lane.group_end.assign(lane.groups.size(), -1.0);
    lane.pass_end.assign(list.size(), -1.0);
  }
  const CallOrder order = call_order(shape, per_rank);
  // partner[rank][i]: (peer, its group) of the message at position i; (-1, -1) if it has none.
  std::vector<std::vector<std::pair<int, int>>> partner(p);
  for (int rank = 0; rank < p; rank++) partner[rank].assign(per_rank[rank].size(), {-1, -1});
  for (int rank = 0; rank < p; rank++) {
    for (int peer = 0; peer < p; peer++) {
      if (peer == rank) continue;  // copies
      const std::vector<int>&out = order.sends[rank][peer], &in = order.receives[peer][rank];
      for (size_t k = 0; k < out.size() && k < in.size(); k++) {
        partner[rank][out[k]] = {peer, lanes[peer].group_of[in[k]]};
        partner[peer][in[k]] = {rank, lanes[rank].group_of[out[k]]};
      }
    }
  }
  // The group a pass at position i waits for: its receive's (the latest receive of its data before
  // it); kNoGroup when it receives nothing, or its data is a copy whose send comes before it on the
  // same lane; kNever when what it needs is not before it.
  constexpr int kNoGroup = -1, kNever = -2;
  auto group_needed = [&](int rank, int i) -> int {
    const Action& pass = per_rank[rank][i];
    const int s = virtual_stage(shape, rank, pass.chunk);
    const bool receives_data = (pass.op == Op::F && s > 0) || (pass.op == Op::B && s < shape.virtual_stages() - 1);
    if (!receives_data) return kNoGroup;
    const Op wanted = pass.op == Op::F ? Op::RecvActivation : Op::RecvGradient;
    if (rank_of_stage(shape, pass.op == Op::F ? s - 1 : s + 1) == rank) {  // a copy from this rank's other chunk
      const Op sent = pass.op == Op::F ? Op::SendActivation : Op::SendGradient;
      const int from = chunk_of_stage(shape, pass.op == Op::F ? s - 1 : s + 1);
      for (int j = i - 1; j >= 0; j--)
        if (per_rank[rank][j] == Action{sent, pass.micro, from}) return kNoGroup;
      return kNever;
    }
    for (int j = i - 1; j >= 0; j--) {
      const Action& a = per_rank[rank][j];
      if (a.op == wanted && a.micro == pass.micro && a.chunk == pass.chunk) return lanes[rank].group_of[j];
    }
    return kNever;
  };

  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int rank = 0; rank < p; rank++) {
      Lane& lane = lanes[rank];
      const std::vector<Action>& list = per_rank[rank];
      // The message lane.
      while (lane.next_group < lane.groups.size()) {
        const size_t g = lane.next_group;
        const std::vector<int>& group = lane.groups[g];
        if (lane.group_start[g] < 0) {
          double start = g > 0 ? lane.group_end[g - 1] : 0;
          bool passes_done = true;
          for (int i = group.front() - 1; i >= 0 && passes_done; i--)
            if (is_pass(list[i].op)) {  // the last pass before it ends after every earlier one
              passes_done = lane.pass_end[i] >= 0;
              start = std::max(start, lane.pass_end[i]);
              break;
            }
          if (!passes_done) break;
          lane.group_start[g] = start;
          progressed = true;
        }
        double end = lane.group_start[g];
        bool partners_started = true;
        for (int i : group) {
          const auto [peer, partner_group] = partner[rank][i];
          if (peer < 0 || lanes[peer].group_start[partner_group] < 0) {
            partners_started = false;
            break;
          }
          end = std::max(end, lanes[peer].group_start[partner_group]);
        }
        if (!partners_started) break;
        lane.group_end[g] = end + costs.p2p;
        for (int i : group) lane.ran.push_back({rank, list[i], lane.group_start[g], lane.group_start[g]});
        lane.next_group++;
        progressed = true;
      }
      // The compute lane.
      while (lane.next_pass < list.size()) {
        const size_t i = lane.next_pass;
        const Action& a = list[i];
        if (!is_pass(a.op)) {
          if (is_copy(rank, a)) lane.ran.push_back({rank, a, lane.compute_clock, lane.compute_clock});
          lane.next_pass++;
          continue;
        }
        const int group = group_needed(rank, int(i));
        if (group == kNever || (group >= 0 && lane.group_end[group] < 0)) break;
        const double ready = group >= 0 ? lane.group_end[group] : 0;
        const double start = std::max(lane.compute_clock, ready), cost = cost_of(rank, a);
        lane.compute_clock = start + cost;
        lane.computed += cost;
        lane.pass_end[i] = lane.compute_clock;
        lane.ran.push_back({rank, a, start, lane.compute_clock});
        lane.next_pass++;
        progressed = true;
      }
    }
  }

  Simulation sim;
  for (int rank = 0; rank < p; rank++) {
    sim.actions.insert(sim.actions.end(), lanes[rank].ran.begin(), lanes[rank].ran.end());
    sim.makespan = std::max(sim.makespan, lanes[rank].compute_clock);
    if (!lanes[rank].group_end.empty()) sim.makespan = std::max(sim.makespan, lanes[rank].group_end.back());
  }
  for (int rank = 0; rank < p; rank++) sim.idle.push_back(sim.makespan - lanes[rank].computed);
  auto describe_group = [&](int rank, const std::vector<int>& group) {
    std::vector<Action> actions;
    for (int i : group) actions.push_back(per_rank[rank][i]);
    return "rank " + std::to_string(rank) + "'s group [" + describe(actions) + "]";
  };
  for (int rank = 0; rank < p; rank++) {
    const Lane& lane = lanes[rank];
    std::string reason;
    if (lane.next_pass < per_rank[rank].size() && group_needed(rank, int(lane.next_pass)) == kNever) {
      // A copy listed after the pass that reads it (or a receive not listed before it): the pass
      // waits for itself, whatever the other ranks do.
      reason = "rank " + std::to_string(rank) + " waits at " + describe(per_rank[rank][lane.next_pass]) +
               " for data that nothing listed before it brings";
    } else if (lane.next_group < lane.groups.size()) {
      const std::vector<int>& group = lane.groups[lane.next_group];
      reason = describe_group(rank, group) + " ";
      if (lane.group_start[lane.next_group] < 0) {
        reason += "waits for its passes before it";
      } else {
        reason += "waits for";
        for (int i : group) {
          const auto [peer, g] = partner[rank][i];
          if (peer < 0) {
            reason += " a partner for " + describe(per_rank[rank][i]) + ", which no rank sends";
            break;
          }
          if (lanes[peer].group_start[g] < 0) {
            reason += " " + describe_group(peer, lanes[peer].groups[g]);
            break;
          }
        }
      }
    }
    if (!reason.empty()) sim.deadlock += (sim.deadlock.empty() ? "" : "; ") + reason;
  }
  return sim;
}

}  // namespace

double theory_bubble(Schedule schedule, const PipelineShape& shape, double forward, double backward,
                     double weight, double pair) {
  const double p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  switch (schedule) {
    case Schedule::AFAB:
    case Schedule::OneFOneB: return (p - 1) / (m + p - 1);
    case Schedule::Interleaved: return (p - 1) / (v * m + p - 1);
    case Schedule::ZBH1: {
      double idle = (p - 1) * (forward + backward) - std::min(m - 1, p - 1) * weight;
      return idle / (m * (forward + backward + weight) + idle);
    }
    case Schedule::ZBV: {
      // Per chunk costs; docs/theory.md, section 10, derives the idle time.
      const double idle = (p - 1) * std::max(backward, 2 * (backward - weight));
      return idle / (2 * m * (forward + backward + weight) + idle);
    }
    case Schedule::DualPipeV: {
      const double passes = forward + backward + weight;
      if (pair < 0) {
        // Pairs one pass after the other: the fill of the V's first arm, (p-1)F, which no order
        // avoids: exact when B <= F and B <= W; more otherwise, as simulated.
        const double idle = (p - 1) * forward;
        return idle / (2 * m * passes + idle);
      }
      // Pairs at once, each taking F&B = `pair` (docs/theory.md, section 10): rank r runs
      // 2m - 3p + r + 1 of them, so it computes that many times F+B+W - F&B less than rank 0, and idles
      // as much more; rank 0 idles 2(p-1)(F&B - B - W). Exact where B <= F, B <= W and
      // max(F, B+W) <= F&B <= F+B+W; a floor otherwise.
      const double saved = passes - pair, first = 2 * (p - 1) * std::max(0.0, pair - backward - weight);
      const double step = 2 * m * passes - (2 * m - 3 * p + 1) * saved + first;
      return (first + (p - 1) / 2 * saved) / step;
    }
  }
  return 0;
}

std::string theory_bubble_formula(Schedule schedule, bool overlapped) {
  switch (schedule) {
    case Schedule::AFAB:
    case Schedule::OneFOneB: return "(p-1)/(m+p-1)";
    case Schedule::Interleaved: return "(p-1)/(v*m+p-1)";
    case Schedule::ZBH1: return "(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W))";
    case Schedule::ZBV: return "(p-1)max(B,2(B-W))/(2m(F+B+W)+(p-1)max(B,2(B-W)))";
    case Schedule::DualPipeV:
      return overlapped ? "idle of rank r 2(p-1)(F&B-B-W)+r(F+B+W-F&B), mean over r / step (at least)"
                        : "(p-1)F/(2m(F+B+W)+(p-1)F) (at least)";
  }
  return "";
}

// Interleaved's activation slots, from its order. Forward number n of the rank is micro-batch
// (n / (p v)) p + n % p of chunk (n / p) % v, and backward number n the same micro-batch of chunk
// v-1 - (n / p) % v. So micro-batch j of chunk c is
//   forward number  (j / p) p v + c p + j % p,   backward number  (j / p) p v + (v-1-c) p + j % p:
// its backward number is its forward number + (v-1-2c) p, for every j. Past the warm-up of w
// forwards the rank runs forward number n, then backward number n - w; so micro-batch j is held
// from its forward until forward number (its backward number) + w has run: a window of
//   L = (v-1-2c) p + w + 1   consecutive forwards, the same for every micro-batch of the chunk
// (with Megatron-LM's w = 2(p-1-r) + (v-1) p: L = 2(v-1-c) p + 2(p-r) - 1). The most the chunk
// holds at once is the most of its forwards that fit in L consecutive ones. They come in runs of p
// every p v, so a window starting at a run holds q p + min(p, L - q p v) of them, q = L / (p v);
// never more than the m there are. When the warm-up is every forward (w = m v), all m are held.
// Summed over its chunks, rank 0 holds at most w + 1 = (v+1) p - 1 chunks' activations, each chunk
// 1/v of the rank's layers: (1 + (p-1)/(p v)) times 1f1b's p micro-batches, the price of the smaller
// bubble (Narayanan et al. 2021). The chunks' peaks do not all come at once, so the slots above add
// up to a little more.
// ZB-V's, from its order: chunk 0 of rank r runs 2(p-r)-1 forwards, then r more alternating with chunk
// 1's, before its first B and W (which come together in the steady state): it holds 2p-r-1, and the
// steady state's F before its B, W makes 2p-r. Chunk 1 holds its r warm-up forwards and the one whose
// B and W follow at once: r+1. Never more than the m there are. Every rank holds 2p+1 chunks'
// activations, half a rank's layers each: p + 1/2 micro-batches of the rank's, where 1f1b's rank 0
// holds p (about the paper's "same memory as 1F1B"), and every rank alike, where 1f1b's rank p-1
// holds 1. DualPipeV's order holds the same (its warm-up is ZB-V's).
int theory_in_flight(Schedule schedule, const PipelineShape& shape, int rank, int chunk) {
  ENSURE(schedule_shape_error(schedule, shape).empty(), schedule_shape_error(schedule, shape));
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  ENSURE(rank >= 0 && rank < p && chunk >= 0 && chunk < v, "theory_in_flight: rank or chunk outside the shape");
  switch (schedule) {
    case Schedule::AFAB: return m;
    case Schedule::OneFOneB: return std::min(p - rank, m);
    case Schedule::ZBH1: return std::min(p, m);
    case Schedule::ZBV:
    case Schedule::DualPipeV: return std::min(m, chunk == 0 ? 2 * p - rank : rank + 1);
    case Schedule::Interleaved: {
      const int warmup = interleaved_warmup(shape, rank);
      if (warmup == m * v) return m;
      const int window = (v - 1 - 2 * chunk) * p + warmup + 1;
      const int runs = window / (p * v);
      return std::min(m, runs * p + std::min(p, window - runs * p * v));
    }
  }
  return 0;
}
