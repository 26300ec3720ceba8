// matmul_timing.cpp: the CPU products' counters of matmul_timing.h.
#include "ops/matmul_timing.h"

#include <atomic>

namespace {
// Atomic: the two lanes of a pipeline's F&B pair (lanes.h) compute on two threads at once.
std::atomic<double> g_cpu_matmul_ms{0};
std::atomic<double> g_cpu_matmul_class_ms[kMatmulRowClasses];
std::atomic<double> g_cpu_matmul_class_flops[kMatmulRowClasses];
void atomic_add(std::atomic<double>& total, double x) {
  double before = total.load();
  while (!total.compare_exchange_weak(before, before + x)) {
  }
}
}  // namespace

MatmulClock::MatmulClock(int64_t rows, int64_t in, int64_t out)
    : row_class_(matmul_row_class(rows)), flops_(2.0 * double(rows) * double(in) * double(out)) {}

MatmulClock::~MatmulClock() {
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  atomic_add(g_cpu_matmul_ms, ms);
  atomic_add(g_cpu_matmul_class_ms[row_class_], ms);
  atomic_add(g_cpu_matmul_class_flops[row_class_], flops_);
}

double cpu_matmul_ms() { return g_cpu_matmul_ms.load(); }

int matmul_row_class(int64_t rows) {
  int b = 0;
  while (b + 1 < kMatmulRowClasses && (int64_t(1) << (b + 1)) <= rows) b++;
  return b;
}

MatmulByRows cpu_matmul_by_rows() {
  MatmulByRows by;
  for (int b = 0; b < kMatmulRowClasses; b++) by.ms[b] = g_cpu_matmul_class_ms[b].load(), by.flops[b] = g_cpu_matmul_class_flops[b].load();
  return by;
}
