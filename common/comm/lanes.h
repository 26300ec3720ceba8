// lanes.h: the two lanes of DualPipe's F&B pairs, which the pipeline executor (pipeline.h) runs at
// once. Defines Lane, current_lane(), LaneScope, LaneThread, LaneCommunicator, PairScope and
// free_when_pair_ends().
//
// Why lanes. DualPipeV's steady state pairs the forward of one micro-batch, on one of a rank's two
// chunks, with the backward of another micro-batch on the other chunk (F&B), so that the messages
// of one travel while the other computes: with experts in the stages, one micro-batch's all-to-all
// hides under the other's arithmetic (DeepSeek-V3, section 3.2.1). The executor runs such a pair as
// two lanes: the forward on the calling thread (the forward lane), the backward, B then W, on a
// thread of its own (the backward lane, LaneThread). The two passes share no arithmetic (another
// chunk's weights and scratch, another micro-batch's activation slot), so the results are the same,
// bit for bit, as one pass after the other.
//
// What the lanes must not share. Both talk to the same groups from inside a pass: tensor
// parallelism's collectives, context parallelism's ring, the experts' all-to-alls and their counts'
// gathers, the gradients' sums. MPI forbids two threads to issue collectives on one communicator at
// once; and even one at a time, the two lanes would reach a group in another order on each rank
// (whichever lane gets there first), while a communicator's collectives must come in the same order
// on every rank. So each lane issues on its own communicator: the forward lane on the group itself,
// the backward lane on a copy (Communicator::duplicate: the same ranks, another MPI communicator;
// LaneCommunicator routes each call by the calling thread's lane). The lane of a pass is fixed by the
// pass, F forward, B and W backward, paired or not; every rank of a group runs the same list of
// passes, so each of the two communicators sees the same collectives in the same order everywhere.
// Scratch that a pass keeps beside its chunk (chapter 11's exchange buffers, chapter 10's ring) is
// one per lane, for the same reason.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/comm.h"
#include "ops/memory.h"  // Buffer

enum class Lane { Forward = 0, Backward = 1 };
constexpr int kLanes = 2;

// The lane this thread computes for: Forward unless a LaneScope on this thread says otherwise. With
// pairs overlapped the executor sets it for every pass (F forward; B and W backward); otherwise it is
// never set, and every group's forward-lane communicator, the group itself, carries everything.
Lane current_lane();
int lane_index();  // int(current_lane()), to index per-lane scratch
const char* lane_name(Lane lane);  // "forward", "backward"

class LaneScope {
 public:
  explicit LaneScope(Lane lane);
  ~LaneScope();
  LaneScope(const LaneScope&) = delete;
  LaneScope& operator=(const LaneScope&) = delete;

 private:
  Lane previous_;
};

// A thread that runs one task at a time beside its caller (the backward lane of a pair). One thread
// for the whole run, not one per pair: its thread-local scratch (the matrix products' packed tiles)
// is allocated once.
class LaneThread {
 public:
  LaneThread();
  ~LaneThread();
  LaneThread(const LaneThread&) = delete;
  LaneThread& operator=(const LaneThread&) = delete;
  // Starts `task` on the thread and returns; one task at a time (wait() before the next).
  void start(std::function<void()> task);
  // Blocks until the task has returned.
  void wait();

 private:
  void main();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool busy_ = false, stopping_ = false;
  std::thread thread_;  // last: starts once everything above exists
};

// A group as the two lanes see it: every call goes to the forward lane's communicator (the group
// itself) or the backward lane's (its copy), by the calling thread's lane. Its statistics are the two
// together, so that a report's bytes per group (TrainingRun's groups, chapter 12's group table) count
// what both lanes sent. The copy shares the group's emulated link (Communicator::duplicate).
class LaneCommunicator final : public Communicator {
 public:
  // Collective over `group` (every rank of it calls this, as for split): makes the copy, named
  // "<group> (backward lane)". `group` must outlive this.
  explicit LaneCommunicator(Communicator& group);
  // The same, owning `group` (ProcessGrid::give_each_lane_its_groups).
  explicit LaneCommunicator(std::unique_ptr<Communicator> group);
  Communicator& of(Lane lane) { return lane == Lane::Forward ? group_comm_ : *copy_; }
  Communicator& mine() { return of(current_lane()); }

