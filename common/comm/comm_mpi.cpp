// comm_mpi.cpp: the MPI implementation of comm.h. Defines the MPI communicator, which checks each op's tensors,
// turns the op into a non-blocking MPI call and hands it to the process's one progress engine
// (comm_engine.h; how an op travels, the emulated link and the statistics: comm_engine.cpp). The
// names, totals and link model every backend shares: comm.cpp; what an MPI call takes (types, ops,
// checks, counts): comm_mpi_args.cpp; start-up, shut-down and the groups made without spinning:
// comm_mpi_startup.cpp.
//
// With one rank in the group there is nothing to exchange: collectives complete at issue (a local
// copy where the output is another buffer) and cost no time at all. With two, a small all-reduce is
// one exchange of the two ranks' values, a receive and a send, instead of MPICH's non-blocking
// all-reduce, whose schedule costs more than the message (submit_exchange).
#include "comm/comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ops/bf16.h"
#include "base/check.h"
#include "comm/comm_engine.h"
#include "comm/comm_mpi_args.h"  // MPI's types and ops, the checks of an op's tensors
#include "comm/comm_mpi_internal.h"  // split_resting, duplicate_resting

using namespace comm_engine;
using namespace mpi_args;

namespace {

std::weak_ptr<ProgressEngine> g_engine;  // the process's engine, while some communicator holds it
// The largest all-reduce that a group of two ranks makes as one exchange (submit_exchange). Measured
// against MPI_Allreduce (2 ranks over shared memory, the median of 2000 calls): the exchange
// 0.7-0.9x from 4 B to 8 KB, 1.4-1.5x at 12 and 16 KB, 0.76-0.81x at 32 and 48 KB; MPI_Iallreduce
// 1.0-1.2x throughout. The limit stays below the slow sizes.
constexpr int64_t kExchangeMaxBytes = 8 * 1024;
// How many exchanges of one communicator may be in flight at once, each with its receive buffer
// taken from the communicator's own (ExchangeSlots). A step has few small all-reduces in flight
// together (the loss, the norm, a small bucket); one beyond the slots gets a buffer of its own.
constexpr int kExchangeSlots = 8;

int world_size() {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

// ---------------------------------------------------------------------------------------------
// The MPI communicator

// The receive buffers of a group of two's exchanges (submit_exchange): kExchangeSlots buffers of
// kExchangeMaxBytes, allocated once with the communicator, so that a step's small all-reduces
// allocate nothing. A slot is taken at issue (by whichever lane's thread issues) and given back by
// the engine's thread once the op has added the peer's values into the caller's: a bit per slot,
// claimed and released atomically. When every slot is in flight, take() says so (nullptr) and the
// call allocates its own buffer, as it would without slots: slower, never wrong. Their 64 KB are a
// constant of the communicator, as MPI's own buffers are, not a buffer of the model's: the memory
// table leaves them out (docs/theory.md, section 3).
class ExchangeSlots {
 public:
  ExchangeSlots() : memory_(new char[size_t(kExchangeSlots * kExchangeMaxBytes)]) {}
  char* take() {
    uint32_t busy = busy_.load();
    for (;;) {
      int free_slot = 0;
      while (free_slot < kExchangeSlots && (busy >> free_slot) & 1u) free_slot++;
      if (free_slot == kExchangeSlots) return nullptr;
      if (busy_.compare_exchange_weak(busy, busy | (1u << free_slot)))
        return memory_.get() + int64_t(free_slot) * kExchangeMaxBytes;
    }
  }
  void give_back(const char* slot) {
    const int64_t index = (slot - memory_.get()) / kExchangeMaxBytes;
    ENSURE(index >= 0 && index < kExchangeSlots && (busy_.load() >> index) & 1u, "exchange slot given back twice");
    busy_.fetch_and(~(1u << index));
  }

 private:
  std::unique_ptr<char[]> memory_;
  std::atomic<uint32_t> busy_{0};  // bit i: slot i is in flight
};
static_assert(kExchangeSlots <= 32, "one bit per slot in a 32-bit word");

class MpiCommunicator final : public Communicator {
 public:
  // Over `comm`, which this object then owns (and frees), with the process's engine.
  // `shared_send_lane` >= 0: the emulated link of another communicator over the same ranks
  // (duplicate()), else a link of its own.
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<ProgressEngine> engine, const std::string& group,
                  int shared_send_lane = -1)
      : comm_(comm), engine_(std::move(engine)) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    group_ = group;
    info_ = GroupInfo{group, world_ranks(comm_, size_)};
    send_lane_ = shared_send_lane >= 0 ? shared_send_lane : engine_->add_communicator();
    recv_lane_ = send_lane_ + 1;
    if (size_ == 2) {  // (collective, as every constructor call is: split, duplicate, start-up)
      exchange_ = duplicate_resting(comm_);
      MPI_CHECK(MPI_Comm_set_errhandler(exchange_, MPI_ERRORS_RETURN));
      slots_ = std::make_shared<ExchangeSlots>();
    }
  }

