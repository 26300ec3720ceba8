// test_moe.cpp: the mixture-of-experts MLP of moe.h on the CPU: top-k and the capacity's claim order
// (the same assignments kept however the batch is split over ranks), the experts against a float64
// reference, a MoE layer split over simulated ranks against the whole batch, the balance loss
// against its formula, and the whole MoE model's gradient against finite differences (with and
// without a capacity), plus the layout of the expert tensors under expert parallelism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/memory.h"
#include "model/model.h"
#include "model/moe.h"
#include "ops/ops.h"
#include "model/param_layout.h"
#include "parallel/theory.h"  // activation_bytes, moe_activation_bytes

namespace {

// A small deterministic generator for test data.
struct Lcg {
  uint64_t state;
  float uniform() {  // in [-0.5, 0.5)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float((state >> 40) & 0xFFFF) / 65536.0f - 0.5f;
  }
};

std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  Lcg g{seed};
  std::vector<float> v(n);
  for (float& x : v) x = scale * g.uniform();
  return v;
}

Tensor view(std::vector<float>& v, int64_t rows, int64_t cols) { return make_view(v.data(), {rows, cols}); }
Tensor view(std::vector<float>& v) { return make_view(v.data(), {int64_t(v.size())}); }

GPT2Config moe_config(double capacity_factor) {
  GPT2Config cfg;
  cfg.preset = "custom";
  cfg.L = 2; cfg.C = 8; cfg.NH = 2; cfg.T = 5; cfg.V = 13;
  cfg.experts = 4; cfg.top_k = 2;
  cfg.capacity_factor = capacity_factor;
  cfg.aux_loss_coef = 0.1;
  return cfg;
}

// The expert MLPs of one layer, held in vectors, with views for ExpertMLPs.
struct Experts {
  int C, E;
  std::vector<std::vector<float>> w;  // per expert: fc_w, fc_b, proj_w, proj_b, then their gradients
  Experts(int C_, int E_) : C(C_), E(E_) {
    for (int e = 0; e < E; e++) {
      const size_t F = 4 * size_t(C);
      w.push_back(random_vector(F * C, 100 + e, 0.5f));
      w.push_back(random_vector(F, 200 + e, 0.5f));
      w.push_back(random_vector(C * F, 300 + e, 0.5f));
      w.push_back(random_vector(size_t(C), 400 + e, 0.5f));
      w.push_back(std::vector<float>(F * C));
      w.push_back(std::vector<float>(F));
      w.push_back(std::vector<float>(C * F));
      w.push_back(std::vector<float>(size_t(C)));
    }
  }
  std::vector<ExpertWeights> views() {
    std::vector<ExpertWeights> v;
    const int64_t F = 4 * int64_t(C);
    for (int e = 0; e < E; e++) {
      auto& x = w;
      const size_t b = size_t(8 * e);
      v.push_back({view(x[b], F, C), view(x[b + 1]), view(x[b + 2], C, F), view(x[b + 3]), view(x[b + 4], F, C),
                   view(x[b + 5]), view(x[b + 6], C, F), view(x[b + 7])});
    }
    return v;
  }
};

