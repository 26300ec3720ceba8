// comm_engine.h: the progress engine that every MPI communicator of the process hands its ops to,
// shared by comm_engine.cpp (the engine, its watchdog, CommHandle::wait) and comm_mpi.cpp (the
// communicator that issues the ops, start-up) and included by nothing else. Defines Clock,
// InFlightSweep (the in-flight time split among the ops), CommHandle::State (what a handle holds),
// GroupInfo (a communicator's group as the trace and the watchdog name it), MpiOp (one submitted op) and ProgressEngine. How an op travels,
// the emulated link and the statistics: comm_engine.cpp's opening comment.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"

using Clock = std::chrono::steady_clock;

namespace comm_engine {

// Splits the union of the ops' in-flight intervals (CommStats::in_flight_ms) among the ops, so that
// each op's share is known when it completes and wait() can add it up like the other counters. The
// engine sees every issue and every completion in time order; between two such moments the set of
// ops in flight does not change. A completing op is charged the time since the previous completion,
// or since the current stretch of activity began, whichever is later: every moment when something
// was in flight is charged to exactly one op, the next one to complete. (Charging each op from its
// own issue would count overlapping ops twice; charging from the previous completion on its lane
// would lose the time before a later op of the other lane completes first.)
// The same sweep serves the callers' blocked time (CommStats::exposed_ms), where two threads wait on
// one link at once (a pipeline's two lanes, lanes.h): a wait begins, and its op completes, under the
// engine's mutex, so that those events too come in time order.
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

class ProgressEngine;
struct MpiOp;

}  // namespace comm_engine

// ---------------------------------------------------------------------------------------------
// CommHandle: what the caller holds while an op is in flight

struct CommHandle::State {
  // Set by the issuing thread before the op is submitted; read-only afterwards.
  CollectiveKind kind = CollectiveKind::AllReduce;
  // The op's own name ("all_to_all_v"), as its span on the communication track says, so that the
  // wait's span ("wait all_to_all_v") names the same op; "" (done at issue): the kind's name.
  const char* name = "";
  int64_t payload_bytes = 0, sent_bytes = 0, received_bytes = 0;
  CommStats* stats = nullptr;         // the issuing communicator's; wait() counts the op there
  std::shared_ptr<comm_engine::ProgressEngine> engine;  // drives the op while the caller waits
  Clock::time_point issued;  // when it was handed to the engine
  // Written by the engine under its mutex, read by wait() after the engine said the op is done.
  bool posted = false;        // handed to MPI (no longer held by the emulated link)
  Clock::time_point posted_at;
  bool done = false;
  Clock::time_point completed;
  double busy_ms = 0;
  double in_flight_ms = 0;  // this op's share of the union of in-flight intervals (InFlightSweep)
  bool blocked = false;     // a caller waits for it (ProgressEngine::wait_began), from before it completed
  double blocked_ms = 0;    // then its share of the union of the link's blocked intervals
  int sweep = 0;            // its link's sweeps (ProgressEngine)
  // A blocking op posted at once on the caller's thread (ProgressEngine::post_direct): the engine
  // never lists it, and the caller's wait() polls it alone. Released once it completes.
  std::unique_ptr<comm_engine::MpiOp> direct;
  // The caller's thread only.
  bool counted = false;  // set by the first wait(), so that waiting twice counts once
};

