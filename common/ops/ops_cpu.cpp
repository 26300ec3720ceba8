// ops_cpu.cpp: the CPU implementation of every op in ops.h (declared in ops_cpu.h) but attention, which
// is in ops_cpu_attention.cpp.
// Plain loops in the manner of llm.c's train_gpt2.c: single-threaded and deterministic, so every rank
// computes bit-identical results from identical inputs. Matrix products go through sgemm_cpu.
// Elementwise inner loops are written without branches or calls GCC cannot inline, so -O3 vectorizes
// them; reductions keep their sequential order (no -ffast-math), summing in double where that is cheap.
// Every backward ACCUMULATES (+=) into the gradients it writes, as ops.h says.
#include "ops/ops_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/check.h"       // ENSURE
#include "ops/fast_math.h"   // fast_exp, fast_tanh
#include "ops/matmul_cpu.h"  // sgemm_cpu, sgemm_cpu_bias, sgemm_cpu_sum_a, sgemm_cpu_epilogue
#include "ops/ops_cpu_internal.h"  // kLanes, sum_of_lanes, max_of, exp_shifted, dot_double

namespace cpu {

using internal::exp_shifted;
using internal::kLanes;
using internal::max_of;
using internal::sum_of_lanes;

namespace {
constexpr float kLayernormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// Token ids come from files and command lines; an id outside the table would silently read other memory.
void check_token(int token, int V, const char* what) {
  ENSURE(0 <= token && token < V,
         std::string(what) + " id " + std::to_string(token) + " is outside the vocabulary [0, " +
             std::to_string(V) + ")");
}

// The V to check targets against where an op sees only a slice of the vocabulary and is not told its
// size (the sliced cross-entropy): a target beyond the slice is legitimate, so only a negative one
// can be caught. (The unsplit forward, softmax_crossentropy_forward, checks against the vocabulary.)
constexpr int kVocabularyUnknown = std::numeric_limits<int>::max();


// The row of a slice [vocab_begin, vocab_begin + Vl) that holds `id`, or -1 when the id lies outside.
int row_in_slice(int id, int vocab_begin, int Vl) {
  const int row = id - vocab_begin;  // no overflow: both are in [0, INT_MAX]
  return 0 <= row && row < Vl ? row : -1;
}
}  // namespace

// ----------------------------------------------------------------------------------------------------------
// token and position embeddings (encoder_forward/backward in ops.cpp are these with the whole table)

void embedding_forward(float* out, const int* tokens, const float* wte, int N, int C, int vocab_begin, int Vl,
                       int vocab_size) {
  for (int n = 0; n < N; n++) {
    check_token(tokens[n], vocab_size, "token");
    const int row = row_in_slice(tokens[n], vocab_begin, Vl);
    float* out_row = out + size_t(n) * C;
    if (row < 0) {
      // Another rank's token: a zero row, so that the sum over the ranks is the lookup.
      for (int c = 0; c < C; c++) out_row[c] = 0.0f;
      continue;
    }
    const float* wte_row = wte + size_t(row) * C;
    for (int c = 0; c < C; c++) out_row[c] = wte_row[c];
  }
}

void embedding_backward(float* dwte, const float* dout, const int* tokens, int N, int C, int vocab_begin, int Vl,
                        int vocab_size) {
  // In increasing position order: a token that occurs several times in the batch receives the sum of
  // its positions' gradients, added in the same order on every slicing of the vocabulary (and by the
  // CUDA version), so the slices' rows equal the unsplit table's bit for bit.
  for (int n = 0; n < N; n++) {
    check_token(tokens[n], vocab_size, "token");
    const int row = row_in_slice(tokens[n], vocab_begin, Vl);
    if (row < 0) continue;
    const float* dout_row = dout + size_t(n) * C;
    float* dwte_row = dwte + size_t(row) * C;
    for (int c = 0; c < C; c++) dwte_row[c] += dout_row[c];
  }
}

void position_forward(float* out, const float* wpe, int N, int C, int64_t first_row, int T) {
  int t = int(first_row % T);  // the position of row 0; then one more per row, wrapping at T
  for (int n = 0; n < N; n++) {
    float* out_row = out + size_t(n) * C;
    const float* wpe_row = wpe + size_t(t) * C;
    for (int c = 0; c < C; c++) out_row[c] += wpe_row[c];
    if (++t == T) t = 0;
  }
}

void position_backward(float* dwpe, const float* dout, int N, int C, int64_t first_row, int T) {
  // In row order: a position that several rows share (every sequence of the batch) sums them in
  // increasing row order, as the CUDA version does.
  int t = int(first_row % T);
  for (int n = 0; n < N; n++) {
    const float* dout_row = dout + size_t(n) * C;
    float* dwpe_row = dwpe + size_t(t) * C;
    for (int c = 0; c < C; c++) dwpe_row[c] += dout_row[c];
    if (++t == T) t = 0;
  }
}

// ----------------------------------------------------------------------------------------------------------
// layernorm

namespace {
// One row: out_row = (x - mean) * rstd * weight + bias; returns mean and rstd through m_out, s_out.
inline void layernorm_row(float* out_row, float* m_out, float* s_out, const float* x, const float* weight,
                          const float* bias, int C) {
  // Two passes (mean, then the squared deviations) in double: the one-pass E[x^2] - E[x]^2 cancels
  // badly when the mean is large compared with the spread. Each sum runs in kLanes lanes (see
  // sum_of_lanes), so that it vectorizes.
  double sum_lanes[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes) {
    for (int j = 0; j < kLanes; j++) sum_lanes[j] += x[c + j];
  }
  double sum = sum_of_lanes(sum_lanes);
  for (; c < C; c++) sum += x[c];
  const double m = sum / C;
  double square_lanes[kLanes] = {};
  for (c = 0; c + kLanes <= C; c += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const double d = x[c + j] - m;
      square_lanes[j] += d * d;
    }
  }
  double squared_deviations = sum_of_lanes(square_lanes);
  for (; c < C; c++) {
    const double d = x[c] - m;
    squared_deviations += d * d;
  }
  float s = float(1.0 / std::sqrt(squared_deviations / C + kLayernormEps));
  float mf = float(m);
  for (int c = 0; c < C; c++) out_row[c] = (x[c] - mf) * s * weight[c] + bias[c];
  *m_out = mf;
  *s_out = s;
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  for (int i = 0; i < N; i++)
    layernorm_row(out + size_t(i) * C, &mean[i], &rstd[i], inp + size_t(i) * C, weight, bias, C);
}

void residual_layernorm_forward(float* out, float* ln, float* mean, float* rstd, const float* a, const float* b,
                                const float* weight, const float* bias, int N, int C) {
  for (int i = 0; i < N; i++) {
    const size_t at = size_t(i) * C;
    residual_forward(out + at, a + at, b + at, size_t(C));
    layernorm_row(ln + at, &mean[i], &rstd[i], out + at, weight, bias, C);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* x = inp + size_t(i) * C;
    const float* dout_row = dout + size_t(i) * C;
    float* dinp_row = dinp + size_t(i) * C;
    const float m = mean[i];
    const float s = rstd[i];

    // norm = (x - mean) * rstd depends on every x of the row through mean and rstd. Its input gradient
    // is dnorm with its mean removed and its component along norm removed, hence these two averages.
    double sum_lanes[kLanes] = {}, dot_lanes[kLanes] = {};
    int c = 0;
    for (; c + kLanes <= C; c += kLanes) {
      for (int j = 0; j < kLanes; j++) {
        const float norm = (x[c + j] - m) * s;
        const float dnorm = weight[c + j] * dout_row[c + j];
        sum_lanes[j] += dnorm;
        dot_lanes[j] += double(dnorm) * norm;
      }
    }
    double dnorm_sum = sum_of_lanes(sum_lanes), dnorm_dot_norm = sum_of_lanes(dot_lanes);
    for (; c < C; c++) {
      const float norm = (x[c] - m) * s;
      const float dnorm = weight[c] * dout_row[c];
      dnorm_sum += dnorm;
      dnorm_dot_norm += double(dnorm) * norm;
    }
    const float dnorm_mean = float(dnorm_sum / C);
    const float dnorm_norm_mean = float(dnorm_dot_norm / C);

    // Two loops rather than one: with three outputs that might overlap the inputs, GCC would need more
    // run-time overlap checks than it is willing to emit, and would leave a single loop unvectorized.
    for (int c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      dbias[c] += dout_row[c];
      dweight[c] += norm * dout_row[c];
    }
    for (int c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      float dnorm = weight[c] * dout_row[c];
      dinp_row[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

// ----------------------------------------------------------------------------------------------------------
// matmul (a linear layer: the weight is stored (OC, C), one output channel per row, as in PyTorch)

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                    int OC) {
  // out(N,OC) = inp(N,C) @ weight(OC,C)^T (+ bias): each output starts from its bias and the product
  // is added on top, inside sgemm (no separate pass writing the bias into `out`); without a bias,
  // beta = 0 tells sgemm to ignore whatever `out` held before.
  if (bias) {
    sgemm_cpu_bias(false, true, N, OC, C, inp, C, weight, C, bias, out, OC);
  } else {
    sgemm_cpu(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
  }
}

// matmul_backward (ops.cpp) is these two, in this order: the same products as one call would make.
void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C, int OC,
                           bool accumulate) {
  // dinp(N,C) += dout(N,OC) @ weight(OC,C); beta = 1: backward accumulates, beta = 0: overwrites
  sgemm_cpu(false, false, N, C, OC, 1.0f, dout, OC, weight, C, accumulate ? 1.0f : 0.0f, dinp, C);
}

void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C,
                            int OC) {
  // dweight(OC,C) += dout(N,OC)^T @ inp(N,C); beta = 1: backward accumulates. dbias += dout's column
  // sums, taken as the product packs dout: bias_backward's sums, without its pass over dout.
  if (dbias) {
    sgemm_cpu_sum_a(false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, dbias);
  } else {
    sgemm_cpu(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  }
}

void add_bias(float* out, const float* bias, int N, int C) {
  for (int i = 0; i < N; i++) {
    float* out_row = out + size_t(i) * C;
    for (int c = 0; c < C; c++) out_row[c] += bias[c];
  }
}

void bias_backward(float* dbias, const float* dout, int N, int C) {
  // Row by row, so the inner loop runs along contiguous memory and vectorizes.
  for (int i = 0; i < N; i++) {
    const float* dout_row = dout + size_t(i) * C;
    for (int c = 0; c < C; c++) dbias[c] += dout_row[c];
  }
}

// ----------------------------------------------------------------------------------------------------------
// GELU (tanh approximation) and the residual connection

namespace {
inline float gelu(float x) { return 0.5f * x * (1.0f + fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x))); }
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = gelu(inp[i]);
}

namespace {
inline float gelu_derivative(float x) {
  float tanh_out = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
  // d tanh(u)/du = 1 - tanh(u)^2 (= sech^2), reusing the tanh already computed
  float sech2 = 1.0f - tanh_out * tanh_out;
  return 0.5f * (1.0f + tanh_out) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}
}  // namespace

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, bool accumulate) {
  // Two loops rather than a test per element, so that each vectorizes.
  if (accumulate) {
    for (size_t i = 0; i < n; i++) dinp[i] += gelu_derivative(inp[i]) * dout[i];
  } else {
    for (size_t i = 0; i < n; i++) dinp[i] = gelu_derivative(inp[i]) * dout[i];
  }
}

// GELU inside the MLP's two products, applied by sgemm to each row panel of the product as it is finished
// (SgemmEpilogue): the same functions of the same values as the separate ops, so the same bits, without
// their pass over the product's output (forward: reading fch back; backward: writing and reading the
// gradient of GELU's output).
namespace {
void gelu_of_block(const SgemmEpilogue& e, float* c, int ldc, int i, int j, int mr, int nr) {
  for (int r = 0; r < mr; r++) {
    const float* __restrict c_row = c + size_t(r) * ldc;
    float* __restrict y_row = e.y + size_t(i + r) * e.ld + j;
    for (int k = 0; k < nr; k++) y_row[k] = gelu(c_row[k]);
  }
}

void gelu_derivative_times_block(const SgemmEpilogue& e, float* c, int ldc, int i, int j, int mr, int nr) {
  for (int r = 0; r < mr; r++) {
    float* __restrict c_row = c + size_t(r) * ldc;
    const float* __restrict x_row = e.x + size_t(i + r) * e.ld + j;
    for (int k = 0; k < nr; k++) c_row[k] = gelu_derivative(x_row[k]) * c_row[k];
  }
}
}  // namespace

void matmul_forward_gelu(float* out, float* out_gelu, const float* inp, const float* weight, const float* bias,
                         int N, int C, int OC) {
  const SgemmEpilogue then{gelu_of_block, nullptr, out_gelu, OC};
  sgemm_cpu_epilogue(false, true, N, OC, C, inp, C, weight, C, 0.0f, bias, out, OC, then);
}

void matmul_backward_input_gelu(float* dinp, const float* dout, const float* weight, const float* gelu_inp, int N,
                                int C, int OC) {
  const SgemmEpilogue then{gelu_derivative_times_block, gelu_inp, nullptr, C};
  sgemm_cpu_epilogue(false, false, N, C, OC, dout, OC, weight, C, 0.0f, nullptr, dinp, C, then);
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// ----------------------------------------------------------------------------------------------------------
// softmax + cross-entropy, fused: the gradient of the pair is simply probs - onehot(target)

void softmax_crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N,
                                  int V) {
  for (int i = 0; i < N; i++) {
    const float* logits_row = logits + size_t(i) * V;
    float* probs_row = probs + size_t(i) * V;
    const int target = targets[i];
    check_token(target, V, "target");

    const float maxval = max_of(logits_row, V);
    const double expsum = exp_shifted(probs_row, logits_row, maxval, V);
    const float inv_expsum = float(1.0 / expsum);
    for (int v = 0; v < V; v++) probs_row[v] *= inv_expsum;
    // -log(probs[target]) written as log(expsum) - (logit - max): finite even when probs[target]
    // underflows to 0.
    losses[i] = float(std::log(expsum) - (double(logits_row[target]) - maxval));
  }
}

void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N,
                                   int V, int vocab_begin) {
  for (int i = 0; i < N; i++) {
    const float* probs_row = probs + size_t(i) * V;
    float* dlogits_row = dlogits + size_t(i) * V;
    // With a slice of the vocabulary, a target beyond it is another rank's: only negative ids are
    // errors here (the forward checked the targets against the vocabulary).
    check_token(targets[i], kVocabularyUnknown, "target");
    for (int v = 0; v < V; v++) dlogits_row[v] = probs_row[v] * dloss;  // overwritten (ops.h)
    const int column = row_in_slice(targets[i], vocab_begin, V);
    if (column >= 0) dlogits_row[column] -= dloss;
  }
}

