// comm_mpi.cpp: the MPI implementation of comm.h. Defines init_mpi_communicator / shutdown_mpi,
// set_comm_timeout, CommHandle::wait, modelled_ms, wire_bytes_for, collective_name and the CommStats
// totals.
//
// How an op travels. Every communicator of the process (the world and every group split from it)
// hands its ops to one ProgressEngine:
//   issue:    all_reduce_async(buf) checks the tensor, computes the bytes and the modelled link time,
//             and submits an op. If the emulated link is free, the op is posted at once, on the
//             caller's thread, as a non-blocking MPI call (MPI_Iallreduce, ...); else it is held
//             until the link is free (below). The caller gets a CommHandle and goes on computing.
//   progress: MPICH moves data only inside MPI calls. While the caller computes, a background thread
//             calls MPI_Test on the posted ops, sleeping between polls (10 us at first, up to 200 us
//             when nothing changes), so an async collective advances without taking a core.
//   wait:     the caller drives progress itself: it polls without sleeping, as MPI's own blocking
//             calls do, while the op could still be moving data at memory speed, then backs off to
//             sleeping polls (a late peer). The background thread stands aside meanwhile. A small
//             blocking collective so costs about what raw MPI costs: no thread hand-off on the way.
// Collectives of one communicator are posted in the order they were issued, the same on every
// rank, as MPI requires; ops of different communicators are independent.
//
// Emulated link (LinkModel). Each communicator has a link with two lanes: what this rank sends
// (collectives and sends) and what it receives. The link holds a message for its modelled time
// before it enters the network, i.e. before the MPI call is posted: a send of S bytes is posted
// alpha + S/beta after it was issued, or after the lane's previous op, whichever is later, since a
// lane carries one op at a time. A message therefore arrives no earlier than its modelled time after
// it was sent, however early its receive was posted; and a collective, posted by each rank after its
// own hold, completes no earlier than the last rank's entry plus the modelled time. Receives are not
// held: the sender's hold already covers the message. While ops are held nothing polls; the engine
// sleeps until the next one is due, so waiting out the link burns no CPU.
//
// Statistics. The engine measures each op (busy time on its lane, share of the in-flight time) into
// the op's handle; wait(), on the caller's thread, adds the op to its communicator's stats_. So
// stats_ is written only by the thread that issues and waits, which is the thread that reads it: a
// copy taken between steps is always consistent. The price: an op is counted when it is waited, so
// wait every handle (the blocking forms do it for you). The one exception is `launched`, counted at
// issue on that same thread.
//   busy:      a lane charges an op from its issue or from the lane's previous completion, whichever is
//              later, to its completion: the busy times of one lane add up to the time it was busy.
//   in flight: the union, over both lanes of a communicator, of the intervals from issue to
//              completion (InFlightSweep, one per communicator).
//   exposed:   the time the caller sat in wait(); it lies inside the in-flight time by construction.
// With one rank in the group there is nothing to exchange: collectives complete at issue (a local
// copy where the output is another buffer) and cost no time at all.
#include "comm.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>   // fflush
#include <cstdlib>  // setenv, getenv
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bf16.h"
#include "check.h"
#include "flags.h"    // chapter_has_flag, for the watchdog's message
#include "metrics.h"  // format_bytes, for the watchdog's message
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
    case CollectiveKind::AllToAll: return "all_to_all";
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

int64_t CommStats::total_sent_bytes() const {
  int64_t n = 0;
  for (const CollectiveCounters& c : kind) n += c.sent_bytes;
  return n;
}

int64_t CommStats::total_received_bytes() const {
  int64_t n = 0;
  for (const CollectiveCounters& c : kind) n += c.received_bytes;
  return n;
}

double CommStats::total_busy_ms() const {
  double ms = 0;
  for (const CollectiveCounters& c : kind) ms += c.busy_ms;
  return ms;
}

CommStats CommStats::since(const CommStats& before) const {
  CommStats d;
  for (int k = 0; k < kCollectiveKinds; k++) {
    const CollectiveCounters &a = kind[k], &b = before.kind[k];
    CollectiveCounters& c = d.kind[k];
    c.calls = a.calls - b.calls;
    c.launched = a.launched - b.launched;
    c.payload_bytes = a.payload_bytes - b.payload_bytes;
    c.sent_bytes = a.sent_bytes - b.sent_bytes;
    c.received_bytes = a.received_bytes - b.received_bytes;
    c.max_sent_share = a.max_sent_share;
    c.max_received_share = a.max_received_share;
    c.busy_ms = a.busy_ms - b.busy_ms;
    c.exposed_ms = a.exposed_ms - b.exposed_ms;
  }
  d.exposed_ms = exposed_ms - before.exposed_ms;
  d.in_flight_ms = in_flight_ms - before.in_flight_ms;
  return d;
}

