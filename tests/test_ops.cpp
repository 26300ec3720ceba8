// test_ops.cpp: every op of ops.h, called through ops.h on CPU tensors, against independent references.
// Forward passes are compared with straightforward float64 versions written here. Backward passes are
// compared with central finite differences of those float64 versions, for inputs and parameters alike,
// and each backward is called twice on the same gradient buffers to check that it accumulates (the
// second call must leave twice the gradient). Sizes are small and partly odd (T = 5, V = 11, C = 7 in
// layernorm and matmul) so that no loop hides behind a multiple of a vector width.
//
// The ops of tensor parallelism (vocabulary slices of the embedding and the cross-entropy, runs of
// positions, the two halves of the matmul backward, the bias ops) are compared with the unsplit ops
// they replace, bit for bit where they add the same numbers in the same order, and the sliced
// cross-entropy to a relative 1e-6 (its partial sums cross the stages in fp32).
//
// Tolerances, fp32 ops against float64 references:
//   forward:   atol 1e-5, rtol 1e-4 (a few fp32 roundings of values of order 1)
//   gradients: atol 1e-5, rtol 1e-3 against finite differences with step h = 1e-3 in float64, whose own
//              error is O(h^2) ~ 1e-6 for these smooth functions of inputs of order 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "ops/fast_math.h"
#include "ops/ops.h"
#include "test_util.h"

namespace {

constexpr int B = 2, T = 5, C = 8, NH = 2, V = 11;

constexpr double kForwardAtol = 1e-5, kForwardRtol = 1e-4;
constexpr double kGradAtol = 1e-5, kGradRtol = 1e-3;
constexpr double kFiniteDifferenceStep = 1e-3;

using Vec = std::vector<double>;
using Function = std::function<Vec(const Vec&)>;

// A CPU fp32 view of a test's vector.
Tensor view(std::vector<float>& values, std::initializer_list<int64_t> shape) {
  Tensor t = make_view(values.data(), shape);
  EXPECT_EQ(size_t(t.numel()), values.size()) << "test bug: shape does not match the vector";
  return t;
}

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }

Vec scaled(const Vec& x, double factor) {
  Vec y(x);
  for (double& v : y) v *= factor;
  return y;
}

// d/dx of the scalar sum_i weights[i] * f(x)[i], by central differences (L(x+h) - L(x-h)) / 2h per
// element. Choosing random weights (the role of dout) makes this one scalar test every output.
Vec numerical_gradient(const Function& f, Vec x, const Vec& weights) {
  auto weighted_sum = [&](const Vec& y) {
    EXPECT_EQ(y.size(), weights.size());
    double s = 0.0;
    for (size_t i = 0; i < y.size(); i++) s += weights[i] * y[i];
    return s;
  };
  const double h = kFiniteDifferenceStep;
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = weighted_sum(f(x));
    x[i] = saved - h;
    const double minus = weighted_sum(f(x));
    x[i] = saved;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

// ---------------------------------------------------------------------------------------------------------
// float64 references, written for clarity, not speed

Vec encoder_reference(const std::vector<int>& tokens, const Vec& wte, const Vec& wpe) {
  Vec out(size_t(B) * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

Vec layernorm_reference(const Vec& inp, const Vec& weight, const Vec& bias, int N, int C_, Vec* mean = nullptr,
                        Vec* rstd = nullptr) {
  Vec out(inp.size());
  for (int i = 0; i < N; i++) {
    double m = 0.0;
    for (int c = 0; c < C_; c++) m += inp[i * C_ + c];
    m /= C_;
    double var = 0.0;
    for (int c = 0; c < C_; c++) var += (inp[i * C_ + c] - m) * (inp[i * C_ + c] - m);
    var /= C_;
    const double s = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C_; c++) out[i * C_ + c] = (inp[i * C_ + c] - m) * s * weight[c] + bias[c];
    if (mean) (*mean)[i] = m;
    if (rstd) (*rstd)[i] = s;
  }
  return out;
}

// bias may be empty
Vec matmul_reference(const Vec& inp, const Vec& weight, const Vec& bias, int N, int C_, int OC) {
  Vec out(size_t(N) * OC);
  for (int i = 0; i < N; i++)
    for (int o = 0; o < OC; o++) {
      double sum = bias.empty() ? 0.0 : bias[o];
      for (int c = 0; c < C_; c++) sum += inp[i * C_ + c] * weight[o * C_ + c];
      out[i * OC + o] = sum;
    }
  return out;
}

// qkv(B,T,3C) -> out(B,T,C); optionally the causal part of preatt and all of att, (B,NH,T,T).
Vec attention_reference(const Vec& qkv, Vec* preatt = nullptr, Vec* att = nullptr) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  auto q = [&](int b, int t, int h, int i) { return qkv[(b * T + t) * 3 * C + h * hs + i]; };
  auto k = [&](int b, int t, int h, int i) { return qkv[(b * T + t) * 3 * C + C + h * hs + i]; };
  auto v = [&](int b, int t, int h, int i) { return qkv[(b * T + t) * 3 * C + 2 * C + h * hs + i]; };
  Vec out(size_t(B) * T * C, 0.0);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        Vec scores(t + 1);
        for (int t2 = 0; t2 <= t; t2++) {
          double dot = 0.0;
          for (int i = 0; i < hs; i++) dot += q(b, t, h, i) * k(b, t2, h, i);
          scores[t2] = dot * scale;
        }
        const double maxval = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double s : scores) sum += std::exp(s - maxval);
        for (int t2 = 0; t2 < T; t2++) {
          const size_t at = ((size_t(b) * NH + h) * T + t) * T + t2;
          const double weight = t2 <= t ? std::exp(scores[t2] - maxval) / sum : 0.0;
          if (preatt && t2 <= t) (*preatt)[at] = scores[t2];
          if (att) (*att)[at] = weight;
          if (t2 <= t)
            for (int i = 0; i < hs; i++) out[(b * T + t) * C + h * hs + i] += weight * v(b, t2, h, i);
        }
      }
  return out;
}

// The entries t2 <= t of every (B,NH) block of T x T scores, the only ones the contract defines.
template <typename Number>
std::vector<Number> causal_part(const std::vector<Number>& scores) {
  std::vector<Number> kept;
  for (int bh = 0; bh < B * NH; bh++)
    for (int t = 0; t < T; t++)
      for (int t2 = 0; t2 <= t; t2++) kept.push_back(scores[(size_t(bh) * T + t) * T + t2]);
  return kept;
}

