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
#include <memory>
#include <string>
#include "tensor.h"

enum class ReduceOp { Sum, Avg, Max, Min };

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, SendRecv, Barrier, Scalar, Count };
constexpr int kCollectiveKinds = static_cast<int>(CollectiveKind::Count);
const char* collective_name(CollectiveKind k);  // "all_reduce", "reduce_scatter", ...

struct CollectiveCounters {
  int64_t calls = 0;
  int64_t payload_bytes = 0;  // bytes handed to the collective (the full buffer; for reduce_scatter
                              // the full input, for all_gather the full output)
  int64_t wire_bytes = 0;     // bytes this rank sends over a ring: 2(N-1)/N x payload for all_reduce,
                              // (N-1)/N x payload for reduce_scatter and all_gather, payload otherwise
  double busy_ms = 0;         // time the communication thread spent running these collectives
};

struct CommStats {
  CollectiveCounters kind[kCollectiveKinds];
  double exposed_ms = 0;  // time callers spent blocked waiting for communication
  int64_t total_calls() const;
  int64_t total_wire_bytes() const;
  double total_busy_ms() const;
};

// Emulated interconnect (off when gbps == 0): each collective takes at least the time an alpha-beta
// model of a ring over such a link gives (comm_mpi.cpp, modelled_ms()). The communication thread
// sleeps out the remainder, so no CPU is burnt.
struct LinkModel {
  double gbps = 0;        // link bandwidth in gigabits per second; 0 = no emulation
  double latency_us = 0;  // per-message latency alpha
};

class CommHandle {
 public:
  struct State;
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  // Blocks until the collective finished; the blocked time counts as exposed communication.
  void wait();
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }

  // In place over `buf`.
  virtual CommHandle all_reduce_async(Tensor buf, ReduceOp op) = 0;
  // send holds size()*n elements; rank r receives the reduction of chunk r (n elements) into recv.
  virtual CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) = 0;
  // send holds n elements; recv receives size()*n: rank r's contribution at offset r*n.
  virtual CommHandle all_gather_async(Tensor send, Tensor recv) = 0;
  virtual CommHandle broadcast_async(Tensor buf, int root) = 0;
  virtual CommHandle send_async(Tensor buf, int peer) = 0;
  virtual CommHandle recv_async(Tensor buf, int peer) = 0;
  virtual CommHandle barrier_async() = 0;

  void all_reduce(Tensor buf, ReduceOp op) { all_reduce_async(buf, op).wait(); }
  void reduce_scatter(Tensor send, Tensor recv, ReduceOp op) { reduce_scatter_async(send, recv, op).wait(); }
  void all_gather(Tensor send, Tensor recv) { all_gather_async(send, recv).wait(); }
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
  void set_link_model(LinkModel link) { link_ = link; }
  const LinkModel& link_model() const { return link_; }

 protected:
  int rank_ = 0;
  int size_ = 1;
  CommStats stats_;
  LinkModel link_;
};

// MPI_Init_thread (MPI_THREAD_MULTIPLE) and the communicator over MPI_COMM_WORLD. Call once, first
// thing in main; shutdown_mpi() at the end. Also sets the error context of check.h.
std::unique_ptr<Communicator> init_mpi_communicator(int* argc, char*** argv);
void shutdown_mpi(std::unique_ptr<Communicator> comm);

// Modelled time in ms of one collective on the emulated link (0 when the link is off).
double modelled_ms(const LinkModel& link, CollectiveKind kind, int64_t payload_bytes, int ranks);