CommStats& CommStats::operator+=(const CommStats& other) {
  for (int k = 0; k < kCollectiveKinds; k++) {
    CollectiveCounters& c = kind[k];
    const CollectiveCounters& o = other.kind[k];
    c.calls += o.calls;
    c.launched += o.launched;
    c.payload_bytes += o.payload_bytes;
    c.sent_bytes += o.sent_bytes;
    c.received_bytes += o.received_bytes;
    c.max_sent_share = std::max(c.max_sent_share, o.max_sent_share);
    c.max_received_share = std::max(c.max_received_share, o.max_received_share);
    c.busy_ms += o.busy_ms;
    c.exposed_ms += o.exposed_ms;
  }
  exposed_ms += other.exposed_ms;
  in_flight_ms += other.in_flight_ms;
  return *this;
}

// A scalar is an all-reduce of 8 bytes.
int64_t wire_bytes_for(CollectiveKind kind, int64_t payload, int n) {
  if (n <= 1) return 0;
  switch (kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::Scalar: return 2 * (n - 1) * payload / n;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather:
    case CollectiveKind::AllToAll: return (n - 1) * payload / n;
    case CollectiveKind::Barrier: return 0;
    default: return payload;
  }
}

double modelled_ms(const LinkModel& link, CollectiveKind kind, int64_t payload_bytes, int ranks) {
  if (ranks <= 1 || !link.on()) return 0;
  const double n = ranks;
  const double alpha = link.latency_us * 1e-6;                    // seconds
  const double per_byte = link.gbps > 0 ? 8 / (link.gbps * 1e9) : 0;  // seconds per byte: 1 / beta
  const double S = double(payload_bytes);
  double seconds = 0;
  switch (kind) {
    case CollectiveKind::AllReduce: seconds = 2 * (n - 1) * (alpha + S / n * per_byte); break;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather:
    case CollectiveKind::AllToAll: seconds = (n - 1) * (alpha + S / n * per_byte); break;
    case CollectiveKind::Broadcast:
    case CollectiveKind::SendRecv: seconds = alpha + S * per_byte; break;
    case CollectiveKind::Barrier: seconds = 2 * (n - 1) * alpha; break;
    case CollectiveKind::Scalar: seconds = 2 * (n - 1) * (alpha + 8 / n * per_byte); break;
    case CollectiveKind::Count: break;
  }
  return seconds * 1e3;
}

int64_t all_to_all_v_link_bytes(int64_t sent, int64_t received, int ranks) {
  if (ranks <= 1) return 0;
  const int64_t largest = std::max(sent, received);
  return (largest * ranks + ranks - 2) / (ranks - 1);  // rounded up: never less than the bytes that travel
}

