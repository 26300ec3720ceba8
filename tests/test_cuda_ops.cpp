// test_cuda_ops.cpp: every CUDA op against the CPU op, through the public calls of ops.h, in fp32 and
// in bf16. The same inputs go into CPU tensors and into CUDA tensors (allocated by device_alloc, so
// the counting allocator's CUDA path is tested too); both ops run; the results are compared with
// allclose. The CPU ops are themselves checked against float64 references (test_ops.cpp), so
// agreement here means the CUDA ops are right. Backward tests start from nonzero gradients: the ops
// must accumulate. Outputs an op overwrites (attention's dpreatt and datt, the cross-entropy's dlogits,
// a matmul without bias) start as NaN: a value read before it is written shows up as NaN.
// Sizes are odd and cross the kernels' boundaries: T = 37 rows of scores (more than a warp's 32
// lanes), C = 130 channels, V = 1000 logits (more than the 512 threads of a softmax block). Then the
// same ops at GPT-2 small's shapes (T = 1024, C = 768, NH = 12, V = 50304), where every loop goes
// around many times, and the link delay of the NCCL communicator (link_delay.h). The ops of tensor
// parallelism (vocabulary slices, runs of positions, the matmul backward's halves, the bias ops, the
// sliced cross-entropy) are checked the same way, stage by stage; so is the classifier's version 2,
// the cross-entropy and its backward fused in one kernel, and AdamW's, one launch for many tensors.
//
// bf16: the inputs are rounded to bf16 on the host (bf16.h) and uploaded as BF16 tensors; the CPU op
// runs in fp32 on exactly those rounded values. So the two sides differ only by what the CUDA op
// rounds to bf16 on its way (its outputs, and in attention its intermediate scores).
//
// Without a GPU, or in a build without CUDA, every test is skipped: "no CUDA device: <why>" (except
// convert_tensor's CPU path, which runs everywhere).
//
// Tolerances: |cuda - cpu| <= atol + atol_of_max * max|cpu| + rtol * |cpu|.
// fp32: both sides compute in fp32; they differ only in rounding: other summation orders, fused
// multiply-adds (nvcc contracts a*b + c, g++ -std=c++17 does not), and the GPU's expf/tanhf against
// glibc's.
//   exact (0, 0):        one rounding per element in the same order on both sides: encoder, embedding and
//                        position forward and backward (the backwards add in the CPU's order), add_bias,
//                        residual, copy, add, scale, the cross-entropy slice's maximum and target logit
//   kElementwise:        a few roundings and a library function per element (GELU, AdamW, softmax
//                        backward): atol 1e-6, rtol 1e-5
//   kReduction:          sums of up to ~130 terms of order 1 (layernorm, matmul, attention, softmax):
//                        atol 1e-5, rtol 1e-4
//   kLongSum:            sums over all rows (parameter gradients) or 2^20 elements: atol 1e-4, rtol 1e-4
//                        (sum_of_squares and mean_of: relative 1e-5, fp32 partial sums vs double)
// bf16 keeps 8 significant bits: one rounding to nearest moves a value by at most 2^-8 = 3.9e-3 of it.
//   exact after rounding: where the fp32 arithmetic is the same on both sides (the exact ops above),
//                        the CUDA result is the CPU's fp32 result rounded once to bf16, bit for bit
//   kBf16Once:           computed in fp32 from bf16 inputs and rounded once when stored (layernorm,
//                        matmul, GELU, softmax, every backward that accumulates into bf16): rtol 1e-2,
//                        atol 1e-3 * max|cpu| for the fp32 differences of values that cancel. Also the
//                        sliced cross-entropy's probabilities, rounded twice (2 x 2^-8 < 1e-2)
//   kBf16Chained:        attention, whose scores and probabilities are stored in bf16 between its
//                        steps: rtol 1e-2, atol 1e-2 * max|cpu| (a numpy emulation of the same
//                        roundings at these shapes needed 2.3e-3 * max|cpu|)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ops/bf16.h"    // float_to_bf16, round_to_bf16: bf16 inputs and expected values on the host
#include "ops/device.h"  // cuda_device_count
#include "ops/memory.h"  // Buffer, memory_stats
#include "ops/ops.h"
#include "test_util.h"
#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "base/cuda_check.h"
#include "comm/link_delay.h"  // hold_stream
#include "ops/ops_cuda.h"    // cuda::synchronize, cuda::stream
#endif

namespace {

struct Tolerance {
  double atol, rtol;
  double atol_of_max = 0.0;  // added to atol, times the largest |expected|: bf16 errors scale with the data
};
constexpr Tolerance kExact{0.0, 0.0};
constexpr Tolerance kElementwise{1e-6, 1e-5};
constexpr Tolerance kReduction{1e-5, 1e-4};
constexpr Tolerance kLongSum{1e-4, 1e-4};
constexpr Tolerance kBf16Once{0.0, 1e-2, 1e-3};
constexpr Tolerance kBf16Chained{0.0, 1e-2, 1e-2};

// The tolerance for the dtype under test.
Tolerance pick(DType dt, Tolerance fp32, Tolerance bf16) { return dt == DType::BF16 ? bf16 : fp32; }

::testing::AssertionResult close(const std::vector<float>& cuda, const std::vector<float>& cpu, Tolerance tol) {
  double largest = 0.0;
  for (float x : cpu) largest = std::max(largest, double(std::fabs(x)));
  return allclose(cuda, cpu, tol.atol + tol.atol_of_max * largest, tol.rtol);
}

// Values as the dtype under test holds them: rounded to the nearest bf16 for bf16, unchanged for
// fp32. Inputs go through it before both sides see them; an expected result goes through it when the
// CUDA op's only extra rounding is the final one.
std::vector<float> as_dtype(std::vector<float> values, DType dt) {
  if (dt == DType::BF16)
    for (float& x : values) x = round_to_bf16(x);
  return values;
}

// Every test skips, saying why, where no GPU can run it.
class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// A CUDA copy of host values (float or int), freed when it goes out of scope: the tensors that are
// fp32 whatever the dtype (mean, rstd, losses, AdamW's state) and the token ids.
template <typename Value>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<Value>& host)
      : buffer_(int64_t(host.size()), MemCategory::Other, DType::F32, Device::CUDA), count_(host.size()) {
    static_assert(sizeof(Value) == sizeof(float), "stored in an fp32 buffer of the same element size");
#ifdef GPT_WITH_CUDA
    CUDA_CHECK(cudaMemcpy(buffer_.data(), host.data(), count_ * sizeof(Value), cudaMemcpyHostToDevice));
#endif
  }
  Tensor view(std::initializer_list<int64_t> shape) const {
    Tensor t = make_view(buffer_.data(), shape, DType::F32, Device::CUDA);
    EXPECT_EQ(size_t(t.numel()), count_) << "test bug: shape does not match the array";
    return t;
  }
  const Value* data() const { return static_cast<const Value*>(buffer_.data()); }
  // Waits for every queued op, then copies back.
  std::vector<Value> download() const {
    std::vector<Value> host(count_);
#ifdef GPT_WITH_CUDA
    cuda::synchronize();
    CUDA_CHECK(cudaMemcpy(host.data(), buffer_.data(), count_ * sizeof(Value), cudaMemcpyDeviceToHost));
#endif
    return host;
  }

 private:
  Buffer buffer_;
  size_t count_;
};
using DeviceFloats = DeviceArray<float>;
using DeviceInts = DeviceArray<int>;

// A CUDA tensor of the dtype under test (fp32 or bf16) holding host values, freed when it goes out of
// scope: the model's tensors. bf16 values are rounded to nearest even on the way up (pass them through
// as_dtype first, so that the CPU sees the same numbers); download() widens them back, exactly.
class DeviceValues {
 public:
  DeviceValues(const std::vector<float>& host, DType dt)
      : buffer_(int64_t(host.size()), MemCategory::Other, dt, Device::CUDA), count_(host.size()), dt_(dt) {
    EXPECT_TRUE(dt == DType::F32 || dt == DType::BF16) << "test bug: model tensors are fp32 or bf16";
#ifdef GPT_WITH_CUDA
    if (dt == DType::F32) {
      CUDA_CHECK(cudaMemcpy(buffer_.data(), host.data(), count_ * sizeof(float), cudaMemcpyHostToDevice));
    } else {
      std::vector<bf16_bits> bits(count_);
      for (size_t i = 0; i < count_; i++) bits[i] = float_to_bf16(host[i]);
      CUDA_CHECK(cudaMemcpy(buffer_.data(), bits.data(), count_ * sizeof(bf16_bits), cudaMemcpyHostToDevice));
    }
#endif
  }
  Tensor view(std::initializer_list<int64_t> shape) const {
    Tensor t = make_view(buffer_.data(), shape, dt_, Device::CUDA);
    EXPECT_EQ(size_t(t.numel()), count_) << "test bug: shape does not match the array";
    return t;
  }
  // The raw bf16 bits. Waits for every queued op, then copies back.
  std::vector<bf16_bits> download_bits() const {
    EXPECT_EQ(dt_, DType::BF16) << "test bug: bits of a bf16 tensor only";
    std::vector<bf16_bits> bits(count_);
#ifdef GPT_WITH_CUDA
    cuda::synchronize();
    CUDA_CHECK(cudaMemcpy(bits.data(), buffer_.data(), count_ * sizeof(bf16_bits), cudaMemcpyDeviceToHost));
#endif
    return bits;
  }
  // The values as fp32 (bf16 widened exactly). Waits for every queued op, then copies back.
  std::vector<float> download() const {
    std::vector<float> host(count_);
    if (dt_ == DType::BF16) {
      const std::vector<bf16_bits> bits = download_bits();
      for (size_t i = 0; i < count_; i++) host[i] = bf16_to_float(bits[i]);
      return host;
    }
#ifdef GPT_WITH_CUDA
    cuda::synchronize();
    CUDA_CHECK(cudaMemcpy(host.data(), buffer_.data(), count_ * sizeof(float), cudaMemcpyDeviceToHost));
#endif
    return host;
  }

