// trace.cpp: the process clock and the Chrome-trace recorder of trace.h.
// Spans are kept in memory (a mutex, since the communication thread records too) and written once
// at the end: every rank sends its JSON text to rank 0, which writes one file with one "process"
// per rank and one "thread" per track, the layout Perfetto and chrome://tracing understand.
#include "comm/trace.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

#include "comm/comm.h"
#include "base/fileio.h"
#include "comm/lanes.h"  // current_lane

namespace {

using Clock = std::chrono::steady_clock;
Clock::time_point g_epoch = Clock::now();

struct Span {
  Track track;
  std::string name, detail;
  double start_ms, end_ms;
  double issued_ms, link_ms;  // < 0: none
};

// Atomic: the communication thread reads it (trace_span) while the main thread may switch it.
std::atomic<bool> g_enabled{false};
std::mutex g_mutex;
std::vector<Span> g_spans;

const char* track_name(Track t) {
  switch (t) {
    case Track::Compute: return "compute";
    case Track::Comm: return "communication";
    case Track::Wait: return "waiting on communication";
    case Track::TensorParallel: return "tensor-parallel communication";
    case Track::BackwardLane: return "compute, backward lane (F&B pairs)";
    case Track::BackwardLaneWait: return "waiting on communication, backward lane";
  }
  return "?";
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// This rank's events as comma-separated JSON objects (no brackets), timestamps in microseconds.
std::string rank_events_json(int rank) {
  std::string out;
  char buf[512];
  auto add = [&](const std::string& event) {
    if (!out.empty()) out += ",\n";
    out += event;
  };
  std::snprintf(buf, sizeof buf, R"({"ph":"M","pid":%d,"name":"process_name","args":{"name":"rank %d"}})",
                rank, rank);
  add(buf);
  std::lock_guard<std::mutex> lock(g_mutex);
  // A chapter without tensor parallelism gets no empty "tensor-parallel" track, a run without F&B
  // pairs no backward lane.
  bool has_track[6] = {true, true, true, false, false, false};
  for (const Span& s : g_spans) has_track[int(s.track)] = true;
  for (Track t : {Track::Compute, Track::Comm, Track::Wait, Track::TensorParallel, Track::BackwardLane,
                  Track::BackwardLaneWait}) {
    if (!has_track[int(t)]) continue;
    std::snprintf(buf, sizeof buf, R"({"ph":"M","pid":%d,"tid":%d,"name":"thread_name","args":{"name":"%s"}})",
                  rank, int(t), track_name(t));
    add(buf);
  }
  for (const Span& s : g_spans) {
    std::snprintf(buf, sizeof buf, R"({"ph":"X","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"name":"%s")", rank,
                  int(s.track), s.start_ms * 1e3, (s.end_ms - s.start_ms) * 1e3, json_escape(s.name).c_str());
    std::string event = buf, args;
    if (!s.detail.empty()) args += R"("detail":")" + json_escape(s.detail) + "\"";
    for (const auto& [key, value] : {std::pair<const char*, double>{"issued_ms", s.issued_ms}, {"link_ms", s.link_ms}}) {
      if (value < 0) continue;
      std::snprintf(buf, sizeof buf, R"(%s"%s":%.4f)", args.empty() ? "" : ",", key, value);
      args += buf;
    }
    if (!args.empty()) event += R"(,"args":{)" + args + "}";
    add(event + "}");
  }
  return out;
}

}  // namespace

double now_ms() { return trace_ms(Clock::now()); }

double trace_ms(Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - g_epoch).count(); }

void sync_clock_epoch(Communicator& comm) {
  comm.barrier();
  g_epoch = Clock::now();
}

void enable_tracing(bool on) { g_enabled = on; }
bool tracing_enabled() { return g_enabled; }

namespace {
thread_local bool t_waits_hidden = false;  // trace_hide_waits_of_this_thread
}  // namespace

void trace_hide_waits_of_this_thread(bool hidden) { t_waits_hidden = hidden; }
bool trace_waits_hidden_on_this_thread() { return t_waits_hidden; }

void trace_span(Track track, const std::string& name, double start_ms, double end_ms, const std::string& detail,
                double issued_ms, double link_ms) {
  if (!g_enabled || (track == Track::Wait && t_waits_hidden)) return;
  if (current_lane() == Lane::Backward) {  // a pair's backward lane: its own rows (lanes.h)
    if (track == Track::Compute) track = Track::BackwardLane;
    if (track == Track::Wait) track = Track::BackwardLaneWait;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.push_back({track, name, detail, start_ms, end_ms, issued_ms, link_ms});
}

TraceScope::TraceScope(std::string name, Track track)
    : name_(std::move(name)), track_(track), start_(g_enabled ? now_ms() : 0) {}

TraceScope::~TraceScope() {
  if (g_enabled) trace_span(track_, name_, start_, now_ms());
}

void write_merged_trace(Communicator& comm, const std::string& path) {
  std::string mine = rank_events_json(comm.rank());
  // Gather variable-length texts with what the communicator has: first every length, then each
  // rank's text broadcast in turn. Simple and collective; a trace is written once per run.
  std::string merged = "{\"traceEvents\":[\n";
  for (int r = 0; r < comm.size(); r++) {
    uint64_t length = (r == comm.rank()) ? mine.size() : 0;
    comm.broadcast_bytes(&length, sizeof length, r);
    std::string text = (r == comm.rank()) ? mine : std::string(length, '\0');
    if (length) comm.broadcast_bytes(&text[0], length, r);
    if (r > 0) merged += ",\n";
    merged += text;
  }
  merged += "\n],\"displayTimeUnit\":\"ms\"}\n";
  if (comm.rank() == 0) write_file_atomically(path, merged.data(), merged.size());
}
