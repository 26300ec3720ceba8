// theory.cpp: the formulas of docs/theory.md, fp32 and bf16 mixed-precision columns.
#include "theory.h"

#include <algorithm>

Prediction predict(Strategy strategy, const ParamLayout& layout, int grad_accum, DType dtype) {
  const double psi = double(layout.num_params), N = layout.ranks;
  const double ring = (N - 1) / N;  // a ring collective sends this share of the payload per rank
  // Bytes per parameter of the parameters (= of the gradients, = of an element on the wire) and of
  // the optimizer state: 4 and 8 in fp32; 2 and 12 in mixed precision (master weights, m, v).
  const bool mixed = dtype == DType::BF16;
  const double w = mixed ? 2 : 4, k = mixed ? 12 : 8;
  const std::string W = mixed ? "2Ψ" : "4Ψ", K = mixed ? "12Ψ" : "8Ψ";
  const double K_acc = grad_accum;
  Prediction p;
  switch (strategy) {
    case Strategy::DP:
      p = {"DP", W + " + " + W + " + " + K, w * psi, w * psi, k * psi, "all-reduce: 2(N-1)/N x " + W,
           2 * ring * w * psi};
      break;
    case Strategy::ZeRO1:
      p = {"ZeRO-1", W + " + " + W + " + " + K + "/N", w * psi, w * psi, k * psi / N,
           "reduce-scatter + all-gather: 2(N-1)/N x " + W, 2 * ring * w * psi};
      break;
    case Strategy::ZeRO2:
      p = {"ZeRO-2", W + " + (" + W + " + " + K + ")/N", w * psi, w * psi / N, k * psi / N,
           "K reduce-scatters + all-gather: (K+1)(N-1)/N x " + W, (K_acc + 1) * ring * w * psi};
      break;
    case Strategy::ZeRO3:
      p = {"ZeRO-3", "(" + W + " + " + W + " + " + K + ")/N", w * psi / N, w * psi / N, k * psi / N,
           "K x (2 all-gathers + reduce-scatter): 3K(N-1)/N x " + W, 3.0 * K_acc * ring * w * psi};
      break;
  }
  return p;
}

namespace {
// One tensor of the arena: its bytes, rounded up to 64 as the model's arena carves it.
double carved(double elements, double element_bytes) {
  const double bytes = elements * element_bytes;
  return double(int64_t((bytes + 63) / 64) * 64);
}
}  // namespace

double activation_bytes(const GPT2Config& cfg, int B, DType dtype, bool flash) {
  const double w = double(dtype_size(dtype)), f32 = 4;  // statistics and losses stay fp32
  const double T = cfg.T, C = cfg.C, NH = cfg.NH, V = cfg.V, BT = double(B) * T;
  const double att = flash ? 0 : double(B) * NH * T * T, lse = flash ? double(B) * NH * T : 0;
  // Per block, what its backward reads: ln1 (BTC) and its mean and rstd (BT each), qkv (3BTC), the
  // attention output (BTC), the scores before and after softmax (B NH T T each, not with Flash-
  // Attention, which keeps B NH T log-sum-exps instead), attproj (BTC), the stream after attention
  // (BTC), ln2 (BTC, 2 BT), fc before and after GELU (4BTC each), the MLP projection (BTC) and the
  // stream after the block (BTC): 18 BTC + 2 B NH T^2 + 4 BT.
  const double block = carved(BT * C, w) + 2 * carved(BT, f32) + carved(3 * BT * C, w) + carved(BT * C, w) +
                       2 * carved(att, w) + carved(lse, f32) + carved(BT * C, w) + carved(BT * C, w) +
                       carved(BT * C, w) + 2 * carved(BT, f32) + 2 * carved(4 * BT * C, w) + carved(BT * C, w) +
                       carved(BT * C, w);
  // Around the blocks: the embeddings (BTC), the final layernorm (BTC, 2 BT), logits and probabilities
  // (BTV each) and the losses (BT).
  const double ends = carved(BT * C, w) + carved(BT * C, w) + 2 * carved(BT, f32) + 2 * carved(BT * V, w) +
                      carved(BT, f32);
  // The backward's scratch, reused by every block: gradients of the stream, of a layernorm's output
  // and of the attention output (BTC each), of qkv (3BTC), of the scores (2 B NH T^2), of fc before
  // and after GELU (4BTC each) and of the logits (BTV).
  const double scratch = 3 * carved(BT * C, w) + carved(3 * BT * C, w) + 2 * carved(att, w) +
                         2 * carved(4 * BT * C, w) + carved(BT * V, w);
  return cfg.L * block + ends + scratch;
}

double MemoryForecast::peak() const { return model_state + activations + data + std::max(transient, checkpoint); }

MemoryForecast forecast_memory(Strategy strategy, const ParamLayout& layout, const GPT2Config& cfg, int micro_B,
                               DType dtype, Device device, bool flash, bool saves_or_resumes, double data_bytes) {
  const Prediction p = predict(strategy, layout, 1, dtype);
  const double w = double(dtype_size(dtype)), N = layout.ranks;
  // The buffers are padded (param_layout.h): the formula's Ψ is the padded length here.
  const double padding = double(layout.padded_size) / double(layout.num_params);
  MemoryForecast m;
  m.model_state = (p.params_bytes + p.grads_bytes + p.optim_bytes) * padding;
  m.activations = activation_bytes(cfg, micro_B, dtype, flash);
  if (device == Device::CUDA) m.activations += 2.0 * micro_B * cfg.T * 4;  // token ids, inputs and targets

  // Communication buffers, at most (docs/theory.md, "Transient buffers"): the largest block U, the
  // embedding unit E (which the tied head keeps gathered, and whose gradient stays open from the
  // head's backward to the embedding's).
  double U = 0;
  for (int u = 1; u + 1 < layout.num_units(); u++) U = std::max(U, double(layout.unit_size(u)));
  const double E = double(layout.unit_size(0)), head = double(layout.unit_size(layout.num_units() - 1));
  const double layer_grads = E + 2 * U * (1 + 1 / N);  // ZeRO-2/3: two reduce-scatters in flight, E open
  switch (strategy) {
    case Strategy::DP: m.transient = 0; break;
    case Strategy::ZeRO1: m.transient = w * double(layout.padded_size) / N; break;  // the gradient shard
    case Strategy::ZeRO2: m.transient = w * layer_grads; break;
    case Strategy::ZeRO3: m.transient = w * (layer_grads + E + 2 * U + head); break;  // + gathered layers
  }
  // Full fp32 host copies: one to initialise; saving or resuming holds parameters, m and v, plus the
  // shards gathered from every rank. On a GPU these live on the host, except the gathered shards.
  const double full = 4.0 * double(layout.padded_size);
  if (device == Device::CPU) {
    m.checkpoint = saves_or_resumes ? 4 * full : full;
    m.data = data_bytes;
  } else {
    m.checkpoint = saves_or_resumes ? full : 0;
  }
  return m;
}
