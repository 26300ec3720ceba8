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

void set_cpu_matmul_emulation(MatmulEmulation* emulation) { g_emulation = emulation; }
MatmulEmulation* cpu_matmul_emulation() { return g_emulation; }