double gelu64(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Routing's pure pieces

TEST(MoERouting, TopKPicksTheLargestAndBreaksTiesToTheLowerExpert) {
  const std::vector<float> probs = {0.1f, 0.4f, 0.2f, 0.3f,    // 1, 3
                                    0.25f, 0.25f, 0.25f, 0.25f,  // ties: 0, 1
                                    0.7f, 0.1f, 0.1f, 0.1f};   // 0, then the tie 1
  std::vector<int> chosen(6);
  MoELayer::top_k(probs.data(), 3, 4, 2, chosen.data());
  EXPECT_EQ(chosen, (std::vector<int>{1, 3, 0, 1, 0, 1}));
}

TEST(MoERouting, CapacityIsFloorOfFactorTimesTokensTimesKOverE) {
  EXPECT_EQ(MoELayer::capacity_of(0, 512, 2, 4), -1);
  EXPECT_EQ(MoELayer::capacity_of(1.0, 512, 2, 4), 256);
  EXPECT_EQ(MoELayer::capacity_of(1.25, 100, 2, 8), 31);  // 31.25
  EXPECT_EQ(MoELayer::capacity_of(0.5, 10, 1, 4), 1);     // 1.25
  // Past every token, a capacity drops nothing more: a huge factor is no capacity, never an
  // overflow (1e30 once became a capacity of 0 and a refusal asking for at least 0.0078).
  EXPECT_EQ(MoELayer::capacity_of(2.0, 512, 2, 4), 512);
  EXPECT_EQ(MoELayer::capacity_of(3.0, 512, 2, 4), 512);
  EXPECT_EQ(MoELayer::capacity_of(1e30, 512, 2, 4), 512);
  EXPECT_EQ(MoELayer::capacity_of(1e308, 512, 2, 4), 512);
  EXPECT_EQ(moe_capacity_problem(1e30, 512, 2, 4), "");
}

// The claim order is the global token order: a batch split over ranks, each told how many places
// the ranks before it claimed, keeps exactly what the whole batch keeps on one rank.
TEST(MoERouting, ClaimsKeepTheSameAssignmentsHoweverTheBatchIsSplit) {
  const int E = 4, k = 2;
  const int64_t tokens = 96, A = tokens * k;
  std::vector<int> chosen(static_cast<size_t>(A));
  Lcg g{42};
  for (int64_t t = 0; t < tokens; t++) {  // skewed: expert 0 is popular
    const int first = g.uniform() < 0.1f ? 0 : int((g.uniform() + 0.5f) * E) % E;
    chosen[size_t(t * k)] = first;
    chosen[size_t(t * k + 1)] = (first + 1 + int((g.uniform() + 0.5f) * (E - 1))) % E;
  }
  const int64_t capacity = MoELayer::capacity_of(0.75, tokens, k, E);
  std::vector<char> whole(static_cast<size_t>(A));
  MoELayer::claim_capacity(chosen.data(), A, E, std::vector<int64_t>(E, 0), capacity, whole.data());
  int64_t dropped = 0;
  for (char c : whole) dropped += !c;
  ASSERT_GT(dropped, 0) << "the test wants some assignments over capacity";
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    std::vector<char> split(static_cast<size_t>(A));
    std::vector<int64_t> earlier(E, 0);
    const int64_t per_rank = A / ranks;
    for (int r = 0; r < ranks; r++) {
      const int* mine = chosen.data() + r * per_rank;
      MoELayer::claim_capacity(mine, per_rank, E, earlier, capacity, split.data() + r * per_rank);
      for (int64_t a = 0; a < per_rank; a++) earlier[size_t(mine[a])]++;
    }
    EXPECT_EQ(split, whole);
  }
}

// ---------------------------------------------------------------------------------------------
// The experts