 private:
  Buffer buffer_;
  size_t count_;
  DType dt_;
};

Tensor cpu_view(std::vector<float>& values, std::initializer_list<int64_t> shape) {
  Tensor t = make_view(values.data(), shape);
  EXPECT_EQ(size_t(t.numel()), values.size()) << "test bug: shape does not match the vector";
  return t;
}

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }
std::vector<float> nans(size_t n) { return std::vector<float>(n, NAN); }

// n values uniform in [lo, hi) as the dtype under test holds them.
std::vector<float> random_in(DType dt, size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return as_dtype(random_vector(n, seed, lo, hi), dt);
}

constexpr int B = 2, T = 37, C = 48, NH = 4, V = 1000;

// ---------------------------------------------------------------------------------------------------------
// encoder: exact in both dtypes (bf16: the CPU's fp32 result rounded once)

void check_encoder_forward(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const int maxT = T + 3;
  auto tokens = random_ints(B * T, V, 1);
  auto wte = random_in(dt, size_t(V) * C, 2), wpe = random_in(dt, size_t(maxT) * C, 3);
  auto out = zeros(size_t(B) * T * C);
  encoder_forward(cpu_view(out, {B, T, C}), tokens.data(), cpu_view(wte, {V, C}), cpu_view(wpe, {maxT, C}), B, T);
  const auto expected = as_dtype(out, dt);

  DeviceValues d_wte(wte, dt), d_wpe(wpe, dt), d_out(nans(out.size()), dt);
  encoder_forward(d_out.view({B, T, C}), tokens.data(), d_wte.view({V, C}), d_wpe.view({maxT, C}), B, T);
  EXPECT_TRUE(close(d_out.download(), expected, kExact)) << "host tokens";

  DeviceInts d_tokens(tokens);
  DeviceValues d_out2(nans(out.size()), dt);
  encoder_forward(d_out2.view({B, T, C}), d_tokens.data(), d_wte.view({V, C}), d_wpe.view({maxT, C}), B, T);
  EXPECT_TRUE(close(d_out2.download(), expected, kExact)) << "device tokens";
}

// dwte and dwpe start nonzero (the op accumulates); `tokens` decides how often each row of dwte is hit.
void check_encoder_backward(DType dt, int EB, int ET, int EC, int EV, const std::vector<int>& tokens) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", B*T = " + std::to_string(EB * ET) + ", C = " + std::to_string(EC));
  const int maxT = ET + 3;
  auto dout = random_in(dt, size_t(EB) * ET * EC, 5);
  auto dwte = random_in(dt, size_t(EV) * EC, 6), dwpe = random_in(dt, size_t(maxT) * EC, 7);
  DeviceValues d_dwte(dwte, dt), d_dwpe(dwpe, dt), d_dout(dout, dt);
  encoder_backward(cpu_view(dwte, {EV, EC}), cpu_view(dwpe, {maxT, EC}), cpu_view(dout, {EB, ET, EC}), tokens.data(),
                   EB, ET);
  encoder_backward(d_dwte.view({EV, EC}), d_dwpe.view({maxT, EC}), d_dout.view({EB, ET, EC}), tokens.data(), EB, ET);
  // Exact: the kernels add each position's gradient in the CPU's order, in fp32, with no atomics.
  EXPECT_TRUE(close(d_dwte.download(), as_dtype(dwte, dt), kExact)) << "dwte";
  EXPECT_TRUE(close(d_dwpe.download(), as_dtype(dwpe, dt), kExact)) << "dwpe";
}

TEST_F(CudaOps, EncoderForwardMatchesCpuWithHostAndDeviceTokens) { check_encoder_forward(DType::F32); }

TEST_F(CudaOps, EncoderBackwardAccumulatesExactlyAsCpu) {
  // ids below 5: every token repeats, its gradients add up
  check_encoder_backward(DType::F32, B, T, C, V, random_ints(B * T, 5, 4));
}

// GPT-2 small's B*T = 8 x 1024 positions and C = 768 channels. Every third position holds one of 8
// tokens (chains of about 340 positions each), the others a token of 1000 (most repeat a few times,
// some occur once): long chains, short ones, and first positions anywhere in the batch.
std::vector<int> repeated_tokens(int n, int vocabulary, uint64_t seed) {
  Rng rng(seed);
  std::vector<int> tokens(n);
  for (int i = 0; i < n; i++) tokens[i] = i % 3 == 0 ? rng.below(8) : rng.below(vocabulary);
  return tokens;
}

TEST_F(CudaOps, EncoderBackwardIsBitIdenticalToCpuWithRepeatedTokensAtScale) {
  const int EB = 8, ET = 1024, EC = 768, EV = 1000;
  check_encoder_backward(DType::F32, EB, ET, EC, EV, repeated_tokens(EB * ET, EV, 8));
}

TEST_F(CudaOps, EncoderBf16IsCpuRoundedOnce) {
  check_encoder_forward(DType::BF16);
  check_encoder_backward(DType::BF16, B, T, C, V, random_ints(B * T, 5, 4));
  check_encoder_backward(DType::BF16, 4, 256, 130, V, repeated_tokens(4 * 256, V, 9));
}

// ---------------------------------------------------------------------------------------------------------
// layernorm: rows of 7 channels (fewer than a warp's lanes) and of 130 (each lane takes several)

void check_layernorm(DType dt, int LC, int N = B * T) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", C = " + std::to_string(LC) + ", N = " + std::to_string(N));
  auto inp = random_in(dt, size_t(N) * LC, 10, 2.0f, 4.0f);  // offset from 0: the mean matters
  auto weight = random_in(dt, LC, 11, 0.5f, 1.5f), bias = random_in(dt, LC, 12);
  auto dout = random_in(dt, size_t(N) * LC, 13);
  auto out = zeros(size_t(N) * LC), mean = zeros(N), rstd = zeros(N);
  auto dinp = random_in(dt, size_t(N) * LC, 14), dweight = random_in(dt, LC, 15), dbias = random_in(dt, LC, 16);
  DeviceValues d_inp(inp, dt), d_weight(weight, dt), d_bias(bias, dt), d_dout(dout, dt), d_out(nans(out.size()), dt);
  DeviceValues d_dinp(dinp, dt), d_dweight(dweight, dt), d_dbias(dbias, dt);
  DeviceFloats d_mean(nans(N)), d_rstd(nans(N));

  layernorm_forward(cpu_view(out, {N, LC}), cpu_view(mean, {N}), cpu_view(rstd, {N}), cpu_view(inp, {N, LC}),
                    cpu_view(weight, {LC}), cpu_view(bias, {LC}));
  layernorm_forward(d_out.view({N, LC}), d_mean.view({N}), d_rstd.view({N}), d_inp.view({N, LC}),
                    d_weight.view({LC}), d_bias.view({LC}));
  EXPECT_TRUE(close(d_out.download(), out, pick(dt, kReduction, kBf16Once)));
  // mean and rstd are fp32 in both dtypes, computed from the same (rounded) inputs
  EXPECT_TRUE(close(d_mean.download(), mean, kReduction));
  EXPECT_TRUE(close(d_rstd.download(), rstd, kReduction));

  // Each backward uses its own side's mean and rstd, as in training.
  layernorm_backward(cpu_view(dinp, {N, LC}), cpu_view(dweight, {LC}), cpu_view(dbias, {LC}), cpu_view(dout, {N, LC}),
                     cpu_view(inp, {N, LC}), cpu_view(weight, {LC}), cpu_view(mean, {N}), cpu_view(rstd, {N}));
  layernorm_backward(d_dinp.view({N, LC}), d_dweight.view({LC}), d_dbias.view({LC}), d_dout.view({N, LC}),
                     d_inp.view({N, LC}), d_weight.view({LC}), d_mean.view({N}), d_rstd.view({N}));
  EXPECT_TRUE(close(d_dinp.download(), dinp, pick(dt, kReduction, kBf16Once)));
  EXPECT_TRUE(close(d_dweight.download(), dweight, pick(dt, kLongSum, kBf16Once)));
  EXPECT_TRUE(close(d_dbias.download(), dbias, pick(dt, kLongSum, kBf16Once)));
}

