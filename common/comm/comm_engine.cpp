// comm_engine.cpp: the progress engine of comm_engine.h, which moves every op of the process's MPI
// communicators, and CommHandle::wait. Defines the ProgressEngine's members, its watchdog (the
// group's missing members by name), set_comm_timeout, interrupt_link_emulation and CommHandle::wait;
// the communicator that issues the ops is in comm_mpi.cpp.
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
//             sleeping polls (a late peer). The background thread stands aside meanwhile.
//   blocking: an op waited at once (the blocking forms, every step of chapter 00's algorithms) that
//             the link does not hold skips the engine altogether (post_direct): posted on the
//             caller's thread, never listed, polled alone by its own wait() without the engine's
//             mutex. A small message so costs about what raw MPI costs: no hand-off, no list, no
//             other op's MPI_Test between two of its own. Only its statistics go through the engine.
//             Where a node's ranks outnumber its cores (8 ranks on 2 cores, as the tests run), a
//             waiting caller never spins: the peer it waits for is waiting for a core, and a spin
//             would take one from it (measured on 2 cores: 8 ranks of 04 spent most of their CPU
//             time polling).
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
//              Where two threads wait on one link at once (a pipeline's two lanes, lanes.h), the
//              union of their blocked intervals (a second sweep per communicator), as for in flight.
#include "comm/comm_engine.h"

#include <algorithm>
#include <atomic>
#include <cstdio>  // snprintf
#include <fstream>
#include <map>

#include "base/check.h"
#include "base/metrics.h"  // format_bytes, for the watchdog's message
#include "base/peer_state.h"  // stopped_or_ended_ranks, for the watchdog's message
#include "comm/trace.h"

using namespace comm_engine;

namespace {

std::atomic<double> g_timeout_s{300.0};
std::atomic<bool> g_link_interrupted{false};  // interrupt_link_emulation, written by a signal handler
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

// A modelled time too long for the clock (an emulated link no flag allows, set by a test) is held
// for about 30 years, where the watchdog or an interrupt ends it, instead of overflowing.
constexpr double kLongestHoldMs = 1e12;

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

Clock::duration as_duration(double ms) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// The progress engine

ProgressEngine::ProgressEngine(bool may_spin) : may_spin_(may_spin), thread_([this] { thread_main(); }) {}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  thread_cv_.notify_all();
  thread_.join();
}

int ProgressEngine::add_communicator() {
  std::lock_guard<std::mutex> lock(mutex_);
  lanes_.push_back(Lane{});
  lanes_.push_back(Lane{});
  sweeps_.push_back(InFlightSweep{});
  blocked_.push_back(InFlightSweep{});
  return int(lanes_.size()) - 2;
}

void ProgressEngine::submit(std::unique_ptr<MpiOp> op, double modelled_ms, bool waited_at_once) {
  bool wake = !waited_at_once;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point now = Clock::now();
    Lane& lane = lanes_[op->lane];
    op->issued = now;
    op->handle->issued = now;
    op->handle->sweep = op->lane / 2;
    if (!(modelled_ms <= kLongestHoldMs)) modelled_ms = kLongestHoldMs;  // NaN too
    if (g_link_interrupted.load()) modelled_ms = 0, lane.free_at = std::min(lane.free_at, now);
    op->modelled_ms = modelled_ms;
    op->post_at = std::max(now, lane.free_at) + as_duration(modelled_ms);
    lane.free_at = op->post_at;
    sweeps_[op->lane / 2].op_issued(now);
    // Whoever drives progress (the thread, or a waiting caller) already wakes by the post time of
    // every op held before: an op due no earlier than one of those needs no wake-up of its own. In
    // chapter 02, with a collective per tensor queued on the link, that is most of them, and each
    // wake-up would take a core from backward.
    const Clock::time_point due = op->post_at;
    const bool driven_by_then =
        std::any_of(held_.begin(), held_.end(), [&](const std::unique_ptr<MpiOp>& h) { return h->post_at <= due; });
    held_.push_back(std::move(op));
    if (!post_due(now) && driven_by_then) wake = false;
  }
  // The background thread polls what an async op leaves in flight, or posts what the link holds. A
  // blocking call is driven by its own caller from the start: waking the thread would only make it
  // compete with the caller for the core and for MPI.
  if (wake) thread_cv_.notify_one();
}