namespace comm_engine {

// A communicator's group as the trace and the watchdog name it. The communicator owns it and outlives
// its ops (its destructor drains them).
struct GroupInfo {
  std::string name;              // "world", "dp", "tp", "pp", "embedding"
  std::vector<int> world_ranks;  // the members' MPI_COMM_WORLD ranks, by rank in the group
};

// One submitted op. The issuing thread fills it in; from submission on, the engine owns it.
struct MpiOp {
  std::shared_ptr<CommHandle::State> handle;
  const char* name = "";                    // for the trace and the watchdog: "all_reduce", "send", ...
  const GroupInfo* group = nullptr;         // the communicator's group (it outlives its ops)
  int peer = -1;                            // send and recv: the other rank, in the group
  const char* link_flags = "--link";        // the flags of the link that holds it (LinkModel::flags)
  std::function<void(MPI_Request*)> start;  // posts the non-blocking MPI call(s) into `request`
  std::function<void()> finish;             // after MPI completes (the Avg scaling); may be empty
  int lane = 0;
  Clock::time_point issued, post_at, posted;
  double modelled_ms = 0;  // its own hold; it begins at post_at - modelled_ms, after the lane's previous op
  // What start() posts, tested together: one request, or two for an exchange (a receive and a send,
  // comm_mpi.cpp's two-rank all-reduce).
  int requests = 1;
  MPI_Request request[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// The one progress engine of the process (comm_engine.cpp's opening comment says how it moves ops).
class ProgressEngine {
 public:
  // may_spin: a waiting caller may poll without sleeping while its op could still be moving data
  // (comm_engine.cpp). False where this node's ranks outnumber its cores: there the peer a rank
  // waits for needs the very core a spin would take.
  explicit ProgressEngine(bool may_spin = true);
  ~ProgressEngine();

  // A communicator's two lanes of the emulated link (comm_engine.cpp), sends then receives, and its
  // in-flight sweep: returns the send lane (the receive lane is the next).
  int add_communicator();

  // Takes `op`, held for `modelled_ms` on its lane; posts it now when it is due now.
  void submit(std::unique_ptr<MpiOp> op, double modelled_ms, bool waited_at_once);
  // The small-message path: a blocking op that the link would not hold (off, or nothing to hold) is
  // posted here and now, on the caller's thread, and its wait() polls that one request alone, with
  // no list, no background thread and no other op's MPI_Test in between. False, and nothing done,
  // when the link still holds an op of this communicator (posting now would overtake it): submit().
  bool post_direct(std::unique_ptr<MpiOp>& op);

  // The body of CommHandle::wait(): drives progress until the op is done.
  void wait(CommHandle::State& s);
  // A caller blocks on `s` from now, unless it is done: from now to its completion the link's
  // blocked sweep charges it (s.blocked_ms, its share of the union of the link's blocked intervals:
  // the whole wait unless another thread waited on the same link at the same time).
  void wait_began(CommHandle::State& s);

  // Waits until no op of these lanes is held or posted (a communicator about to be freed).
  void drain(int lane_a, int lane_b);

  // Posts, once their link time has come, every op of `lane` that the emulated link still holds, so
  // that a blocking MPI call on the communicator (split) comes after them on every rank.
  void post_held(int lane);

 private:
  struct Lane {
    Clock::time_point free_at;        // when the emulated lane can take the next op
    Clock::time_point last_completed;  // for the busy time (comm_engine.cpp)
  };
  struct Progress {
    bool changed = false;       // an op was posted or completed
    bool mpi_pending = false;   // a posted op has not completed: someone must poll
    Clock::time_point next_post = Clock::time_point::max();  // when the next held op is due
  };

  Clock::time_point held_check(Clock::time_point now) const;
  bool post_due(Clock::time_point now);
  Progress progress(Clock::time_point now);
  void complete_op(MpiOp& op);
  void wait_direct(CommHandle::State& s);
  [[noreturn]] void watchdog(const MpiOp& op, double timeout_s);
  [[noreturn]] void held_watchdog(const MpiOp& op, double timeout_s);
  void thread_main();

  std::mutex mutex_;                    // guards everything below, and the ops' handles' results
  std::condition_variable thread_cv_;   // wakes the background thread: new op, no more waiters, stop
  std::condition_variable waiter_cv_;   // wakes waiting callers: an op completed
  std::vector<Lane> lanes_;
  std::list<std::unique_ptr<MpiOp>> held_;    // submitted, not yet posted (the emulated link)
  std::list<std::unique_ptr<MpiOp>> posted_;  // posted to MPI, not yet complete
  std::vector<InFlightSweep> sweeps_;  // one per communicator: its ops' union of in-flight intervals
  std::vector<InFlightSweep> blocked_;  // and its callers' union of blocked intervals
  int waiters_ = 0;
  bool stopping_ = false;
  const bool may_spin_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace comm_engine
