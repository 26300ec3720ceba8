// test_tp_layers.cpp: Megatron's layers one at a time, forward and backward, split over t = 2, 3 and
// 4 "ranks" in one process and held to the unsplit layer. The ops are the real ones of ops.h, and
// each rank's weights are cut from the whole model's by the real layout (param_layout.h's
// TensorShard): fc by rows, proj by columns, qkv by heads within each of q, k and v. What the
// collectives would do is written out as plain sums over the ranks, so that each test shows where f
// and g go:
//   - column-parallel (mlp.fc): each rank's outputs are the whole product's columns, bias included;
//     its weight and bias gradients are the whole ones' rows; its input gradient is partial, and
//     only the sum over the ranks (f's all-reduce in backward) is the whole one;
//   - row-parallel (attn.proj): the partial outputs summed (g) plus the bias once are the whole
//     output; the bias added on every rank is off by exactly (t-1) x bias, the silent bug;
//   - attention by heads: qkv cut by the layout gives each rank whole heads, whose attention is the
//     whole attention's columns; qkv cut into contiguous thirds does not;
//   - the MLP (fc, GELU, proj): nothing is exchanged between the two products.
// Tolerances, fp32. What a rank computes itself (a column of a product, a row of a weight's gradient,
// one head's attention) adds the same numbers in the same order as the unsplit op, yet is not always
// bit for bit the same: where a slice's column falls in one of the matmul's edge tiles
// (matmul_cpu.cpp), the bias is added after the sum instead of before, one rounding apart, and
// attention carries that on: atol 1e-6, rtol 1e-6. Where the ranks' partial results are added, as an
// all-reduce would: atol 1e-5, rtol 1e-5, values of order 1 summed in another order. Each pitfall
// shown (a partial gradient, a bias added t times, qkv cut into thirds) is off by far more.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/ops.h"
#include "model/param_layout.h"
#include "test_util.h"

namespace {

constexpr double kSliceAtol = 1e-6, kSliceRtol = 1e-6;
constexpr double kSummedAtol = 1e-5, kSummedRtol = 1e-5;
const int kSplits[] = {2, 3, 4};

// NH, 4C and V divide by every split; T odd so that no loop hides behind a vector width.
constexpr int B = 2, T = 5, N = B * T;
GPT2Config layer_config() {
  GPT2Config cfg;
  cfg.preset = "custom";
  cfg.L = 1; cfg.C = 48; cfg.NH = 12; cfg.T = T; cfg.V = 36;
  return cfg;
}

// Parameters and gradients in one flat layout: the whole model's, or one rank's slices of it.
struct Weights {
  ParamLayout layout;
  std::vector<float> params, grads;

  Tensor param(const std::string& name) { return view_of(params, name); }
  Tensor grad(const std::string& name) { return view_of(grads, name); }
  std::vector<float> grad_values(const std::string& name) const { return values_of(grads, name); }
  std::vector<float> param_values(const std::string& name) const { return values_of(params, name); }

 private:
  const ParamInfo& info(const std::string& name) const {
    const int i = layout.find(name);
    EXPECT_GE(i, 0) << "test bug: no parameter " << name;
    return layout.params[i];
  }
  Tensor view_of(std::vector<float>& flat, const std::string& name) {
    const ParamInfo& p = info(name);
    if (p.ndim == 2) return make_view(&flat[p.offset], {p.shape[0], p.shape[1]});
    return make_view(&flat[p.offset], {p.shape[0]});
  }
  std::vector<float> values_of(const std::vector<float>& flat, const std::string& name) const {
    const ParamInfo& p = info(name);
    return std::vector<float>(flat.begin() + p.offset, flat.begin() + p.offset + p.size);
  }
};

// Random, so that no row, column or head of a tensor equals another.
Weights whole_model() {
  Weights w;
  w.layout = build_gpt2_layout(layer_config(), 1);
  w.params = random_vector(w.layout.padded_size, 7);
  w.grads.assign(w.layout.padded_size, 0.0f);
  return w;
}

// Rank r of t's slices of the whole model, and zero gradients.
Weights rank_slices(const Weights& whole, int t, int r) {
  Weights w;
  w.layout = build_gpt2_layout(layer_config(), 1, {t, r, false});
  w.params.assign(w.layout.padded_size, 0.0f);
  slice_from_global(whole.layout, whole.params.data(), w.layout, w.params.data());
  w.grads.assign(w.layout.padded_size, 0.0f);
  return w;
}

// Rank r's slice of the whole model's gradient of `name`, cut as the layout cuts the parameter.
std::vector<float> sliced_grad(const Weights& whole, const Weights& rank, const std::string& name) {
  Weights cut = rank;
  slice_from_global(whole.layout, whole.grads.data(), cut.layout, cut.grads.data());
  return cut.grad_values(name);
}

Tensor view(std::vector<float>& values, std::initializer_list<int64_t> shape) {
  Tensor t = make_view(values.data(), shape);
  EXPECT_EQ(size_t(t.numel()), values.size()) << "test bug: shape does not match the vector";
  return t;
}

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }

