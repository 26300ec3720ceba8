// test_flash_attention.cpp: FlashAttention (common/ops/attention_flash.cu) against the CPU's materialized
// attention (ops_cpu.cpp) on the same bf16-rounded inputs: output, the saved log-sum-exp and every
// gradient, at each head size it supports, with T a multiple of the 64-row tile and not. Runs only
// on a GPU; skips elsewhere, saying why.
//
// Tolerance: the GPU rounds the probabilities and the gradient of the scores to bf16 (8 significant
// bits, relative error up to 2^-9) before they enter a product, and stores its results in bf16;
// sums over up to T keys average those roundings out. 3e-2 relative to the largest reference value
// (atol) plus 3e-2 of each element fails an indexing or masking bug, whose error is of the order
// of the values themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/bf16.h"
#include "ops/device.h"
#include "ops/memory.h"
#include "ops/ops.h"
#include "test_util.h"

namespace {

constexpr double kRtol = 3e-2, kAtolShare = 3e-2;

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

// A bf16 copy of `values` on the GPU.
Buffer upload_bf16(const std::vector<float>& values) {
  Buffer host(int64_t(values.size()), MemCategory::Other, DType::BF16, Device::CPU);
  convert_tensor(host.view(), make_view(const_cast<float*>(values.data()), {int64_t(values.size())}));
  Buffer device(int64_t(values.size()), MemCategory::Other, DType::BF16, Device::CUDA);
  transfer(device.view(), host.view());
  return device;
}

std::vector<float> download(const Buffer& device) {
  synchronize(Device::CUDA);
  Buffer host(device.count(), MemCategory::Other, device.view().dtype, Device::CPU);
  transfer(host.view(), device.view());
  std::vector<float> values(size_t(device.count()));
  if (device.view().dtype == DType::F32) {
    std::copy(host.f32(), host.f32() + device.count(), values.begin());
  } else {
    convert_tensor(make_view(values.data(), {device.count()}), host.view());
  }
  return values;
}

::testing::AssertionResult close_to(const std::vector<float>& got, const std::vector<float>& want) {
  double largest = 0;
  for (float x : want) largest = std::max(largest, double(std::fabs(x)));
  return allclose(got, to_double(want), kAtolShare * largest, kRtol);
}

struct Shape {
  int B, T, C, NH;
};

class FlashAttention : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

TEST_P(FlashAttention, MatchesMaterializedAttentionForwardAndBackward) {
  const auto [B, T, C, NH] = GetParam();
  ASSERT_TRUE(flash_attention_available(DType::BF16, Device::CUDA, C, NH));
  const std::vector<float> qkv = rounded(random_vector(size_t(B) * T * 3 * C, 71, -2.0f, 2.0f));
  const std::vector<float> dout = rounded(random_vector(size_t(B) * T * C, 72));
  const std::vector<float> dqkv_before = rounded(random_vector(qkv.size(), 73));  // backward adds to it

  // CPU reference, fp32, on the same rounded inputs.
  std::vector<float> out(size_t(B) * T * C), preatt(size_t(B) * NH * T * T), att(preatt.size());
  std::vector<float> dqkv = dqkv_before, dpreatt(preatt.size()), datt(preatt.size());
  auto view = [](std::vector<float>& v, std::initializer_list<int64_t> shape) { return make_view(v.data(), shape); };
  std::vector<float> qkv_cpu = qkv, dout_cpu = dout;
  attention_forward(view(out, {B, T, C}), view(preatt, {B, NH, T, T}), view(att, {B, NH, T, T}),
                    view(qkv_cpu, {B, T, 3 * C}), NH);
  attention_backward(view(dqkv, {B, T, 3 * C}), view(dpreatt, {B, NH, T, T}), view(datt, {B, NH, T, T}),
                     view(dout_cpu, {B, T, C}), view(qkv_cpu, {B, T, 3 * C}), view(att, {B, NH, T, T}), NH);
  // lse of each row from the CPU's scores: log sum_{t2 <= t} exp(preatt).
  std::vector<float> lse_ref(size_t(B) * NH * T);
  for (size_t row = 0; row < lse_ref.size(); row++) {
    const int t = int(row % T);
    double m = -INFINITY, sum = 0;
    for (int t2 = 0; t2 <= t; t2++) m = std::max(m, double(preatt[row * T + t2]));
    for (int t2 = 0; t2 <= t; t2++) sum += std::exp(double(preatt[row * T + t2]) - m);
    lse_ref[row] = float(m + std::log(sum));
  }

  // GPU, poisoned outputs first: every element must be written.
  const Buffer d_qkv = upload_bf16(qkv), d_dout = upload_bf16(dout), d_dqkv = upload_bf16(dqkv_before);
  Buffer d_out = upload_bf16(std::vector<float>(out.size(), NAN));
  Buffer d_lse(int64_t(lse_ref.size()), MemCategory::Other, DType::F32, Device::CUDA);
  std::vector<float> nan_lse(lse_ref.size(), NAN);
  transfer(d_lse.view(), make_view(nan_lse.data(), {int64_t(nan_lse.size())}));
  auto shaped = [](const Buffer& b, std::initializer_list<int64_t> shape) {
    Tensor t = b.view();
    Tensor s = make_view(t.data, shape, t.dtype, t.device);
    return s;
  };
  attention_forward_flash(shaped(d_out, {B, T, C}), shaped(d_lse, {B, NH, T}), shaped(d_qkv, {B, T, 3 * C}), NH);
  attention_backward_flash(shaped(d_dqkv, {B, T, 3 * C}), shaped(d_dout, {B, T, C}), shaped(d_qkv, {B, T, 3 * C}),
                           shaped(d_out, {B, T, C}), shaped(d_lse, {B, NH, T}), NH);

  EXPECT_TRUE(close_to(download(d_out), out)) << "output";
  EXPECT_TRUE(allclose(download(d_lse), to_double(lse_ref), 1e-3, 1e-3)) << "log-sum-exp";
  // The gradient part by part: q, k and v columns of each row.
  const std::vector<float> got = download(d_dqkv);
  for (int part = 0; part < 3; part++) {
    std::vector<float> g, w;
    for (size_t row = 0; row < size_t(B) * T; row++)
      for (int c = 0; c < C; c++) {
        g.push_back(got[row * 3 * C + part * C + c]);
        w.push_back(dqkv[row * 3 * C + part * C + c]);
      }
    EXPECT_TRUE(close_to(g, w)) << "gradient of " << "qkv"[part];
  }
}

INSTANTIATE_TEST_SUITE_P(HeadSizes, FlashAttention,
                         ::testing::Values(Shape{2, 64, 64, 4},     // D = 16, one tile
                                           Shape{2, 100, 128, 4},   // D = 32, a partial second tile
                                           Shape{1, 200, 128, 2},   // D = 64, four tiles, the last partial
                                           Shape{2, 130, 256, 2}),  // D = 128
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "D" + std::to_string(info.param.C / info.param.NH) + "_T" +
                                  std::to_string(info.param.T);
                         });

TEST(FlashAttentionAvailability, OnlyBf16OnCudaWithTileableHeads) {
  EXPECT_FALSE(flash_attention_available(DType::F32, Device::CUDA, 768, 12));
  EXPECT_FALSE(flash_attention_available(DType::BF16, Device::CPU, 768, 12));
  EXPECT_FALSE(flash_attention_available(DType::BF16, Device::CUDA, 15, 3));  // head size 5
#ifdef GPT_WITH_CUDA
  EXPECT_TRUE(flash_attention_available(DType::BF16, Device::CUDA, 768, 12));  // GPT-2: head size 64
#else
  EXPECT_FALSE(flash_attention_available(DType::BF16, Device::CUDA, 768, 12));  // no CUDA in this build
#endif
}

}  // namespace