TEST(ExpertMLPs, MatchFloat64ReferenceForwardAndBackward) {
  const int C = 6, E = 3;
  Experts x(C, E);
  const std::vector<int64_t> counts = {2, 0, 3};
  const int64_t n = 5;
  std::vector<float> rows = random_vector(size_t(n * C), 7), out(size_t(n * C));
  std::vector<float> dout = random_vector(size_t(n * C), 8), drows(size_t(n * C));
  ExpertMLPs mlps(1, C);
  auto w = x.views();
  mlps.forward(0, w, view(rows, n, C), counts, view(out, n, C));
  mlps.backward(0, w, view(dout, n, C), view(drows, n, C));
  // float64: out = proj(gelu(fc(row))) with the row's expert, and L = sum(out * dout): drows by
  // central differences of L in float64.
  auto expert_of = [&](int64_t i) { return i < 2 ? 0 : 2; };
  auto out64 = [&](const std::vector<double>& row, int e, int c) {
    const auto& fw = x.w[size_t(8 * e)];
    const auto& fb = x.w[size_t(8 * e + 1)];
    const auto& pw = x.w[size_t(8 * e + 2)];
    const auto& pb = x.w[size_t(8 * e + 3)];
    double o = pb[size_t(c)];
    for (int f = 0; f < 4 * C; f++) {
      double h = fb[size_t(f)];
      for (int j = 0; j < C; j++) h += double(fw[size_t(f * C + j)]) * row[size_t(j)];
      o += double(pw[size_t(c * 4 * C + f)]) * gelu64(h);
    }
    return o;
  };
  for (int64_t i = 0; i < n; i++) {
    std::vector<double> row(rows.begin() + i * C, rows.begin() + (i + 1) * C);
    for (int c = 0; c < C; c++)
      EXPECT_NEAR(out[size_t(i * C + c)], out64(row, expert_of(i), c), 1e-5) << "row " << i << " col " << c;
    for (int j = 0; j < C; j++) {
      auto L = [&](double delta) {
        std::vector<double> r = row;
        r[size_t(j)] += delta;
        double sum = 0;
        for (int c = 0; c < C; c++) sum += out64(r, expert_of(i), c) * dout[size_t(i * C + c)];
        return sum;
      };
      const double numeric = (L(1e-6) - L(-1e-6)) / 2e-6;
      EXPECT_NEAR(drows[size_t(i * C + j)], numeric, 1e-4) << "drows row " << i << " col " << j;
    }
  }
  // Expert 1 received no rows: its gradients stay zero; the others' are not.
  for (int w8 = 4; w8 < 8; w8++)
    for (float g : x.w[size_t(8 + w8)]) EXPECT_EQ(g, 0.0f);
  double touched = 0;
  for (float g : x.w[size_t(4)]) touched += std::fabs(g);
  EXPECT_GT(touched, 0.0);
}

// ---------------------------------------------------------------------------------------------
// One MoE layer over simulated ranks

namespace {
struct LayerRun {
  std::vector<float> out, dx, drouter;
  std::vector<std::vector<float>> expert_grads;
  std::vector<int64_t> routed, dropped, by_rank;
  double aux = 0;  // the average over the ranks of their shares: the global balance loss
};

// The layer on `ranks` simulated ranks, each with N/ranks of the tokens, their counts gathered by
// hand, then the gradients of L = sum(out * dout) + aux (averaged over the ranks like the loss).
LayerRun run_layer(int ranks, double factor, const std::vector<float>& x_all, const std::vector<float>& router,
                   const std::vector<float>& dout_all, int64_t N, int C, int E, int k) {
  LayerRun result;
  result.out.assign(size_t(N * C), 0);
  result.dx.assign(size_t(N * C), 0);
  result.drouter.assign(size_t(E * C), 0);
  Experts experts(C, E);
  const int64_t n = N / ranks;
  // The counts every rank would gather: route each rank's tokens once to learn them.
  std::vector<int32_t> all(size_t(ranks * E), 0);
  for (int r = 0; r < ranks; r++) {
    std::vector<float> probe(x_all.begin() + r * n * C, x_all.begin() + (r + 1) * n * C);
    std::vector<float> logits(size_t(n * E));
    std::vector<float> rw = router;
    matmul_forward(view(logits, n, E), view(probe, n, C), view(rw, E, C), Tensor());
    std::vector<float> probs(logits);
    for (int64_t t = 0; t < n; t++) {  // top-k of the logits is that of the softmax
      std::vector<int> chosen(static_cast<size_t>(k));
      MoELayer::top_k(probs.data() + t * E, 1, E, k, chosen.data());
      for (int c : chosen) all[size_t(r * E + c)] += 1;
    }
  }
  for (int r = 0; r < ranks; r++) {
    MoELayer layer(C, E, k, factor, 0.1, n);
    ExpertMLPs mlps(1, C);
    ExpertHooks hooks;
    hooks.rank = r, hooks.ranks = ranks;
    // The counts travel as int32, exact at any size (a float count stops being exact at 2^24).
    hooks.gather_counts = [&](Tensor mine, Tensor gathered) {
      ASSERT_EQ(gathered.numel(), int64_t(all.size()));
      for (int e = 0; e < E; e++) EXPECT_EQ(mine.i32()[e], all[size_t(r * E + e)]);
      std::memcpy(gathered.i32(), all.data(), all.size() * sizeof(int32_t));
    };
    std::vector<float> x(x_all.begin() + r * n * C, x_all.begin() + (r + 1) * n * C);
    std::vector<float> dout(dout_all.begin() + r * n * C, dout_all.begin() + (r + 1) * n * C);
    std::vector<float> rw = router, out(size_t(n * C)), dx(size_t(n * C)), drouter(size_t(E * C));
    auto w = experts.views();
    result.aux += layer.forward(0, view(x, n, C), view(rw, E, C), view(out, n, C), hooks,
                                [&](Tensor rows, const std::vector<int64_t>& counts, Tensor y) {
                                  mlps.forward(0, w, rows, counts, y);
                                }) / ranks;
    // L = sum(out * dout) sums over the tokens, whichever rank holds them; the balance loss is the
    // average of the ranks' shares, so each rank's weighs 1/ranks.
    layer.backward(view(dout, n, C), view(x, n, C), view(rw, E, C), view(dx, n, C), view(drouter, E, C),
                   1.0f / float(ranks), hooks, 0, [&](Tensor d, Tensor drows) { mlps.backward(0, w, d, drows); });
    std::copy(out.begin(), out.end(), result.out.begin() + r * n * C);
    std::copy(dx.begin(), dx.end(), result.dx.begin() + r * n * C);
    for (size_t i = 0; i < drouter.size(); i++) result.drouter[i] += drouter[i];
    result.routed = layer.stats().routed;
    result.dropped = layer.stats().dropped;
    result.by_rank = layer.stats().by_rank;
  }
  for (int e = 0; e < E; e++)
    for (int j = 4; j < 8; j++) result.expert_grads.push_back(experts.w[size_t(8 * e + j)]);
  return result;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], 1e-6 + 1e-5 * std::fabs(want[i])) << what << "[" << i << "]";
}
}  // namespace