Vec gelu_reference(const Vec& x) {
  Vec y(x.size());
  const double pi = std::acos(-1.0);
  for (size_t i = 0; i < x.size(); i++)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

// -log softmax(logits row)[target], without the max-subtraction trick: float64 has the range for it.
Vec crossentropy_reference(const Vec& logits, const std::vector<int>& targets, int N, int V_,
                           Vec* probs = nullptr) {
  Vec losses(N);
  for (int i = 0; i < N; i++) {
    double sum = 0.0;
    for (int v = 0; v < V_; v++) sum += std::exp(logits[i * V_ + v]);
    for (int v = 0; v < V_; v++)
      if (probs) (*probs)[i * V_ + v] = std::exp(logits[i * V_ + v]) / sum;
    losses[i] = -std::log(std::exp(logits[i * V_ + targets[i]]) / sum);
  }
  return losses;
}

// ---------------------------------------------------------------------------------------------------------
// encoder

TEST(Encoder, ForwardMatchesReference) {
  const int maxT = T + 2;  // the position table is longer than the sequence, as in training
  auto tokens = random_ints(B * T, V, 1);
  auto wte = random_vector(V * C, 2), wpe = random_vector(maxT * C, 3);
  auto out = zeros(B * T * C);
  encoder_forward(view(out, {B, T, C}), tokens.data(), view(wte, {V, C}), view(wpe, {maxT, C}), B, T);
  EXPECT_TRUE(allclose(out, encoder_reference(tokens, to_double(wte), to_double(wpe)), kForwardAtol,
                       kForwardRtol));
}

TEST(Encoder, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int maxT = T + 2;
  // ids below 4 only, so tokens repeat (their gradients must add up) and most rows of wte stay unused
  auto tokens = random_ints(B * T, 4, 4);
  auto wte = random_vector(V * C, 5), wpe = random_vector(maxT * C, 6), dout = random_vector(B * T * C, 7);
  auto dwte = zeros(V * C), dwpe = zeros(maxT * C);

  const Vec wte_d = to_double(wte), wpe_d = to_double(wpe), dout_d = to_double(dout);
  Vec dwte_ref = numerical_gradient([&](const Vec& x) { return encoder_reference(tokens, x, wpe_d); }, wte_d,
                                    dout_d);
  Vec dwpe_ref = numerical_gradient([&](const Vec& x) { return encoder_reference(tokens, wte_d, x); }, wpe_d,
                                    dout_d);

  for (int call = 1; call <= 2; call++) {
    encoder_backward(view(dwte, {V, C}), view(dwpe, {maxT, C}), view(dout, {B, T, C}), tokens.data(), B, T);
    SCOPED_TRACE("after backward call " + std::to_string(call));
    EXPECT_TRUE(allclose(dwte, scaled(dwte_ref, call), kGradAtol, kGradRtol));
    EXPECT_TRUE(allclose(dwpe, scaled(dwpe_ref, call), kGradAtol, kGradRtol));
  }
}

// ---------------------------------------------------------------------------------------------------------
// the encoder split as tensor parallelism splits it: the vocabulary into slices (embedding_*), the
// positions into runs of rows (position_*). Exact: the same additions in the same order.

// Each slice of the vocabulary holds some of the tokens: otherwise a test below would prove less.
void expect_every_slice_hit(const std::vector<int>& ids, int slices) {
  for (auto [begin, end] : vocabulary_slices(V, slices))
    EXPECT_TRUE(std::any_of(ids.begin(), ids.end(), [&](int id) { return begin <= id && id < end; }))
        << "test bug: no id in [" << begin << ", " << end << ")";
}

constexpr int SB = 8;  // sequences of the vocabulary-slice tests: 40 positions, so that tokens repeat

TEST(EmbeddingSlices, SlicesSumToTheEncodersLookup) {
  const int N = SB * T, maxT = T + 2;
  auto tokens = random_ints(N, V, 90);
  auto wte = random_vector(V * C, 91), wpe = random_vector(maxT * C, 92);
  auto encoded = zeros(N * C);
  encoder_forward(view(encoded, {SB, T, C}), tokens.data(), view(wte, {V, C}), view(wpe, {maxT, C}), SB, T);

  for (int slices = 1; slices <= 4; slices++) {
    SCOPED_TRACE(std::to_string(slices) + " slices");
    expect_every_slice_hit(tokens, slices);
    // Each rank's partial lookup, summed over the ranks (the all-reduce), then the positions.
    auto sum = zeros(N * C);
    for (auto [begin, end] : vocabulary_slices(V, slices)) {
      auto wte_slice = rows_of(wte, C, begin, end);
      std::vector<float> out(N * C, NAN);  // overwritten: zero rows for the other slices' tokens
      embedding_forward(view(out, {N, C}), tokens.data(), view(wte_slice, {end - begin, C}), begin, V);
      for (int i = 0; i < N * C; i++) sum[i] += out[i];
    }
    position_forward(view(sum, {N, C}), view(wpe, {maxT, C}), 0, T);
    EXPECT_TRUE(allclose(sum, encoded, 0.0, 0.0));
  }
}

TEST(EmbeddingSlices, SliceGradientsAreTheEncodersRowsExactly) {
  const int N = SB * T, maxT = T + 2;
  auto tokens = random_ints(N, V, 93);
  auto dout = random_vector(N * C, 94);
  // Nonzero starting gradients: every op accumulates.
  const auto dwte_start = random_vector(V * C, 95), dwpe_start = random_vector(maxT * C, 96);
  auto dwte = dwte_start, dwpe = dwpe_start;
  encoder_backward(view(dwte, {V, C}), view(dwpe, {maxT, C}), view(dout, {SB, T, C}), tokens.data(), SB, T);

  for (int slices = 1; slices <= 4; slices++) {
    SCOPED_TRACE(std::to_string(slices) + " slices");
    expect_every_slice_hit(tokens, slices);
    for (auto [begin, end] : vocabulary_slices(V, slices)) {
      SCOPED_TRACE("slice [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
      auto dwte_slice = rows_of(dwte_start, C, begin, end);
      embedding_backward(view(dwte_slice, {end - begin, C}), view(dout, {N, C}), tokens.data(), begin, V);
      EXPECT_TRUE(allclose(dwte_slice, rows_of(dwte, C, begin, end), 0.0, 0.0));
    }
  }
  auto dwpe_alone = dwpe_start;
  position_backward(view(dwpe_alone, {maxT, C}), view(dout, {N, C}), 0, T);
  EXPECT_TRUE(allclose(dwpe_alone, dwpe, 0.0, 0.0)) << "the encoder's dwpe";
}

// Rows that are a run of the flattened positions starting anywhere: position (first_row + n) % T.
TEST(PositionSlices, RowsFromAnyFirstRowFollowTheirPositions) {
  const int N = 13, maxT = T + 2;  // 13 rows: runs that start and end in the middle of a sequence
  auto wpe = random_vector(maxT * C, 97), dout = random_vector(N * C, 98);
  for (int64_t first_row : {int64_t(0), int64_t(3), int64_t(7), int64_t(2 * T + 4), (int64_t(1) << 33) + 1}) {
    SCOPED_TRACE("first_row " + std::to_string(first_row));
    auto out = random_vector(N * C, 99), dwpe = random_vector(maxT * C, 100);  // both accumulate
    auto expected_out = out, expected_dwpe = dwpe;
    for (int n = 0; n < N; n++) {
      const int t = int((first_row + n) % T);
      for (int c = 0; c < C; c++) {
        expected_out[n * C + c] += wpe[t * C + c];
        expected_dwpe[t * C + c] += dout[n * C + c];  // in row order, as the op adds
      }
    }
    position_forward(view(out, {N, C}), view(wpe, {maxT, C}), first_row, T);
    position_backward(view(dwpe, {maxT, C}), view(dout, {N, C}), first_row, T);
    EXPECT_TRUE(allclose(out, expected_out, 0.0, 0.0));
    EXPECT_TRUE(allclose(dwpe, expected_dwpe, 0.0, 0.0)) << "the rows T.. of the table stay untouched too";
  }
}

// The batch's rows cut into runs (sequence parallelism: one run per rank), each run's position ops
// called with its first row: the forward gives the whole batch's rows, and the backward, accumulating
// the runs in order into one table, the whole batch's gradient, bit for bit.
TEST(PositionSlices, RunsOfTheBatchAddUpToTheWholeBatch) {
  const int N = SB * T, maxT = T + 2;
  auto wpe = random_vector(maxT * C, 101), dout = random_vector(N * C, 102);
  auto whole = random_vector(N * C, 103), whole_dwpe = random_vector(maxT * C, 104);
  auto runs = whole, runs_dwpe = whole_dwpe;
  position_forward(view(whole, {N, C}), view(wpe, {maxT, C}), 0, T);
  position_backward(view(whole_dwpe, {maxT, C}), view(dout, {N, C}), 0, T);
  const std::vector<int> cuts = {0, 3, 11, 12, 26, N};  // runs of 3, 8, 1, 14 and 14 rows
  for (size_t r = 0; r + 1 < cuts.size(); r++) {
    const int first = cuts[r], count = cuts[r + 1] - cuts[r];
    const Tensor run = make_view(runs.data() + size_t(first) * C, {count, C});
    const Tensor run_dout = make_view(dout.data() + size_t(first) * C, {count, C});
    position_forward(run, view(wpe, {maxT, C}), first, T);
    position_backward(view(runs_dwpe, {maxT, C}), run_dout, first, T);
  }
  EXPECT_TRUE(allclose(runs, whole, 0.0, 0.0));
  EXPECT_TRUE(allclose(runs_dwpe, whole_dwpe, 0.0, 0.0));
}

// ---------------------------------------------------------------------------------------------------------
// layernorm: (B,T,LC) with an odd LC, inputs offset from zero so that subtracting the mean matters

constexpr int LC = 7;
// The layernorm tests run at LC, narrower than a vector, and at 37: the row sums' vectorized lanes
// (8 at a time) and a tail of 5.
constexpr int kLayernormWidths[] = {LC, 37};

TEST(Layernorm, ForwardMatchesReference) {
  for (const int width : kLayernormWidths) {
    SCOPED_TRACE("row width " + std::to_string(width));
    const int LC = width;  // this test's row width, in place of the file's
    const int N = B * T;
    auto inp = random_vector(N * LC, 10, 2.0f, 4.0f);
    auto weight = random_vector(LC, 11, 0.5f, 1.5f), bias = random_vector(LC, 12);
    auto out = zeros(N * LC), mean = zeros(N), rstd = zeros(N);
    layernorm_forward(view(out, {B, T, LC}), view(mean, {B, T}), view(rstd, {B, T}), view(inp, {B, T, LC}),
                      view(weight, {LC}), view(bias, {LC}));

    Vec mean_ref(N), rstd_ref(N);
    Vec out_ref = layernorm_reference(to_double(inp), to_double(weight), to_double(bias), N, LC, &mean_ref,
                                      &rstd_ref);
    EXPECT_TRUE(allclose(out, out_ref, kForwardAtol, kForwardRtol));
    EXPECT_TRUE(allclose(mean, mean_ref, kForwardAtol, kForwardRtol));
    EXPECT_TRUE(allclose(rstd, rstd_ref, kForwardAtol, kForwardRtol));
  }
}

TEST(Layernorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  for (const int width : kLayernormWidths) {
    SCOPED_TRACE("row width " + std::to_string(width));
    const int LC = width;  // this test's row width, in place of the file's
    const int N = B * T;
    auto inp = random_vector(N * LC, 13, 2.0f, 4.0f);
    auto weight = random_vector(LC, 14, 0.5f, 1.5f), bias = random_vector(LC, 15);
    auto dout = random_vector(N * LC, 16);
    auto out = zeros(N * LC), mean = zeros(N), rstd = zeros(N);
    layernorm_forward(view(out, {B, T, LC}), view(mean, {B, T}), view(rstd, {B, T}), view(inp, {B, T, LC}),
                      view(weight, {LC}), view(bias, {LC}));

    const Vec inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);
    const Vec dout_d = to_double(dout);
    Vec dinp_ref = numerical_gradient(
        [&](const Vec& x) { return layernorm_reference(x, weight_d, bias_d, N, LC); }, inp_d, dout_d);
    Vec dweight_ref = numerical_gradient(
        [&](const Vec& x) { return layernorm_reference(inp_d, x, bias_d, N, LC); }, weight_d, dout_d);
    Vec dbias_ref = numerical_gradient(
        [&](const Vec& x) { return layernorm_reference(inp_d, weight_d, x, N, LC); }, bias_d, dout_d);

    auto dinp = zeros(N * LC), dweight = zeros(LC), dbias = zeros(LC);
    for (int call = 1; call <= 2; call++) {
      layernorm_backward(view(dinp, {B, T, LC}), view(dweight, {LC}), view(dbias, {LC}), view(dout, {B, T, LC}),
                         view(inp, {B, T, LC}), view(weight, {LC}), view(mean, {B, T}), view(rstd, {B, T}));
      SCOPED_TRACE("after backward call " + std::to_string(call));
      EXPECT_TRUE(allclose(dinp, scaled(dinp_ref, call), kGradAtol, kGradRtol));
      EXPECT_TRUE(allclose(dweight, scaled(dweight_ref, call), kGradAtol, kGradRtol));
      EXPECT_TRUE(allclose(dbias, scaled(dbias_ref, call), kGradAtol, kGradRtol));
    }
  }
}

// The block's residual add and second layernorm in one call: bit for bit the two ops, at both widths.
TEST(Layernorm, WithTheResidualAddIsTheTwoOpsBitForBit) {
  for (const int width : kLayernormWidths) {
    SCOPED_TRACE("row width " + std::to_string(width));
    const int LC = width;  // this test's row width, in place of the file's
    const int N = B * T;
    auto a = random_vector(N * LC, 17, 1.0f, 3.0f), b = random_vector(N * LC, 18);
    auto weight = random_vector(LC, 19, 0.5f, 1.5f), bias = random_vector(LC, 20);
    auto sum = zeros(N * LC), out = zeros(N * LC), mean = zeros(N), rstd = zeros(N);
    residual_forward(view(sum, {N, LC}), view(a, {N, LC}), view(b, {N, LC}));
    layernorm_forward(view(out, {N, LC}), view(mean, {N}), view(rstd, {N}), view(sum, {N, LC}), view(weight, {LC}),
                      view(bias, {LC}));
    std::vector<float> fused_sum(sum.size(), std::nanf("")), fused_out(out.size(), std::nanf(""));
    std::vector<float> fused_mean(N, std::nanf("")), fused_rstd(N, std::nanf(""));
    residual_layernorm_forward(view(fused_sum, {N, LC}), view(fused_out, {N, LC}), view(fused_mean, {N}),
                               view(fused_rstd, {N}), view(a, {N, LC}), view(b, {N, LC}), view(weight, {LC}),
                               view(bias, {LC}));
    EXPECT_TRUE(allclose(fused_sum, sum, 0.0, 0.0)) << "the sum";
    EXPECT_TRUE(allclose(fused_out, out, 0.0, 0.0)) << "the layernorm";
    EXPECT_TRUE(allclose(fused_mean, mean, 0.0, 0.0)) << "mean";
    EXPECT_TRUE(allclose(fused_rstd, rstd, 0.0, 0.0)) << "rstd";
  }
}

// ---------------------------------------------------------------------------------------------------------
// matmul: inp (B,T,LC) -> out (B,T,OC), odd LC and OC

constexpr int OC = 5;

TEST(Matmul, ForwardMatchesReferenceWithAndWithoutBias) {
  const int N = B * T;
  auto inp = random_vector(N * LC, 20), weight = random_vector(OC * LC, 21), bias = random_vector(OC, 22);
  const Vec inp_d = to_double(inp), weight_d = to_double(weight);

  auto out = zeros(N * OC);
  matmul_forward(view(out, {B, T, OC}), view(inp, {B, T, LC}), view(weight, {OC, LC}), view(bias, {OC}));
  EXPECT_TRUE(allclose(out, matmul_reference(inp_d, weight_d, to_double(bias), N, LC, OC), kForwardAtol,
                       kForwardRtol));

  // Without a bias the old contents of out must not leak into the result, even NaN.
  std::fill(out.begin(), out.end(), NAN);
  matmul_forward(view(out, {B, T, OC}), view(inp, {B, T, LC}), view(weight, {OC, LC}), Tensor{});
  EXPECT_TRUE(allclose(out, matmul_reference(inp_d, weight_d, Vec{}, N, LC, OC), kForwardAtol, kForwardRtol));
}

// Shapes beyond one register block and one cache block of sgemm, so its edge handling is exercised too.
TEST(Matmul, ForwardMatchesReferenceAtLargerOddShapes) {
  const int N = 37, C_ = 300, OC_ = 45;
  auto inp = random_vector(N * C_, 23), weight = random_vector(OC_ * C_, 24), bias = random_vector(OC_, 25);
  auto out = zeros(N * OC_);
  matmul_forward(view(out, {N, OC_}), view(inp, {N, C_}), view(weight, {OC_, C_}), view(bias, {OC_}));
  // sums of 300 products: the fp32 rounding grows with the length, hence a looser atol
  EXPECT_TRUE(allclose(out, matmul_reference(to_double(inp), to_double(weight), to_double(bias), N, C_, OC_),
                       1e-4, kForwardRtol));
}

TEST(Matmul, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = B * T;
  auto inp = random_vector(N * LC, 26), weight = random_vector(OC * LC, 27), bias = random_vector(OC, 28);
  auto dout = random_vector(N * OC, 29);
  const Vec inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);
  const Vec dout_d = to_double(dout);
  Vec dinp_ref = numerical_gradient(
      [&](const Vec& x) { return matmul_reference(x, weight_d, bias_d, N, LC, OC); }, inp_d, dout_d);
  Vec dweight_ref = numerical_gradient(
      [&](const Vec& x) { return matmul_reference(inp_d, x, bias_d, N, LC, OC); }, weight_d, dout_d);
  Vec dbias_ref = numerical_gradient(
      [&](const Vec& x) { return matmul_reference(inp_d, weight_d, x, N, LC, OC); }, bias_d, dout_d);

  auto dinp = zeros(N * LC), dweight = zeros(OC * LC), dbias = zeros(OC);
  for (int call = 1; call <= 2; call++) {
    matmul_backward(view(dinp, {B, T, LC}), view(dweight, {OC, LC}), view(dbias, {OC}), view(dout, {B, T, OC}),
                    view(inp, {B, T, LC}), view(weight, {OC, LC}));
    SCOPED_TRACE("after backward call " + std::to_string(call));
    EXPECT_TRUE(allclose(dinp, scaled(dinp_ref, call), kGradAtol, kGradRtol));
    EXPECT_TRUE(allclose(dweight, scaled(dweight_ref, call), kGradAtol, kGradRtol));
    EXPECT_TRUE(allclose(dbias, scaled(dbias_ref, call), kGradAtol, kGradRtol));
  }

  // Without dbias, the other two gradients are the same.
  std::fill(dinp.begin(), dinp.end(), 0.0f);
  std::fill(dweight.begin(), dweight.end(), 0.0f);
  matmul_backward(view(dinp, {B, T, LC}), view(dweight, {OC, LC}), Tensor{}, view(dout, {B, T, OC}),
                  view(inp, {B, T, LC}), view(weight, {OC, LC}));
  EXPECT_TRUE(allclose(dinp, dinp_ref, kGradAtol, kGradRtol));
  EXPECT_TRUE(allclose(dweight, dweight_ref, kGradAtol, kGradRtol));
}

