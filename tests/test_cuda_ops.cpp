// test_cuda_ops.cpp: every CUDA op against the CPU op, through the public calls of ops.h. The same
// inputs go into CPU tensors and into CUDA tensors (allocated by device_alloc, so the counting
// allocator's CUDA path is tested too); both ops run; the results are compared with allclose. The CPU
// ops are themselves checked against float64 references (test_ops.cpp), so agreement here means the
// CUDA ops are right. Backward tests start from nonzero gradients: the ops must accumulate.
// Sizes are odd and cross the kernels' boundaries: T = 37 rows of scores (more than a warp's 32
// lanes), C = 130 channels, V = 1000 logits (more than the 512 threads of a softmax block). Then the
// same ops at GPT-2 small's shapes (T = 1024, C = 768, NH = 12, V = 50304), where every loop goes
// around many times, and the link delay of the NCCL communicator (link_delay.h).
//
// Without a GPU, or in a build without CUDA, every test is skipped: "no CUDA device: <why>".
//
// Tolerances (|cuda - cpu| <= atol + rtol * |cpu|). Both sides compute in fp32; they differ only in
// rounding: other summation orders, fused multiply-adds (nvcc contracts a*b + c, g++ -std=c++17 does
// not), and the GPU's expf/tanhf against glibc's.
//   exact (0, 0):        one rounding per element in the same order on both sides: encoder forward and
//                        backward (the backward adds in the CPU's order), residual, copy, add, scale
//   kElementwise:        a few roundings and a library function per element (GELU, AdamW, softmax
//                        backward): atol 1e-6, rtol 1e-5
//   kReduction:          sums of up to ~130 terms of order 1 (layernorm, matmul, attention, softmax):
//                        atol 1e-5, rtol 1e-4
//   kLongSum:            sums over all rows (parameter gradients) or 2^20 elements: atol 1e-4, rtol 1e-4
//                        (sum_of_squares and mean_of: relative 1e-5, fp32 partial sums vs double)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "device.h"  // cuda_device_count
#include "memory.h"  // Buffer, memory_stats
#include "ops.h"
#include "test_util.h"
#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "link_delay.h"  // LinkDelay
#include "ops_cuda.h"    // cuda::synchronize, cuda::stream
#endif

namespace {

struct Tolerance {
  double atol, rtol;
};
constexpr Tolerance kExact{0.0, 0.0};
constexpr Tolerance kElementwise{1e-6, 1e-5};
constexpr Tolerance kReduction{1e-5, 1e-4};
constexpr Tolerance kLongSum{1e-4, 1e-4};

::testing::AssertionResult close(const std::vector<float>& cuda, const std::vector<float>& cpu, Tolerance tol) {
  return allclose(cuda, cpu, tol.atol, tol.rtol);
}

// Every test skips, saying why, where no GPU can run it.
class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// A CUDA copy of host values (float or int), freed when it goes out of scope.
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

Tensor cpu_view(std::vector<float>& values, std::initializer_list<int64_t> shape) {
  Tensor t = make_view(values.data(), shape);
  EXPECT_EQ(size_t(t.numel()), values.size()) << "test bug: shape does not match the vector";
  return t;
}

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }

constexpr int B = 2, T = 37, C = 48, NH = 4, V = 1000;

// ---------------------------------------------------------------------------------------------------------
// encoder

TEST_F(CudaOps, EncoderForwardMatchesCpuWithHostAndDeviceTokens) {
  const int maxT = T + 3;
  auto tokens = random_ints(B * T, V, 1);
  auto wte = random_vector(size_t(V) * C, 2), wpe = random_vector(size_t(maxT) * C, 3);
  auto out = zeros(size_t(B) * T * C);
  encoder_forward(cpu_view(out, {B, T, C}), tokens.data(), cpu_view(wte, {V, C}), cpu_view(wpe, {maxT, C}), B, T);

  DeviceFloats d_wte(wte), d_wpe(wpe), d_out(zeros(out.size()));
  encoder_forward(d_out.view({B, T, C}), tokens.data(), d_wte.view({V, C}), d_wpe.view({maxT, C}), B, T);
  EXPECT_TRUE(close(d_out.download(), out, kExact)) << "host tokens";

  DeviceInts d_tokens(tokens);
  DeviceFloats d_out2(zeros(out.size()));
  encoder_forward(d_out2.view({B, T, C}), d_tokens.data(), d_wte.view({V, C}), d_wpe.view({maxT, C}), B, T);
  EXPECT_TRUE(close(d_out2.download(), out, kExact)) << "device tokens";
}

