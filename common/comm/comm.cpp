// comm.cpp: what comm.h defines for every backend (the MPI communicator, NCCL's and the host-staged
// one, chapter 00's): collective_name, the CommStats totals, wire_bytes_for and the link model
// (modelled_ms, all_to_all_v_link_bytes), and Communicator::send_recv_async's default. The MPI
// communicator and start-up: comm_mpi.cpp; its progress engine and CommHandle::wait: comm_engine.cpp.
#include "comm/comm.h"

#include "comm/wire_format.h"  // CollectiveFormats: what formats() holds

#include <algorithm>
#include <vector>

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

thread_local bool Communicator::issuing_blocking_ = false;

Communicator::Communicator() : formats_(std::make_shared<CollectiveFormats>()) {}
Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::split(int color, int key, const std::string& group) {
  std::unique_ptr<Communicator> made = split_group(color, key, group);
  made->formats_ = formats_;
  return made;
}

std::unique_ptr<Communicator> Communicator::duplicate(const std::string& group) {
  std::unique_ptr<Communicator> made = duplicate_group(group);
  made->formats_ = formats_;
  return made;
}

void CollectiveCounters::count_op(int64_t payload, int64_t sent, int64_t received) {
  calls += 1;
  payload_bytes += payload;
  sent_bytes += sent;
  received_bytes += received;
  if (payload > 0) {
    max_sent_share = std::max(max_sent_share, double(sent) / double(payload));
    max_received_share = std::max(max_received_share, double(received) / double(payload));
  }
}

namespace {
// One field of the counters, added over every collective kind.
template <typename T>
T sum_over_kinds(const CommStats& stats, T CollectiveCounters::*field) {
  T total = 0;
  for (const CollectiveCounters& c : stats.kind) total += c.*field;
  return total;
}
}  // namespace

int64_t CommStats::total_calls() const { return sum_over_kinds(*this, &CollectiveCounters::calls); }
int64_t CommStats::total_launched() const { return sum_over_kinds(*this, &CollectiveCounters::launched); }
int64_t CommStats::total_sent_bytes() const { return sum_over_kinds(*this, &CollectiveCounters::sent_bytes); }
int64_t CommStats::total_received_bytes() const { return sum_over_kinds(*this, &CollectiveCounters::received_bytes); }
double CommStats::total_busy_ms() const { return sum_over_kinds(*this, &CollectiveCounters::busy_ms); }

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

// ---------------------------------------------------------------------------------------------
// Sends and receives in one call: each on its own, one handle that waits for them all (a backend
// with group calls, NCCL's, overrides it)

CommHandle Communicator::send_recv_async(const std::vector<PointToPoint>& ops) {
  std::vector<CommHandle> handles;
  for (const PointToPoint& op : ops)
    handles.push_back(op.send ? send_async(op.buf, op.peer, op.tag) : recv_async(op.buf, op.peer, op.tag));
  if (handles.size() == 1) return handles[0];
  return CommHandle([handles]() mutable {
    for (CommHandle& h : handles) h.wait();
  });
}
