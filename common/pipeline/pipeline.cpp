// pipeline.cpp: see pipeline.h.
#include "pipeline/pipeline.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "base/check.h"
#include "ops/device.h"
#include "ops/ops.h"
#include "comm/trace.h"
#include "comm/wire_p2p.h"  // the messages in the recipe's format (fp32: as they are)

double attention_flops_per_token(const GPT2Config& cfg) { return 4.0 * cfg.T * cfg.C; }

std::vector<double> unit_costs(const GPT2Config& cfg) {
  const double C = cfg.C, V = cfg.V;
  std::vector<double> costs(cfg.L + 2, 24 * C * C + attention_flops_per_token(cfg));
  costs.front() = 0;
  costs.back() = 2 * C * V;
  return costs;
}

std::vector<int> balanced_partition(const GPT2Config& cfg, int virtual_stages) {
  const int S = virtual_stages, L = cfg.L;
  ENSURE(S >= 1 && S <= L, "balanced_partition: every virtual stage needs a block");
  const std::vector<double> cost = unit_costs(cfg);
  // best[s][l]: the smallest possible costliest stage when stages 0..s-1 hold blocks 0..l-1; the
  // embedding's cost goes to stage 0, the head's to stage S-1. Small: S, L are tens at most.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(S + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= S; s++)
    for (int l = s; l <= L - (S - s); l++)
      for (int k = s - 1; k < l; k++) {  // stage s-1 holds blocks k..l-1
        double stage = 0;
        for (int b = k; b < l; b++) stage += cost[b + 1];
        if (s == 1) stage += cost.front();
        if (s == S) stage += cost.back();
        const double worst = std::max(best[s - 1][k], stage);
        if (worst < best[s][l]) best[s][l] = worst, cut[s][l] = k;
      }
  std::vector<int> blocks(S);
  for (int s = S, l = L; s >= 1; l = cut[s][l], s--) blocks[s - 1] = l - cut[s][l];
  return blocks;
}

std::vector<ModelPart> parts_of_rank(const GPT2Config& cfg, const std::vector<int>& blocks, int stages, int rank,
                                     Placement placement) {
  const int S = int(blocks.size()), chunks = S / stages;
  ENSURE(S % stages == 0, "parts_of_rank: the virtual stages do not divide over the stages");
  ENSURE(placement == Placement::Loop || chunks == 2, "parts_of_rank: a V has two chunks a rank");
  const PipelineShape shape{stages, 1, chunks, placement};
  std::vector<ModelPart> parts;
  for (int c = 0; c < chunks; c++) {
    const int s = virtual_stage(shape, rank, c);
    int first_block = 0;
    for (int i = 0; i < s; i++) first_block += blocks[i];
    ModelPart part;
    part.first_unit = s == 0 ? 0 : first_block + 1;  // block b is unit b + 1; stage 0 adds the embedding
    part.last_unit = s == S - 1 ? cfg.L + 1 : first_block + blocks[s];
    part.input_is_local = s > 0 && rank_of_stage(shape, s - 1) == rank;
    parts.push_back(part);
  }
  return parts;
}

bool tied_copies_equal(Communicator* embedding, Tensor params, const ParamLayout& layout) {
  if (!embedding) return true;
  const ParamInfo& wte = layout.params[layout.find("wte")];
  Buffer both(2 * wte.size, MemCategory::Other, params.dtype, Device::CPU);
  Tensor mine = both.view().slice1d(embedding->rank() * wte.size, wte.size);
  transfer(mine, params.slice1d(wte.offset, wte.size));
  embedding->all_gather(mine, both.view());
  const size_t bytes = size_t(wte.size) * dtype_size(params.dtype);
  return std::memcmp(both.data(), static_cast<char*>(both.data()) + bytes, bytes) == 0;
}