TEST(MoELayer, SplitOverRanksEqualsTheWholeBatch) {
  const int C = 8, E = 4, k = 2;
  const int64_t N = 24;
  const std::vector<float> x = random_vector(size_t(N * C), 1), router = random_vector(size_t(E * C), 2, 2.0f);
  const std::vector<float> dout = random_vector(size_t(N * C), 3);
  for (double factor : {0.0, 0.5}) {
    SCOPED_TRACE("capacity factor " + std::to_string(factor));
    const LayerRun one = run_layer(1, factor, x, router, dout, N, C, E, k);
    if (factor > 0) {
      int64_t dropped = 0;
      for (int64_t d : one.dropped) dropped += d;
      EXPECT_GT(dropped, 0) << "a factor of 0.5 drops some assignments";
    }
    for (int ranks : {2, 3, 4}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks");
      const LayerRun split = run_layer(ranks, factor, x, router, dout, N, C, E, k);
      EXPECT_EQ(split.routed, one.routed);
      EXPECT_EQ(split.dropped, one.dropped);
      // by_rank holds each rank's counts, which add up to the whole batch's.
      ASSERT_EQ(split.by_rank.size(), size_t(ranks * E));
      for (int e = 0; e < E; e++) {
        int64_t sum = 0;
        for (int q = 0; q < ranks; q++) sum += split.by_rank[size_t(q * E + e)];
        EXPECT_EQ(sum, one.routed[size_t(e)]) << "expert " << e;
      }
      expect_close(split.out, one.out, "out");
      expect_close(split.dx, one.dx, "dx");
      expect_close(split.drouter, one.drouter, "drouter");
      for (size_t i = 0; i < one.expert_grads.size(); i++) expect_close(split.expert_grads[i], one.expert_grads[i], "expert grad");
      EXPECT_NEAR(split.aux, one.aux, 1e-7);
    }
  }
}

