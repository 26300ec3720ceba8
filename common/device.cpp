// device.cpp: cuda_device_count and pick_device of device.h. The CUDA runtime is asked only in the
// CUDA build (GPT_WITH_CUDA); there a missing driver or GPU is an answer (0 devices), not an error.
#include "device.h"

#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "check.h"  // config_error

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
