// device.cpp: see device.h. The CUDA runtime is asked only in the
// CUDA build (GPT_WITH_CUDA); there a missing driver or GPU is an answer (0 devices), not an error.
#include "ops/device.h"

#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "base/cuda_check.h"  // CUDA_CHECK
#include "ops/ops_cuda.h"    // cuda::synchronize, the compute stream
#endif

#include <unistd.h>  // sysconf

#include <algorithm>
#include <cstring>
#include <fstream>

#include "base/check.h"  // config_error, fatal, ENSURE
#include "base/watchdog.h"

int cuda_device_count(std::string* why) {
#ifdef GPT_WITH_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // No GPU (cudaErrorNoDevice), no driver (cudaErrorInsufficientDriver), ...: not fatal here.
    // cudaGetLastError clears the error, so that later CUDA_CHECKs do not report it again.
    cudaGetLastError();
    if (why) {
      const std::string what = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
      if (status == cudaErrorNoDevice) {
        *why = "no CUDA-capable GPU is visible (" + what + ")";
      } else if (status == cudaErrorInsufficientDriver) {
        *why = "no NVIDIA driver is loaded, or it is older than the CUDA runtime (" + what + ")";
      } else {
        *why = "cudaGetDeviceCount failed (" + what + ")";
      }
    }
    return 0;
  }
  if (count == 0 && why) *why = "cudaGetDeviceCount found no CUDA device";
  return count;
#else
  if (why) *why = "this program was built without CUDA (nvcc was not found when it was built)";
  return 0;
#endif
}

Device pick_device(const std::string& flag) {
  if (flag == "cpu") return Device::CPU;
  if (flag == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
  if (flag == "cuda") {
    std::string why;
    if (cuda_device_count(&why) > 0) return Device::CUDA;
    config_error("--device cuda: no CUDA device is available (" + why + "); use --device cpu or --device auto");
  }
  config_error("--device " + flag + ": unknown device; choose auto, cpu or cuda");
}

const char* device_name(Device device) { return device == Device::CUDA ? "cuda" : "cpu"; }

DType pick_dtype(const std::string& flag, Device device, bool recipe) {
  if (flag == "fp32") return DType::F32;
  if (flag == "auto") return device == Device::CUDA && !recipe ? DType::BF16 : DType::F32;
  if (flag == "bf16") {
    if (device == Device::CUDA) return DType::BF16;
    config_error("--dtype bf16 needs a GPU (--device cuda): the CPU ops compute in fp32; use --dtype fp32");
  }
  config_error("--dtype " + flag + ": unknown dtype; choose auto, fp32 or bf16");
}

void transfer(Tensor dst, Tensor src) {
  ENSURE(dst.dtype == src.dtype && dst.numel() == src.numel(), "transfer: dst and src differ in dtype or size");
  if (src.bytes() == 0) return;
  if (dst.device == Device::CPU && src.device == Device::CPU) {
    std::memcpy(dst.data, src.data, src.bytes());
    return;
  }
#ifdef GPT_WITH_CUDA
  // cudaMemcpy runs on the legacy default stream, which the compute stream (ops_cuda.h) is ordered
  // with: the copy sees every op queued before it, and ops queued after it see the copy.
  BlockedOnDevice blocked("waiting for the GPU to copy a tensor");
  CUDA_CHECK(cudaMemcpy(dst.data, src.data, src.bytes(), cudaMemcpyDefault));
#else
  fatal("transfer: a CUDA tensor, but this program was built without CUDA");
#endif
}

void synchronize(Device device) {
#ifdef GPT_WITH_CUDA
  if (device == Device::CUDA) {
    BlockedOnDevice blocked("waiting for the GPU to finish its work");
    CUDA_CHECK(cudaDeviceSynchronize());
  }
#else
  (void)device;
#endif
}

void synchronize_compute(Device device) {
#ifdef GPT_WITH_CUDA
  if (device == Device::CUDA) cuda::synchronize();  // watched there
#else
  (void)device;
#endif
}

namespace {
// Peak dense FLOP/s from NVIDIA's data sheets (the README's MFU section quotes them).
// A name matches when it contains `model`. fp32 is the non-tensor-core rate: the CUDA fp32 ops
// use cuBLAS in its default math mode, without TF32.
struct Peak {
  const char* model;
  double bf16, fp32;
  const char* label;
};
// The first entry whose model the name contains wins: the PCIe and NVL parts come before the SXM ones.
constexpr Peak kPeaks[] = {
    {"H100 PCIe", 756e12, 51e12, "H100 PCIe"},
    {"H100 NVL", 835e12, 60e12, "H100 NVL"},
    {"H200 NVL", 835e12, 60e12, "H200 NVL"},
    {"H200", 989e12, 67e12, "H200 SXM"},
    {"H100", 989e12, 67e12, "H100 SXM"},
    {"A100", 312e12, 19.5e12, "A100"},
};
}  // namespace

DeviceInfo describe_device(Device device, DType dtype) {
  DeviceInfo info;
  info.name = device_name(device);
#ifdef GPT_WITH_CUDA
  if (device == Device::CUDA) {
    int index = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&index));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    info.name += std::string(": ") + prop.name;
    for (const Peak& peak : kPeaks) {
      if (std::strstr(prop.name, peak.model) == nullptr) continue;
      info.peak_flops = dtype == DType::BF16 ? peak.bf16 : peak.fp32;
      info.peak_source = std::string(peak.label) + " dense " + dtype_name(dtype);
      break;
    }
  }
#else
  (void)dtype;
#endif
  return info;
}

namespace {
int g_ranks_per_gpu = 1;

// A container's memory limit (cgroup v2, then v1), or 0 when there is none.
double container_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") continue;
    const double bytes = std::strtod(text.c_str(), nullptr);
    if (bytes > 0 && bytes < 1e18) return bytes;  // v1 reports "no limit" as a huge number
  }
  return 0;
}
}  // namespace

void set_ranks_per_gpu(int ranks) { g_ranks_per_gpu = std::max(1, ranks); }

double memory_per_rank(Device device, int ranks_on_node, std::string* how) {
#ifdef GPT_WITH_CUDA
  if (device == Device::CUDA) {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (how)
      *how = "GPU memory " + std::to_string(total_bytes >> 20) + " MiB / " + std::to_string(g_ranks_per_gpu) +
             " rank(s) on it";
    return double(total_bytes) / g_ranks_per_gpu;
  }
#endif
  (void)device;
  double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  const double limit = container_limit();
  const bool limited = limit > 0 && limit < physical;
  if (limited) physical = limit;
  const int ranks = std::max(1, ranks_on_node);
  if (how)
    *how = std::string(limited ? "container limit " : "physical memory ") + std::to_string(int64_t(physical) >> 20) +
           " MiB / " + std::to_string(ranks) + " rank(s) on this node";
  return physical / ranks;
}