// The vocabulary-parallel cross-entropy: softmax_crossentropy_forward's arithmetic cut where the
// ranks must combine their rows (max, then sum). Every value that crosses a stage is fp32, as the
// all-reduces carry it, so the losses differ from the unsplit op's by a few fp32 roundings of the
// sum (relative 1e-7), not more.

void crossentropy_shard_max(float* row_max, float* target_logit, const float* logits, const int* targets, int N,
                            int Vl, int vocab_begin) {
  for (int i = 0; i < N; i++) {
    const float* logits_row = logits + size_t(i) * Vl;
    check_token(targets[i], kVocabularyUnknown, "target");
    row_max[i] = max_of(logits_row, Vl);
    // Exactly one slice holds the target: the others contribute 0 to the all-reduced sum, which is
    // then the target's logit exactly.
    const int column = row_in_slice(targets[i], vocab_begin, Vl);
    target_logit[i] = column >= 0 ? logits_row[column] : 0.0f;
  }
}

void crossentropy_shard_exp(float* probs, float* row_sum, const float* logits, const float* row_max, int N,
                            int Vl) {
  for (int i = 0; i < N; i++) {
    const float* logits_row = logits + size_t(i) * Vl;
    float* probs_row = probs + size_t(i) * Vl;
    row_sum[i] = float(exp_shifted(probs_row, logits_row, row_max[i], Vl));
  }
}

