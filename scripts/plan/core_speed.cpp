// core_speed.cpp: how fast each core of this machine computes now, sample by sample, for `make
// core-speed` (docs/planner.md, plan-check: why a timed row runs in rounds).
//
//   build/core_speed [--seconds 6] [--period-ms 100]
//
// One thread pinned to each online core, busy all along as a rank is: our matrix product at a shape of
// the small preset's MLP (512 rows, 128 in, 512 out: cpu::matmul_forward, whose operands live in the
// core's caches) over and over until the period ends, then a fixed loop of multiply-adds on registers
// alone, then a plain triple loop on a working set the size of the core's second-level cache; each
// timed on the thread's own CPU clock. CPU time, not wall time: a thread that waits for a
// core is not counted, so what moves is what a second of the core computes. Prints one line a sample:
// each core's product rate (GFLOP/s) and each loop's speed against its fastest sample on that core;
// then a summary per core. On a virtual machine all three can move from one sample to the next, the
// cache loop most, while the guest's own counters (run time, wait time, steal time) see none of it.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <thread>
#include <vector>

#include "ops/ops_cpu.h"
#include "training/flags.h"

namespace {

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

double wall_ms() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Eight independent chains of multiply-adds: registers only, no memory traffic to share.
double register_loop(int n) {
  double a[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  for (int i = 0; i < n; i++)
    for (double& x : a) x = x * 0.999999 + 1e-7;
  double sum = 0;
  for (double x : a) sum += x;
  return sum;
}

// A plain triple loop over three 256 x 256 matrices (768 KB: the core's 1 MB second-level cache holds
// them, just): its speed is that cache's.
void cache_loop(std::vector<float>& a, std::vector<float>& b, std::vector<float>& c) {
  const int n = 256;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < n; k++) {
      const float x = a[size_t(i) * n + k];
      for (int j = 0; j < n; j++) c[size_t(i) * n + j] += x * b[size_t(k) * n + j];
    }
}

struct Sample {
  double at_ms, product_gflops, loop_ms, cache_ms;
};

constexpr int kRows = 512, kIn = 128, kOut = 512, kLoop = 200000;

void measure(int core, double seconds, double period_ms, double start_ms, std::vector<Sample>* samples) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  std::vector<float> inp(size_t(kRows) * kIn, 0.5f), weight(size_t(kOut) * kIn, 0.25f), out(size_t(kRows) * kOut);
  std::vector<float> a(256 * 256, 0.5f), b(256 * 256, 0.25f), c(256 * 256);
  volatile double sink = 0;
  while (wall_ms() < start_ms) usleep(1000);
  // Busy all along, as a rank is: products until the period ends, then the loop once.
  for (double next = start_ms + period_ms; next <= start_ms + seconds * 1e3; next += period_ms) {
    const double t0 = thread_cpu_ms();
    int products = 0;
    do {
      cpu::matmul_forward(out.data(), inp.data(), weight.data(), nullptr, kRows, kIn, kOut);
      products++;
    } while (wall_ms() < next);
    const double t1 = thread_cpu_ms();
    sink = sink + register_loop(kLoop) + out[0];
    const double t2 = thread_cpu_ms();
    cache_loop(a, b, c);
    const double t3 = thread_cpu_ms();
    sink = sink + c[0];  // its result is read, so the loop stays
    samples->push_back({next - period_ms - start_ms, 2.0 * kRows * kIn * kOut * products / ((t1 - t0) / 1e3) / 1e9,
                        t2 - t1, t3 - t2});
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 6, period_ms = 100;
  FlagParser flags;
  flags.add("--seconds", &seconds, "how long to sample (s)");
  flags.add("--period-ms", &period_ms, "time between two samples on each core (ms)");
  if (!flags.parse(argc, argv, "core_speed: how fast each core computes now: our product, a loop on registers, a cache-sized loop."))
    return 0;
  if (!(seconds > 0 && seconds <= 600) || !(period_ms >= 10 && period_ms <= 10000)) {
    std::fprintf(stderr, "core_speed: --seconds %g --period-ms %g: give 0 < seconds <= 600 and 10 <= period-ms <= 10000\n",
                 seconds, period_ms);
    return 2;
  }
  const int cores = int(sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<std::vector<Sample>> samples(cores);
  std::vector<std::thread> threads;
  const double start = wall_ms() + 50;
  for (int c = 0; c < cores; c++) threads.emplace_back(measure, c, seconds, period_ms, start, &samples[c]);
  for (auto& t : threads) t.join();

  std::vector<double> fastest_loop(cores), fastest_cache(cores), fastest_product(cores, 0), slowest_product(cores, 1e30);
  for (int c = 0; c < cores; c++) {
    fastest_loop[c] = fastest_cache[c] = 1e30;
    for (const Sample& s : samples[c]) {
      fastest_loop[c] = std::min(fastest_loop[c], s.loop_ms);
      fastest_cache[c] = std::min(fastest_cache[c], s.cache_ms);
      fastest_product[c] = std::max(fastest_product[c], s.product_gflops);
      slowest_product[c] = std::min(slowest_product[c], s.product_gflops);
    }
  }
  std::printf("%8s", "t (s)");
  for (int c = 0; c < cores; c++) std::printf(" | core %d: product GFLOP/s, registers, cache", c);
  std::printf("\n");
  const size_t n = samples[0].size();
  for (size_t i = 0; i < n; i++) {
    std::printf("%8.2f", samples[0][i].at_ms / 1e3);
    for (int c = 0; c < cores; c++)
      if (i < samples[c].size())
        std::printf(" | %22.1f %10.2f %6.2f", samples[c][i].product_gflops, fastest_loop[c] / samples[c][i].loop_ms,
                    fastest_cache[c] / samples[c][i].cache_ms);
    std::printf("\n");
  }
  for (int c = 0; c < cores; c++) {
    int slow = 0, slow_cache = 0;
    double slowest_loop = 1;
    for (const Sample& s : samples[c]) {
      slow += s.product_gflops < 0.6 * fastest_product[c];
      slow_cache += s.cache_ms > fastest_cache[c] / 0.6;
      slowest_loop = std::min(slowest_loop, fastest_loop[c] / s.loop_ms);
    }
    std::printf("core %d: products %.1f to %.1f GFLOP/s, %d of %zu samples under 60%% of the fastest; the cache loop under "
                "60%% of its fastest in %d; the register loop at %.2f to 1.00 of its fastest\n", c, slowest_product[c],
                fastest_product[c], slow, samples[c].size(), slow_cache, slowest_loop);
  }
  return 0;
}