PipelineExecutor::PipelineExecutor(Communicator& pipeline, std::vector<GPT2*> chunks, const PipelineShape& shape,
                                   std::vector<Action> actions, Matching matching, int micro_B, int T, int C,
                                   Device device, DType dtype)
    : pipeline_(pipeline), chunks_(std::move(chunks)), shape_(shape), actions_(std::move(actions)),
      matching_(matching), micro_B_(micro_B), T_(T), C_(C), rank_(pipeline.rank()), device_(device), dtype_(dtype) {
  const int v = shape_.chunks, m = shape_.micro_batches, p = shape_.stages, last = p * v - 1;
  ENSURE(int(chunks_.size()) == v, "PipelineExecutor: one model per chunk");
  ENSURE(pipeline.size() == shape_.stages, "PipelineExecutor: the group is not the pipeline");
  ENSURE(matching_ != Matching::ByTag || largest_pipeline_tag(shape_) <= pipeline.largest_tag(),
         "PipelineExecutor: the schedule's tags pass the communicator's largest (pipeline_tag_problem)");
  activation_in_.resize(v), gradient_in_.resize(v), gradient_out_.resize(v);
  activation_recv_.assign(v, std::vector<CommHandle>(m));
  gradient_recv_.assign(v, std::vector<CommHandle>(m));
  slot_of_.assign(v, std::vector<int>(m, -1));
  free_slots_.resize(v);
  // A stage's stream holds B*T rows, or this rank's B*T/t of them under sequence parallelism (09).
  const TensorParallelism& tp = chunks_.front()->tensor_parallelism();
  rows_divisor_ = tp.size > 1 && tp.sequence_parallel ? tp.size : 1;
  const int64_t elements = int64_t(micro_B) * T * C / rows_divisor_;
  for (int c = 0; c < v; c++) {
    const int slots = chunks_[c]->part().slots;
    ENSURE(slots >= max_in_flight(actions_, c),
           "PipelineExecutor: chunk " + std::to_string(c) + " has fewer activation slots than the schedule needs");
    // As many buffers of each kind as activation slots: a micro-batch's message is received no
    // earlier than the schedule lets it into the chunk, and read by the pass that does.
    const int s = virtual_stage(shape_, rank_, c);
    // A gradient for a chunk of this rank (one stage; a V's turn) is copied straight into its buffer.
    const bool gradient_leaves = s > 0 && rank_of_stage(shape_, s - 1) != rank_;
    for (int i = 0; i < slots; i++) {
      if (s > 0) activation_in_[c].buffers.emplace_back(elements, MemCategory::CommBuffers, dtype, device);
      if (gradient_leaves) gradient_out_[c].buffers.emplace_back(elements, MemCategory::CommBuffers, dtype, device);
      if (s < last) gradient_in_[c].buffers.emplace_back(elements, MemCategory::CommBuffers, dtype, device);
    }
    for (MessageBuffers* kind : {&activation_in_[c], &gradient_in_[c], &gradient_out_[c]}) {
      kind->of_micro.assign(m, -1);
      kind->sent.resize(kind->buffers.size());
    }
  }
  // Under call order a pass's receive goes out in one group with the sends before it, which a pair
  // would hold back until both its passes are done: there the pairs run in sequence.
  if (matching_ == Matching::ByTag) pairs_ = fb_pairs(actions_);
  pair_at_.assign(actions_.size(), -1);
  for (int k = 0; k < int(pairs_.size()); k++) pair_at_[size_t(pairs_[size_t(k)].forward)] = k;
}

void PipelineExecutor::overlap_pairs(bool on) {
  // A GPU would need a compute stream per lane for the two passes to run at once; this executor
  // drives one.
  ENSURE(!on || device_ == Device::CPU, "PipelineExecutor: F&B pairs overlap on the CPU only");
  if (on && !lane_thread_) lane_thread_ = std::make_unique<LaneThread>();
  if (!on) lane_thread_.reset();
}

void PipelineExecutor::MessageBuffers::reset() {
  free.clear();
  for (int i = int(buffers.size()) - 1; i >= 0; i--) free.push_back(i);
  std::fill(of_micro.begin(), of_micro.end(), -1);
  held.clear();
  lent.clear();
  for (CommHandle& h : sent) h = CommHandle();
}