// The two halves of the backward, input first (as matmul_backward calls them) and weight first (as a
// backward that defers the weight's gradient may): matmul_backward's results bit for bit, at shapes
// beyond sgemm's blocks, from nonzero starting gradients, with and without dbias.
TEST(Matmul, BackwardHalvesAreTheWholeBackwardBitForBit) {
  const int N = 37, C_ = 300, OC_ = 45;
  auto inp = random_vector(N * C_, 110), weight = random_vector(OC_ * C_, 111), dout = random_vector(N * OC_, 112);
  const auto dinp_start = random_vector(N * C_, 113), dweight_start = random_vector(OC_ * C_, 114);
  const auto dbias_start = random_vector(OC_, 115);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with dbias" : "without dbias");
    auto dinp = dinp_start, dweight = dweight_start, dbias = dbias_start;
    matmul_backward(view(dinp, {N, C_}), view(dweight, {OC_, C_}), with_bias ? view(dbias, {OC_}) : Tensor{},
                    view(dout, {N, OC_}), view(inp, {N, C_}), view(weight, {OC_, C_}));
    for (bool input_first : {true, false}) {
      SCOPED_TRACE(input_first ? "input half first" : "weight half first");
      auto half_dinp = dinp_start, half_dweight = dweight_start, half_dbias = dbias_start;
      auto input_half = [&] {
        matmul_backward_input(view(half_dinp, {N, C_}), view(dout, {N, OC_}), view(weight, {OC_, C_}));
      };
      auto weight_half = [&] {
        matmul_backward_weight(view(half_dweight, {OC_, C_}), with_bias ? view(half_dbias, {OC_}) : Tensor{},
                               view(dout, {N, OC_}), view(inp, {N, C_}));
      };
      if (input_first) {
        input_half();
        weight_half();
      } else {
        weight_half();
        input_half();
      }
      EXPECT_TRUE(allclose(half_dinp, dinp, 0.0, 0.0)) << "dinp";
      EXPECT_TRUE(allclose(half_dweight, dweight, 0.0, 0.0)) << "dweight";
      EXPECT_TRUE(allclose(half_dbias, dbias, 0.0, 0.0)) << "dbias (unchanged without)";
    }
  }
}

