// trace.h: one clock for the whole process, and the Chrome-trace timeline (opens in Perfetto).
// Defines now_ms(), Track, trace_span() (thread-safe, a no-op unless tracing is on),
// trace_hide_waits_of_this_thread() and write_merged_trace(), which gathers every rank's spans into
// one file: one process per rank, compute and communication on separate tracks (the tensor-parallel
// track, and the backward lane's two, only where they have spans).
#pragma once
#include <chrono>
#include <string>

class Communicator;

// Milliseconds since this rank's epoch. The epoch is set right after a barrier at start-up
// (sync_clock_epoch), so timelines of different ranks line up to within the barrier's skew.
double now_ms();
void sync_clock_epoch(Communicator& comm);
// The same clock at an earlier moment `t` of std::chrono::steady_clock (what now_ms() read then).
double trace_ms(std::chrono::steady_clock::time_point t);

// Wait: the caller blocked on communication. TensorParallel: the collectives of a tensor-parallel
// group (chapter 07), which sit inside forward and backward, apart from the data-parallel ones.
// BackwardLane, BackwardLaneWait: the compute and the waits of the backward lane of a pipeline's F&B
// pairs (lanes.h), which run beside the forward lane's; a span recorded on Compute or Wait by a thread
// in the backward lane lands there, so that the trace shows the two lanes as two rows.
enum class Track { Compute = 0, Comm = 1, Wait = 2, TensorParallel = 3, BackwardLane = 4, BackwardLaneWait = 5 };

void enable_tracing(bool on);
bool tracing_enabled();
// For a thread that waits on the caller's behalf (a communicator's worker, comm_p2p.cpp, waiting for
// the messages of the collective it runs): its waits are not the caller's, so the Wait track leaves
// them out; the caller's own wait for the collective is recorded where it waits. With false, shown
// again (a caller that ran a collective in the worker's stead).
void trace_hide_waits_of_this_thread(bool hidden = true);
bool trace_waits_hidden_on_this_thread();
// Records one span [start_ms, end_ms] on `track`. `name` is copied. `detail` (optional) shows in
// the span's args, e.g. the byte count of a collective; so do, where >= 0, `issued_ms` (when the
// collective was issued: its span may begin later, the link being busy; on a wait, the issue of the
// op waited for) and `link_ms` (how long the emulated link held it, comm.h's modelled_ms). Those two
// let scripts/compare/compare_timing.py replay a step on the link model (docs/theory.md, "Modelled step").
void trace_span(Track track, const std::string& name, double start_ms, double end_ms,
                const std::string& detail = "", double issued_ms = -1, double link_ms = -1);

// RAII span on the compute track: TraceScope s("forward L3");
class TraceScope {
 public:
  explicit TraceScope(std::string name, Track track = Track::Compute);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  std::string name_;
  Track track_;
  double start_;
};

// Collective over all ranks: rank 0 writes `path` (atomically: temporary file, then rename).
void write_merged_trace(Communicator& comm, const std::string& path);
