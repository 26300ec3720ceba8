// matmul_recipe_cuda.h: the device steps of a mixed-precision recipe's products, for a model whose
// fp32 tensors live on a GPU. Defines namespace recipe_cuda: the amax of a tensor, its scaled cast to a
// format's codes (transposed where cuBLASLt's fp8 "TN" layout needs it), the product of two code
// matrices through cuBLASLt (fp32 accumulation, fp32 output), and the epilogues that put a product
// where the layer wants it (bias, rounding to the layer's dtype, accumulation into a gradient).
//
// Which format and which scale an operand takes is decided by LowPrecisionMatmuls
// (training/precision_recipe.h), once for both devices: only these steps differ from the CPU's
// emulation (quantize.h, matmul_emulation.h). Every call is queued on the thread's compute stream
// (ops_cuda.h); amax() and drain_counts() wait for it, since they return numbers to the host. The
// buffers (codes, the product, cuBLASLt's workspace) are allocated at the first steps and reused.
// Available in a CUDA build (GPT_WITH_CUDA); they need a GPU to run (fp8: compute capability 8.9+).
#pragma once
#include <cstdint>

#include "ops/float_formats.h"  // NumberFormat, Overflow

#ifdef GPT_WITH_CUDA
namespace recipe_cuda {

// The largest |x[i] * pre| of n device values (NaN ignored, as std::max ignores it on the CPU).
float amax(const float* x, int64_t n, float pre);

// Delayed scaling needs a step's amaxes only at its end: each history owns a device slot, raised to
// the amax of every cast it sees without the host waiting (amax_into_slot), and read once per step
// (drain_amax_slots: out[i] = max(out[i], slot i) for the first `count` slots, which are cleared).
constexpr int kAmaxSlots = 8192;
void amax_into_slot(const float* x, int64_t n, float pre, int slot);
void drain_amax_slots(float* out, int count);

// Each product's two operands own a buffer of codes, held until the product has read them.
enum class Operand { A, B };

// The codes of (x * pre) * scale in `format` (round to nearest even; E4M3 saturates under
// Overflow::Saturate) for the rows x cols device matrix x, or for its transpose (cols x rows) where
// `transposed`. Adds to the device counters of `kind` (0, 1, 2) the values that are not zero, those
// that underflowed to zero and those beyond the format's max (quantize.h's QuantCounts).
// Returns the device codes (1 or 2 bytes each), valid until the next cast into the same operand.
const void* cast(Operand operand, const float* x, int rows, int cols, bool transposed, NumberFormat format,
                 Overflow overflow, float pre, float scale, int kind);

// C(M,N) = factor * A(M,K) B(N,K)^T, A and B codes in their formats (both bf16, both fp16, or fp8 with
// at least one E4M3), summed in fp32 by cuBLASLt into a device buffer of M*N fp32 values, returned
// (valid until the next product). fast_accumulation: Hopper's fp8 fast accumulation
// (CUBLASLT_MATMUL_DESC_FAST_ACCUM), the recipe's "tensor-core"; else cuBLASLt promotes the tensor
// cores' partial sums into fp32 (the recipe's "fp32" and "promote128"). fp8 needs M, N and K
// multiples of 16 (cuBLASLt's rule): the recipe is refused before the work where they are not.
const float* product(const void* a, NumberFormat a_format, const void* b, NumberFormat b_format, int M, int N, int K,
                     float factor, bool fast_accumulation);

// out(N,OC) = the product plus the bias (fp32; nullptr: none), rounded to `output`: the forward's epilogue.
void forward_epilogue(float* out, const float* product, const float* bias, int N, int OC, NumberFormat output);
// dst[i] += the product, rounded to `output` where `round` (an input gradient) or not (a weight
// gradient, kept in fp32), times unscale (the loss scale undone: a power of two).
void accumulate(float* dst, const float* product, int64_t n, bool round, NumberFormat output, float unscale);

// Adds the device counters of each of the three kinds to nonzero, underflow and overflow (each
// indexed by kind), and clears them.
void drain_counts(int64_t nonzero[3], int64_t underflow[3], int64_t overflow[3]);

}  // namespace recipe_cuda
#endif
