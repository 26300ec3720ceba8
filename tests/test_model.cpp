// test_model.cpp: the whole GPT-2 model on the CPU: its gradient against finite differences, the
// hooks later chapters build on, gradient accumulation, unit binding, and the parameter layout; and
// the model in parts, as pipeline stages run it (chapter 08): stages chained by hand give the whole
// model's loss and gradients, micro-batches in several slots at once, and the backward split into
// the inputs' gradients and, later, the weights'. And that a step after the first allocates nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <functional>
#include <cstring>
#include <string>
#include <vector>

#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "model/param_layout.h"
#include "pipeline/pipeline.h"
#include "parallel/parallelize.h"  // parallelize, the dimensions' apply functions
#include "parallel/theory.h"
#include "parallel/shards.h"
#include "training/optimizer.h"
#include "test_util.h"

// Every operator new of this program, counted: what a training step allocates (std::vector's growth,
// a scratch buffer sized on demand), for Model.AStepAfterTheFirstAllocatesNothing.
namespace {
std::atomic<long> allocations{0};
}  // namespace
void* operator new(std::size_t bytes) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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

// A training step after the first allocates nothing: the forward, the backward, the gradient's norm
// and AdamW run in memory that the model, the optimizer and the first step sized (the attention's
// scratch, the products' packing buffers). At 37 positions and 48 channels, so that the attention's
// and the products' edge tiles run too.
TEST(Model, AStepAfterTheFirstAllocatesNothing) {
  GPT2Config cfg = tiny_config();
  cfg.T = 37, cfg.C = 48, cfg.NH = 4;
  const ParamLayout layout = build_gpt2_layout(cfg, 1);
  const int B = 2;
  Buffer params{layout.padded_size, MemCategory::Params}, grads{layout.padded_size, MemCategory::Grads};
  GPT2::init_weights(layout, 7, params.f32());
  GPT2 model{cfg, layout, B};
  model.bind_all(params.f32(), grads.f32());
  AdamW adamw(layout, ShardPlan::unsharded(layout), 0.1f);
  std::vector<int> inputs, targets;
  for (int i = 0; i < B * cfg.T; i++) inputs.push_back((i * 7 + 3) % cfg.V), targets.push_back((i * 5 + 1) % cfg.V);
  auto step = [&](int s) {
    fill_zero(grads.view());
    model.forward(inputs.data(), targets.data(), B);
    model.backward(1.0f);
    const double norm = std::sqrt(sum_of_squares(grads.view()));
    adamw.update(params.view(), grads.view(), s, 1e-3f, norm > 1.0 ? float(1.0 / norm) : 1.0f);
  };
  step(1);
  const long before = allocations.load();
  step(2);
  step(3);
  EXPECT_EQ(allocations.load() - before, 0) << "allocations in two steps after the first";
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

// ---------------------------------------------------------------------------------------------
// Parts of the model, as pipeline stages (chapter 08)

// A model of 4 blocks, split after unit `cut` (units 0 embedding, 1..4 blocks, 5 the head).
GPT2Config deep_config() {
  GPT2Config cfg = tiny_config();
  cfg.L = 4;
  return cfg;
}

std::vector<float> perturbed_weights(const ParamLayout& layout, uint64_t seed) {
  std::vector<float> w(layout.padded_size, 0.0f);
  GPT2::init_weights(layout, seed, w.data());
  const std::vector<float> noise = random_vector(w.size(), seed + 1, -0.05f, 0.05f);
  for (const ParamInfo& p : layout.params)
    for (int64_t i = p.offset; i < p.offset + p.size; i++) w[i] += noise[i];
  return w;
}

TEST(Layout, AStageHoldsItsUnitsAndTheTiedEmbeddingAtBothEnds) {
  const GPT2Config cfg = deep_config();
  const ParamLayout first = build_gpt2_layout(cfg, 2, {}, {ModelPart{0, 2}});
  const ParamLayout middle = build_gpt2_layout(cfg, 2, {}, {ModelPart{3, 3}});
  const ParamLayout last = build_gpt2_layout(cfg, 2, {}, {ModelPart{4, 5}});
  const ParamLayout whole = build_gpt2_layout(cfg, 2);
  for (const ParamLayout* l : {&first, &middle, &last}) ASSERT_EQ(l->params.size(), whole.params.size());
  EXPECT_TRUE(first.params[first.find("wte")].held());
  EXPECT_TRUE(last.params[last.find("wte")].held());
  EXPECT_FALSE(middle.params[middle.find("wte")].held());
  EXPECT_TRUE(first.params[first.find("wpe")].held());
  EXPECT_FALSE(last.params[last.find("wpe")].held());
  EXPECT_TRUE(middle.params[middle.find("h2.mlp.fc.weight")].held());
  EXPECT_FALSE(middle.params[middle.find("h1.mlp.fc.weight")].held());
  EXPECT_TRUE(last.params[last.find("lnf.bias")].held());
  // Every parameter of the model is held by exactly one stage, wte by two.
  for (size_t i = 0; i < whole.params.size(); i++) {
    const int holders = first.params[i].held() + middle.params[i].held() + last.params[i].held();
    EXPECT_EQ(holders, whole.params[i].name == "wte" ? 2 : 1) << whole.params[i].name;
  }
  EXPECT_EQ(first.padded_size % 32, 0);
  EXPECT_LT(middle.padded_size, whole.padded_size / 3);
}

// The whole model, one backward per micro-batch: the reference for the stages.
struct WholeModelRun {
  std::vector<float> losses, grads;
};
WholeModelRun run_whole(const GPT2Config& cfg, const std::vector<float>& weights, const std::vector<int>& inputs,
                        const std::vector<int>& targets, int B, int micro_batches) {
  const ParamLayout layout = build_gpt2_layout(cfg, 1);
  std::vector<float> params = weights;
  WholeModelRun run;
  run.grads.assign(layout.padded_size, 0.0f);
  GPT2 model(cfg, layout, B);
  model.bind_all(params.data(), run.grads.data());
  for (int m = 0; m < micro_batches; m++) {
    run.losses.push_back(model.forward(&inputs[m * B * cfg.T], &targets[m * B * cfg.T], B));
    model.backward(1.0f / micro_batches);
  }
  return run;
}

// Two stages chained by hand on one process, all micro-batches forward first (each in its own
// slot), then their backwards (in the same order: gradients accumulate in the reference's order);
// with split_backward, the weights' gradients last.
// Their losses and their gradients, placed back into the whole model's layout, are the whole
// model's: exactly, except wte's two halves, summed here as the pipeline's embedding group sums
// them (a different order of additions: close, not equal).
TEST(ModelPart, TwoStagesWithSlotsEqualTheWholeModel) {
  const GPT2Config cfg = deep_config();
  const int B = 2, M = 3;
  const ParamLayout whole = build_gpt2_layout(cfg, 1);
  const std::vector<float> weights = perturbed_weights(whole, 17);
  const std::vector<int> inputs = random_ints(M * B * cfg.T, cfg.V, 5), targets = random_ints(M * B * cfg.T, cfg.V, 6);
  const WholeModelRun reference = run_whole(cfg, weights, inputs, targets, B, M);

  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "split backward" : "whole backward");
    const ModelPart first_part{0, 2, M, split}, last_part{3, 5, M, split};
    const ParamLayout first = build_gpt2_layout(cfg, 1, {}, {first_part});
    const ParamLayout last = build_gpt2_layout(cfg, 1, {}, {last_part});
    std::vector<float> p0(first.padded_size), p1(last.padded_size), g0(first.padded_size, 0.0f),
        g1(last.padded_size, 0.0f);
    slice_from_global(whole, weights.data(), first, p0.data());
    slice_from_global(whole, weights.data(), last, p1.data());
    GPT2 stage0(cfg, first, B, Device::CPU, DType::F32, {}, first_part);
    GPT2 stage1(cfg, last, B, Device::CPU, DType::F32, {}, last_part);
    stage0.bind_all(p0.data(), g0.data());
    stage1.bind_all(p1.data(), g1.data());
    // Every gradient a stage holds is announced once per backward, none that it does not hold.
    std::vector<int> ready0(first.params.size(), 0), ready1(last.params.size(), 0);
    stage0.hooks.grad_ready = [&](int p) { ready0[p]++; };
    stage1.hooks.grad_ready = [&](int p) { ready1[p]++; };

    for (int m = 0; m < M; m++) {
      EXPECT_EQ(stage0.forward(m, &inputs[m * B * cfg.T], nullptr, B), 0.0f);
      copy_tensor(stage1.input(m, B), stage0.output(m));
      const float loss = stage1.forward(m, nullptr, &targets[m * B * cfg.T], B);
      EXPECT_EQ(loss, reference.losses[m]) << "micro-batch " << m;
    }
    for (int m = 0; m < M; m++) {
      stage1.backward(m, 1.0f / M);
      std::vector<float> grad_in(size_t(B) * cfg.T * cfg.C);
      copy_tensor(make_view(grad_in.data(), {int64_t(grad_in.size())}), stage1.input_grad());
      stage0.backward(m, 1.0f / M, make_view(grad_in.data(), {B * cfg.T, cfg.C}));
    }
    if (split)
      for (int m = 0; m < M; m++) {
        stage1.backward_weights(m);
        stage0.backward_weights(m);
      }
    for (size_t i = 0; i < first.params.size(); i++) {
      EXPECT_EQ(ready0[i], first.params[i].held() ? M : 0) << first.params[i].name;
      EXPECT_EQ(ready1[i], last.params[i].held() ? M : 0) << last.params[i].name;
    }
    std::vector<float> g(whole.padded_size, 0.0f);
    place_into_global(first, g0.data(), whole, g.data());
    place_into_global(last, g1.data(), whole, g.data());
    const ParamInfo& wte = whole.params[whole.find("wte")];
    const ParamInfo& wte0 = first.params[first.find("wte")];
    const ParamInfo& wte1 = last.params[last.find("wte")];
    for (int64_t j = 0; j < wte.size; j++) g[wte.offset + j] = g0[wte0.offset + j] + g1[wte1.offset + j];
    for (const ParamInfo& p : whole.params) {
      if (p.name == "wte")
        EXPECT_TRUE(allclose(&g[p.offset], &reference.grads[p.offset], p.size, 1e-7, 1e-5));
      else
        EXPECT_EQ(0, std::memcmp(&g[p.offset], &reference.grads[p.offset], p.size * sizeof(float))) << p.name;
    }
  }
}

