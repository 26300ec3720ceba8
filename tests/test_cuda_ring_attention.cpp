// test_cuda_ring_attention.cpp: ring attention's CUDA kernels (ring_attention_cuda.cu) against the CPU
// kernels of ring_attention.h, through the same public calls: each call runs once on CPU rows and once
// on CUDA rows holding the same values, and the results are compared. The CPU kernels are checked
// against the unsplit attention in test_ring_attention.cpp and test_ring_protocol.cpp, so agreement
// here means the GPU's ring is right too.
//
// The case is a ring of two on a zigzag split of T = 40 (rank 0 holds positions 0-9 and 30-39, rank 1
// 10-29): rank 0's queries fold its own block and then rank 1's, in which positions 0-9 see nothing
// (rows the mask empties must keep their state) and 30-39 see everything. Head sizes 32 and 128, the
// smallest and largest the kernels take (one and four channels per lane). Backward gradients start
// nonzero: the kernels accumulate.
// Tolerance (fp32 on both sides, other summation orders and expf against cpu::fast_exp, 2 ulps):
// atol 1e-5, rtol 1e-4, as test_cuda_ops.cpp's kReduction; pack_kv and add_kv_grad are exact.
//
// Without a GPU every test but the head-size refusal is skipped: "no CUDA device: <why>".
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "parallel/context_split.h"  // context_positions
#include "ops/device.h"         // cuda_device_count
#include "ops/memory.h"         // Buffer
#include "ops/ring_attention.h"
#include "test_util.h"
#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "base/cuda_check.h"
#include "ops/ops_cuda.h"  // cuda::synchronize
#endif

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

class CudaRingAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// The same values on the CPU (host) and on the GPU (device), fp32.
struct Twin {
  std::vector<float> host;
  Buffer device;
  explicit Twin(std::vector<float> values)
      : host(std::move(values)), device(int64_t(host.size()), MemCategory::Other, DType::F32, Device::CUDA) {
#ifdef GPT_WITH_CUDA
    CUDA_CHECK(cudaMemcpy(device.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
#endif
  }
  Tensor cpu(std::initializer_list<int64_t> shape) { return make_view(host.data(), shape); }
  Tensor gpu(std::initializer_list<int64_t> shape) { return make_view(device.data(), shape, DType::F32, Device::CUDA); }
  std::vector<float> download() const {
    std::vector<float> values(host.size());
#ifdef GPT_WITH_CUDA
    cuda::synchronize();
    CUDA_CHECK(cudaMemcpy(values.data(), device.data(), values.size() * sizeof(float), cudaMemcpyDeviceToHost));
#endif
    return values;
  }
  ::testing::AssertionResult agrees(double atol = kAtol, double rtol = kRtol) const {
    return allclose(download(), host, atol, rtol);
  }
};

struct Shape {
  int C, NH;
};
constexpr int B = 2, T = 40, cp = 2, Tl = T / cp;
const Shape kShapes[] = {{64, 2}, {256, 2}};  // head sizes 32 and 128

TEST(CudaRingAttentionShapes, HeadSizesTheKernelsTake) {
  EXPECT_EQ(ring_attention_problem(Device::CPU, 130, 2), "");  // the CPU takes any head size
  // hs = 65 gives a warp's lanes no whole number of channels: refused, naming the head size (or, in a
  // build without CUDA, saying so).
  EXPECT_NE(ring_attention_problem(Device::CUDA, 130, 2), "");
#ifdef GPT_WITH_CUDA
  EXPECT_NE(ring_attention_problem(Device::CUDA, 130, 2).find("65"), std::string::npos);
  EXPECT_EQ(ring_attention_problem(Device::CUDA, 768, 12), "");   // GPT-2's 64
  EXPECT_NE(ring_attention_problem(Device::CUDA, 1024, 4), "");   // 256: more than 4 chunks of 32
#endif
}

TEST_F(CudaRingAttention, PackAndAddKvAreExact) {
  const int C = 64;
  Twin qkv(random_vector(size_t(B) * Tl * 3 * C, 1)), kv(std::vector<float>(size_t(B) * Tl * 2 * C, NAN));
  pack_kv(kv.cpu({B, Tl, 2 * C}), qkv.cpu({B, Tl, 3 * C}), B, Tl, C);
  pack_kv(kv.gpu({B, Tl, 2 * C}), qkv.gpu({B, Tl, 3 * C}), B, Tl, C);
  EXPECT_TRUE(kv.agrees(0, 0));
  Twin dqkv(random_vector(size_t(B) * Tl * 3 * C, 2)), dkv(random_vector(size_t(B) * Tl * 2 * C, 3));
  add_kv_grad(dqkv.cpu({B, Tl, 3 * C}), dkv.cpu({B, Tl, 2 * C}), B, Tl, C);
  add_kv_grad(dqkv.gpu({B, Tl, 3 * C}), dkv.gpu({B, Tl, 2 * C}), B, Tl, C);
  EXPECT_TRUE(dqkv.agrees(0, 0));
}

TEST_F(CudaRingAttention, ForwardAndBackwardMatchTheCpuBlockByBlock) {
  const std::vector<int> mine = context_positions(T, cp, 0, ContextSplit::Zigzag);
  const std::vector<int> theirs = context_positions(T, cp, 1, ContextSplit::Zigzag);
  for (const Shape& s : kShapes) {
    const int C = s.C, NH = s.NH;
    SCOPED_TRACE("head size " + std::to_string(C / NH));
    const size_t rows = size_t(B) * Tl, stats = size_t(B) * NH * Tl;
    Twin qkv(random_vector(rows * 3 * C, 10)), other(random_vector(rows * 2 * C, 11));
    Twin own(std::vector<float>(rows * 2 * C, NAN));
    pack_kv(own.cpu({B, Tl, 2 * C}), qkv.cpu({B, Tl, 3 * C}), B, Tl, C);
    pack_kv(own.gpu({B, Tl, 2 * C}), qkv.gpu({B, Tl, 3 * C}), B, Tl, C);
    Twin out(std::vector<float>(rows * C, NAN)), lse(std::vector<float>(stats, NAN)),
        row_sum(std::vector<float>(stats, NAN));
    attention_block_start(out.cpu({B, Tl, C}), lse.cpu({B, NH, Tl}), row_sum.cpu({B, NH, Tl}));
    attention_block_start(out.gpu({B, Tl, C}), lse.gpu({B, NH, Tl}), row_sum.gpu({B, NH, Tl}));
    EXPECT_TRUE(out.agrees(0, 0));
    EXPECT_TRUE(row_sum.agrees(0, 0));

    // Forward: the own block, then the other rank's; the running state after each.
    Twin* blocks[2] = {&own, &other};
    const std::vector<int>* owners[2] = {&mine, &theirs};
    for (int step = 0; step < 2; step++) {
      SCOPED_TRACE("forward, block " + std::to_string(step));
      Twin& kv = *blocks[step];
      const int64_t cpu_pairs = attention_block_forward(
          btc_rows(out.cpu({B, Tl, C}), Tl, C), lse.host.data(), row_sum.host.data(),
          qkv_rows(qkv.cpu({B, Tl, 3 * C}), 0, B, Tl, C), kv_rows(kv.cpu({B, Tl, 2 * C}), 0, B, Tl, C),
          kv_rows(kv.cpu({B, Tl, 2 * C}), 1, B, Tl, C), mine.data(), owners[step]->data(), B, NH, C);
      const int64_t gpu_pairs = attention_block_forward(
          btc_rows(out.gpu({B, Tl, C}), Tl, C), lse.gpu({B, NH, Tl}).f32(), row_sum.gpu({B, NH, Tl}).f32(),
          qkv_rows(qkv.gpu({B, Tl, 3 * C}), 0, B, Tl, C), kv_rows(kv.gpu({B, Tl, 2 * C}), 0, B, Tl, C),
          kv_rows(kv.gpu({B, Tl, 2 * C}), 1, B, Tl, C), mine.data(), owners[step]->data(), B, NH, C);
      EXPECT_EQ(gpu_pairs, cpu_pairs);
      EXPECT_GT(cpu_pairs, 0);
      EXPECT_TRUE(out.agrees());
      EXPECT_TRUE(lse.agrees());  // the running maximum, until finish
      EXPECT_TRUE(row_sum.agrees());
    }
    attention_block_finish(btc_rows(out.cpu({B, Tl, C}), Tl, C), lse.host.data(), lse.host.data(),
                           row_sum.host.data(), B, NH, C);
    attention_block_finish(btc_rows(out.gpu({B, Tl, C}), Tl, C), lse.gpu({B, NH, Tl}).f32(),
                           lse.gpu({B, NH, Tl}).f32(), row_sum.gpu({B, NH, Tl}).f32(), B, NH, C);
    EXPECT_TRUE(out.agrees());
    EXPECT_TRUE(lse.agrees());

    // Backward from the finished forward (each side its own), the same dout.
    Twin dout(random_vector(rows * C, 12)), D(std::vector<float>(stats, NAN));
    attention_row_dots(D.host.data(), btc_rows(dout.cpu({B, Tl, C}), Tl, C), btc_rows(out.cpu({B, Tl, C}), Tl, C), B,
                       NH, C);
    attention_row_dots(D.gpu({B, NH, Tl}).f32(), btc_rows(dout.gpu({B, Tl, C}), Tl, C),
                       btc_rows(out.gpu({B, Tl, C}), Tl, C), B, NH, C);
    EXPECT_TRUE(D.agrees());
    Twin dqkv(random_vector(rows * 3 * C, 13)), dkv(random_vector(rows * 2 * C, 14));
    for (int step = 0; step < 2; step++) {
      SCOPED_TRACE("backward, block " + std::to_string(step));
      Twin& kv = *blocks[step];
      // Step 0's key gradients go into dqkv's own k and v, the other block's into the accumulator.
      auto dk = [&](bool gpu) {
        return step == 0 ? qkv_rows(gpu ? dqkv.gpu({B, Tl, 3 * C}) : dqkv.cpu({B, Tl, 3 * C}), 1, B, Tl, C)
                         : kv_rows(gpu ? dkv.gpu({B, Tl, 2 * C}) : dkv.cpu({B, Tl, 2 * C}), 0, B, Tl, C);
      };
      auto dv = [&](bool gpu) {
        return step == 0 ? qkv_rows(gpu ? dqkv.gpu({B, Tl, 3 * C}) : dqkv.cpu({B, Tl, 3 * C}), 2, B, Tl, C)
                         : kv_rows(gpu ? dkv.gpu({B, Tl, 2 * C}) : dkv.cpu({B, Tl, 2 * C}), 1, B, Tl, C);
      };
      const int64_t cpu_pairs = attention_block_backward(
          qkv_rows(dqkv.cpu({B, Tl, 3 * C}), 0, B, Tl, C), dk(false), dv(false),
          qkv_rows(qkv.cpu({B, Tl, 3 * C}), 0, B, Tl, C), kv_rows(kv.cpu({B, Tl, 2 * C}), 0, B, Tl, C),
          kv_rows(kv.cpu({B, Tl, 2 * C}), 1, B, Tl, C), btc_rows(dout.cpu({B, Tl, C}), Tl, C), lse.host.data(),
          D.host.data(), mine.data(), owners[step]->data(), B, NH, C);
      const int64_t gpu_pairs = attention_block_backward(
          qkv_rows(dqkv.gpu({B, Tl, 3 * C}), 0, B, Tl, C), dk(true), dv(true),
          qkv_rows(qkv.gpu({B, Tl, 3 * C}), 0, B, Tl, C), kv_rows(kv.gpu({B, Tl, 2 * C}), 0, B, Tl, C),
          kv_rows(kv.gpu({B, Tl, 2 * C}), 1, B, Tl, C), btc_rows(dout.gpu({B, Tl, C}), Tl, C),
          lse.gpu({B, NH, Tl}).f32(), D.gpu({B, NH, Tl}).f32(), mine.data(), owners[step]->data(), B, NH, C);
      EXPECT_EQ(gpu_pairs, cpu_pairs);
      EXPECT_TRUE(dqkv.agrees());
      EXPECT_TRUE(dkv.agrees());
    }
  }
}

}  // namespace