TEST_F(CudaOps, EncoderBackwardAccumulatesExactlyAsCpu) {
  const int maxT = T + 3;
  auto tokens = random_ints(B * T, 5, 4);  // ids below 5: every token repeats, its gradients add up
  auto dout = random_vector(size_t(B) * T * C, 5);
  auto dwte = random_vector(size_t(V) * C, 6), dwpe = random_vector(size_t(maxT) * C, 7);  // nonzero: +=
  DeviceFloats d_dwte(dwte), d_dwpe(dwpe), d_dout(dout);
  encoder_backward(cpu_view(dwte, {V, C}), cpu_view(dwpe, {maxT, C}), cpu_view(dout, {B, T, C}), tokens.data(), B,
                   T);
  encoder_backward(d_dwte.view({V, C}), d_dwpe.view({maxT, C}), d_dout.view({B, T, C}), tokens.data(), B, T);
  // Exact: the kernel adds each position's gradient in the CPU's order, with no atomics.
  EXPECT_TRUE(close(d_dwte.download(), dwte, kExact));
  EXPECT_TRUE(close(d_dwpe.download(), dwpe, kExact));
}

// ---------------------------------------------------------------------------------------------------------
// layernorm: rows of 7 channels (fewer than a warp's lanes) and of 130 (each lane takes several)

void check_layernorm(int LC, int N = B * T) {
  SCOPED_TRACE("C = " + std::to_string(LC) + ", N = " + std::to_string(N));
  auto inp = random_vector(size_t(N) * LC, 10, 2.0f, 4.0f);  // offset from 0: the mean matters
  auto weight = random_vector(LC, 11, 0.5f, 1.5f), bias = random_vector(LC, 12);
  auto dout = random_vector(size_t(N) * LC, 13);
  auto out = zeros(size_t(N) * LC), mean = zeros(N), rstd = zeros(N);
  auto dinp = random_vector(size_t(N) * LC, 14), dweight = random_vector(LC, 15), dbias = random_vector(LC, 16);
  DeviceFloats d_inp(inp), d_weight(weight), d_bias(bias), d_dout(dout), d_out(out), d_mean(mean), d_rstd(rstd);
  DeviceFloats d_dinp(dinp), d_dweight(dweight), d_dbias(dbias);

  layernorm_forward(cpu_view(out, {N, LC}), cpu_view(mean, {N}), cpu_view(rstd, {N}), cpu_view(inp, {N, LC}),
                    cpu_view(weight, {LC}), cpu_view(bias, {LC}));
  layernorm_forward(d_out.view({N, LC}), d_mean.view({N}), d_rstd.view({N}), d_inp.view({N, LC}),
                    d_weight.view({LC}), d_bias.view({LC}));
  EXPECT_TRUE(close(d_out.download(), out, kReduction));
  EXPECT_TRUE(close(d_mean.download(), mean, kReduction));
  EXPECT_TRUE(close(d_rstd.download(), rstd, kReduction));

  // Each backward uses its own side's mean and rstd, as in training.
  layernorm_backward(cpu_view(dinp, {N, LC}), cpu_view(dweight, {LC}), cpu_view(dbias, {LC}), cpu_view(dout, {N, LC}),
                     cpu_view(inp, {N, LC}), cpu_view(weight, {LC}), cpu_view(mean, {N}), cpu_view(rstd, {N}));
  layernorm_backward(d_dinp.view({N, LC}), d_dweight.view({LC}), d_dbias.view({LC}), d_dout.view({N, LC}),
                     d_inp.view({N, LC}), d_weight.view({LC}), d_mean.view({N}), d_rstd.view({N}));
  EXPECT_TRUE(close(d_dinp.download(), dinp, kReduction));
  EXPECT_TRUE(close(d_dweight.download(), dweight, kLongSum));
  EXPECT_TRUE(close(d_dbias.download(), dbias, kLongSum));
}

