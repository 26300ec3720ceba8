// watchdog.cpp: see watchdog.h.
#include "base/watchdog.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "base/check.h"       // fatal, error_phase
#include "base/peer_state.h"  // stopped_or_ended_ranks

namespace {

using Clock = std::chrono::steady_clock;

// Plain atomics, so that the watchdog thread, detached and still asleep when the process exits,
// never touches an object whose destructor has run.
std::atomic<double> g_timeout_s{0};
std::atomic<int64_t> g_blocked_since_ns{0};  // 0: not blocked
std::atomic<const char*> g_what{""};
std::atomic<bool> g_thread_started{false};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void watch() {
  for (;;) {
    // A tenth of a second: the job ends within that of the timeout, for no measurable cost.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double timeout = g_timeout_s.load();
    const int64_t since = g_blocked_since_ns.load();
    if (timeout <= 0 || since == 0) continue;
    const double waited = double(now_ns() - since) * 1e-9;
    if (waited <= timeout) continue;
    fatal(device_wait_message(g_what.load(), error_phase(), waited));
  }
}

}  // namespace

// Which rank a collective on the GPU waits for, neither NCCL nor the host can say; the node can, for
// the ranks that share it (peer_state.h), as the MPI watchdog names them.
std::string device_wait_message(const std::string& what, const std::string& phase, double waited_s) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", waited_s);
  const std::string stopped = stopped_or_ended_ranks();
  return "watchdog: " + what + (phase.empty() ? "" : " in " + phase) + " has not returned after " + seconds +
         " s (--timeout): " + (stopped.empty() ? "a peer rank is stopped, dead or stuck" : stopped) +
         " (a collective on the GPU waits for every rank of its group). Ending the job.";
}

void set_device_wait_timeout(double seconds) { g_timeout_s.store(seconds); }

BlockedOnDevice::BlockedOnDevice(const char* what) {
  if (g_timeout_s.load() <= 0) return;
  if (!g_thread_started.exchange(true)) std::thread(watch).detach();
  g_what.store(what);
  g_blocked_since_ns.store(now_ns());
}

BlockedOnDevice::~BlockedOnDevice() { g_blocked_since_ns.store(0); }
