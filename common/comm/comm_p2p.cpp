// comm_p2p.cpp: with_collectives() of comm_p2p.h: the P2PCollectives communicator, which runs the
// three gradient collectives from send and receive on a worker thread of its own and hands
// everything else to the communicator it wraps.
#include "comm/comm_p2p.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "comm/trace.h"  // the caller's wait span; the worker's own waits hidden
#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "base/cuda_check.h"  // CUDA_CHECK
#include "ops/ops_cuda.h"    // cuda::stream(), use_stream_on_this_thread: the worker's stream
#endif

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// One collective, from its issue to its wait. The caller fills in the first part before handing it
// to the worker; the worker writes the second, under the communicator's mutex, and sets `done`; the
// caller reads it once it has seen `done` under that mutex.
struct Pending {
  CollectiveKind kind = CollectiveKind::AllReduce;
  int64_t payload_bytes = 0;
  bool on_gpu = false;  // its tensors are CUDA memory: ordered and timed by events (file comment)
  Clock::time_point issued;
  bool ran_inline = false;  // run on the caller's thread (P2PCollectives::run_inline): blocked from its issue
  // The worker's.
  bool done = false;
  Clock::time_point completed;
  int64_t sent_bytes = 0, received_bytes = 0;  // what the lane's sends and receives carried
  double busy_ms = 0;       // the lane's busy time for them (CPU)
  double in_flight_ms = 0;  // this collective's share of the union of in-flight intervals (CPU)
  // The caller's.
  bool counted = false;  // set by the first wait(), so that waiting twice counts once
  double host_blocked_ms = 0;
#ifdef GPT_WITH_CUDA
  cudaEvent_t ready = nullptr;   // the caller's stream at issue: the input is written
  cudaEvent_t start = nullptr;   // the worker's stream, once it has waited for `ready`
  cudaEvent_t end = nullptr;     // the worker's stream, after the collective's last kernel
  cudaEvent_t waited = nullptr;  // the caller's stream, where wait() made it wait for `end`
#endif
};

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
    share_formats_of(*inner_);
    // The algorithms' own group: every rank of inner_ builds it here, in the same order.
    lane_ = inner_->split(0, inner_->rank(), inner_->group() + " (send/recv collectives)");
    lane_->set_link_model(link_);
#ifdef GPT_WITH_CUDA
    if (device_ == Device::CUDA) CUDA_CHECK(cudaGetDevice(&cuda_device_));  // the worker's too
#endif
    worker_ = std::thread([this] { worker_main(); });  // last: everything it reads exists
  }

  // Runs what is still queued (every rank queued the same collectives, and peers are running them
  // too), then ends the worker. Wait every handle before this, as for any communicator (comm.h).
  ~P2PCollectives() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    worker_.join();
#ifdef GPT_WITH_CUDA
    for (auto& p : gpu_uncollected_) destroy_events(*p);
