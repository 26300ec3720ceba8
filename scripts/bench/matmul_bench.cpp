// matmul_bench.cpp: measures sgemm_cpu against single-threaded OpenBLAS on the model's GEMM shapes.
//
// For each preset (tiny: rows = 8*64, C = 64, V = 256; small: rows = 8*128, C = 128, V = 256) and
// each linear layer (OC, IC) of the model, times the three products a training step makes:
//   forward  out(rows, OC) = inp(rows, IC) @ W(OC, IC)^T   sgemm(trans_b)
//   backward dinp(rows, IC) = dout(rows, OC) @ W(OC, IC)    sgemm(no trans)
//   backward dW(OC, IC)     = dout(rows, OC)^T @ inp        sgemm(trans_a)
// with the alpha and beta that common/ops/ops_cpu.cpp passes: alpha = 1; beta = 1 (accumulate) for the
// backward products; the forward of layers with a bias starts from it (ours: sgemm_cpu_bias; OpenBLAS:
// beta = 1 onto C, which the layer would first fill with the bias); beta = 0 for the lm head forward.
// Both implementations run in the same process after a warm-up, in alternating timed samples of a
// few milliseconds each, so load from other processes hits them alike; each figure is the median
// over 31 samples. Prints one row
// per shape and the geometric mean of ours/OpenBLAS. A benchmark, not a test: it checks nothing.
//
// Build and run:
//   g++ -O3 -march=native -std=c++17 -Wall -Wextra -Icommon scripts/bench/matmul_bench.cpp
//       common/ops/matmul_cpu.cpp -lopenblas -o /tmp/matmul_bench
//   /tmp/matmul_bench [--shapes tiny|small|all]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/matmul_cpu.h"

extern "C" void openblas_set_num_threads(int);

namespace {

struct Shape {
  std::string what;
  bool trans_a, trans_b;
  int M, N, K;
  float beta;
};

struct Preset {
  const char* name;
  int rows, C, V;
};

std::vector<Shape> shapes_for(const Preset& p) {
  struct Layer { const char* name; int OC, IC; bool bias; };
  const Layer layers[] = {{"qkv", 3 * p.C, p.C, true},
                          {"attn proj", p.C, p.C, true},
                          {"fc", 4 * p.C, p.C, true},
                          {"fc proj", p.C, 4 * p.C, true},
                          {"lm head", p.V, p.C, false}};
  std::vector<Shape> out;
  for (const Layer& l : layers) {
    const std::string tag = std::string(p.name) + " " + l.name;
    out.push_back({tag + " fwd", false, true, p.rows, l.OC, l.IC, l.bias ? 1.0f : 0.0f});
    out.push_back({tag + " dinp", false, false, p.rows, l.IC, l.OC, 1.0f});
    out.push_back({tag + " dW", true, false, l.OC, l.IC, p.rows, 1.0f});
  }
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Result { double ours_gflops, blas_gflops; };

Result bench(const Shape& s) {
  // Stored operand dimensions: A is M x K (K x M if transposed), B is K x N (N x K if transposed).
  const int a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
  const int b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> A(static_cast<size_t>(a_rows) * a_cols), B(static_cast<size_t>(b_rows) * b_cols);
  for (float& x : A) x = dist(rng);
  for (float& x : B) x = dist(rng);
  // With beta = 1, C grows linearly with the calls from zero; it stays far from overflow.
  std::vector<float> C(static_cast<size_t>(s.M) * s.N, 0.0f);
  const std::vector<float> bias(static_cast<size_t>(s.N), 0.5f);
  const bool with_bias = !s.trans_a && s.trans_b && s.beta == 1.0f;  // a biased layer's forward

  auto run_ours = [&] {
    if (with_bias) {
      sgemm_cpu_bias(false, true, s.M, s.N, s.K, A.data(), a_cols, B.data(), b_cols, bias.data(), C.data(), s.N);
      return;
    }
    sgemm_cpu(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, A.data(), a_cols, B.data(), b_cols, s.beta,
              C.data(), s.N);
  };
  auto run_blas = [&] {
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                s.M, s.N, s.K, 1.0f, A.data(), a_cols, B.data(), b_cols, s.beta, C.data(), s.N);
  };

  const double flops = 2.0 * s.M * s.N * s.K;
  // Each timed sample loops enough calls to last ~2 ms at 80 GFLOP/s, so that timer resolution and
  // call overhead do not matter, while the whole table still takes only a few seconds.
  const int calls = std::max(1, static_cast<int>(2e-3 * 80e9 / flops));
  auto time_one = [&](auto&& fn) {
    const double t0 = now_s();
    for (int c = 0; c < calls; ++c) fn();
    return (now_s() - t0) / calls;
  };

  for (int w = 0; w < 3; ++w) { time_one(run_ours); time_one(run_blas); }
  const int repeats = 31;
  std::vector<double> t_ours, t_blas;
  for (int r = 0; r < repeats; ++r) {
    // Alternate which goes first so neither always inherits the other's cache state.
    if (r % 2 == 0) { t_ours.push_back(time_one(run_ours)); t_blas.push_back(time_one(run_blas)); }
    else            { t_blas.push_back(time_one(run_blas)); t_ours.push_back(time_one(run_ours)); }
  }
  return {flops / median(t_ours) * 1e-9, flops / median(t_blas) * 1e-9};
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      which = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--shapes tiny|small|all]\n", argv[0]);
      return 2;
    }
  }
  if (which != "tiny" && which != "small" && which != "all") {
    std::fprintf(stderr, "--shapes must be tiny, small or all, not '%s'\n", which.c_str());
    return 2;
  }

  openblas_set_num_threads(1);
  const Preset presets[] = {{"tiny", 8 * 64, 64, 256}, {"small", 8 * 128, 128, 256}};

  std::printf("%-24s %5s %5s %5s %15s %17s %14s\n", "shape (what)", "M", "N", "K", "ours GFLOP/s",
              "OpenBLAS GFLOP/s", "ours/OpenBLAS");
  double log_sum = 0.0;
  int count = 0;
  for (const Preset& p : presets) {
    if (which != "all" && which != p.name) continue;
    for (const Shape& s : shapes_for(p)) {
      const Result r = bench(s);
      const double ratio = r.ours_gflops / r.blas_gflops;
      log_sum += std::log(ratio);
      ++count;
      std::printf("%-24s %5d %5d %5d %15.1f %17.1f %14.2f\n", s.what.c_str(), s.M, s.N, s.K, r.ours_gflops,
                  r.blas_gflops, ratio);
      std::fflush(stdout);
    }
  }
  std::printf("geometric mean ours/OpenBLAS over %d shapes: %.2f\n", count, std::exp(log_sum / count));
  return 0;
}
