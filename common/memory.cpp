// memory.cpp: the counting allocator of memory.h. Every allocation records its size and category in
// a small header, so device_free() knows what to subtract without a lookup table.
#include "memory.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#ifdef GPT_WITH_CUDA
#include <unordered_map>

#include "cuda_check.h"  // CUDA_CHECK, cudaMalloc
#endif

namespace {

MemoryStats g_stats;
std::mutex g_mutex;  // the communication thread allocates too

// Placed in front of every CPU allocation; 64 bytes keeps the user pointer 64-byte aligned.
struct alignas(64) AllocHeader {
  size_t bytes;
  int category;
  int device;
};

void count(MemCategory cat, int64_t delta) {
  std::lock_guard<std::mutex> lock(g_mutex);
  int c = static_cast<int>(cat);
  g_stats.current[c] += delta;
  g_stats.current_total += delta;
  if (g_stats.current[c] > g_stats.peak[c]) g_stats.peak[c] = g_stats.current[c];
  if (g_stats.current_total > g_stats.peak_total) g_stats.peak_total = g_stats.current_total;
}

#ifdef GPT_WITH_CUDA
// GPU memory cannot carry a header that the host writes in front of it, so the size and category of
// every CUDA allocation live in this map instead, guarded by g_mutex like the statistics.
struct CudaAllocation {
  size_t bytes;
  MemCategory category;
};
std::unordered_map<void*, CudaAllocation> g_cuda_allocations;

void* cuda_alloc(size_t bytes, MemCategory cat) {
  void* ptr = nullptr;
  // At least one byte, so that an empty buffer still has an address (as on the CPU).
  if (cudaMalloc(&ptr, bytes ? bytes : 1) != cudaSuccess) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    fatal("out of GPU memory allocating " + std::to_string(bytes) + " bytes for " + mem_category_name(cat) + " (" +
          std::to_string(free_bytes >> 20) + " of " + std::to_string(total_bytes >> 20) + " MiB free)");
  }
  // Zero-filled like CPU memory. The memset runs on the legacy default stream; waiting for it here
  // means no stream, blocking or not, can see the memory before it is zero.
  CUDA_CHECK(cudaMemset(ptr, 0, bytes));
  CUDA_CHECK(cudaDeviceSynchronize());
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_cuda_allocations[ptr] = {bytes, cat};
  }
  count(cat, int64_t(bytes));
  return ptr;
}

// Frees `ptr` and returns true if it is a CUDA allocation; returns false for any other pointer.
bool cuda_free(void* ptr) {
  CudaAllocation allocation;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_cuda_allocations.find(ptr);
    if (it == g_cuda_allocations.end()) return false;
    allocation = it->second;
    g_cuda_allocations.erase(it);
  }
  CUDA_CHECK(cudaFree(ptr));  // waits for the device: no queued kernel can still use the memory
  count(allocation.category, -int64_t(allocation.bytes));
  return true;
}
#endif

}  // namespace

const char* mem_category_name(MemCategory c) {
  static const char* names[] = {"params", "grads", "optim", "activations", "comm", "other"};
  return names[static_cast<int>(c)];
}

void* device_alloc(size_t bytes, MemCategory cat, Device device) {
#ifdef GPT_WITH_CUDA
  if (device == Device::CUDA) return cuda_alloc(bytes, cat);
#endif
  if (device == Device::CUDA) fatal("device_alloc: CUDA memory needs the CUDA build (see README)");
  size_t total = sizeof(AllocHeader) + ((bytes + 63) / 64) * 64;
  void* raw = std::aligned_alloc(64, total);
  if (!raw) fatal("out of memory allocating " + std::to_string(bytes) + " bytes for " + mem_category_name(cat));
  std::memset(raw, 0, total);
  auto* header = static_cast<AllocHeader*>(raw);
  header->bytes = bytes;
  header->category = static_cast<int>(cat);
  header->device = static_cast<int>(device);
  count(cat, int64_t(bytes));
  return header + 1;
}

void device_free(void* ptr) {
  if (!ptr) return;
#ifdef GPT_WITH_CUDA
  if (cuda_free(ptr)) return;
#endif
  auto* header = static_cast<AllocHeader*>(ptr) - 1;
  count(static_cast<MemCategory>(header->category), -int64_t(header->bytes));
  std::free(header);
}

const MemoryStats& memory_stats() { return g_stats; }

void reset_memory_peaks() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int c = 0; c < kMemCategories; c++) g_stats.peak[c] = g_stats.current[c];
  g_stats.peak_total = g_stats.current_total;
}

Buffer::Buffer(int64_t count, MemCategory cat, DType dtype, Device device)
    : count_(count), dtype_(dtype), device_(device) {
  data_ = device_alloc(size_t(count) * dtype_size(dtype), cat, device);
}

Buffer::~Buffer() { device_free(data_); }

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    device_free(data_);
    data_ = other.data_;
    count_ = other.count_;
    dtype_ = other.dtype_;
    device_ = other.device_;
    other.data_ = nullptr;
    other.count_ = 0;
  }
  return *this;
}

Tensor Buffer::view() const { return make_view(data_, {count_}, dtype_, device_); }
