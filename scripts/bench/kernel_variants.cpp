// kernel_variants.cpp: on a GPU, every CUDA kernel that has a version 2 beside its version 1 is checked
// against its reference, then both versions are timed at GPT-2 124M's shapes, and the faster named.
// One run picks the winners; the framework then calls the winner, and the loser stays as the lesson's
// earlier step (docs/gpus.md). A benchmark, not a test: tests/test_cuda_ops.cpp holds the checks that
// fail a build; these are repeated here at the timed shapes, so a timing never comes from a wrong
// kernel.
//   classifier  v1: softmax_crossentropy_forward then _backward (the (N,V) probabilities in between);
//               v2: fused_classifier (one kernel, dlogits over the logits). bf16, N = B x T = 16 x 1024
//               rows of V = 50304 (GPT-2's padded vocabulary). Checked on 64 rows against the CPU ops.
//   adamw       v1: one adamw_update per tensor of GPT-2 124M's layout, as optimizer.cpp launches it;
//               v2: adamw_update_fused, one launch. fp32. Checked: the same bits after one step.
// Each time is the mean of 20 runs after 3 of warm-up, between two CUDA events on the compute stream.
// Prints a table, then one JSON line per kernel family ({"kernel", "v1_ms", "v2_ms", "winner", "ok"}).
// Without a GPU (or without CUDA in the build) it says why and exits 0.
//
// Build and run: make build/kernel_variants (a CUDA build); build/kernel_variants
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/device.h"  // cuda_device_count
#include "ops/memory.h"  // Buffer
#include "model/model_config.h"
#include "ops/ops.h"
#include "model/param_layout.h"
#ifdef GPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ops/bf16.h"
#include "base/cuda_check.h"
#include "ops/ops_cuda.h"
#endif