void crossentropy_shard_finish(float* losses, float* probs, const float* row_max, const float* row_sum,
                               const float* target_logit, int N, int Vl) {
  for (int i = 0; i < N; i++) {
    float* probs_row = probs + size_t(i) * Vl;
    const double expsum = row_sum[i];
    const float inv_expsum = float(1.0 / expsum);
    for (int v = 0; v < Vl; v++) probs_row[v] *= inv_expsum;
    // As in softmax_crossentropy_forward: log(expsum) - (logit - max), finite even when the target's
    // probability underflows.
    losses[i] = float(std::log(expsum) - (double(target_logit[i]) - row_max[i]));
  }
}

// ----------------------------------------------------------------------------------------------------------
// helpers for the trainers

void fill_zero(float* x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = 0.0f;
}

void copy_tensor(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

void add_inplace(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void scale_inplace(float* x, float factor, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] *= factor;
}

// x . x in kLanes lanes (dot_double), as the layernorm's sums: one running sum would be a chain of
// dependent additions, one every four cycles, which made the gradient's norm 2% of a step at deep.
double sum_of_squares(const float* x, size_t n) { return internal::dot_double(x, x, n); }

double mean_of(const float* x, size_t n) {
  ENSURE(n > 0, "mean of an empty tensor");
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += x[i];
  return sum / double(n);
}

// ----------------------------------------------------------------------------------------------------------
// AdamW

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, int step, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale) {
  ENSURE(step >= 1, "adamw step counts from 1");
  // The moments start at zero, so early on they underestimate; dividing by 1 - beta^step undoes that.
  const float bias_correction1 = 1.0f - std::pow(beta1, float(step));
  const float bias_correction2 = 1.0f - std::pow(beta2, float(step));
  for (size_t i = 0; i < n; i++) {
    float g = grad[i] * grad_scale;
    float m_i = beta1 * m[i] + (1.0f - beta1) * g;
    float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    float m_hat = m_i / bias_correction1;
    float v_hat = v_i / bias_correction2;
    // decoupled weight decay: it acts on the parameter directly, not through the adaptive moments
    param[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * param[i]);
  }
}

}  // namespace cpu
