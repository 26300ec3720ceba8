// float_formats_cuda.h: the conversions of float_formats.h run by CUDA kernels over whole arrays, so a
// test can hold the GPU's codes next to the host's. Host arrays in and out (the functions copy them to
// the device and back). Available in a CUDA build (GPT_WITH_CUDA); they need a GPU to run.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/float_formats.h"

#ifdef GPT_WITH_CUDA
// codes[i] = encode_float(format, values[i], overflow), computed on the GPU.
void encode_on_gpu(NumberFormat format, Overflow overflow, const float* values, uint16_t* codes, size_t n);
// values[i] = decode_code(format, codes[i]), computed on the GPU.
void decode_on_gpu(NumberFormat format, const uint16_t* codes, float* values, size_t n);
// What NVIDIA's own conversions give (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h: __float2bfloat16_rn,
// __float2half_rn, __nv_cvt_float_to_fp8 with __NV_SATFINITE or __NV_NOSAT): a second, independent
// opinion on the same values. Overflow::Saturate is honoured for the fp8 formats only (the 16-bit
// formats' intrinsics have no saturating mode).
void encode_with_cuda_intrinsics(NumberFormat format, Overflow overflow, const float* values, uint16_t* codes, size_t n);
#endif
