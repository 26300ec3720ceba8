// test_cuda_moe_rows.cpp: the MoE layer's row movements (moe_rows.h) on the GPU against the same ops on
// the CPU, which MoELayer runs (its routing, capacity and balance loss are checked in test_moe.cpp and
// test_expert_parallel.cpp, so agreement here means the CUDA kernels are right). A routing with
// top-2 of 4 experts over N = 37 tokens, C = 70 channels (more than two warps' lanes, not a multiple of
// 32), where capacity dropped every fifth assignment and one token lost both of its choices.
// Tolerances: the dispatch, the dy of the combine's backward and the return of the rows move or add
// the same numbers in the same order: exact. The combine (a multiply-add nvcc may fuse) and the gates'
// gradients (a dot product in double, summed by lanes then across the warp): atol 1e-6, rtol 1e-5.
// Without a GPU each test is skipped: "no CUDA device: <why>".
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/device.h"  // cuda_device_count
#include "ops/memory.h"  // Buffer
#include "ops/moe_rows.h"
#include "test_util.h"
#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "base/cuda_check.h"
#include "ops/ops_cuda.h"  // cuda::synchronize
#endif

namespace {

class CudaMoeRows : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// Host values and their copy on the GPU (fp32 or int32: 4 bytes each).
template <typename Value>
struct Twin {
  std::vector<Value> host;
  Buffer device;
  explicit Twin(std::vector<Value> values)
      : host(std::move(values)), device(int64_t(host.size()), MemCategory::Other, DType::F32, Device::CUDA) {
    static_assert(sizeof(Value) == 4, "an fp32-sized element");
#ifdef GPT_WITH_CUDA
    CUDA_CHECK(cudaMemcpy(device.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
#endif
  }
  Value* cpu_data() { return host.data(); }
  Value* gpu_data() { return static_cast<Value*>(device.data()); }
  Tensor cpu(int64_t rows, int64_t cols) { return make_view(host.data(), {rows, cols}); }
  Tensor gpu(int64_t rows, int64_t cols) { return make_view(device.data(), {rows, cols}, DType::F32, Device::CUDA); }
  std::vector<float> download() const {
    std::vector<float> values(host.size());
#ifdef GPT_WITH_CUDA
    cuda::synchronize();
    CUDA_CHECK(cudaMemcpy(values.data(), device.data(), values.size() * 4, cudaMemcpyDeviceToHost));
#endif
    return values;
  }
  ::testing::AssertionResult agrees(double atol, double rtol) const { return allclose(download(), host, atol, rtol); }
};

constexpr int N = 37, C = 70, E = 4, k = 2;

// A routing as MoELayer makes one: distinct experts per token, kept rows numbered by expert then claim
// order, every fifth assignment and both of token 3's dropped.
struct Routing {
  std::vector<int> chosen, row;
  int kept = 0;
  Routing() : chosen(size_t(N) * k), row(size_t(N) * k, -1) {
    for (int t = 0; t < N; t++) {
      chosen[size_t(t) * k] = t % E;
      chosen[size_t(t) * k + 1] = (t % E + 1 + t % (E - 1)) % E;  // 1 to E-1 further: another expert
    }
    std::vector<int> counts(E, 0);
    for (int a = 0; a < N * k; a++)
      if (a % 5 != 4 && a / k != 3) counts[size_t(chosen[size_t(a)])]++;
    std::vector<int> next(E, 0);
    for (int e = 1; e < E; e++) next[size_t(e)] = next[size_t(e - 1)] + counts[size_t(e - 1)];
    for (int a = 0; a < N * k; a++)
      if (a % 5 != 4 && a / k != 3) row[size_t(a)] = next[size_t(chosen[size_t(a)])]++, kept++;
  }
};

TEST_F(CudaMoeRows, DispatchCombineAndTheirBackwardsMatchTheCpu) {
  const Routing r;
  const int n = r.kept;
  Twin<int> chosen(r.chosen), row(r.row);
  Twin<float> probs(random_vector(size_t(N) * E, 1, 0.0f, 1.0f)), x(random_vector(size_t(N) * C, 2));
  Twin<float> rows(std::vector<float>(size_t(n) * C, 0.0f));
  moe_dispatch(rows.cpu(n, C), x.cpu(N, C), row.cpu_data(), k);
  moe_dispatch(rows.gpu(n, C), x.gpu(N, C), row.gpu_data(), k);
  EXPECT_TRUE(rows.agrees(0, 0));

  Twin<float> y(random_vector(size_t(n) * C, 3)), out(std::vector<float>(size_t(N) * C, 7.0f));  // overwritten
  moe_combine(out.cpu(N, C), y.cpu(n, C), probs.cpu_data(), chosen.cpu_data(), row.cpu_data(), k, E);
  moe_combine(out.gpu(N, C), y.gpu(n, C), probs.gpu_data(), chosen.gpu_data(), row.gpu_data(), k, E);
  EXPECT_TRUE(out.agrees(1e-6, 1e-5));
  for (int c = 0; c < C; c++) EXPECT_EQ(out.host[size_t(3 * C + c)], 0.0f) << "token 3 lost both choices";

  Twin<float> dout(random_vector(size_t(N) * C, 4)), dy(std::vector<float>(size_t(n) * C, 0.0f));
  Twin<float> dgate(std::vector<float>(size_t(N) * k, 9.0f));  // overwritten, dropped ones with 0
  moe_combine_backward(dy.cpu(n, C), dgate.cpu_data(), dout.cpu(N, C), y.cpu(n, C), probs.cpu_data(),
                       chosen.cpu_data(), row.cpu_data(), k, E);
  moe_combine_backward(dy.gpu(n, C), dgate.gpu_data(), dout.gpu(N, C), y.gpu(n, C), probs.gpu_data(),
                       chosen.gpu_data(), row.gpu_data(), k, E);
  EXPECT_TRUE(dy.agrees(0, 0));
  EXPECT_TRUE(dgate.agrees(1e-6, 1e-5));
  EXPECT_EQ(dgate.host[4], 0.0f) << "a dropped assignment's gate has no gradient";

  Twin<float> drows(random_vector(size_t(n) * C, 5)), dx(random_vector(size_t(N) * C, 6));  // accumulated into
  moe_return_rows(dx.cpu(N, C), drows.cpu(n, C), row.cpu_data(), k);
  moe_return_rows(dx.gpu(N, C), drows.gpu(n, C), row.gpu_data(), k);
  EXPECT_TRUE(dx.agrees(0, 0));
}

}  // namespace
