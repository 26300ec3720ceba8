// pipeline.cpp: see pipeline.h.
#include "pipeline.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "check.h"
#include "device.h"
#include "ops.h"
#include "trace.h"

std::vector<double> unit_costs(const GPT2Config& cfg) {
  const double C = cfg.C, T = cfg.T, V = cfg.V;
  std::vector<double> costs(cfg.L + 2, 24 * C * C + 4 * T * C);
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

std::vector<ModelPart> parts_of_rank(const GPT2Config& cfg, const std::vector<int>& blocks, int stages, int rank) {
  const int S = int(blocks.size()), chunks = S / stages;
  ENSURE(S % stages == 0, "parts_of_rank: the virtual stages do not divide over the stages");
  std::vector<ModelPart> parts;
  for (int c = 0; c < chunks; c++) {
    const int s = c * stages + rank;
    int first_block = 0;
    for (int i = 0; i < s; i++) first_block += blocks[i];
    ModelPart part;
    part.first_unit = s == 0 ? 0 : first_block + 1;  // block b is unit b + 1; stage 0 adds the embedding
    part.last_unit = s == S - 1 ? cfg.L + 1 : first_block + blocks[s];
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
    ENSURE(chunks_[c]->part().slots >= max_in_flight(actions_, c),
           "PipelineExecutor: chunk " + std::to_string(c) + " has fewer activation slots than the schedule needs");
    const int s = virtual_stage(shape_, rank_, c);
    for (int micro = 0; micro < m; micro++) {
      if (s > 0) activation_in_[c].emplace_back(elements, MemCategory::CommBuffers, dtype, device);
      if (s > 0 && p > 1) gradient_out_[c].emplace_back(elements, MemCategory::CommBuffers, dtype, device);
      if (s < last) gradient_in_[c].emplace_back(elements, MemCategory::CommBuffers, dtype, device);
    }
  }
}

Tensor PipelineExecutor::stream(Buffer& b, int B) const {
  return make_view(b.data(), {int64_t(B) * T_ / rows_divisor_, C_}, dtype_, device_);
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
  const int next = (rank_ + 1) % p, previous = (rank_ + p - 1) % p;
  times_ = Times{};
  times_.forward.assign(v, 0), times_.backward.assign(v, 0), times_.weight.assign(v, 0);
  for (int c = 0; c < v; c++) {
    free_slots_[c].clear();
    for (int slot = chunks_[c]->part().slots - 1; slot >= 0; slot--) free_slots_[c].push_back(slot);
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
  std::vector<Communicator::PointToPoint> group;
  std::vector<CommHandle*> group_handles;
  auto post = [&](const Communicator::PointToPoint& op, CommHandle* handle) {
    if (matching_ == Matching::ByTag) {
      *handle = op.send ? pipeline_.send_async(op.buf, op.peer, op.tag) : pipeline_.recv_async(op.buf, op.peer, op.tag);
      return;
    }
    group.push_back(op);
    group_handles.push_back(handle);
  };
  auto start_group = [&] {
    if (group.empty()) return;
    const CommHandle handle = pipeline_.send_recv_async(group);
    for (CommHandle* h : group_handles) *h = handle;
    group.clear();
    group_handles.clear();
  };

  const double step_start = now_ms();
  float loss = 0;
  for (const Action& a : actions_) {
    const int c = a.chunk, micro = a.micro, s = virtual_stage(shape_, rank_, c);
    GPT2& model = *chunks_[c];
    if (a.op == Op::F || a.op == Op::B || a.op == Op::W) {
      start_group();
      if (before_compute) before_compute(a);
    }
    switch (a.op) {
      case Op::RecvActivation:
        activation_recv_[c][micro] = CommHandle();
        if (p > 1)
          post({false, stream(activation_in_[c][micro], micro_B_), previous, tag(false, s, micro)},
               &activation_recv_[c][micro]);
        break;
      case Op::RecvGradient:
        gradient_recv_[c][micro] = CommHandle();
        if (p > 1)
          post({false, stream(gradient_in_[c][micro], micro_B_), next, tag(true, s, micro)}, &gradient_recv_[c][micro]);
        break;
      case Op::F: {
        ENSURE(!free_slots_[c].empty(), "PipelineExecutor: no free activation slot for " + describe(a));
        const int slot = free_slots_[c].back();
        free_slots_[c].pop_back();
        slot_of_[c][micro] = slot;
        const bool needs_tokens = model.has_embedding() || model.has_head();
        const MicroBatch tokens = needs_tokens ? batch(micro) : MicroBatch{nullptr, nullptr, micro_B_};
        if (s > 0) {
          wait_for(activation_recv_[c][micro]);
          copy_tensor(model.input(slot, tokens.B), stream(activation_in_[c][micro], tokens.B));
        }
        TraceScope span(describe(a));
        timed(&times_.forward[c], [&] { loss += model.forward(slot, tokens.inputs, tokens.targets, tokens.B); });
        break;
      }
      case Op::SendActivation:
        if (p == 1) {  // to this rank's next chunk
          copy_tensor(stream(activation_in_[c + 1][micro], micro_B_), model.output(slot_of_[c][micro]));
          break;
        }
        post({true, model.output(slot_of_[c][micro]), next, tag(false, s + 1, micro)}, &activation_sent[c][micro]);
        break;
      case Op::B: {
        Tensor output_grad;
        if (s < last) {
          wait_for(gradient_recv_[c][micro]);
          output_grad = stream(gradient_in_[c][micro], micro_B_);
        }
        TraceScope span(describe(a));
        // The loss is the mean over the step's micro-batches: each backward starts from 1/m of the
        // gradient of its own mean, once, here at the loss; no other stage scales anything.
        timed(&times_.backward[c], [&] { model.backward(slot_of_[c][micro], 1.0f / m, output_grad); });
        if (!model.part().split_backward) free_slot(c, micro);
        break;
      }
      case Op::SendGradient: {
        if (p == 1) {  // to this rank's previous chunk
          copy_tensor(stream(gradient_in_[c - 1][micro], micro_B_), model.input_grad());
          break;
        }
        Tensor out = stream(gradient_out_[c][micro], micro_B_);
        copy_tensor(out, model.input_grad());  // (the model's scratch is overwritten by the next backward)
        sends_.emplace_back();
        post({true, out, previous, tag(true, s - 1, micro)}, &sends_.back());
        break;
      }
      case Op::W: {
        TraceScope span(describe(a));
        timed(&times_.weight[c], [&] { model.backward_weights(slot_of_[c][micro]); });
        free_slot(c, micro);
        break;
      }
    }
  }
  start_group();
  for (CommHandle& h : sends_) h.wait();
  sends_.clear();
  for (int c = 0; c < v; c++)
    for (CommHandle& h : activation_sent[c])
      if (h.valid()) h.wait();
  synchronize_compute(device_);  // on a GPU the waits above only queued: the step ends when they end
  times_.step = now_ms() - step_start;
  for (int c = 0; c < v; c++) {
    times_.forward[c] /= m, times_.backward[c] /= m, times_.weight[c] /= m;
  }
  return loss / m;
}
