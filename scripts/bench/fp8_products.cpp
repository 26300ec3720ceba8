// fp8_products.cpp: tokens/s of a training step's matrix products in fp8 against bf16, on a GPU's
// tensor cores through cuBLASLt (common/ops/matmul_cublaslt.h), at GPT-2 124M's width and at a wider
// one, printed beside torchtitan's published Float8 gain (docs/mixed_precision.md, "On a GPU").
//
// What is timed: for each linear layer of a block (qkv C->3C, attention projection C->C, MLP C->4C
// and 4C->C) and for the LM head (C->V), the three products a step makes over R = B*T rows, each as
// C(M,N) = A(M,K) B(N,K)^T, the only form cuBLASLt's fp8 kernels take:
//   forward  out(R, OC)  = inp(R, IC) W(OC, IC)^T        e4m3 x e4m3
//   backward dinp(R, IC) = dout(R, OC) W^T(IC, OC)^T     e5m2 x e4m3 (chapter 13's default gradients)
//   backward dW(OC, IC)  = dout^T(OC, R) inp^T(IC, R)^T  e5m2 x e4m3
// all in bf16 for the bf16 column. The LM head stays bf16 in both, as chapter 13's recipe keeps it.
// Each product's median time after a warm-up (CUDA events); a step's products are L blocks' plus the
// head's. Not timed: the casts to fp8 and the transposed copies an fp8 layer makes (Transformer
// Engine keeps them beside the weights), the attention's own products, and every elementwise op: so
// the ratio here is the products' ceiling, and a whole step gains less (Amdahl), as torchtitan's
// table does (8B on 8 H100, FSDP, torch.compile: 6,667 -> 8,532 tokens/s per GPU, 1.28x).
//
// Build: make build/fp8_products (with the tests where nvcc exists). Run, on a GPU:
//   build/fp8_products [--batch 8] [--repeats 20]
// It prints a table and one JSON line per width. Without a GPU, or without fp8 tensor cores
// (compute capability below 8.9), it says so and exits 0 (a benchmark, not a test).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ops/float_formats.h"

#ifdef GPT_WITH_CUDA
#include "ops/device.h"  // cuda_device_count
#include "ops/matmul_cublaslt.h"

namespace {

struct Width {
  const char* name;
  int L, C, T, V;
};

struct Product {
  int M, N, K;
  bool gradient;  // its A operand is a gradient (fp8: e5m2)
};

// The three products of a linear layer (OC, IC) over R rows.
void add_layer(std::vector<Product>& products, int R, int OC, int IC) {
  products.push_back({R, OC, IC, false});
  products.push_back({R, IC, OC, true});
  products.push_back({OC, IC, R, true});
}

double products_ms(const std::vector<Product>& products, bool fp8, int repeats) {
  double ms = 0;
  for (const Product& p : products) {
    const NumberFormat a = !fp8 ? NumberFormat::BF16 : p.gradient ? NumberFormat::E5M2 : NumberFormat::E4M3;
    const NumberFormat b = fp8 ? NumberFormat::E4M3 : NumberFormat::BF16;
    ms += cublaslt_product_ms(p.M, p.N, p.K, a, b, repeats);
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int batch = 8, repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
  }
  if (batch < 1 || repeats < 1) {
    std::fprintf(stderr, "fp8_products: --batch and --repeats must be >= 1\n");
    return 1;
  }
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::printf("fp8_products: no CUDA device (%s): nothing to time\n", why.c_str());
    return 0;
  }
  if (!gpu_has_fp8_tensor_cores(&why)) {
    std::printf("fp8_products: no fp8 tensor cores (%s; fp8 needs 8.9+): nothing to time\n", why.c_str());
    return 0;
  }
  // GPT-2 124M, and GPT-2's blocks at Llama 3 8B's width (4096; its depth 32): torchtitan's model.
  const Width widths[] = {{"gpt2 (124M)", 12, 768, 1024, 50304}, {"wide (C=4096, L=32)", 32, 4096, 1024, 50304}};
  std::printf("a step's matrix products on the GPU, B = %d sequences (medians of %d runs; docs/mixed_precision.md)\n",
              batch, repeats);
  std::printf("%-22s %10s %12s %12s %12s %12s %9s   %s\n", "width", "rows", "bf16 ms", "fp8 ms", "bf16 tok/s",
              "fp8 tok/s", "fp8/bf16", "torchtitan Float8 (8B, whole step)");
  for (const Width& w : widths) {
    const int R = batch * w.T, C = w.C;
    std::vector<Product> block;
    add_layer(block, R, 3 * C, C);
    add_layer(block, R, C, C);
    add_layer(block, R, 4 * C, C);
    add_layer(block, R, C, 4 * C);
    std::vector<Product> head;
    add_layer(head, R, w.V, C);
    const double head_ms = products_ms(head, false, repeats);  // bf16 in both recipes
    const double bf16_ms = w.L * products_ms(block, false, repeats) + head_ms;
    const double fp8_ms = w.L * products_ms(block, true, repeats) + head_ms;
    const double bf16_tps = R / (bf16_ms / 1e3), fp8_tps = R / (fp8_ms / 1e3);
    std::printf("%-22s %10d %12.2f %12.2f %12.0f %12.0f %8.2fx   1.28x (6,667 -> 8,532 tok/s per H100)\n", w.name, R,
                bf16_ms, fp8_ms, bf16_tps, fp8_tps, fp8_tps / bf16_tps);
    std::printf("{\"type\":\"fp8_products\",\"width\":\"%s\",\"L\":%d,\"C\":%d,\"rows\":%d,\"bf16_ms\":%.4f,"
                "\"fp8_ms\":%.4f,\"bf16_tokens_per_s\":%.1f,\"fp8_tokens_per_s\":%.1f}\n",
                w.name, w.L, C, R, bf16_ms, fp8_ms, bf16_tps, fp8_tps);
  }
  return 0;
}

#else
int main() {
  std::printf("fp8_products: built without CUDA (no nvcc): nothing to time\n");
  return 0;
}
#endif