// aux = coef x E x sum_e f_e P_e, in float64 from the probabilities.
TEST(MoELayer, BalanceLossIsTheSwitchFormula) {
  const int C = 8, E = 4, k = 2;
  const int64_t N = 16;
  std::vector<float> x = random_vector(size_t(N * C), 11), router = random_vector(size_t(E * C), 12, 2.0f);
  std::vector<float> out(size_t(N * C));
  Experts experts(C, E);
  ExpertMLPs mlps(1, C);
  MoELayer layer(C, E, k, 0, 0.25, N);
  auto w = experts.views();
  const float aux = layer.forward(0, view(x, N, C), view(router, E, C), view(out, N, C), ExpertHooks{},
                                  [&](Tensor rows, const std::vector<int64_t>& counts, Tensor y) {
                                    mlps.forward(0, w, rows, counts, y);
                                  });
  std::vector<double> P(E, 0), f(E, 0);
  for (int64_t t = 0; t < N; t++) {
    std::vector<double> p(E);
    double top = -1e30, sum = 0;
    for (int e = 0; e < E; e++) {
      double z = 0;
      for (int c = 0; c < C; c++) z += double(x[size_t(t * C + c)]) * router[size_t(e * C + c)];
      p[size_t(e)] = z, top = std::max(top, z);
    }
    for (double& v : p) sum += (v = std::exp(v - top));
    std::vector<float> pf(E);
    for (int e = 0; e < E; e++) P[size_t(e)] += (p[size_t(e)] /= sum) / N, pf[size_t(e)] = float(p[size_t(e)]);
    std::vector<int> chosen(k);
    MoELayer::top_k(pf.data(), 1, E, k, chosen.data());
    for (int c : chosen) f[size_t(c)] += 1.0 / (k * N);
  }
  double expected = 0;
  for (int e = 0; e < E; e++) expected += f[size_t(e)] * P[size_t(e)];
  expected *= 0.25 * E;
  EXPECT_NEAR(aux, expected, 1e-6);
  int64_t routed = 0;
  for (int64_t r : layer.stats().routed) routed += r;
  EXPECT_EQ(routed, N * k);
}

// ---------------------------------------------------------------------------------------------
// The whole MoE model

namespace {
struct MoEFixture {
  GPT2Config cfg;
  ParamLayout layout;
  int B = 2;
  Buffer params, grads;
  std::vector<int> inputs, targets;
  std::unique_ptr<GPT2> model;

  explicit MoEFixture(double capacity_factor) : cfg(moe_config(capacity_factor)), layout(build_gpt2_layout(cfg, 1)) {
    params = Buffer(layout.padded_size, MemCategory::Params);
    grads = Buffer(layout.padded_size, MemCategory::Grads);
    model = std::make_unique<GPT2>(cfg, layout, B);
    GPT2::init_weights(layout, 7, params.f32());
    uint64_t state = 12345;
    for (int64_t i = 0; i < layout.padded_size; i++) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      params.f32()[i] += 0.3f * (float((state >> 40) & 0xFFFF) / 65535.0f - 0.5f);
    }
    for (int i = 0; i < B * cfg.T; i++) {
      inputs.push_back((i * 7 + 3) % cfg.V);
      targets.push_back((i * 5 + 1) % cfg.V);
    }
    model->bind_all(params.f32(), grads.f32());
  }
  float loss() { return model->forward(inputs.data(), targets.data(), B); }
};
}  // namespace

// Every tensor kind (router, each expert's four, attention, embeddings) against central differences.
// Top-k is piecewise constant: a difference that moves a token to another expert measures a jump, not
// the derivative; such a probe (the routing differs between the two sides) is skipped and counted.
TEST(MoEModel, GradientMatchesFiniteDifferences) {
  for (double factor : {0.0, 0.75}) {
    SCOPED_TRACE("capacity factor " + std::to_string(factor));
    MoEFixture f(factor);
    f.loss();
    if (factor > 0) {
      int64_t dropped = 0;
      for (int l = 0; l < f.cfg.L; l++)
        for (int64_t d : f.model->routing(l).dropped) dropped += d;
      EXPECT_GT(dropped, 0) << "a factor of 0.75 drops assignments on this batch";
    }
    f.model->backward(1.0f);
    auto routing_now = [&] {
      std::vector<int64_t> r;
      for (int l = 0; l < f.cfg.L; l++)
        for (int64_t c : f.model->routing(l).routed) r.push_back(c);
      return r;
    };
    const std::vector<int64_t> routed = routing_now();
    const float h = 1e-2f;
    int checked = 0, skipped = 0;
    for (const ParamInfo& p : f.layout.params) {
      for (int64_t j : {int64_t(0), p.size / 2, p.size - 1}) {
        float* w = f.params.f32() + p.offset + j;
        const float saved = *w;
        *w = saved + h;
        const double up = f.loss();
        const bool same_up = routing_now() == routed;
        *w = saved - h;
        const double down = f.loss();
        const bool same_down = routing_now() == routed;
        *w = saved;
        if (!same_up || !same_down) {
          skipped++;
          continue;
        }
        const double numeric = (up - down) / (2 * h);
        const double analytic = f.grads.f32()[p.offset + j];
        EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << p.name << "[" << j << "]";
        checked++;
      }
    }
    EXPECT_GE(checked, 3 * int(f.layout.params.size()) * 9 / 10) << skipped << " probes changed the routing";
  }
}