bool PipelineExecutor::MessageBuffers::lend(int micro) {
  if (free.empty()) return false;
  of_micro[micro] = free.back();
  free.pop_back();
  lent.push_back(of_micro[micro]);
  return true;
}

int PipelineExecutor::MessageBuffers::give_back(int micro) {
  ENSURE(of_micro[micro] >= 0, "PipelineExecutor: micro-batch " + std::to_string(micro) + " holds no buffer");
  free.push_back(of_micro[micro]);
  lent.erase(std::find(lent.begin(), lent.end(), of_micro[micro]));
  of_micro[micro] = -1;
  if (held.empty()) return -1;
  const int next = held.front();
  held.erase(held.begin());
  lend(next);
  return next;
}

double PipelineExecutor::buffer_bytes() const {
  double bytes = 0;
  for (const std::vector<MessageBuffers>* kind : {&activation_in_, &gradient_in_, &gradient_out_})
    for (const MessageBuffers& chunk : *kind)
      for (const Buffer& b : chunk.buffers) bytes += double(b.count()) * dtype_size(dtype_);
  return bytes;
}

Tensor PipelineExecutor::stream(Buffer& b, int B) const {
  return make_view(b.data(), {int64_t(B) * T_ / rows_divisor_, C_}, dtype_, device_);
}

Tensor PipelineExecutor::buffer_of(MessageBuffers& kind, int micro, int B) const {
  ENSURE(kind.of_micro[micro] >= 0, "PipelineExecutor: micro-batch " + std::to_string(micro) +
                                        "'s message has no buffer (its receive was listed after a later one's)");
  return stream(kind.buffers[size_t(kind.of_micro[micro])], B);
}

int64_t largest_pipeline_tag(const PipelineShape& shape) {
  return 2LL * shape.stages * shape.chunks * shape.micro_batches - 1;
}

// Unique over a step: which kind of message, into which virtual stage, for which micro-batch. Under
// call order every message has tag 0: NCCL ignores tags, and MPI then matches messages between two
// ranks in the order they were posted, NCCL's rule, so that a run over MPI tests the order itself.
int PipelineExecutor::tag(bool gradient, int virtual_stage, int micro) const {
  if (matching_ == Matching::ByCallOrder) return 0;
  const int stages = shape_.stages * shape_.chunks;
  return (int(gradient) * stages + virtual_stage) * shape_.micro_batches + micro;
}

