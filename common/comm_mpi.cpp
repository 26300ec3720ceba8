// comm_mpi.cpp: the MPI implementation of comm.h, built around one communication thread per rank.
// Defines init_mpi_communicator / shutdown_mpi, CommHandle::wait, modelled_ms, collective_name and
// the CommStats totals.
//
// How a collective travels:
//   caller thread:  all_reduce_async(buf) -> checks the tensor, computes the byte counts and the
//                   modelled link time, queues an op and returns a CommHandle at once.
//   comm thread:    takes ops off the queue in FIFO order and starts each one as a non-blocking MPI
//                   call (MPI_Iallreduce, ...). FIFO is what makes this correct: every rank queues
//                   its collectives in program order, so every rank starts them in the same order,
//                   which MPI requires of collectives on one communicator. Started ops then progress
//                   together and the thread retires them in order when MPI reports them complete.
//   caller thread:  handle.wait() sleeps on a condition variable until the op is retired. The time
//                   it sleeps is the "exposed" communication: the part that compute did not hide.
//
// Several ops may be in flight at once. This is what lets a rank post a send and a receive and wait
// for both (a ring, a pipeline stage): if the thread ran one op to completion before starting the
// next, every rank of a ring would sit in its send, waiting for a receive nobody has posted yet.
//
// Emulated link (LinkModel, off when gbps == 0). An alpha-beta model of a ring over N ranks,
// with S the payload in bytes, alpha the per-message latency and beta = gbps * 1e9 / 8 bytes/s:
//   all_reduce                   2(N-1) * (alpha + S / (N beta))   reduce-scatter, then all-gather
//   reduce_scatter, all_gather    (N-1) * (alpha + S / (N beta))   S = the full (N-chunk) size
//   broadcast, send, recv                  alpha + S / beta         pipelined: the payload once
//   barrier                       2(N-1) * alpha                     an all-reduce of nothing
//   scalar                        as all_reduce with S = 8 bytes
// and 0 when N == 1 or the link is off. An op retires no earlier than its modelled end; the thread
// sleeps out the difference. The link carries one op at a time, so ops queued together finish one
// modelled time after another, as buckets do on a real link. Receives get a lane of their own: a
// link is full duplex, so what a rank receives does not queue behind what it sends.
//
// Statistics. The comm thread measures each op (busy time, share of the in-flight time) into the
// op's handle; wait(), on the caller's thread, adds the op to stats_. So stats_ is written only by
// the thread that issues and waits, which is the thread that reads it: no lock, no race, and a copy
// of stats() taken between steps is always consistent. The price: an op is counted when it is
// waited, so wait every handle (MPI asks the same of every request; the blocking forms do it for
// you). The one exception is `launched`, counted by enqueue() at issue, on that same thread: it
// answers "was anything started before this point?", which a count at wait() cannot.
//
// Busy time and in-flight time. Each lane charges an op from its start or from the retirement of
// the lane's previous op, whichever is later, so the busy times of one lane add up to the time that
// lane was busy. The two lanes still overlap (a pipeline's send and receive), and their busy times
// then add up to more than the time anything was in flight. CommStats::in_flight_ms is that time,
// the union of all in-flight intervals; InFlightSweep below splits it among the ops.
#include "comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bf16.h"
#include "trace.h"

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Names, totals and the link model

const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::SendRecv: return "send_recv";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::Scalar: return "scalar";
    case CollectiveKind::Count: break;
  }
  return "?";
}

int64_t CommStats::total_calls() const {
  int64_t n = 0;
  for (const CollectiveCounters& c : kind) n += c.calls;
  return n;
}

int64_t CommStats::total_launched() const {
  int64_t n = 0;
  for (const CollectiveCounters& c : kind) n += c.launched;
  return n;
}

int64_t CommStats::total_wire_bytes() const {
  int64_t n = 0;
  for (const CollectiveCounters& c : kind) n += c.wire_bytes;
  return n;
}

double CommStats::total_busy_ms() const {
  double ms = 0;
  for (const CollectiveCounters& c : kind) ms += c.busy_ms;
  return ms;
}