#endif
    lane_.reset();
    inner_.reset();
  }

  std::unique_ptr<Communicator> split_group(int color, int key, const std::string& group) override {
    return std::make_unique<P2PCollectives>(choice_, inner_->split(color, key, group));
  }
  std::unique_ptr<Communicator> duplicate_group(const std::string& group) override {
    return std::make_unique<P2PCollectives>(choice_, inner_->duplicate(group));
  }

  // Each of these copies what its algorithm needs (tensors are views, counts a vector): the worker
  // runs it after the call has returned.
  CommHandle all_reduce_async(Tensor buf, ReduceOp op) override {
    if (!ours(buf, op)) return inner_->all_reduce_async(buf, op);
    const Algorithm a = algorithm_for(choice_, CollectiveKind::AllReduce, int64_t(buf.bytes()));
    return issue(CollectiveKind::AllReduce, int64_t(buf.bytes()), buf.device,
                 [this, buf, op, a] { p2p_all_reduce(*lane_, buf, op, a); });
  }
  CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) override {
    if (!ours(send, op)) return inner_->reduce_scatter_async(send, recv, op);
    const Algorithm a = algorithm_for(choice_, CollectiveKind::ReduceScatter, int64_t(send.bytes()));
    return issue(CollectiveKind::ReduceScatter, int64_t(send.bytes()), send.device,
                 [this, send, recv, op, a] { p2p_reduce_scatter(*lane_, send, recv, op, a); });
  }
  CommHandle all_gather_async(Tensor send, Tensor recv) override {
    if (!ours(recv, ReduceOp::Sum)) return inner_->all_gather_async(send, recv);
    const Algorithm a = algorithm_for(choice_, CollectiveKind::AllGather, int64_t(recv.bytes()));
    return issue(CollectiveKind::AllGather, int64_t(recv.bytes()), recv.device,
                 [this, send, recv, a] { p2p_all_gather(*lane_, send, recv, a); });
  }
  CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                    ReduceOp op) override {
    if (!ours(send, op)) return inner_->reduce_scatter_v_async(send, recv, counts, op);
    const Algorithm a = algorithm_for(choice_, CollectiveKind::ReduceScatter, int64_t(send.bytes()));
    return issue(CollectiveKind::ReduceScatter, int64_t(send.bytes()), send.device,
                 [this, send, recv, counts, op, a] { p2p_reduce_scatter(*lane_, send, recv, op, a, counts); });
  }
  CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) override {
    if (!ours(recv, ReduceOp::Sum)) return inner_->all_gather_v_async(send, recv, counts);
    const Algorithm a = algorithm_for(choice_, CollectiveKind::AllGather, int64_t(recv.bytes()));
    return issue(CollectiveKind::AllGather, int64_t(recv.bytes()), recv.device,
                 [this, send, recv, counts, a] { p2p_all_gather(*lane_, send, recv, a, counts); });
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

  // The lane belongs to the worker: what touches it is queued behind the collectives issued before.
  void collect_stats() override {
    inner_->collect_stats();
#ifdef GPT_WITH_CUDA
    collect_gpu_times();
#endif
  }
  void set_link_model(LinkModel link) override {
    link_ = link;
    inner_->set_link_model(link);
    post([this, link] { lane_->set_link_model(link); });
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

  // Hands one collective to the worker and returns its handle. Counted as the library's would be
  // (comm.h): `launched` now, the rest when it is waited.
  CommHandle issue(CollectiveKind kind, int64_t payload_bytes, Device device, std::function<void()> body) {
    auto p = std::make_shared<Pending>();
    p->kind = kind;
    p->payload_bytes = payload_bytes;
    p->on_gpu = device == Device::CUDA;
    p->issued = Clock::now();
    ours_.kind[int(kind)].launched += 1;
#ifdef GPT_WITH_CUDA
    if (p->on_gpu) {
      // The input is written by the kernels this thread queued so far: the worker's stream waits.
      collect_gpu_times();
      CUDA_CHECK(cudaEventCreateWithFlags(&p->ready, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventRecord(p->ready, cuda::stream()));
    }
#endif
    if (!p->on_gpu && issuing_blocking_ && payload_bytes <= kSmallAllReduceBytes && run_inline(*p, body))
      return CommHandle(std::function<void()>([this, p] { wait_for(p); }));
    post([this, p, body = std::move(body)] { execute(*p, body); });
    return CommHandle(std::function<void()>([this, p] { wait_for(p); }));
  }

  // The small-message path. A small blocking collective, waited the moment it is issued, runs here
  // on the caller's thread when the worker is idle with nothing queued: handing it over would cost
  // two thread wake-ups, more than its messages take. The lane is claimed first, so that the worker
  // cannot start anything on it meanwhile, and order is kept: nothing issued before is still
  // pending. False (the worker is busy): it goes the usual way.
  bool run_inline(Pending& p, const std::function<void()>& body) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (lane_claimed_ || !queue_.empty()) return false;
      lane_claimed_ = true;
    }
    p.ran_inline = true;
    // Its messages' waits are the caller's wait for the collective (wait_for's span), as on the worker.
    const bool waits_hidden = trace_waits_hidden_on_this_thread();
    trace_hide_waits_of_this_thread(true);
    execute(p, body);
    trace_hide_waits_of_this_thread(waits_hidden);
    bool queued = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lane_claimed_ = false;
      queued = !queue_.empty();
    }
    // A collective queued meanwhile by another thread may run now. Else the worker sleeps on: a
    // wake-up for nothing would cost more than the collective.
    if (queued) work_cv_.notify_one();
    return true;
  }

  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    work_cv_.notify_one();
  }

  // The worker: one at a time, in issue order, as MPI requires of a communicator's collectives.
  void worker_main() {
    trace_hide_waits_of_this_thread();  // it waits for messages on the caller's behalf
#ifdef GPT_WITH_CUDA
    // The current device is the thread's own: this one starts on device 0 unless told.
    if (cuda_device_ >= 0) {
      CUDA_CHECK(cudaSetDevice(cuda_device_));
      // Default flags, like the compute stream: ordered with the legacy default stream, so that the
      // host-staged communicator's plain cudaMemcpy and the kernels here see each other's bytes.
      CUDA_CHECK(cudaStreamCreate(&stream_));
      cuda::use_stream_on_this_thread(stream_);
    }
#endif
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [&] { return !lane_claimed_ && (stopping_ || !queue_.empty()); });
        if (queue_.empty()) break;  // stopping, with nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
        lane_claimed_ = true;
      }
      task();
      std::lock_guard<std::mutex> lock(mutex_);
      lane_claimed_ = false;
    }
