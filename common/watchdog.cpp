// watchdog.cpp: see watchdog.h.
#include "watchdog.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "check.h"  // fatal, error_phase

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
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", waited);
    const std::string phase = error_phase();
    fatal(std::string("watchdog: ") + g_what.load() + (phase.empty() ? "" : " in " + phase) + " has not returned after " +
          seconds + " s (--timeout): a collective on the GPU waits for a peer rank that is stopped, dead or stuck. "
          "Ending the job.");
  }
}

}  // namespace

void set_device_wait_timeout(double seconds) { g_timeout_s.store(seconds); }

BlockedOnDevice::BlockedOnDevice(const char* what) {
  if (g_timeout_s.load() <= 0) return;
  if (!g_thread_started.exchange(true)) std::thread(watch).detach();
  g_what.store(what);
  g_blocked_since_ns.store(now_ns());
}

BlockedOnDevice::~BlockedOnDevice() { g_blocked_since_ns.store(0); }