// A scalar is an all-reduce of 8 bytes. (A receive sends nothing at all: recv_async says so to
// enqueue.)
int64_t wire_bytes_for(CollectiveKind kind, int64_t payload, int n) {
  if (n <= 1) return 0;
  switch (kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::Scalar: return 2 * (n - 1) * payload / n;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather: return (n - 1) * payload / n;
    default: return payload;
  }
}

double modelled_ms(const LinkModel& link, CollectiveKind kind, int64_t payload_bytes, int ranks) {
  if (ranks <= 1 || link.gbps <= 0) return 0;
  const double n = ranks;
  const double alpha = link.latency_us * 1e-6;  // seconds
  const double beta = link.gbps * 1e9 / 8;      // bytes per second
  const double S = double(payload_bytes);
  double seconds = 0;
  switch (kind) {
    case CollectiveKind::AllReduce: seconds = 2 * (n - 1) * (alpha + S / (n * beta)); break;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather: seconds = (n - 1) * (alpha + S / (n * beta)); break;
    case CollectiveKind::Broadcast:
    case CollectiveKind::SendRecv: seconds = alpha + S / beta; break;
    case CollectiveKind::Barrier: seconds = 2 * (n - 1) * alpha; break;
    case CollectiveKind::Scalar: seconds = 2 * (n - 1) * (alpha + 8 / (n * beta)); break;
    case CollectiveKind::Count: break;
  }
  return seconds * 1e3;
}

namespace {


// bf16 tensors (the host-staged copies of mixed-precision GPU tensors, comm_nccl.cpp) travel as
// 16-bit words, MPI_UINT16_T, so every byte on the wire is what theory counts. MPI cannot add those
// words itself: reductions on them use user-defined ops that widen each pair to fp32, combine, and
// round back (bf16.h), as NCCL does on the GPU. Created once, after MPI_Init (MpiCommunicator).
template <typename Combine>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16_bits* a = static_cast<const bf16_bits*>(in);
  bf16_bits* b = static_cast<bf16_bits*>(inout);
  for (int i = 0; i < *len; i++) b[i] = float_to_bf16(Combine()(bf16_to_float(a[i]), bf16_to_float(b[i])));
}
struct Add { float operator()(float a, float b) const { return a + b; } };
struct Larger { float operator()(float a, float b) const { return std::max(a, b); } };
struct Smaller { float operator()(float a, float b) const { return std::min(a, b); } };
MPI_Op g_bf16_sum = MPI_OP_NULL, g_bf16_max = MPI_OP_NULL, g_bf16_min = MPI_OP_NULL;

void create_bf16_ops() {
  if (g_bf16_sum != MPI_OP_NULL) return;
  MPI_CHECK(MPI_Op_create(&bf16_reduce<Add>, /*commute=*/1, &g_bf16_sum));
  MPI_CHECK(MPI_Op_create(&bf16_reduce<Larger>, 1, &g_bf16_max));
  MPI_CHECK(MPI_Op_create(&bf16_reduce<Smaller>, 1, &g_bf16_min));
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::BF16 ? MPI_UINT16_T : MPI_FLOAT; }

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const bool bf16 = dtype == DType::BF16;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return bf16 ? g_bf16_sum : MPI_SUM;  // then scaled by 1/N: MPI has no average
    case ReduceOp::Max: return bf16 ? g_bf16_max : MPI_MAX;
    case ReduceOp::Min: return bf16 ? g_bf16_min : MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are int. 2^31 - 1 floats is 8 GiB in one call, beyond any buffer this course builds.
int mpi_count(int64_t n) {
  ENSURE(n >= 0 && n <= INT_MAX, "more than INT_MAX elements in one MPI call");
  return int(n);
}

void ensure_cpu(const Tensor& t) {
  ENSURE(t.device == Device::CPU && (t.dtype == DType::F32 || t.dtype == DType::BF16),
         "the MPI communicator moves CPU fp32 and bf16 tensors; CUDA tensors need the NCCL or host-staged one");
  ENSURE(t.data != nullptr || t.numel() == 0, "tensor without memory");
}