#ifdef GPT_WITH_CUDA
    if (stream_) {
      // Finished before it goes: blocks this stream freed may then go to any stream that later
      // gets the same handle (memory.cpp keeps them by stream).
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      cuda::use_stream_on_this_thread(nullptr);
      CUDA_CHECK(cudaStreamDestroy(stream_));
      stream_ = nullptr;
    }
#endif
  }

  // On the worker: runs the algorithm over the lane and records what it sent, received and took.
  void execute(Pending& p, const std::function<void()>& body) {
#ifdef GPT_WITH_CUDA
    if (p.on_gpu) {
      CUDA_CHECK(cudaStreamWaitEvent(stream_, p.ready, 0));
      CUDA_CHECK(cudaEventDestroy(p.ready));  // allowed before it completes: released once the GPU passes it
      p.ready = nullptr;
      CUDA_CHECK(cudaEventCreate(&p.start));
      CUDA_CHECK(cudaEventCreate(&p.end));
      CUDA_CHECK(cudaEventRecord(p.start, stream_));
    }
#endif
    const CommStats before = lane_->stats();
    body();
#ifdef GPT_WITH_CUDA
    if (p.on_gpu) CUDA_CHECK(cudaEventRecord(p.end, stream_));
#endif
    lane_->collect_stats();  // a device lane's event times, so that its list of ops stays short
    const CommStats spent = lane_->stats().since(before);
    const CollectiveCounters& p2p = spent.kind[int(CollectiveKind::SendRecv)];
    const Clock::time_point end = Clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    p.sent_bytes = p2p.sent_bytes;
    p.received_bytes = p2p.received_bytes;
    p.busy_ms = p2p.busy_ms;
    // In flight from its issue to now. The worker completes collectives in issue order, so the union
    // of those intervals grows by this much: from the later of its issue and the previous completion.
    p.in_flight_ms = ms_between(std::max(p.issued, last_completed_), end);
    last_completed_ = end;
    p.completed = end;
    p.done = true;
    done_cv_.notify_all();
  }

  // The body of handle.wait(), on the caller's thread: blocks until the worker has run the collective,
  // then counts it. The blocked time is exposed communication, as the library's is.
  void wait_for(const std::shared_ptr<Pending>& p) {
    if (p->counted) return;  // waited before: done, and counted
    const Clock::time_point blocked_from = p->ran_inline ? p->issued : Clock::now();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [&] { return p->done; });
    }
    p->counted = true;
    CollectiveCounters& c = ours_.kind[int(p->kind)];
    c.count_op(p->payload_bytes, p->sent_bytes, p->received_bytes);
    // Blocked from the call until the collective completed: inside its own [issued, completed], so
    // exposed time never exceeds the in-flight time.
    const Clock::time_point from = std::max(blocked_from, p->issued);
    const double blocked = p->completed > from ? ms_between(from, p->completed) : 0.0;
#ifdef GPT_WITH_CUDA
    if (p->on_gpu) {
      // The worker has queued the collective; the caller's stream waits for its end, the host does
      // not. Its times come from the events, once the GPU has passed them (collect_gpu_times).
      p->host_blocked_ms = blocked;
      CUDA_CHECK(cudaEventCreate(&p->waited));
      CUDA_CHECK(cudaEventRecord(p->waited, cuda::stream()));
      CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), p->end, 0));
      gpu_uncollected_.push_back(p);
      collect_gpu_times();
      return;
    }
