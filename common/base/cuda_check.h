// cuda_check.h: CUDA_CHECK, CUBLAS_CHECK and NCCL_CHECK, the GPU companions of check.h's MPI_CHECK.
// Each wraps one library call; on failure it reports the library's own message, the call, file:line,
// rank and host (library_error in check.cpp), then aborts the whole job, because a rank that stops
// alone leaves its peers hung inside the next collective.
//
// This header brings in only the CUDA runtime API. CUBLAS_CHECK and NCCL_CHECK name cuBLAS and NCCL
// functions when they are expanded, so include <cublas_v2.h> or <nccl.h> where you use them (you
// include them anyway to make the calls). Kernel launches return nothing: check them with
// CUDA_CHECK(cudaGetLastError()) right after the launch.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "base/check.h"  // library_error

#define CUDA_CHECK(call)                                                                    \
  do {                                                                                      \
    cudaError_t cuda_status_ = (call);                                                      \
    if (cuda_status_ != cudaSuccess)                                                        \
      library_error("CUDA", std::string(cudaGetErrorName(cuda_status_)) + ": " +            \
                                cudaGetErrorString(cuda_status_),                           \
                    #call, __FILE__, __LINE__);                                             \
  } while (0)

// cublasGetStatusName gives the enum's name (CUBLAS_STATUS_INVALID_VALUE), cublasGetStatusString
// what it means.
#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t cublas_status_ = (call);                                                 \
    if (cublas_status_ != CUBLAS_STATUS_SUCCESS)                                            \
      library_error("cuBLAS", std::string(cublasGetStatusName(cublas_status_)) + ": " +     \
                                  cublasGetStatusString(cublas_status_),                    \
                    #call, __FILE__, __LINE__);                                             \
  } while (0)

// ncclGetLastError(nullptr) adds NCCL's detailed text for the last failure of this thread
// ("Duplicate GPU detected", ...), which ncclGetErrorString's generic category does not say.
#define NCCL_CHECK(call)                                                                    \
  do {                                                                                      \
    ncclResult_t nccl_status_ = (call);                                                     \
    if (nccl_status_ != ncclSuccess) {                                                      \
      const char* nccl_detail_ = ncclGetLastError(nullptr);                                 \
      library_error("NCCL", std::string(ncclGetErrorString(nccl_status_)) + " (" +          \
                                (nccl_detail_ ? nccl_detail_ : "") + ")",                   \
                    #call, __FILE__, __LINE__);                                             \
    }                                                                                       \
  } while (0)