// GradWrite::Overwrite, which the block's backward uses where the product (or GELU) is the first to
// write an input gradient: bit for bit what zeroing the buffer and accumulating gives, whatever the
// buffer held before (NaN here, which any read of it would carry into the result).
TEST(Matmul, OverwritingBackwardInputIsZeroThenAccumulateBitForBit) {
  const int N = 37, C_ = 300, OC_ = 45;  // beyond sgemm's register tiles and row blocks, odd edges
  auto weight = random_vector(OC_ * C_, 120), dout = random_vector(N * OC_, 121);
  auto accumulated = zeros(size_t(N) * C_);
  matmul_backward_input(view(accumulated, {N, C_}), view(dout, {N, OC_}), view(weight, {OC_, C_}));
  std::vector<float> overwritten(size_t(N) * C_, std::nanf(""));
  matmul_backward_input(view(overwritten, {N, C_}), view(dout, {N, OC_}), view(weight, {OC_, C_}),
                        GradWrite::Overwrite);
  EXPECT_TRUE(allclose(overwritten, accumulated, 0.0, 0.0));
}

TEST(Gelu, OverwritingBackwardIsZeroThenAccumulateBitForBit) {
  auto inp = random_vector(B * T * 4 * C, 122, -4.0f, 4.0f), dout = random_vector(inp.size(), 123);
  auto accumulated = zeros(inp.size());
  gelu_backward(view(accumulated, {B, T, 4 * C}), view(inp, {B, T, 4 * C}), view(dout, {B, T, 4 * C}));
  std::vector<float> overwritten(inp.size(), std::nanf(""));
  gelu_backward(view(overwritten, {B, T, 4 * C}), view(inp, {B, T, 4 * C}), view(dout, {B, T, 4 * C}),
                GradWrite::Overwrite);
  EXPECT_TRUE(allclose(overwritten, accumulated, 0.0, 0.0));
}

// The MLP's products with GELU inside them (matmul_forward_gelu, matmul_backward_input_gelu): bit for
// bit the ops apart, as the block called them before, at shapes with edge tiles, more than one depth
// slice and more than one column panel of sgemm (2100 > 2048 columns); the backward over NaN.
TEST(Matmul, GeluInsideTheProductsIsTheOpsApartBitForBit) {
  const int N = 37, C_ = 300, F = 2100;
  auto inp = random_vector(N * C_, 130), weight = random_vector(F * C_, 131), bias = random_vector(F, 132);
  auto apart = zeros(size_t(N) * F), apart_gelu = zeros(size_t(N) * F);
  matmul_forward(view(apart, {N, F}), view(inp, {N, C_}), view(weight, {F, C_}), view(bias, {F}));
  gelu_forward(view(apart_gelu, {N, F}), view(apart, {N, F}));
  std::vector<float> inside(size_t(N) * F, std::nanf("")), inside_gelu(size_t(N) * F, std::nanf(""));
  matmul_forward_gelu(view(inside, {N, F}), view(inside_gelu, {N, F}), view(inp, {N, C_}), view(weight, {F, C_}),
                      view(bias, {F}));
  EXPECT_TRUE(allclose(inside, apart, 0.0, 0.0)) << "forward: the product";
  EXPECT_TRUE(allclose(inside_gelu, apart_gelu, 0.0, 0.0)) << "forward: its GELU";

  // Backward through the projection (F -> C_): its input's gradient, then GELU's, from the forward's fch.
  auto proj = random_vector(C_ * F, 133), dout = random_vector(N * C_, 134);
  std::vector<float> dgelu(size_t(N) * F, std::nanf("")), dfch(size_t(N) * F, std::nanf(""));
  matmul_backward_input(view(dgelu, {N, F}), view(dout, {N, C_}), view(proj, {C_, F}), GradWrite::Overwrite);
  gelu_backward(view(dfch, {N, F}), view(apart, {N, F}), view(dgelu, {N, F}), GradWrite::Overwrite);
  std::vector<float> fused(size_t(N) * F, std::nanf(""));
  matmul_backward_input_gelu(view(fused, {N, F}), view(dout, {N, C_}), view(proj, {C_, F}), view(apart, {N, F}));
  EXPECT_TRUE(allclose(fused, dfch, 0.0, 0.0)) << "backward";
}

// add_bias: one addition per element, exact; bias_backward: column sums against float64, accumulating.
TEST(Bias, AddBiasAndItsBackwardMatchLoops) {
  const int N = B * T;
  auto out = random_vector(N * LC, 116), bias = random_vector(LC, 117), dout = random_vector(N * LC, 118);
  auto expected = out;
  for (int i = 0; i < N; i++)
    for (int c = 0; c < LC; c++) expected[i * LC + c] += bias[c];
  add_bias(view(out, {B, T, LC}), view(bias, {LC}));
  EXPECT_TRUE(allclose(out, expected, 0.0, 0.0));

  const auto dbias_start = random_vector(LC, 119);
  Vec column_sums(LC, 0.0);
  for (int i = 0; i < N; i++)
    for (int c = 0; c < LC; c++) column_sums[c] += dout[i * LC + c];
  auto dbias = dbias_start;
  for (int call = 1; call <= 2; call++) {
    bias_backward(view(dbias, {LC}), view(dout, {B, T, LC}));
    Vec reference(LC);
    for (int c = 0; c < LC; c++) reference[c] = dbias_start[c] + call * column_sums[c];
    SCOPED_TRACE("after backward call " + std::to_string(call));
    EXPECT_TRUE(allclose(dbias, reference, kForwardAtol, kForwardRtol));
  }
}

