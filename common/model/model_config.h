// model_config.h: the shape of a GPT-2 model and the named presets every chapter accepts.
// Defines GPT2Config and find_preset(). Dimensions keep the project's short names:
// L layers, C channels, NH heads, T sequence length (context), V vocabulary. Also Recompute, what
// the model recomputes in backward instead of keeping it from forward, and its parse/name helpers.
#pragma once
#include <string>

// Activation recomputation (docs/theory.md, "Activation recomputation"): what the backward pass
// recomputes instead of keeping it from the forward pass.
//   None:      every tensor the backward reads is kept, per block and micro-batch in flight.
//   Selective: the attention core's (B,NH,T,T) scores and softmax are dropped, and recomputed from
//              the kept q, k, v right before the attention's backward (Korthikanti et al. 2022).
//   Full:      only each block's input is kept; the block's forward is replayed inside its backward.
enum class Recompute { None, Selective, Full };
// "none", "selective", "full" -> *out; false for anything else.
bool parse_recompute(const std::string& text, Recompute* out);
const char* recompute_name(Recompute r);

struct GPT2Config {
  std::string preset;  // a preset's name (find_preset), or "custom"
  int L = 0, C = 0, NH = 0, T = 0, V = 0;
  int default_batch = 0;     // global batch in sequences when --batch is not given
  float default_lr = 0;      // peak learning rate when --lr is not given
  // How attention is computed where a choice exists (bf16 on a GPU, head size 16/32/64/128): true =
  // FlashAttention (attention_flash.cu), false = the (B,NH,T,T) matrices, as everywhere else.
  bool flash_attention = false;
  // What the backward recomputes rather than keeps (it belongs to the model: every chapter's
  // --recompute sets it, and activation_bytes() counts what each choice keeps).
  Recompute recompute = Recompute::None;
  // Mixture of experts (moe.h): 0 = the dense GPT-2 MLP; else each block's MLP is `experts` expert
  // MLPs of the same shape and a router sending each token to its `top_k`. The capacity factor (0:
  // unlimited) and the balance loss's coefficient are training settings (chapter 11's flags).
  int experts = 0, top_k = 0;
  double capacity_factor = 0, aux_loss_coef = 0;
  bool moe() const { return experts > 0; }
};

// Fills *cfg and returns true for a known preset name:
//   tiny:  L=2,  C=64,  NH=4,  T=64,   V=256    (the CPU default: a step takes tens of ms on one core)
//   small: L=4,  C=128, NH=4,  T=128,  V=256
//   deep:  L=12, C=128, NH=4,  T=64,   V=256    (make compare: ZeRO-3 gathers a few of its 12 blocks)
//   gpt2:  L=12, C=768, NH=12, T=1024, V=50304  (GPT-2 124M's shape; V padded to a multiple of 128)
//   odd:   L=2,  C=15,  NH=3,  T=17,   V=258    (for tests: 9945 parameters, divisible by no N > 1)
//   wide:  L=2,  C=32,  NH=4,  T=16,   V=8192   (for tests: the embedding outweighs the blocks)
//   tall:  L=8,  C=32,  NH=4,  T=32,   V=256    (for tests: 4 pipeline stages of 2 chunks each)
//   long:  L=2,  C=64,  NH=4,  T=1024, V=256    (chapter 10: a long context on a small width)
//   moe-tiny:  tiny's shape, each MLP 4 experts, top-2       (chapter 11, moe.h)
//   moe-small: small's shape, each MLP 8 experts, top-2
bool find_preset(const std::string& name, GPT2Config* cfg);
const char* preset_names();  // "tiny, small, deep, gpt2, odd, wide, tall, long, moe-tiny, moe-small, gpt2-wide", for error messages
