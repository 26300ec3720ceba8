// tensor.h: a Tensor is a view (pointer, shape, dtype, device) over memory some allocator owns.
// Views never own or free memory; the flat parameter buffer, activation arenas and communication
// buffers own it (see memory.h). Ops take views, so the same call runs on CPU or CUDA.
#pragma once
#include <cstdint>
#include <initializer_list>
#include "base/check.h"

enum class Device { CPU, CUDA };
// I32: token ids. F16 and U8 only travel: the codes of fp16 and of the 8-bit formats on the wire of
// a collective in a low-precision format (comm/wire_format.h); no op computes on them.
enum class DType { F32, BF16, I32, F16, U8 };

inline size_t dtype_size(DType t) { return t == DType::BF16 || t == DType::F16 ? 2 : t == DType::U8 ? 1 : 4; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::I32: return "int32";
    case DType::F16: return "fp16";
    case DType::U8: return "uint8";
  }
  return "?";
}

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};

  int64_t numel() const {
    int64_t n = ndim ? 1 : 0;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }
  float* f32() const {
    ENSURE(dtype == DType::F32, "tensor is not fp32");
    return static_cast<float*>(data);
  }
  int* i32() const {
    ENSURE(dtype == DType::I32, "tensor is not int32");
    return static_cast<int*>(data);
  }
  // The same memory seen as `count` elements starting `offset` elements in, as a 1-D view. An empty
  // slice has no memory (data == nullptr): a rank owning none of a range may then ask for its
  // "piece" at an offset outside the buffer without forming an out-of-bounds pointer.
  Tensor slice1d(int64_t offset, int64_t count) const {
    Tensor t = *this;
    t.data = count == 0 ? nullptr : static_cast<char*>(data) + offset * int64_t(dtype_size(dtype));
    t.ndim = 1;
    t.shape[0] = count;
    t.shape[1] = t.shape[2] = t.shape[3] = 0;
    return t;
  }
};

inline Tensor make_view(void* data, std::initializer_list<int64_t> shape, DType dtype = DType::F32,
                        Device device = Device::CPU) {
  ENSURE(shape.size() <= 4, "at most 4 dimensions");
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  for (int64_t d : shape) t.shape[t.ndim++] = d;
  return t;
}