// ---------------------------------------------------------------------------------------------------------
// attention: qkv (B,T,3C) with NH = 2 heads of C/NH = 4 channels

TEST(Attention, ForwardMatchesReference) {
  // inputs in [-2, 2]: scores large enough that the softmax is far from uniform
  auto qkv = random_vector(B * T * 3 * C, 30, -2.0f, 2.0f);
  auto out = zeros(B * T * C), preatt = zeros(B * NH * T * T), att = zeros(B * NH * T * T);
  attention_forward(view(out, {B, T, C}), view(preatt, {B, NH, T, T}), view(att, {B, NH, T, T}),
                    view(qkv, {B, T, 3 * C}), NH);

  Vec preatt_ref(preatt.size()), att_ref(att.size());
  Vec out_ref = attention_reference(to_double(qkv), &preatt_ref, &att_ref);
  EXPECT_TRUE(allclose(out, out_ref, kForwardAtol, kForwardRtol));
  // att is defined everywhere (0 above the diagonal); preatt only on and below it
  EXPECT_TRUE(allclose(att, att_ref, kForwardAtol, kForwardRtol));
  EXPECT_TRUE(allclose(causal_part(preatt), causal_part(preatt_ref), kForwardAtol, kForwardRtol));
}

TEST(Attention, IsCausal) {
  auto qkv = random_vector(B * T * 3 * C, 31);
  auto out_before = zeros(B * T * C), out_after = zeros(B * T * C);
  auto preatt = zeros(B * NH * T * T), att = zeros(B * NH * T * T);
  attention_forward(view(out_before, {B, T, C}), view(preatt, {B, NH, T, T}), view(att, {B, NH, T, T}),
                    view(qkv, {B, T, 3 * C}), NH);

  // change the query, key and value of the last position of every sequence
  for (int b = 0; b < B; b++)
    for (int i = 0; i < 3 * C; i++) qkv[(b * T + T - 1) * 3 * C + i] += 0.5f;
  attention_forward(view(out_after, {B, T, C}), view(preatt, {B, NH, T, T}), view(att, {B, NH, T, T}),
                    view(qkv, {B, T, 3 * C}), NH);

  for (int b = 0; b < B; b++) {
    const size_t first = size_t(b) * T * C, earlier = size_t(T - 1) * C;
    SCOPED_TRACE("sequence " + std::to_string(b));
    // earlier positions cannot see the future: bit-identical
    EXPECT_TRUE(allclose(&out_after[first], &out_before[first], earlier, 0.0, 0.0));
    // ...while the last position did see the change (otherwise this test would prove nothing)
    EXPECT_FALSE(allclose(&out_after[first + earlier], &out_before[first + earlier], C, 1e-3, 0.0));
  }
}

TEST(Attention, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto qkv = random_vector(B * T * 3 * C, 32, -2.0f, 2.0f), dout = random_vector(B * T * C, 33);
  auto out = zeros(B * T * C), preatt = zeros(B * NH * T * T), att = zeros(B * NH * T * T);
  attention_forward(view(out, {B, T, C}), view(preatt, {B, NH, T, T}), view(att, {B, NH, T, T}),
                    view(qkv, {B, T, 3 * C}), NH);

  Vec dqkv_ref = numerical_gradient([](const Vec& x) { return attention_reference(x); }, to_double(qkv),
                                    to_double(dout));

  auto dqkv = zeros(B * T * 3 * C);
  for (int call = 1; call <= 2; call++) {
    // dpreatt and datt are scratch the op overwrites (ops.h): NaN on entry must not leak out
    std::vector<float> dpreatt(size_t(B) * NH * T * T, NAN), datt(size_t(B) * NH * T * T, NAN);
    attention_backward(view(dqkv, {B, T, 3 * C}), view(dpreatt, {B, NH, T, T}), view(datt, {B, NH, T, T}),
                       view(dout, {B, T, C}), view(qkv, {B, T, 3 * C}), view(att, {B, NH, T, T}), NH);
    SCOPED_TRACE("after backward call " + std::to_string(call));
    EXPECT_TRUE(allclose(dqkv, scaled(dqkv_ref, call), kGradAtol, kGradRtol));
  }
}

// The model's CPU forward does not store the scores before the softmax (an empty preatt): the same
// output and softmax, bit for bit.
TEST(Attention, ForwardWithoutTheScoresIsTheSameBitForBit) {
  const int T_ = 37;
  auto qkv = random_vector(B * T_ * 3 * C, 36, -2.0f, 2.0f);
  auto out = zeros(B * T_ * C), preatt = zeros(B * NH * T_ * T_), att = zeros(B * NH * T_ * T_);
  attention_forward(view(out, {B, T_, C}), view(preatt, {B, NH, T_, T_}), view(att, {B, NH, T_, T_}),
                    view(qkv, {B, T_, 3 * C}), NH);
  std::vector<float> out_alone(out.size(), std::nanf("")), att_alone(att.size(), std::nanf(""));
  attention_forward(view(out_alone, {B, T_, C}), Tensor(), view(att_alone, {B, NH, T_, T_}), view(qkv, {B, T_, 3 * C}),
                    NH);
  EXPECT_TRUE(allclose(out_alone, out, 0.0, 0.0)) << "out";
  EXPECT_TRUE(allclose(att_alone, att, 0.0, 0.0)) << "att";
}

// The block's backward overwrites qkv's gradient with the attention's (GradWrite::Overwrite) instead of
// zeroing it first: bit for bit the same, whatever dqkv held (NaN here), at T = 37, whose last tile
// is cut by the sequence's end.
TEST(Attention, OverwritingBackwardIsZeroThenAccumulateBitForBit) {
  const int T_ = 37;
  auto qkv = random_vector(B * T_ * 3 * C, 34, -2.0f, 2.0f), dout = random_vector(B * T_ * C, 35);
  auto out = zeros(B * T_ * C), preatt = zeros(B * NH * T_ * T_), att = zeros(B * NH * T_ * T_);
  attention_forward(view(out, {B, T_, C}), view(preatt, {B, NH, T_, T_}), view(att, {B, NH, T_, T_}),
                    view(qkv, {B, T_, 3 * C}), NH);
  auto dpreatt = zeros(preatt.size()), datt = zeros(att.size());
  auto backward = [&](std::vector<float>& dqkv, GradWrite write) {
    attention_backward(view(dqkv, {B, T_, 3 * C}), view(dpreatt, {B, NH, T_, T_}), view(datt, {B, NH, T_, T_}),
                       view(dout, {B, T_, C}), view(qkv, {B, T_, 3 * C}), view(att, {B, NH, T_, T_}), NH, write);
  };
  auto accumulated = zeros(qkv.size());
  backward(accumulated, GradWrite::Accumulate);
  std::vector<float> overwritten(qkv.size(), std::nanf(""));
  backward(overwritten, GradWrite::Overwrite);
  EXPECT_TRUE(allclose(overwritten, accumulated, 0.0, 0.0));
}

// ---------------------------------------------------------------------------------------------------------
// GELU and residual

TEST(Gelu, ForwardMatchesReference) {
  auto inp = random_vector(B * T * 4 * C, 40, -4.0f, 4.0f);  // both tails and the curved middle
  auto out = zeros(inp.size());
  gelu_forward(view(out, {B, T, 4 * C}), view(inp, {B, T, 4 * C}));
  EXPECT_TRUE(allclose(out, gelu_reference(to_double(inp)), kForwardAtol, kForwardRtol));
}

TEST(Gelu, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto inp = random_vector(B * T * 4 * C, 41, -4.0f, 4.0f), dout = random_vector(inp.size(), 42);
  Vec dinp_ref = numerical_gradient(gelu_reference, to_double(inp), to_double(dout));
  auto dinp = zeros(inp.size());
  for (int call = 1; call <= 2; call++) {
    gelu_backward(view(dinp, {B, T, 4 * C}), view(inp, {B, T, 4 * C}), view(dout, {B, T, 4 * C}));
    SCOPED_TRACE("after backward call " + std::to_string(call));
    EXPECT_TRUE(allclose(dinp, scaled(dinp_ref, call), kGradAtol, kGradRtol));
  }
}

