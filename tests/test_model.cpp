// test_model.cpp: the whole GPT-2 model on the CPU: its gradient against finite differences, the
// hooks later chapters build on, gradient accumulation, unit binding, and the parameter layout.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "memory.h"
#include "model.h"
#include "ops.h"
#include "param_layout.h"
#include "test_util.h"

namespace {

GPT2Config tiny_config() {
  GPT2Config cfg;
  cfg.preset = "custom";
  cfg.L = 2; cfg.C = 8; cfg.NH = 2; cfg.T = 5; cfg.V = 13;
  return cfg;
}

struct Fixture {
  GPT2Config cfg = tiny_config();
  ParamLayout layout = build_gpt2_layout(cfg, 1);
  int B = 2;
  Buffer params{layout.padded_size, MemCategory::Params};
  Buffer grads{layout.padded_size, MemCategory::Grads};
  std::vector<int> inputs, targets;
  GPT2 model{cfg, layout, B};

  Fixture() {
    GPT2::init_weights(layout, 7, params.f32());
    // Perturb every parameter so layernorm gains, biases and the tied head all matter.
    uint64_t state = 12345;
    for (int64_t i = 0; i < layout.padded_size; i++) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      params.f32()[i] += 0.1f * (float((state >> 40) & 0xFFFF) / 65535.0f - 0.5f);
    }
    for (int i = 0; i < B * cfg.T; i++) {
      inputs.push_back((i * 7 + 3) % cfg.V);
      targets.push_back((i * 5 + 1) % cfg.V);
    }
    model.bind_all(params.f32(), grads.f32());
  }
  float loss() { return model.forward(inputs.data(), targets.data(), B); }
};

TEST(Model, GradientMatchesFiniteDifferences) {
  Fixture f;
  f.loss();
  f.model.backward(1.0f);
  // Central differences in fp32 with h = 1e-2: the loss is ~2.6 with ~3e-7 rounding, so the
  // quotient carries ~3e-5 of noise; the tolerance below leaves room for that and for O(h^2).
  const float h = 1e-2f;
  int checked = 0;
  for (const ParamInfo& p : f.layout.params) {
    for (int64_t j : {int64_t(0), p.size / 2, p.size - 1}) {
      float* w = f.params.f32() + p.offset + j;
      const float saved = *w;
      *w = saved + h;
      const double up = f.loss();
      *w = saved - h;
      const double down = f.loss();
      *w = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = f.grads.f32()[p.offset + j];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << p.name << "[" << j << "]";
      checked++;
    }
  }
  EXPECT_EQ(checked, 3 * int(f.layout.params.size()));
}

TEST(Model, BackwardAccumulatesWithLossWeight) {
  Fixture f;
  f.loss();
  f.model.backward(1.0f);
  std::vector<float> once(f.grads.f32(), f.grads.f32() + f.layout.padded_size);
  fill_zero(f.grads.view());
  f.model.backward(0.5f);
  f.model.backward(0.5f);
  EXPECT_TRUE(allclose(f.grads.f32(), once.data(), once.size(), 1e-7, 1e-5));
}

TEST(Model, HooksFireInLayerOrderAndEveryGradientOnce) {
  Fixture f;
  std::vector<std::string> events;
  std::vector<int> ready_count(f.layout.params.size(), 0);
  std::vector<int> ready_order;
  f.model.hooks.before_forward = [&](int u) { events.push_back("F" + std::to_string(u)); };
  f.model.hooks.after_forward = [&](int u) { events.push_back("f" + std::to_string(u)); };
  f.model.hooks.before_backward = [&](int u) { events.push_back("B" + std::to_string(u)); };
  f.model.hooks.after_backward = [&](int u) { events.push_back("b" + std::to_string(u)); };
  f.model.hooks.grad_ready = [&](int p) { ready_count[p]++; ready_order.push_back(p); };
  f.loss();
  f.model.backward(1.0f);
  std::vector<std::string> expected = {"F0", "f0", "F1", "f1", "F2", "f2", "F3", "f3",
                                       "B3", "b3", "B2", "b2", "B1", "b1", "B0", "b0"};
  EXPECT_EQ(events, expected);
  for (size_t p = 0; p < ready_count.size(); p++) EXPECT_EQ(ready_count[p], 1) << f.layout.params[p].name;
  // Gradients become final from high offsets to low (buckets rely on it), wte (tied) last.
  EXPECT_EQ(f.layout.params[ready_order.back()].name, "wte");
  for (size_t i = 1; i + 1 < ready_order.size(); i++)
    EXPECT_GT(f.layout.params[ready_order[i - 1]].offset, f.layout.params[ready_order[i]].offset);
}

TEST(Model, UnitCanBeBoundToAnotherBuffer) {
  Fixture f;
  const float reference = f.loss();
  // Move block 1's parameters to a separate buffer, as ZeRO-3 does with a gathered layer.
  const int u = 1;
  std::vector<float> gathered(f.params.f32() + f.layout.unit_begin[u], f.params.f32() + f.layout.unit_begin[u + 1]);
  std::fill(f.params.f32() + f.layout.unit_begin[u], f.params.f32() + f.layout.unit_begin[u + 1], 0.0f);
  f.model.bind_unit_params(u, gathered.data());
  EXPECT_EQ(f.loss(), reference);
}

TEST(Layout, UnitsAreContiguousPaddedAndCountIsGPT2s) {
  GPT2Config cfg = tiny_config();
  for (int ranks : {1, 2, 3, 4}) {
    ParamLayout layout = build_gpt2_layout(cfg, ranks);
    const int64_t C = cfg.C;
    EXPECT_EQ(layout.num_params, cfg.V * C + cfg.T * C + cfg.L * (12 * C * C + 13 * C) + 2 * C);
    EXPECT_EQ(layout.num_units(), cfg.L + 2);
    EXPECT_EQ(layout.padded_size % (16 * ranks), 0);
    for (int u = 0; u < layout.num_units(); u++) EXPECT_EQ(layout.unit_size(u) % (16 * ranks), 0);
    for (size_t i = 0; i + 1 < layout.params.size(); i++) {
      const ParamInfo &a = layout.params[i], &b = layout.params[i + 1];
      if (a.unit == b.unit) EXPECT_EQ(a.offset + a.size, b.offset) << a.name;
      else EXPECT_EQ(layout.unit_begin[b.unit], b.offset);
    }
  }
}

TEST(Model, InitialWeightsDoNotDependOnRankCount) {
  GPT2Config cfg = tiny_config();
  ParamLayout one = build_gpt2_layout(cfg, 1), four = build_gpt2_layout(cfg, 4);
  std::vector<float> a(one.padded_size), b(four.padded_size);
  GPT2::init_weights(one, 99, a.data());
  GPT2::init_weights(four, 99, b.data());
  for (size_t i = 0; i < one.params.size(); i++) {
    const ParamInfo &p = one.params[i], &q = four.params[i];
    ASSERT_EQ(p.name, q.name);
    for (int64_t j = 0; j < p.size; j++) ASSERT_EQ(a[p.offset + j], b[q.offset + j]) << p.name;
  }
  // Matrices are random with GPT-2's 0.02 scale, not constant.
  const ParamInfo& wte = one.params[0];
  double sq = 0;
  for (int64_t j = 0; j < wte.size; j++) sq += double(a[j]) * a[j];
  EXPECT_NEAR(std::sqrt(sq / wte.size), 0.02, 0.004);
}

}  // namespace
