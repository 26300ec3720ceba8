// expert_exchange.h: chapter 11's lesson, the exchange itself. The tokens of a MoE layer travel to
// the ranks that hold their experts and back, by all-to-all over the expert-parallel group: the
// counts first, then the rows (dispatch), the experts run, the outputs return (combine); backward
// the same two trips for the gradients. Under --precision the rows travel in the recipe's formats
// (wire_format.h): activations forward, gradients backward. Defines ExpertExchange, which 11's
// train.cpp wires into the model's ExpertHooks, and 12_5d_parallel composes with the other four
// dimensions.
//
// Under a pipeline whose F&B pairs run at once (12 with dualpipev; common/comm/lanes.h), one micro-batch's
// forward and another's backward exchange at the same time: the exchange then takes the EP group
// as a LaneCommunicator (each lane its own communicator), and keeps its scratch buffers and its
// predicted counts once per lane. Its routing and the experts' activations are per slot, which the
// two passes of a pair never share.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/comm.h"
#include "comm/lanes.h"  // lane_index, kLanes
#include "comm/wire_format.h"  // the rows in a recipe's formats (fp32: as they are)
#include "ops/memory.h"
#include "model/model.h"
#include "model/moe.h"
#include "ops/ops.h"  // copy_tensor: the rows regrouped on their device

// The tokens' trips to the experts of the EP group and back, per layer (the lesson's core).
class ExpertExchange {
 public:
  // `slots`: the micro-batches a pipeline keeps in flight (chapter 12: every chunk's), each with its
  // own routing and its experts' activations until its backward; 1 without a pipeline.
  ExpertExchange(Communicator& ep, GPT2& model, int L, int E, int C, int slots = 1)
      : ep_(ep), model_(model), L_(L), E_(E), C_(C), local_(E / ep.size()), device_(ep.device()),
        layers_(size_t(L) * size_t(slots)) {
    for (int s = 0; s < slots; s++) mlps_.emplace_back(L, C, device_);  // the rows' device: the group's
  }

  // rows (n,C) grouped by expert 0..E-1 (counts[e] rows each) -> out (n,C), the same order.
  void forward(int slot, int layer, Tensor rows, const std::vector<int64_t>& counts, Tensor out) {
    Layer& d = layers_[size_t(slot * L_ + layer)];
    const int P = ep_.size();
    // Dispatch, 1: the counts. Chunk q of `counts` is the E/ep experts of rank q; what arrives in
    // chunk s is how many rows rank s sends to each of this rank's experts.
    // int32: exact at any count (a float is exact only to 2^24).
    std::vector<int32_t> mine(counts.begin(), counts.end()), theirs(static_cast<size_t>(E_));
    ep_.all_to_all(make_view(mine.data(), {int64_t(E_)}, DType::I32), make_view(theirs.data(), {int64_t(E_)}, DType::I32));
    d.send_rows.assign(size_t(P), 0);
    d.recv_rows.assign(size_t(P), 0);
    d.recv_counts.assign(size_t(E_), 0);
    for (int q = 0; q < P; q++)
      for (int j = 0; j < local_; j++) {
        d.send_rows[size_t(q)] += counts[size_t(q * local_ + j)];
        d.recv_counts[size_t(q * local_ + j)] = theirs[size_t(q * local_ + j)];
        d.recv_rows[size_t(q)] += d.recv_counts[size_t(q * local_ + j)];
      }
    count_predicted(wire_bytes_for(CollectiveKind::AllToAll, int64_t(E_) * 4, P), int64_t(E_) * 4);
    // Dispatch, 2: the rows, to the rank of their expert (grouped by expert is grouped by rank).
    // Under a mixed-precision recipe they travel in the layer's dtype, as tensor parallelism's
    // activations do: what the experts' products round them to anyway (fp8: a bf16 row, then E4M3).
    const Wire& activations = collective_formats(ep_).activations;
    Tensor received = exchange(rows, d.send_rows, d.recv_rows, lane().received, activations);
    // Experts: this rank's, on their rows from every peer (regrouped by expert), and back.
    Tensor outputs = run_experts(slot, layer, received, d, /*forward=*/true);
    // Combine: the outputs return to their tokens' ranks (moe.cpp weights and adds them), in the
    // same format: the experts' outputs are in it already.
    exchange_into(outputs, d.recv_rows, d.send_rows, out, activations);
  }