TEST_F(CudaOps, LayernormForwardAndBackwardMatchCpu) {
  check_layernorm(7);
  check_layernorm(130);
}

// ---------------------------------------------------------------------------------------------------------
// matmul: odd shapes, no multiple of any tile size

constexpr int MN = 67, MC = 129, MOC = 97;

TEST_F(CudaOps, MatmulForwardMatchesCpuWithAndWithoutBias) {
  auto inp = random_vector(size_t(MN) * MC, 20), weight = random_vector(size_t(MOC) * MC, 21);
  auto bias = random_vector(MOC, 22);
  DeviceFloats d_inp(inp), d_weight(weight), d_bias(bias);

  auto out = zeros(size_t(MN) * MOC);
  matmul_forward(cpu_view(out, {MN, MOC}), cpu_view(inp, {MN, MC}), cpu_view(weight, {MOC, MC}),
                 cpu_view(bias, {MOC}));
  DeviceFloats d_out(zeros(out.size()));
  matmul_forward(d_out.view({MN, MOC}), d_inp.view({MN, MC}), d_weight.view({MOC, MC}), d_bias.view({MOC}));
  EXPECT_TRUE(close(d_out.download(), out, kReduction)) << "with bias";

  // Without a bias, stale contents of out (even NaN) must not leak into the result.
  matmul_forward(cpu_view(out, {MN, MOC}), cpu_view(inp, {MN, MC}), cpu_view(weight, {MOC, MC}), Tensor{});
  DeviceFloats d_stale(std::vector<float>(out.size(), NAN));
  matmul_forward(d_stale.view({MN, MOC}), d_inp.view({MN, MC}), d_weight.view({MOC, MC}), Tensor{});
  EXPECT_TRUE(close(d_stale.download(), out, kReduction)) << "without bias";
}

TEST_F(CudaOps, MatmulBackwardAccumulatesAsCpu) {
  auto inp = random_vector(size_t(MN) * MC, 23), weight = random_vector(size_t(MOC) * MC, 24);
  auto dout = random_vector(size_t(MN) * MOC, 25);
  DeviceFloats d_inp(inp), d_weight(weight), d_dout(dout);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with dbias" : "without dbias");
    auto dinp = random_vector(size_t(MN) * MC, 26), dweight = random_vector(size_t(MOC) * MC, 27);
    auto dbias = random_vector(MOC, 28);
    DeviceFloats d_dinp(dinp), d_dweight(dweight), d_dbias(dbias);
    matmul_backward(cpu_view(dinp, {MN, MC}), cpu_view(dweight, {MOC, MC}),
                    with_bias ? cpu_view(dbias, {MOC}) : Tensor{}, cpu_view(dout, {MN, MOC}), cpu_view(inp, {MN, MC}),
                    cpu_view(weight, {MOC, MC}));
    matmul_backward(d_dinp.view({MN, MC}), d_dweight.view({MOC, MC}), with_bias ? d_dbias.view({MOC}) : Tensor{},
                    d_dout.view({MN, MOC}), d_inp.view({MN, MC}), d_weight.view({MOC, MC}));
    EXPECT_TRUE(close(d_dinp.download(), dinp, kReduction));
    EXPECT_TRUE(close(d_dweight.download(), dweight, kReduction));
    EXPECT_TRUE(close(d_dbias.download(), dbias, kLongSum));  // unchanged when without
  }
}

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