TEST_F(CudaOps, LayernormForwardAndBackwardMatchCpu) {
  check_layernorm(DType::F32, 7);
  check_layernorm(DType::F32, 130);
}

TEST_F(CudaOps, LayernormBf16MatchesCpu) {
  check_layernorm(DType::BF16, 7);
  check_layernorm(DType::BF16, 130);
  check_layernorm(DType::BF16, 768, 256);
}

// ---------------------------------------------------------------------------------------------------------
// matmul: odd shapes, no multiple of any tile size

constexpr int MN = 67, MC = 129, MOC = 97;

void check_matmul_forward(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const Tolerance tol = pick(dt, kReduction, kBf16Once);
  auto inp = random_in(dt, size_t(MN) * MC, 20), weight = random_in(dt, size_t(MOC) * MC, 21);
  auto bias = random_in(dt, MOC, 22);
  DeviceValues d_inp(inp, dt), d_weight(weight, dt), d_bias(bias, dt);

  auto out = zeros(size_t(MN) * MOC);
  matmul_forward(cpu_view(out, {MN, MOC}), cpu_view(inp, {MN, MC}), cpu_view(weight, {MOC, MC}),
                 cpu_view(bias, {MOC}));
  DeviceValues d_out(nans(out.size()), dt);
  matmul_forward(d_out.view({MN, MOC}), d_inp.view({MN, MC}), d_weight.view({MOC, MC}), d_bias.view({MOC}));
  EXPECT_TRUE(close(d_out.download(), out, tol)) << "with bias";

  // A bias that starts one element into its buffer is not 16-byte aligned: cuBLASLt's bias epilogue
  // cannot take it, and the op adds it another way (ops_cuda.cu).
  std::vector<float> shifted(MOC + 1, NAN);
  std::copy(bias.begin(), bias.end(), shifted.begin() + 1);
  DeviceValues d_shifted(shifted, dt), d_out_shifted(nans(out.size()), dt);
  matmul_forward(d_out_shifted.view({MN, MOC}), d_inp.view({MN, MC}), d_weight.view({MOC, MC}),
                 d_shifted.view({MOC + 1}).slice1d(1, MOC));
  EXPECT_TRUE(close(d_out_shifted.download(), out, tol)) << "with a bias that is not 16-byte aligned";

  // Without a bias, stale contents of out (even NaN) must not leak into the result.
  matmul_forward(cpu_view(out, {MN, MOC}), cpu_view(inp, {MN, MC}), cpu_view(weight, {MOC, MC}), Tensor{});
  DeviceValues d_stale(nans(out.size()), dt);
  matmul_forward(d_stale.view({MN, MOC}), d_inp.view({MN, MC}), d_weight.view({MOC, MC}), Tensor{});
  EXPECT_TRUE(close(d_stale.download(), out, tol)) << "without bias";
}

void check_matmul_backward(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  auto inp = random_in(dt, size_t(MN) * MC, 23), weight = random_in(dt, size_t(MOC) * MC, 24);
  auto dout = random_in(dt, size_t(MN) * MOC, 25);
  DeviceValues d_inp(inp, dt), d_weight(weight, dt), d_dout(dout, dt);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with dbias" : "without dbias");
    auto dinp = random_in(dt, size_t(MN) * MC, 26), dweight = random_in(dt, size_t(MOC) * MC, 27);
    auto dbias = random_in(dt, MOC, 28);
    DeviceValues d_dinp(dinp, dt), d_dweight(dweight, dt), d_dbias(dbias, dt);
    matmul_backward(cpu_view(dinp, {MN, MC}), cpu_view(dweight, {MOC, MC}),
                    with_bias ? cpu_view(dbias, {MOC}) : Tensor{}, cpu_view(dout, {MN, MOC}), cpu_view(inp, {MN, MC}),
                    cpu_view(weight, {MOC, MC}));
    matmul_backward(d_dinp.view({MN, MC}), d_dweight.view({MOC, MC}), with_bias ? d_dbias.view({MOC}) : Tensor{},
                    d_dout.view({MN, MOC}), d_inp.view({MN, MC}), d_weight.view({MOC, MC}));
    EXPECT_TRUE(close(d_dinp.download(), dinp, pick(dt, kReduction, kBf16Once)));
    EXPECT_TRUE(close(d_dweight.download(), dweight, pick(dt, kReduction, kBf16Once)));
    EXPECT_TRUE(close(d_dbias.download(), dbias, pick(dt, kLongSum, kBf16Once)));  // unchanged when without
  }
}

TEST_F(CudaOps, MatmulForwardMatchesCpuWithAndWithoutBias) { check_matmul_forward(DType::F32); }
TEST_F(CudaOps, MatmulBackwardAccumulatesAsCpu) { check_matmul_backward(DType::F32); }
TEST_F(CudaOps, MatmulForwardBf16MatchesCpuWithAndWithoutBias) { check_matmul_forward(DType::BF16); }
TEST_F(CudaOps, MatmulBackwardBf16AccumulatesAsCpu) { check_matmul_backward(DType::BF16); }

// ---------------------------------------------------------------------------------------------------------
// attention: NH = 4 heads of 12 channels, T = 37

// The entries t2 <= t of every (B,NH) block of T x T scores, the only ones the contract defines.
std::vector<float> causal_part(const std::vector<float>& scores, int blocks = B * NH, int rows = T) {
  std::vector<float> kept;
  for (int bh = 0; bh < blocks; bh++)
    for (int t = 0; t < rows; t++)
      for (int t2 = 0; t2 <= t; t2++) kept.push_back(scores[(size_t(bh) * rows + t) * rows + t2]);
  return kept;
}

// Forward, then backward, at (AB, AT, AC, ANH). The backward runs on the same inputs on both sides:
// the CUDA forward's att (in bf16, the rounded probabilities) goes into the CPU backward too. dpreatt
// and datt start as NaN on both sides: they are overwritten scratch (ops.h).
void check_attention(DType dt, int AB, int AT, int AC, int ANH, uint64_t seed, float qkv_range) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", T = " + std::to_string(AT) + ", C = " + std::to_string(AC));
  const Tolerance tol = pick(dt, kReduction, kBf16Chained);
  const size_t scores = size_t(AB) * ANH * AT * AT;
  const auto qkv_shape = {int64_t(AB), int64_t(AT), int64_t(3 * AC)};
  const auto out_shape = {int64_t(AB), int64_t(AT), int64_t(AC)};
  const auto scores_shape = {int64_t(AB), int64_t(ANH), int64_t(AT), int64_t(AT)};
  auto qkv = random_in(dt, size_t(AB) * AT * 3 * AC, seed, -qkv_range, qkv_range);
  auto dout = random_in(dt, size_t(AB) * AT * AC, seed + 1);
  auto out = zeros(size_t(AB) * AT * AC), preatt = zeros(scores), att = zeros(scores);
  DeviceValues d_qkv(qkv, dt), d_dout(dout, dt), d_out(nans(out.size()), dt), d_preatt(nans(scores), dt),
      d_att(nans(scores), dt);

  attention_forward(cpu_view(out, out_shape), cpu_view(preatt, scores_shape), cpu_view(att, scores_shape),
                    cpu_view(qkv, qkv_shape), ANH);
  attention_forward(d_out.view(out_shape), d_preatt.view(scores_shape), d_att.view(scores_shape),
                    d_qkv.view(qkv_shape), ANH);
  EXPECT_TRUE(close(d_out.download(), out, tol)) << "out";
  auto cuda_att = d_att.download();
  EXPECT_TRUE(close(cuda_att, att, tol)) << "att, including the zeros above the diagonal";
  EXPECT_TRUE(close(causal_part(d_preatt.download(), AB * ANH, AT), causal_part(preatt, AB * ANH, AT), tol))
      << "preatt";

  auto dqkv = random_in(dt, qkv.size(), seed + 2), dpreatt = nans(scores), datt = nans(scores);
  DeviceValues d_dqkv(dqkv, dt), d_dpreatt(nans(scores), dt), d_datt(nans(scores), dt);
  attention_backward(cpu_view(dqkv, qkv_shape), cpu_view(dpreatt, scores_shape), cpu_view(datt, scores_shape),
                     cpu_view(dout, out_shape), cpu_view(qkv, qkv_shape), cpu_view(cuda_att, scores_shape), ANH);
  attention_backward(d_dqkv.view(qkv_shape), d_dpreatt.view(scores_shape), d_datt.view(scores_shape),
                     d_dout.view(out_shape), d_qkv.view(qkv_shape), d_att.view(scores_shape), ANH);
  EXPECT_TRUE(close(d_dqkv.download(), dqkv, tol)) << "dqkv";
  EXPECT_TRUE(
      close(causal_part(d_dpreatt.download(), AB * ANH, AT), causal_part(dpreatt, AB * ANH, AT), tol))
      << "dpreatt";
}

