// comm.h: the communicator every chapter talks to. Defines ReduceOp, CollectiveKind, CommHandle,
// CollectiveCounters, CommStats, LinkModel and Communicator.
//
// Every collective has a blocking form and an async form that returns a CommHandle. The MPI
// implementation (comm_mpi.cpp) starts each op as a non-blocking MPI call and keeps it moving with
// a progress engine shared by every communicator of the process (comm_engine.cpp): a background
// thread polls while the caller computes, and a caller that waits drives progress itself. The
// caller's time blocked in wait() is "exposed communication"; the time during which any op was in
// flight is "communication time". Both, and the bytes this rank sent and received, are counted per
// collective kind.
//
// A communicator spans a group of ranks: the world, or a group split from it (split(), used by the
// process grid of tensor and pipeline parallelism). Every group has its own counters, so a step can
// report what travelled over the data-parallel group apart from the tensor-parallel one.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/tensor.h"

enum class ReduceOp { Sum, Avg, Max, Min };

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, SendRecv, Barrier, Scalar, AllToAll, Count };
constexpr int kCollectiveKinds = static_cast<int>(CollectiveKind::Count);
const char* collective_name(CollectiveKind k);  // "all_reduce", "reduce_scatter", ...

struct CollectiveCounters {
  int64_t calls = 0;           // ops completed and waited: counted by wait(), like everything below
  int64_t launched = 0;        // ops issued: counted at issue, before anything ran, so that a test can
                               // tell whether a collective was started during some stretch of code
  int64_t payload_bytes = 0;   // bytes handed to the collective (the full buffer; for reduce_scatter
                               // the full input, for all_gather the full output)
  // What this rank itself sent and received. For an even split (every uniform collective) each rank
  // sends and receives (N-1)/N of the payload in a reduce-scatter or an all-gather, 2(N-1)/N in an
  // all-reduce. For the variable-count forms they follow the counts: a rank that owns a larger
  // segment receives more contributions to reduce, or sends its segment to more bytes' worth of peers.
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  // The largest share of one call's payload that this rank sent, and received, so far in the run
  // (not differenced by since()): (N-1)/N for a balanced reduce-scatter or all-gather, up to N-1 for
  // a rank that owns the whole range of a variable-count one.
  double max_sent_share = 0;
  double max_received_share = 0;
  double busy_ms = 0;          // time ops of this kind were in flight on their lane (see comm_engine.cpp)
  double exposed_ms = 0;       // the callers' blocked time (CommStats::exposed_ms) spent on this kind: a
                               // pipeline's waits for a receive are its bubble, not communication
  // One completed op of `payload` bytes, of which this rank sent `sent` and received `received`: the
  // count, the bytes and the largest shares (every backend's wait() counts its ops here).
  void count_op(int64_t payload, int64_t sent, int64_t received);
};

struct CommStats {
  CollectiveCounters kind[kCollectiveKinds];
  double exposed_ms = 0;    // time callers spent blocked waiting for communication
  double in_flight_ms = 0;  // time during which at least one op was in flight, from its issue to its
                            // completion: the union of their intervals. Busy times of ops that
                            // overlap add up to more; this never does. exposed_ms <= in_flight_ms,
                            // since a caller only waits while its op is in flight.
  int64_t total_calls() const;
  int64_t total_launched() const;  // every kind, Scalar included: callers subtract what they need
  int64_t total_sent_bytes() const;
  // Training traffic only: every kind but Scalar (the loss and norm scalars are metrics, not what
  // theory counts).
  int64_t training_sent_bytes() const { return total_sent_bytes() - kind[int(CollectiveKind::Scalar)].sent_bytes; }
  int64_t total_received_bytes() const;
  double total_busy_ms() const;
  // The counts of what happened between `before` (an earlier copy of these statistics) and now. The
  // per-call maxima are not differences: they keep the larger of the two.
  CommStats since(const CommStats& before) const;
  // Adds another communicator's statistics (a run's groups together). Each communicator's in-flight
  // time is the union of its own ops' intervals: where two groups communicate at the same moment,
  // the sum counts that moment twice. Exposed time stays within it.
  CommStats& operator+=(const CommStats& other);
};

