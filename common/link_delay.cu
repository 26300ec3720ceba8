// link_delay.cu: the kernels and calls of link_delay.h (why and how: see there).
#include "link_delay.h"

#include "cuda_check.h"  // CUDA_CHECK
#include "memory.h"      // device_alloc: the slot is counted like every other byte

namespace {

// The GPU's global nanosecond clock: one clock for all SMs, so a stamp taken on one SM can be
// compared with a reading on another.
__device__ unsigned long long globaltimer_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void stamp_kernel(unsigned long long* start_ns) { *start_ns = globaltimer_ns(); }

// One thread that mostly sleeps: it holds the stream without taking an SM from other kernels.
// __nanosleep sleeps up to twice its argument, so the hold ends within a few microseconds of `until`.
__global__ void hold_kernel(const unsigned long long* start_ns, unsigned long long duration_ns) {
  const unsigned long long until = *start_ns + duration_ns;
  while (globaltimer_ns() < until) __nanosleep(1000);
}

}  // namespace

LinkDelay::LinkDelay() {
  start_ns_ = static_cast<unsigned long long*>(
      device_alloc(sizeof(unsigned long long), MemCategory::CommBuffers, Device::CUDA));
}

LinkDelay::~LinkDelay() { device_free(start_ns_); }

void LinkDelay::begin(cudaStream_t stream) {
  stamp_kernel<<<1, 1, 0, stream>>>(start_ns_);
  CUDA_CHECK(cudaGetLastError());
}

void LinkDelay::end(cudaStream_t stream, double modelled_ms) {
  hold_kernel<<<1, 1, 0, stream>>>(start_ns_, static_cast<unsigned long long>(modelled_ms * 1e6));
  CUDA_CHECK(cudaGetLastError());
}
