// cublas_on_demand.cpp: cuBLAS and cuBLASLt, loaded at their first call rather than at the start of
// every program. Defines the cuBLAS and cuBLASLt functions the framework calls (ops_cuda.cu,
// matmul_cublaslt.cu, cuda_check.h), each of which opens the library on its first call (dlopen) and
// forwards to the library's own function of that name.
//
// Why: the programs link libcommon.a, and with it these calls, whether they train on a GPU or not.
// Linked as libraries, cuBLAS and cuBLASLt (half a gigabyte, thousands of static constructors) were
// loaded and initialised by every process at its start: about 0.15 s of CPU time per rank, spent
// by each rank of each run on the CPU too (4 ranks of 04 for one step on 2 cores: 1.4 s of CPU time
// with them, 0.7 s without). A run on the GPU pays the same once, at its first matrix product.
//
// A call this file does not define fails to link ("undefined reference to cublas..."): add it below
// with its declaration's parameters (the compiler checks them against the library's header).
#ifdef GPT_WITH_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#include "base/check.h"

namespace {

// The library of this name and the version the framework was compiled against (libcublas.so.13),
// found as the linker would find it: the program's run path (cuda.mk), then the system's.
void* open_library(const std::string& name) {
  const std::string file = name + ".so." + std::to_string(CUBLAS_VER_MAJOR);
  void* library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library)
    fatal("cannot load " + file + " (" + dlerror() + "): is the CUDA Toolkit's lib64 folder on this machine, "
          "as when the program was built? (LD_LIBRARY_PATH can name it)");
  return library;
}

// libcublas needs libcublasLt: opened first, it is found by its name when libcublas asks for it.
void* cublas_lt_library() {
  static void* library = open_library("libcublasLt");
  return library;
}
void* cublas_library() {
  static void* library = (cublas_lt_library(), open_library("libcublas"));
  return library;
}

template <typename Function>
Function resolve(void* library, const char* name) {
  void* address = dlsym(library, name);
  if (!address) fatal(std::string("the cuBLAS library has no ") + name + ": another version than the CUDA headers'?");
  return reinterpret_cast<Function>(address);
}

}  // namespace

// The definitions keep the C linkage of the headers' declarations. (A parameter list that matches no
// declaration would define a C++ overload instead, whose mangled name leaves the call undefined at the
// link: an error, never a silent mismatch.)
#define FORWARD(returns, library, name, parameters, arguments)                       \
  returns CUBLASWINAPI name parameters {                                             \
    using Function = returns (*) parameters;                                         \
    static const Function function = resolve<Function>(library(), #name);            \
    return function arguments;                                                       \
  }

FORWARD(cublasStatus_t, cublas_library, cublasCreate_v2, (cublasHandle_t* handle), (handle))
FORWARD(cublasStatus_t, cublas_library, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream),
        (handle, stream))
FORWARD(cublasStatus_t, cublas_library, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode),
        (handle, mode))
FORWARD(cublasStatus_t, cublas_library, cublasGemmEx,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype, int ldb,
         const void* beta, void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
         cublasGemmAlgo_t algo),
        (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo))
FORWARD(cublasStatus_t, cublas_library, cublasGemmStridedBatchedEx,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
         cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
         long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo),
        (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc,
         strideC, batchCount, computeType, algo))
FORWARD(const char*, cublas_library, cublasGetStatusName, (cublasStatus_t status), (status))
FORWARD(const char*, cublas_library, cublasGetStatusString, (cublasStatus_t status), (status))

FORWARD(cublasStatus_t, cublas_lt_library, cublasLtCreate, (cublasLtHandle_t* handle), (handle))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmul,
        (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
         cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
         cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
         void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream),
        (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspaceSizeInBytes,
         stream))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmulAlgoGetHeuristic,
        (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
         cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
         cublasLtMatmulPreference_t preference, int requestedAlgoCount,
         cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
        (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount, heuristicResultsArray,
         returnAlgoCount))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmulDescCreate,
        (cublasLtMatmulDesc_t* desc, cublasComputeType_t computeType, cudaDataType_t scaleType),
        (desc, computeType, scaleType))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmulDescSetAttribute,
        (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t sizeInBytes),
        (desc, attr, buf, sizeInBytes))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t* pref),
        (pref))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref),
        (pref))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatmulPreferenceSetAttribute,
        (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
         size_t sizeInBytes),
        (pref, attr, buf, sizeInBytes))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatrixLayoutCreate,
        (cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
        (layout, type, rows, cols, ld))
FORWARD(cublasStatus_t, cublas_lt_library, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))

#endif  // GPT_WITH_CUDA