// Emulated interconnect: each op takes at least the time an alpha-beta model of a ring over such a
// link gives (modelled_ms() below). Off when both numbers are 0. Latency alone (gbps 0) models an
// infinitely wide link whose every message costs latency_us.
struct LinkModel {
  double gbps = 0;        // link bandwidth in gigabits per second; 0 = unlimited
  double latency_us = 0;  // per-message latency alpha
  // The flags that set it, which a message names: "--link" (--link-gbps, --link-latency-us), or a
  // group's own ("--tp-link": 07's tensor-parallel group, where the chapter has those flags).
  const char* flags = "--link";
  bool on() const { return gbps > 0 || latency_us > 0; }
};

class CommHandle {
 public:
  struct State;
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  // A handle whose wait() calls `device_wait`: a device communicator's (NCCL, comm_nccl.cpp), whose
  // collectives finish on a GPU stream (it makes the GPU's compute stream wait for the collective,
  // the host does not block, and counts the op); or several handles waited together
  // (send_recv_async).
  explicit CommHandle(std::function<void()> device_wait)
      : device_wait_(std::make_shared<std::function<void()>>(std::move(device_wait))) {}
  // Blocks until the op has finished; the blocked time counts as exposed communication.
  void wait();
  bool valid() const { return state_ != nullptr || device_wait_ != nullptr; }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<std::function<void()>> device_wait_;  // shared by copies, like state_
};

struct CollectiveFormats;  // wire_format.h: the formats a mixed-precision recipe's collectives move

class Communicator {
 public:
  Communicator();
  virtual ~Communicator();
  int rank() const { return rank_; }   // within this communicator's group
  int size() const { return size_; }
  // Where the tensors of its collectives live: CPU for MPI, CUDA for the NCCL and host-staged ones.
  Device device() const { return device_; }
  const std::string& name() const { return name_; }    // "mpi", "nccl", "mpi (host-staged)"
  const std::string& group() const { return group_; }  // "world", "dp", "tp", "pp", ...

  // A new communicator over the ranks of this one that pass the same `color`, ranked by `key`
  // (ties by their rank here), named `group`. Collective: every rank of this communicator calls it,
  // after the same ops (async ones may still be in flight). Of the same kind as this one (MPI, NCCL or
  // host-staged); groups share the one progress engine. Wait every handle of a communicator before
  // destroying it. The group shares this one's collective formats (formats()).
  std::unique_ptr<Communicator> split(int color, int key, const std::string& group);
  // A second communicator over the same ranks, in the same order, named `group`, for a second thread
  // that issues collectives beside this one's (lanes.h: the backward lane of DualPipe's F&B pairs):
  // MPI lets two threads issue collectives at once only on different communicators. Collective, like
  // split(). Over MPI it shares this one's emulated link (LinkModel): a second stream over the same
  // network card, not a second card, so that two lanes' messages queue for it as on a machine.
  // Elsewhere it is split(0, rank(), group).
  std::unique_ptr<Communicator> duplicate(const std::string& group);

  // The formats its collectives travel in under a mixed-precision recipe (wire_format.h,
  // collective_formats): one object, shared by this communicator and every group split from it (or
  // wrapping it), so that a recipe installed on the run's world reaches every group of its grid, and
  // two runs in one process (tests) never see each other's.
  CollectiveFormats& formats() const { return *formats_; }

  // MPI forbids a send buffer that overlaps the receive buffer of the same call, and does not check:
  // it would reduce or copy from input it has half overwritten. So the collectives below with both
  // a send and a recv check that the two do not share a byte (ENSURE), with one exception, the
  // all-gathers in place.