TEST_F(CudaOps, AttentionForwardAndBackwardMatchCpu) { check_attention(DType::F32, B, T, C, NH, 30, 2.0f); }

TEST_F(CudaOps, AttentionBf16MatchesCpu) { check_attention(DType::BF16, B, T, C, NH, 30, 2.0f); }

TEST_F(CudaOps, AttentionIsDeterministic) {
  const size_t scores = size_t(B) * NH * T * T;
  auto qkv = random_vector(size_t(B) * T * 3 * C, 33, -2.0f, 2.0f), dout = random_vector(size_t(B) * T * C, 34);
  DeviceFloats d_qkv(qkv), d_dout(dout), d_out(zeros(size_t(B) * T * C));
  DeviceFloats d_preatt(zeros(scores)), d_att(zeros(scores));
  attention_forward(d_out.view({B, T, C}), d_preatt.view({B, NH, T, T}), d_att.view({B, NH, T, T}),
                    d_qkv.view({B, T, 3 * C}), NH);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; run++) {
    DeviceFloats d_dqkv(zeros(qkv.size())), d_dpreatt(nans(scores)), d_datt(nans(scores));
    attention_backward(d_dqkv.view({B, T, 3 * C}), d_dpreatt.view({B, NH, T, T}), d_datt.view({B, NH, T, T}),
                       d_dout.view({B, T, C}), d_qkv.view({B, T, 3 * C}), d_att.view({B, NH, T, T}), NH);
    runs.push_back(d_dqkv.download());
  }
  EXPECT_TRUE(close(runs[1], runs[0], kExact)) << "two runs of the same backward differ";
}

// ---------------------------------------------------------------------------------------------------------
// GELU and residual

void check_gelu(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const Tolerance tol = pick(dt, kElementwise, kBf16Once);
  const int64_t n = int64_t(B) * T * 4 * C;
  auto inp = random_in(dt, n, 40, -4.0f, 4.0f), dout = random_in(dt, n, 41), out = zeros(n);
  auto dinp = random_in(dt, n, 42);
  DeviceValues d_inp(inp, dt), d_dout(dout, dt), d_out(nans(n), dt), d_dinp(dinp, dt);
  gelu_forward(cpu_view(out, {n}), cpu_view(inp, {n}));
  gelu_forward(d_out.view({n}), d_inp.view({n}));
  EXPECT_TRUE(close(d_out.download(), out, tol));
  gelu_backward(cpu_view(dinp, {n}), cpu_view(inp, {n}), cpu_view(dout, {n}));
  gelu_backward(d_dinp.view({n}), d_inp.view({n}), d_dout.view({n}));
  EXPECT_TRUE(close(d_dinp.download(), dinp, tol));
  // Overwrite, as the block's backward calls it: written over NaN, which any read would carry.
  auto written = zeros(n);
  DeviceValues d_written(nans(n), dt);
  gelu_backward(cpu_view(written, {n}), cpu_view(inp, {n}), cpu_view(dout, {n}), GradWrite::Overwrite);
  gelu_backward(d_written.view({n}), d_inp.view({n}), d_dout.view({n}), GradWrite::Overwrite);
  EXPECT_TRUE(close(d_written.download(), written, tol)) << "overwritten";
}

// Exact in both dtypes: one addition per element on both sides (bf16: then rounded once).
void check_residual(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const int64_t n = int64_t(B) * T * C;
  auto a = random_in(dt, n, 43), b = random_in(dt, n, 44), dout = random_in(dt, n, 45), out = zeros(n);
  auto da = random_in(dt, n, 46), db = random_in(dt, n, 47);
  DeviceValues d_a(a, dt), d_b(b, dt), d_dout(dout, dt), d_out(nans(n), dt), d_da(da, dt), d_db(db, dt);
  residual_forward(cpu_view(out, {n}), cpu_view(a, {n}), cpu_view(b, {n}));
  residual_forward(d_out.view({n}), d_a.view({n}), d_b.view({n}));
  EXPECT_TRUE(close(d_out.download(), as_dtype(out, dt), kExact));
  residual_backward(cpu_view(da, {n}), cpu_view(db, {n}), cpu_view(dout, {n}));
  residual_backward(d_da.view({n}), d_db.view({n}), d_dout.view({n}));
  EXPECT_TRUE(close(d_da.download(), as_dtype(da, dt), kExact));
  EXPECT_TRUE(close(d_db.download(), as_dtype(db, dt), kExact));
}

TEST_F(CudaOps, GeluForwardAndBackwardMatchCpu) { check_gelu(DType::F32); }
TEST_F(CudaOps, ResidualForwardAndBackwardAreExact) { check_residual(DType::F32); }
TEST_F(CudaOps, GeluBf16MatchesCpu) { check_gelu(DType::BF16); }
TEST_F(CudaOps, ResidualBf16IsCpuRoundedOnce) { check_residual(DType::BF16); }

// ---------------------------------------------------------------------------------------------------------
// softmax + cross-entropy: V = 1000 logits per row

// Forward with host targets and with device targets; the backward then runs on the CUDA forward's
// probs on both sides, into dlogits that start as NaN (overwritten, ops.h).
void check_softmax_crossentropy(DType dt, int N, int SV, std::vector<float> logits, uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", V = " + std::to_string(SV));
  logits = as_dtype(logits, dt);
  auto targets = random_ints(N, SV, seed);
  auto losses = zeros(N), probs = zeros(size_t(N) * SV), dlogits = nans(size_t(N) * SV);
  DeviceValues d_logits(logits, dt), d_probs(nans(probs.size()), dt), d_dlogits(nans(dlogits.size()), dt);
  DeviceFloats d_losses(nans(N));
  DeviceInts d_targets(targets);
  const float dloss = 1.0f / float(N);

  softmax_crossentropy_forward(cpu_view(losses, {N}), cpu_view(probs, {N, SV}), cpu_view(logits, {N, SV}),
                               targets.data());
  softmax_crossentropy_forward(d_losses.view({N}), d_probs.view({N, SV}), d_logits.view({N, SV}), targets.data());
  // the losses are fp32 in both dtypes, computed in fp32 from the same (rounded) logits
  EXPECT_TRUE(close(d_losses.download(), losses, kReduction)) << "host targets";
  EXPECT_TRUE(close(d_probs.download(), probs, pick(dt, kReduction, kBf16Once))) << "host targets";
  DeviceFloats d_losses2(nans(N));
  softmax_crossentropy_forward(d_losses2.view({N}), d_probs.view({N, SV}), d_logits.view({N, SV}), d_targets.data());
  EXPECT_TRUE(close(d_losses2.download(), losses, kReduction)) << "device targets";

  auto cuda_probs = d_probs.download();
  softmax_crossentropy_backward(cpu_view(dlogits, {N, SV}), cpu_view(cuda_probs, {N, SV}), targets.data(), dloss);
  softmax_crossentropy_backward(d_dlogits.view({N, SV}), d_probs.view({N, SV}), d_targets.data(), dloss);
  EXPECT_TRUE(close(d_dlogits.download(), dlogits, pick(dt, kElementwise, kBf16Once)));
}

std::vector<float> logits_with_a_huge_row(int N, int SV, uint64_t seed) {
  auto logits = random_vector(size_t(N) * SV, seed, -3.0f, 3.0f);
  for (int v = 0; v < SV; v++) logits[size_t(3) * SV + v] += 100.0f;  // exp(100) overflows fp32: max subtraction
  return logits;
}

TEST_F(CudaOps, SoftmaxCrossentropyMatchesCpuWithHostAndDeviceTargets) {
  check_softmax_crossentropy(DType::F32, B * T, V, logits_with_a_huge_row(B * T, V, 50), 51);
}

TEST_F(CudaOps, SoftmaxCrossentropyBf16MatchesCpu) {
  check_softmax_crossentropy(DType::BF16, B * T, V, logits_with_a_huge_row(B * T, V, 50), 51);
}

