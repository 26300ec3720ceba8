// matmul_timing.h: what the CPU's matrix products cost, counted as they run: their wall time in all
// and, by the class of their rows, their time and FLOPs (the planner's rates, docs/planner.md).
// Defines cpu_matmul_ms(), MatmulByRows, cpu_matmul_by_rows(), matmul_row_class() and MatmulClock,
// which ops.cpp's products start around their CPU work.
#pragma once
#include <chrono>
#include <cstdint>

// The wall time, in ms, that this process has spent in the CPU's matrix products (matmul_forward,
// matmul_backward_input, matmul_backward_weight) since it started; a step's share is the difference.
// The planner calibrates its two rates on it (docs/planner.md): FLOPs of the products per second,
// and the rest of the compute per activation byte. Not counted on a GPU, whose kernels are async.
double cpu_matmul_ms();
// The same time and the products' FLOPs (2 N C OC a call), split by the rows N of the product's
// activations into classes of powers of two: class b holds N in [2^b, 2^(b+1)). Our CPU product runs
// faster a FLOP on taller matrices (an expert's rows under expert parallelism, a pipeline's
// micro-batch), so the planner prices each product at its class's rate (docs/planner.md, plan-check).
constexpr int kMatmulRowClasses = 32;
struct MatmulByRows {
  double ms[kMatmulRowClasses] = {};
  double flops[kMatmulRowClasses] = {};
};
MatmulByRows cpu_matmul_by_rows();
int matmul_row_class(int64_t rows);  // floor(log2(rows)), 0 for rows <= 1

// Adds the time from its construction to its end to cpu_matmul_ms(), and with its FLOPs (2 x rows x
// in x out) to the class of its rows. Safe on two threads at once (a pipeline's F&B pair, lanes.h).
struct MatmulClock {
  MatmulClock(int64_t rows, int64_t in, int64_t out);
  ~MatmulClock();
  MatmulClock(const MatmulClock&) = delete;
  MatmulClock& operator=(const MatmulClock&) = delete;

 private:
  int row_class_;
  double flops_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};
