// memory.cpp: the counting allocator of memory.h. Every allocation records its size and category in
// a small header, so device_free() knows what to subtract without a lookup table.
#include "ops/memory.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#ifdef GPT_WITH_CUDA
#include <unordered_map>

#include "base/cuda_check.h"  // CUDA_CHECK, cudaMalloc
#include "ops/ops_cuda.h"    // cuda::stream(): where new memory is zeroed, and whose blocks the cache keeps
#endif

namespace {

MemoryStats g_stats;
std::mutex g_mutex;  // communicators' worker threads allocate too (comm_p2p.cpp)

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

// A cache of freed GPU blocks by exact size, as PyTorch's caching allocator keeps them, for two
// reasons. cudaFree waits for the whole device, NCCL's stream included: a chapter that frees a
// layer's buffer while the next layer's collective runs (05, 06) would lose its overlap to that
// wait. And cudaMalloc is slow. Training allocates the same sizes every step, so exact sizes hit.
// Reuse is safe without waiting: a buffer is freed only after its last collective was waited (the
// freeing thread's stream then waits for it), and the next user's zeroing is queued on that same
// stream, behind every kernel that used the block before. So a block goes back to the stream of the
// thread that freed it (cuda::stream(): the compute stream, or a communicator worker's, whose
// collectives free their scratch there, comm_p2p.cpp) and only that stream takes it again: another
// stream is not ordered after its last use, as PyTorch keeps a pool per stream for the same reason.
struct CachedBlock {
  void* ptr;
  cudaStream_t stream;  // where it was last used
};
std::unordered_multimap<size_t, CachedBlock> g_cuda_cache;
int64_t g_cuda_cached_bytes = 0;

void release_cuda_cache() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [bytes, block] : g_cuda_cache) CUDA_CHECK(cudaFree(block.ptr));
  g_cuda_cache.clear();
  g_cuda_cached_bytes = 0;
}

void* cuda_alloc(size_t bytes, MemCategory cat) {
  const size_t size = bytes ? bytes : 1;  // an empty buffer still has an address (as on the CPU)
  void* ptr = nullptr;
  const cudaStream_t stream = cuda::stream();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto [first, last] = g_cuda_cache.equal_range(size);
    for (auto cached = first; cached != last; ++cached) {
      if (cached->second.stream != stream) continue;
      ptr = cached->second.ptr;
      g_cuda_cache.erase(cached);
      g_cuda_cached_bytes -= int64_t(size);
      break;
    }
  }
  if (!ptr && cudaMalloc(&ptr, size) != cudaSuccess) {
    cudaGetLastError();  // clear the error, free what the cache holds, and try once more
    release_cuda_cache();
    if (cudaMalloc(&ptr, size) != cudaSuccess) {
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      fatal("out of GPU memory allocating " + std::to_string(bytes) + " bytes for " + mem_category_name(cat) + " (" +
            std::to_string(free_bytes >> 20) + " of " + std::to_string(total_bytes >> 20) + " MiB free)");
    }
  }
  // Zero-filled like CPU memory, on this thread's stream (the compute stream for the training
  // thread): every op it queues sees the zeros (they run there), so does a collective (its stream
  // waits for an event recorded there), and so does a cudaMemcpy (the legacy default stream waits for
  // the compute stream and a worker's, both created blocking).
  CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream));
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_cuda_allocations[ptr] = {bytes, cat};
  }
  count(cat, int64_t(bytes));
  return ptr;
}

// Returns `ptr` to the cache and true if it is a CUDA allocation; returns false for any other pointer.
bool cuda_free(void* ptr) {
  CudaAllocation allocation;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_cuda_allocations.find(ptr);
    if (it == g_cuda_allocations.end()) return false;
    allocation = it->second;
    g_cuda_allocations.erase(it);
    const size_t size = allocation.bytes ? allocation.bytes : 1;
    g_cuda_cache.emplace(size, CachedBlock{ptr, cuda::stream()});
    g_cuda_cached_bytes += int64_t(size);
  }
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
  if (device == Device::CUDA) fatal("device_alloc: CUDA memory needs the CUDA build (see docs/gpus.md)");
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

MemoryStats memory_stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_stats;
}

int64_t cuda_cached_bytes() {
#ifdef GPT_WITH_CUDA
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_cuda_cached_bytes;
#else
  return 0;
#endif
}

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
