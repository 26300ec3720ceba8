// pipeline_schedule.cpp: see pipeline_schedule.h. The six builders, each written like its diagram
// (warm-up, steady state, cool-down), the V's call-order lists from its timeline, then the checker,
// the simulator and the theory.
#include "pipeline_schedule.h"

#include <algorithm>

#include "check.h"  // ENSURE

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

// Megatron-LM's warm-up count for rank r: (v-1)p forwards, the chunks before the last for the first p
// micro-batches, so that the last chunk's first micro-batch is under way; then 2 per rank after this
// one, where 1f1b has 1: a forward for each hop of micro-batch 0's last chunk down to rank p-1 and
// one for each hop of its gradient back. The simulator shows why it is worth the memory: with 1 per
// rank the step is as short while messages take no time, and longer as soon as they do (the extra
// forwards hide the p2p time of the round trip). Megatron-LM also runs every forward first when
// m == p (all_warmup_microbatches); with every receive posted up front nothing here needs that,
// and the simulator shows the same step time with fewer activations held on the last ranks.
int interleaved_warmup(const PipelineShape& shape, int rank) {
  const int p = shape.stages, v = shape.chunks;
  return std::min(2 * (p - 1 - rank) + (v - 1) * p, shape.micro_batches * v);
}

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

constexpr int kOps = 7;  // the members of Op

bool is_pass(Op op) { return op == Op::F || op == Op::B || op == Op::W; }

// The time an action takes: its pass's cost for its chunk (every rank alike) or its virtual stage
// (each its own, as measured); sends and receives none.
double action_cost(const PipelineShape& shape, const ActionCosts& costs, int rank, const Action& a) {
  const int i = int(costs.forward.size()) == shape.chunks ? a.chunk : virtual_stage(shape, rank, a.chunk);
  if (a.op == Op::F) return costs.forward[i];
  if (a.op == Op::B) return costs.backward[i];
  if (a.op == Op::W) return costs.weight.empty() ? 0 : costs.weight[i];
  return 0;
}

// A send or receive of `rank`: the rank at the other end, and the message named by the action that
// receives it (a send of virtual stage s's output is recvA on s+1; of its input's gradient, recvG on
// s-1), so that both ends of one message have the same name.
struct Message {
  int peer;
  Action as_received;
};
Message message_of(const PipelineShape& shape, int rank, const Action& a) {
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

namespace {

// The sends and receives of every pair of ranks in call order, as positions in the lists:
// sends[a][b][k] is the k-th send from rank a to rank b, receives[b][a][k] the k-th receive at b from
// a. NCCL pairs exactly these two.
struct CallOrder {
  std::vector<std::vector<std::vector<int>>> sends, receives;
};
CallOrder call_order(const PipelineShape& shape, const std::vector<std::vector<Action>>& per_rank) {
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