// The activation arena of a part equals theory.cpp's formula, slots and kept gradients included.
TEST(ModelPart, ActivationArenaIsTheFormula) {
  const GPT2Config cfg = deep_config();
  for (const ModelPart part : {ModelPart{0, 2, 3, false}, ModelPart{3, 5, 2, true}, ModelPart{2, 3, 4, true},
                               ModelPart{0, 5, 1, true}}) {
    const ParamLayout layout = build_gpt2_layout(cfg, 1, {}, {part});
    reset_memory_peaks();
    const int64_t before = memory_stats().current[int(MemCategory::Activations)];
    GPT2 model(cfg, layout, 2, Device::CPU, DType::F32, {}, part);
    const int64_t arena = memory_stats().current[int(MemCategory::Activations)] - before;
    EXPECT_EQ(double(arena), activation_bytes(cfg, 2, DType::F32, false, {}, part))
        << "units " << part.first_unit << ".." << part.last_unit << ", " << part.slots << " slots";
  }
}

// The partition by cost is the best contiguous cut: no other assignment of blocks to stages (each at
// least one) has a cheaper costliest stage, found here by trying them all. On GPT-2 124M the LM
// head weighs 4.5 blocks, so equal block counts would leave the last stage the slowest: the cut gives
// it fewer blocks than the first.
TEST(Partition, BalancedByCostIsTheBestContiguousCut) {
  auto costliest = [](const GPT2Config& cfg, const std::vector<int>& blocks) {
    const std::vector<double> cost = unit_costs(cfg);
    double worst = 0;
    int unit = 1;
    for (size_t s = 0; s < blocks.size(); s++) {
      double stage = (s == 0 ? cost.front() : 0) + (s + 1 == blocks.size() ? cost.back() : 0);
      for (int b = 0; b < blocks[s]; b++) stage += cost[unit++];
      worst = std::max(worst, stage);
    }
    return worst;
  };
  GPT2Config gpt2, deep;
  ASSERT_TRUE(find_preset("gpt2", &gpt2));
  ASSERT_TRUE(find_preset("deep", &deep));
  for (const GPT2Config& cfg : {gpt2, deep}) {
    for (int S : {1, 2, 3, 4, 6}) {
      SCOPED_TRACE(cfg.preset + ", " + std::to_string(S) + " stages");
      const std::vector<int> blocks = balanced_partition(cfg, S);
      ASSERT_EQ(int(blocks.size()), S);
      int total = 0;
      for (int b : blocks) {
        total += b;
        EXPECT_GE(b, 1);
      }
      EXPECT_EQ(total, cfg.L);
      // Every composition of L into S positive parts.
      double best = INFINITY;
      std::vector<int> trial(S, 1);
      std::function<void(int, int)> place = [&](int s, int left) {
        if (s == S - 1) {
          trial[s] = left;
          best = std::min(best, costliest(cfg, trial));
          return;
        }
        for (int b = 1; b <= left - (S - 1 - s); b++) trial[s] = b, place(s + 1, left - b);
      };
      place(0, cfg.L);
      EXPECT_DOUBLE_EQ(costliest(cfg, blocks), best);
    }
  }
  const std::vector<int> four = balanced_partition(gpt2, 4);
  EXPECT_LT(four.back(), four.front()) << "the head's stage should hold fewer blocks";
  EXPECT_LT(costliest(gpt2, four), costliest(gpt2, {3, 3, 3, 3}));
}

}  // namespace