namespace {

std::atomic<double> g_timeout_s{300.0};
std::atomic<bool> g_link_interrupted{false};  // interrupt_link_emulation, written by a signal handler
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

// A modelled time too long for the clock (an emulated link no flag allows, set by a test) is held
// for about 30 years, where the watchdog or an interrupt ends it, instead of overflowing.
constexpr double kLongestHoldMs = 1e12;

// bf16 tensors (the host-staged copies of mixed-precision GPU tensors, comm_nccl.cpp) travel as
// 16-bit words, MPI_UINT16_T, so every byte on the wire is what theory counts. MPI cannot add those
// words itself: reductions on them use user-defined ops that widen each pair to fp32, combine, and
// round back (bf16.h), as NCCL does on the GPU. Created once, after MPI_Init.
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

MPI_Datatype mpi_type(DType dtype) {
  return dtype == DType::BF16 ? MPI_UINT16_T : dtype == DType::I32 ? MPI_INT32_T : MPI_FLOAT;
}

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
  ENSURE(t.device == Device::CPU, "the MPI communicator moves CPU tensors; CUDA tensors need the NCCL or host-staged one");
  ENSURE(t.data != nullptr || t.numel() == 0, "tensor without memory");
}
// int32 (routing counts, moe.h) only travels: gathers, all-to-alls, broadcasts and messages.
void ensure_reducible(const Tensor& t) {
  ENSURE(t.dtype == DType::F32 || t.dtype == DType::BF16, "the MPI communicator reduces fp32 and bf16 tensors only");
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
// may well start where the other buffer does.
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
// segment. Checked, and copied: the caller's vector may die before the op is posted, and MPI reads
// these arrays until the op completes, so the op's lambda owns them.
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

// What the engine runs after the MPI call for `op`: nothing, or for Avg the scaling of the sum by
// 1/N (one multiply per element, cheaper than a divide; tests expect exactly sum * (1.0f / N)), in
// fp32 and rounded once for bf16.
std::function<void()> average_if(ReduceOp op, const Tensor& t, int ranks) {
  if (op != ReduceOp::Avg || t.numel() == 0 || ranks == 1) return {};
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

// What one rank sends and receives in a collective whose payload (`element` bytes per element)
// splits into segments of `counts` over the group, segment r belonging to rank r: a reduce-scatter
// sends every other rank's segment to its owner and receives N-1 contributions to its own; an
// all-gather the reverse. An all-reduce is both. Even counts give the ring's (N-1)/N.
struct Traffic {
  int64_t sent = 0, received = 0;
};
Traffic split_traffic(CollectiveKind kind, const std::vector<int64_t>& counts, int rank, int64_t element) {
  const int n = int(counts.size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t others = (total - counts[rank]) * element, own_from_peers = (n - 1) * counts[rank] * element;
  if (kind == CollectiveKind::ReduceScatter) return {others, own_from_peers};
  return {own_from_peers, others};  // all-gather
}
std::vector<int64_t> even_counts(int64_t total, int n) { return std::vector<int64_t>(n, total / n); }

// Polling by the background thread while the caller computes. Linux adds up to 50 us of timer slack
// to each sleep, so the shortest sleeps are really ~60 us.
constexpr std::chrono::microseconds kPollMin{10};
constexpr std::chrono::microseconds kPollStep{10};
constexpr std::chrono::microseconds kPollMax{200};
// A waiting caller polls without sleeping while its op could still be moving data: for at least
// kSpinMin, and longer for large payloads, as long as a copy at kSpinBytesPerMs could still run.
// Beyond that a peer is late, and the caller backs off to sleeping polls, leaving the core to others.
constexpr double kSpinMinMs = 1.0;
constexpr double kSpinBytesPerMs = 1e6;  // 1 GB/s
constexpr int kPollsPerYield = 64;

// Splits the union of the ops' in-flight intervals (CommStats::in_flight_ms) among the ops, so that
// each op's share is known when it completes and wait() can add it up like the other counters. The
// engine sees every issue and every completion in time order; between two such moments the set of
// ops in flight does not change. A completing op is charged the time since the previous completion,
// or since the current stretch of activity began, whichever is later: every moment when something
// was in flight is charged to exactly one op, the next one to complete. (Charging each op from its
// own issue would count overlapping ops twice; charging from the previous completion on its lane
// would lose the time before a later op of the other lane completes first.)
class InFlightSweep {
 public:
  void op_issued(Clock::time_point t) {
    if (in_flight_++ == 0) charged_until_ = t;
  }
  double op_completed(Clock::time_point t) {  // the op's share, in ms
    in_flight_--;
    const double ms = std::chrono::duration<double, std::milli>(t - charged_until_).count();
    charged_until_ = t;
    return ms;
  }

 private:
  int in_flight_ = 0;
  Clock::time_point charged_until_;
};

Clock::duration as_duration(double ms) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

class ProgressEngine;

}  // namespace

// ---------------------------------------------------------------------------------------------
// CommHandle: what the caller holds while an op is in flight

struct CommHandle::State {
  // Set by the issuing thread before the op is submitted; read-only afterwards.
  CollectiveKind kind = CollectiveKind::AllReduce;
  int64_t payload_bytes = 0, sent_bytes = 0, received_bytes = 0;
  CommStats* stats = nullptr;         // the issuing communicator's; wait() counts the op there
  std::shared_ptr<ProgressEngine> engine;  // drives the op while the caller waits
  Clock::time_point issued;  // when it was handed to the engine
  // Written by the engine under its mutex, read by wait() after the engine said the op is done.
  bool posted = false;        // handed to MPI (no longer held by the emulated link)
  Clock::time_point posted_at;
  bool done = false;
  Clock::time_point completed;
  double busy_ms = 0;
  double in_flight_ms = 0;  // this op's share of the union of in-flight intervals (InFlightSweep)
  // The caller's thread only.
  bool counted = false;  // set by the first wait(), so that waiting twice counts once
};

namespace {

// A communicator's group as the trace and the watchdog name it. The communicator owns it and outlives
// its ops (its destructor drains them).
struct GroupInfo {
  std::string name;              // "world", "dp", "tp", "pp", "embedding"
  std::vector<int> world_ranks;  // the members' MPI_COMM_WORLD ranks, by rank in the group
};

// "the pipeline group (world ranks 0, 1)": a stuck collective waits for one of these ranks, and
// which one MPI cannot say, so the watchdog names them all (the first few of a large group).
std::string describe_group(const GroupInfo& g) {
  const std::map<std::string, std::string> words = {
      {"dp", "data-parallel"}, {"tp", "tensor-parallel"}, {"pp", "pipeline"}};
  const auto word = words.find(g.name);
  std::string text = "the " + (word == words.end() ? g.name : word->second) + " group (world rank";
  const size_t n = g.world_ranks.size(), shown = n > 8 ? 6 : n;
  text += n > 1 ? "s " : " ";
  for (size_t i = 0; i < shown; i++) text += (i ? ", " : "") + std::to_string(g.world_ranks[i]);
  if (shown < n) text += ", ..., " + std::to_string(g.world_ranks.back()) + ": " + std::to_string(n) + " ranks";
  return text + ")";
}

// Every world rank's process id and node (the lowest world rank on its node), gathered at start-up,
// so that a watchdog can look at the peers that share its node (/proc/<pid>/stat).
std::vector<int> g_world_pids, g_world_nodes;

// Which members of `g` (other than this process) are stopped (SIGSTOP, a debugger) or gone, as far
// as this node can see: "world rank 1 (pid 4242) is stopped"; "" when none is, or none shares the node.
std::string missing_members(const GroupInfo& g) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::string text;
  for (int r : g.world_ranks) {
    if (r == me || size_t(r) >= g_world_pids.size() || g_world_nodes[size_t(r)] != g_world_nodes[size_t(me)]) continue;
    const std::string pid = std::to_string(g_world_pids[size_t(r)]);
    std::ifstream in("/proc/" + pid + "/stat");
    std::string stat;
    std::getline(in, stat);
    const size_t after_name = stat.rfind(')');  // "pid (name) S ...": the name may hold spaces
    std::string state;
    if (!in && stat.empty()) state = "has ended";
    else if (after_name != std::string::npos && after_name + 2 < stat.size() &&
             (stat[after_name + 2] == 'T' || stat[after_name + 2] == 't'))
      state = "is stopped (SIGSTOP, Ctrl-Z or a debugger)";
    else if (after_name != std::string::npos && after_name + 2 < stat.size() && stat[after_name + 2] == 'Z')
      state = "has ended";
    if (!state.empty()) text += (text.empty() ? "" : "; ") + ("world rank " + std::to_string(r) + " (pid " + pid + ") " + state);
  }
  return text;
}

// One submitted op. The issuing thread fills it in; from submission on, the engine owns it.
struct MpiOp {
  std::shared_ptr<CommHandle::State> handle;
  const char* name = "";                    // for the trace and the watchdog: "all_reduce", "send", ...
  const GroupInfo* group = nullptr;         // the communicator's group (it outlives its ops)
  int peer = -1;                            // send and recv: the other rank, in the group
  std::function<void(MPI_Request*)> start;  // posts the non-blocking MPI call
  std::function<void()> finish;             // after MPI completes (the Avg scaling); may be empty
  int lane = 0;
  Clock::time_point issued, post_at, posted;
  double modelled_ms = 0;  // its own hold; it begins at post_at - modelled_ms, after the lane's previous op
  MPI_Request request = MPI_REQUEST_NULL;
};

// The one progress engine of the process (see the file comment).
class ProgressEngine {
 public:
  ProgressEngine() : thread_([this] { thread_main(); }) {}
  ~ProgressEngine() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    thread_cv_.notify_all();
    thread_.join();
  }

  // A communicator's two lanes of the emulated link (the file comment), sends then receives, and its
  // in-flight sweep: returns the send lane (the receive lane is the next).
  int add_communicator() {
    std::lock_guard<std::mutex> lock(mutex_);
    lanes_.push_back(Lane{});
    lanes_.push_back(Lane{});
    sweeps_.push_back(InFlightSweep{});
    return int(lanes_.size()) - 2;
  }

  // Takes `op`, held for `modelled_ms` on its lane; posts it now when it is due now.
  void submit(std::unique_ptr<MpiOp> op, double modelled_ms, bool waited_at_once) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const Clock::time_point now = Clock::now();
      Lane& lane = lanes_[op->lane];
      op->issued = now;
      op->handle->issued = now;
      if (!(modelled_ms <= kLongestHoldMs)) modelled_ms = kLongestHoldMs;  // NaN too
      if (g_link_interrupted.load()) modelled_ms = 0, lane.free_at = std::min(lane.free_at, now);
      op->modelled_ms = modelled_ms;
      op->post_at = std::max(now, lane.free_at) + as_duration(modelled_ms);
      lane.free_at = op->post_at;
      sweeps_[op->lane / 2].op_issued(now);
      held_.push_back(std::move(op));
      post_due(now);
    }
    // The background thread polls what an async op leaves in flight, or posts what the link holds. A
    // blocking call is driven by its own caller from the start: waking the thread would only make it
    // compete with the caller for the core and for MPI.
    if (!waited_at_once) thread_cv_.notify_one();
  }

  // The body of CommHandle::wait(): drives progress until the op is done.
  void wait(CommHandle::State& s) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (s.done) return;
    waiters_++;
    const double spin_ms = std::max(kSpinMinMs, double(s.payload_bytes) / kSpinBytesPerMs);
    auto poll = kPollMin;
    for (int spins = 0; !s.done; spins++) {
      const Clock::time_point now = Clock::now();
      Progress p = progress(now);
      if (s.done) break;
      // Spin only while this op itself is moving data: held by the link, it sleeps until posted.
      if (s.posted && p.mpi_pending && now - s.posted_at < as_duration(spin_ms)) {
        // Polling like MPI's own blocking calls, which yield the core now and then (a yield is a
        // system call: yielding at every poll would double a small collective's latency).
        lock.unlock();
        if (spins % kPollsPerYield == kPollsPerYield - 1) std::this_thread::yield();
        lock.lock();
        continue;
      }
      poll = p.changed ? kPollMin : std::min(poll + kPollStep, kPollMax);
      const Clock::time_point wake = p.mpi_pending ? std::min(now + poll, p.next_post) : p.next_post;
      waiter_cv_.wait_until(lock, std::min(wake, held_check(now)));
    }
    // The background thread takes over what is still in flight; with nothing left it need not wake.
    if (--waiters_ == 0 && !(held_.empty() && posted_.empty())) thread_cv_.notify_one();
  }

  // Waits until no op of these lanes is held or posted (a communicator about to be freed).
  void drain(int lane_a, int lane_b) {
    auto mine = [&](const std::unique_ptr<MpiOp>& op) { return op->lane == lane_a || op->lane == lane_b; };
    std::unique_lock<std::mutex> lock(mutex_);
    waiters_++;
    for (;;) {  // (the condition is tested after progress: it may have completed the last of them)
      const Clock::time_point now = Clock::now();
      const Progress p = progress(now);
      if (!std::any_of(held_.begin(), held_.end(), mine) && !std::any_of(posted_.begin(), posted_.end(), mine)) break;
      waiter_cv_.wait_until(lock, std::min(p.mpi_pending ? now + kPollMax : p.next_post, held_check(now)));
    }
    if (--waiters_ == 0) thread_cv_.notify_one();
  }

  // Posts, once their link time has come, every op of `lane` that the emulated link still holds, so
  // that a blocking MPI call on the communicator (split) comes after them on every rank.
  void post_held(int lane) {
    auto mine = [&](const std::unique_ptr<MpiOp>& op) { return op->lane == lane; };
    std::unique_lock<std::mutex> lock(mutex_);
    waiters_++;
    for (;;) {  // (the condition is tested after progress: it may have posted the last of them)
      const Clock::time_point now = Clock::now();
      const Progress p = progress(now);
      if (!std::any_of(held_.begin(), held_.end(), mine)) break;
      waiter_cv_.wait_until(lock, std::min(p.next_post, held_check(now)));
    }
    if (--waiters_ == 0) thread_cv_.notify_one();
  }

 private:
  struct Lane {
    Clock::time_point free_at;        // when the emulated lane can take the next op
    Clock::time_point last_completed;  // for the busy time (file comment)
  };
  struct Progress {
    bool changed = false;       // an op was posted or completed
    bool mpi_pending = false;   // a posted op has not completed: someone must poll
    Clock::time_point next_post = Clock::time_point::max();  // when the next held op is due
  };

  // While the link holds an op, whoever waits looks again at least this often: for an interrupt
  // (interrupt_link_emulation) and for the watchdog, however far the op's post time lies.
  Clock::time_point held_check(Clock::time_point now) const {
    return held_.empty() ? Clock::time_point::max() : now + as_duration(kHeldCheckMs);
  }

  // Posts every held op that is due, in issue order (for a lane, due times grow in issue order);
  // after an interrupt, every held op.
  bool post_due(Clock::time_point now) {
    bool posted = false;
    const bool interrupted = g_link_interrupted.load();
    for (auto it = held_.begin(); it != held_.end();) {
      if ((*it)->post_at > now && !interrupted) {
        ++it;
        continue;
      }
      MpiOp& op = **it;
      // Posted early by an interrupt: the lane is free from now on, not from the end of the hold it
      // skipped (else an op issued after the interrupt is lifted would wait out that hold).
      if (interrupted) lanes_[op.lane].free_at = std::min(lanes_[op.lane].free_at, now);
      op.posted = now;
      op.handle->posted = true;
      op.handle->posted_at = now;
      op.start(&op.request);
      posted_.push_back(std::move(*it));
      it = held_.erase(it);
      posted = true;
    }
    return posted;
  }

  // One round, under the mutex: post what is due, test what is posted, complete what finished, and
  // end the job if an op has waited longer than the watchdog allows.
  Progress progress(Clock::time_point now) {
    Progress p;
    p.changed = post_due(now);
    const double timeout_s = g_timeout_s.load();
    for (auto it = posted_.begin(); it != posted_.end();) {
      MpiOp& op = **it;
      int complete = 0;
      MPI_CHECK(MPI_Test(&op.request, &complete, MPI_STATUS_IGNORE));
      if (!complete) {
        if (timeout_s > 0 && now - op.posted > as_duration(timeout_s * 1e3)) watchdog(op, timeout_s);
        p.mpi_pending = true;
        ++it;
        continue;
      }
      if (op.finish) op.finish();
      complete_op(op);
      it = posted_.erase(it);
      p.changed = true;
    }
    for (const auto& op : held_) {
      p.next_post = std::min(p.next_post, op->post_at);
      const Clock::time_point hold_began = op->post_at - as_duration(op->modelled_ms);
      if (timeout_s > 0 && now - hold_began > as_duration(timeout_s * 1e3)) held_watchdog(*op, timeout_s);
    }
    return p;
  }

  // Times here come from steady_clock, not from now_ms(): the trace's epoch moves once at start-up
  // (sync_clock_epoch), while a busy time must not.
  void complete_op(MpiOp& op) {
    const Clock::time_point end = Clock::now();
    Lane& lane = lanes_[op.lane];
    const Clock::time_point begin = std::max(op.issued, lane.last_completed);
    lane.last_completed = end;
    CommHandle::State& h = *op.handle;
    h.busy_ms = std::chrono::duration<double, std::milli>(end - begin).count();
    h.in_flight_ms = sweeps_[op.lane / 2].op_completed(end);
    h.completed = end;
    h.done = true;
    if (tracing_enabled()) {
      const double end_ms = trace_ms(end);
      const std::string& group = op.group->name;
      const bool tensor_parallel = group.compare(0, 2, "tp") == 0 && (group.size() == 2 || group[2] == ' ');  // (a lane's copy too)
      trace_span(tensor_parallel ? Track::TensorParallel : Track::Comm, op.name, end_ms - h.busy_ms, end_ms,
                 std::to_string(h.payload_bytes) + " B" + (group == "world" ? "" : ", " + group),
                 trace_ms(op.issued), op.modelled_ms);
    }
    waiter_cv_.notify_all();
  }

  // The phase is read now, not at issue: a stuck op holds its issuing thread in the same step. A
  // send or receive waits for one known rank, named as such; a collective, for any of its group.
  [[noreturn]] void watchdog(const MpiOp& op, double timeout_s) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3g", timeout_s);
    const std::string phase = error_phase();
    const bool point_to_point = op.peer >= 0;
    const std::string peer =
        point_to_point ? "world rank " + std::to_string(op.group->world_ranks.at(size_t(op.peer))) : "";
    // Which peer MPI cannot say; the node can, for the peers that share it.
    const std::string missing = missing_members(*op.group);
    const std::string blamed = !missing.empty() ? missing
                               : (point_to_point ? peer : "a peer rank of that group") + " is stopped, dead or stuck";
    fatal(std::string("watchdog: ") + op.name + " of " + format_bytes(double(op.handle->payload_bytes)) +
          (point_to_point ? (std::string(op.name) == "send" ? " to " : " from ") + peer : "") + " over " +
          describe_group(*op.group) + (phase.empty() ? "" : " in " + phase) + " has not completed after " +
          seconds + " s (--timeout): " + blamed + " before this " + (point_to_point ? "message" : "collective") +
          ". Ending the job.");
  }

  // A wait on the emulated link alone: no peer is involved yet, so none is blamed.
  [[noreturn]] void held_watchdog(const MpiOp& op, double timeout_s) {
    char text[160];
    std::snprintf(text, sizeof text, "for %.4g s, longer than --timeout %.3g s", op.modelled_ms / 1e3, timeout_s);
    const std::string phase = error_phase();
    const bool tp_link = op.group->name == "tp" && chapter_has_flag("--tp-link-gbps");
    const std::string flags = tp_link ? "--tp-link-gbps and --tp-link-latency-us" : "--link-gbps and --link-latency-us";
    fatal(std::string("watchdog: the emulated link holds this ") + op.name + " of " +
          format_bytes(double(op.handle->payload_bytes)) + " over " + describe_group(*op.group) +
          (phase.empty() ? "" : " in " + phase) + " " + text + ": the modelled link (" + flags +
          ") is that slow; no rank is dead. Raise the bandwidth, lower the latency, or raise --timeout.");
  }

  // The background thread: polls while nobody waits, sleeps while nothing is posted.
  void thread_main() {
    std::unique_lock<std::mutex> lock(mutex_);
    auto poll = kPollMin;
    for (;;) {
      if (stopping_ && held_.empty() && posted_.empty()) return;
      if (waiters_ > 0) {  // a waiting caller drives progress
        thread_cv_.wait(lock);
        continue;
      }
      const Clock::time_point now = Clock::now();
      const Progress p = progress(now);
      if (held_.empty() && posted_.empty()) {
        poll = kPollMin;
        thread_cv_.wait(lock);
        continue;
      }
      poll = p.changed ? kPollMin : std::min(poll + kPollStep, kPollMax);
      const Clock::time_point wake = p.mpi_pending ? std::min(now + poll, p.next_post) : p.next_post;
      thread_cv_.wait_until(lock, std::min(wake, held_check(now)));
    }
  }

  std::mutex mutex_;                    // guards everything below, and the ops' handles' results
  std::condition_variable thread_cv_;   // wakes the background thread: new op, no more waiters, stop
  std::condition_variable waiter_cv_;   // wakes waiting callers: an op completed
  std::vector<Lane> lanes_;
  std::list<std::unique_ptr<MpiOp>> held_;    // submitted, not yet posted (the emulated link)
  std::list<std::unique_ptr<MpiOp>> posted_;  // posted to MPI, not yet complete
  std::vector<InFlightSweep> sweeps_;  // one per communicator: its ops' union of in-flight intervals
  int waiters_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once everything above exists
};

