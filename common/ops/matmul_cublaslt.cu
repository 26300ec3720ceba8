// matmul_cublaslt.cu: cublaslt_product and cublaslt_product_ms (matmul_cublaslt.h), one cuBLASLt plan
// (LtPlan) shared by both. The operands are encoded on the host with
// our conversions (float_formats.h), so the GPU multiplies exactly the codes the emulation does.
//
// Layout: cuBLASLt is column-major, and its fp8 kernels take only the "TN" form (A transposed, B not).
// Our row-major C(M,N) = A B^T is the column-major C'(N,M) = B' A'^T ... which is exactly TN with
// cuBLASLt's A = our B (K x N column-major, transposed) and cuBLASLt's B = our A (K x M, not).
#include "ops/matmul_cublaslt.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "base/check.h"  // fatal
#include "base/cuda_check.h"

namespace {

// The codes of values * scale in the format, packed as the GPU reads them (1 or 2 bytes each).
std::vector<uint8_t> encode_scaled(const float* values, size_t n, NumberFormat f, float scale) {
  const int bytes = format_bits(f) / 8;
  std::vector<uint8_t> codes(n * bytes);
  for (size_t i = 0; i < n; i++) {
    const uint16_t code = encode_float(f, values[i] * scale, bytes == 1 ? Overflow::Saturate : Overflow::Ieee);
    codes[i * bytes] = uint8_t(code & 0xFF);
    if (bytes == 2) codes[i * bytes + 1] = uint8_t(code >> 8);
  }
  return codes;
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* device = nullptr;
  CUDA_CHECK(cudaMalloc(&device, host.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return device;
}

// One product's cuBLASLt plan: the descriptor, the three layouts, the heuristic's algorithm and its
// workspace, for C(M,N) = A(M,K) B(N,K)^T with operands already on the GPU; shared by the product
// and its timing, so that what is timed is what is checked.
struct LtPlan {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  size_t workspace_bytes = 32u << 20;
  void* workspace = nullptr;
  float alpha = 1, beta = 0;

  // factors: the device's two dequantizing factors {1/a_scale, 1/b_scale} (fp8: passed as scale
  // pointers; else folded into alpha, `host_factors`).
  LtPlan(int M, int N, int K, NumberFormat a_format, NumberFormat b_format, const float* factors,
         const std::vector<float>& host_factors) {
    const bool fp8 = format_bits(a_format) == 8;
    CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    CUBLAS_CHECK(cublasLtCreate(&lt));
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
    if (fp8) {  // cuBLASLt's A is our B, its B our A (the layout note above)
      const float* lt_a_scale = factors + 1;
      const float* lt_b_scale = factors;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &lt_a_scale, sizeof lt_a_scale));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &lt_b_scale, sizeof lt_b_scale));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_a, cuda_type(b_format), K, N, K));  // our B, transposed
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b, cuda_type(a_format), K, M, K));  // our A
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c, CUDA_R_32F, N, M, N));
    // Without fp8's scale pointers, the scales are undone by alpha.
    alpha = fp8 ? 1.0f : host_factors[0] * host_factors[1];
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes, sizeof workspace_bytes));
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, layout_a, layout_b, layout_c, layout_c, preference, 1,
                                                &heuristic, &found));
    if (found == 0)
      fatal(std::string("cublaslt_product: cuBLASLt has no kernel for ") + format_name(a_format) + " x " +
            format_name(b_format) + " on this GPU");
  }
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  void run(const void* a, const void* b, float* c) const {
    CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, b, layout_a, a, layout_b, &beta, c, layout_c, c, layout_c,
                                &heuristic.algo, workspace, workspace_bytes, 0));
  }
  ~LtPlan() {
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(layout_a);
    cublasLtMatrixLayoutDestroy(layout_b);
    cublasLtMatrixLayoutDestroy(layout_c);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    CUDA_CHECK(cudaFree(workspace));
  }
};