// An empty side (a rank that owns none of a range passes Tensor()) has no dtype to compare.
void ensure_same_dtype(const Tensor& send, const Tensor& recv, const char* what) {
  if (send.numel() == 0 || recv.numel() == 0) return;
  ENSURE(send.dtype == recv.dtype, std::string(what) + ": send and recv differ in dtype");
}

// Whether two tensors share a byte. An empty tensor shares none, wherever its pointer points.
bool overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

// The buffer handed to MPI: null for an empty tensor. MPI touches no byte of it either way, but
// MPICH checks that a send and a receive buffer do not start at the same address, and an empty view
// may well start where the other buffer does (the last piece of a range, a rank that owns none of it).
void* mpi_buffer(const Tensor& t) { return t.numel() == 0 ? nullptr : t.data; }

// Whether an all-gather runs in place: `send` IS this rank's segment of `recv`, which starts
// `own_offset` elements in (comm.h). Then MPI takes this rank's contribution from recv (MPI_IN_PLACE).
// Any other overlap would have MPI read a segment while another rank's data overwrites it: ENSURE.
bool gather_in_place(const Tensor& send, const Tensor& recv, int64_t own_offset, const char* what) {
  if (send.numel() > 0 && send.data == recv.slice1d(own_offset, send.numel()).data) return true;
  ENSURE(!overlap(send, recv), std::string(what) + ": send overlaps recv without being this rank's own "
                               "segment of it; MPI forbids that (in place, send must be exactly that segment)");
  return false;
}

// The counts of a variable-count collective as MPI wants them, int, with the displacement of each
// segment. Checked, and copied: the caller's vector may die before the comm thread starts the op,
// and MPI reads these arrays until the op completes, so the op's lambda owns them.
struct VarCounts {
  std::vector<int> counts, displs;
  int64_t total = 0;
};

VarCounts var_counts(const std::vector<int64_t>& counts, int ranks, const char* what) {
  ENSURE(int(counts.size()) == ranks, std::string(what) + ": counts must have one entry per rank");
  VarCounts v;
  for (int64_t c : counts) {
    ENSURE(c >= 0, std::string(what) + ": negative count");
    v.displs.push_back(mpi_count(v.total));
    v.counts.push_back(mpi_count(c));
    v.total += c;
  }
  mpi_count(v.total);  // every displacement fits an int only if the total does
  return v;
}

// What the comm thread runs after the MPI call for `op`: nothing, or for Avg the scaling of the sum
// by 1/N (one multiply per element, cheaper than a divide; tests expect exactly sum * (1.0f / N)),
// in fp32 and rounded once for bf16.
std::function<void()> average_if(ReduceOp op, const Tensor& t, int ranks) {
  if (op != ReduceOp::Avg || t.numel() == 0) return {};
  const float inv_ranks = 1.0f / float(ranks);
  const int64_t n = t.numel();
  if (t.dtype == DType::BF16) {
    bf16_bits* data = static_cast<bf16_bits*>(t.data);
    return [=] {
      for (int64_t i = 0; i < n; i++) data[i] = float_to_bf16(bf16_to_float(data[i]) * inv_ranks);
    };
  }
  float* data = t.f32();
  return [=] {
    for (int64_t i = 0; i < n; i++) data[i] *= inv_ranks;
  };
}

// Polling: MPICH makes progress only inside MPI calls (no background thread by default), so the
// comm thread must keep calling MPI_Test for an op to advance. Calling it in a tight loop would
// occupy a whole core, the core the compute thread needs; with 4 ranks on 2 cores it would halve
// the compute of the whole job. So the thread sleeps between polls: briefly at first, because a
// small collective finishes within a few polls and its latency is what the caller waits for, then
// 10 us longer after each poll that changed nothing, up to 200 us for a long transfer. (Linux adds
// up to 50 us of timer slack to each sleep, so the shortest sleeps are really ~60 us.)
constexpr std::chrono::microseconds kPollMin{10};
constexpr std::chrono::microseconds kPollStep{10};
constexpr std::chrono::microseconds kPollMax{200};

