// matmul_emulation.h: matrix products as low-precision hardware computes them, emulated on the CPU
// with the same semantics, and the switch that routes the model's CPU products through them.
// Defines Accumulate, emulated_product() (C = A B^T from operands already in their format),
// MatmulEmulation, the interface ops.cpp's three CPU matmul calls consult (set_cpu_matmul_emulation;
// fp32 GPU products too, where the emulation says it runs there), Fp32Products (a scope that skips it),
// and the map from a bound weight's (or gradient's) address to its flat offset (note_bound_memory).
//
// What the hardware does, and so what we do: each input is rounded to its format (after its scale,
// quantize.h); the products of two such values are exact in fp32 (bf16 x bf16 needs 16 significant
// bits, fp16 x fp16 22, fp8 x fp8 8); the sum is kept in an fp32 accumulator; the result is
// converted to the layer's dtype. Hopper's fp8 tensor cores are the exception DeepSeek-V3 measured:
// their accumulator keeps about 14 significant bits, which loses the small terms of a long sum.
// DeepSeek's remedy promotes the partial sum to an fp32 register every 128 products (4 of Hopper's
// WGMMA instructions over K = 32 each), where it is added at full precision.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/tensor.h"

enum class Accumulate {
  Fp32,         // every product added in fp32 (bf16 and fp16 tensor cores; the ideal fp8 product)
  TensorCore,   // fp8 on Hopper: an accumulator of 14 significant bits for the whole sum
  Promote128,   // DeepSeek-V3: 14-bit partial sums of 128 products, each added into fp32
};
constexpr int kPromoteInterval = 128;       // products per partial sum under Accumulate::Promote128
constexpr int kTensorCoreAccumulatorBits = 14;  // significant bits the fp8 accumulator keeps (DeepSeek-V3, 3.3.2)
const char* accumulate_name(Accumulate a);  // "fp32", "tensor-core", "promote128"

// C(M,N) = A(M,K) @ B(N,K)^T, both operands row-major with the contraction along their rows' length.
// Fp32 runs the project's sgemm (matmul_cpu.h): every product exact, the sums in fp32 in its blocked
// order. TensorCore and Promote128 add the K products of each element in order into an accumulator
// whose every sum is cut to kTensorCoreAccumulatorBits significant bits (toward zero, as an aligned
// fixed-point adder drops the bits shifted out); Promote128 adds that accumulator into an fp32 total
// and clears it after each kPromoteInterval products.
void emulated_product(float* C, const float* A, const float* B, int M, int N, int K, Accumulate accumulate);

// The three products of a linear layer (ops.h's matmul_forward, matmul_backward_input and
// matmul_backward_weight, with their shapes and accumulation conventions), done another way.
class MatmulEmulation {
 public:
  virtual ~MatmulEmulation() = default;
  virtual void forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) = 0;   // out = inp @ weight^T + bias
  virtual void backward_input(Tensor dinp, Tensor dout, Tensor weight) = 0;       // dinp += dout @ weight
  virtual void backward_weight(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp) = 0;  // dweight += dout^T @ inp
  // Whether it also takes fp32 tensors on a GPU (LowPrecisionMatmuls in a CUDA build); else only the
  // CPU's products reach it.
  virtual bool runs_on_gpu() const { return false; }
};

// While set, ops.cpp sends every CPU matmul (fp32 tensors) to `emulation` instead of the fp32 path,
// and every fp32 matmul on a GPU too where emulation->runs_on_gpu(); nullptr restores the fp32 path.
// One per process: set it before the first forward, from the thread that runs the model.
void set_cpu_matmul_emulation(MatmulEmulation* emulation);
MatmulEmulation* cpu_matmul_emulation();  // nullptr while an Fp32Products lives on the calling thread

// While one lives, the products its thread runs skip the installed emulation: fp32, as in chapters
// 01-12 without a recipe. For what a recipe keeps in full precision on purpose (a mixture of
// experts' router, moe.cpp). Per thread, so that a pipeline's other lane (lanes.h) keeps its recipe.
class Fp32Products {
 public:
  Fp32Products();
  ~Fp32Products();
  Fp32Products(const Fp32Products&) = delete;
  Fp32Products& operator=(const Fp32Products&) = delete;
};

// Where the model's flat parameters and gradients live now: GPT2's bind calls (model.h) report each
// range [begin, end) of the flat layout bound at `base` (nullptr: released), so that an emulation
// knows a product's weight by its flat offset, the same on every rank and every step, even where
// ZeRO-3 gathers a layer into whichever buffer is free. `grads` tells the two arrays apart.
void note_bound_memory(bool grads, int64_t begin, int64_t end, const void* base, size_t element_bytes);
// The flat offset of the element at `address` in the bound parameters (or gradients), or -1.
int64_t bound_flat_offset(bool grads, const void* address);
