// memory.h: the framework's own allocator, which counts every byte by category.
// A chapter's reported memory is therefore measured, not estimated. Defines MemCategory,
// device_alloc/device_free, the per-process MemoryStats (current and peak bytes per category), Buffer
// and Scratch.
#pragma once
#include <cstddef>
#include <cstdint>
#include "ops/tensor.h"

enum class MemCategory { Params, Grads, OptState, Activations, CommBuffers, Other, Count };
constexpr int kMemCategories = static_cast<int>(MemCategory::Count);
const char* mem_category_name(MemCategory c);  // "params", "grads", "optim", "activations", "comm", "other"

struct MemoryStats {
  int64_t current[kMemCategories] = {};
  int64_t peak[kMemCategories] = {};
  int64_t current_total = 0;
  int64_t peak_total = 0;
};

// Allocates `bytes` (zero-filled, 64-byte aligned on the CPU) on `device` and counts them under `cat`.
void* device_alloc(size_t bytes, MemCategory cat, Device device = Device::CPU);
void device_free(void* ptr);
// A copy, taken under the allocator's lock: a communicator's worker thread (comm_p2p.cpp) allocates
// while the training thread reads.
MemoryStats memory_stats();
// GPU bytes freed by the framework but kept for reuse (memory.cpp says why): held from the driver,
// counted in no category, since no tensor lives there. 0 without CUDA.
int64_t cuda_cached_bytes();
// Starts a new peak window: peaks become the current values (a step's peak, for example).
void reset_memory_peaks();

// An owning buffer for a Tensor: allocates on construction, frees on destruction, not copyable.
class Buffer {
 public:
  Buffer() = default;
  Buffer(int64_t count, MemCategory cat, DType dtype = DType::F32, Device device = Device::CPU);
  Buffer(int64_t count, MemCategory cat, Device device) : Buffer(count, cat, DType::F32, device) {}
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Tensor view() const;  // 1-D view of the whole buffer
  float* f32() const { return view().f32(); }
  int64_t count() const { return count_; }
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  int64_t count_ = 0;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// A scratch buffer that grows on demand and is never shrunk: the kernels' temporaries (partial sums,
// staged ids). Allocated through device_alloc, so its bytes appear in the memory report under
// "other". Growing returns the old block to the allocator's cache (memory.cpp) without waiting:
// whoever takes it next zeroes it on the compute stream, behind every kernel queued before that
// still reads it. Kept in globals and never freed: the process ends with them (freeing from a
// static destructor would race the CUDA runtime's own teardown at exit).
class Scratch {
 public:
  explicit Scratch(Device device) : device_(device) {}
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      device_free(data_);
      data_ = device_alloc(bytes, MemCategory::Other, device_);
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  Device device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};