// Dimensions compose as a list (parallelize.h): each is applied to every chunk in the order given, a
// later one wrapping what an earlier one installed (Ulysses around the ring), chunk c getting its own
// hooks, and an empty transform (a dimension that splits nothing here) is skipped.
TEST(Parallelize, AppliesEachDimensionToEveryChunkInTheOrderGiven) {
  const GPT2Config cfg = tiny_config();
  const ParamLayout layout = build_gpt2_layout(cfg, 1);
  GPT2 first(cfg, layout, 1), second(cfg, layout, 1);
  std::vector<std::string> calls;
  AttentionHooks ring;
  ring.attention_forward = [&calls](Tensor, Tensor, Tensor, int NH) { calls.push_back("ring " + std::to_string(NH)); };
  const ChunkTransform around = [&calls](GPT2& chunk, int index) {
    auto inner = chunk.attention_hooks.attention_forward;
    chunk.attention_hooks.attention_forward = [&calls, inner, index](Tensor out, Tensor lse, Tensor qkv, int NH) {
      calls.push_back("around " + std::to_string(index));
      inner(out, lse, qkv, NH);
    };
  };
  std::vector<ExpertHooks> experts(2);
  experts[0].rank = 3, experts[1].rank = 5;
  ProductHooks collectives;
  collectives.vocab_all_reduce = [&calls](Tensor, ReduceOp) { calls.push_back("vocab"); };
  EXPECT_FALSE(apply_ulysses({}));  // no exchange: nothing to install
  parallelize({&first, &second}, {apply_tensor_parallel(collectives), apply_context_parallel(ring), ChunkTransform(),
                                  around, apply_expert_parallel(experts), apply_ulysses({})});
  first.attention_hooks.attention_forward(Tensor(), Tensor(), Tensor(), 2);
  second.attention_hooks.attention_forward(Tensor(), Tensor(), Tensor(), 4);
  second.product_hooks.vocab_all_reduce(Tensor(), ReduceOp::Max);
  EXPECT_EQ(calls, (std::vector<std::string>{"around 0", "ring 2", "around 1", "ring 4", "vocab"}));
  EXPECT_EQ(first.expert_hooks.rank, 3);
  EXPECT_EQ(second.expert_hooks.rank, 5);
}
