// float_formats_cuda.cu: the kernels behind float_formats_cuda.h. One thread per value; the
// conversions themselves are float_formats.h's, compiled for the device, so the GPU rounds exactly as
// the host does. The intrinsics' kernel is the GPU's own opinion, for the tests to compare with.
#include "ops/float_formats_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "base/cuda_check.h"

namespace {

__global__ void encode_kernel(NumberFormat format, Overflow overflow, const float* values, uint16_t* codes, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) codes[i] = encode_float(format, values[i], overflow);
}

__global__ void decode_kernel(NumberFormat format, const uint16_t* codes, float* values, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) values[i] = decode_code(format, codes[i]);
}

__global__ void intrinsics_kernel(NumberFormat format, Overflow overflow, const float* values, uint16_t* codes, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = values[i];
  const __nv_saturation_t saturate = overflow == Overflow::Saturate ? __NV_SATFINITE : __NV_NOSAT;
  switch (format) {
    case NumberFormat::BF16: codes[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x)); break;
    case NumberFormat::FP16: codes[i] = __half_as_ushort(__float2half_rn(x)); break;
    case NumberFormat::E4M3: codes[i] = __nv_cvt_float_to_fp8(x, saturate, __NV_E4M3); break;
    default: codes[i] = __nv_cvt_float_to_fp8(x, saturate, __NV_E5M2); break;
  }
}

constexpr int kThreads = 256;
int blocks_for(size_t n) { return int((n + kThreads - 1) / kThreads); }

// Device copies of the input and output, freed when the call ends.
template <typename In, typename Out, typename Launch>
void run_on_gpu(const In* in, Out* out, size_t n, Launch launch) {
  if (n == 0) return;
  In* device_in = nullptr;
  Out* device_out = nullptr;
  CUDA_CHECK(cudaMalloc(&device_in, n * sizeof(In)));
  CUDA_CHECK(cudaMalloc(&device_out, n * sizeof(Out)));
  CUDA_CHECK(cudaMemcpy(device_in, in, n * sizeof(In), cudaMemcpyHostToDevice));
  launch(device_in, device_out);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaMemcpy(out, device_out, n * sizeof(Out), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(device_in));
  CUDA_CHECK(cudaFree(device_out));
}

}  // namespace

void encode_on_gpu(NumberFormat format, Overflow overflow, const float* values, uint16_t* codes, size_t n) {
  run_on_gpu(values, codes, n, [&](const float* in, uint16_t* out) {
    encode_kernel<<<blocks_for(n), kThreads>>>(format, overflow, in, out, n);
  });
}

void decode_on_gpu(NumberFormat format, const uint16_t* codes, float* values, size_t n) {
  run_on_gpu(codes, values, n, [&](const uint16_t* in, float* out) {
    decode_kernel<<<blocks_for(n), kThreads>>>(format, in, out, n);
  });
}

void encode_with_cuda_intrinsics(NumberFormat format, Overflow overflow, const float* values, uint16_t* codes, size_t n) {
  run_on_gpu(values, codes, n, [&](const float* in, uint16_t* out) {
    intrinsics_kernel<<<blocks_for(n), kThreads>>>(format, overflow, in, out, n);
  });
}
