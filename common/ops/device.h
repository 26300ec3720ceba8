// device.h: which device a run computes on, in which dtype, and moving data between devices.
// Defines cuda_device_count(), cuda_available(), pick_device() (the meaning of a --device flag:
// auto | cpu | cuda), pick_dtype() (--dtype), transfer(), synchronize() and describe_device() with
// the peak FLOP/s that MFU divides by.
// Host code only: it builds with and without CUDA (without it, no CUDA device is ever available).
#pragma once
#include <string>

#include "ops/tensor.h"  // Device

// CUDA devices this process can use: 0 when built without CUDA, without a driver or without a GPU,
// in which case `why` (if given) receives the reason.
int cuda_device_count(std::string* why = nullptr);
inline bool cuda_available() { return cuda_device_count() > 0; }

// "auto": CUDA when available, else the CPU. "cpu": the CPU. "cuda": CUDA, or a config_error that
// says why it is unavailable. Anything else: a config_error naming the three choices.
// Which GPU a rank uses is chosen later, by communicator_for (comm_factory.h).
Device pick_device(const std::string& flag);

const char* device_name(Device device);  // "cpu" or "cuda"

// The meaning of a --dtype flag on `device`: "fp32"; "bf16" (mixed precision, CUDA only: the CPU ops
// compute in fp32, so bf16 there is a config_error that says so); "auto" = bf16 on CUDA, fp32 on
// the CPU. Anything else: a config_error naming the three choices. Under a mixed-precision recipe
// (`recipe`: --precision other than fp32) the model's tensors stay fp32 on either device, the
// products casting their operands (precision_recipe.h): "auto" is then fp32, and the recipe's flags
// refused any other value beside it (precision_recipe_from_flags).
DType pick_dtype(const std::string& flag, Device device, bool recipe = false);

// Copies src into dst, which may live on different devices (host <-> GPU), byte for byte: same dtype
// and numel. On return, host memory on either side may be reused or read; a copy to the GPU may
// still be in flight, but every op queued afterwards sees its result.
void transfer(Tensor dst, Tensor src);

// Blocks until every op queued on `device` has finished: a no-op on the CPU, where ops are
// synchronous. A step's time is read after this, or it would measure only the queueing of kernels.
void synchronize(Device device);
// Blocks until the compute stream has run what was queued on it: the passes so far, and the
// collectives they were made to wait for; not communication still in flight on its own stream. A
// pipeline (08) times each pass with it, without waiting for its neighbours' messages. On the CPU a
// no-op. Both are watched (watchdog.h): a wait longer than --timeout ends the job.
void synchronize_compute(Device device);

// What a run computes on, for the run header ("cpu", "cuda: NVIDIA H100 80GB HBM3"), and the peak
// dense FLOP/s of that device for `dtype`, which MFU divides by (0 where unknown: the CPU, or a GPU
// not in the table of device.cpp). peak_source names the peak ("H100 SXM dense bf16").
struct DeviceInfo {
  std::string name;
  double peak_flops = 0;
  std::string peak_source;
};
DeviceInfo describe_device(Device device, DType dtype);

// The memory one rank may use on `device`, in bytes, for the run's memory check (training_run.h):
// on the CPU the machine's physical memory (or the container's limit, if lower) shared by the
// `ranks_on_node` ranks of this node; on a GPU its memory, shared by the ranks that use that GPU
// (set_ranks_per_gpu, called by the communicator factory). `how` (if given) says where it came from.
double memory_per_rank(Device device, int ranks_on_node, std::string* how = nullptr);
void set_ranks_per_gpu(int ranks);