void check_fp8_shape(NumberFormat a_format, int M, int N, int K) {
  if (format_bits(a_format) == 8 && (M % 16 || N % 16 || K % 16))
    fatal("cublaslt_product: fp8 needs M, N and K multiples of 16 (got " + std::to_string(M) + ", " +
          std::to_string(N) + ", " + std::to_string(K) + ")");
}

}  // namespace

bool gpu_has_fp8_tensor_cores(std::string* why) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    if (why) *why = "no CUDA device";
    return false;
  }
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (why) *why = "compute capability " + std::to_string(major) + "." + std::to_string(minor);
  return major * 10 + minor >= 89;
}

void cublaslt_product(float* C, const float* A, const float* B, int M, int N, int K, NumberFormat a_format,
                      NumberFormat b_format, float a_scale, float b_scale) {
  check_fp8_shape(a_format, M, N, K);
  uint8_t* a = upload(encode_scaled(A, size_t(M) * K, a_format, a_scale));
  uint8_t* b = upload(encode_scaled(B, size_t(N) * K, b_format, b_scale));
  const std::vector<float> dequantize = {1.0f / a_scale, 1.0f / b_scale};
  float* factors = upload(dequantize);
  float* c = nullptr;
  CUDA_CHECK(cudaMalloc(&c, size_t(M) * N * sizeof(float)));
  {
    const LtPlan plan(M, N, K, a_format, b_format, factors, dequantize);
    plan.run(a, b, c);
    CUDA_CHECK(cudaMemcpy(C, c, size_t(M) * N * sizeof(float), cudaMemcpyDeviceToHost));
  }
  for (void* p : {(void*)a, (void*)b, (void*)factors, (void*)c}) CUDA_CHECK(cudaFree(p));
}

double cublaslt_product_ms(int M, int N, int K, NumberFormat a_format, NumberFormat b_format, int repeats) {
  check_fp8_shape(a_format, M, N, K);
  // Operands of values in [-1, 1) (their codes; scale 1), a block of 2^20 repeated (an LM head's are
  // gigabytes): the time does not depend on them.
  std::vector<float> values(size_t(1) << 20);
  uint32_t state = 12345;
  for (float& v : values) state = state * 1664525u + 1013904223u, v = float(state >> 8) / float(1u << 23) - 1.0f;
  auto tiled = [&](size_t n, NumberFormat f) {
    const std::vector<uint8_t> block = encode_scaled(values.data(), values.size(), f, 1.0f);
    const size_t bytes = n * size_t(format_bits(f) / 8);
    uint8_t* device = nullptr;
    CUDA_CHECK(cudaMalloc(&device, bytes));
    for (size_t at = 0; at < bytes; at += block.size())
      CUDA_CHECK(cudaMemcpy(device + at, block.data(), std::min(block.size(), bytes - at), cudaMemcpyHostToDevice));
    return device;
  };
  uint8_t* a = tiled(size_t(M) * K, a_format);
  uint8_t* b = tiled(size_t(N) * K, b_format);
  const std::vector<float> dequantize = {1.0f, 1.0f};
  float* factors = upload(dequantize);
  float* c = nullptr;
  CUDA_CHECK(cudaMalloc(&c, size_t(M) * N * sizeof(float)));
  std::vector<float> times;
  {
    const LtPlan plan(M, N, K, a_format, b_format, factors, dequantize);
    for (int i = 0; i < 3; i++) plan.run(a, b, c);  // warm-up
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < repeats; i++) {
      CUDA_CHECK(cudaEventRecord(start, 0));
      plan.run(a, b, c);
      CUDA_CHECK(cudaEventRecord(stop, 0));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
  }
  for (void* p : {(void*)a, (void*)b, (void*)factors, (void*)c}) CUDA_CHECK(cudaFree(p));
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times.empty() ? 0.0 : double(times[times.size() / 2]);
}

cudaDataType_t cuda_type(NumberFormat f) {
  switch (f) {
    case NumberFormat::BF16: return CUDA_R_16BF;
    case NumberFormat::FP16: return CUDA_R_16F;
    case NumberFormat::E4M3: return CUDA_R_8F_E4M3;
    default: return CUDA_R_8F_E5M2;
  }
}
