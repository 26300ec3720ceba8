// pipeline_schedule.cpp: see pipeline_schedule.h. The names and shapes of the schedules, the
// placement of their virtual stages, and the six builders, each written like its diagram (warm-up,
// steady state, cool-down), then the V's call-order lists from its timeline. What a list's messages
// are and whether all ranks' lists are sound together: pipeline_check.cpp; the simulator and the
// theory: pipeline_simulate.cpp.
#include "schedule/pipeline_schedule.h"

#include <algorithm>

#include "base/check.h"  // ENSURE
#include "schedule/pipeline_schedule_internal.h"
#include "schedule/pipeline_simulate.h"  // call_order_from_timeline simulates the lists

using namespace pipeline_internal;

namespace {

struct ScheduleName {
  Schedule schedule;
  const char* name;
};
const ScheduleName kScheduleNames[] = {
    {Schedule::AFAB, "afab"},
    {Schedule::OneFOneB, "1f1b"},
    {Schedule::Interleaved, "interleaved"},
    {Schedule::ZBH1, "zb-h1"},
    {Schedule::ZBV, "zb-v"},
    {Schedule::DualPipeV, "dualpipev"},
};

}  // namespace

bool parse_schedule(const std::string& name, Schedule* out) {
  for (const ScheduleName& entry : kScheduleNames) {
    if (name == entry.name) {
      *out = entry.schedule;
      return true;
    }
  }
  return false;
}

const char* schedule_name(Schedule schedule) {
  for (const ScheduleName& entry : kScheduleNames)
    if (entry.schedule == schedule) return entry.name;
  return "?";
}

std::string schedule_names() {
  std::string names;
  for (const ScheduleName& entry : kScheduleNames) names += std::string(names.empty() ? "" : ", ") + entry.name;
  return names;
}

Placement placement_of(Schedule schedule) {
  return schedule == Schedule::ZBV || schedule == Schedule::DualPipeV ? Placement::V : Placement::Loop;
}

bool splits_backward(Schedule schedule) {
  return schedule == Schedule::ZBH1 || schedule == Schedule::ZBV || schedule == Schedule::DualPipeV;
}

const char* matching_name(Matching matching) { return matching == Matching::ByTag ? "tag" : "call-order"; }

