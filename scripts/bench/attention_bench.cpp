// attention_bench.cpp: times the CPU attention (cpu::attention_forward and attention_backward, the
// op alone) at the shapes of the presets tiny, small and deep, and prints ms per call and GFLOP/s.
//
// FLOPs: each of the P = B NH T(T+1)/2 causal (query, key) pairs costs a multiply-add per head channel
// in each product that runs over it: two products forward (S = Q K^T, O = P V), four backward
// (dP = dO V^T, dQ = dS K, dK = dS^T Q, dV = P^T dO), so 4 hs P FLOPs forward and 8 hs P backward
// (the softmax and the masked halves of the diagonal tiles not counted). Each sample is one call,
// timed by the thread's CPU time, after 32 MB of other data went through the caches (as in a step,
// where the layer's inputs come from memory); a figure is the median of the samples. The op is called
// as the model calls it on the CPU: the scores before the softmax not stored (preatt nullptr), dqkv
// overwritten. A benchmark, not a test: tests/test_ops.cpp checks the op.
//
// Build and run: make build/attention_bench && build/attention_bench [samples [warm]] (warm: without
// the 32 MB between calls)
// (JSON lines after the table: {"preset", "forward_ms", "backward_ms", ...}.)
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ops/ops_cpu.h"

namespace {

double thread_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Reads and writes 32 MB, so that the next call starts with its operands out of L1 and L2.
void evict_caches() {
  static std::vector<float> junk(size_t(8) << 20, 1.0f);
  for (float& x : junk) x = x * 0.5f + 1.0f;
}

struct Shape {
  const char* preset;
  int B, T, C, NH;
};

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  const bool evict = !(argc > 2 && std::string(argv[2]) == "warm");
  const Shape shapes[] = {{"tiny", 8, 64, 64, 4}, {"small", 8, 128, 128, 4}, {"deep", 8, 64, 128, 4}};
  std::printf("CPU attention, one call, median of %d (thread CPU time), operands %s\n", samples,
              evict ? "out of the caches" : "left in the caches by the previous call");
  std::printf("| preset | B, T, C, NH | forward ms | GFLOP/s | backward ms | GFLOP/s |\n|---|---|---|---|---|---|\n");
  std::string lines;
  for (const Shape& s : shapes) {
    const size_t btc = size_t(s.B) * s.T * s.C, bhtt = size_t(s.B) * s.NH * s.T * s.T;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> qkv(3 * btc), dout(btc), out(btc), att(bhtt), dqkv(3 * btc), dpreatt(bhtt), datt(bhtt);
    for (float& x : qkv) x = uni(rng);
    for (float& x : dout) x = uni(rng);
    std::vector<double> fwd, bwd;
    for (int i = 0; i < samples + 1; i++) {  // the first call warms up
      if (evict) evict_caches();
      double t0 = thread_cpu_ms();
      cpu::attention_forward(out.data(), nullptr, att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      const double f = thread_cpu_ms() - t0;
      if (evict) evict_caches();
      t0 = thread_cpu_ms();
      cpu::attention_backward(dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B,
                              s.T, s.C, s.NH, /*accumulate=*/false);
      const double g = thread_cpu_ms() - t0;
      if (i > 0) fwd.push_back(f), bwd.push_back(g);
    }
    const double pairs = double(s.B) * s.NH * s.T * (s.T + 1) / 2, hs = double(s.C) / s.NH;
    const double f = median(fwd), g = median(bwd);
    const double f_gflops = 4 * hs * pairs / (f * 1e6), g_gflops = 8 * hs * pairs / (g * 1e6);
    std::printf("| %s | %d, %d, %d, %d | %.3f | %.1f | %.3f | %.1f |\n", s.preset, s.B, s.T, s.C, s.NH, f, f_gflops,
                g, g_gflops);
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"preset\": \"%s\", \"forward_ms\": %.4f, \"backward_ms\": %.4f, \"forward_gflops\": %.2f, "
                  "\"backward_gflops\": %.2f}\n",
                  s.preset, f, g, f_gflops, g_gflops);
    lines += line;
  }
  std::fputs(lines.c_str(), stdout);
  return 0;
}
