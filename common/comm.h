// comm.h: the communicator every chapter talks to. Defines ReduceOp, CommHandle, CommStats,
// LinkModel and Communicator.
//
// Every collective has a blocking form and an async form that returns a CommHandle. The MPI
// implementation (comm_mpi.cpp) runs collectives on one dedicated communication thread, as mature
// frameworks do, so an async collective really progresses while the caller computes. The caller's
// time blocked in wait() is "exposed communication"; the time the thread spends running
// collectives is "communication time". Both, and the bytes, are counted per collective kind.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "tensor.h"

enum class ReduceOp { Sum, Avg, Max, Min };

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, SendRecv, Barrier, Scalar, Count };
constexpr int kCollectiveKinds = static_cast<int>(CollectiveKind::Count);
const char* collective_name(CollectiveKind k);  // "all_reduce", "reduce_scatter", ...

struct CollectiveCounters {
  int64_t calls = 0;          // ops completed and waited: counted by wait(), like everything below
  int64_t launched = 0;       // ops issued: counted at issue, before anything ran, so that a test can
                              // tell whether a collective was started during some stretch of code
  int64_t payload_bytes = 0;  // bytes handed to the collective (the full buffer; for reduce_scatter
                              // the full input, for all_gather the full output)
  int64_t wire_bytes = 0;     // bytes this rank sends over a ring: 2(N-1)/N x payload for all_reduce,
                              // (N-1)/N x payload for reduce_scatter and all_gather, payload otherwise
  double busy_ms = 0;         // time the communication thread spent running these collectives
};

struct CommStats {
  CollectiveCounters kind[kCollectiveKinds];
  double exposed_ms = 0;    // time callers spent blocked waiting for communication
  double in_flight_ms = 0;  // time during which at least one op was in flight: the union of their
                            // intervals. The busy times of ops that overlap (a send and a receive,
                            // each on its lane of the link) add up to more; this never does.
  int64_t total_calls() const;
  int64_t total_launched() const;  // every kind, Scalar included: callers subtract what they need
  int64_t total_wire_bytes() const;
  double total_busy_ms() const;
};

// Emulated interconnect (off when gbps == 0): each collective takes at least the time an alpha-beta
// model of a ring over such a link gives (comm_mpi.cpp, modelled_ms()). The communication thread
// sleeps out the remainder, so no CPU is burnt. Over NCCL (comm_nccl.cpp) a one-thread kernel holds
// the collective's stream instead (link_delay.h).
struct LinkModel {
  double gbps = 0;        // link bandwidth in gigabits per second; 0 = no emulation
  double latency_us = 0;  // per-message latency alpha
};

class CommHandle {
 public:
  struct State;
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  // The handle of a device communicator (NCCL, comm_nccl.cpp), whose collectives finish on a GPU
  // stream rather than on the comm thread: wait() calls `device_wait`, which makes the GPU's compute
  // stream wait for the collective (the host does not block) and counts the op.
  explicit CommHandle(std::function<void()> device_wait)
      : device_wait_(std::make_shared<std::function<void()>>(std::move(device_wait))) {}
  // Blocks until the collective finished; the blocked time counts as exposed communication.
  void wait();
  bool valid() const { return state_ != nullptr || device_wait_ != nullptr; }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<std::function<void()>> device_wait_;  // shared by copies, like state_
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Where the tensors of its collectives live: CPU for MPI, CUDA for the NCCL and host-staged ones.
  Device device() const { return device_; }
  const std::string& name() const { return name_; }  // "mpi", "nccl", "mpi (host-staged)"

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
  // ZeRO gathers the updated parameters: every rank updated its own slice of the full buffer.
  virtual CommHandle all_gather_async(Tensor send, Tensor recv) = 0;