TEST(Residual, ForwardAddsAndBackwardAccumulates) {
  auto a = random_vector(B * T * C, 43), b = random_vector(B * T * C, 44), dout = random_vector(B * T * C, 45);
  auto out = zeros(B * T * C);
  residual_forward(view(out, {B, T, C}), view(a, {B, T, C}), view(b, {B, T, C}));
  Vec sum(out.size());
  for (size_t i = 0; i < sum.size(); i++) sum[i] = double(a[i]) + double(b[i]);
  EXPECT_TRUE(allclose(out, sum, kForwardAtol, kForwardRtol));

  // d(a + b)/da = d(a + b)/db = 1: both gradients are dout, then twice dout
  auto da = zeros(B * T * C), db = zeros(B * T * C);
  for (int call = 1; call <= 2; call++) {
    residual_backward(view(da, {B, T, C}), view(db, {B, T, C}), view(dout, {B, T, C}));
    SCOPED_TRACE("after backward call " + std::to_string(call));
    EXPECT_TRUE(allclose(da, scaled(to_double(dout), call), 0.0, 0.0));
    EXPECT_TRUE(allclose(db, scaled(to_double(dout), call), 0.0, 0.0));
  }
}

// ---------------------------------------------------------------------------------------------------------
// softmax + cross-entropy: logits (B,T,V), V = 11

TEST(SoftmaxCrossentropy, ForwardMatchesReference) {
  auto logits = random_vector(B * T * V, 50, -3.0f, 3.0f);
  // One position with logits around 100: exp(100) overflows fp32, so this checks the max subtraction.
  for (int v = 0; v < V; v++) logits[3 * V + v] += 100.0f;
  auto targets = random_ints(B * T, V, 51);
  auto losses = zeros(B * T), probs = zeros(B * T * V);
  softmax_crossentropy_forward(view(losses, {B, T}), view(probs, {B, T, V}), view(logits, {B, T, V}),
                               targets.data());

  Vec probs_ref(probs.size());
  Vec losses_ref = crossentropy_reference(to_double(logits), targets, B * T, V, &probs_ref);
  EXPECT_TRUE(allclose(losses, losses_ref, kForwardAtol, kForwardRtol));
  EXPECT_TRUE(allclose(probs, probs_ref, kForwardAtol, kForwardRtol));
}

TEST(SoftmaxCrossentropy, BackwardIsGradientOfMeanLossAndOverwrites) {
  auto logits = random_vector(B * T * V, 52, -3.0f, 3.0f);
  auto targets = random_ints(B * T, V, 53);
  auto losses = zeros(B * T), probs = zeros(B * T * V);
  softmax_crossentropy_forward(view(losses, {B, T}), view(probs, {B, T, V}), view(logits, {B, T, V}),
                               targets.data());

  // the scalar being differentiated: the mean loss over all B*T positions
  auto mean_loss = [&](const Vec& x) {
    Vec l = crossentropy_reference(x, targets, B * T, V);
    double sum = 0.0;
    for (double v : l) sum += v;
    return Vec{sum / (B * T)};
  };
  Vec dlogits_ref = numerical_gradient(mean_loss, to_double(logits), Vec{1.0});

  // dlogits is overwritten, not accumulated (ops.h): NaN on entry must not leak out, and a second
  // call gives the same gradient, not twice it.
  std::vector<float> dlogits(size_t(B) * T * V, NAN);
  for (int call = 1; call <= 2; call++) {
    softmax_crossentropy_backward(view(dlogits, {B, T, V}), view(probs, {B, T, V}), targets.data(),
                                  1.0f / (B * T));
    SCOPED_TRACE("after backward call " + std::to_string(call));
    // These gradients are of order 1/(B*T) = 0.1, so atol 1e-5 is already a relative check.
    EXPECT_TRUE(allclose(dlogits, dlogits_ref, kGradAtol, kGradRtol));
  }
}

// The vocabulary-parallel cross-entropy on 2, 3 and 4 slices of V = 11 columns, with the all-reduces
// between its stages done by loops here (Max of row_max, Sum of target_logit and of row_sum, in slice
// order, in fp32 as a collective sums). Against softmax_crossentropy_forward: relative 1e-6 (the
// unsplit op keeps the sum of exponentials in double throughout; here each slice's sum is rounded to
// fp32 and the partial sums added in fp32, a few roundings of 6e-8 each). Targets: every id of the
// vocabulary, so every slice holds some; one row of logits around 100 checks the max subtraction.
TEST(CrossentropySlices, ThreeStagesMatchTheUnsplitForward) {
  const int N = 3 * V;
  auto logits = random_vector(N * V, 120, -3.0f, 3.0f);
  for (int v = 0; v < V; v++) logits[5 * V + v] += 100.0f;
  std::vector<int> targets(N);
  for (int i = 0; i < N; i++) targets[i] = (7 * i + 2) % V;
  auto losses = zeros(N), probs = zeros(N * V);
  softmax_crossentropy_forward(view(losses, {N}), view(probs, {N, V}), view(logits, {N, V}), targets.data());
  EXPECT_TRUE(allclose(losses, crossentropy_reference(to_double(logits), targets, N, V), kForwardAtol, kForwardRtol))
      << "test bug: the unsplit forward differs from float64";

  for (int slices = 2; slices <= 4; slices++) {
    SCOPED_TRACE(std::to_string(slices) + " slices");
    expect_every_slice_hit(targets, slices);
    const auto ranges = vocabulary_slices(V, slices);
    std::vector<std::vector<float>> slice_logits, slice_probs;
    for (auto [begin, end] : ranges) {
      slice_logits.push_back(columns_of(logits, V, begin, end));
      slice_probs.push_back(std::vector<float>(size_t(N) * (end - begin), NAN));  // overwritten
    }
    auto logits_of = [&](size_t k) { return view(slice_logits[k], {N, ranges[k].second - ranges[k].first}); };
    auto probs_of = [&](size_t k) { return view(slice_probs[k], {N, ranges[k].second - ranges[k].first}); };

    std::vector<float> row_max(N, -INFINITY), target_logit = zeros(N), row_sum = zeros(N);
    for (size_t k = 0; k < ranges.size(); k++) {
      std::vector<float> slice_max(N, NAN), slice_target(N, NAN);
      crossentropy_shard_max(view(slice_max, {N}), view(slice_target, {N}), logits_of(k), targets.data(),
                             ranges[k].first);
      for (int i = 0; i < N; i++) {
        row_max[i] = std::max(row_max[i], slice_max[i]);
        target_logit[i] += slice_target[i];
      }
    }
    for (size_t k = 0; k < ranges.size(); k++) {
      std::vector<float> slice_sum(N, NAN);
      crossentropy_shard_exp(probs_of(k), view(slice_sum, {N}), logits_of(k), view(row_max, {N}));
      for (int i = 0; i < N; i++) row_sum[i] += slice_sum[i];
    }
    for (size_t k = 0; k < ranges.size(); k++) {
      SCOPED_TRACE("slice " + std::to_string(k));
      std::vector<float> slice_losses(N, NAN);
      crossentropy_shard_finish(view(slice_losses, {N}), probs_of(k), view(row_max, {N}), view(row_sum, {N}),
                                view(target_logit, {N}));
      EXPECT_TRUE(allclose(slice_losses, losses, 0.0, 1e-6)) << "losses";
      EXPECT_TRUE(allclose(slice_probs[k], columns_of(probs, V, ranges[k].first, ranges[k].second), 0.0, 1e-6))
          << "probs";
    }
  }
}

