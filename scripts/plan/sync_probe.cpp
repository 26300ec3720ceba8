// sync_probe.cpp: what one synchronization between ranks costs on this machine now, for `make
// plan-check` (scripts/plan/plan_check.sh runs it beside each calibration; the planner adds it to every
// blocking collective and message of a row as --sync-us, docs/planner.md).
//
//   mpiexec -n 2 build/sync_probe [--ms 500] [--work-us 1000]
//
// Each rank computes --work-us of its own CPU time (a spin on the thread's CPU clock, so the same work
// whatever the load), then calls a blocking all-reduce of one float through our Communicator (the MPI
// backend every chapter uses, no emulated link), and times the call; as a row of plan-check computes
// between its collectives. Rank 0 prints one line, "sync-json {...}", with the calls' mean and median
// in microseconds, averaged over the ranks. A call returns once both ranks have arrived and run since:
// on idle cores a few microseconds of shared memory; on cores shared with more runnable processes
// than cores, the rank that arrives first waits for the other, whose work the scheduler stretched
// more, and then each for the other to be scheduled again, about a time slice. Averaged over both
// ranks, the wait is what a synchronization adds to the mean of the ranks' work between two of them:
// the max of two works is their mean plus half their difference. The mean, not the median, is what a
// row pays: its collectives wait in sequence, so their costs add, the long waits included. The loop
// runs for --ms of wall time, not a number of calls, so that it spans many time slices. (Rank 0
// decides when to stop and says so in the value it contributes, so both ranks stop at the same call.)
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>

#include "comm/comm.h"
#include "comm/trace.h"  // now_ms
#include "ops/memory.h"  // Buffer
#include "training/flags.h"

namespace {

double thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// Burns `us` of this thread's CPU time: on a shared core it lasts longer in wall time, as a row's compute does.
void work(double us) {
  const double until = thread_cpu_us() + us;
  volatile double sink = 0;
  while (thread_cpu_us() < until)
    for (int i = 0; i < 1000; i++) sink = sink + 1e-9 * i;
}

}  // namespace

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  double wall_ms = 500, work_us = 1000;
  FlagParser flags;
  flags.add("--ms", &wall_ms, "wall time to time blocking all-reduces of one float for (ms)");
  flags.add("--work-us", &work_us, "CPU time each rank computes before each all-reduce (us)");
  if (!flags.parse(argc, argv, "sync_probe: the cost of one synchronization between ranks, now.")) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  if (!(wall_ms > 0 && wall_ms <= 60000) || !(work_us >= 0 && work_us <= 1e6)) {
    if (comm->rank() == 0)
      std::fprintf(stderr, "sync_probe: --ms %g --work-us %g: give 0 < ms <= 60000 and 0 <= work-us <= 1e6\n", wall_ms,
                   work_us);
    shutdown_mpi(std::move(comm));
    return 2;
  }
  Buffer value(1, MemCategory::CommBuffers);
  float* x = value.view().f32();
  for (int i = 0; i < 5; i++) comm->all_reduce(value.view(), ReduceOp::Sum);  // warm-up
  std::vector<double> us;
  const double start = now_ms();
  for (bool stop = false; !stop;) {
    // Rank 0's 1 says "this is the last call"; the sum carries it to every rank.
    work(work_us);
    x[0] = comm->rank() == 0 && now_ms() - start >= wall_ms ? 1.0f : 0.0f;
    const double t0 = now_ms();
    comm->all_reduce(value.view(), ReduceOp::Sum);
    us.push_back((now_ms() - t0) * 1e3);
    stop = x[0] > 0.5f;
  }
  double sum = 0;
  for (double u : us) sum += u;
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  // Averaged over the ranks: each rank's own view of the same calls.
  const double mean = comm->all_reduce_scalar(sum / double(us.size()), ReduceOp::Avg);
  const double median = comm->all_reduce_scalar(sorted[(sorted.size() - 1) / 2], ReduceOp::Avg);
  if (comm->rank() == 0)
    std::printf("sync-json {\"calls\": %zu, \"ranks\": %d, \"work_us\": %.0f, \"mean_us\": %.3f, \"median_us\": %.3f, "
                "\"wall_ms\": %.1f}\n",
                us.size(), comm->size(), work_us, mean, median, now_ms() - start);
  shutdown_mpi(std::move(comm));
  return 0;
}
