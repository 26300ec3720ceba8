// matmul_cublaslt.h: the low-precision product on a GPU's tensor cores, through cuBLASLt: bf16, fp16
// and fp8 (E4M3 or E5M2 inputs, H100/H200 and Ada), fp32 accumulation, per-tensor scales. The GPU
// counterpart of emulated_product (matmul_emulation.h), with the same shapes, so a test can set the
// two side by side, and its time with the operands on the GPU (cublaslt_product_ms). Needs a CUDA
// build (GPT_WITH_CUDA) and, to run, a GPU (fp8: compute capability 8.9+).
#pragma once
#include <string>

#include "ops/float_formats.h"

#ifdef GPT_WITH_CUDA
#include <library_types.h>  // cudaDataType_t

// A format's cuBLASLt data type (CUDA_R_16BF, CUDA_R_16F, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2).
cudaDataType_t cuda_type(NumberFormat f);
// C(M,N) = (A(M,K) @ B(N,K)^T) / (a_scale * b_scale), row-major, every operand on the host in fp32.
// A and B are multiplied as the codes of A * a_scale and B * b_scale in a_format and b_format (both
// bf16, both fp16, or fp8 with at least one E4M3); the scales go to cuBLASLt as the dequantizing
// factors 1/a_scale and 1/b_scale (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER). fp8 needs K, M, N
// multiples of 16 (cuBLASLt's rule for fp8); the function says so and stops otherwise.
void cublaslt_product(float* C, const float* A, const float* B, int M, int N, int K, NumberFormat a_format,
                      NumberFormat b_format, float a_scale, float b_scale);
// The milliseconds one such product takes on the GPU with its operands already there (codes of
// values in [-1, 1), scales 1): the median of `repeats` runs after a warm-up, each timed with CUDA
// events; the same cuBLASLt plan as cublaslt_product. For scripts/bench/fp8_products.cpp.
double cublaslt_product_ms(int M, int N, int K, NumberFormat a_format, NumberFormat b_format, int repeats);
// True where the GPU has fp8 tensor cores (compute capability 8.9 or above); `why` says what it found.
bool gpu_has_fp8_tensor_cores(std::string* why);
#endif
