// test_recompute.cpp: activation recomputation (GPT2Config::recompute, docs/theory.md section 12).
// Recomputing must not change a single bit: the losses and gradients under selective and full
// recomputation are those of none, on the whole model, on pipeline parts with several micro-batches
// in flight (which share the recomputation's workspace), with the backward split in two
// (selective), and on a tensor-parallel group with and without sequence parallelism (at 2 ranks),
// there with the backward split in two as well (zb-h1 under TP).
// The arena really drops what recomputation drops: its measured bytes equal activation_bytes() for
// every mode, and the replay's tensor-parallel collectives are those predict_tensor_parallel() adds.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "ops/memory.h"
#include "model/model.h"
#include "mpi_test_env.h"
#include "model/param_layout.h"
#include "parallel/theory.h"
#include "test_util.h"
#include "tp_test_hooks.h"

namespace {

const Recompute kModes[] = {Recompute::None, Recompute::Selective, Recompute::Full};

// T larger than the head size, so that the (B,NH,T,T) scores are a real share of the arena.
GPT2Config config(Recompute recompute) {
  GPT2Config cfg;
  cfg.preset = "custom";
  cfg.L = 3; cfg.C = 16; cfg.NH = 4; cfg.T = 8; cfg.V = 32;
  cfg.recompute = recompute;
  return cfg;
}

std::vector<float> random_weights(const ParamLayout& layout, uint64_t seed) {
  std::vector<float> w(layout.padded_size, 0.0f);
  GPT2::init_weights(layout, seed, w.data());
  Rng rng(seed);
  for (const ParamInfo& p : layout.params)  // biases and gains away from 0 and 1, so that each matters
    for (int64_t i = 0; i < p.size; i++) w[p.offset + i] += 0.05f * float(rng.uniform() - 0.5);
  return w;
}

// What one run leaves: the losses of its micro-batches and the gradient buffer.
struct Result {
  std::vector<float> losses, grads;
};

// `wte_reordered`: wte's two uses (the lookup and the tied head) add their gradients in the other
// order, as a split backward's later weight pass does: close, not equal.
void expect_bitwise_equal(const Result& got, const Result& want, const ParamLayout& layout,
                          bool wte_reordered = false) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t m = 0; m < got.losses.size(); m++) EXPECT_EQ(got.losses[m], want.losses[m]) << "micro-batch " << m;
  for (const ParamInfo& p : layout.params) {
    if (wte_reordered && p.name == "wte")
      EXPECT_TRUE(allclose(&got.grads[p.offset], &want.grads[p.offset], size_t(p.size), 1e-7, 1e-5));
    else
      EXPECT_EQ(0, std::memcmp(&got.grads[p.offset], &want.grads[p.offset], size_t(p.size) * sizeof(float)))
          << p.name;
  }
}

// A part of the model with `part.slots` micro-batches: all forwards, then all backwards (and, under
// split_backward, all weight passes), as afab runs them; the whole model is the part {0, L+1}.
Result run_part(const GPT2Config& cfg, const ModelPart& part, const std::vector<float>& whole_weights,
                const std::vector<int>& inputs, const std::vector<int>& targets, int B) {
  const ParamLayout whole = build_gpt2_layout(cfg, 1);
  const ParamLayout layout = build_gpt2_layout(cfg, 1, {}, {part});
  std::vector<float> params(layout.padded_size);
  slice_from_global(whole, whole_weights.data(), layout, params.data());
  Result r;
  r.grads.assign(layout.padded_size, 0.0f);
  GPT2 model(cfg, layout, B, Device::CPU, DType::F32, {}, part);
  model.bind_all(params.data(), r.grads.data());
  const int M = part.slots, n = B * cfg.T;
  std::vector<float> output_grad(size_t(n) * cfg.C);
  for (size_t i = 0; i < output_grad.size(); i++) output_grad[i] = 1e-3f * float(int(i % 17) - 8);
  for (int m = 0; m < M; m++) {
    if (!model.has_embedding()) {  // a later stage: a made-up input stream
      Tensor in = model.input(m, B);
      for (int64_t i = 0; i < in.numel(); i++) in.f32()[i] = 0.1f * float(int((i * 7 + m) % 13) - 6);
    }
    r.losses.push_back(model.forward(m, &inputs[size_t(m) * n], &targets[size_t(m) * n], B));
  }
  for (int m = M - 1; m >= 0; m--)
    model.backward(m, 1.0f / M, model.has_head() ? Tensor() : make_view(output_grad.data(), {n, cfg.C}));
  if (part.split_backward)
    for (int m = 0; m < M; m++) model.backward_weights(m);
  return r;
}