// The backward of a slice, given the slice's columns of the probabilities, is the slice's columns of
// the unsplit backward, bit for bit: the one-hot lands only in the slice that holds the target (the
// first slice, vocab_begin 0, included, whose targets beyond its columns are other slices').
TEST(CrossentropySlices, SliceBackwardIsTheSliceOfTheFullBackward) {
  const int N = 3 * V;
  auto logits = random_vector(N * V, 121, -3.0f, 3.0f);
  std::vector<int> targets(N);
  for (int i = 0; i < N; i++) targets[i] = (5 * i + 1) % V;
  auto losses = zeros(N), probs = zeros(N * V);
  softmax_crossentropy_forward(view(losses, {N}), view(probs, {N, V}), view(logits, {N, V}), targets.data());
  const float dloss = 1.0f / N;
  std::vector<float> dlogits(N * V, NAN);
  softmax_crossentropy_backward(view(dlogits, {N, V}), view(probs, {N, V}), targets.data(), dloss);

  for (int slices = 1; slices <= 4; slices++) {
    SCOPED_TRACE(std::to_string(slices) + " slices");
    for (auto [begin, end] : vocabulary_slices(V, slices)) {
      SCOPED_TRACE("slice [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
      auto slice_probs = columns_of(probs, V, begin, end);
      std::vector<float> slice_dlogits(size_t(N) * (end - begin), NAN);
      softmax_crossentropy_backward(view(slice_dlogits, {N, end - begin}), view(slice_probs, {N, end - begin}),
                                    targets.data(), dloss, begin);
      EXPECT_TRUE(allclose(slice_dlogits, columns_of(dlogits, V, begin, end), 0.0, 0.0));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// AdamW: three steps against the formula of ops.h in float64

TEST(AdamW, ThreeStepsMatchReference) {
  const int n = 13;
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
  auto param = random_vector(n, 60), m = zeros(n), v = zeros(n);
  Vec param_ref = to_double(param), m_ref(n, 0.0), v_ref(n, 0.0);

  for (int step = 1; step <= 3; step++) {
    auto grad = random_vector(n, 60 + step);
    adamw_update(view(param, {n}), Tensor(), view(grad, {n}), view(m, {n}), view(v, {n}), step, lr, beta1, beta2,
                 eps, weight_decay, grad_scale);

    for (int i = 0; i < n; i++) {
      const double g = double(grad[i]) * grad_scale;
      m_ref[i] = beta1 * m_ref[i] + (1.0 - beta1) * g;
      v_ref[i] = beta2 * v_ref[i] + (1.0 - beta2) * g * g;
      const double m_hat = m_ref[i] / (1.0 - std::pow(double(beta1), step));
      const double v_hat = v_ref[i] / (1.0 - std::pow(double(beta2), step));
      param_ref[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * param_ref[i]);
    }
    SCOPED_TRACE("after step " + std::to_string(step));
    // each step moves a parameter by about lr = 1e-2; fp32 represents values near 1 to 6e-8
    EXPECT_TRUE(allclose(param, param_ref, 1e-6, 1e-5));
    EXPECT_TRUE(allclose(m, m_ref, 1e-7, 1e-5));
    EXPECT_TRUE(allclose(v, v_ref, 1e-8, 1e-5));
  }
}

// ---------------------------------------------------------------------------------------------------------
// reductions and elementwise helpers

TEST(Reductions, SumOfSquaresAndMeanMatchFloat64) {
  auto x = random_vector(1001, 70);
  double sum_sq = 0.0, sum = 0.0;
  for (float v : x) {
    sum_sq += double(v) * v;
    sum += v;
  }
  const Tensor t = view(x, {7, 11, 13});
  EXPECT_NEAR(sum_of_squares(t), sum_sq, 1e-12 * sum_sq);
  EXPECT_NEAR(mean_of(t), sum / 1001, 1e-12);
}

TEST(Reductions, AccumulateInDouble) {
  // 1e4^2 + 1000 * 1^2: in fp32, 1e8 + 1 rounds back to 1e8 (fp32 spacing there is 8), so a float
  // accumulator would return 1e8. In double every partial sum is exact.
  std::vector<float> x(1001, 1.0f);
  x[0] = 1e4f;
  EXPECT_EQ(sum_of_squares(view(x, {1001})), 100001000.0);

  x[0] = 1e8f;
  EXPECT_EQ(mean_of(view(x, {1001})), 100001000.0 / 1001);
}

TEST(Helpers, FillZeroCopyAddScale) {
  const int n = 37;
  auto a = random_vector(n, 80), b = random_vector(n, 81);
  const Vec a_d = to_double(a), b_d = to_double(b);

  auto dst = random_vector(n, 82);
  copy_tensor(view(dst, {n}), view(a, {n}));
  EXPECT_TRUE(allclose(dst, a, 0.0, 0.0));

  add_inplace(view(dst, {n}), view(b, {n}));
  Vec sum(n);
  for (int i = 0; i < n; i++) sum[i] = a_d[i] + b_d[i];
  EXPECT_TRUE(allclose(dst, sum, kForwardAtol, kForwardRtol));

  scale_inplace(view(dst, {n}), -0.25f);
  EXPECT_TRUE(allclose(dst, scaled(sum, -0.25), kForwardAtol, kForwardRtol));

  fill_zero(view(dst, {n}));
  EXPECT_TRUE(allclose(dst, zeros(n), 0.0, 0.0));
}

TEST(Helpers, CopyBetweenViewsOfDifferentShape) {
  // copy and add only need equal element counts: a (3,4) block into a flat (12) buffer
  auto src = random_vector(12, 83);
  auto dst = zeros(12);
  copy_tensor(view(dst, {12}), view(src, {3, 4}));
  EXPECT_TRUE(allclose(dst, src, 0.0, 0.0));
  add_inplace(view(dst, {2, 6}), view(src, {12}));
  EXPECT_TRUE(allclose(dst, scaled(to_double(src), 2.0), 0.0, 0.0));
}

// ---------------------------------------------------------------------------------------------------------
// The vectorized paths: fast_exp and fast_tanh against libm, and attention at a shape that runs its
// blocked loops (more than one 32-key block of scores, and head channels in a 32-wide block, an 8-wide
// block and a scalar tail), which the small shapes above never reach.

// |actual - expected| in units in the last place of expected.
double ulps(float actual, float expected) {
  const float magnitude = std::fabs(expected);
  const double ulp = double(std::nextafter(magnitude, INFINITY)) - magnitude;
  return std::fabs(double(actual) - double(expected)) / ulp;
}

TEST(FastMath, ExpWithinOneUlpOfLibm) {
  double worst = 0.0;
  float worst_at = 0.0f;
  for (double x = -87.0; x <= 88.0; x += 1.0 / 1024 + 1e-7) {  // + 1e-7: not only binary fractions
    const double e = ulps(cpu::fast_exp(float(x)), std::exp(float(x)));
    if (e > worst) {
      worst = e;
      worst_at = float(x);
    }
  }
  EXPECT_LE(worst, 1.0) << "at x = " << worst_at;
  EXPECT_EQ(cpu::fast_exp(0.0f), 1.0f);
  EXPECT_EQ(cpu::fast_exp(-100.0f), 0.0f);  // where expf is subnormal or 0
  EXPECT_EQ(cpu::fast_exp(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::fast_exp(100.0f), INFINITY);
  EXPECT_TRUE(std::isnan(cpu::fast_exp(NAN)));
}

TEST(FastMath, TanhWithinEightUlpsOfLibm) {
  double worst = 0.0;
  float worst_at = 0.0f;
  for (double x = -12.0; x <= 12.0; x += 1.0 / 4096 + 1e-7) {
    const double e = ulps(cpu::fast_tanh(float(x)), std::tanh(float(x)));
    if (e > worst) {
      worst = e;
      worst_at = float(x);
    }
  }
  EXPECT_LE(worst, 8.0) << "at x = " << worst_at;
  EXPECT_EQ(cpu::fast_tanh(20.0f), 1.0f);
  EXPECT_EQ(cpu::fast_tanh(-20.0f), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::fast_tanh(NAN)));
}

// The CPU attention works in tiles of 6 queries x 16 (or 8) keys or channels: shapes whose edges cut
// through tiles. (T, head size): 37 keys, 43 = 16 + 16 + 8 + 3 channels; T = 32, where the queries'
// tiles (36 rows) reach past the keys' (32 columns); the odd preset's 17 and 5 (narrower than a
// vector); tiny's 64 and 16.
class AttentionShapes : public ::testing::TestWithParam<std::pair<int, int>> {};
INSTANTIATE_TEST_SUITE_P(Attention, AttentionShapes,
                         ::testing::Values(std::make_pair(37, 43), std::make_pair(32, 5), std::make_pair(17, 5),
                                           std::make_pair(64, 16)));

TEST_P(AttentionShapes, TiledLoopsMatchTheFloat64Reference) {
  const int Bq = 2, Tq = GetParam().first, NHq = 2, hs = GetParam().second, Cq = NHq * hs;
  const double scale = 1.0 / std::sqrt(double(hs));
  auto qkv = random_vector(size_t(Bq) * Tq * 3 * Cq, 90, -1.0f, 1.0f);
  auto dout = random_vector(size_t(Bq) * Tq * Cq, 91);
  const Vec x = to_double(qkv), dy = to_double(dout);
  // element i of head h of part 0 (query), 1 (key) or 2 (value) at position t of sequence b
  auto at = [&](int b, int t, int part, int h, int i) {
    return (size_t(b) * Tq + t) * 3 * Cq + part * Cq + h * hs + i;
  };

  // float64 forward and backward, written out (finite differences would take too long at this size)
  Vec out_ref(size_t(Bq) * Tq * Cq, 0.0), att_ref(size_t(Bq) * NHq * Tq * Tq, 0.0), dqkv_ref(x.size(), 0.0);
  for (int b = 0; b < Bq; b++)
    for (int h = 0; h < NHq; h++)
      for (int t = 0; t < Tq; t++) {
        Vec p(t + 1);
        for (int t2 = 0; t2 <= t; t2++) {
          double dot = 0.0;
          for (int i = 0; i < hs; i++) dot += x[at(b, t, 0, h, i)] * x[at(b, t2, 1, h, i)];
          p[t2] = dot * scale;
        }
        const double maxval = *std::max_element(p.begin(), p.end());
        double sum = 0.0;
        for (double& v : p) sum += v = std::exp(v - maxval);
        for (double& v : p) v /= sum;
        const double* dy_t = &dy[(size_t(b) * Tq + t) * Cq + h * hs];
        Vec dp(t + 1);
        double weighted = 0.0;
        for (int t2 = 0; t2 <= t; t2++) {
          att_ref[((size_t(b) * NHq + h) * Tq + t) * Tq + t2] = p[t2];
          for (int i = 0; i < hs; i++) {
            out_ref[(size_t(b) * Tq + t) * Cq + h * hs + i] += p[t2] * x[at(b, t2, 2, h, i)];
            dp[t2] += dy_t[i] * x[at(b, t2, 2, h, i)];
            dqkv_ref[at(b, t2, 2, h, i)] += p[t2] * dy_t[i];
          }
          weighted += p[t2] * dp[t2];
        }
        for (int t2 = 0; t2 <= t; t2++) {
          const double ds = p[t2] * (dp[t2] - weighted) * scale;
          for (int i = 0; i < hs; i++) {
            dqkv_ref[at(b, t, 0, h, i)] += ds * x[at(b, t2, 1, h, i)];
            dqkv_ref[at(b, t2, 1, h, i)] += ds * x[at(b, t, 0, h, i)];
          }
        }
      }

  auto out = zeros(out_ref.size()), preatt = zeros(att_ref.size()), att = zeros(att_ref.size());
  attention_forward(view(out, {Bq, Tq, Cq}), view(preatt, {Bq, NHq, Tq, Tq}), view(att, {Bq, NHq, Tq, Tq}),
                    view(qkv, {Bq, Tq, 3 * Cq}), NHq);
  EXPECT_TRUE(allclose(out, out_ref, kForwardAtol, kForwardRtol));
  EXPECT_TRUE(allclose(att, att_ref, kForwardAtol, kForwardRtol));

  auto dqkv = zeros(x.size());
  for (int call = 1; call <= 2; call++) {
    std::vector<float> dpreatt(att.size(), NAN), datt(att.size(), NAN);
    attention_backward(view(dqkv, {Bq, Tq, 3 * Cq}), view(dpreatt, {Bq, NHq, Tq, Tq}),
                       view(datt, {Bq, NHq, Tq, Tq}), view(dout, {Bq, Tq, Cq}), view(qkv, {Bq, Tq, 3 * Cq}),
                       view(att, {Bq, NHq, Tq, Tq}), NHq);
    SCOPED_TRACE("after backward call " + std::to_string(call));
    EXPECT_TRUE(allclose(dqkv, scaled(dqkv_ref, call), kGradAtol, kGradRtol));
  }
}

// What the multi-rank equivalence rests on: a head's results, forward and backward, are the same bits
// whether it is computed in a batch beside other sequences and heads (one rank) or alone (a rank of
// data, tensor or Ulysses parallelism holding a share of them). Odd sizes: T = 13 (the last tile of
// queries partly past the sequence), head size 5 (narrower than a vector).
TEST(Attention, AHeadGetsTheSameBitsAloneAsInABatch) {
  constexpr int Bq = 3, Tq = 13, NHq = 3, hs = 5, Cq = NHq * hs;
  auto qkv = random_vector(size_t(Bq) * Tq * 3 * Cq, 92, -2.0f, 2.0f);
  auto dout = random_vector(size_t(Bq) * Tq * Cq, 93);
  auto out = zeros(size_t(Bq) * Tq * Cq), preatt = zeros(size_t(Bq) * NHq * Tq * Tq), att = zeros(preatt.size());
  auto dqkv = zeros(qkv.size()), dpreatt = zeros(att.size()), datt = zeros(att.size());
  attention_forward(view(out, {Bq, Tq, Cq}), view(preatt, {Bq, NHq, Tq, Tq}), view(att, {Bq, NHq, Tq, Tq}),
                    view(qkv, {Bq, Tq, 3 * Cq}), NHq);
  attention_backward(view(dqkv, {Bq, Tq, 3 * Cq}), view(dpreatt, {Bq, NHq, Tq, Tq}), view(datt, {Bq, NHq, Tq, Tq}),
                     view(dout, {Bq, Tq, Cq}), view(qkv, {Bq, Tq, 3 * Cq}), view(att, {Bq, NHq, Tq, Tq}), NHq);

  for (int b = 0; b < Bq; b++)
    for (int h = 0; h < NHq; h++) {
      // sequence b's head h alone: its (Tq, 3 hs) part of qkv, its (Tq, hs) part of dout
      std::vector<float> qkv1(size_t(Tq) * 3 * hs), dout1(size_t(Tq) * hs);
      for (int t = 0; t < Tq; t++)
        for (int i = 0; i < hs; i++) {
          for (int part = 0; part < 3; part++)
            qkv1[(size_t(t) * 3 + part) * hs + i] = qkv[(size_t(b) * Tq + t) * 3 * Cq + part * Cq + h * hs + i];
          dout1[size_t(t) * hs + i] = dout[(size_t(b) * Tq + t) * Cq + h * hs + i];
        }
      auto out1 = zeros(size_t(Tq) * hs), preatt1 = zeros(size_t(Tq) * Tq), att1 = zeros(preatt1.size());
      auto dqkv1 = zeros(qkv1.size()), dpreatt1 = zeros(att1.size()), datt1 = zeros(att1.size());
      attention_forward(view(out1, {1, Tq, hs}), view(preatt1, {1, 1, Tq, Tq}), view(att1, {1, 1, Tq, Tq}),
                        view(qkv1, {1, Tq, 3 * hs}), 1);
      attention_backward(view(dqkv1, {1, Tq, 3 * hs}), view(dpreatt1, {1, 1, Tq, Tq}), view(datt1, {1, 1, Tq, Tq}),
                         view(dout1, {1, Tq, hs}), view(qkv1, {1, Tq, 3 * hs}), view(att1, {1, 1, Tq, Tq}), 1);

      SCOPED_TRACE("sequence " + std::to_string(b) + ", head " + std::to_string(h));
      const size_t square = (size_t(b) * NHq + h) * Tq * Tq;
      EXPECT_TRUE(allclose(&att1[0], &att[square], att1.size(), 0.0, 0.0));
      std::vector<float> out_bh(out1.size()), dqkv_bh(dqkv1.size());
      for (int t = 0; t < Tq; t++)
        for (int i = 0; i < hs; i++) {
          out_bh[size_t(t) * hs + i] = out[(size_t(b) * Tq + t) * Cq + h * hs + i];
          for (int part = 0; part < 3; part++)
            dqkv_bh[(size_t(t) * 3 + part) * hs + i] = dqkv[(size_t(b) * Tq + t) * 3 * Cq + part * Cq + h * hs + i];
        }
      EXPECT_TRUE(allclose(out1, out_bh, 0.0, 0.0));
      EXPECT_TRUE(allclose(dqkv1, dqkv_bh, 0.0, 0.0));
    }
}

}  // namespace