TEST_F(CudaOps, AttentionForwardAndBackwardMatchCpu) {
  const size_t scores = size_t(B) * NH * T * T;
  auto qkv = random_vector(size_t(B) * T * 3 * C, 30, -2.0f, 2.0f), dout = random_vector(size_t(B) * T * C, 31);
  auto out = zeros(size_t(B) * T * C), preatt = zeros(scores), att = zeros(scores);
  DeviceFloats d_qkv(qkv), d_dout(dout), d_out(out), d_preatt(preatt), d_att(att);

  attention_forward(cpu_view(out, {B, T, C}), cpu_view(preatt, {B, NH, T, T}), cpu_view(att, {B, NH, T, T}),
                    cpu_view(qkv, {B, T, 3 * C}), NH);
  attention_forward(d_out.view({B, T, C}), d_preatt.view({B, NH, T, T}), d_att.view({B, NH, T, T}),
                    d_qkv.view({B, T, 3 * C}), NH);
  EXPECT_TRUE(close(d_out.download(), out, kReduction));
  EXPECT_TRUE(close(d_att.download(), att, kReduction));  // including the zeros above the diagonal
  EXPECT_TRUE(close(causal_part(d_preatt.download()), causal_part(preatt), kReduction));

  auto dqkv = random_vector(qkv.size(), 32), dpreatt = zeros(scores), datt = zeros(scores);
  DeviceFloats d_dqkv(dqkv), d_dpreatt(dpreatt), d_datt(datt);
  attention_backward(cpu_view(dqkv, {B, T, 3 * C}), cpu_view(dpreatt, {B, NH, T, T}), cpu_view(datt, {B, NH, T, T}),
                     cpu_view(dout, {B, T, C}), cpu_view(qkv, {B, T, 3 * C}), cpu_view(att, {B, NH, T, T}), NH);
  attention_backward(d_dqkv.view({B, T, 3 * C}), d_dpreatt.view({B, NH, T, T}), d_datt.view({B, NH, T, T}),
                     d_dout.view({B, T, C}), d_qkv.view({B, T, 3 * C}), d_att.view({B, NH, T, T}), NH);
  EXPECT_TRUE(close(d_dqkv.download(), dqkv, kReduction));
  EXPECT_TRUE(close(causal_part(d_dpreatt.download()), causal_part(dpreatt), kReduction));
}

TEST_F(CudaOps, AttentionIsDeterministic) {
  const size_t scores = size_t(B) * NH * T * T;
  auto qkv = random_vector(size_t(B) * T * 3 * C, 33, -2.0f, 2.0f), dout = random_vector(size_t(B) * T * C, 34);
  DeviceFloats d_qkv(qkv), d_dout(dout), d_out(zeros(size_t(B) * T * C));
  DeviceFloats d_preatt(zeros(scores)), d_att(zeros(scores));
  attention_forward(d_out.view({B, T, C}), d_preatt.view({B, NH, T, T}), d_att.view({B, NH, T, T}),
                    d_qkv.view({B, T, 3 * C}), NH);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; run++) {
    DeviceFloats d_dqkv(zeros(qkv.size())), d_dpreatt(zeros(scores)), d_datt(zeros(scores));
    attention_backward(d_dqkv.view({B, T, 3 * C}), d_dpreatt.view({B, NH, T, T}), d_datt.view({B, NH, T, T}),
                       d_dout.view({B, T, C}), d_qkv.view({B, T, 3 * C}), d_att.view({B, NH, T, T}), NH);
    runs.push_back(d_dqkv.download());
  }
  EXPECT_TRUE(close(runs[1], runs[0], kExact)) << "two runs of the same backward differ";
}

// ---------------------------------------------------------------------------------------------------------
// GELU and residual

TEST_F(CudaOps, GeluForwardAndBackwardMatchCpu) {
  const size_t n = size_t(B) * T * 4 * C;
  auto inp = random_vector(n, 40, -4.0f, 4.0f), dout = random_vector(n, 41), out = zeros(n);
  auto dinp = random_vector(n, 42);
  DeviceFloats d_inp(inp), d_dout(dout), d_out(out), d_dinp(dinp);
  gelu_forward(cpu_view(out, {int64_t(n)}), cpu_view(inp, {int64_t(n)}));
  gelu_forward(d_out.view({int64_t(n)}), d_inp.view({int64_t(n)}));
  EXPECT_TRUE(close(d_out.download(), out, kElementwise));
  gelu_backward(cpu_view(dinp, {int64_t(n)}), cpu_view(inp, {int64_t(n)}), cpu_view(dout, {int64_t(n)}));
  gelu_backward(d_dinp.view({int64_t(n)}), d_inp.view({int64_t(n)}), d_dout.view({int64_t(n)}));
  EXPECT_TRUE(close(d_dinp.download(), dinp, kElementwise));
}