TEST(Recompute, ParsesItsThreeNamesAndRefusesOthers) {
  Recompute r = Recompute::None;
  for (Recompute mode : kModes) {
    ASSERT_TRUE(parse_recompute(recompute_name(mode), &r));
    EXPECT_EQ(r, mode);
  }
  EXPECT_FALSE(parse_recompute("partial", &r));
  EXPECT_FALSE(parse_recompute("", &r));
}

// Losses and gradients bit for bit equal to no recomputation: the whole model, a first and a last
// stage with 3 micro-batches in flight, and (selective only: full refuses it) the split backward.
TEST(Recompute, LossesAndGradientsAreNoRecomputationsBitForBit) {
  const GPT2Config none = config(Recompute::None);
  const int B = 2, M = 3;
  const std::vector<float> weights = random_weights(build_gpt2_layout(none, 1), 5);
  const std::vector<int> inputs = random_ints(size_t(M) * B * none.T, none.V, 1);
  const std::vector<int> targets = random_ints(size_t(M) * B * none.T, none.V, 2);
  const int L = none.L;
  for (const ModelPart part : {ModelPart{0, L + 1, 1, false}, ModelPart{0, 2, M, false}, ModelPart{2, L + 1, M, false},
                               ModelPart{0, L + 1, M, true}, ModelPart{1, 2, M, true}}) {
    const Result reference = run_part(none, part, weights, inputs, targets, B);
    const ParamLayout layout = build_gpt2_layout(none, 1, {}, {part});
    for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
      if (mode == Recompute::Full && part.split_backward) continue;
      SCOPED_TRACE(std::string(recompute_name(mode)) + ", units " + std::to_string(part.first_unit) + ".." +
                   std::to_string(part.last_unit) + ", " + std::to_string(part.slots) + " slots" +
                   (part.split_backward ? ", split backward" : ""));
      expect_bitwise_equal(run_part(config(mode), part, weights, inputs, targets, B), reference, layout);
    }
  }
}

// The measured arena is the formula, for every mode and part; and each mode keeps less than the one
// before it (on this model, where the scores are a real share).
TEST(Recompute, ArenaIsTheFormulaAndShrinksWithEachMode) {
  for (const ModelPart part : {ModelPart{}, ModelPart{0, 2, 3, false}, ModelPart{2, 4, 2, false},
                               ModelPart{1, 3, 2, true}}) {
    double previous = 0;
    for (Recompute mode : kModes) {
      if (mode == Recompute::Full && part.split_backward) continue;
      const GPT2Config cfg = config(mode);
      const ParamLayout layout = build_gpt2_layout(cfg, 1, {}, {part});
      const int64_t before = memory_stats().current[int(MemCategory::Activations)];
      GPT2 model(cfg, layout, 2, Device::CPU, DType::F32, {}, part);
      const double arena = double(memory_stats().current[int(MemCategory::Activations)] - before);
      EXPECT_EQ(arena, activation_bytes(cfg, 2, DType::F32, false, {}, part))
          << recompute_name(mode) << ", units " << part.first_unit << ".." << part.last_unit;
      if (mode != Recompute::None) {
        EXPECT_LT(arena, previous) << recompute_name(mode);
      }
      previous = arena;
    }
  }
}

// The FLOPs recomputation adds: none, the attention's two products, the block but its last product.
TEST(Recompute, ExtraFlopsAreTheReplayedProducts) {
  const GPT2Config none = config(Recompute::None);
  const double C = none.C, T = none.T, L = none.L;
  EXPECT_EQ(recompute_flops_per_token(none), 0.0);
  EXPECT_EQ(recompute_flops_per_token(config(Recompute::Selective)), L * 4 * T * C);
  EXPECT_EQ(recompute_flops_per_token(config(Recompute::Full)), L * (16 * C * C + 4 * T * C));
  EXPECT_EQ(recompute_flops_per_token(config(Recompute::Full), {2, 0, false}, ModelPart{0, 2, 1, false}),
            2 * (16 * C * C + 4 * T * C) / 2);
}

// --- Tensor parallelism (2 ranks or more) ---------------------------------------------------------

// One rank's part of a tensor-parallel group: 2 micro-batches accumulated; the collectives it made,
// per kind.
struct TensorParallelResult {
  Result result;
  double arena = 0;
  int64_t calls[kCollectiveKinds] = {};
};