void accumulate(std::vector<float>& sum, const std::vector<float>& part) {
  ASSERT_EQ(sum.size(), part.size());
  for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
}

// Every row of (rows, bias.size()) holding `bias` times `factor`.
std::vector<float> bias_rows(const std::vector<float>& bias, int rows, float factor) {
  std::vector<float> out;
  for (int n = 0; n < rows; n++)
    for (float b : bias) out.push_back(factor * b);
  return out;
}

// mlp.fc, column-parallel: the output's 4C channels are cut into t slices of rows of the weight.
TEST(ColumnParallelLinear, OutputColumnsAndWeightRowsAreTheWholeOnesAndInputGradientsSumToIt) {
  const int C = layer_config().C, OC = 4 * C;
  const std::string w = "h0.mlp.fc.weight", b = "h0.mlp.fc.bias";
  std::vector<float> x = random_vector(size_t(N) * C, 1), dout = random_vector(size_t(N) * OC, 2);
  Weights whole = whole_model();
  std::vector<float> out = zeros(size_t(N) * OC), dx = zeros(x.size());
  matmul_forward(view(out, {N, OC}), view(x, {N, C}), whole.param(w), whole.param(b));
  matmul_backward(view(dx, {N, C}), whole.grad(w), whole.grad(b), view(dout, {N, OC}), view(x, {N, C}), whole.param(w));

  for (int t : kSplits) {
    SCOPED_TRACE("t = " + std::to_string(t));
    const int OCl = OC / t;
    std::vector<float> dx_summed = zeros(x.size());
    for (int r = 0; r < t; r++) {
      SCOPED_TRACE("rank " + std::to_string(r));
      Weights mine = rank_slices(whole, t, r);
      std::vector<float> out_r = zeros(size_t(N) * OCl), dx_r = zeros(x.size());
      matmul_forward(view(out_r, {N, OCl}), view(x, {N, C}), mine.param(w), mine.param(b));  // f: the input whole
      EXPECT_TRUE(allclose(out_r, columns_of(out, OC, r * OCl, (r + 1) * OCl), kSliceAtol, kSliceRtol));
      std::vector<float> dout_r = columns_of(dout, OC, r * OCl, (r + 1) * OCl);
      matmul_backward(view(dx_r, {N, C}), mine.grad(w), mine.grad(b), view(dout_r, {N, OCl}), view(x, {N, C}),
                      mine.param(w));
      EXPECT_TRUE(allclose(mine.grad_values(w), sliced_grad(whole, mine, w), kSliceAtol, kSliceRtol));
      EXPECT_TRUE(allclose(mine.grad_values(b), sliced_grad(whole, mine, b), kSliceAtol, kSliceRtol));
      EXPECT_FALSE(allclose(dx_r, dx, kSummedAtol, kSummedRtol))
          << "one rank's input gradient already equals the whole one: f's sum would not be needed";
      accumulate(dx_summed, dx_r);
    }
    EXPECT_TRUE(allclose(dx_summed, dx, kSummedAtol, kSummedRtol));  // f's all-reduce in backward
  }
}