std::weak_ptr<ProgressEngine> g_engine;  // the process's engine, while some communicator holds it
int g_ranks_on_node = 1;
int g_nodes = 1;

int world_size() {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

}  // namespace

void set_comm_timeout(double seconds) { g_timeout_s = seconds; }

void interrupt_link_emulation(bool interrupted) { g_link_interrupted = interrupted; }

int ranks_on_this_node() { return g_ranks_on_node; }

int nodes_in_job() { return g_nodes; }

CommHandle Communicator::send_recv_async(const std::vector<PointToPoint>& ops) {
  std::vector<CommHandle> handles;
  for (const PointToPoint& op : ops)
    handles.push_back(op.send ? send_async(op.buf, op.peer, op.tag) : recv_async(op.buf, op.peer, op.tag));
  if (handles.size() == 1) return handles[0];
  return CommHandle([handles]() mutable {
    for (CommHandle& h : handles) h.wait();
  });
}

void CommHandle::wait() {
  if (device_wait_) return (*device_wait_)();  // a device communicator's handle (comm.h)
  ENSURE(state_ != nullptr, "wait() on an empty CommHandle");
  State& s = *state_;
  if (s.counted) return;  // waited before: done, and counted
  const Clock::time_point blocked_from = Clock::now();
  s.engine->wait(s);
  // stats belong to the thread that issues and waits (see the file comment): no lock needed.
  CommStats& stats = *s.stats;
  // Blocked from the call until the op completed: inside the op's own [issued, completed] interval,
  // so exposed time never exceeds the in-flight time.
  const Clock::time_point from = std::max(blocked_from, s.issued);
  if (s.completed > from) {
    const double blocked = std::chrono::duration<double, std::milli>(s.completed - from).count();
    stats.exposed_ms += blocked;
    stats.kind[int(s.kind)].exposed_ms += blocked;
    trace_span(Track::Wait, std::string("wait ") + collective_name(s.kind), trace_ms(from), trace_ms(s.completed), "",
               trace_ms(s.issued));
  } else {
    // Done before it was waited for: a span of no length still says where the caller would have
    // waited, for the step-time model (trace.h).
    trace_span(Track::Wait, std::string("wait ") + collective_name(s.kind), trace_ms(from), trace_ms(from), "",
               trace_ms(s.issued));
  }
  if (!s.counted) {
    s.counted = true;
    CollectiveCounters& c = stats.kind[int(s.kind)];
    c.calls += 1;
    c.payload_bytes += s.payload_bytes;
    c.sent_bytes += s.sent_bytes;
    c.received_bytes += s.received_bytes;
    if (s.payload_bytes > 0) {
      c.max_sent_share = std::max(c.max_sent_share, double(s.sent_bytes) / double(s.payload_bytes));
      c.max_received_share = std::max(c.max_received_share, double(s.received_bytes) / double(s.payload_bytes));
    }
    c.busy_ms += s.busy_ms;
    stats.in_flight_ms += s.in_flight_ms;
  }
}