TensorParallelResult run_tensor_parallel(const GPT2Config& cfg, TensorParallelism tp, const std::vector<float>& whole,
                                         const std::vector<int>& inputs, const std::vector<int>& targets, int B,
                                         bool split_backward = false) {
  Communicator& world = test_comm();
  const ParamLayout global = build_gpt2_layout(cfg, 1), local = build_gpt2_layout(cfg, 1, tp);
  std::vector<float> params(local.padded_size);
  slice_from_global(global, whole.data(), local, params.data());
  TensorParallelResult r;
  r.result.grads.assign(local.padded_size, 0.0f);
  const int64_t before = memory_stats().current[int(MemCategory::Activations)];
  GPT2 model(cfg, local, B, Device::CPU, DType::F32, tp, ModelPart{0, cfg.L + 1, 1, split_backward});
  r.arena = double(memory_stats().current[int(MemCategory::Activations)] - before);
  model.bind_all(params.data(), r.result.grads.data());
  set_tensor_parallel_hooks(model, world, tp.sequence_parallel);
  const CommStats start = world.stats();
  for (int m = 0; m < 2; m++) {
    r.result.losses.push_back(model.forward(&inputs[size_t(m) * B * cfg.T], &targets[size_t(m) * B * cfg.T], B));
    model.backward(0.5f);
    if (split_backward) model.backward_weights(0);
  }
  for (int k = 0; k < kCollectiveKinds; k++) r.calls[k] = world.stats().kind[k].calls - start.kind[k].calls;
  return r;
}

TEST(RecomputeTensorParallel, BitForBitArenaIsTheFormulaAndTheReplaysCollectivesArePredicted) {
  Communicator& world = test_comm();
  const int t = world.size();
  if (t == 1 || config(Recompute::None).NH % t) GTEST_SKIP() << "needs 2 or 4 ranks to split the model";
  const GPT2Config none = config(Recompute::None);
  const int B = 2;
  const std::vector<float> whole = random_weights(build_gpt2_layout(none, 1), 9);
  const std::vector<int> inputs = random_ints(size_t(2) * B * none.T, none.V, 3);
  const std::vector<int> targets = random_ints(size_t(2) * B * none.T, none.V, 4);
  for (bool sp : {false, true}) {
    const TensorParallelism tp{t, world.rank(), sp};
    const ParamLayout local = build_gpt2_layout(none, 1, tp);
    const TensorParallelResult reference = run_tensor_parallel(none, tp, whole, inputs, targets, B);
    for (Recompute mode : kModes) {
      SCOPED_TRACE(std::string(recompute_name(mode)) + (sp ? ", TP + SP" : ", TP"));
      const GPT2Config cfg = config(mode);
      const TensorParallelResult got = run_tensor_parallel(cfg, tp, whole, inputs, targets, B);
      expect_bitwise_equal(got.result, reference.result, local);
      EXPECT_EQ(got.arena, activation_bytes(cfg, B, DType::F32, false, tp));
      // The collectives: the model's own (no per-step sums of whole tensors here), 2 micro-batches.
      const TensorParallelPrediction p = predict_tensor_parallel(cfg, B, tp, DType::F32);
      EXPECT_EQ(got.calls[int(CollectiveKind::AllReduce)], 2 * (p.all_reduces + p.loss_all_reduces));
      EXPECT_EQ(got.calls[int(CollectiveKind::AllGather)], 2 * p.all_gathers);
      EXPECT_EQ(got.calls[int(CollectiveKind::ReduceScatter)], 2 * p.reduce_scatters);
      const int64_t replayed = [&] {
        int64_t n = 0;
        for (int k = 0; k < kCollectiveKinds; k++) n += got.calls[k] - reference.calls[k];
        return n;
      }();
      EXPECT_EQ(replayed, 2 * p.recomputed);
      EXPECT_EQ(p.recomputed, mode == Recompute::Full ? (sp ? 3 : 1) * cfg.L : 0);
      // zb-h1's split backward (the weights' gradients in a later pass; under SP, their inputs
      // gathered again there): the same bits, the same collectives, the formula's arena.
      if (mode == Recompute::Full) continue;  // (full keeps no input for a later weight pass)
      const TensorParallelResult split = run_tensor_parallel(cfg, tp, whole, inputs, targets, B, true);
      expect_bitwise_equal(split.result, reference.result, local, /*wte_reordered=*/true);
      EXPECT_EQ(split.arena, activation_bytes(cfg, B, DType::F32, false, tp, ModelPart{0, cfg.L + 1, 1, true}));
      for (int k = 0; k < kCollectiveKinds; k++) EXPECT_EQ(split.calls[k], got.calls[k]) << "collective kind " << k;
    }
  }
}

}  // namespace
