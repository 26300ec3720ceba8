// link_delay.cu: the kernel of link_delay.h (why and how: see there).
#include "comm/link_delay.h"

#include "base/cuda_check.h"  // CUDA_CHECK

namespace {

// The GPU's global nanosecond clock: one clock for all SMs.
__device__ unsigned long long globaltimer_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// One thread that mostly sleeps: it holds the stream without taking an SM from other kernels.
// __nanosleep sleeps up to twice its argument, so the hold ends within a few microseconds of its time.
__global__ void hold_kernel(unsigned long long duration_ns) {
  const unsigned long long until = globaltimer_ns() + duration_ns;
  while (globaltimer_ns() < until) __nanosleep(1000);
}

}  // namespace

void hold_stream(cudaStream_t stream, double ms) {
  hold_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(ms * 1e6));
  CUDA_CHECK(cudaGetLastError());
}
