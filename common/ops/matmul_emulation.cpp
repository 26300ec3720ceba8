// matmul_emulation.cpp: emulated_product() and the process's matmul switch (matmul_emulation.h).
#include "ops/matmul_emulation.h"

#include <cstring>
#include <vector>

#include "ops/matmul_cpu.h"  // sgemm_cpu: the fp32-accumulating product

const char* accumulate_name(Accumulate a) {
  switch (a) {
    case Accumulate::Fp32: return "fp32";
    case Accumulate::TensorCore: return "tensor-core";
    default: return "promote128";
  }
}

namespace {

// x with its significand cut to `bits` significant bits, toward zero.
float keep_significant_bits(float x, int bits) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b &= ~((1u << (24 - bits)) - 1u);
  std::memcpy(&x, &b, 4);
  return x;
}

MatmulEmulation* g_emulation = nullptr;

struct BoundRange {
  bool grads;
  int64_t begin, end;
  const char* base;
  size_t element_bytes;
  const char* memory_end() const { return base + (end - begin) * int64_t(element_bytes); }
};
std::vector<BoundRange> g_bound;  // the model's current bindings (note_bound_memory)

}  // namespace

void emulated_product(float* C, const float* A, const float* B, int M, int N, int K, Accumulate accumulate) {
  if (accumulate == Accumulate::Fp32) {
    sgemm_cpu(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
    return;
  }
  const int interval = accumulate == Accumulate::Promote128 ? kPromoteInterval : K;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      const float* a = A + int64_t(i) * K;
      const float* b = B + int64_t(j) * K;
      float total = 0;  // the fp32 register the partial sums are promoted into
      for (int k0 = 0; k0 < K; k0 += interval) {
        float partial = 0;  // the tensor core's accumulator
        const int k1 = k0 + interval < K ? k0 + interval : K;
        for (int k = k0; k < k1; k++) partial = keep_significant_bits(partial + a[k] * b[k], kTensorCoreAccumulatorBits);
        total += partial;
      }
      C[int64_t(i) * N + j] = total;
    }
  }
}

namespace {
thread_local int t_fp32_products = 0;  // the Fp32Products alive on this thread
}  // namespace

void set_cpu_matmul_emulation(MatmulEmulation* emulation) { g_emulation = emulation; }
MatmulEmulation* cpu_matmul_emulation() { return t_fp32_products > 0 ? nullptr : g_emulation; }

Fp32Products::Fp32Products() { t_fp32_products++; }
Fp32Products::~Fp32Products() { t_fp32_products--; }

void note_bound_memory(bool grads, int64_t begin, int64_t end, const void* base, size_t element_bytes) {
  const char* at = static_cast<const char*>(base);
  const char* at_end = at + (end - begin) * int64_t(element_bytes);
  // A rebinding replaces what it overlaps: the same flat range elsewhere, or other ranges that lived
  // in memory now reused (a buffer freed and allocated again).
  std::vector<BoundRange> kept;
  for (const BoundRange& r : g_bound) {
    const bool same_array = r.grads == grads;
    const bool flat_overlap = same_array && r.begin < end && begin < r.end;
    const bool memory_overlap = at && r.base < at_end && at < r.memory_end();
    if (!flat_overlap && !memory_overlap) kept.push_back(r);
  }
  if (at) kept.push_back({grads, begin, end, at, element_bytes});
  g_bound.swap(kept);
}

int64_t bound_flat_offset(bool grads, const void* address) {
  const char* p = static_cast<const char*>(address);
  for (const BoundRange& r : g_bound)
    if (r.grads == grads && p >= r.base && p < r.memory_end()) return r.begin + (p - r.base) / int64_t(r.element_bytes);
  return -1;
}
