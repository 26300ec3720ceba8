// device.h: which device a run computes on. Defines cuda_device_count(), cuda_available() and
// pick_device(), the meaning of a --device flag (auto | cpu | cuda). Host code only: it builds with
// and without CUDA (without it, no CUDA device is ever available).
#pragma once
#include <string>

#include "tensor.h"  // Device

// CUDA devices this process can use: 0 when built without CUDA, without a driver or without a GPU,
// in which case `why` (if given) receives the reason.
int cuda_device_count(std::string* why = nullptr);
inline bool cuda_available() { return cuda_device_count() > 0; }

// "auto": CUDA when available, else the CPU. "cpu": the CPU. "cuda": CUDA, or a config_error that
// says why it is unavailable. Anything else: a config_error naming the three choices.
// Which GPU a rank uses is chosen later, by create_communicator (comm_factory.h).
Device pick_device(const std::string& flag);

const char* device_name(Device device);  // "cpu" or "cuda"