// ---------------------------------------------------------------------------------------------
// The MPI communicator

namespace {

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
    MPI_CHECK(MPI_Comm_free(&comm_));
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& group) override {
    // MPI_Comm_split is a blocking collective on comm_: it must come after every op issued here
    // before it, on every rank alike, so what the emulated link still holds is posted first.
    engine_->post_held(send_lane_);
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    auto result = std::make_unique<MpiCommunicator>(sub, engine_, group);
    result->set_link_model(link_);
    return result;
  }

  // The copy takes this communicator's two lanes and in-flight sweep: its ops queue on the same
  // emulated link, and the busy and in-flight times of the two add up to the link's. (Its destructor
  // drains the shared lanes: by then every op of both is waited, comm.h.)
  std::unique_ptr<Communicator> duplicate(const std::string& group) override {
    engine_->post_held(send_lane_);  // MPI_Comm_dup is a blocking collective on comm_, as split's
    MPI_Comm copy = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_dup(comm_, &copy));
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
    // Shared with the op's lambdas, which the engine may destroy after this function returned.
    auto v = std::make_shared<double>(value);
    const int ranks = size_;
    const int64_t wire = wire_bytes_for(CollectiveKind::Scalar, sizeof(double), size_);
    issuing_blocking_ = true;  // waited at once, below
    CommHandle handle = submit(
        CollectiveKind::Scalar, "all_reduce_scalar", sizeof(double), {wire, wire}, send_lane_,
        [=](MPI_Request* r) {
          MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.get(), 1, MPI_DOUBLE, mpi_op(op, DType::F32), comm_, r));
        },
        [=] {
          if (op == ReduceOp::Avg) *v /= ranks;
        });
    issuing_blocking_ = false;
    handle.wait();
    return *v;  // written by the engine before it completed the op, which wait() synchronised with
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
    // The only counter written at issue (see the file comment); this thread owns stats_.
    stats_.kind[int(kind)].launched += 1;
    return state;
  }

  // `peer`: a send's or receive's other rank in the group; -1 for a collective. `link_bytes`: the
  // payload the emulated link holds the op for (-1: payload_bytes; all_to_all_v's own, comm.h).
  CommHandle submit(CollectiveKind kind, const char* name, int64_t payload_bytes, Traffic traffic, int lane,
                    std::function<void(MPI_Request*)> start, std::function<void()> finish = {}, int peer = -1,
                    int64_t link_bytes = -1) {
    auto op = std::make_unique<MpiOp>();
    op->handle = new_state(kind, payload_bytes, traffic);
    op->name = name;
    op->group = &info_;
    op->peer = peer;
    op->start = std::move(start);
    op->finish = std::move(finish);
    op->lane = lane;
    CommHandle handle(op->handle);
    // The link model of this moment: link_ belongs to the issuing thread (set_link_model).
    const double link_ms =
        lane == recv_lane_ ? 0.0 : modelled_ms(link_, kind, link_bytes >= 0 ? link_bytes : payload_bytes, size_);
    engine_->submit(std::move(op), link_ms, issuing_blocking_);
    return handle;
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
  std::shared_ptr<ProgressEngine> engine_;
  GroupInfo info_;  // the ops' group (MpiOp::group)
  int send_lane_ = 0, recv_lane_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Start-up and shut-down

std::unique_ptr<Communicator> init_mpi_communicator(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) fatal("init_mpi_communicator() called twice");
  // MPICH 4.0 picks, for non-blocking reduce-scatters of about 256 KB to 1 MB, a recursive-halving
  // schedule that runs 3 to 9 times slower than its own blocking call on one host (measured with
  // make bench-comm); the pairwise schedule matches the blocking call at every size. ZeRO reduce-
  // scatters buckets of about that size, so choose it, unless the user chose otherwise. Other MPI
  // libraries ignore these variables.
  setenv("MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM", "sched_pairwise", /*overwrite=*/0);
  setenv("MPIR_CVAR_IREDUCE_SCATTER_INTRA_ALGORITHM", "sched_pairwise", 0);
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  // From here on MPI returns error codes instead of aborting on its own, so MPI_CHECK can report
  // the rank, the call and the file:line along with MPI's message.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  set_error_context(rank, size);
  // The engine's thread calls MPI while the main thread may call it too (a waiting caller, MPI_Abort).
  if (provided < MPI_THREAD_MULTIPLE)
    config_error("this MPI library does not support MPI_THREAD_MULTIPLE (provided level " +
                 std::to_string(provided) + "); the communication thread needs it. Use an MPI built with "
                 "thread support (MPICH: --enable-threads=multiple, the default of distribution packages)");
  create_bf16_ops();
  // MPI_COMM_TYPE_SHARED groups the ranks that can share memory: those of one node.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_size(node, &g_ranks_on_node));
  int node_id = rank;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &node_id, 1, MPI_INT, MPI_MIN, node));
  // The nodes, counted as a real cluster's are: one node-local rank 0 on each.
  int node_rank = 0;
  MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  int leader = node_rank == 0 ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(&leader, &g_nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Comm_free(&node));
  const int pid = int(getpid());
  g_world_pids.assign(size_t(size), 0);
  g_world_nodes.assign(size_t(size), 0);
  MPI_CHECK(MPI_Allgather(&pid, 1, MPI_INT, g_world_pids.data(), 1, MPI_INT, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allgather(&node_id, 1, MPI_INT, g_world_nodes.data(), 1, MPI_INT, MPI_COMM_WORLD));
  auto engine = std::make_shared<ProgressEngine>();
  g_engine = engine;
  // A private copy of MPI_COMM_WORLD: our collectives and messages cannot be confused with MPI calls
  // made elsewhere in the process (the test harness, a library) on MPI_COMM_WORLD.
  MPI_Comm world = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  std::unique_ptr<Communicator> comm = std::make_unique<MpiCommunicator>(world, engine, "world");
  sync_clock_epoch(*comm);
  return comm;
}

void shutdown_mpi(std::unique_ptr<Communicator> comm) {
  comm.reset();  // drains what it issued and frees it
  ENSURE(g_engine.expired(), "shutdown_mpi() while a communicator split from the world is still alive: destroy "
                             "every group's communicator first");
  // Across hosts over UCX's TCP transport (MPICH 4.0.2, UCX 1.13), MPI_Finalize hangs in a fraction of
  // runs: one rank waits forever for its endpoints to flush while the others, done with theirs, wait in
  // the process manager's barrier. Every result is written by now, and after a barrier every message
  // has been delivered, so such a run may leave without MPI_Finalize: mpiexec accepts it, 20 runs in a
  // row out of 20 (docs/cluster.md, "A reliable MPI"). Opt-in, since one host's MPI_Finalize is fine.
  const char* skip = std::getenv("GPT_SKIP_MPI_FINALIZE");
  if (skip != nullptr && std::string(skip) == "1") {
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    std::fflush(nullptr);
    return;
  }
  MPI_CHECK(MPI_Finalize());
}