// The classifier's version 2 (cuda::fused_classifier): the loss and dlogits, in place over the logits,
// against the CPU's forward then backward on the same (rounded) logits. bf16: each dlogit is the fp32
// value rounded once.
void check_fused_classifier(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const int N = B * T;
  auto logits = as_dtype(logits_with_a_huge_row(N, V, 52), dt);
  auto targets = random_ints(N, V, 53);
  auto losses = zeros(N), probs = zeros(size_t(N) * V), dlogits = nans(size_t(N) * V);
  const float dloss = 1.0f / float(N);
  softmax_crossentropy_forward(cpu_view(losses, {N}), cpu_view(probs, {N, V}), cpu_view(logits, {N, V}), targets.data());
  softmax_crossentropy_backward(cpu_view(dlogits, {N, V}), cpu_view(probs, {N, V}), targets.data(), dloss);
  DeviceValues d_logits(logits, dt);
  DeviceFloats d_losses(nans(N));
  DeviceInts d_targets(targets);
#ifdef GPT_WITH_CUDA
  cuda::fused_classifier(dt, d_logits.view({N, V}).data, d_losses.view({N}).f32(), d_targets.data(), dloss, N, V);
#endif
  EXPECT_TRUE(close(d_losses.download(), losses, kReduction));
  EXPECT_TRUE(close(d_logits.download(), dlogits, pick(dt, kElementwise, kBf16Once)));
}

TEST_F(CudaOps, FusedClassifierMatchesTheCpuForwardAndBackward) {
  check_fused_classifier(DType::F32);
  check_fused_classifier(DType::BF16);
}

// ---------------------------------------------------------------------------------------------------------
// the ops of tensor parallelism

// A slice [begin, begin + rows) of the V = 1000 (or `vocabulary`) token table, forward with host and
// device tokens, backward from a nonzero gradient. Exact in both dtypes: the forward copies rows, the
// backward adds each position's gradient in the CPU's order (bf16: the CPU's fp32 result rounded once).
void check_embedding_slice(DType dt, int N, int EC, int begin, int rows, int vocabulary,
                           const std::vector<int>& tokens) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", N = " + std::to_string(N) + ", C = " + std::to_string(EC) +
               ", slice [" + std::to_string(begin) + ", " + std::to_string(begin + rows) + ")");
  auto wte = random_in(dt, size_t(rows) * EC, 120);
  auto out = nans(size_t(N) * EC);
  embedding_forward(cpu_view(out, {N, EC}), tokens.data(), cpu_view(wte, {rows, EC}), begin, vocabulary);
  DeviceValues d_wte(wte, dt), d_out(nans(out.size()), dt), d_out2(nans(out.size()), dt);
  DeviceInts d_tokens(tokens);
  embedding_forward(d_out.view({N, EC}), tokens.data(), d_wte.view({rows, EC}), begin, vocabulary);
  EXPECT_TRUE(close(d_out.download(), out, kExact)) << "forward, host tokens";
  embedding_forward(d_out2.view({N, EC}), d_tokens.data(), d_wte.view({rows, EC}), begin, vocabulary);
  EXPECT_TRUE(close(d_out2.download(), out, kExact)) << "forward, device tokens";

  auto dout = random_in(dt, size_t(N) * EC, 121), dwte = random_in(dt, size_t(rows) * EC, 122);
  DeviceValues d_dout(dout, dt), d_dwte(dwte, dt);
  embedding_backward(cpu_view(dwte, {rows, EC}), cpu_view(dout, {N, EC}), tokens.data(), begin, vocabulary);
  embedding_backward(d_dwte.view({rows, EC}), d_dout.view({N, EC}), d_tokens.data(), begin, vocabulary);
  EXPECT_TRUE(close(d_dwte.download(), as_dtype(dwte, dt), kExact)) << "backward";
}

TEST_F(CudaOps, EmbeddingSlicesAreExactlyCpu) {
  const auto tokens = random_ints(B * T, 5, 4);  // ids below 5: repeats, in the first slice only
  const auto spread = random_ints(B * T, V, 123);
  for (DType dt : {DType::F32, DType::BF16}) {
    check_embedding_slice(dt, B * T, C, 0, 3, V, tokens);         // ids 3 and 4 belong to another slice
    check_embedding_slice(dt, B * T, C, 300, 250, V, spread);      // a slice in the middle
    check_embedding_slice(dt, B * T, C, V - 250, 250, V, spread);  // the last slice
  }
}

// GPT-2 small's B*T and C; frequent tokens (ids below 8: long chains) in the first of two slices.
TEST_F(CudaOps, EmbeddingSlicesAtScaleAreExactlyCpu) {
  const int EB = 8, ET = 1024, EC = 768, EV = 1000;
  const auto tokens = repeated_tokens(EB * ET, EV, 124);
  check_embedding_slice(DType::F32, EB * ET, EC, 0, EV / 2, EV, tokens);
  check_embedding_slice(DType::F32, EB * ET, EC, EV / 2, EV / 2, EV, tokens);
  check_embedding_slice(DType::BF16, 4 * 256, 130, 0, EV / 2, EV, repeated_tokens(4 * 256, EV, 125));
}

// N rows from first_row on, position (first_row + n) % PT of a table of PT + 3 rows: forward adds one
// value per element, backward adds each row in the CPU's row order: exact in both dtypes.
void check_positions(DType dt, int N, int PC, int PT, int64_t first_row) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", N = " + std::to_string(N) + ", T = " + std::to_string(PT) +
               ", first_row = " + std::to_string(first_row));
  const int maxT = PT + 3;
  auto wpe = random_in(dt, size_t(maxT) * PC, 130), out = random_in(dt, size_t(N) * PC, 131);
  auto dout = random_in(dt, size_t(N) * PC, 132), dwpe = random_in(dt, size_t(maxT) * PC, 133);
  DeviceValues d_wpe(wpe, dt), d_out(out, dt), d_dout(dout, dt), d_dwpe(dwpe, dt);
  position_forward(cpu_view(out, {N, PC}), cpu_view(wpe, {maxT, PC}), first_row, PT);
  position_forward(d_out.view({N, PC}), d_wpe.view({maxT, PC}), first_row, PT);
  EXPECT_TRUE(close(d_out.download(), as_dtype(out, dt), kExact)) << "forward";
  position_backward(cpu_view(dwpe, {maxT, PC}), cpu_view(dout, {N, PC}), first_row, PT);
  position_backward(d_dwpe.view({maxT, PC}), d_dout.view({N, PC}), first_row, PT);
  EXPECT_TRUE(close(d_dwpe.download(), as_dtype(dwpe, dt), kExact)) << "backward";
}

TEST_F(CudaOps, PositionOpsFromAnyFirstRowAreExactlyCpu) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t first_row : {int64_t(0), int64_t(20), int64_t(3 * T + 5), (int64_t(1) << 33) + 7}) {
      check_positions(dt, 2 * T - 9, C, T, first_row);  // rows that start and end inside a sequence
      check_positions(dt, 10, C, T, first_row);         // fewer rows than positions: some rows of dwpe untouched
    }
  }
  check_positions(DType::F32, 4 * 1024, 768, 1024, 1000);  // GPT-2 small's T and C, four sequences' worth
}

// The halves of the matmul backward: against the CPU's halves, and bit for bit against the CUDA
// matmul_backward (the same GEMMs; cuBLAS is deterministic on one GPU), from nonzero gradients.
void check_matmul_halves(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  auto inp = random_in(dt, size_t(MN) * MC, 140), weight = random_in(dt, size_t(MOC) * MC, 141);
  auto dout = random_in(dt, size_t(MN) * MOC, 142);
  DeviceValues d_inp(inp, dt), d_weight(weight, dt), d_dout(dout, dt);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with dbias" : "without dbias");
    auto dinp = random_in(dt, size_t(MN) * MC, 143), dweight = random_in(dt, size_t(MOC) * MC, 144);
    auto dbias = random_in(dt, MOC, 145);
    DeviceValues d_dinp(dinp, dt), d_dweight(dweight, dt), d_dbias(dbias, dt);
    DeviceValues whole_dinp(dinp, dt), whole_dweight(dweight, dt), whole_dbias(dbias, dt);
    matmul_backward_input(cpu_view(dinp, {MN, MC}), cpu_view(dout, {MN, MOC}), cpu_view(weight, {MOC, MC}));
    matmul_backward_weight(cpu_view(dweight, {MOC, MC}), with_bias ? cpu_view(dbias, {MOC}) : Tensor{},
                           cpu_view(dout, {MN, MOC}), cpu_view(inp, {MN, MC}));
    matmul_backward_input(d_dinp.view({MN, MC}), d_dout.view({MN, MOC}), d_weight.view({MOC, MC}));
    matmul_backward_weight(d_dweight.view({MOC, MC}), with_bias ? d_dbias.view({MOC}) : Tensor{},
                           d_dout.view({MN, MOC}), d_inp.view({MN, MC}));
    matmul_backward(whole_dinp.view({MN, MC}), whole_dweight.view({MOC, MC}),
                    with_bias ? whole_dbias.view({MOC}) : Tensor{}, d_dout.view({MN, MOC}), d_inp.view({MN, MC}),
                    d_weight.view({MOC, MC}));
    const auto cuda_dinp = d_dinp.download(), cuda_dweight = d_dweight.download(), cuda_dbias = d_dbias.download();
    EXPECT_TRUE(close(cuda_dinp, dinp, pick(dt, kReduction, kBf16Once))) << "dinp";
    EXPECT_TRUE(close(cuda_dweight, dweight, pick(dt, kReduction, kBf16Once))) << "dweight";
    EXPECT_TRUE(close(cuda_dbias, dbias, pick(dt, kLongSum, kBf16Once))) << "dbias (unchanged when without)";
    EXPECT_TRUE(close(cuda_dinp, whole_dinp.download(), kExact)) << "dinp of matmul_backward";
    EXPECT_TRUE(close(cuda_dweight, whole_dweight.download(), kExact)) << "dweight of matmul_backward";
    EXPECT_TRUE(close(cuda_dbias, whole_dbias.download(), kExact)) << "dbias of matmul_backward";
  }
  // The input's gradient overwritten, as the model's backward asks for it: over NaN on the GPU.
  auto written = zeros(size_t(MN) * MC);
  DeviceValues d_written(nans(written.size()), dt);
  matmul_backward_input(cpu_view(written, {MN, MC}), cpu_view(dout, {MN, MOC}), cpu_view(weight, {MOC, MC}),
                        GradWrite::Overwrite);
  matmul_backward_input(d_written.view({MN, MC}), d_dout.view({MN, MOC}), d_weight.view({MOC, MC}),
                        GradWrite::Overwrite);
  EXPECT_TRUE(close(d_written.download(), written, pick(dt, kReduction, kBf16Once))) << "dinp overwritten";
}