float PipelineExecutor::run(const std::function<MicroBatch(int micro)>& micro_batch) {
  const int v = shape_.chunks, m = shape_.micro_batches, p = shape_.stages, last = p * v - 1;
  // Where virtual stage s's neighbours live comes from the schedule's placement: the next rank round
  // the ring (Loop), or, in a V, up or down the ranks, and this rank itself at the V's point. A
  // message to this rank is a copy into the receiving chunk's buffer, as with one stage.
  auto rank_of = [&](int stage) { return rank_of_stage(shape_, stage); };
  auto chunk_of = [&](int stage) { return chunk_of_stage(shape_, stage); };
  times_ = Times{};
  times_.forward.assign(v, 0), times_.backward.assign(v, 0), times_.weight.assign(v, 0), times_.pair.assign(v, 0);
  for (int c = 0; c < v; c++) {
    free_slots_[c].clear();
    for (int slot = chunks_[c]->part().slots - 1; slot >= 0; slot--) free_slots_[c].push_back(slot);
    activation_in_[c].reset(), gradient_in_[c].reset(), gradient_out_[c].reset();
  }
  std::vector<MicroBatch> batches(m);
  std::vector<bool> fetched(m, false);
  auto batch = [&](int micro) -> const MicroBatch& {
    if (!fetched[micro]) batches[micro] = micro_batch(micro), fetched[micro] = true;
    return batches[micro];
  };
  // The time of a compute pass, without the waiting before it (the host times a GPU's work only once
  // it is done: the compute stream's, not the messages' still in flight beside it).
  auto timed = [&](double* total, const std::function<void()>& pass) {
    const double start = now_ms();
    pass();
    synchronize_compute(device_);
    *total += now_ms() - start;
  };
  // On a GPU, wait() only makes the compute stream wait: the host waits for it too, so that the
  // time counts as waiting, not as the pass after it.
  auto wait_for = [&](CommHandle& handle) {
    if (!handle.valid()) return;  // one stage: the data was copied
    const double start = now_ms();
    handle.wait();
    synchronize_compute(device_);
    times_.waiting += now_ms() - start;
  };
  std::vector<std::vector<CommHandle>> activation_sent(v, std::vector<CommHandle>(m));
  auto free_slot = [&](int c, int micro) {
    if (activation_sent[c][micro].valid()) activation_sent[c][micro].wait();  // it was sent from the slot
    free_slots_[c].push_back(slot_of_[c][micro]);
    slot_of_[c][micro] = -1;
  };
  // Sends and receives: posted at once by tag; under call order collected into the run between two
  // passes and started as one group, whose handle then stands for each of them.
  // Under a recipe a message travels in its format (wire_p2p.h): an activation in the layer's dtype,
  // a gradient as the gradients' collectives (fp16: times the loss scale); fp32: as it is.
  std::vector<Communicator::PointToPoint> group;
  std::vector<Wire> group_wires;
  std::vector<CommHandle*> group_handles;
  auto post = [&](const Communicator::PointToPoint& op, bool gradient, CommHandle* handle) {
    const Wire& wire = gradient ? collective_formats(pipeline_).gradients : collective_formats(pipeline_).activations;
    if (matching_ == Matching::ByTag) {
      *handle = op.send ? wire_send_async(pipeline_, op.buf, op.peer, op.tag, wire)
                        : wire_recv_async(pipeline_, op.buf, op.peer, op.tag, wire);
      return;
    }
    group.push_back(op);
    group_wires.push_back(wire);
    group_handles.push_back(handle);
  };
  auto start_group = [&] {
    if (group.empty()) return;
    const CommHandle handle = wire_send_recv_async(pipeline_, group, group_wires);
    for (CommHandle* h : group_handles) *h = handle;
    group.clear();
    group_wires.clear();
    group_handles.clear();
  };
  // A receive goes out once its micro-batch holds one of the chunk's buffers for that kind of
  // message; till then it waits in list order, and goes out when a pass gives a buffer back.
  auto post_receive = [&](bool gradient, int c, int micro) {
    MessageBuffers& into = gradient ? gradient_in_[c] : activation_in_[c];
    CommHandle& handle = gradient ? gradient_recv_[c][micro] : activation_recv_[c][micro];
    const int s = virtual_stage(shape_, rank_, c);
    post({false, buffer_of(into, micro, micro_B_), rank_of(gradient ? s + 1 : s - 1), tag(gradient, s, micro)}, gradient,
         &handle);
  };
  auto receive = [&](bool gradient, int c, int micro) {
    MessageBuffers& into = gradient ? gradient_in_[c] : activation_in_[c];
    (gradient ? gradient_recv_ : activation_recv_)[c][micro] = CommHandle();
    const int s = virtual_stage(shape_, rank_, c);
    if (rank_of(gradient ? s + 1 : s - 1) == rank_) return;  // the sending chunk, here, copies into a buffer of this one's
    if (into.lend(micro)) return post_receive(gradient, c, micro);
    ENSURE(matching_ == Matching::ByTag, "PipelineExecutor: under call order a receive found no free buffer");
    into.held.push_back(micro);
  };
  // After the pass that read it: the buffer goes to the next held receive, if any.
  auto done_reading = [&](bool gradient, int c, int micro) {
    const int next_micro = (gradient ? gradient_in_[c] : activation_in_[c]).give_back(micro);
    if (next_micro >= 0) post_receive(gradient, c, next_micro);
  };
  // With one stage a message is a copy into the receiving chunk's buffer, lent at the copy.
  auto copy_into = [&](MessageBuffers& into, int micro, Tensor from) {
    ENSURE(into.lend(micro), "PipelineExecutor: no free buffer to copy micro-batch " + std::to_string(micro) + " into");
    copy_tensor(buffer_of(into, micro, micro_B_), from);
  };

  // The passes, each in three parts: what it waits for and takes before it computes (main thread),
  // its computation (in its lane when pairs overlap), and what it gives back after.
  struct ForwardInput {
    int slot;
    MicroBatch tokens;
  };
  auto start_forward = [&](const Action& a) -> ForwardInput {
    const int c = a.chunk, micro = a.micro, s = virtual_stage(shape_, rank_, c);
    GPT2& model = *chunks_[c];
    ENSURE(!free_slots_[c].empty(), "PipelineExecutor: no free activation slot for " + describe(a));
    const int slot = free_slots_[c].back();
    free_slots_[c].pop_back();
    slot_of_[c][micro] = slot;
    const bool needs_tokens = model.has_embedding() || model.has_head();
    const MicroBatch tokens = needs_tokens ? batch(micro) : MicroBatch{nullptr, nullptr, micro_B_};
    if (s > 0) {
      wait_for(activation_recv_[c][micro]);
      copy_tensor(model.input(slot, tokens.B), buffer_of(activation_in_[c], micro, tokens.B));
      done_reading(false, c, micro);
    }
    return {slot, tokens};
  };
  float loss = 0;  // the forward lane's alone
  auto compute_forward = [&](const Action& a, const ForwardInput& in) {
    TraceScope span(describe(a));
    timed(&times_.forward[a.chunk],
          [&] { loss += chunks_[a.chunk]->forward(in.slot, in.tokens.inputs, in.tokens.targets, in.tokens.B); });
  };
  auto start_backward = [&](const Action& a) -> Tensor {
    const int c = a.chunk, micro = a.micro, s = virtual_stage(shape_, rank_, c);
    if (s == last) return Tensor();
    wait_for(gradient_recv_[c][micro]);
    return buffer_of(gradient_in_[c], micro, micro_B_);
  };
  // The loss is the mean over the step's micro-batches: each backward starts from 1/m of the gradient
  // of its own mean, once, here at the loss; no other stage scales anything.
  auto compute_backward = [&](const Action& a, Tensor output_grad) {
    TraceScope span(describe(a));
    timed(&times_.backward[a.chunk], [&] { chunks_[a.chunk]->backward(slot_of_[a.chunk][a.micro], 1.0f / m, output_grad); });
  };
  auto finish_backward = [&](const Action& a) {
    const int c = a.chunk, micro = a.micro, s = virtual_stage(shape_, rank_, c);
    if (s < last) done_reading(true, c, micro);
    if (!chunks_[c]->part().split_backward) free_slot(c, micro);
  };
  auto compute_weight = [&](const Action& a) {
    TraceScope span(describe(a));
    timed(&times_.weight[a.chunk], [&] { chunks_[a.chunk]->backward_weights(slot_of_[a.chunk][a.micro]); });
  };
  auto lane_of = [](Op op) { return op == Op::F ? Lane::Forward : Lane::Backward; };
  std::vector<double> pair_ms(v, 0);
  std::vector<int> pairs_of(v, 0);
  std::vector<bool> ran_in_pair(actions_.size(), false);

  const double step_start = now_ms();
  for (size_t i = 0; i < actions_.size(); i++) {
    const Action& a = actions_[i];
    const int c = a.chunk, micro = a.micro, s = virtual_stage(shape_, rank_, c);
    GPT2& model = *chunks_[c];
    const bool is_pass = a.op == Op::F || a.op == Op::B || a.op == Op::W;
    if (is_pass) start_group();
    if (ran_in_pair[i]) continue;  // a pair's B or W, run with its F
    if (overlaps_pairs() && pair_at_[i] >= 0) {
      // An F&B pair: both inputs first (DualPipe's pair waits for both receives before either
      // computes), then both lanes at once; the sends listed between them follow once both are done.
      const FBPair& pair = pairs_[size_t(pair_at_[i])];
      const Action &f = actions_[size_t(pair.forward)], &b = actions_[size_t(pair.backward)];
      const Action& w = actions_[size_t(pair.weight)];
      const ForwardInput in = start_forward(f);
      const Tensor output_grad = start_backward(b);
      const double passes_before = times_.forward[f.chunk] + times_.backward[b.chunk] + times_.weight[w.chunk];
      const double pair_start = now_ms();
      lane_thread_->start([&] {
        const LaneScope lane(Lane::Backward);
        const PairScope in_pair;
        if (before_compute) before_compute(b);
        compute_backward(b, output_grad);
        if (before_compute) before_compute(w);
        compute_weight(w);
      });
      {
        const LaneScope lane(Lane::Forward);
        const PairScope in_pair;
        if (before_compute) before_compute(f);
        compute_forward(f, in);
      }
      lane_thread_->wait();
      free_pair_buffers();  // what the passes freed inside the pair (lanes.h)
      const double wall = now_ms() - pair_start;
      times_.pairs++;
      times_.pair_ms += wall;
      times_.pair_passes_ms += times_.forward[f.chunk] + times_.backward[b.chunk] + times_.weight[w.chunk] - passes_before;
      pair_ms[f.chunk] += wall, pairs_of[f.chunk]++;
      finish_backward(b);
      free_slot(w.chunk, w.micro);
      ran_in_pair[size_t(pair.backward)] = ran_in_pair[size_t(pair.weight)] = true;
      continue;
    }
    // With pairs overlapped, every pass runs in its lane, paired or not (lanes.h).
    std::optional<LaneScope> lane;
    if (overlaps_pairs() && is_pass) lane.emplace(lane_of(a.op));
    if (is_pass && before_compute) before_compute(a);
    switch (a.op) {
      case Op::RecvActivation: receive(false, c, micro); break;
      case Op::RecvGradient: receive(true, c, micro); break;
      case Op::F: compute_forward(a, start_forward(a)); break;
      case Op::SendActivation:
        if (rank_of(s + 1) == rank_) {  // to this rank's chunk of the next virtual stage
          copy_into(activation_in_[chunk_of(s + 1)], micro, model.output(slot_of_[c][micro]));
          break;
        }
        post({true, model.output(slot_of_[c][micro]), rank_of(s + 1), tag(false, s + 1, micro)}, false,
             &activation_sent[c][micro]);
        break;
      case Op::B:
        compute_backward(a, start_backward(a));
        finish_backward(a);
        break;
      case Op::SendGradient: {
        if (rank_of(s - 1) == rank_) {  // to this rank's chunk of the previous virtual stage
          copy_into(gradient_in_[chunk_of(s - 1)], micro, model.input_grad());
          break;
        }
        // The model's scratch is overwritten by the next backward: the message goes from a copy,
        // in the buffer of the oldest send still lent once that send is done, if none is free.
        MessageBuffers& out = gradient_out_[c];
        if (out.free.empty()) {
          const int oldest = out.lent.front();
          out.sent[size_t(oldest)].wait();
          for (int other = 0; other < m; other++)
            if (out.of_micro[other] == oldest) out.give_back(other);
        }
        ENSURE(out.lend(micro), "PipelineExecutor: no buffer for the gradient of " + describe(a));
        const Tensor copy = buffer_of(out, micro, micro_B_);
        copy_tensor(copy, model.input_grad());
        post({true, copy, rank_of(s - 1), tag(true, s - 1, micro)}, true, &out.sent[size_t(out.of_micro[micro])]);
        break;
      }
      case Op::W:
        compute_weight(a);
        free_slot(c, micro);
        break;
    }
  }
  start_group();
  for (int c = 0; c < v; c++) {
    for (CommHandle& h : gradient_out_[c].sent)
      if (h.valid()) h.wait();
    for (CommHandle& h : activation_sent[c])
      if (h.valid()) h.wait();
  }
  synchronize_compute(device_);  // on a GPU the waits above only queued: the step ends when they end
  times_.step = now_ms() - step_start;
  times_.buffer_bytes = buffer_bytes();
  for (int c = 0; c < v; c++) {
    times_.forward[c] /= m, times_.backward[c] /= m, times_.weight[c] /= m;
    times_.pair[c] = pairs_of[c] ? pair_ms[c] / pairs_of[c] : 0;
  }
  return loss / m;
}