  // dout (n,C): the gradients of the last forward's outputs -> drows (n,C), their inputs'.
  void backward(int slot, int layer, Tensor dout, Tensor drows) {
    Layer& d = layers_[size_t(slot * L_ + layer)];
    const Wire& gradients = collective_formats(ep_).gradients;  // (a recipe's: bf16, fp16 at the loss scale)
    Tensor received = exchange(dout, d.send_rows, d.recv_rows, lane().received, gradients);
    Tensor grads = run_experts(slot, layer, received, d, /*forward=*/false);
    exchange_into(grads, d.recv_rows, d.send_rows, drows, gradients);
  }

  // What the communicator should count, from the counts alone: the bytes this rank sends in its
  // all-to-alls (its own segments stay), and their time on the emulated link (comm.h, modelled_ms).
  // Both lanes' (read between steps).
  int64_t predicted_sent_bytes() const { return lanes_[0].predicted_sent + lanes_[1].predicted_sent; }
  // The rows this rank's experts ran per layer in the last step: their activations (theory.h).
  std::vector<int64_t> expert_rows(int slot = 0) const { return mlps_[size_t(slot)].rows_per_layer(); }
  double predicted_link_ms() const { return lanes_[0].predicted_ms + lanes_[1].predicted_ms; }
  void reset_predictions() {
    for (LaneScratch& l : lanes_) l.predicted_sent = 0, l.predicted_ms = 0;
  }
  // After the step's last backward: each step grows its own buffers to its own routing.
  void release_buffers() {
    for (LaneScratch& l : lanes_) l.received = Buffer(), l.grouped = Buffer(), l.results = Buffer(), l.arrival = Buffer();
  }

 private:
  struct Layer {
    std::vector<int64_t> send_rows, recv_rows;  // (ep) rows to and from each peer
    std::vector<int64_t> recv_counts;           // (ep x E/ep) rows from peer s for local expert j
  };
  // What one lane's passes write as they exchange (lanes.h): the rows received, regrouped by expert,
  // the experts' results and those back in arrival order; and the counts it predicts. One lane (the
  // forward's) unless a pipeline's F&B pairs run at once.
  struct LaneScratch {
    Buffer received, grouped, results, arrival;
    int64_t predicted_sent = 0;
    double predicted_ms = 0;
  };
  LaneScratch& lane() { return lanes_[size_t(lane_index())]; }

  // `from` travels by rows: send_rows[q] rows to rank q, recv_rows[s] from rank s, into `to`, in
  // `wire`'s format (fp32: as they are).
  void exchange_into(Tensor from, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                     Tensor to, const Wire& wire) {
    std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
    int64_t sent = 0, received = 0;
    const int64_t bytes = wire.element_bytes();  // 4 in fp32, 2 in bf16 and fp16
    for (size_t q = 0; q < send.size(); q++) {
      send[q] = send_rows[q] * C_, recv[q] = recv_rows[q] * C_;
      if (int(q) != ep_.rank()) sent += bytes * send[q], received += bytes * recv[q];
    }
    wire_all_to_all_v(ep_, from, send, to, recv, wire);
    count_predicted(ep_.size() > 1 ? sent : 0, all_to_all_v_link_bytes(sent, received, ep_.size()));
  }
  Tensor exchange(Tensor from, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                  Buffer& into, const Wire& wire) {
    int64_t rows = 0;
    for (int64_t r : recv_rows) rows += r;
    grow(into, rows * C_);
    Tensor to = rows_at(into, 0, rows);
    exchange_into(from, send_rows, recv_rows, to, wire);
    return to;
  }