TEST_F(CudaOps, MatmulBackwardHalvesMatchCpuAndTheWholeBackward) {
  check_matmul_halves(DType::F32);
  check_matmul_halves(DType::BF16);
}

// add_bias: one addition per element, exact (bf16: rounded once). bias_backward: a column sum over N
// rows, in one chunk of rows and in many.
void check_bias(DType dt, int N) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", N = " + std::to_string(N));
  auto out = random_in(dt, size_t(N) * MOC, 150), bias = random_in(dt, MOC, 151);
  auto dout = random_in(dt, size_t(N) * MOC, 152), dbias = random_in(dt, MOC, 153);
  DeviceValues d_out(out, dt), d_bias(bias, dt), d_dout(dout, dt), d_dbias(dbias, dt);
  add_bias(cpu_view(out, {N, MOC}), cpu_view(bias, {MOC}));
  add_bias(d_out.view({N, MOC}), d_bias.view({MOC}));
  EXPECT_TRUE(close(d_out.download(), as_dtype(out, dt), kExact)) << "add_bias";
  bias_backward(cpu_view(dbias, {MOC}), cpu_view(dout, {N, MOC}));
  bias_backward(d_dbias.view({MOC}), d_dout.view({N, MOC}));
  EXPECT_TRUE(close(d_dbias.download(), dbias, pick(dt, kLongSum, kBf16Once))) << "bias_backward";
}

TEST_F(CudaOps, AddBiasAndBiasBackwardMatchCpu) {
  for (DType dt : {DType::F32, DType::BF16}) {
    check_bias(dt, 20);    // fewer rows than one chunk of the column sum
    check_bias(dt, MN);    // a few chunks, the last one short
    check_bias(dt, 3000);  // many chunks
  }
}

// The sliced cross-entropy, `slices` slices of SV logits per row, targets all over the vocabulary.
// Each stage runs on both sides on the same inputs (the CPU stage takes the CUDA previous stage's
// outputs, as the backward test above takes the CUDA probabilities), and the all-reduces between the
// stages are loops on the host. Then the CUDA losses and probabilities against the unsplit CPU op,
// and the sliced backward of the CUDA probabilities.
void check_crossentropy_slices(DType dt, int N, int SV, int slices, std::vector<float> logits, uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", V = " + std::to_string(SV) + ", " + std::to_string(slices) +
               " slices");
  logits = as_dtype(logits, dt);
  const auto targets = random_ints(N, SV, seed);
  DeviceInts d_targets(targets);
  auto losses = zeros(N), probs = zeros(size_t(N) * SV);
  softmax_crossentropy_forward(cpu_view(losses, {N}), cpu_view(probs, {N, SV}), cpu_view(logits, {N, SV}),
                               targets.data());

  const auto ranges = vocabulary_slices(SV, slices);
  std::vector<std::vector<float>> slice_logits;
  std::vector<std::unique_ptr<DeviceValues>> d_logits, d_probs;
  for (auto [begin, end] : ranges) {
    slice_logits.push_back(columns_of(logits, SV, begin, end));
    d_logits.push_back(std::make_unique<DeviceValues>(slice_logits.back(), dt));
    d_probs.push_back(std::make_unique<DeviceValues>(nans(size_t(N) * (end - begin)), dt));
  }
  auto columns = [&](size_t k) { return int64_t(ranges[k].second - ranges[k].first); };

  // 1. maxima and target logits: exact (a maximum and a copy of the same values)
  std::vector<float> row_max(N, -INFINITY), target_logit = zeros(N);
  for (size_t k = 0; k < ranges.size(); k++) {
    SCOPED_TRACE("stage 1, slice " + std::to_string(k));
    auto slice_max = nans(N), slice_target = nans(N);
    DeviceFloats d_max(nans(N)), d_target(nans(N)), d_max2(nans(N)), d_target2(nans(N));
    crossentropy_shard_max(cpu_view(slice_max, {N}), cpu_view(slice_target, {N}),
                           cpu_view(slice_logits[k], {N, columns(k)}), targets.data(), ranges[k].first);
    crossentropy_shard_max(d_max.view({N}), d_target.view({N}), d_logits[k]->view({N, columns(k)}), targets.data(),
                           ranges[k].first);
    crossentropy_shard_max(d_max2.view({N}), d_target2.view({N}), d_logits[k]->view({N, columns(k)}),
                           d_targets.data(), ranges[k].first);
    EXPECT_TRUE(close(d_max.download(), slice_max, kExact)) << "row_max, host targets";
    EXPECT_TRUE(close(d_target.download(), slice_target, kExact)) << "target_logit, host targets";
    EXPECT_TRUE(close(d_max2.download(), slice_max, kExact)) << "row_max, device targets";
    EXPECT_TRUE(close(d_target2.download(), slice_target, kExact)) << "target_logit, device targets";
    for (int i = 0; i < N; i++) {
      row_max[i] = std::max(row_max[i], slice_max[i]);
      target_logit[i] += slice_target[i];
    }
  }
  DeviceFloats d_row_max(row_max), d_target_logit(target_logit);

  // 2. exponentials and their sums
  std::vector<float> row_sum = zeros(N);
  for (size_t k = 0; k < ranges.size(); k++) {
    SCOPED_TRACE("stage 2, slice " + std::to_string(k));
    auto slice_probs = nans(size_t(N) * columns(k)), slice_sum = nans(N);
    DeviceFloats d_sum(nans(N));
    crossentropy_shard_exp(cpu_view(slice_probs, {N, columns(k)}), cpu_view(slice_sum, {N}),
                           cpu_view(slice_logits[k], {N, columns(k)}), cpu_view(row_max, {N}));
    crossentropy_shard_exp(d_probs[k]->view({N, columns(k)}), d_sum.view({N}), d_logits[k]->view({N, columns(k)}),
                           d_row_max.view({N}));
    EXPECT_TRUE(close(d_probs[k]->download(), slice_probs, pick(dt, kElementwise, kBf16Once))) << "exponentials";
    const auto cuda_sum = d_sum.download();
    EXPECT_TRUE(close(cuda_sum, slice_sum, kReduction)) << "row_sum";
    for (int i = 0; i < N; i++) row_sum[i] += cuda_sum[i];
  }
  DeviceFloats d_row_sum(row_sum);

  // 3. losses and probabilities; then the backward of each slice
  const float dloss = 1.0f / float(N);
  for (size_t k = 0; k < ranges.size(); k++) {
    SCOPED_TRACE("stage 3, slice " + std::to_string(k));
    auto slice_probs = d_probs[k]->download(), slice_losses = nans(N);
    DeviceFloats d_losses(nans(N));
    crossentropy_shard_finish(cpu_view(slice_losses, {N}), cpu_view(slice_probs, {N, columns(k)}),
                              cpu_view(row_max, {N}), cpu_view(row_sum, {N}), cpu_view(target_logit, {N}));
    crossentropy_shard_finish(d_losses.view({N}), d_probs[k]->view({N, columns(k)}), d_row_max.view({N}),
                              d_row_sum.view({N}), d_target_logit.view({N}));
    const auto cuda_losses = d_losses.download(), cuda_probs = d_probs[k]->download();
    EXPECT_TRUE(close(cuda_losses, slice_losses, kReduction)) << "losses";
    EXPECT_TRUE(close(cuda_probs, slice_probs, pick(dt, kElementwise, kBf16Once))) << "probs";
    EXPECT_TRUE(close(cuda_losses, losses, kReduction)) << "losses against the unsplit op";
    EXPECT_TRUE(close(cuda_probs, columns_of(probs, SV, ranges[k].first, ranges[k].second),
                      pick(dt, kReduction, kBf16Once)))
        << "probs against the unsplit op";

    auto dlogits = nans(cuda_probs.size()), host_probs = cuda_probs;
    DeviceValues d_dlogits(nans(cuda_probs.size()), dt);
    softmax_crossentropy_backward(cpu_view(dlogits, {N, columns(k)}), cpu_view(host_probs, {N, columns(k)}),
                                  targets.data(), dloss, ranges[k].first);
    softmax_crossentropy_backward(d_dlogits.view({N, columns(k)}), d_probs[k]->view({N, columns(k)}),
                                  d_targets.data(), dloss, ranges[k].first);
    EXPECT_TRUE(close(d_dlogits.download(), dlogits, pick(dt, kElementwise, kBf16Once))) << "backward";
  }
}