// Receives travel on their own lane of the emulated link; everything else shares the first.
enum Lane { kSendLane = 0, kRecvLane = 1, kLanes = 2 };

// Splits the union of the ops' in-flight intervals (CommStats::in_flight_ms) among the ops, so that
// each op's share is known when it retires and wait() can add it up like the other counters.
// The comm thread sees every start and every retirement, in time order; between two such moments
// the set of ops in flight does not change. So it sweeps along: a retiring op is charged the time
// since the previous retirement, or since the current stretch of activity began (an op started
// while nothing was in flight), whichever is later. Every moment when something was in flight is
// then charged to exactly one op, the next one to retire.
//
// Why not charge each op from its own start, max(start, previous end), as a lane's busy time does?
// Because retirements come in start order only within a lane. A receive started at 0 that retires at
// 100, with a send-lane op from 30 to 80 retiring first, would be charged 100 - 80: the stretch
// 0..30, when only the receive was in flight, would be lost.
class InFlightSweep {
 public:
  void op_started(Clock::time_point t) {
    if (in_flight_++ == 0) charged_until_ = t;
  }
  // The retiring op's share, in ms.
  double op_retired(Clock::time_point t) {
    in_flight_--;
    const double ms = std::chrono::duration<double, std::milli>(t - charged_until_).count();
    charged_until_ = t;
    return ms;
  }

 private:
  int in_flight_ = 0;                // ops started and not yet retired, on both lanes
  Clock::time_point charged_until_;  // the time up to which in-flight time has been charged
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// CommHandle: what the caller holds while an op is in flight

struct CommHandle::State {
  // Set by the issuing thread before the op is queued; read-only afterwards.
  CollectiveKind kind = CollectiveKind::AllReduce;
  int64_t payload_bytes = 0;
  int64_t wire_bytes = 0;
  CommStats* stats = nullptr;  // the issuing communicator's; wait() counts the op there

  // The comm thread sets busy_ms, then done; the waiter reads them. Guarded by mutex.
  std::mutex mutex;
  std::condition_variable retired;
  bool done = false;
  double busy_ms = 0;
  double in_flight_ms = 0;  // this op's share of the union of in-flight intervals (InFlightSweep)
  bool counted = false;  // set by the first wait(), so that waiting twice counts once
};

void CommHandle::wait() {
  if (device_wait_) return (*device_wait_)();  // a device communicator's handle (comm.h)
  ENSURE(state_ != nullptr, "wait() on an empty CommHandle");
  State& s = *state_;
  double blocked_from = 0, blocked_to = 0;
  bool first_wait;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    if (!s.done) {
      blocked_from = now_ms();
      s.retired.wait(lock, [&] { return s.done; });  // sleeps; no CPU while the op runs
      blocked_to = now_ms();
    }
    first_wait = !s.counted;
    s.counted = true;
  }
  // stats_ belongs to the thread that issues and waits (see the file comment): no lock needed.
  const double blocked = blocked_to - blocked_from;
  s.stats->exposed_ms += blocked;
  if (blocked > 0)
    trace_span(Track::Wait, std::string("wait ") + collective_name(s.kind), blocked_from, blocked_to);
  if (first_wait) {
    CollectiveCounters& c = s.stats->kind[int(s.kind)];
    c.calls += 1;
    c.payload_bytes += s.payload_bytes;
    c.wire_bytes += s.wire_bytes;
    c.busy_ms += s.busy_ms;
    s.stats->in_flight_ms += s.in_flight_ms;
  }
}

// ---------------------------------------------------------------------------------------------
// The MPI communicator