// attn.proj, row-parallel: its input channels (the attention's heads) are cut into t slices of
// columns of the weight; the bias stays whole on every rank.
TEST(RowParallelLinear, PartialOutputsSumToTheWholeWithTheBiasAddedOnce) {
  const int C = layer_config().C;
  const std::string w = "h0.attn.proj.weight", b = "h0.attn.proj.bias";
  std::vector<float> x = random_vector(size_t(N) * C, 3), dout = random_vector(size_t(N) * C, 4);
  Weights whole = whole_model();
  std::vector<float> out = zeros(size_t(N) * C), dx = zeros(x.size());
  matmul_forward(view(out, {N, C}), view(x, {N, C}), whole.param(w), whole.param(b));
  matmul_backward(view(dx, {N, C}), whole.grad(w), whole.grad(b), view(dout, {N, C}), view(x, {N, C}), whole.param(w));
  const std::vector<float> bias = whole.param_values(b);

  for (int t : kSplits) {
    SCOPED_TRACE("t = " + std::to_string(t));
    const int Cl = C / t;
    std::vector<float> summed = zeros(out.size()), summed_with_bias_everywhere = zeros(out.size());
    for (int r = 0; r < t; r++) {
      SCOPED_TRACE("rank " + std::to_string(r));
      Weights mine = rank_slices(whole, t, r);
      std::vector<float> x_r = columns_of(x, C, r * Cl, (r + 1) * Cl);  // this rank's heads' output
      std::vector<float> partial = zeros(out.size()), biased = zeros(out.size());
      matmul_forward(view(partial, {N, C}), view(x_r, {N, Cl}), mine.param(w), Tensor());
      matmul_forward(view(biased, {N, C}), view(x_r, {N, Cl}), mine.param(w), mine.param(b));
      accumulate(summed, partial);
      accumulate(summed_with_bias_everywhere, biased);
      // Backward: g's mirror passes the output's gradient whole to every rank, with no collective.
      std::vector<float> dx_r = zeros(x_r.size());
      matmul_backward(view(dx_r, {N, Cl}), mine.grad(w), Tensor(), view(dout, {N, C}), view(x_r, {N, Cl}),
                      mine.param(w));
      bias_backward(mine.grad(b), view(dout, {N, C}));
      EXPECT_TRUE(allclose(dx_r, columns_of(dx, C, r * Cl, (r + 1) * Cl), kSliceAtol, kSliceRtol));
      EXPECT_TRUE(allclose(mine.grad_values(w), sliced_grad(whole, mine, w), kSliceAtol, kSliceRtol));
      EXPECT_TRUE(allclose(mine.grad_values(b), whole.grad_values(b), kSliceAtol, kSliceRtol))
          << "the bias's gradient needs no sum: dout is whole on every rank";
    }
    add_bias(view(summed, {N, C}), whole.param(b));  // once, after g's all-reduce
    EXPECT_TRUE(allclose(summed, out, kSummedAtol, kSummedRtol));
    // The pitfall: a bias added before the sum is added t times.
    EXPECT_FALSE(allclose(summed_with_bias_everywhere, out, kSummedAtol, kSummedRtol));
    std::vector<float> excess = summed_with_bias_everywhere;
    for (size_t i = 0; i < excess.size(); i++) excess[i] -= summed[i];
    EXPECT_TRUE(allclose(excess, bias_rows(bias, N, float(t - 1)), kSummedAtol, kSummedRtol));
  }
}