TEST_F(CudaOps, CrossentropySlicesMatchCpu) {
  for (DType dt : {DType::F32, DType::BF16})
    for (int slices : {2, 3, 4})
      check_crossentropy_slices(dt, B * T, V, slices, logits_with_a_huge_row(B * T, V, 160), 161);
}

// ---------------------------------------------------------------------------------------------------------
// helpers, reductions, AdamW

// Exact in both dtypes. In bf16 the CPU reference is rounded after every step, as the bf16 tensor is.
void check_fill_copy_add_scale(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const int n = 1001;
  auto a = random_in(dt, n, 60), b = random_in(dt, n, 61), dst = random_in(dt, n, 62);
  DeviceValues d_a(a, dt), d_b(b, dt), d_dst(dst, dt);
  copy_tensor(cpu_view(dst, {n}), cpu_view(a, {7, 11, 13}));
  copy_tensor(d_dst.view({n}), d_a.view({7, 11, 13}));
  EXPECT_TRUE(close(d_dst.download(), dst, kExact)) << "copy";
  add_inplace(cpu_view(dst, {n}), cpu_view(b, {n}));
  add_inplace(d_dst.view({n}), d_b.view({n}));
  dst = as_dtype(dst, dt);
  EXPECT_TRUE(close(d_dst.download(), dst, kExact)) << "add";
  scale_inplace(cpu_view(dst, {n}), -0.3f);
  scale_inplace(d_dst.view({n}), -0.3f);
  dst = as_dtype(dst, dt);
  EXPECT_TRUE(close(d_dst.download(), dst, kExact)) << "scale";
  fill_zero(d_dst.view({n}));
  EXPECT_TRUE(close(d_dst.download(), zeros(n), kExact)) << "fill";
}

TEST_F(CudaOps, FillCopyAddScaleAreExact) { check_fill_copy_add_scale(DType::F32); }
TEST_F(CudaOps, FillCopyAddScaleBf16AreCpuRoundedOnce) { check_fill_copy_add_scale(DType::BF16); }

void check_sums(DType dt) {
  SCOPED_TRACE(dtype_name(dt));
  const int64_t n = (int64_t(1) << 20) + 3;  // more elements than the reduction has threads
  auto x = random_in(dt, size_t(n), 70);
  DeviceValues d_x(x, dt);
  const double cpu_sum_sq = sum_of_squares(cpu_view(x, {n})), cpu_mean = mean_of(cpu_view(x, {n}));
  // fp32 partial sums in both dtypes: bf16 only changes the inputs, which the CPU shares
  EXPECT_NEAR(sum_of_squares(d_x.view({n})), cpu_sum_sq, 1e-5 * cpu_sum_sq);
  // The mean of values uniform in [-1, 1) is near 0: compare on the scale of the values' magnitude.
  EXPECT_NEAR(mean_of(d_x.view({n})), cpu_mean, 1e-5);
}

TEST_F(CudaOps, SumOfSquaresAndMeanMatchCpu) { check_sums(DType::F32); }
TEST_F(CudaOps, SumOfSquaresAndMeanBf16MatchCpu) { check_sums(DType::BF16); }

constexpr float kLr = 1e-2f, kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f, kWeightDecay = 0.1f, kGradScale = 0.5f;

TEST_F(CudaOps, AdamWThreeStepsMatchCpu) {
  const int n = 1003;
  auto param = random_vector(n, 80), m = zeros(n), v = zeros(n);
  DeviceFloats d_param(param), d_m(m), d_v(v);
  for (int step = 1; step <= 3; step++) {
    auto grad = random_vector(n, 80 + step);
    DeviceFloats d_grad(grad);
    adamw_update(cpu_view(param, {n}), Tensor{}, cpu_view(grad, {n}), cpu_view(m, {n}), cpu_view(v, {n}), step, kLr,
                 kBeta1, kBeta2, kEps, kWeightDecay, kGradScale);
    adamw_update(d_param.view({n}), Tensor{}, d_grad.view({n}), d_m.view({n}), d_v.view({n}), step, kLr, kBeta1,
                 kBeta2, kEps, kWeightDecay, kGradScale);
    SCOPED_TRACE("after step " + std::to_string(step));
    EXPECT_TRUE(close(d_param.download(), param, kElementwise));
    EXPECT_TRUE(close(d_m.download(), m, kElementwise));
    EXPECT_TRUE(close(d_v.download(), v, kElementwise));
  }
}

// Mixed precision: the fp32 master weights follow the CPU's fp32 AdamW (given the same bf16
// gradients), and the bf16 parameters are the master weights rounded, bit for bit.
TEST_F(CudaOps, AdamWBf16WithMasterWeightsMatchesCpu) {
  const int n = 1003;
  auto master = random_vector(n, 85), m = zeros(n), v = zeros(n);  // fp32: not rounded
  DeviceValues d_param(as_dtype(master, DType::BF16), DType::BF16);
  DeviceFloats d_master(master), d_m(m), d_v(v);
  for (int step = 1; step <= 3; step++) {
    auto grad = random_in(DType::BF16, n, 85 + step);
    DeviceValues d_grad(grad, DType::BF16);
    adamw_update(cpu_view(master, {n}), Tensor{}, cpu_view(grad, {n}), cpu_view(m, {n}), cpu_view(v, {n}), step,
                 kLr, kBeta1, kBeta2, kEps, kWeightDecay, kGradScale);
    adamw_update(d_param.view({n}), d_master.view({n}), d_grad.view({n}), d_m.view({n}), d_v.view({n}), step, kLr,
                 kBeta1, kBeta2, kEps, kWeightDecay, kGradScale);
    SCOPED_TRACE("after step " + std::to_string(step));
    const auto cuda_master = d_master.download();
    EXPECT_TRUE(close(cuda_master, master, kElementwise)) << "master";
    EXPECT_TRUE(close(d_m.download(), m, kElementwise)) << "m";
    EXPECT_TRUE(close(d_v.download(), v, kElementwise)) << "v";
    const auto bits = d_param.download_bits();
    int differing = 0;
    for (int i = 0; i < n; i++) differing += bits[i] != float_to_bf16(cuda_master[i]);
    EXPECT_EQ(differing, 0) << "bf16 parameters that are not their master weight rounded";
  }
}

// AdamW's version 2 (cuda::adamw_update_fused): one launch over three segments, the middle one without
// weight decay, equal bit for bit to version 1 launched per segment, and close to the CPU's.
TEST_F(CudaOps, FusedAdamWEqualsOneLaunchPerSegment) {
  const int n = 1003;
  const std::vector<int64_t> ends = {300, 337, n};
  const std::vector<bool> decays = {true, false, true};
  auto param = random_vector(n, 90), m = zeros(n), v = zeros(n);
  DeviceFloats fused_param(param), fused_m(m), fused_v(v), each_param(param), each_m(m), each_v(v);
  for (int step = 1; step <= 3; step++) {
    auto grad = random_vector(n, 90 + step);
    DeviceFloats d_grad(grad);
    int64_t begin = 0;
    for (size_t s = 0; s < ends.size(); s++) {
      const int64_t count = ends[s] - begin;
      const float decay = decays[s] ? kWeightDecay : 0.0f;
      auto at = [&](std::vector<float>& x) { return make_view(x.data() + begin, {count}); };
      auto on_gpu = [&](const DeviceFloats& x) { return x.view({n}).slice1d(begin, count); };
      adamw_update(at(param), Tensor{}, at(grad), at(m), at(v), step, kLr, kBeta1, kBeta2, kEps, decay, kGradScale);
      adamw_update(on_gpu(each_param), Tensor{}, on_gpu(d_grad), on_gpu(each_m), on_gpu(each_v), step, kLr, kBeta1,
                   kBeta2, kEps, decay, kGradScale);
      begin = ends[s];
    }
#ifdef GPT_WITH_CUDA
    cuda::adamw_update_fused(DType::F32, fused_param.view({n}).data, nullptr, d_grad.view({n}).data,
                             fused_m.view({n}).f32(), fused_v.view({n}).f32(), size_t(n), ends, decays, step, kLr,
                             kBeta1, kBeta2, kEps, kWeightDecay, kGradScale);
#endif
    SCOPED_TRACE("after step " + std::to_string(step));
    EXPECT_TRUE(close(fused_param.download(), each_param.download(), kExact));
    EXPECT_TRUE(close(fused_m.download(), each_m.download(), kExact));
    EXPECT_TRUE(close(fused_v.download(), each_v.download(), kExact));
    EXPECT_TRUE(close(fused_param.download(), param, kElementwise));
  }
}