bool ProgressEngine::post_direct(std::unique_ptr<MpiOp>& op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A communicator's lanes are a pair (send even, receive odd); only its send lane ever holds.
    const int send_lane = op->lane & ~1;
    const auto held_here = [&](const std::unique_ptr<MpiOp>& h) { return (h->lane & ~1) == send_lane; };
    if (std::any_of(held_.begin(), held_.end(), held_here)) return false;
    const Clock::time_point now = Clock::now();
    CommHandle::State& h = *op->handle;
    op->issued = op->post_at = op->posted = now;
    h.issued = h.posted_at = now;
    h.posted = true;
    h.sweep = op->lane / 2;
    sweeps_[size_t(h.sweep)].op_issued(now);
    // Blocking: its caller is blocked from the issue on, as wait_began would say at once.
    h.blocked = true;
    blocked_[size_t(h.sweep)].op_issued(now);
  }
  op->start(op->request);
  CommHandle::State& h = *op->handle;
  h.direct = std::move(op);
  return true;
}

// Polls like wait(): without sleeping while the op could still be moving data, then with sleeps
// that grow (a late peer), the watchdog watching. Only the bookkeeping at the end takes the mutex.
void ProgressEngine::wait_direct(CommHandle::State& s) {
  MpiOp& op = *s.direct;
  const double timeout_s = g_timeout_s.load();
  const Clock::duration spin = as_duration(std::max(kSpinMinMs, double(s.payload_bytes) / kSpinBytesPerMs));
  auto poll = kPollMin;
  for (int spins = 0;; spins++) {
    int complete = 0;
    MPI_CHECK(MPI_Testall(op.requests, op.request, &complete, MPI_STATUSES_IGNORE));
    if (complete) break;
    const Clock::time_point now = Clock::now();
    if (timeout_s > 0 && now - op.posted > as_duration(timeout_s * 1e3)) {
      std::lock_guard<std::mutex> lock(mutex_);
      watchdog(op, timeout_s);
    }
    if (may_spin_ && now - op.posted < spin) {  // (never where ranks outnumber cores: see the top)
      if (spins % kPollsPerYield == kPollsPerYield - 1) std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(poll);
    poll = std::min(poll + kPollStep, kPollMax);
  }
  if (op.finish) op.finish();
  std::lock_guard<std::mutex> lock(mutex_);
  complete_op(op);
  s.direct.reset();  // (it holds a reference to s: the cycle ends here)
}

void ProgressEngine::wait_began(CommHandle::State& s) {
  if (s.direct) return;  // blocked since its issue (post_direct)
  std::lock_guard<std::mutex> lock(mutex_);
  if (s.done || s.blocked) return;
  s.blocked = true;
  blocked_[size_t(s.sweep)].op_issued(Clock::now());
}

void ProgressEngine::wait(CommHandle::State& s) {
  if (s.direct) return wait_direct(s);
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
    if (may_spin_ && s.posted && p.mpi_pending && now - s.posted_at < as_duration(spin_ms)) {
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

void ProgressEngine::drain(int lane_a, int lane_b) {
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

void ProgressEngine::post_held(int lane) {
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

// While the link holds an op, whoever waits looks again at least this often: for an interrupt
// (interrupt_link_emulation) and for the watchdog, however far the op's post time lies.
Clock::time_point ProgressEngine::held_check(Clock::time_point now) const {
  return held_.empty() ? Clock::time_point::max() : now + as_duration(kHeldCheckMs);
}

// Posts every held op that is due, in issue order (for a lane, due times grow in issue order);
// after an interrupt, every held op.
bool ProgressEngine::post_due(Clock::time_point now) {
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
    op.start(op.request);
    posted_.push_back(std::move(*it));
    it = held_.erase(it);
    posted = true;
  }
  return posted;
}

// One round, under the mutex: post what is due, test what is posted, complete what finished, and
// end the job if an op has waited longer than the watchdog allows.
ProgressEngine::Progress ProgressEngine::progress(Clock::time_point now) {
  Progress p;
  p.changed = post_due(now);
  const double timeout_s = g_timeout_s.load();
  for (auto it = posted_.begin(); it != posted_.end();) {
    MpiOp& op = **it;
    int complete = 0;
    MPI_CHECK(MPI_Testall(op.requests, op.request, &complete, MPI_STATUSES_IGNORE));
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
void ProgressEngine::complete_op(MpiOp& op) {
  const Clock::time_point end = Clock::now();
  Lane& lane = lanes_[op.lane];
  const Clock::time_point begin = std::max(op.issued, lane.last_completed);
  lane.last_completed = end;
  CommHandle::State& h = *op.handle;
  h.busy_ms = std::chrono::duration<double, std::milli>(end - begin).count();
  h.in_flight_ms = sweeps_[op.lane / 2].op_completed(end);
  if (h.blocked) h.blocked_ms = blocked_[op.lane / 2].op_completed(end);
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
void ProgressEngine::watchdog(const MpiOp& op, double timeout_s) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.3g", timeout_s);
  const std::string phase = error_phase();
  const bool point_to_point = op.peer >= 0;
  const std::string peer =
      point_to_point ? "world rank " + std::to_string(op.group->world_ranks.at(size_t(op.peer))) : "";
  // Which peer MPI cannot say; the node can, for the peers that share it.
  const std::string missing = stopped_or_ended_ranks(op.group->world_ranks);
  const std::string blamed = !missing.empty() ? missing
                             : (point_to_point ? peer : "a peer rank of that group") + " is stopped, dead or stuck";
  fatal(std::string("watchdog: ") + op.name + " of " + format_bytes(double(op.handle->payload_bytes)) +
        (point_to_point ? (std::string(op.name) == "send" ? " to " : " from ") + peer : "") + " over " +
        describe_group(*op.group) + (phase.empty() ? "" : " in " + phase) + " has not completed after " +
        seconds + " s (--timeout): " + blamed + " before this " + (point_to_point ? "message" : "collective") +
        ". Ending the job.");
}

// A wait on the emulated link alone: no peer is involved yet, so none is blamed.
void ProgressEngine::held_watchdog(const MpiOp& op, double timeout_s) {
  char text[160];
  std::snprintf(text, sizeof text, "for %.4g s, longer than --timeout %.3g s", op.modelled_ms / 1e3, timeout_s);
  const std::string phase = error_phase();
  const std::string flags = std::string(op.link_flags) + "-gbps and " + op.link_flags + "-latency-us";
  fatal(std::string("watchdog: the emulated link holds this ") + op.name + " of " +
        format_bytes(double(op.handle->payload_bytes)) + " over " + describe_group(*op.group) +
        (phase.empty() ? "" : " in " + phase) + " " + text + ": the modelled link (" + flags +
        ") is that slow; no rank is dead. Raise the bandwidth, lower the latency, or raise --timeout.");
}

// The background thread: polls while nobody waits, sleeps while nothing is posted.
void ProgressEngine::thread_main() {
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

void set_comm_timeout(double seconds) { g_timeout_s = seconds; }

void interrupt_link_emulation(bool interrupted) { g_link_interrupted = interrupted; }

// ---------------------------------------------------------------------------------------------
// CommHandle: what the caller holds while an op is in flight (its State: comm_engine.h)

void CommHandle::wait() {
  if (device_wait_) return (*device_wait_)();  // a device communicator's handle (comm.h)
  ENSURE(state_ != nullptr, "wait() on an empty CommHandle");
  State& s = *state_;
  if (s.counted) return;  // waited before: done, and counted
  const Clock::time_point blocked_from = Clock::now();
  // Blocked from the call until the op completed: inside the op's own [issued, completed] interval,
  // so exposed time never exceeds the in-flight time. Two threads blocked on one link at once (a
  // pipeline's lanes) count their union, as its in-flight time is (InFlightSweep).
  s.engine->wait_began(s);
  s.engine->wait(s);
  const Clock::time_point from = std::max(blocked_from, s.issued);
  // stats belong to the thread that issues and waits (see the file comment): no lock needed.
  CommStats& stats = *s.stats;
  if (s.completed > from) {
    stats.exposed_ms += s.blocked_ms;
    stats.kind[int(s.kind)].exposed_ms += s.blocked_ms;
  }
  // Done before it was waited for, a span of no length still says where the caller would have
  // waited, for the step-time model (trace.h). (Named only when traced: a small op's wait is a
  // couple of microseconds, and building its name is a measurable part of it.)
  if (tracing_enabled())
    trace_span(Track::Wait, std::string("wait ") + (*s.name ? s.name : collective_name(s.kind)), trace_ms(from),
               trace_ms(std::max(from, s.completed)), "", trace_ms(s.issued));
  if (!s.counted) {
    s.counted = true;
    CollectiveCounters& c = stats.kind[int(s.kind)];
    c.count_op(s.payload_bytes, s.sent_bytes, s.received_bytes);
    c.busy_ms += s.busy_ms;
    stats.in_flight_ms += s.in_flight_ms;
  }
}