#endif
    c.busy_ms += p->busy_ms;
    c.exposed_ms += blocked;
    ours_.exposed_ms += blocked;
    ours_.in_flight_ms += p->in_flight_ms;
    trace_span(Track::Wait, std::string("wait ") + collective_name(p->kind), trace_ms(from),
               trace_ms(std::max(from, p->completed)), "", trace_ms(p->issued));
  }

#ifdef GPT_WITH_CUDA
  // The times of waited GPU collectives whose events the GPU has passed, as the NCCL communicator
  // takes its own (comm_nccl.cpp): busy and in flight from start to end on the worker's stream (one
  // collective after another there, so they never overlap); exposed, the caller's stream's stall
  // (end - waited, when positive) plus the host's wait for the worker to queue it, which is its
  // whole transfer where the lane blocks (host staging). Never blocks.
  void collect_gpu_times() {
    for (auto it = gpu_uncollected_.begin(); it != gpu_uncollected_.end();) {
      Pending& p = **it;
      if (!passed(p.end) || !passed(p.waited)) {
        ++it;
        continue;
      }
      float busy = 0, stall = 0;
      CUDA_CHECK(cudaEventElapsedTime(&busy, p.start, p.end));
      CUDA_CHECK(cudaEventElapsedTime(&stall, p.waited, p.end));
      const double exposed = std::min(double(busy), p.host_blocked_ms + std::max(0.0, double(stall)));
      CollectiveCounters& c = ours_.kind[int(p.kind)];
      c.busy_ms += busy;
      c.exposed_ms += exposed;
      ours_.exposed_ms += exposed;
      ours_.in_flight_ms += busy;
      destroy_events(p);
      it = gpu_uncollected_.erase(it);
    }
  }
  static bool passed(cudaEvent_t event) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) return false;
    CUDA_CHECK(status);
    return true;
  }
  static void destroy_events(Pending& p) {
    for (cudaEvent_t* e : {&p.ready, &p.start, &p.end, &p.waited}) {
      if (*e) CUDA_CHECK(cudaEventDestroy(*e));
      *e = nullptr;
    }
  }
#endif

  CollectivesChoice choice_;
  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<Communicator> lane_;  // the worker's alone, once it runs
  CommStats ours_;                      // the caller's thread's, like any communicator's statistics
  mutable CommStats composed_;

  std::mutex mutex_;                   // guards the queue, stopping_ and the Pendings' worker half
  std::condition_variable work_cv_;    // wakes the worker: a task, or stop
  std::condition_variable done_cv_;    // wakes a waiting caller: a collective done
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  bool lane_claimed_ = false;          // a collective runs on the lane: the worker's, or one run inline
  Clock::time_point last_completed_;  // the worker's: its previous collective's completion
#ifdef GPT_WITH_CUDA
  int cuda_device_ = -1;               // the caller's device, for the worker; -1 on a CPU communicator
  cudaStream_t stream_ = nullptr;      // the worker's stream (its thread's cuda::stream())
  std::list<std::shared_ptr<Pending>> gpu_uncollected_;  // waited, times not yet read
#endif
  std::thread worker_;  // last: started once everything above exists
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

Algorithm algorithm_for(const CollectivesChoice& choice, CollectiveKind kind, int64_t bytes) {
  if (choice.by_size)
    return kind == CollectiveKind::AllReduce && bytes <= kSmallAllReduceBytes ? Algorithm::RecursiveDoubling : Algorithm::Ring;
  return algorithm_has(choice.forced, kind) ? choice.forced : Algorithm::Ring;
}

int64_t collective_sent_bytes(const CollectivesChoice& choice, CollectiveKind kind, int64_t bytes, int element_bytes,
                              int ranks, int rank) {
  if (choice.library) return wire_bytes_for(kind, bytes, ranks);
  return predicted_sent_bytes(algorithm_for(choice, kind, bytes), kind, bytes, element_bytes, ranks, rank);
}

std::unique_ptr<Communicator> with_collectives(const CollectivesChoice& choice, std::unique_ptr<Communicator> inner) {
  if (choice.library) return inner;
  return std::make_unique<P2PCollectives>(choice, std::move(inner));
}