bool parse_matching(const std::string& name, Matching* out) {
  for (Matching m : {Matching::ByTag, Matching::ByCallOrder}) {
    if (name == matching_name(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

std::string schedule_shape_error(Schedule schedule, const PipelineShape& shape) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  if (p < 1) return "the pipeline needs at least 1 stage, not " + std::to_string(p);
  if (m < 1) return "a step needs at least 1 micro-batch, not " + std::to_string(m);
  if (shape.placement != placement_of(schedule))
    return std::string(schedule_name(schedule)) + " places its virtual stages " +
           (placement_of(schedule) == Placement::V ? "in a V" : "round-robin") + ", but the shape has them " +
           (shape.placement == Placement::V ? "in a V" : "round-robin");
  if (placement_of(schedule) == Placement::V && v != 2)
    return std::string(schedule_name(schedule)) + " runs 2 chunks per rank, the two arms of its V, not " +
           std::to_string(v);
  if (schedule == Schedule::ZBV) return "";
  if (schedule == Schedule::DualPipeV) {
    // Its warm-up fills the V with 2p micro-batches' forwards before the first pair (DualPipe's own
    // requirement, num_chunks >= 2 num_ranks).
    if (m < 2 * p)
      return "dualpipev needs at least 2 x the stages (" + std::to_string(2 * p) + ") micro-batches, not " +
             std::to_string(m);
    return "";
  }
  if (schedule != Schedule::Interleaved) {
    if (v != 1)
      return std::string(schedule_name(schedule)) + " runs one chunk per rank, not " + std::to_string(v) +
             ": use the interleaved schedule for more";
    return "";
  }
  if (v < 2)
    return "interleaved needs at least 2 chunks per rank, not " + std::to_string(v) +
           " (with one chunk, use 1f1b)";
  if (m % p != 0) {
    // Its order takes the micro-batches p at a time through each chunk.
    int below = m / p * p, above = below + p;
    return "interleaved needs the micro-batches (" + std::to_string(m) + ") to be a multiple of the stages (" +
           std::to_string(p) + "): use " + (below > 0 ? std::to_string(below) + " or " : std::string()) +
           std::to_string(above);
  }
  return "";
}

int virtual_stage(const PipelineShape& shape, int rank, int chunk) {
  if (shape.placement == Placement::V) return chunk == 0 ? rank : 2 * shape.stages - 1 - rank;
  return chunk * shape.stages + rank;
}

int rank_of_stage(const PipelineShape& shape, int stage) {
  const int p = shape.stages;
  if (shape.placement == Placement::V) return stage < p ? stage : 2 * p - 1 - stage;
  return stage % p;
}

int chunk_of_stage(const PipelineShape& shape, int stage) {
  if (shape.placement == Placement::V) return stage < shape.stages ? 0 : 1;
  return stage / shape.stages;
}

namespace {

// One rank's list as a builder writes it: forward() and backward() append the pass and then the
// send of what it produced; finish() places the receive of every pass that needs one: at the start
// of the list, in the order the passes consume them (ByTag), or right before its pass (ByCallOrder;
// a V's call-order lists are placed from its timeline instead, call_order_from_timeline).
class RankList {
 public:
  RankList(const PipelineShape& shape, int rank) : shape_(shape), rank_(rank) {}

  void forward(int micro, int chunk) {
    pass({Op::F, micro, chunk});
    if (!is_last_stage(chunk)) entries_.push_back({{Op::SendActivation, micro, chunk}});
  }
  // Under zb-h1 the input gradient only: the next rank down waits for it, not for the weights'.
  void backward(int micro, int chunk) {
    pass({Op::B, micro, chunk});
    if (!is_first_stage(chunk)) entries_.push_back({{Op::SendGradient, micro, chunk}});
  }
  void weight(int micro, int chunk) { pass({Op::W, micro, chunk}); }
  // A forward and a backward with their messages in one group after both (Megatron-LM's steady
  // state under call order): both sends, and the receives of the next pair, which finish() then
  // places before the next pair's forward.
  void forward_backward(Action f, Action b) {
    pass(f);
    pass(b, /*receive_with_previous=*/true);
    if (!is_last_stage(f.chunk)) entries_.push_back({{Op::SendActivation, f.micro, f.chunk}});
    if (!is_first_stage(b.chunk)) entries_.push_back({{Op::SendGradient, b.micro, b.chunk}});
  }

  std::vector<Action> finish(Matching matching) const {
    std::vector<Action> receives, list;
    for (size_t i = 0; i < entries_.size(); i++) {
      const Entry& e = entries_[i];
      std::vector<Action>& into = matching == Matching::ByTag ? receives : list;
      if (e.action.op == Op::F || e.action.op == Op::B) {
        if (!e.receive_with_previous) add_receive(e.action, &into);
        // The next pass's receive, if it goes with this one's.
        if (i + 1 < entries_.size() && entries_[i + 1].receive_with_previous) add_receive(entries_[i + 1].action, &into);
      }
      list.push_back(e.action);
    }
    list.insert(list.begin(), receives.begin(), receives.end());
    return list;
  }

 private:
  struct Entry {
    Action action;
    bool receive_with_previous = false;  // its receive goes before the pass before it
  };
  void pass(Action a, bool receive_with_previous = false) { entries_.push_back({a, receive_with_previous}); }
  void add_receive(const Action& pass, std::vector<Action>* into) const {
    if (pass.op == Op::F && !is_first_stage(pass.chunk)) into->push_back({Op::RecvActivation, pass.micro, pass.chunk});
    if (pass.op == Op::B && !is_last_stage(pass.chunk)) into->push_back({Op::RecvGradient, pass.micro, pass.chunk});
  }
  bool is_first_stage(int chunk) const { return virtual_stage(shape_, rank_, chunk) == 0; }
  bool is_last_stage(int chunk) const {
    return virtual_stage(shape_, rank_, chunk) == shape_.virtual_stages() - 1;
  }

  PipelineShape shape_;
  int rank_;
  std::vector<Entry> entries_;
};

// GPipe (Huang et al. 2019): every micro-batch's forward, then every backward, in the order 0..m-1
// as GPipe and Megatron-LM run them. Simple, and the rank holds all m micro-batches' activations.
std::vector<Action> build_afab(const PipelineShape& shape, int rank, Matching matching) {
  RankList list(shape, rank);
  const int m = shape.micro_batches;
  for (int micro = 0; micro < m; micro++) list.forward(micro, 0);
  for (int micro = 0; micro < m; micro++) list.backward(micro, 0);
  return list.finish(matching);
}

// PipeDream-Flush (Narayanan et al. 2021), Megatron-LM's forward_backward_pipelining_without_
// interleaving. Rank r's first backward needs micro-batch 0 to pass the p-1-r ranks after it and its
// gradient to come back: the warm-up fills that wait with p-1-r forwards. Then each backward frees
// the activations the forward before it took, so the rank never holds more than p-r micro-batches,
// where afab holds m: same bubble, memory bounded by the pipeline's depth instead of the batch.
std::vector<Action> build_1f1b(const PipelineShape& shape, int rank, Matching matching) {
  RankList list(shape, rank);
  const int p = shape.stages, m = shape.micro_batches;
  const int warmup = std::min(p - 1 - rank, m);
  int next_forward = 0, next_backward = 0;
  for (int i = 0; i < warmup; i++) list.forward(next_forward++, 0);
  while (next_forward < m) {  // steady state: one forward, one backward
    list.forward(next_forward++, 0);
    list.backward(next_backward++, 0);
  }
  while (next_backward < m) list.backward(next_backward++, 0);  // cool-down
  return list.finish(matching);
}

// Interleaved: the rank's forwards, numbered k = 0 .. m v - 1 ("virtual micro-batches"), take the
// micro-batches p at a time through each chunk in turn. Backwards run the same order with the chunks
// reversed, since the gradient comes out of the last chunk first.
Action interleaved_forward(const PipelineShape& shape, int k) {
  const int p = shape.stages, v = shape.chunks;
  return {Op::F, k / (p * v) * p + k % p, k / p % v};
}
Action interleaved_backward(const PipelineShape& shape, int k) {
  Action forward = interleaved_forward(shape, k);
  return {Op::B, forward.micro, shape.chunks - 1 - forward.chunk};
}

}  // namespace

// Megatron-LM's warm-up count for rank r: (v-1)p forwards, the chunks before the last for the first p
// micro-batches, so that the last chunk's first micro-batch is under way; then 2 per rank after this
// one, where 1f1b has 1: a forward for each hop of micro-batch 0's last chunk down to rank p-1 and
// one for each hop of its gradient back. The simulator shows why it is worth the memory: with 1 per
// rank the step is as short while messages take no time, and longer as soon as they do (the extra
// forwards hide the p2p time of the round trip). Megatron-LM also runs every forward first when
// m == p (all_warmup_microbatches); with every receive posted up front nothing here needs that,
// and the simulator shows the same step time with fewer activations held on the last ranks.
int pipeline_internal::interleaved_warmup(const PipelineShape& shape, int rank) {
  const int p = shape.stages, v = shape.chunks;
  return std::min(2 * (p - 1 - rank) + (v - 1) * p, shape.micro_batches * v);
}

namespace {

// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM"; forward_backward_pipelining_with_interleaving). Each
// rank holds v chunks of layers, so a micro-batch crosses the pipeline v times, each time in 1/v of
// the time: the fill and drain shrink by v, and the bubble with them, for v times the messages.
std::vector<Action> build_interleaved(const PipelineShape& shape, int rank, Matching matching) {
  RankList list(shape, rank);
  const int total = shape.micro_batches * shape.chunks;
  const int warmup = interleaved_warmup(shape, rank);
  auto forward = [&](int k) {
    Action f = interleaved_forward(shape, k);
    list.forward(f.micro, f.chunk);
  };
  auto backward = [&](int k) {
    Action b = interleaved_backward(shape, k);
    list.backward(b.micro, b.chunk);
  };
  for (int k = 0; k < warmup; k++) forward(k);
  for (int k = warmup; k < total; k++) {  // steady state: one forward, one backward
    if (matching == Matching::ByCallOrder) {
      // Each pass's messages in their own group would leave every rank's gradient send waiting for
      // a neighbour whose own send waits in turn, round the ring (check_pipeline finds the cycle):
      // the pair's four messages go in one group, as Megatron-LM sends them.
      list.forward_backward(interleaved_forward(shape, k), interleaved_backward(shape, k - warmup));
      continue;
    }
    forward(k);
    backward(k - warmup);
  }
  for (int k = total - warmup; k < total; k++) backward(k);  // cool-down
  return list.finish(matching);
}

// Zero Bubble's handcrafted ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, figure
// 3; the order of sail-sg/zero-bubble-pipeline-parallelism's ZeroBubbleH1Pipeline with exact
// semantics). The backward splits into B, the input gradient that the rank before waits for, and W,
// the weight gradient that nobody waits for. 1f1b's warm-up; then rank r runs its first r steady
// rounds without their W, so that its gradients reach the rank before it sooner; the r W's it owes
// run later, in time that 1f1b leaves idle (the cool-down's waits, the end of the step). Bubble per rank
// (p-1)(F+B-W) instead of 1f1b's (p-1)(F+B+W). A micro-batch's activations are freed by its W, so
// rank r holds up to p micro-batches, r of them awaiting only their W (the p-r others whole, as
// 1f1b): ZB-H1's peak memory is at most 1f1b's peak, rank 0's.
std::vector<Action> build_zb_h1(const PipelineShape& shape, int rank, Matching matching) {
  RankList list(shape, rank);
  const int p = shape.stages, m = shape.micro_batches;
  const int warmup = std::min(p - 1 - rank, m);
  int next_forward = 0, next_backward = 0, next_weight = 0;
  for (int i = 0; i < warmup; i++) list.forward(next_forward++, 0);
  for (int i = 0; i < rank && next_forward < m; i++) {  // steady, W held back
    list.forward(next_forward++, 0);
    list.backward(next_backward++, 0);
  }
  while (next_forward < m) {  // steady: one forward, one backward, one (the oldest) weight gradient
    list.forward(next_forward++, 0);
    list.backward(next_backward++, 0);
    list.weight(next_weight++, 0);
  }
  while (next_backward < m) {  // cool-down: the held-back W's fill the waits for gradients
    list.backward(next_backward++, 0);
    list.weight(next_weight++, 0);
  }
  while (next_weight < m) list.weight(next_weight++, 0);
  return list.finish(matching);
}

// Zero Bubble's ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 6; the
// order of PyTorch's ScheduleZBVZeroBubble). Two chunks a rank in a V (pipeline_schedule.h): a
// micro-batch goes down the ranks through chunk 0, turns at rank p-1 without a message, and comes
// back up through chunk 1 to the loss on rank 0. Rank r's first chunk-1 forward can start once
// micro-batch 0 has gone down and come back up to it, 2(p-1-r)+1 chunk forwards after its own first:
// the warm-up fills that with chunk-0 forwards, then alternates the two chunks while the first
// gradients are on their way, then runs each chunk-1 forward with its B and W, which the rank
// itself can start (the loss's rank at once, the others as gradients come back up the V). The
// steady state runs one F, B and W of each chunk in turn; the cool-down runs the B's that the rank
// before waits for first, and the W's nobody waits for last, in the time the drain leaves idle.
// Written for at least 2p-1 micro-batches (rank 0's warm-up); with fewer, the passes of the ones
// missing are left out, which keeps the list sound: a pass waits only for passes of its own
// micro-batch.
std::vector<Action> build_zb_v(const PipelineShape& shape, int rank, Matching matching) {
  RankList list(shape, rank);
  const int p = shape.stages, m = shape.micro_batches, n = std::max(m, 2 * p - 1);
  int forwards[2] = {0, 0}, backwards[2] = {0, 0}, weights[2] = {0, 0};  // per chunk: the next micro-batch
  auto F = [&](int chunk) {
    if (forwards[chunk] < m) list.forward(forwards[chunk], chunk);
    forwards[chunk]++;
  };
  auto B = [&](int chunk) {
    if (backwards[chunk] < m) list.backward(backwards[chunk], chunk);
    backwards[chunk]++;
  };
  auto W = [&](int chunk) {
    if (weights[chunk] < m) list.weight(weights[chunk], chunk);
    weights[chunk]++;
  };
  for (int i = 0; i < 2 * (p - rank) - 1; i++) F(0);  // warm-up: down the V
  for (int i = 0; i < rank; i++) F(1), F(0);
  for (int i = 0; i < p - rank; i++) F(1), B(1), W(1);
  while (forwards[1] < forwards[0] || forwards[0] < n) {  // steady state: each chunk's F, B, W
    if (forwards[0] < n) F(0);
    B(0), W(0);
    F(1), B(1), W(1);
  }
  for (int i = 0; i < rank; i++) B(0), B(1);  // cool-down: the B's first, the W's in the waits
  for (int i = 0; i < p - rank; i++) B(0), W(0);
  while (weights[1] < backwards[1]) W(1);
  while (weights[0] < backwards[0]) W(0);
  return list.finish(matching);
}

// DeepSeek's DualPipeV (DeepSeek-V3 technical report 2024; deepseek-ai/DualPipe's dualpipev.py, the
// "cut-in-half" DualPipe, the order written here from its eight steps): ZB-V's placement, with the
// steady state pairing the forward of one chunk with the whole backward of the other (F&B), so that
// one micro-batch's messages travel while the other computes. The list writes a pair as F, then B
// and W (fb_pairs finds them); the executor runs the two at once, on two lanes (lanes.h), unless
// --fb-overlap off or call order. The backward is whole (B then W) except where zero-bubble pays:
// in the fill (step 3) and the drain (steps 6, 7), B runs alone and its W waits in a queue, oldest
// first, for a later weight pass (DualPipe's WeightGradStore). m >= 2p.
std::vector<Action> build_dualpipev(const PipelineShape& shape, int rank, Matching matching) {
  RankList list(shape, rank);
  const int p = shape.stages, m = shape.micro_batches;
  int forwards[2] = {0, 0}, backwards[2] = {0, 0};  // per chunk: the next micro-batch
  std::vector<Action> waiting;                      // the weight passes held back, oldest first
  auto F = [&](int chunk) { list.forward(forwards[chunk]++, chunk); };
  auto B = [&](int chunk, bool hold_weight) {  // hold_weight: zero-bubble, W later
    const int micro = backwards[chunk]++;
    list.backward(micro, chunk);
    if (hold_weight) waiting.push_back({Op::W, micro, chunk});
    else list.weight(micro, chunk);
  };
  auto W = [&] {  // the oldest held weight pass
    list.weight(waiting.front().micro, waiting.front().chunk);
    waiting.erase(waiting.begin());
  };
  for (int i = 0; i < 2 * (p - 1 - rank); i++) F(0);           // 1: down the first arm
  for (int i = 0; i < rank + 1; i++) F(0), F(1);               // 2: both arms
  for (int i = 0; i < p - 1 - rank; i++) B(1, true), W(), F(1);  // 3: zero-bubble B, then its W
  for (int i = 0; i < m - 2 * p + rank + 1; i++) {             // 4: steady state, F&B pairs
    F(0), B(1, false);
    F(1), B(0, false);
  }
  for (int i = 0; i < p - 1 - rank; i++) B(1, false), F(1), B(0, false);  // 5: the last forwards
  const int half = (rank + 1) / 2;
  for (int i = 0; i < rank + 1; i++) {  // 6: both arms' backwards; the second half zero-bubble
    B(1, i > half || (i == half && rank % 2 == 1));
    B(0, i >= half);
  }
  for (int i = 0; i < p - 1 - rank; i++) W(), B(0, true);  // 7: a held W, then a zero-bubble B
  while (!waiting.empty()) W();                            // 8: the W's left
  return list.finish(matching);
}

std::vector<Action> call_order_from_timeline(Schedule schedule, const PipelineShape& shape, int rank);

}  // namespace

std::vector<Action> build_schedule(Schedule schedule, const PipelineShape& shape, int rank, Matching matching) {
  ENSURE(schedule_shape_error(schedule, shape).empty(), schedule_shape_error(schedule, shape));
  ENSURE(rank >= 0 && rank < shape.stages, "build_schedule: rank outside the pipeline");
  // A V's lists under call order come from the whole pipeline's timeline, not from one rank's order
  // of passes alone (call_order_from_timeline says why).
  if (matching == Matching::ByCallOrder && shape.placement == Placement::V && shape.stages > 1)
    return call_order_from_timeline(schedule, shape, rank);
  switch (schedule) {
    case Schedule::AFAB: return build_afab(shape, rank, matching);
    case Schedule::OneFOneB: return build_1f1b(shape, rank, matching);
    case Schedule::Interleaved: return build_interleaved(shape, rank, matching);
    case Schedule::ZBH1: return build_zb_h1(shape, rank, matching);
    case Schedule::ZBV: return build_zb_v(shape, rank, matching);
    case Schedule::DualPipeV: return build_dualpipev(shape, rank, matching);
  }
  return {};
}

std::string describe(const Action& action) {
  const char* name = "?";
  switch (action.op) {
    case Op::F: name = "F"; break;
    case Op::B: name = "B"; break;
    case Op::W: name = "W"; break;
    case Op::SendActivation: name = "sendA"; break;
    case Op::RecvActivation: name = "recvA"; break;
    case Op::SendGradient: name = "sendG"; break;
    case Op::RecvGradient: name = "recvG"; break;
  }
  return name + std::to_string(action.micro) + ".c" + std::to_string(action.chunk);
}

std::string describe(const std::vector<Action>& actions) {
  std::string text;
  for (const Action& action : actions) text += (text.empty() ? "" : " ") + describe(action);
  return text;
}

namespace {

// A V's lists under call order. Each receive right before its pass, as RankList places them, is not
// enough in a V: two neighbours exchange both ways within one phase (activations down one arm and
// gradients up the other, and back), so the two ends of a pair would call in different orders, and
// a group could wait for a call that its partner makes only after a group that waits in turn.
// Instead every message gets one place in one global order: its send's time in the schedule's
// timeline (the tag-matched lists simulated with F = B = W = 1, a whole backward 2; ties by sending
// rank, then by its list), and every rank calls its sends and receives in that order. The sends
// stay right after their passes; a receive goes into the gap after the last of its rank's passes
// that has ended by its send's time: it is posted while its sender computes it, so neither end's
// later calls queue behind it. Both ends of every pair then call in one order, so the k-th send
// meets the k-th receive, and no group waits forever: by induction over the global order, every
// group before a message's group, on either rank, holds earlier messages only, whose partner groups
// have started; every pass before it waits only for such groups; so both of the message's groups
// start, and then every group ends. With the timeline's costs the step is as long as by tag. A
// message between the two chunks of rank p-1 (the V's point) is a copy, in no group: its receive
// stays right before its pass. check_pipeline checks, for the shape at hand, that each receive
// finds a free buffer though it is posted early (the tests sweep p and m).
std::vector<Action> call_order_from_timeline(Schedule schedule, const PipelineShape& shape, int rank) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  std::vector<std::vector<Action>> by_tag;
  for (int r = 0; r < p; r++) by_tag.push_back(build_schedule(schedule, shape, r, Matching::ByTag));
  const bool split = splits_backward(schedule);
  const Simulation timeline = simulate(shape, uniform_costs(shape, 1, split ? 1 : 2, split ? 1 : 0), by_tag);
  ENSURE(timeline.deadlock.empty(), "call_order_from_timeline: the tag-matched lists deadlock: " + timeline.deadlock);

  // A message's place in the global order, found by the action that receives it on its rank.
  struct Place {
    double time = -1;
    int sender = 0, position = 0;
    bool operator<(const Place& o) const {
      return time != o.time ? time < o.time : sender != o.sender ? sender < o.sender : position < o.position;
    }
  };
  std::vector<Place> place_of(size_t(p) * 2 * v * m);
  auto place = [&](int receiver, const Action& received) -> Place& {
    return place_of[((size_t(receiver) * 2 + (received.op == Op::RecvGradient)) * v + received.chunk) * m +
                    received.micro];
  };
  std::vector<double> pass_end;  // this rank's, in list order
  for (size_t i = 0, position = 0; i < timeline.actions.size(); i++, position++) {
    const SimulatedAction& done = timeline.actions[i];
    if (i > 0 && timeline.actions[i - 1].rank != done.rank) position = 0;  // rank by rank, each in list order
    if (done.rank == rank && is_pass(done.action.op)) pass_end.push_back(done.end);
    if (done.action.op != Op::SendActivation && done.action.op != Op::SendGradient) continue;
    const Message message = message_of(shape, done.rank, done.action);
    place(message.peer, message.as_received) = {done.start, done.rank, int(position)};
  }

  // This rank's passes in order, and its messages, each in a gap: gap g is right before pass g, the
  // last one after every pass.
  struct Placed {
    Action action;
    Place place;
    int gap;
  };
  std::vector<Action> passes;
  std::vector<Placed> messages, copies_received;
  for (const Action& a : by_tag[rank]) {
    if (is_pass(a.op)) {
      passes.push_back(a);
      continue;
    }
    const Message message = message_of(shape, rank, a);
    if (a.op == Op::SendActivation || a.op == Op::SendGradient) {
      messages.push_back({a, place(message.peer, message.as_received), int(passes.size())});
      continue;
    }
    const Action consumer{a.op == Op::RecvActivation ? Op::F : Op::B, a.micro, a.chunk};
    const int before = int(std::find(by_tag[rank].begin(), by_tag[rank].end(), consumer) - by_tag[rank].begin());
    const int consumer_gap = int(std::count_if(by_tag[rank].begin(), by_tag[rank].begin() + before,
                                               [](const Action& b) { return is_pass(b.op); }));
    if (message.peer == rank) {
      copies_received.push_back({a, Place{}, consumer_gap});
      continue;
    }
    const Place sent = place(rank, a);
    const int gap = int(std::upper_bound(pass_end.begin(), pass_end.end(), sent.time) - pass_end.begin());
    // Its pass starts once the message has come, after every pass that ended before it was sent.
    ENSURE(sent.time >= 0 && gap <= consumer_gap, "call_order_from_timeline: " + describe(a) + " out of its timeline");
    messages.push_back({a, sent, gap});
  }
  std::sort(messages.begin(), messages.end(), [](const Placed& a, const Placed& b) { return a.place < b.place; });

  std::vector<Action> list;
  size_t next_message = 0;
  for (int gap = 0; gap <= int(passes.size()); gap++) {
    for (; next_message < messages.size() && messages[next_message].gap == gap; next_message++)
      list.push_back(messages[next_message].action);
    for (const Placed& copy : copies_received)
      if (copy.gap == gap) list.push_back(copy.action);
    if (gap < int(passes.size())) list.push_back(passes[gap]);
  }
  // In the global order, gap by gap: a message's gap never falls behind an earlier one's.
  ENSURE(next_message == messages.size(), "call_order_from_timeline: the gaps are out of the global order");
  return list;
}

}  // namespace
