// matmul_ab.cpp: the CPU products of one layer of the model, two builds of common/ops/matmul_cpu.cpp side
// by side in one program: `before_*` (another commit's source, its functions renamed by matmul_ab.sh)
// and the working tree's. For each of the 15 products a training step makes per layer and head, with the
// entry points and alpha/beta that common/ops/ops_cpu.cpp uses (the forward from a bias, the input
// gradient overwriting, the weight gradient accumulating with its bias's sums), the two are called
// alternately, the order swapped every call, and timed by the thread's CPU time. Prints each side's
// GFLOP/s (medians), after / before, and whether the two products are the same bits.
// warm: the operands stay in the caches from the call before; cold: 32 MB of other data goes through
// the caches before every call, as a step's activations come from L3 or memory.
// A benchmark, not a test. Usage (through matmul_ab.sh): matmul_ab ROWS CALLS warm|cold
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/matmul_cpu.h"

void before_sgemm_cpu(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int);
void before_sgemm_cpu_bias(bool, bool, int, int, int, const float*, int, const float*, int, const float*, float*,
                           int);
void before_sgemm_cpu_sum_a(bool, int, int, int, float, const float*, int, const float*, int, float, float*, int,
                            float*);

namespace {

double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

enum class Kind { ForwardBias, Forward, InputGrad, WeightGradBias, WeightGrad };
struct Product {
  std::string name;
  Kind kind;
  int M, N, K;
};

// One product on one side (after = the working tree's code). C is refilled before, so both sides start
// from the same values.
void run(bool after, const Product& p, const float* A, const float* B, const float* bias, float* C, float* sums) {
  switch (p.kind) {
    case Kind::ForwardBias:
      (after ? sgemm_cpu_bias : before_sgemm_cpu_bias)(false, true, p.M, p.N, p.K, A, p.K, B, p.K, bias, C, p.N);
      break;
    case Kind::Forward:
      (after ? sgemm_cpu : before_sgemm_cpu)(false, true, p.M, p.N, p.K, 1.0f, A, p.K, B, p.K, 0.0f, C, p.N);
      break;
    case Kind::InputGrad:
      (after ? sgemm_cpu : before_sgemm_cpu)(false, false, p.M, p.N, p.K, 1.0f, A, p.K, B, p.N, 0.0f, C, p.N);
      break;
    case Kind::WeightGradBias:
      (after ? sgemm_cpu_sum_a : before_sgemm_cpu_sum_a)(false, p.M, p.N, p.K, 1.0f, A, p.M, B, p.N, 1.0f, C, p.N,
                                                          sums);
      break;
    case Kind::WeightGrad:
      (after ? sgemm_cpu : before_sgemm_cpu)(true, false, p.M, p.N, p.K, 1.0f, A, p.M, B, p.N, 1.0f, C, p.N);
      break;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[3], "warm") != 0 && std::strcmp(argv[3], "cold") != 0)) {
    std::fprintf(stderr, "usage: %s ROWS CALLS warm|cold   (ROWS = B x T: 1024 for small, 512 for deep)\n", argv[0]);
    return 2;
  }
  const int rows = std::atoi(argv[1]), calls = std::atoi(argv[2]);
  const bool cold = std::strcmp(argv[3], "cold") == 0;
  if (rows < 1 || calls < 1) {
    std::fprintf(stderr, "matmul_ab: ROWS and CALLS must be positive integers\n");
    return 2;
  }
  const int C = 128, V = 256;  // small's and deep's channels, the byte vocabulary
  struct Layer {
    const char* name;
    int OC, IC;
    bool bias;
  };
  const Layer layers[] = {{"qkv", 3 * C, C, true},
                          {"attn proj", C, C, true},
                          {"fc", 4 * C, C, true},
                          {"fc proj", C, 4 * C, true},
                          {"lm head", V, C, false}};
  std::vector<Product> products;
  for (const Layer& l : layers) {
    products.push_back({std::string(l.name) + " fwd", l.bias ? Kind::ForwardBias : Kind::Forward, rows, l.OC, l.IC});
    products.push_back({std::string(l.name) + " dinp", Kind::InputGrad, rows, l.IC, l.OC});
    products.push_back({std::string(l.name) + " dW", l.bias ? Kind::WeightGradBias : Kind::WeightGrad, l.OC, l.IC, rows});
  }
  const size_t big = size_t(std::max(rows, 4 * C)) * 4 * C;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> A(big), B(big), bias(4 * C), C_before(big), C_after(big), sums(4 * C);
  std::vector<float> other(8 << 20);  // 32 MB
  for (float& x : A) x = uniform(rng);
  for (float& x : B) x = uniform(rng);
  for (float& x : bias) x = uniform(rng);

  std::printf("%-14s %6s %6s %6s %11s %11s %7s %s\n", "product", "M", "N", "K", "before GF/s", "after GF/s",
              "after/before", "bits");
  double total[2] = {0.0, 0.0};
  for (const Product& p : products) {
    std::vector<double> seconds[2];
    bool same = true;
    for (int call = 0; call <= calls; ++call) {  // call 0 warms up
      for (int turn = 0; turn < 2; ++turn) {
        const bool after = (call % 2 == 0) == (turn == 0);
        float* c = after ? C_after.data() : C_before.data();
        std::fill(c, c + size_t(p.M) * p.N, 0.5f);
        std::fill(sums.begin(), sums.end(), 0.0f);
        if (cold) {
          for (size_t i = 0; i < other.size(); i += 16) other[i] += 1.0f;
        }
        const double start = cpu_seconds();
        run(after, p, A.data(), B.data(), bias.data(), c, sums.data());
        if (call > 0) seconds[after].push_back(cpu_seconds() - start);
      }
      same &= std::memcmp(C_before.data(), C_after.data(), sizeof(float) * p.M * p.N) == 0;
    }
    const double gflop = 2.0 * p.M * p.N * p.K / 1e9;
    const double before = median(seconds[0]), after = median(seconds[1]);
    total[0] += before;
    total[1] += after;
    std::printf("%-14s %6d %6d %6d %11.1f %11.1f %12.3f %s\n", p.name.c_str(), p.M, p.N, p.K, gflop / before,
                gflop / after, after / before, same ? "same" : "DIFFERENT");
  }
  std::printf("the 15 together: before %.2f ms, after %.2f ms, after/before %.3f\n", total[0] * 1e3,
              total[1] * 1e3, total[1] / total[0]);
  return 0;
}