  // In place over `buf`.
  virtual CommHandle all_reduce_async(Tensor buf, ReduceOp op) = 0;
  // send holds size()*n elements; rank r receives the reduction of chunk r (n elements) into recv.
  virtual CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) = 0;
  // send holds n elements; recv receives size()*n: rank r's contribution at offset r*n.
  // In place when send IS this rank's chunk of recv (send.data == the address of element rank*n of
  // recv): MPI then takes this rank's contribution from recv itself (MPI_IN_PLACE). That is how
  // ZeRO gathers the updated parameters: every rank updated its own piece of each range.
  virtual CommHandle all_gather_async(Tensor send, Tensor recv) = 0;

  // Variable counts: segment r (counts[r] elements, possibly 0) belongs to rank r. counts has size()
  // entries, the same on every rank; segment r begins at counts[0] + ... + counts[r-1]. Counted as
  // ReduceScatter and AllGather, with the full size sum(counts) as the payload; the bytes sent and
  // received follow the counts (CollectiveCounters). counts is copied: it may die as soon as the call
  // returns.
  //
  // send holds sum(counts) elements; this rank receives the reduction of its segment into recv,
  // counts[rank()] elements (recv may be an empty Tensor when that is 0).
  virtual CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                            ReduceOp op) = 0;
  // send holds counts[rank()] elements; recv receives sum(counts): every rank's segment, in rank
  // order. In place when send IS this rank's segment of recv, as for all_gather_async.
  virtual CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) = 0;

  // All-to-all (expert parallelism's dispatch and combine): every rank sends a different chunk to
  // every rank. send holds size() chunks of n elements, chunk r for rank r; recv receives size()
  // chunks of n, chunk r from rank r. Counted as AllToAll with this rank's send buffer S as the
  // payload; a rank keeps its own chunk, so it sends and receives (N-1)/N of S.
  virtual CommHandle all_to_all_async(Tensor send, Tensor recv) = 0;
  // Variable counts: send holds sum(send_counts) elements, segment r (send_counts[r], possibly 0)
  // for rank r, in rank order; recv receives sum(recv_counts), segment r from rank r. recv_counts[r]
  // must be what rank r sends here (its send_counts[rank()]): exchange the counts first, with an
  // all_to_all of one count per rank. The payload is this rank's send buffer; the bytes sent and
  // received follow the counts, the own segment excluded. The counts are copied.
  virtual CommHandle all_to_all_v_async(Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                        const std::vector<int64_t>& recv_counts) = 0;

  virtual CommHandle broadcast_async(Tensor buf, int root) = 0;
  // Point to point. A receive matches the send from `peer` with the same tag; messages with equal
  // (peer, tag) arrive in the order they were sent. NCCL has no tags and matches by issue order
  // (comm_nccl.cpp): a program that must run on it issues sends and receives in a matching order.
  virtual CommHandle send_async(Tensor buf, int peer, int tag = 0) = 0;
  virtual CommHandle recv_async(Tensor buf, int peer, int tag = 0) = 0;
  // Several sends and receives started together, one handle for them all. NCCL runs them as one
  // group call (ncclGroupStart/End): a send finishes only while its receive runs, so a rank's send to
  // a neighbour and its receive from it must progress at once, not one after the other on the
  // stream. Elsewhere each is posted on its own (tags match them); the handle waits for all.
  struct PointToPoint {
    bool send;
    Tensor buf;
    int peer, tag;
  };
  virtual CommHandle send_recv_async(const std::vector<PointToPoint>& ops);
  // The same, waited at once: each message is posted on the caller's thread as it is issued and the
  // caller drives it to completion, with no hand-off to a background progress thread (which a small
  // message would spend more time waking than travelling). What chapter 00's algorithms use per step.
  void send_recv(const std::vector<PointToPoint>& ops) {
    blocking([&] { return send_recv_async(ops); });
  }
  // Whether a receive finds its message by tag (MPI), or only by the order of the calls (NCCL): a
  // pipeline then orders its messages so that the k-th send meets the k-th receive
  // (pipeline_schedule.h, Matching).
  virtual bool matches_by_tag() const { return true; }
  // The largest tag a message may carry: MPI's MPI_TAG_UB attribute; the standard guarantees 32767.
  virtual int64_t largest_tag() const { return 32767; }
  virtual CommHandle barrier_async() = 0;

  // The blocking forms: the async form, waited at once (issuing_blocking_ lets a communicator know,
  // so that it need not arrange for progress in the background).
  void all_reduce(Tensor buf, ReduceOp op) {
    blocking([&] { return all_reduce_async(buf, op); });
  }
  void reduce_scatter(Tensor send, Tensor recv, ReduceOp op) {
    blocking([&] { return reduce_scatter_async(send, recv, op); });
  }
  void all_gather(Tensor send, Tensor recv) {
    blocking([&] { return all_gather_async(send, recv); });
  }
  void reduce_scatter_v(Tensor send, Tensor recv, const std::vector<int64_t>& counts, ReduceOp op) {
    blocking([&] { return reduce_scatter_v_async(send, recv, counts, op); });
  }
  void all_gather_v(Tensor send, Tensor recv, const std::vector<int64_t>& counts) {
    blocking([&] { return all_gather_v_async(send, recv, counts); });
  }
  void all_to_all(Tensor send, Tensor recv) {
    blocking([&] { return all_to_all_async(send, recv); });
  }
  void all_to_all_v(Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                    const std::vector<int64_t>& recv_counts) {
    blocking([&] { return all_to_all_v_async(send, send_counts, recv, recv_counts); });
  }
  void broadcast(Tensor buf, int root) {
    blocking([&] { return broadcast_async(buf, root); });
  }
  void send(Tensor buf, int peer, int tag = 0) {
    blocking([&] { return send_async(buf, peer, tag); });
  }
  void recv(Tensor buf, int peer, int tag = 0) {
    blocking([&] { return recv_async(buf, peer, tag); });
  }
  void barrier() {
    blocking([&] { return barrier_async(); });
  }

  // One double reduced across ranks, blocking; counted as CollectiveKind::Scalar so that metric and
  // norm scalars never blur the gradient traffic that theory predicts.
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
  // Raw bytes from root to everyone (checkpoint payloads, strings), blocking, counted as Broadcast.
  virtual void broadcast_bytes(void* data, size_t bytes, int root) = 0;

  // Every rank passes whether it succeeded; if any failed, the lowest failing rank prints its
  // message and the whole job ends, non-zero: on the world's communicator every rank finalizes and
  // exits (check.h, agreed_error), on a smaller group through MPI_Abort. Use after work that can fail on some ranks only (opening a
  // file), before the next collective, so no rank is left waiting for a failed peer.
  virtual void agree_or_die(bool ok, const std::string& msg) = 0;

  // Virtual for a communicator that composes its statistics from others' (comm_p2p.h).
  virtual const CommStats& stats() const { return stats_; }
  // Brings stats() up to date. A device communicator learns the times of its collectives from GPU
  // events, which it reads only once the GPU has passed them (comm_nccl.cpp): call this after
  // synchronizing the device, before reading a step's statistics. MPI's are always up to date.
  virtual void collect_stats() {}
  virtual void set_link_model(LinkModel link) { link_ = link; }
  const LinkModel& link_model() const { return link_; }
  // The buffer wire_format.cpp stages a low-precision collective's codes in, one per communicator,
  // reused call after call; opaque here: the communicator knows nothing of the formats around it.
  std::shared_ptr<void>& wire_staging() { return wire_staging_; }

 protected:
  // What split() and duplicate() make, before they hand the new group this one's formats.
  virtual std::unique_ptr<Communicator> split_group(int color, int key, const std::string& group) = 0;
  virtual std::unique_ptr<Communicator> duplicate_group(const std::string& group) {
    return split_group(0, rank(), group);
  }
  // A communicator that wraps another (lanes.h, the device backends) takes the wrapped one's formats.
  void share_formats_of(const Communicator& wrapped) { formats_ = wrapped.formats_; }

  template <typename Issue>
  void blocking(Issue issue) {
    issuing_blocking_ = true;
    CommHandle handle = issue();
    issuing_blocking_ = false;
    handle.wait();
  }

  // True while a blocking form issues its op, on the thread that issues it: per thread, so that two
  // lanes (lanes.h) issuing through one LaneCommunicator do not share it, and so that the copy that
  // issues the op for a LaneCommunicator sees its caller's.
  static thread_local bool issuing_blocking_;
  int rank_ = 0;
  int size_ = 1;
  Device device_ = Device::CPU;
  std::string name_ = "mpi";
  std::string group_ = "world";
  CommStats stats_;
  LinkModel link_;

 private:
  std::shared_ptr<CollectiveFormats> formats_;
  std::shared_ptr<void> wire_staging_;
};