TEST_F(CudaOps, ResidualForwardAndBackwardAreExact) {
  const int64_t n = int64_t(B) * T * C;
  auto a = random_vector(n, 43), b = random_vector(n, 44), dout = random_vector(n, 45), out = zeros(n);
  auto da = random_vector(n, 46), db = random_vector(n, 47);
  DeviceFloats d_a(a), d_b(b), d_dout(dout), d_out(out), d_da(da), d_db(db);
  residual_forward(cpu_view(out, {n}), cpu_view(a, {n}), cpu_view(b, {n}));
  residual_forward(d_out.view({n}), d_a.view({n}), d_b.view({n}));
  EXPECT_TRUE(close(d_out.download(), out, kExact));
  residual_backward(cpu_view(da, {n}), cpu_view(db, {n}), cpu_view(dout, {n}));
  residual_backward(d_da.view({n}), d_db.view({n}), d_dout.view({n}));
  EXPECT_TRUE(close(d_da.download(), da, kExact));
  EXPECT_TRUE(close(d_db.download(), db, kExact));
}

// ---------------------------------------------------------------------------------------------------------
// softmax + cross-entropy: V = 1000 logits per row

TEST_F(CudaOps, SoftmaxCrossentropyMatchesCpuWithHostAndDeviceTargets) {
  const int N = B * T;
  auto logits = random_vector(size_t(N) * V, 50, -3.0f, 3.0f);
  for (int v = 0; v < V; v++) logits[size_t(3) * V + v] += 100.0f;  // exp(100) overflows fp32: max subtraction
  auto targets = random_ints(N, V, 51);
  auto losses = zeros(N), probs = zeros(size_t(N) * V), dlogits = random_vector(size_t(N) * V, 52);
  DeviceFloats d_logits(logits), d_losses(losses), d_probs(probs), d_dlogits(dlogits);
  DeviceInts d_targets(targets);
  const float dloss = 1.0f / float(N);

  softmax_crossentropy_forward(cpu_view(losses, {B, T}), cpu_view(probs, {B, T, V}), cpu_view(logits, {B, T, V}),
                               targets.data());
  softmax_crossentropy_forward(d_losses.view({B, T}), d_probs.view({B, T, V}), d_logits.view({B, T, V}),
                               targets.data());
  EXPECT_TRUE(close(d_losses.download(), losses, kReduction)) << "host targets";
  EXPECT_TRUE(close(d_probs.download(), probs, kReduction)) << "host targets";
  DeviceFloats d_losses2(zeros(N));
  softmax_crossentropy_forward(d_losses2.view({B, T}), d_probs.view({B, T, V}), d_logits.view({B, T, V}),
                               d_targets.data());
  EXPECT_TRUE(close(d_losses2.download(), losses, kReduction)) << "device targets";

  softmax_crossentropy_backward(cpu_view(dlogits, {B, T, V}), cpu_view(probs, {B, T, V}), targets.data(), dloss);
  softmax_crossentropy_backward(d_dlogits.view({B, T, V}), d_probs.view({B, T, V}), d_targets.data(), dloss);
  EXPECT_TRUE(close(d_dlogits.download(), dlogits, kElementwise));
}

// ---------------------------------------------------------------------------------------------------------
// helpers, reductions, AdamW

TEST_F(CudaOps, FillCopyAddScaleAreExact) {
  const int n = 1001;
  auto a = random_vector(n, 60), b = random_vector(n, 61), dst = random_vector(n, 62);
  DeviceFloats d_a(a), d_b(b), d_dst(dst);
  copy_tensor(cpu_view(dst, {n}), cpu_view(a, {7, 11, 13}));
  copy_tensor(d_dst.view({n}), d_a.view({7, 11, 13}));
  EXPECT_TRUE(close(d_dst.download(), dst, kExact)) << "copy";
  add_inplace(cpu_view(dst, {n}), cpu_view(b, {n}));
  add_inplace(d_dst.view({n}), d_b.view({n}));
  EXPECT_TRUE(close(d_dst.download(), dst, kExact)) << "add";
  scale_inplace(cpu_view(dst, {n}), -0.3f);
  scale_inplace(d_dst.view({n}), -0.3f);
  EXPECT_TRUE(close(d_dst.download(), dst, kExact)) << "scale";
  fill_zero(d_dst.view({n}));
  EXPECT_TRUE(close(d_dst.download(), zeros(n), kExact)) << "fill";
}