#ifdef GPT_WITH_CUDA
namespace {

std::vector<float> random_values(size_t n, unsigned seed, float scale) {
  std::vector<float> x(n);
  unsigned state = seed * 2654435761u + 1;
  for (float& v : x) {
    state = state * 1664525u + 1013904223u;
    v = scale * (float(state >> 8) / float(1 << 24) * 2.0f - 1.0f);
  }
  return x;
}

template <typename F>
double time_ms(F&& f) {
  for (int i = 0; i < 3; i++) f();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  constexpr int kRuns = 20;
  CUDA_CHECK(cudaEventRecord(start, cuda::stream()));
  for (int i = 0; i < kRuns; i++) f();
  CUDA_CHECK(cudaEventRecord(stop, cuda::stream()));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms / kRuns;
}

void upload(void* dst, const void* src, size_t bytes) { CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)); }
void download(void* dst, const void* src, size_t bytes) {
  cuda::synchronize();
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

struct Result {
  std::string kernel;
  double v1_ms, v2_ms;
  bool ok;
  std::string check;
};

// bf16 logits of `rows` x V, rounded on the host so the CPU sees the same values.
std::vector<float> bf16_logits(int rows, int V) {
  std::vector<float> x = random_values(size_t(rows) * V, 7, 4.0f);
  for (float& v : x) v = round_to_bf16(v);
  return x;
}
Buffer bf16_on_gpu(const std::vector<float>& x) {
  Buffer b(int64_t(x.size()), MemCategory::Other, DType::BF16, Device::CUDA);
  std::vector<bf16_bits> bits(x.size());
  for (size_t i = 0; i < x.size(); i++) bits[i] = float_to_bf16(x[i]);
  upload(b.data(), bits.data(), bits.size() * sizeof(bf16_bits));
  return b;
}

Result classifier() {
  const int V = 50304, check_rows = 64, N = 16 * 1024;
  const float dloss = 1.0f / N;
  // The check: 64 rows against the CPU's forward and backward (fp32, on the rounded logits).
  std::vector<float> logits = bf16_logits(check_rows, V), probs(logits.size()), dlogits(logits.size());
  std::vector<float> losses(check_rows);
  std::vector<int> targets(check_rows);
  for (int i = 0; i < check_rows; i++) targets[size_t(i)] = (i * 7919) % V;
  softmax_crossentropy_forward(make_view(losses.data(), {check_rows}), make_view(probs.data(), {check_rows, V}),
                               make_view(logits.data(), {check_rows, V}), targets.data());
  softmax_crossentropy_backward(make_view(dlogits.data(), {check_rows, V}), make_view(probs.data(), {check_rows, V}),
                                targets.data(), dloss);
  Buffer d_logits = bf16_on_gpu(logits), d_losses(check_rows, MemCategory::Other, Device::CUDA);
  cuda::fused_classifier(DType::BF16, d_logits.data(), d_losses.f32(), targets.data(), dloss, check_rows, V);
  std::vector<bf16_bits> bits(logits.size());
  std::vector<float> gpu_losses(check_rows);
  download(bits.data(), d_logits.data(), bits.size() * sizeof(bf16_bits));
  download(gpu_losses.data(), d_losses.data(), gpu_losses.size() * sizeof(float));
  double largest = 0, worst = 0, worst_loss = 0;
  for (float d : dlogits) largest = std::fmax(largest, std::fabs(d));
  for (size_t i = 0; i < bits.size(); i++)
    worst = std::fmax(worst, std::fabs(bf16_to_float(bits[i]) - dlogits[i]) / (1e-3 * largest + 1e-2 * std::fabs(dlogits[i])));
  for (int i = 0; i < check_rows; i++)
    worst_loss = std::fmax(worst_loss, std::fabs(gpu_losses[size_t(i)] - losses[size_t(i)]) / (1e-5 + 1e-4 * std::fabs(losses[size_t(i)])));
  const bool ok = worst <= 1 && worst_loss <= 1;
  char check[160];
  std::snprintf(check, sizeof check, "64 rows vs CPU: dlogits at %.2f, losses at %.2f of the bf16 tolerance", worst,
                worst_loss);
  // The timing, at GPT-2's shape.
  Buffer big = bf16_on_gpu(bf16_logits(N, V)), big_probs(int64_t(N) * V, MemCategory::Other, DType::BF16, Device::CUDA);
  Buffer big_dlogits(int64_t(N) * V, MemCategory::Other, DType::BF16, Device::CUDA);
  Buffer big_losses(N, MemCategory::Other, Device::CUDA), big_targets(N, MemCategory::Other, DType::I32, Device::CUDA);
  std::vector<int> all_targets(static_cast<size_t>(N));
  for (int i = 0; i < N; i++) all_targets[size_t(i)] = (i * 7919) % V;
  upload(big_targets.data(), all_targets.data(), all_targets.size() * sizeof(int));
  const int* t = static_cast<const int*>(big_targets.data());
  const double v1 = time_ms([&] {
    cuda::softmax_crossentropy_forward(DType::BF16, big_losses.f32(), big_probs.data(), big.data(), t, N, V);
    cuda::softmax_crossentropy_backward(DType::BF16, big_dlogits.data(), big_probs.data(), t, dloss, N, V, 0);
  });
  const double v2 = time_ms([&] { cuda::fused_classifier(DType::BF16, big.data(), big_losses.f32(), t, dloss, N, V); });
  return {"classifier (bf16, 16384 x 50304)", v1, v2, ok, check};
}

Result adamw() {
  GPT2Config cfg;
  find_preset("gpt2", &cfg);
  const ParamLayout layout = build_gpt2_layout(cfg, 1);
  const int64_t n = layout.padded_size;
  std::vector<int64_t> ends;
  std::vector<bool> decays;
  for (const ParamInfo& p : layout.params) ends.push_back(p.offset + p.size), decays.push_back(p.weight_decay);
  if (ends.back() < n) ends.push_back(n), decays.push_back(false);  // the padding: zero, and stays zero
  const std::vector<float> start = random_values(size_t(n), 3, 0.1f), grad = random_values(size_t(n), 4, 0.01f);
  Buffer p1(n, MemCategory::Other, Device::CUDA), p2(n, MemCategory::Other, Device::CUDA), g(n, MemCategory::Other, Device::CUDA);
  Buffer m1(n, MemCategory::Other, Device::CUDA), v1s(n, MemCategory::Other, Device::CUDA);
  Buffer m2(n, MemCategory::Other, Device::CUDA), v2s(n, MemCategory::Other, Device::CUDA);
  for (Buffer* b : {&p1, &p2}) upload(b->data(), start.data(), size_t(n) * sizeof(float));
  upload(g.data(), grad.data(), size_t(n) * sizeof(float));
  for (Buffer* b : {&m1, &v1s, &m2, &v2s}) cuda::fill_zero(DType::F32, b->data(), size_t(n));
  auto per_tensor = [&](int step) {
    int64_t begin = 0;
    for (size_t s = 0; s < ends.size(); s++) {
      const size_t count = size_t(ends[s] - begin);
      cuda::adamw_update(DType::F32, p1.f32() + begin, nullptr, g.f32() + begin, m1.f32() + begin, v1s.f32() + begin,
                         count, step, 6e-4f, 0.9f, 0.95f, 1e-8f, decays[s] ? 0.1f : 0.0f, 1.0f);
      begin = ends[s];
    }
  };
  auto fused = [&](int step) {
    cuda::adamw_update_fused(DType::F32, p2.data(), nullptr, g.data(), m2.f32(), v2s.f32(), size_t(n), ends, decays,
                             step, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f);
  };
  per_tensor(1);
  fused(1);
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  download(a.data(), p1.data(), a.size() * sizeof(float));
  download(b.data(), p2.data(), b.size() * sizeof(float));
  int64_t differing = 0;
  for (int64_t i = 0; i < n; i++) differing += a[size_t(i)] != b[size_t(i)];
  char check[160];
  std::snprintf(check, sizeof check, "one step from the same state: %lld of %lld parameters differ (0 expected); %zu "
                "launches against 1", (long long)differing, (long long)n, ends.size());
  const double t1 = time_ms([&] { per_tensor(2); });
  const double t2 = time_ms([&] { fused(2); });
  return {"adamw (fp32, GPT-2 124M)", t1, t2, differing == 0, check};
}

}  // namespace
#endif

int main() {
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::printf("kernel_variants: no CUDA device: %s\n", why.c_str());
    return 0;
  }
#ifdef GPT_WITH_CUDA
  const Result results[] = {classifier(), adamw()};
  std::printf("%-36s %10s %10s %8s  %s\n", "kernel", "v1 ms", "v2 ms", "winner", "check");
  for (const Result& r : results)
    std::printf("%-36s %10.3f %10.3f %8s  %s %s\n", r.kernel.c_str(), r.v1_ms, r.v2_ms,
                r.ok ? (r.v2_ms < r.v1_ms ? "v2" : "v1") : "v1", r.ok ? "ok:" : "FAILED (v2 wrong, v1 kept):",
                r.check.c_str());
  for (const Result& r : results)
    std::printf("{\"kernel\": \"%s\", \"v1_ms\": %.4f, \"v2_ms\": %.4f, \"winner\": \"%s\", \"ok\": %s}\n",
                r.kernel.c_str(), r.v1_ms, r.v2_ms, r.ok && r.v2_ms < r.v1_ms ? "v2" : "v1", r.ok ? "true" : "false");
  bool all_ok = true;
  for (const Result& r : results) all_ok = all_ok && r.ok;
  return all_ok ? 0 : 1;
#endif
}