// MPI_Init_thread (MPI_THREAD_MULTIPLE) and the communicator over MPI_COMM_WORLD. Call once, first
// thing in main; shutdown_mpi() at the end, after every communicator split from it is gone. Also sets
// the error context of check.h. With GPT_SKIP_MPI_FINALIZE=1 in the environment, shutdown_mpi() ends
// with a barrier instead of MPI_Finalize: MPICH 4.0 over UCX's TCP transport hangs in MPI_Finalize in
// a fraction of runs across hosts (docs/cluster.md, "A reliable MPI"); scripts/cluster/cluster.sh sets it.
std::unique_ptr<Communicator> init_mpi_communicator(int* argc, char*** argv);
void shutdown_mpi(std::unique_ptr<Communicator> comm);

// How many ranks of the job run on this rank's node (machine): they share its memory. And how many
// nodes the job spans (1 on one host; `mpiexec -f hostfile` across hosts, docs/cluster.md).
int ranks_on_this_node();
int nodes_in_job();
// The cores this process may count on: its affinity mask, or fewer where GPT_CORES_PER_JOB says so
// (tests/run_tests.sh runs several jobs at once and gives each its share of the machine).
int cores_for_this_job();

// The watchdog: an op that has been in flight (posted to MPI) for longer than `seconds` ends the job
// with a message naming the rank, the op, its group with the group's world ranks, the peer of a send
// or receive, and the step (check.h's phase). It catches a peer that is stopped, dead or stuck before
// a collective or a message. 0 switches it off. Process-wide.
void set_comm_timeout(double seconds);