TEST_F(CudaOps, SumOfSquaresAndMeanMatchCpu) {
  const int64_t n = (int64_t(1) << 20) + 3;  // more elements than the reduction has threads
  auto x = random_vector(size_t(n), 70);
  DeviceFloats d_x(x);
  const double cpu_sum_sq = sum_of_squares(cpu_view(x, {n})), cpu_mean = mean_of(cpu_view(x, {n}));
  EXPECT_NEAR(sum_of_squares(d_x.view({n})), cpu_sum_sq, 1e-5 * cpu_sum_sq);
  // The mean of values uniform in [-1, 1) is near 0: compare on the scale of the values' magnitude.
  EXPECT_NEAR(mean_of(d_x.view({n})), cpu_mean, 1e-5);
}

TEST_F(CudaOps, AdamWThreeStepsMatchCpu) {
  const int n = 1003;
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
  auto param = random_vector(n, 80), m = zeros(n), v = zeros(n);
  DeviceFloats d_param(param), d_m(m), d_v(v);
  for (int step = 1; step <= 3; step++) {
    auto grad = random_vector(n, 80 + step);
    DeviceFloats d_grad(grad);
    adamw_update(cpu_view(param, {n}), cpu_view(grad, {n}), cpu_view(m, {n}), cpu_view(v, {n}), step, lr, beta1,
                 beta2, eps, weight_decay, grad_scale);
    adamw_update(d_param.view({n}), d_grad.view({n}), d_m.view({n}), d_v.view({n}), step, lr, beta1, beta2, eps,
                 weight_decay, grad_scale);
    SCOPED_TRACE("after step " + std::to_string(step));
    EXPECT_TRUE(close(d_param.download(), param, kElementwise));
    EXPECT_TRUE(close(d_m.download(), m, kElementwise));
    EXPECT_TRUE(close(d_v.download(), v, kElementwise));
  }
}

// ---------------------------------------------------------------------------------------------------------
// GPT-2 small's shapes (model_config.h): warps that loop 32 times over a row of 1024 scores or 24 times
// over 768 channels, softmax blocks that loop 98 times over 50304 logits, 12 heads of 64 channels
// in the strided-batched GEMMs. One sequence (B = 1) keeps the CPU side to a few seconds. The long
// sums here (over up to 1024 keys, 1024 rows, 50304 logits) are weighted by attention probabilities,
// or are of exponentials at most 1, or are the parameter-gradient sums kLongSum is for: the
// tolerances above still apply.

constexpr int kGptT = 1024, kGptC = 768, kGptNH = 12, kGptV = 50304;