// The MoE layers' activations (docs/theory.md, 14; moe_activation_bytes): the model holds the arena
// and the buffers fixed by shape; a step's peak adds exactly 9C fp32 per row its experts ran in each
// layer and the backward's scratch for the layer with the most, at the rows the routing gave
// (fewer with a capacity), and a finished step holds nothing more. Fails if a buffer is sized by a
// high-water mark, or grown with the old block still counted, or kept past the backward.
TEST(MoEModel, ActivationsEqualTheFormulaAtTheRoutingCounts) {
  for (double factor : {0.0, 0.75}) {
    SCOPED_TRACE("capacity factor " + std::to_string(factor));
    const int64_t before = memory_stats().current[int(MemCategory::Activations)];
    MoEFixture f(factor);
    const std::vector<int64_t> no_rows(size_t(f.cfg.L), 0);
    const int64_t held = memory_stats().current[int(MemCategory::Activations)] - before;
    const double arena = activation_bytes(f.cfg, f.B, DType::F32, false);
    EXPECT_EQ(double(held), arena + moe_activation_bytes(f.cfg, f.B, no_rows));
    for (int step = 0; step < 2; step++) {
      reset_memory_peaks();
      f.loss();
      f.model->backward(1.0f);
      std::vector<int64_t> rows;  // on one rank: every kept assignment
      for (int l = 0; l < f.cfg.L; l++) {
        const RoutingStats& r = f.model->routing(l);
        int64_t kept = 0;
        for (int e = 0; e < f.cfg.experts; e++) kept += r.routed[size_t(e)] - r.dropped[size_t(e)];
        rows.push_back(kept);
      }
      if (factor == 0) EXPECT_EQ(rows[0], moe_expert_rows_balanced(f.cfg, f.B));  // every assignment kept
      else EXPECT_LT(rows[0] + rows[1], 2 * moe_expert_rows_balanced(f.cfg, f.B));
      const MemoryStats& mem = memory_stats();
      const double peak = double(mem.peak[int(MemCategory::Activations)] - before);
      EXPECT_EQ(peak, arena + moe_activation_bytes(f.cfg, f.B, rows));
      EXPECT_EQ(mem.current[int(MemCategory::Activations)] - before, held) << "a finished step holds no expert rows";
      EXPECT_LE(moe_activation_bytes(f.cfg, f.B, rows),
                moe_activation_bytes(f.cfg, f.B, std::vector<int64_t>(size_t(f.cfg.L),
                                                                      moe_expert_rows_at_most(f.cfg, f.B, 1, 1))));
    }
  }
}