// Async-signal-safe. From the call on (until called with false), the emulated link holds nothing: a
// held op is posted at the engine's next look (at most kHeldCheckMs later), a new one at once. The
// run's SIGINT and SIGTERM handler calls it, so that a stop is never stuck behind a modelled wait:
// the step ends at the real network's speed, and the ranks agree to stop there. The modelled waits
// are watched by the watchdog too: an op that the link holds longer than the timeout by itself
// ends the job, saying that the modelled link is that slow (no rank is dead).
void interrupt_link_emulation(bool interrupted = true);
constexpr double kHeldCheckMs = 50;

// Bytes one rank sends for a collective of `payload_bytes` split evenly over `ranks` (the sent_bytes
// of CollectiveCounters), rounded down when N does not divide the payload; 0 with one rank.
int64_t wire_bytes_for(CollectiveKind kind, int64_t payload_bytes, int ranks);

// Modelled time in ms of one op on the emulated link (0 when the link is off or ranks == 1):
//   all_reduce                   2(N-1) (alpha + S / (N beta))   reduce-scatter, then all-gather
//   reduce_scatter, all_gather    (N-1) (alpha + S / (N beta))   S = the full (N-chunk) size
//   all_to_all                    (N-1) (alpha + S / (N beta))   S = this rank's send buffer:
//                                                                N-1 pairwise exchanges of a chunk
//   broadcast, send               alpha + S / beta               pipelined: the payload once
//   barrier                       2(N-1) alpha                    an all-reduce of nothing
//   scalar                        as all_reduce with S = 8 bytes
// with alpha = latency_us and beta = gbps / 8 bytes per second (infinite when gbps is 0).
double modelled_ms(const LinkModel& link, CollectiveKind kind, int64_t payload_bytes, int ranks);

// The payload whose all_to_all takes as long as an all_to_all_v that sends `sent` and receives
// `received` bytes (own segment excluded): the larger of the two, as if it were the (N-1)/N that
// travels of an even split. Then modelled_ms(AllToAll) = (N-1) alpha + max(sent, received) / beta
// (docs/theory.md, "All-to-all"), and an even split gives back its own S.
int64_t all_to_all_v_link_bytes(int64_t sent, int64_t received, int ranks);
