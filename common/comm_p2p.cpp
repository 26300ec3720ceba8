// comm_p2p.cpp: with_collectives() of comm_p2p.h: the P2PCollectives communicator, which runs the
// three gradient collectives from send and receive and hands everything else to the communicator
// it wraps.
#include "comm_p2p.h"

#include <algorithm>
#include <utility>

namespace {

class P2PCollectives : public Communicator {
 public:
  P2PCollectives(const CollectivesChoice& choice, std::unique_ptr<Communicator> inner)
      : choice_(choice), inner_(std::move(inner)) {
    rank_ = inner_->rank();
    size_ = inner_->size();
    device_ = inner_->device();
    name_ = inner_->name() + ", collectives from send/recv";
    group_ = inner_->group();
    link_ = inner_->link_model();
    // The algorithms' own group: every rank of inner_ builds it here, in the same order.
    lane_ = inner_->split(0, inner_->rank(), inner_->group() + " (send/recv collectives)");
    lane_->set_link_model(link_);
  }
  ~P2PCollectives() override {
    lane_.reset();
    inner_.reset();
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& group) override {
    return std::make_unique<P2PCollectives>(choice_, inner_->split(color, key, group));
  }

  CommHandle all_reduce_async(Tensor buf, ReduceOp op) override {
    if (!ours(buf, op)) return inner_->all_reduce_async(buf, op);
    const Algorithm a = choice_.by_size ? (int64_t(buf.bytes()) <= kSmallAllReduceBytes ? Algorithm::RecursiveDoubling
                                                                                       : Algorithm::Ring)
                                        : choice_.forced;
    return run(CollectiveKind::AllReduce, int64_t(buf.bytes()), [&] { p2p_all_reduce(*lane_, buf, op, a); });
  }
  CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) override {
    if (!ours(send, op)) return inner_->reduce_scatter_async(send, recv, op);
    return run(CollectiveKind::ReduceScatter, int64_t(send.bytes()),
               [&] { p2p_reduce_scatter(*lane_, send, recv, op, pick(CollectiveKind::ReduceScatter)); });
  }
  CommHandle all_gather_async(Tensor send, Tensor recv) override {
    if (!ours(recv, ReduceOp::Sum)) return inner_->all_gather_async(send, recv);
    return run(CollectiveKind::AllGather, int64_t(recv.bytes()),
               [&] { p2p_all_gather(*lane_, send, recv, pick(CollectiveKind::AllGather)); });
  }
  CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                    ReduceOp op) override {
    if (!ours(send, op)) return inner_->reduce_scatter_v_async(send, recv, counts, op);
    return run(CollectiveKind::ReduceScatter, int64_t(send.bytes()),
               [&] { p2p_reduce_scatter(*lane_, send, recv, op, pick(CollectiveKind::ReduceScatter), counts); });
  }
  CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) override {
    if (!ours(recv, ReduceOp::Sum)) return inner_->all_gather_v_async(send, recv, counts);
    return run(CollectiveKind::AllGather, int64_t(recv.bytes()),
               [&] { p2p_all_gather(*lane_, send, recv, pick(CollectiveKind::AllGather), counts); });
  }

  // The rest is the inner communicator's.
  CommHandle all_to_all_async(Tensor send, Tensor recv) override { return inner_->all_to_all_async(send, recv); }
  CommHandle all_to_all_v_async(Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                const std::vector<int64_t>& recv_counts) override {
    return inner_->all_to_all_v_async(send, send_counts, recv, recv_counts);
  }
  CommHandle broadcast_async(Tensor buf, int root) override { return inner_->broadcast_async(buf, root); }
  CommHandle send_async(Tensor buf, int peer, int tag) override { return inner_->send_async(buf, peer, tag); }
  CommHandle recv_async(Tensor buf, int peer, int tag) override { return inner_->recv_async(buf, peer, tag); }
  CommHandle send_recv_async(const std::vector<PointToPoint>& ops) override { return inner_->send_recv_async(ops); }
  bool matches_by_tag() const override { return inner_->matches_by_tag(); }
  int64_t largest_tag() const override { return inner_->largest_tag(); }
  CommHandle barrier_async() override { return inner_->barrier_async(); }
  double all_reduce_scalar(double value, ReduceOp op) override { return inner_->all_reduce_scalar(value, op); }
  void broadcast_bytes(void* data, size_t bytes, int root) override { inner_->broadcast_bytes(data, bytes, root); }
  void agree_or_die(bool ok, const std::string& msg) override { inner_->agree_or_die(ok, msg); }
  void collect_stats() override {
    inner_->collect_stats();
    lane_->collect_stats();
  }
  void set_link_model(LinkModel link) override {
    link_ = link;
    inner_->set_link_model(link);
    lane_->set_link_model(link);
  }

  // The inner communicator's counters, with ours added under their kinds. The lane's own counters
  // (its sends) are left out: they are ours, already counted here.
  const CommStats& stats() const override {
    composed_ = inner_->stats();
    composed_ += ours_;
    return composed_;
  }

 private:
  // GPU tensors reduced by Max or Min go to the library: the GPU ops here add (ops.h).
  bool ours(const Tensor& t, ReduceOp op) const {
    if (choice_.library) return false;
    return t.device == Device::CPU || op == ReduceOp::Sum || op == ReduceOp::Avg;
  }
  Algorithm pick(CollectiveKind kind) const {
    return !choice_.by_size && algorithm_has(choice_.forced, kind) ? choice_.forced : Algorithm::Ring;
  }

  // Runs one collective to completion and counts it as the library's would be counted (comm.h): one
  // call of `kind` with `payload` bytes, what the lane sent and received, and its time, all exposed.
  template <typename Body>
  CommHandle run(CollectiveKind kind, int64_t payload, Body body) {
    const CommStats before = lane_->stats();
    body();
    const CommStats spent = lane_->stats().since(before);
    const CollectiveCounters& p2p = spent.kind[int(CollectiveKind::SendRecv)];
    CollectiveCounters& c = ours_.kind[int(kind)];
    c.calls++, c.launched++;
    c.payload_bytes += payload;
    c.sent_bytes += p2p.sent_bytes;
    c.received_bytes += p2p.received_bytes;
    if (payload > 0) {
      c.max_sent_share = std::max(c.max_sent_share, double(p2p.sent_bytes) / double(payload));
      c.max_received_share = std::max(c.max_received_share, double(p2p.received_bytes) / double(payload));
    }
    c.busy_ms += p2p.busy_ms;
    c.exposed_ms += spent.exposed_ms;
    ours_.exposed_ms += spent.exposed_ms;
    ours_.in_flight_ms += spent.in_flight_ms;
    return CommHandle(std::function<void()>([] {}));  // already complete
  }

  CollectivesChoice choice_;
  std::unique_ptr<Communicator> inner_, lane_;
  CommStats ours_;
  mutable CommStats composed_;
};

}  // namespace

bool parse_collectives(const std::string& text, CollectivesChoice* out) {
  CollectivesChoice c;
  if (text == "library") return *out = c, true;
  c.library = false;
  if (text == "ours") return c.by_size = true, *out = c, true;
  if (!parse_algorithm(text, &c.forced)) return false;
  return *out = c, true;
}

std::unique_ptr<Communicator> with_collectives(const CollectivesChoice& choice, std::unique_ptr<Communicator> inner) {
  if (choice.library) return inner;
  return std::make_unique<P2PCollectives>(choice, std::move(inner));
}