  std::unique_ptr<Communicator> split_group(int color, int key, const std::string& group) override {
    return mine().split(color, key, group);
  }
  CommHandle all_reduce_async(Tensor buf, ReduceOp op) override { return mine().all_reduce_async(buf, op); }
  CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) override {
    return mine().reduce_scatter_async(send, recv, op);
  }
  CommHandle all_gather_async(Tensor send, Tensor recv) override { return mine().all_gather_async(send, recv); }
  CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                    ReduceOp op) override {
    return mine().reduce_scatter_v_async(send, recv, counts, op);
  }
  CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) override {
    return mine().all_gather_v_async(send, recv, counts);
  }
  CommHandle all_to_all_async(Tensor send, Tensor recv) override { return mine().all_to_all_async(send, recv); }
  CommHandle all_to_all_v_async(Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                const std::vector<int64_t>& recv_counts) override {
    return mine().all_to_all_v_async(send, send_counts, recv, recv_counts);
  }
  CommHandle broadcast_async(Tensor buf, int root) override { return mine().broadcast_async(buf, root); }
  CommHandle send_async(Tensor buf, int peer, int tag) override { return mine().send_async(buf, peer, tag); }
  CommHandle recv_async(Tensor buf, int peer, int tag) override { return mine().recv_async(buf, peer, tag); }
  CommHandle send_recv_async(const std::vector<PointToPoint>& ops) override { return mine().send_recv_async(ops); }
  bool matches_by_tag() const override { return group_comm_.matches_by_tag(); }
  int64_t largest_tag() const override { return group_comm_.largest_tag(); }
  CommHandle barrier_async() override { return mine().barrier_async(); }
  double all_reduce_scalar(double value, ReduceOp op) override { return mine().all_reduce_scalar(value, op); }
  void broadcast_bytes(void* data, size_t bytes, int root) override { mine().broadcast_bytes(data, bytes, root); }
  void agree_or_die(bool ok, const std::string& msg) override { mine().agree_or_die(ok, msg); }
  // The two lanes' statistics added up (CommStats::operator+=). Read between steps, as any group's.
  const CommStats& stats() const override;
  void collect_stats() override;
  void set_link_model(LinkModel link) override;

 private:
  std::unique_ptr<Communicator> owned_;  // the group, where this owns it
  Communicator& group_comm_;
  std::unique_ptr<Communicator> copy_;
  mutable CommStats both_;
};

// `lane`'s communicator of `group`: its own where the group has two (a LaneCommunicator), else the
// group itself. For what keeps one object per lane (chapter 10's ring), built before any pass runs.
Communicator& lane_of(Communicator& group, Lane lane);

// Memory a pass frees inside a pair is freed when the pair ends. The two lanes run side by side, so
// whether the backward lane frees a layer's activations before or after the forward lane allocates
// its own would set the step's peak by a race; held to the pair's end, the peak is the one of the
// pair's passes in list order (the forward's allocations, then the backward's), which the theory
// replays (theory.h, moe_schedule_activation_bytes). The executor marks the pair (PairScope, on both
// lanes) and frees what was held once both lanes are done (free_pair_buffers).
class PairScope {
 public:
  PairScope();
  ~PairScope();
  PairScope(const PairScope&) = delete;
  PairScope& operator=(const PairScope&) = delete;

 private:
  bool previous_;
};
// Frees `buffer` now, or, on a thread inside a PairScope, at the next free_pair_buffers(). Leaves
// `buffer` empty either way.
void free_when_pair_ends(Buffer& buffer);
void free_pair_buffers();