// The balance loss is part of the loss the model returns, and its share is what aux_loss() says.
TEST(MoEModel, LossIncludesTheBalanceLoss) {
  MoEFixture with(0.0);
  const float total = with.loss();
  const double aux = with.model->aux_loss();
  EXPECT_GT(aux, 0.0);
  GPT2Config no_aux = moe_config(0.0);
  no_aux.aux_loss_coef = 0;
  MoEFixture without(0.0);
  without.model = std::make_unique<GPT2>(no_aux, without.layout, without.B);
  without.model->bind_all(with.params.f32(), without.grads.f32());
  const float ce = without.loss();
  EXPECT_NEAR(total, ce + aux, 1e-6);
  // aux() is the sum over the layers of each one's coef x E x sum_e f_e P_e: recomputed here from
  // the routing statistics (f_e) and the router's probabilities (P_e) of each layer's input, which
  // the model does not expose, so the layers' own balance losses are summed instead.
  double layers = 0;
  for (int l = 0; l < with.cfg.L; l++) layers += with.model->routing(l).aux_loss;
  EXPECT_NEAR(aux, layers, 1e-6);
  // Its bounds: f and P each sum to one, so sum_e f_e P_e lies in (0, 1]: aux in (0, coef x E x L];
  // a balanced router gives exactly coef per layer. This batch's router is not balanced: the loss
  // is above coef x L.
  EXPECT_LE(aux, 0.1 * 4 * with.cfg.L);
  EXPECT_GT(aux, 0.1 * with.cfg.L);
}

// The balance loss of one layer is coef x E x sum_e f_e P_e exactly: a router that sends every
// token to the same k experts with probabilities p (all tokens alike) gives f_e = 1/k for the chosen
// and P_e = p_e, so aux = coef x E x (sum of the chosen p_e) / k; a router of zeros gives the
// balanced value coef (every p_e = 1/E, top-k the first k).
TEST(MoELayer, BalanceLossOfAKnownRouter) {
  const int C = 4, E = 4, k = 2;
  const int64_t N = 6;
  std::vector<float> x(size_t(N * C), 0.0f), out(size_t(N * C));
  for (int64_t t = 0; t < N; t++) x[size_t(t * C)] = 1.0f;  // every token (1, 0, 0, 0)
  Experts experts(C, E);
  ExpertMLPs mlps(1, C);
  auto w = experts.views();
  auto run_here = [&](Tensor rows, const std::vector<int64_t>& counts, Tensor y) { mlps.forward(0, w, rows, counts, y); };
  {
    std::vector<float> zeros(size_t(E * C), 0.0f);
    MoELayer layer(C, E, k, 0, 0.5, N);
    EXPECT_NEAR(layer.forward(0, view(x, N, C), view(zeros, E, C), view(out, N, C), ExpertHooks{}, run_here), 0.5, 1e-6);
  }
  // Logits (2, 1, 0, 0) for expert 0..3: p = softmax, chosen 0 and 1.
  std::vector<float> router(size_t(E * C), 0.0f);
  router[0] = 2.0f, router[size_t(C)] = 1.0f;
  const double z = std::exp(2.0) + std::exp(1.0) + 2.0;
  const double expected = 0.5 * E * (std::exp(2.0) / z + std::exp(1.0) / z) / k;
  MoELayer layer(C, E, k, 0, 0.5, N);
  EXPECT_NEAR(layer.forward(0, view(x, N, C), view(router, E, C), view(out, N, C), ExpertHooks{}, run_here), expected,
              1e-6);
  const std::vector<int64_t>& routed = layer.stats().routed;
  ASSERT_EQ(routed.size(), size_t(E));
  EXPECT_EQ(routed[0], N);
  EXPECT_EQ(routed[1], N);
  EXPECT_EQ(routed[2] + routed[3], 0);
}