  // Variable counts, for a range [begin, end) of a flat buffer whose pieces different ranks own:
  // under ZeRO rank r owns [r*S, (r+1)*S), so a bucket or a layer splits by owner unevenly, and
  // ranks that own none of it get 0. counts has size() entries, the same on every rank; segment r
  // begins at counts[0] + ... + counts[r-1]. Counted as ReduceScatter and AllGather, with the full
  // size sum(counts) as the payload, exactly as the uniform forms. counts is copied: it may die as
  // soon as the call returns.
  //
  // send holds sum(counts) elements; this rank receives the reduction of its segment into recv,
  // counts[rank()] elements (recv may be an empty Tensor when that is 0).
  virtual CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                            ReduceOp op) = 0;
  // send holds counts[rank()] elements; recv receives sum(counts): every rank's segment, in rank
  // order. In place when send IS this rank's segment of recv, as for all_gather_async.
  virtual CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) = 0;

  virtual CommHandle broadcast_async(Tensor buf, int root) = 0;
  virtual CommHandle send_async(Tensor buf, int peer) = 0;
  virtual CommHandle recv_async(Tensor buf, int peer) = 0;
  virtual CommHandle barrier_async() = 0;

  void all_reduce(Tensor buf, ReduceOp op) { all_reduce_async(buf, op).wait(); }
  void reduce_scatter(Tensor send, Tensor recv, ReduceOp op) { reduce_scatter_async(send, recv, op).wait(); }
  void all_gather(Tensor send, Tensor recv) { all_gather_async(send, recv).wait(); }
  void reduce_scatter_v(Tensor send, Tensor recv, const std::vector<int64_t>& counts, ReduceOp op) {
    reduce_scatter_v_async(send, recv, counts, op).wait();
  }
  void all_gather_v(Tensor send, Tensor recv, const std::vector<int64_t>& counts) {
    all_gather_v_async(send, recv, counts).wait();
  }
  void broadcast(Tensor buf, int root) { broadcast_async(buf, root).wait(); }
  void send(Tensor buf, int peer) { send_async(buf, peer).wait(); }
  void recv(Tensor buf, int peer) { recv_async(buf, peer).wait(); }
  void barrier() { barrier_async().wait(); }

  // One double reduced across ranks, blocking; counted as CollectiveKind::Scalar so that metric and
  // norm scalars never blur the gradient traffic that theory predicts.
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
  // Raw bytes from root to everyone (checkpoint payloads, strings), blocking, counted as Broadcast.
  virtual void broadcast_bytes(void* data, size_t bytes, int root) = 0;

  // Every rank passes whether it succeeded; if any failed, the lowest failing rank prints its
  // message and the whole job aborts. Use after work that can fail on some ranks only (opening a
  // file), before the next collective, so no rank is left waiting for a failed peer.
  virtual void agree_or_die(bool ok, const std::string& msg) = 0;

  const CommStats& stats() const { return stats_; }
  // Brings stats() up to date. A device communicator learns the times of its collectives from GPU
  // events, which it reads only once the GPU has passed them (comm_nccl.cpp): call this after
  // synchronizing the device, before reading a step's statistics. MPI's are always up to date.
  virtual void collect_stats() {}
  virtual void set_link_model(LinkModel link) { link_ = link; }
  const LinkModel& link_model() const { return link_; }

 protected:
  int rank_ = 0;
  int size_ = 1;
  Device device_ = Device::CPU;
  std::string name_ = "mpi";
  CommStats stats_;
  LinkModel link_;
};

// MPI_Init_thread (MPI_THREAD_MULTIPLE) and the communicator over MPI_COMM_WORLD. Call once, first
// thing in main; shutdown_mpi() at the end. Also sets the error context of check.h.
std::unique_ptr<Communicator> init_mpi_communicator(int* argc, char*** argv);
void shutdown_mpi(std::unique_ptr<Communicator> comm);

// Bytes one rank sends over a ring for a collective of `payload_bytes` (CollectiveCounters'
// wire_bytes), rounded down when N does not divide the payload; 0 with one rank.
int64_t wire_bytes_for(CollectiveKind kind, int64_t payload_bytes, int ranks);

// Modelled time in ms of one collective on the emulated link (0 when the link is off).
double modelled_ms(const LinkModel& link, CollectiveKind kind, int64_t payload_bytes, int ranks);