// ---------------------------------------------------------------------------------------------------------
// convert_tensor: rounds exactly as bf16.h does, on the GPU and on the CPU

// Values that probe the rounding: ties (to even, either way), the largest finite fp32 (rounds up to
// infinity), infinities, signed zeros, subnormals of fp32 and of bf16, then random values.
std::vector<float> rounding_probes() {
  auto from_bits = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  std::vector<float> probes = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               from_bits(0x3F808000u),  // 1 + 2^-8: a tie, rounds down to the even 1
                               from_bits(0x3F818000u),  // 1 + 3 * 2^-8: a tie, rounds up to the even 1 + 2^-6
                               from_bits(0x3F808001u),  // just above a tie: rounds up
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               from_bits(0x00018000u),  // a subnormal tie
                               1e-40f,
                               -3.0e38f,
                               65504.0f};
  for (float x : random_vector(4093, 100, -1e3f, 1e3f)) probes.push_back(x);
  return probes;
}

std::vector<bf16_bits> bf16_h_bits(const std::vector<float>& values) {
  std::vector<bf16_bits> bits(values.size());
  for (size_t i = 0; i < values.size(); i++) bits[i] = float_to_bf16(values[i]);
  return bits;
}

// The values of bf16 bits, as floats: exact. (Compared with ==, which the probes allow: no NaN.)
std::vector<float> widened(const std::vector<bf16_bits>& bits) {
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); i++) values[i] = bf16_to_float(bits[i]);
  return values;
}

TEST_F(CudaOps, ConvertRoundTripMatchesBf16H) {
  auto probes = rounding_probes();
  const int64_t n = int64_t(probes.size());
  DeviceFloats d_f32(probes), d_back(nans(n));
  DeviceValues d_bf16(nans(n), DType::BF16), d_copy(nans(n), DType::BF16);
  convert_tensor(d_bf16.view({n}), d_f32.view({n}));
  const auto bits = d_bf16.download_bits();
  const auto expected = bf16_h_bits(probes);
  for (int64_t i = 0; i < n; i++) {
    if (bits[i] == expected[i]) continue;
    ADD_FAILURE() << "fp32 -> bf16 of " << probes[i] << " (element " << i << "): bits " << bits[i]
                  << ", bf16.h's float_to_bf16 gives " << expected[i];
    break;  // the first difference says enough
  }

  convert_tensor(d_back.view({n}), d_bf16.view({n}));  // widening is exact
  EXPECT_TRUE(d_back.download() == widened(bits)) << "bf16 -> fp32";

  convert_tensor(d_copy.view({n}), d_bf16.view({n}));  // same dtype: a copy
  EXPECT_TRUE(d_copy.download_bits() == bits) << "bf16 -> bf16";

  // NaN stays NaN (the GPU's canonical NaN and bf16.h's quiet NaN differ in their payload bits)
  DeviceFloats d_nan(nans(3));
  DeviceValues d_nan_bf16(zeros(3), DType::BF16);
  convert_tensor(d_nan_bf16.view({3}), d_nan.view({3}));
  for (float x : d_nan_bf16.download()) EXPECT_TRUE(std::isnan(x));
}

// The CPU side of convert_tensor, which needs no GPU: the same rounding as bf16.h, and back.
TEST(ConvertTensorOnCpu, RoundTripMatchesBf16H) {
  auto probes = rounding_probes();
  const int64_t n = int64_t(probes.size());
  std::vector<bf16_bits> bits(n, 0xFFFFu), copied(n, 0xFFFFu);
  std::vector<float> back(n, NAN);
  convert_tensor(make_view(bits.data(), {n}, DType::BF16), make_view(probes.data(), {n}));
  EXPECT_TRUE(bits == bf16_h_bits(probes)) << "fp32 -> bf16";
  convert_tensor(make_view(back.data(), {n}), make_view(bits.data(), {n}, DType::BF16));
  EXPECT_TRUE(back == widened(bits)) << "bf16 -> fp32";
  convert_tensor(make_view(copied.data(), {n}, DType::BF16), make_view(bits.data(), {n}, DType::BF16));
  EXPECT_TRUE(copied == bits) << "bf16 -> bf16";
}

// ---------------------------------------------------------------------------------------------------------
// GPT-2 small's shapes (model_config.h): warps that loop 32 times over a row of 1024 scores or 24 times
// over 768 channels, softmax blocks that loop 98 times over 50304 logits, 12 heads of 64 channels
// in the strided-batched GEMMs. One sequence (B = 1) keeps the CPU side to a few seconds. The long
// sums here (over up to 1024 keys, 1024 rows, 50304 logits) are weighted by attention probabilities,
// or are of exponentials at most 1, or are the parameter-gradient sums kLongSum is for: the
// tolerances above still apply.

constexpr int kGptT = 1024, kGptC = 768, kGptNH = 12, kGptV = 50304;

TEST_F(CudaOps, AttentionAtGpt2ShapesMatchesCpu) { check_attention(DType::F32, 1, kGptT, kGptC, kGptNH, 90, 1.0f); }

TEST_F(CudaOps, AttentionBf16AtGpt2ShapesMatchesCpu) {
  check_attention(DType::BF16, 1, kGptT, kGptC, kGptNH, 90, 1.0f);
}

TEST_F(CudaOps, LayernormAtGpt2ShapesMatchesCpu) { check_layernorm(DType::F32, kGptC, kGptT); }

TEST_F(CudaOps, SoftmaxCrossentropyAtGpt2VocabularyMatchesCpu) {
  check_softmax_crossentropy(DType::F32, 64, kGptV, random_vector(size_t(64) * kGptV, 93, -3.0f, 3.0f), 94);
}

TEST_F(CudaOps, SoftmaxCrossentropyBf16AtGpt2VocabularyMatchesCpu) {
  check_softmax_crossentropy(DType::BF16, 64, kGptV, random_vector(size_t(64) * kGptV, 93, -3.0f, 3.0f), 94);
}

// A quarter of GPT-2's vocabulary per slice: rows of 12576 logits, 25 per thread of a block.
TEST_F(CudaOps, CrossentropySlicesAtGpt2VocabularyMatchCpu) {
  for (DType dt : {DType::F32, DType::BF16})
    check_crossentropy_slices(dt, 64, kGptV, 4, random_vector(size_t(64) * kGptV, 95, -3.0f, 3.0f), 96);
}

// ---------------------------------------------------------------------------------------------------------
// the emulated link of the NCCL communicator: hold_stream holds the stream for the modelled time,
// timed with events around it (the bounds allow for a launch, not more)

TEST_F(CudaOps, LinkDelayHoldsTheStreamForTheModelledTime) {
#ifdef GPT_WITH_CUDA
  cudaStream_t s = cuda::stream();
  hold_stream(s, 0.0);  // warm-up: the first launch of a kernel loads it
  cudaEvent_t start, end;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&end));
  for (double modelled_ms : {5.0, 0.5}) {
    SCOPED_TRACE("modelled " + std::to_string(modelled_ms) + " ms");
    CUDA_CHECK(cudaEventRecord(start, s));
    hold_stream(s, modelled_ms);
    CUDA_CHECK(cudaEventRecord(end, s));
    CUDA_CHECK(cudaEventSynchronize(end));
    float held_ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&held_ms, start, end));
    EXPECT_GE(held_ms, modelled_ms * 0.999);  // event resolution is about 0.5 us
    EXPECT_LE(held_ms, modelled_ms + 1.0);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(end));
#endif
}

// ---------------------------------------------------------------------------------------------------------
// the counting allocator on the GPU

TEST_F(CudaOps, CudaAllocationsAreCountedAndFreed) {
  const int c = int(MemCategory::Activations);
  const int64_t before = memory_stats().current[c];
  {
    Buffer buffer(1000, MemCategory::Activations, DType::F32, Device::CUDA);
    EXPECT_EQ(memory_stats().current[c], before + 4000);
    std::vector<float> host(1000, 1.0f);
#ifdef GPT_WITH_CUDA
    CUDA_CHECK(cudaMemcpy(host.data(), buffer.data(), 4000, cudaMemcpyDeviceToHost));
#endif
    EXPECT_TRUE(close(host, zeros(1000), kExact)) << "device_alloc must zero-fill";
  }
  EXPECT_EQ(memory_stats().current[c], before);
}

}  // namespace