TEST(MoELayout, ExpertsAreListedOnEveryRankAndHeldByTheirOwner) {
  GPT2Config cfg = moe_config(0);
  const ParamLayout whole = build_gpt2_layout(cfg, 1);
  const int64_t C = cfg.C, per_expert = 2 * 4 * C * C + 4 * C + C;
  int64_t expert_elements = 0;
  for (const ParamInfo& p : whole.params)
    if (p.expert >= 0) expert_elements += p.size;
  EXPECT_EQ(expert_elements, int64_t(cfg.L) * cfg.experts * per_expert);
  EXPECT_GE(whole.find("h1.moe.router.weight"), 0);
  EXPECT_EQ(whole.params[size_t(whole.find("h1.moe.router.weight"))].shape[0], cfg.experts);
  for (int ep : {2, 4}) {
    for (int r = 0; r < ep; r++) {
      const ParamLayout mine = build_gpt2_layout(cfg, 2, {}, {}, ExpertParallelism{ep, r});
      ASSERT_EQ(mine.params.size(), whole.params.size());
      int64_t held = 0;
      for (size_t i = 0; i < mine.params.size(); i++) {
        const ParamInfo& p = mine.params[i];
        EXPECT_EQ(p.name, whole.params[i].name);
        if (p.expert < 0) EXPECT_EQ(p.size, whole.params[i].size) << p.name;
        else if (p.expert / (cfg.experts / ep) == r) EXPECT_EQ(p.size, whole.params[i].size) << p.name;
        else EXPECT_EQ(p.size, 0) << p.name;
        if (p.expert >= 0) held += p.size;
      }
      EXPECT_EQ(held, expert_elements / ep);  // expert parameters fall as 1/ep
      // Same length on every rank of the group: the dense tensors sit at the same offsets.
      EXPECT_EQ(mine.padded_size, build_gpt2_layout(cfg, 2, {}, {}, ExpertParallelism{ep, 0}).padded_size);
    }
  }
}

TEST(MoERefusals, EachNamesTheFlagAndWhatWouldBeRight) {
  EXPECT_EQ(moe_run_problem("moe-tiny", "11_expert_parallel", Device::CPU, true, 4, 1, 1, "none"), "");
  // On a GPU: in 11 and 12 (expert parallelism arranged) where the build has CUDA, elsewhere refused.
  EXPECT_NE(moe_run_problem("moe-tiny", "03_bucket_dp", Device::CUDA, false, 1, 1, 1, "none").find("--device cpu"),
            std::string::npos);
#ifdef GPT_WITH_CUDA
  EXPECT_EQ(moe_run_problem("moe-tiny", "11", Device::CUDA, true, 1, 1, 1, "none"), "");
#else
  EXPECT_NE(moe_run_problem("moe-tiny", "11", Device::CUDA, true, 1, 1, 1, "none").find("without CUDA"),
            std::string::npos);
#endif
  EXPECT_NE(moe_run_problem("moe-tiny", "03_bucket_dp", Device::CPU, false, 2, 1, 1, "none").find("11_expert_parallel"),
            std::string::npos);
  EXPECT_EQ(moe_run_problem("moe-tiny", "03_bucket_dp", Device::CPU, false, 1, 1, 1, "none"), "");
  EXPECT_NE(moe_run_problem("moe-tiny", "07", Device::CPU, false, 1, 2, 1, "none").find("--tp"), std::string::npos);
  EXPECT_NE(moe_run_problem("moe-tiny", "11", Device::CPU, true, 1, 1, 1, "full").find("--recompute"),
            std::string::npos);
}

// A capacity under one token per expert drops every token: refused, naming the smallest factor
// that gives one place, which itself passes (and one just under it would not).
TEST(MoERefusals, CapacityUnderOneTokenNamesTheSmallestFactor) {
  const int64_t tokens = 4 * 64;  // a global micro-batch of moe-tiny at --batch 8 --grad-accum 2
  const int k = 2, E = 4;
  EXPECT_EQ(moe_capacity_problem(0, tokens, k, E), "");    // unlimited
  EXPECT_EQ(moe_capacity_problem(1.0, tokens, k, E), "");  // 128 places
  const std::string problem = moe_capacity_problem(0.001, tokens, k, E);
  ASSERT_NE(problem, "");
  EXPECT_NE(problem.find("--capacity-factor 0.001"), std::string::npos) << problem;
  const std::string marker = "at least --capacity-factor ";
  const size_t at = problem.find(marker);
  ASSERT_NE(at, std::string::npos) << problem;
  const double smallest = std::stod(problem.substr(at + marker.size()));
  EXPECT_NEAR(smallest, double(E) / (tokens * k), 1e-3 * double(E) / (tokens * k)) << problem;
  EXPECT_EQ(MoELayer::capacity_of(smallest, tokens, k, E), 1) << problem;
  EXPECT_EQ(moe_capacity_problem(smallest, tokens, k, E), "");
  EXPECT_NE(moe_capacity_problem(smallest * 0.99, tokens, k, E), "");
}