// Attention splits by heads: the layout cuts qkv's weight and bias into q, k and v blocks and gives
// rank r the same heads' rows of each (param_layout.h), so its attention runs over whole heads.
TEST(AttentionByHeads, EachRanksHeadsGiveTheWholeAttentionsColumns) {
  const GPT2Config cfg = layer_config();
  const int C = cfg.C, NH = cfg.NH;
  const std::string w = "h0.attn.qkv.weight", b = "h0.attn.qkv.bias";
  std::vector<float> x = random_vector(size_t(N) * C, 5), dout = random_vector(size_t(N) * C, 6);
  Weights whole = whole_model();
  std::vector<float> qkv = zeros(size_t(N) * 3 * C), out = zeros(size_t(N) * C);
  std::vector<float> att = zeros(size_t(B) * NH * T * T), preatt = att, datt = att, dpreatt = att;
  std::vector<float> dqkv = zeros(qkv.size()), dx = zeros(x.size());
  matmul_forward(view(qkv, {N, 3 * C}), view(x, {N, C}), whole.param(w), whole.param(b));
  attention_forward(view(out, {B, T, C}), view(preatt, {B, NH, T, T}), view(att, {B, NH, T, T}),
                    view(qkv, {B, T, 3 * C}), NH);
  attention_backward(view(dqkv, {B, T, 3 * C}), view(dpreatt, {B, NH, T, T}), view(datt, {B, NH, T, T}),
                     view(dout, {B, T, C}), view(qkv, {B, T, 3 * C}), view(att, {B, NH, T, T}), NH);
  matmul_backward(view(dx, {N, C}), whole.grad(w), whole.grad(b), view(dqkv, {N, 3 * C}), view(x, {N, C}),
                  whole.param(w));
  const std::vector<float> whole_weight = whole.param_values(w), whole_bias = whole.param_values(b);

  // A rank's attention over the NH/t heads whose q, k and v are the rows `weight` and `bias` hold.
  auto attend = [&](std::vector<float>& weight, std::vector<float>& bias, int t, std::vector<float>* qkv_out,
                    std::vector<float>* att_out) {
    const int Cl = C / t, NHl = NH / t;
    std::vector<float> q_k_v = zeros(size_t(N) * 3 * Cl), y = zeros(size_t(N) * Cl);
    std::vector<float> scores = zeros(size_t(B) * NHl * T * T), probabilities = scores;
    matmul_forward(view(q_k_v, {N, 3 * Cl}), view(x, {N, C}), view(weight, {3 * Cl, C}), view(bias, {3 * Cl}));
    attention_forward(view(y, {B, T, Cl}), view(scores, {B, NHl, T, T}), view(probabilities, {B, NHl, T, T}),
                      view(q_k_v, {B, T, 3 * Cl}), NHl);
    if (qkv_out) *qkv_out = q_k_v;
    if (att_out) *att_out = probabilities;
    return y;
  };

  for (int t : kSplits) {
    SCOPED_TRACE("t = " + std::to_string(t));
    const int Cl = C / t, NHl = NH / t;
    std::vector<float> dx_summed = zeros(x.size());
    for (int r = 0; r < t; r++) {
      SCOPED_TRACE("rank " + std::to_string(r));
      Weights mine = rank_slices(whole, t, r);
      std::vector<float> weight_r = mine.param_values(w), bias_r = mine.param_values(b), qkv_r, att_r;
      const std::vector<float> out_r = attend(weight_r, bias_r, t, &qkv_r, &att_r);
      const std::vector<float> expected = columns_of(out, C, r * Cl, (r + 1) * Cl);
      EXPECT_TRUE(allclose(out_r, expected, kSliceAtol, kSliceRtol));

      // The naive cut, rows [r 3C/t, (r+1) 3C/t) of qkv: rank 0 then takes q's rows as q, more of q's
      // as k and k's as v, and its attention is of no head at all.
      std::vector<float> naive_weight = rows_of(whole_weight, C, r * 3 * Cl, (r + 1) * 3 * Cl);
      std::vector<float> naive_bias = rows_of(whole_bias, 1, r * 3 * Cl, (r + 1) * 3 * Cl);
      EXPECT_FALSE(allclose(attend(naive_weight, naive_bias, t, nullptr, nullptr), expected, kSummedAtol, kSummedRtol))
          << "contiguous thirds of qkv gave this rank's heads: the test cannot tell a cut by heads from them";

      std::vector<float> dout_r = columns_of(dout, C, r * Cl, (r + 1) * Cl), dqkv_r = zeros(qkv_r.size());
      std::vector<float> dx_r = zeros(x.size()), datt_r = zeros(att_r.size()), dpreatt_r = datt_r;
      attention_backward(view(dqkv_r, {B, T, 3 * Cl}), view(dpreatt_r, {B, NHl, T, T}), view(datt_r, {B, NHl, T, T}),
                         view(dout_r, {B, T, Cl}), view(qkv_r, {B, T, 3 * Cl}), view(att_r, {B, NHl, T, T}), NHl);
      matmul_backward(view(dx_r, {N, C}), mine.grad(w), mine.grad(b), view(dqkv_r, {N, 3 * Cl}), view(x, {N, C}),
                      mine.param(w));
      EXPECT_TRUE(allclose(mine.grad_values(w), sliced_grad(whole, mine, w), kSliceAtol, kSliceRtol));
      EXPECT_TRUE(allclose(mine.grad_values(b), sliced_grad(whole, mine, b), kSliceAtol, kSliceRtol));
      accumulate(dx_summed, dx_r);
    }
    EXPECT_TRUE(allclose(dx_summed, dx, kSummedAtol, kSummedRtol));  // f's all-reduce in backward
  }
}

