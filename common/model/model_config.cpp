// model_config.cpp: the presets of model_config.h. The default learning rates are the largest that
// train every preset without a loss spike over 20, 30 and 100 steps at batch 8 (checked by hand:
// tiny at 3e-3 and small at 2e-3 doubled their loss for a step; tiny, small and deep are checked by
// tests/test_training.cpp, DefaultLearningRate).
#include "model/model_config.h"

bool find_preset(const std::string& name, GPT2Config* cfg) {
  GPT2Config c;
  c.preset = name;
  if (name == "tiny") {
    c.L = 2; c.C = 64; c.NH = 4; c.T = 64; c.V = 256;
    c.default_batch = 8; c.default_lr = 2e-3f;
  } else if (name == "small") {
    c.L = 4; c.C = 128; c.NH = 4; c.T = 128; c.V = 256;
    c.default_batch = 8; c.default_lr = 1e-3f;
  } else if (name == "deep") {
    // make compare's default: 12 blocks, so that ZeRO-3 holds only a few of them gathered at a time.
    c.L = 12; c.C = 128; c.NH = 4; c.T = 64; c.V = 256;
    c.default_batch = 8; c.default_lr = 1e-3f;
  } else if (name == "odd") {
    // For tests: odd tensor sizes, and a count (9945) that divides by neither 2 nor 4, so shards
    // cut through tensors and padding is exercised; NH, 4C and V (258) split over 3 TP ranks.
    c.L = 2; c.C = 15; c.NH = 3; c.T = 17; c.V = 258;
    c.default_batch = 8; c.default_lr = 3e-3f;
  } else if (name == "wide") {
    // For tests: an embedding (V x C) that outweighs the blocks, as GPT-2's does, on a small model.
    c.L = 2; c.C = 32; c.NH = 4; c.T = 16; c.V = 8192;
    c.default_batch = 8; c.default_lr = 2e-3f;
  } else if (name == "tall") {
    // For tests: 8 blocks on a small model, so that 4 pipeline stages of 2 chunks each get a block.
    c.L = 8; c.C = 32; c.NH = 4; c.T = 32; c.V = 256;
    c.default_batch = 8; c.default_lr = 2e-3f;
  } else if (name == "long") {
    // Chapter 10's: a long context on a small width, where the activations grow with T (and the
    // materialized attention with T^2), and splitting the sequence over a ring halves them at 2 ranks.
    c.L = 2; c.C = 64; c.NH = 4; c.T = 1024; c.V = 256;
    c.default_batch = 4; c.default_lr = 2e-3f;
  } else if (name == "moe-tiny") {
    // Chapter 11: tiny's blocks with a mixture-of-experts MLP, small enough for 4 CPU ranks.
    c.L = 2; c.C = 64; c.NH = 4; c.T = 64; c.V = 256;
    c.experts = 4; c.top_k = 2;
    c.default_batch = 8; c.default_lr = 2e-3f;
  } else if (name == "moe-small") {
    c.L = 4; c.C = 128; c.NH = 4; c.T = 128; c.V = 256;
    c.experts = 8; c.top_k = 2;
    c.default_batch = 8; c.default_lr = 1e-3f;
  } else if (name == "gpt2") {
    c.L = 12; c.C = 768; c.NH = 12; c.T = 1024; c.V = 50304;
    c.default_batch = 8; c.default_lr = 6e-4f;
  } else if (name == "gpt2-wide") {
    // GPT-2 124M's vocabulary, context and depth at twice its width (heads of 128; 419M parameters):
    // the wider model where fp8's products gain more on a GPU (docs/mixed_precision.md, "On a GPU").
    c.L = 12; c.C = 1536; c.NH = 12; c.T = 1024; c.V = 50304;
    c.default_batch = 8; c.default_lr = 3e-4f;
  } else {
    return false;
  }
  *cfg = c;
  return true;
}

const char* preset_names() { return "tiny, small, deep, gpt2, odd, wide, tall, long, moe-tiny, moe-small, gpt2-wide"; }

bool parse_recompute(const std::string& text, Recompute* out) {
  if (text == "none") *out = Recompute::None;
  else if (text == "selective") *out = Recompute::Selective;
  else if (text == "full") *out = Recompute::Full;
  else return false;
  return true;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}