TEST_F(CudaOps, AttentionAtGpt2ShapesMatchesCpu) {
  const int GB = 1;
  const size_t scores = size_t(GB) * kGptNH * kGptT * kGptT;
  auto qkv = random_vector(size_t(GB) * kGptT * 3 * kGptC, 90), dout = random_vector(size_t(GB) * kGptT * kGptC, 91);
  auto out = zeros(size_t(GB) * kGptT * kGptC), preatt = zeros(scores), att = zeros(scores);
  DeviceFloats d_qkv(qkv), d_dout(dout), d_out(out), d_preatt(preatt), d_att(att);
  const auto qkv_shape = {int64_t(GB), int64_t(kGptT), int64_t(3 * kGptC)};
  const auto out_shape = {int64_t(GB), int64_t(kGptT), int64_t(kGptC)};
  const auto scores_shape = {int64_t(GB), int64_t(kGptNH), int64_t(kGptT), int64_t(kGptT)};

  attention_forward(cpu_view(out, out_shape), cpu_view(preatt, scores_shape), cpu_view(att, scores_shape),
                    cpu_view(qkv, qkv_shape), kGptNH);
  attention_forward(d_out.view(out_shape), d_preatt.view(scores_shape), d_att.view(scores_shape),
                    d_qkv.view(qkv_shape), kGptNH);
  EXPECT_TRUE(close(d_out.download(), out, kReduction));
  EXPECT_TRUE(close(d_att.download(), att, kReduction));

  auto dqkv = random_vector(qkv.size(), 92), dpreatt = zeros(scores), datt = zeros(scores);
  DeviceFloats d_dqkv(dqkv), d_dpreatt(dpreatt), d_datt(datt);
  attention_backward(cpu_view(dqkv, qkv_shape), cpu_view(dpreatt, scores_shape), cpu_view(datt, scores_shape),
                     cpu_view(dout, out_shape), cpu_view(qkv, qkv_shape), cpu_view(att, scores_shape), kGptNH);
  attention_backward(d_dqkv.view(qkv_shape), d_dpreatt.view(scores_shape), d_datt.view(scores_shape),
                     d_dout.view(out_shape), d_qkv.view(qkv_shape), d_att.view(scores_shape), kGptNH);
  EXPECT_TRUE(close(d_dqkv.download(), dqkv, kReduction));
  EXPECT_TRUE(close(causal_part(d_dpreatt.download(), GB * kGptNH, kGptT), causal_part(dpreatt, GB * kGptNH, kGptT),
                    kReduction));
}

TEST_F(CudaOps, LayernormAtGpt2ShapesMatchesCpu) { check_layernorm(kGptC, kGptT); }

TEST_F(CudaOps, SoftmaxCrossentropyAtGpt2VocabularyMatchesCpu) {
  const int N = 64;
  auto logits = random_vector(size_t(N) * kGptV, 93, -3.0f, 3.0f);
  auto targets = random_ints(N, kGptV, 94);
  auto losses = zeros(N), probs = zeros(size_t(N) * kGptV), dlogits = random_vector(size_t(N) * kGptV, 95);
  DeviceFloats d_logits(logits), d_losses(losses), d_probs(probs), d_dlogits(dlogits);
  DeviceInts d_targets(targets);
  const float dloss = 1.0f / float(N);
  softmax_crossentropy_forward(cpu_view(losses, {N}), cpu_view(probs, {N, kGptV}), cpu_view(logits, {N, kGptV}),
                               targets.data());
  softmax_crossentropy_forward(d_losses.view({N}), d_probs.view({N, kGptV}), d_logits.view({N, kGptV}),
                               d_targets.data());
  EXPECT_TRUE(close(d_losses.download(), losses, kReduction));
  EXPECT_TRUE(close(d_probs.download(), probs, kReduction));
  softmax_crossentropy_backward(cpu_view(dlogits, {N, kGptV}), cpu_view(probs, {N, kGptV}), targets.data(), dloss);
  softmax_crossentropy_backward(d_dlogits.view({N, kGptV}), d_probs.view({N, kGptV}), d_targets.data(), dloss);
  EXPECT_TRUE(close(d_dlogits.download(), dlogits, kElementwise));
}

// ---------------------------------------------------------------------------------------------------------
// the emulated link of the NCCL communicator: begin() and end() around nothing hold the stream for
// the modelled time, timed with events around them (the bounds allow for launches, not more)

TEST_F(CudaOps, LinkDelayHoldsTheStreamForTheModelledTime) {
#ifdef GPT_WITH_CUDA
  LinkDelay delay;
  cudaStream_t s = cuda::stream();
  delay.begin(s);  // warm-up: the first launch of a kernel loads it, which the host does in between
  delay.end(s, 0.0);
  cudaEvent_t start, end;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&end));
  for (double modelled_ms : {5.0, 0.5}) {
    SCOPED_TRACE("modelled " + std::to_string(modelled_ms) + " ms");
    CUDA_CHECK(cudaEventRecord(start, s));
    delay.begin(s);
    delay.end(s, modelled_ms);
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