namespace {

// One queued or in-flight op. The issuing thread fills in the first part; from the moment the op is
// queued, the comm thread owns it.
struct MpiOp {
  std::shared_ptr<CommHandle::State> handle;
  const char* name = "";                        // for the trace: "all_reduce", "send", ...
  std::function<void(MPI_Request*)> start;      // posts the non-blocking MPI call
  std::function<void()> finish;                 // after MPI completes (the Avg scaling); may be empty
  double modelled_ms = 0;                       // fixed at enqueue, with the link model of that moment
  Lane lane = kSendLane;
  // ---- comm thread only
  MPI_Request request = MPI_REQUEST_NULL;
  bool mpi_done = false;
  Clock::time_point started;
  Clock::time_point link_done;  // the op retires no earlier than this (its modelled end)
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    // A private copy of MPI_COMM_WORLD: our collectives and messages cannot be confused with MPI
    // calls made elsewhere in the process (the test harness, a library) on MPI_COMM_WORLD.
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    create_bf16_ops();
    thread_ = std::thread([this] { progress_loop(); });
  }

  // Finishes what is queued (every rank queued the same ops, so peers are finishing them too), then
  // stops the thread.
  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_one();
    thread_.join();
    MPI_CHECK(MPI_Comm_free(&comm_));
  }

  CommHandle all_reduce_async(Tensor buf, ReduceOp op) override {
    ensure_cpu(buf);
    void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    const MPI_Op reduce = mpi_op(op, buf.dtype);
    return enqueue(
        CollectiveKind::AllReduce, "all_reduce", int64_t(buf.bytes()), kSendLane,
        [=](MPI_Request* r) { MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, n, type, reduce, comm_, r)); },
        average_if(op, buf, size_));
  }

  CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) override {
    ensure_cpu(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "reduce_scatter");
    ENSURE(send.numel() == int64_t(size_) * recv.numel(), "reduce_scatter: send must hold size() x recv elements");
    ENSURE(!overlap(send, recv), "reduce_scatter: send and recv overlap; MPI forbids it, use a separate recv");
    const void* in = mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const int n = mpi_count(recv.numel());
    const MPI_Datatype type = mpi_type(send.dtype);
    const MPI_Op reduce = mpi_op(op, send.dtype);
    return enqueue(
        CollectiveKind::ReduceScatter, "reduce_scatter", int64_t(send.bytes()), kSendLane,
        [=](MPI_Request* r) { MPI_CHECK(MPI_Ireduce_scatter_block(in, out, n, type, reduce, comm_, r)); },
        average_if(op, recv, size_));
  }

  CommHandle all_gather_async(Tensor send, Tensor recv) override {
    ensure_cpu(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "all_gather");
    ENSURE(recv.numel() == int64_t(size_) * send.numel(), "all_gather: recv must hold size() x send elements");
    const bool in_place = gather_in_place(send, recv, int64_t(rank_) * send.numel(), "all_gather");
    const void* in = in_place ? MPI_IN_PLACE : mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const int n = mpi_count(send.numel());
    const MPI_Datatype type = mpi_type(recv.dtype);
    return enqueue(CollectiveKind::AllGather, "all_gather", int64_t(recv.bytes()), kSendLane, [=](MPI_Request* r) {
      MPI_CHECK(MPI_Iallgather(in, n, type, out, n, type, comm_, r));
    });
  }

  CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                    ReduceOp op) override {
    ensure_cpu(send);
    ensure_cpu(recv);
    ensure_same_dtype(send, recv, "reduce_scatter_v");
    VarCounts v = var_counts(counts, size_, "reduce_scatter_v");
    ENSURE(send.numel() == v.total, "reduce_scatter_v: send must hold sum(counts) elements");
    ENSURE(recv.numel() == counts[rank_], "reduce_scatter_v: recv must hold counts[rank()] elements");
    ENSURE(!overlap(send, recv), "reduce_scatter_v: send and recv overlap; MPI forbids it, use a separate recv");
    const void* in = mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const MPI_Datatype type = mpi_type(send.dtype);
    const MPI_Op reduce = mpi_op(op, send.dtype);
    // The lambda owns the counts (VarCounts above): moved in, they live until the op is destroyed.
    return enqueue(
        CollectiveKind::ReduceScatter, "reduce_scatter_v", int64_t(send.bytes()), kSendLane,
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
    const void* in = in_place ? MPI_IN_PLACE : mpi_buffer(send);
    void* out = mpi_buffer(recv);
    const int n = v.counts[rank_];
    const MPI_Datatype type = mpi_type(recv.dtype);
    return enqueue(CollectiveKind::AllGather, "all_gather_v", int64_t(recv.bytes()), kSendLane,
                   [=, c = std::move(v.counts), d = std::move(v.displs)](MPI_Request* r) {
                     MPI_CHECK(MPI_Iallgatherv(in, n, type, out, c.data(), d.data(), type, comm_, r));
                   });
  }

  CommHandle broadcast_async(Tensor buf, int root) override {
    ensure_cpu(buf);
    ENSURE(root >= 0 && root < size_, "broadcast: root out of range");
    void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    return enqueue(CollectiveKind::Broadcast, "broadcast", int64_t(buf.bytes()), kSendLane,
                   [=](MPI_Request* r) { MPI_CHECK(MPI_Ibcast(data, n, type, root, comm_, r)); });
  }

  CommHandle send_async(Tensor buf, int peer) override {
    ensure_cpu(buf);
    ENSURE(peer >= 0 && peer < size_, "send: peer out of range");
    const void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    // One tag for everything: MPI keeps messages between two ranks in order, and both sides issue
    // them in program order, so the k-th send to a peer matches that peer's k-th receive.
    return enqueue(CollectiveKind::SendRecv, "send", int64_t(buf.bytes()), kSendLane,
                   [=](MPI_Request* r) { MPI_CHECK(MPI_Isend(data, n, type, peer, 0, comm_, r)); });
  }

  CommHandle recv_async(Tensor buf, int peer) override {
    ensure_cpu(buf);
    ENSURE(peer >= 0 && peer < size_, "recv: peer out of range");
    void* data = buf.data;
    const int n = mpi_count(buf.numel());
    const MPI_Datatype type = mpi_type(buf.dtype);
    return enqueue(
        CollectiveKind::SendRecv, "recv", int64_t(buf.bytes()), kRecvLane,
        [=](MPI_Request* r) { MPI_CHECK(MPI_Irecv(data, n, type, peer, 0, comm_, r)); }, {},
        /*sends_nothing=*/true);
  }

  CommHandle barrier_async() override {
    return enqueue(CollectiveKind::Barrier, "barrier", 0, kSendLane,
                   [=](MPI_Request* r) { MPI_CHECK(MPI_Ibarrier(comm_, r)); });
  }

  // Through the comm thread like everything else: a second thread calling MPI_Allreduce directly
  // could start it before or after a queued collective, and the ranks would disagree on the order.
  double all_reduce_scalar(double value, ReduceOp op) override {
    // Shared with the op's lambdas, which the comm thread destroys after this function returned.
    auto v = std::make_shared<double>(value);
    const int ranks = size_;
    enqueue(
        CollectiveKind::Scalar, "all_reduce_scalar", sizeof(double), kSendLane,
        [=](MPI_Request* r) {
          MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.get(), 1, MPI_DOUBLE, mpi_op(op, DType::F32), comm_, r));
        },
        [=] {
          if (op == ReduceOp::Avg) *v /= ranks;
        })
        .wait();
    return *v;  // written by the comm thread before it retired the op, which wait() synchronised with
  }

  void broadcast_bytes(void* data, size_t bytes, int root) override {
    ENSURE(root >= 0 && root < size_, "broadcast_bytes: root out of range");
    ENSURE(data != nullptr || bytes == 0, "broadcast_bytes: null data");
    // MPI counts are int, so payloads past 2 GiB (a large checkpoint) go in chunks of 1 GiB; each
    // chunk counts as one broadcast call.
    constexpr size_t kChunk = size_t(1) << 30;
    std::vector<CommHandle> chunks;
    size_t offset = 0;
    do {
      char* p = static_cast<char*>(data) + offset;
      const int n = int(std::min(kChunk, bytes - offset));
      chunks.push_back(enqueue(CollectiveKind::Broadcast, "broadcast_bytes", n, kSendLane, [=](MPI_Request* r) {
        MPI_CHECK(MPI_Ibcast(p, n, MPI_BYTE, root, comm_, r));
      }));
      offset += size_t(n);
    } while (offset < bytes);
    for (CommHandle& h : chunks) h.wait();
  }

  void agree_or_die(bool ok, const std::string& msg) override {
    // Every rank contributes its own rank if it failed and size() if it did not; the minimum is the
    // lowest failing rank, or size() when all succeeded.
    const int first_failed = int(all_reduce_scalar(ok ? size_ : rank_, ReduceOp::Min));
    if (first_failed == size_) return;
    if (first_failed == rank_) fatal(msg);
    // Give the failing rank time to print before this rank's abort takes the whole job down.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    MPI_CHECK(MPI_Abort(MPI_COMM_WORLD, 1));
  }

 private:
  CommHandle enqueue(CollectiveKind kind, const char* name, int64_t payload_bytes, Lane lane,
                     std::function<void(MPI_Request*)> start, std::function<void()> finish = {},
                     bool sends_nothing = false) {
    auto handle = std::make_shared<CommHandle::State>();
    handle->kind = kind;
    handle->payload_bytes = payload_bytes;
    handle->wire_bytes = sends_nothing ? 0 : wire_bytes_for(kind, payload_bytes, size_);
    handle->stats = &stats_;
    // The only counter written at issue (see the file comment); this thread owns stats_.
    stats_.kind[int(kind)].launched += 1;

    auto op = std::make_unique<MpiOp>();
    op->handle = handle;
    op->name = name;
    op->start = std::move(start);
    op->finish = std::move(finish);
    // Computed here, not on the comm thread: link_ belongs to the caller's thread (set_link_model).
    op->modelled_ms = modelled_ms(link_, kind, payload_bytes, size_);
    op->lane = lane;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      queue_.push_back(std::move(op));
    }
    queue_cv_.notify_one();
    return CommHandle(std::move(handle));
  }

  // The comm thread's whole life: start queued ops, poll the running ones, retire the finished ones,
  // sleep. It sleeps on queue_cv_ so that a newly queued op wakes it at once.
  void progress_loop() {
    std::deque<std::unique_ptr<MpiOp>> in_flight[kLanes];  // per lane, in start order
    Clock::time_point link_free[kLanes];                   // when each emulated lane is free again
    Clock::time_point last_retired[kLanes];                // for the busy time, see retire()
    InFlightSweep sweep;                                   // for the in-flight time
    auto poll_interval = kPollMin;

    std::unique_lock<std::mutex> lock(queue_mutex_);
    for (;;) {
      bool changed = false;
      // 1. Start everything queued, in queue order (= program order, the same on every rank).
      while (!queue_.empty()) {
        std::unique_ptr<MpiOp> op = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();  // the caller may queue more while MPI starts this one
        start(*op, &link_free[op->lane]);
        sweep.op_started(op->started);
        in_flight[op->lane].push_back(std::move(op));
        changed = true;
        lock.lock();
      }
      if (in_flight[kSendLane].empty() && in_flight[kRecvLane].empty()) {
        if (stopping_) return;  // the queue is drained and nothing is in flight
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        continue;
      }
      lock.unlock();

      // 2. Drive MPI: every call to MPI_Test advances the library's progress engine.
      bool mpi_pending = false;
      for (auto& lane : in_flight)
        for (auto& op : lane) {
          if (op->mpi_done) continue;
          int complete = 0;
          MPI_CHECK(MPI_Test(&op->request, &complete, MPI_STATUS_IGNORE));
          if (complete) {
            if (op->finish) op->finish();
            op->mpi_done = true;
            changed = true;
          } else {
            mpi_pending = true;
          }
        }

      // 3. Retire, in order within each lane, what MPI finished and the emulated link delivered.
      const Clock::time_point now = Clock::now();
      Clock::time_point next_link_done = Clock::time_point::max();
      for (int l = 0; l < kLanes; l++) {
        auto& lane = in_flight[l];
        while (!lane.empty() && lane.front()->mpi_done) {
          if (lane.front()->link_done > now) {
            next_link_done = std::min(next_link_done, lane.front()->link_done);
            break;
          }
          retire(*lane.front(), &last_retired[l], &sweep);
          lane.pop_front();
          changed = true;
        }
      }

      // 4. Sleep until the next poll is due or the emulated link delivers. A timed wait on the queue's
      // condition variable rather than sleep_until: an op queued meanwhile wakes us and starts at
      // once. (With nothing left in flight, the top of the loop sleeps until an op is queued.)
      lock.lock();
      if (in_flight[kSendLane].empty() && in_flight[kRecvLane].empty()) continue;
      poll_interval = changed ? kPollMin : std::min(poll_interval + kPollStep, kPollMax);
      // When no MPI call is pending, every op left waits for its link time: next_link_done is set.
      const Clock::time_point wake = mpi_pending ? std::min(now + poll_interval, next_link_done) : next_link_done;
      queue_cv_.wait_until(lock, wake, [&] { return !queue_.empty(); });
    }
  }

  void start(MpiOp& op, Clock::time_point* lane_free) {
    op.started = Clock::now();
    // The emulated lane carries one op at a time: this one gets the link when the lane is free.
    const auto modelled =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(op.modelled_ms));
    *lane_free = std::max(op.started, *lane_free) + modelled;
    op.link_done = *lane_free;
    op.start(&op.request);
  }

  // Times here come from steady_clock, not from now_ms(): the trace's epoch moves once at start-up
  // (sync_clock_epoch), while a busy time must not.
  void retire(MpiOp& op, Clock::time_point* lane_last_retired, InFlightSweep* sweep) {
    const Clock::time_point end = Clock::now();
    const double end_ms = now_ms();
    // An op queued behind another is charged from the moment the previous one retired, so the busy
    // times of a lane add up to the time the lane was busy, never more.
    const Clock::time_point begin = std::max(op.started, *lane_last_retired);
    *lane_last_retired = end;
    const double busy_ms = std::chrono::duration<double, std::milli>(end - begin).count();
    const double in_flight_ms = sweep->op_retired(end);
    CommHandle::State& h = *op.handle;
    trace_span(Track::Comm, op.name, end_ms - busy_ms, end_ms, std::to_string(h.payload_bytes) + " B");
    {
      std::lock_guard<std::mutex> lock(h.mutex);
      h.busy_ms = busy_ms;
      h.in_flight_ms = in_flight_ms;
      h.done = true;
    }
    h.retired.notify_all();  // op.handle keeps the state alive even if the waiter drops its handle
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::thread thread_;
  std::mutex queue_mutex_;  // guards queue_ and stopping_
  std::condition_variable queue_cv_;
  std::deque<std::unique_ptr<MpiOp>> queue_;
  bool stopping_ = false;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Start-up and shut-down

std::unique_ptr<Communicator> init_mpi_communicator(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) fatal("init_mpi_communicator() called twice");
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  // From here on MPI returns error codes instead of aborting on its own, so MPI_CHECK can report
  // the rank, the call and the file:line along with MPI's message.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  set_error_context(rank, size);
  // The comm thread calls MPI while the main thread may call it too (MPI_Abort, the test harness).
  if (provided < MPI_THREAD_MULTIPLE)
    config_error("this MPI library does not support MPI_THREAD_MULTIPLE (provided level " +
                 std::to_string(provided) + "); the communication thread needs it. Use an MPI built with "
                 "thread support (MPICH: --enable-threads=multiple, the default of distribution packages)");
  std::unique_ptr<Communicator> comm = std::make_unique<MpiCommunicator>();
  sync_clock_epoch(*comm);
  return comm;
}

void shutdown_mpi(std::unique_ptr<Communicator> comm) {
  comm.reset();  // drains the queue and joins the comm thread
  MPI_CHECK(MPI_Finalize());
}