  // The attribute lives on MPI_COMM_WORLD (the standard's predefined attributes); one bound a process.
  int64_t largest_tag() const override {
    void* value = nullptr;
    int found = 0;
    MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found));
    return found ? *static_cast<int*>(value) : 32767;
  }

  // Finishes what this communicator issued (every rank issued the same ops, so peers are finishing
  // them too), then frees the MPI communicator.
  ~MpiCommunicator() override {
    engine_->drain(send_lane_, recv_lane_);
    // A handle waited after its communicator is gone would count the op into freed statistics.
    ENSURE(stats_.total_launched() == stats_.total_calls(),
           "a communicator destroyed with ops never waited: wait every CommHandle before its communicator goes");
    if (exchange_ != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&exchange_));
    MPI_CHECK(MPI_Comm_free(&comm_));
  }

  std::unique_ptr<Communicator> split_group(int color, int key, const std::string& group) override {
    // A split is a collective on comm_: it must come after every op issued here
    // before it, on every rank alike, so what the emulated link still holds is posted first.
    engine_->post_held(send_lane_);
    MPI_Comm sub = split_resting(comm_, color, key);
    auto result = std::make_unique<MpiCommunicator>(sub, engine_, group);
    result->set_link_model(link_);
    return result;
  }

  // The copy takes this communicator's two lanes and in-flight sweep: its ops queue on the same
  // emulated link, and the busy and in-flight times of the two add up to the link's. (Its destructor
  // drains the shared lanes: by then every op of both is waited, comm.h.)
  std::unique_ptr<Communicator> duplicate_group(const std::string& group) override {
    engine_->post_held(send_lane_);  // MPI_Comm_idup is a collective on comm_, ordered as split is
    MPI_Comm copy = duplicate_resting(comm_);
    auto result = std::make_unique<MpiCommunicator>(copy, engine_, group, send_lane_);
    result->set_link_model(link_);
    return result;
  }

  CommHandle all_reduce_async(Tensor buf, ReduceOp op) override {
    ensure_cpu(buf);
    ensure_reducible(buf);
    const int64_t bytes = int64_t(buf.bytes());
    if (size_ == 1) return done(CollectiveKind::AllReduce, bytes);
    void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    const MPI_Op reduce = mpi_op(op, buf.dtype);
    const int64_t wire = wire_bytes_for(CollectiveKind::AllReduce, bytes, size_);
    if (exchanges(bytes)) {
      // A slot of the communicator's; past the slots in flight, a buffer of this call's own.
      std::shared_ptr<ExchangeSlots> slots = slots_;
      char* slot = slots->take();
      std::shared_ptr<char[]> own(slot ? nullptr : new char[size_t(bytes)]);
      char* theirs = slot ? slot : own.get();
      return submit_exchange(CollectiveKind::AllReduce, "all_reduce", bytes, data, theirs, n, type, reduce,
                             [slots, slot, own, average = average_if(op, buf, size_)] {
                               if (slot) slots->give_back(slot);
                               if (average) average();
                             });
    }
    return submit(
        CollectiveKind::AllReduce, "all_reduce", bytes, {wire, wire}, send_lane_,
        [=](MPI_Request* r) { MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, n, type, reduce, comm_, r)); },
        average_if(op, buf, size_));
  }

  CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) override {
    ensure_cpu(send);
    ensure_reducible(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "reduce_scatter");
    ENSURE(send.numel() == int64_t(size_) * recv.numel(), "reduce_scatter: send must hold size() x recv elements");
    ENSURE(!overlap(send, recv), "reduce_scatter: send and recv overlap; MPI forbids it, use a separate recv");
    const int64_t bytes = int64_t(send.bytes());
    if (size_ == 1) return done_copy(CollectiveKind::ReduceScatter, bytes, recv, send);
    const void* in = mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const int n = mpi_count(recv.numel());
    const MPI_Datatype type = mpi_type(send.dtype);
    const MPI_Op reduce = mpi_op(op, send.dtype);
    return submit(
        CollectiveKind::ReduceScatter, "reduce_scatter", bytes,
        split_traffic(CollectiveKind::ReduceScatter, even_counts(send.numel(), size_), rank_, dtype_size(send.dtype)),
        send_lane_, [=](MPI_Request* r) { MPI_CHECK(MPI_Ireduce_scatter_block(in, out, n, type, reduce, comm_, r)); },
        average_if(op, recv, size_));
  }

  CommHandle all_gather_async(Tensor send, Tensor recv) override {
    ensure_cpu(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "all_gather");
    ENSURE(recv.numel() == int64_t(size_) * send.numel(), "all_gather: recv must hold size() x send elements");
    const bool in_place = gather_in_place(send, recv, int64_t(rank_) * send.numel(), "all_gather");
    const int64_t bytes = int64_t(recv.bytes());
    if (size_ == 1) return done_copy(CollectiveKind::AllGather, bytes, recv, in_place ? Tensor() : send);
    const void* in = in_place ? MPI_IN_PLACE : mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const int n = mpi_count(send.numel());
    const MPI_Datatype type = mpi_type(recv.dtype);
    return submit(
        CollectiveKind::AllGather, "all_gather", bytes,
        split_traffic(CollectiveKind::AllGather, even_counts(recv.numel(), size_), rank_, dtype_size(recv.dtype)),
        send_lane_, [=](MPI_Request* r) { MPI_CHECK(MPI_Iallgather(in, n, type, out, n, type, comm_, r)); });
  }

  CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                    ReduceOp op) override {
    ensure_cpu(send);
    ensure_reducible(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "reduce_scatter_v");
    VarCounts v = var_counts(counts, size_, "reduce_scatter_v");
    ENSURE(send.numel() == v.total, "reduce_scatter_v: send must hold sum(counts) elements");
    ENSURE(recv.numel() == counts[rank_], "reduce_scatter_v: recv must hold counts[rank()] elements");
    ENSURE(!overlap(send, recv), "reduce_scatter_v: send and recv overlap; MPI forbids it, use a separate recv");
    const int64_t bytes = int64_t(send.bytes());
    if (size_ == 1) return done_copy(CollectiveKind::ReduceScatter, bytes, recv, send);
    const void* in = mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const MPI_Datatype type = mpi_type(send.dtype);
    const MPI_Op reduce = mpi_op(op, send.dtype);
    // The lambda owns the counts (VarCounts above): moved in, they live until the op is destroyed.
    return submit(
        CollectiveKind::ReduceScatter, "reduce_scatter_v", bytes,
        split_traffic(CollectiveKind::ReduceScatter, counts, rank_, dtype_size(send.dtype)), send_lane_,
        [=, c = std::move(v.counts)](MPI_Request* r) {
          MPI_CHECK(MPI_Ireduce_scatter(in, out, c.data(), type, reduce, comm_, r));
        },
        average_if(op, recv, size_));
  }

  CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) override {
    ensure_cpu(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "all_gather_v");
    VarCounts v = var_counts(counts, size_, "all_gather_v");
    ENSURE(send.numel() == counts[rank_], "all_gather_v: send must hold counts[rank()] elements");
    ENSURE(recv.numel() == v.total, "all_gather_v: recv must hold sum(counts) elements");
    const bool in_place = gather_in_place(send, recv, v.displs[rank_], "all_gather_v");
    const int64_t bytes = int64_t(recv.bytes());
    if (size_ == 1) return done_copy(CollectiveKind::AllGather, bytes, recv, in_place ? Tensor() : send);
    const void* in = in_place ? MPI_IN_PLACE : mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const int n = v.counts[rank_];
    const MPI_Datatype type = mpi_type(recv.dtype);
    return submit(CollectiveKind::AllGather, "all_gather_v", bytes,
                  split_traffic(CollectiveKind::AllGather, counts, rank_, dtype_size(recv.dtype)), send_lane_,
                  [=, c = std::move(v.counts), d = std::move(v.displs)](MPI_Request* r) {
                    MPI_CHECK(MPI_Iallgatherv(in, n, type, out, c.data(), d.data(), type, comm_, r));
                  });
  }

  CommHandle all_to_all_async(Tensor send, Tensor recv) override {
    ensure_cpu(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "all_to_all");
    ENSURE(send.numel() == recv.numel() && send.numel() % size_ == 0,
           "all_to_all: send and recv must each hold size() chunks of the same number of elements");
    ENSURE(!overlap(send, recv), "all_to_all: send and recv overlap; MPI forbids it, use a separate recv");
    const int64_t bytes = int64_t(send.bytes());
    if (size_ == 1) return done_copy(CollectiveKind::AllToAll, bytes, recv, send);
    const void* in = mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const int n = mpi_count(send.numel() / size_);
    const MPI_Datatype type = mpi_type(send.dtype);
    const int64_t wire = wire_bytes_for(CollectiveKind::AllToAll, bytes, size_);
    return submit(CollectiveKind::AllToAll, "all_to_all", bytes, {wire, wire}, send_lane_,
                  [=](MPI_Request* r) { MPI_CHECK(MPI_Ialltoall(in, n, type, out, n, type, comm_, r)); });
  }

  CommHandle all_to_all_v_async(Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                const std::vector<int64_t>& recv_counts) override {
    ensure_cpu(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "all_to_all_v");
    VarCounts out_counts = var_counts(send_counts, size_, "all_to_all_v (send_counts)");
    VarCounts in_counts = var_counts(recv_counts, size_, "all_to_all_v (recv_counts)");
    ENSURE(send.numel() == out_counts.total, "all_to_all_v: send must hold sum(send_counts) elements");
    ENSURE(recv.numel() == in_counts.total, "all_to_all_v: recv must hold sum(recv_counts) elements");
    ENSURE(send_counts[rank_] == recv_counts[rank_],
           "all_to_all_v: this rank's own segment must have the same count in send_counts and recv_counts");
    ENSURE(!overlap(send, recv), "all_to_all_v: send and recv overlap; MPI forbids it, use a separate recv");
    const int64_t bytes = int64_t(send.bytes());
    if (size_ == 1) return done_copy(CollectiveKind::AllToAll, bytes, recv, send);
    const DType dtype = send.numel() > 0 ? send.dtype : recv.dtype;
    const int64_t element = int64_t(dtype_size(dtype));
    const Traffic traffic{(out_counts.total - send_counts[rank_]) * element,
                          (in_counts.total - recv_counts[rank_]) * element};
    const void* in = mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const MPI_Datatype type = mpi_type(dtype);
    return submit(CollectiveKind::AllToAll, "all_to_all_v", bytes, traffic, send_lane_,
                  [=, sc = std::move(out_counts.counts), sd = std::move(out_counts.displs),
                   rc = std::move(in_counts.counts), rd = std::move(in_counts.displs)](MPI_Request* r) {
                    MPI_CHECK(MPI_Ialltoallv(in, sc.data(), sd.data(), type, out, rc.data(), rd.data(), type, comm_, r));
                  },
                  {}, -1, all_to_all_v_link_bytes(traffic.sent, traffic.received, size_));
  }

  CommHandle broadcast_async(Tensor buf, int root) override {
    ensure_cpu(buf);
    ENSURE(root >= 0 && root < size_, "broadcast: root out of range");
    const int64_t bytes = int64_t(buf.bytes());
    if (size_ == 1) return done(CollectiveKind::Broadcast, bytes);
    void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    // Pipelined along a chain: every rank but the last passes the payload on; all but the root receive it.
    return submit(CollectiveKind::Broadcast, "broadcast", bytes, {bytes, rank_ == root ? 0 : bytes}, send_lane_,
                  [=](MPI_Request* r) { MPI_CHECK(MPI_Ibcast(data, n, type, root, comm_, r)); });
  }

  CommHandle send_async(Tensor buf, int peer, int tag) override {
    ensure_cpu(buf);
    ENSURE(peer >= 0 && peer < size_, "send: peer out of range");
    ENSURE(tag >= 0, "send: tags are non-negative");
    const void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    const int64_t bytes = int64_t(buf.bytes());
    return submit(
        CollectiveKind::SendRecv, "send", bytes, {peer == rank_ ? 0 : bytes, 0}, send_lane_,
        [=](MPI_Request* r) { MPI_CHECK(MPI_Isend(data, n, type, peer, tag, comm_, r)); }, {}, peer);
  }

  CommHandle recv_async(Tensor buf, int peer, int tag) override {
    ensure_cpu(buf);
    ENSURE(peer >= 0 && peer < size_, "recv: peer out of range");
    ENSURE(tag >= 0, "recv: tags are non-negative");
    void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    const int64_t bytes = int64_t(buf.bytes());
    // Not held: the sender's lane already held the message for its modelled time.
    return submit(
        CollectiveKind::SendRecv, "recv", bytes, {0, peer == rank_ ? 0 : bytes}, recv_lane_,
        [=](MPI_Request* r) { MPI_CHECK(MPI_Irecv(data, n, type, peer, tag, comm_, r)); }, {}, peer);
  }

  // A send and a receive waited at once with no emulated link to hold the send (each step of
  // chapter 00's algorithms): one op of two requests, as the two-rank exchange is, posted and
  // polled by the caller, instead of two ops and a handle over both; the same counters (one call
  // for the pair), half the bookkeeping. Anything else, each message on its own (comm.cpp).
  CommHandle send_recv_async(const std::vector<PointToPoint>& ops) override {
    if (!issuing_blocking_ || link_.on() || ops.size() != 2 || ops[0].send == ops[1].send)
      return Communicator::send_recv_async(ops);
    const PointToPoint& out = ops[0].send ? ops[0] : ops[1];
    const PointToPoint& in = ops[0].send ? ops[1] : ops[0];
    for (const PointToPoint* m : {&out, &in}) {
      ensure_cpu(m->buf);
      ENSURE(m->peer >= 0 && m->peer < size_, "send_recv: peer out of range");
      ENSURE(m->tag >= 0, "send_recv: tags are non-negative");
    }
    const void* sent = out.buf.data;
    void* received = in.buf.data;
    const int n_out = mpi_count(out.buf.numel()), n_in = mpi_count(in.buf.numel());
    const MPI_Datatype type_out = mpi_type(out.buf.dtype), type_in = mpi_type(in.buf.dtype);
    const int to = out.peer, from = in.peer, tag_out = out.tag, tag_in = in.tag;
    const int64_t bytes_out = int64_t(out.buf.bytes()), bytes_in = int64_t(in.buf.bytes());
    return submit(
        CollectiveKind::SendRecv, "send_recv", bytes_out + bytes_in,
        {to == rank_ ? 0 : bytes_out, from == rank_ ? 0 : bytes_in}, send_lane_,
        [=](MPI_Request* r) {
          MPI_CHECK(MPI_Irecv(received, n_in, type_in, from, tag_in, comm_, &r[0]));
          MPI_CHECK(MPI_Isend(sent, n_out, type_out, to, tag_out, comm_, &r[1]));
        },
        {}, from, -1, /*requests=*/2);
  }

  CommHandle barrier_async() override {
    if (size_ == 1) return done(CollectiveKind::Barrier, 0);
    return submit(CollectiveKind::Barrier, "barrier", 0, {0, 0}, send_lane_,
                  [=](MPI_Request* r) { MPI_CHECK(MPI_Ibarrier(comm_, r)); });
  }

  // Through the engine like everything else: an MPI_Allreduce called directly could be posted
  // before or after a held collective, and the ranks would disagree on the order.
  double all_reduce_scalar(double value, ReduceOp op) override {
    if (size_ == 1) {
      done(CollectiveKind::Scalar, sizeof(double)).wait();
      return value;
    }
    // Shared with the op's lambdas, which the engine may destroy after this function returned. The
    // second is the peer's value, where the two ranks exchange theirs (submit_exchange).
    std::shared_ptr<double[]> v(new double[2]{value, 0.0});
    const int ranks = size_;
    const int64_t wire = wire_bytes_for(CollectiveKind::Scalar, sizeof(double), size_);
    const auto average = [=] {
      if (op == ReduceOp::Avg) v[0] /= ranks;
    };
    issuing_blocking_ = true;  // waited at once, below
    CommHandle handle =
        exchanges(sizeof(double))
            ? submit_exchange(CollectiveKind::Scalar, "all_reduce_scalar", sizeof(double), v.get(), v.get() + 1, 1,
                              MPI_DOUBLE, mpi_op(op, DType::F32), average)
            : submit(
                  CollectiveKind::Scalar, "all_reduce_scalar", sizeof(double), {wire, wire}, send_lane_,
                  [=](MPI_Request* r) {
                    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.get(), 1, MPI_DOUBLE, mpi_op(op, DType::F32), comm_, r));
                  },
                  average);
    issuing_blocking_ = false;
    handle.wait();
    return v[0];  // written by the engine before it completed the op, which wait() synchronised with
  }

  void broadcast_bytes(void* data, size_t bytes, int root) override {
    ENSURE(root >= 0 && root < size_, "broadcast_bytes: root out of range");
    ENSURE(data != nullptr || bytes == 0, "broadcast_bytes: null data");
    if (size_ == 1) return done(CollectiveKind::Broadcast, int64_t(bytes)).wait();
    // MPI counts are int, so payloads past 2 GiB (a large checkpoint) go in chunks of 1 GiB; each
    // chunk counts as one broadcast call.
    constexpr size_t kChunk = size_t(1) << 30;
    std::vector<CommHandle> chunks;
    size_t offset = 0;
    issuing_blocking_ = true;  // all waited right below
    do {
      char* p = static_cast<char*>(data) + offset;
      const int n = int(std::min(kChunk, bytes - offset));
      chunks.push_back(submit(CollectiveKind::Broadcast, "broadcast_bytes", n, {n, rank_ == root ? 0 : n}, send_lane_,
                              [=](MPI_Request* r) { MPI_CHECK(MPI_Ibcast(p, n, MPI_BYTE, root, comm_, r)); }));
      offset += size_t(n);
    } while (offset < bytes);
    issuing_blocking_ = false;
    for (CommHandle& h : chunks) h.wait();
  }

  void agree_or_die(bool ok, const std::string& msg) override {
    // Every rank contributes its own rank if it failed and size() if it did not; the minimum is the
    // lowest failing rank, or size() when all succeeded.
    const int first_failed = int(all_reduce_scalar(ok ? size_ : rank_, ReduceOp::Min));
    if (first_failed == size_) return;
    // Every rank of this group knows now; one that is not in it would wait for it forever, and the
    // job ends the old way (check.h, agreed_error).
    if (size_ == world_size()) agreed_error(msg, first_failed == rank_);
    if (first_failed == rank_) fatal(msg);
    // Give the failing rank time to print before this rank's abort takes the whole job down.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    MPI_CHECK(MPI_Abort(MPI_COMM_WORLD, 1));
  }

 private:
  std::shared_ptr<CommHandle::State> new_state(CollectiveKind kind, int64_t payload_bytes, Traffic traffic) {
    auto state = std::make_shared<CommHandle::State>();
    state->kind = kind;
    state->payload_bytes = payload_bytes;
    state->sent_bytes = traffic.sent;
    state->received_bytes = traffic.received;
    state->stats = &stats_;
    state->engine = engine_;
    state->sweep = send_lane_ / 2;  // (the link it is charged to, submitted or done at once)
    // The only counter written at issue (comm_engine.cpp's opening comment); this thread owns stats_.
    stats_.kind[int(kind)].launched += 1;
    return state;
  }

  // `peer`: a send's or receive's other rank in the group; -1 for a collective. `link_bytes`: the
  // payload the emulated link holds the op for (-1: payload_bytes; all_to_all_v's own, comm.h).
  CommHandle submit(CollectiveKind kind, const char* name, int64_t payload_bytes, Traffic traffic, int lane,
                    std::function<void(MPI_Request*)> start, std::function<void()> finish = {}, int peer = -1,
                    int64_t link_bytes = -1, int requests = 1) {
    auto op = std::make_unique<MpiOp>();
    op->handle = new_state(kind, payload_bytes, traffic);
    op->handle->name = name;
    op->name = name;
    op->group = &info_;
    op->peer = peer;
    op->link_flags = link_.flags;
    op->start = std::move(start);
    op->finish = std::move(finish);
    op->requests = requests;
    op->lane = lane;
    CommHandle handle(op->handle);
    // The link model of this moment: link_ belongs to the issuing thread (set_link_model).
    const double link_ms =
        lane == recv_lane_ ? 0.0 : modelled_ms(link_, kind, link_bytes >= 0 ? link_bytes : payload_bytes, size_);
    // Waited at once and not held by the link: posted here and now (the small-message path).
    if (issuing_blocking_ && link_ms == 0 && engine_->post_direct(op)) return handle;
    engine_->submit(std::move(op), link_ms, issuing_blocking_);
    return handle;
  }

  // Whether an all-reduce of `bytes` is one exchange between two ranks (submit_exchange): a small
  // payload (up to kExchangeMaxBytes) over a group of 2. Its size and the group's alone decide, so
  // that every rank of the group makes the same MPI calls.
  bool exchanges(int64_t bytes) const { return exchange_ != MPI_COMM_NULL && bytes <= kExchangeMaxBytes; }

  // An all-reduce of `n` elements at `data` over a group of two ranks, as one exchange: a receive of
  // the peer's values into `theirs` and a send of ours, on exchange_ (a copy of comm_ that carries
  // nothing else: a message of the caller's own, sent on comm_, can never be taken for one), then
  // data = theirs op data (reduce_into) and `then`. MPICH's non-blocking MPI_Iallreduce, polled,
  // takes 1.2x its own blocking MPI_Allreduce at 4 KB and 1.8x at 4 B; the exchange 0.7-0.9x of it
  // (docs/benchmarks.md). Both ranks hold the same result to the bit: each adds the other's value
  // to its own, and a + b == b + a in floating point (a max or min of +0 and -0 aside, which compare
  // equal). The bytes are an all-reduce's at N = 2, S each way. `then` also gives `theirs` back (or
  // keeps it alive) once the op is done.
  CommHandle submit_exchange(CollectiveKind kind, const char* name, int64_t bytes, void* data, void* theirs, int n,
                             MPI_Datatype type, MPI_Op reduce, std::function<void()> then) {
    const int peer = 1 - rank_;
    const MPI_Comm exchange = exchange_;
    return submit(
        kind, name, bytes, {bytes, bytes}, send_lane_,
        [=](MPI_Request* r) {
          MPI_CHECK(MPI_Irecv(theirs, n, type, peer, 0, exchange, &r[0]));
          MPI_CHECK(MPI_Isend(data, n, type, peer, 0, exchange, &r[1]));
        },
        [=, then = std::move(then)] {
          reduce_into(data, theirs, n, type, reduce);
          then();
        },
        -1, -1, /*requests=*/2);
  }

  // A collective of one rank: nothing to exchange, complete at issue.
  CommHandle done(CollectiveKind kind, int64_t payload_bytes) {
    auto state = new_state(kind, payload_bytes, {0, 0});
    state->issued = state->completed = Clock::now();
    state->done = true;
    return CommHandle(state);
  }
  // The same where the result goes to another buffer: the copy (none when `from` is empty).
  CommHandle done_copy(CollectiveKind kind, int64_t payload_bytes, const Tensor& to, const Tensor& from) {
    if (from.numel() > 0) std::memcpy(to.data, from.data, to.bytes());
    return done(kind, payload_bytes);
  }

  // The MPI_COMM_WORLD rank of each member of `comm`, by its rank there (a local lookup, no message).
  static std::vector<int> world_ranks(MPI_Comm comm, int size) {
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_CHECK(MPI_Comm_group(comm, &group));
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> ranks(size_t(size), 0), in_world(size_t(size), 0);
    for (int i = 0; i < size; i++) ranks[size_t(i)] = i;
    MPI_CHECK(MPI_Group_translate_ranks(group, size, ranks.data(), world, in_world.data()));
    MPI_CHECK(MPI_Group_free(&group));
    MPI_CHECK(MPI_Group_free(&world));
    return in_world;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm exchange_ = MPI_COMM_NULL;  // a group of 2: a copy of comm_ for the exchanges alone
  std::shared_ptr<ExchangeSlots> slots_;  // a group of 2: the exchanges' receive buffers
  std::shared_ptr<ProgressEngine> engine_;
  GroupInfo info_;  // the ops' group (MpiOp::group)
  int send_lane_ = 0, recv_lane_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The world's communicator, for start-up (comm_mpi_startup.cpp)

std::unique_ptr<Communicator> make_mpi_world_communicator(MPI_Comm world, bool may_spin) {
  auto engine = std::make_shared<ProgressEngine>(may_spin);
  g_engine = engine;
  return std::make_unique<MpiCommunicator>(world, engine, "world");
}

bool mpi_engine_in_use() { return !g_engine.expired(); }