// The MLP pair: fc column-parallel, GELU on each rank's slice of the 4C channels, proj row-parallel.
// One g after proj in forward, one f before fc in backward, and nothing between the products.
TEST(MlpPair, SplitFcGeluProjIsTheWholeMlpForwardAndBackward) {
  const int C = layer_config().C, F = 4 * C;
  const std::string fc_w = "h0.mlp.fc.weight", fc_b = "h0.mlp.fc.bias";
  const std::string proj_w = "h0.mlp.proj.weight", proj_b = "h0.mlp.proj.bias";
  std::vector<float> x = random_vector(size_t(N) * C, 8), dy = random_vector(size_t(N) * C, 9);
  Weights whole = whole_model();
  std::vector<float> h = zeros(size_t(N) * F), g = h, dg = h, dh = h, y = zeros(size_t(N) * C), dx = zeros(x.size());
  matmul_forward(view(h, {N, F}), view(x, {N, C}), whole.param(fc_w), whole.param(fc_b));
  gelu_forward(view(g, {N, F}), view(h, {N, F}));
  matmul_forward(view(y, {N, C}), view(g, {N, F}), whole.param(proj_w), whole.param(proj_b));
  matmul_backward(view(dg, {N, F}), whole.grad(proj_w), whole.grad(proj_b), view(dy, {N, C}), view(g, {N, F}),
                  whole.param(proj_w));
  gelu_backward(view(dh, {N, F}), view(h, {N, F}), view(dg, {N, F}));
  matmul_backward(view(dx, {N, C}), whole.grad(fc_w), whole.grad(fc_b), view(dh, {N, F}), view(x, {N, C}),
                  whole.param(fc_w));

  for (int t : kSplits) {
    SCOPED_TRACE("t = " + std::to_string(t));
    const int Fl = F / t;
    std::vector<float> y_summed = zeros(y.size()), dx_summed = zeros(x.size());
    for (int r = 0; r < t; r++) {
      SCOPED_TRACE("rank " + std::to_string(r));
      Weights mine = rank_slices(whole, t, r);
      std::vector<float> h_r = zeros(size_t(N) * Fl), g_r = h_r, dg_r = h_r, dh_r = h_r;
      std::vector<float> partial = zeros(y.size()), dx_r = zeros(x.size());
      matmul_forward(view(h_r, {N, Fl}), view(x, {N, C}), mine.param(fc_w), mine.param(fc_b));
      gelu_forward(view(g_r, {N, Fl}), view(h_r, {N, Fl}));
      EXPECT_TRUE(allclose(g_r, columns_of(g, F, r * Fl, (r + 1) * Fl), kSliceAtol, kSliceRtol))
          << "GELU acts on each rank's channels alone";
      matmul_forward(view(partial, {N, C}), view(g_r, {N, Fl}), mine.param(proj_w), Tensor());
      accumulate(y_summed, partial);

      matmul_backward(view(dg_r, {N, Fl}), mine.grad(proj_w), Tensor(), view(dy, {N, C}), view(g_r, {N, Fl}),
                      mine.param(proj_w));
      bias_backward(mine.grad(proj_b), view(dy, {N, C}));
      EXPECT_TRUE(allclose(dg_r, columns_of(dg, F, r * Fl, (r + 1) * Fl), kSliceAtol, kSliceRtol));
      gelu_backward(view(dh_r, {N, Fl}), view(h_r, {N, Fl}), view(dg_r, {N, Fl}));
      matmul_backward(view(dx_r, {N, C}), mine.grad(fc_w), mine.grad(fc_b), view(dh_r, {N, Fl}), view(x, {N, C}),
                      mine.param(fc_w));
      accumulate(dx_summed, dx_r);
      for (const std::string& name : {fc_w, fc_b, proj_w})
        EXPECT_TRUE(allclose(mine.grad_values(name), sliced_grad(whole, mine, name), kSliceAtol, kSliceRtol)) << name;
      EXPECT_TRUE(allclose(mine.grad_values(proj_b), whole.grad_values(proj_b), kSliceAtol, kSliceRtol));
    }
    add_bias(view(y_summed, {N, C}), whole.param(proj_b));  // g's all-reduce, then the bias once
    EXPECT_TRUE(allclose(y_summed, y, kSummedAtol, kSummedRtol));
    EXPECT_TRUE(allclose(dx_summed, dx, kSummedAtol, kSummedRtol));  // f's all-reduce in backward
  }
}

}  // namespace