  // The received rows arrive by peer, then by expert; the experts want them by expert, then by peer
  // (within an expert: the global token order, peers being consecutive ranks). Regroups, runs the
  // experts forward (or backward), and puts the results back in arrival order.
  Tensor run_experts(int slot, int layer, Tensor received, const Layer& d, bool forward) {
    const int P = ep_.size();
    const int64_t rows = received.numel() / C_;
    LaneScratch& mine = lane();
    grow(mine.grouped, rows * C_);
    grow(mine.results, rows * C_);
    grow(mine.arrival, rows * C_);
    std::vector<int64_t> at_arrival(size_t(P * local_)), local_counts(size_t(local_), 0);
    int64_t offset = 0;
    for (int s = 0; s < P; s++)
      for (int j = 0; j < local_; j++) at_arrival[size_t(s * local_ + j)] = offset, offset += d.recv_counts[size_t(s * local_ + j)];
    // (copy_tensor: a memcpy on the CPU, a device-to-device copy on the GPU's stream.)
    auto move_rows = [&](const Buffer& from, const Buffer& to, bool to_grouped) {
      int64_t grouped = 0;
      for (int j = 0; j < local_; j++)
        for (int s = 0; s < P; s++) {
          const int64_t n = d.recv_counts[size_t(s * local_ + j)], arrival = at_arrival[size_t(s * local_ + j)];
          if (n > 0) {
            if (to_grouped) copy_tensor(rows_at(to, grouped, n), rows_at(from, arrival, n));
            else copy_tensor(rows_at(to, arrival, n), rows_at(from, grouped, n));
          }
          grouped += n;
        }
    };
    for (int j = 0; j < local_; j++)
      for (int s = 0; s < P; s++) local_counts[size_t(j)] += d.recv_counts[size_t(s * local_ + j)];
    move_rows(mine.received, mine.grouped, true);
    const Tensor in = rows_at(mine.grouped, 0, rows);
    const Tensor out = rows_at(mine.results, 0, rows);
    ExpertMLPs& mlps = mlps_[size_t(slot)];
    if (forward) mlps.forward(layer, model_.held_experts(layer), in, local_counts, out);
    else mlps.backward(layer, model_.held_experts(layer), in, out);
    move_rows(mine.results, mine.arrival, false);
    return rows_at(mine.arrival, 0, rows);
  }

  void count_predicted(int64_t sent_bytes, int64_t link_bytes) {
    lane().predicted_sent += sent_bytes;
    lane().predicted_ms += modelled_ms(ep_.link_model(), CollectiveKind::AllToAll, link_bytes, ep_.size());
  }
  // The old block goes before the new one comes, so the step's peak is the four buffers at the
  // largest layer's rows (docs/theory.md 14, moe_exchange_buffer_bytes), never old and new at once:
  // once per lane where two run.
  void grow(Buffer& b, int64_t count) const {
    if (b.count() >= count) return;
    b = Buffer();
    b = Buffer(count, MemCategory::CommBuffers, device_);
  }
  // Rows [begin, begin + n) of a buffer of C-channel rows, on the exchange's device.
  Tensor rows_at(const Buffer& b, int64_t begin, int64_t n) const {
    return make_view(static_cast<float*>(b.data()) + begin * C_, {n, int64_t(C_)}, DType::F32, device_);
  }

  Communicator& ep_;
  GPT2& model_;
  int L_, E_, C_, local_;
  Device device_;                 // of the rows: the EP group's (CUDA: NCCL or host-staged all-to-alls)
  std::vector<ExpertMLPs> mlps_;  // per slot: this rank's experts' activations
  std::vector<Layer> layers_;     // per slot and layer
  LaneScratch lanes_[kLanes];
};
