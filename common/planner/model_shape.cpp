// model_shape.cpp: the published shapes and the per-layer counts of model_shape.h. Every formula is
// derived in docs/theory.md, section 16; each preset names its source.
#include "planner/model_shape.h"

#include <algorithm>
#include <vector>

namespace {

ModelShape llama3(const char* name, int L, int C, int NH, int F, const char* size) {
  ModelShape s;
  s.name = name;
  s.L = L, s.C = C, s.NH = NH, s.KV = 8, s.ffn = F, s.gated = true, s.tied = false;
  s.T = 8192, s.V = 128256;
  s.note = std::string("Llama 3 ") + size + " (Llama Team, The Llama 3 Herd of Models, arXiv 2407.21783, Table 3; "
           "vocabulary 128,256 as released): SwiGLU, 8 KV heads, untied, RoPE";
  return s;
}

// Megatron-LM's H100 weak-scaling table (NVIDIA/Megatron-LM README, Megatron-Core r0.8.0, July 2024):
// GPT with a GELU MLP of 4C, multi-head attention, untied embeddings, vocabulary 131,072, sequence 4,096.
ModelShape mcore(const char* name, int L, int C, int NH) {
  ModelShape s;
  s.name = name;
  s.L = L, s.C = C, s.NH = NH, s.ffn = 4 * C, s.tied = false, s.T = 4096, s.V = 131072;
  s.note = std::string("Megatron-LM's H100 table (Megatron-Core r0.8.0 README), ") + (name + 6) +
           ": GPT, GELU MLP of 4C, untied, V 131,072, T 4,096";
  return s;
}

ModelShape deepseek_v3() {
  ModelShape s;
  s.name = "deepseek-v3";
  s.L = 61, s.C = 7168, s.NH = 128, s.head_dim = 128, s.T = 4096, s.V = 129280;
  s.gated = true, s.tied = false;
  s.ffn = 18432, s.dense_layers = 3;
  s.experts = 256, s.top_k = 8, s.shared_experts = 1, s.expert_ffn = 2048;
  s.q_lora = 1536, s.kv_lora = 512, s.rope_dim = 64;
  s.note = "DeepSeek-V3 (DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv 2412.19437, section 4.2; vocabulary "
           "and dense FFN width from the released config): MLA's matrices counted, its activations and traffic "
           "approximated as 128 heads of 128 + 64; the multi-token-prediction module left out";
  return s;
}

ModelShape gpt_oss_120b() {
  ModelShape s;
  s.name = "gpt-oss-120b";
  s.L = 36, s.C = 2880, s.NH = 64, s.KV = 8, s.head_dim = 64, s.T = 4096, s.V = 201088;
  s.gated = true, s.tied = false;
  s.experts = 128, s.top_k = 4, s.expert_ffn = 2880;
  s.window = 128, s.windowed_share = 0.5;
  s.note = "GPT-OSS 120B (OpenAI, gpt-oss-120b model card, August 2025): 36 layers, 128 experts top-4 of width "
           "2,880, 64 query / 8 KV heads of 64, every other layer banded to 128 keys, vocabulary 201,088; "
           "117B parameters, 5.1B active";
  return s;
}

std::vector<ModelShape> presets() {
  return {
      llama3("llama3-8b", 32, 4096, 32, 14336, "8B"),
      llama3("llama3-70b", 80, 8192, 64, 28672, "70B"),
      llama3("llama3-405b", 126, 16384, 128, 53248, "405B"),
      mcore("mcore-1.7b", 24, 2048, 16),
      mcore("mcore-7.1b", 30, 4096, 32),
      mcore("mcore-16b", 32, 6144, 48),
      mcore("mcore-32b", 48, 7168, 56),
      mcore("mcore-70b", 84, 8192, 64),
      mcore("mcore-119b", 92, 10240, 80),
      mcore("mcore-177b", 96, 12288, 96),
      mcore("mcore-314b", 96, 16384, 128),
      mcore("mcore-462b", 112, 18432, 144),
      deepseek_v3(),
      gpt_oss_120b(),
  };
}

}  // namespace

bool find_model_shape(const std::string& name, ModelShape* out) {
  for (const ModelShape& s : presets())
    if (s.name == name) {
      *out = s;
      return true;
    }
  return false;
}

std::string model_shape_names() {
  std::string names;
  for (const ModelShape& s : presets()) names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

ModelShape shape_of(const GPT2Config& cfg) {
  ModelShape s;
  s.name = cfg.preset;
  s.L = cfg.L, s.C = cfg.C, s.NH = cfg.NH, s.T = cfg.T, s.V = cfg.V, s.ffn = 4 * cfg.C;
  s.tied = true, s.learned_positions = true;
  if (cfg.moe()) s.experts = cfg.experts, s.top_k = cfg.top_k, s.expert_ffn = 4 * cfg.C;
  s.default_batch = cfg.default_batch;
  s.note = "GPT-2's architecture";
  return s;
}

std::string model_shape_problem(const ModelShape& s) {
  if (s.L < 1 || s.C < 1 || s.NH < 1 || s.T < 1 || s.V < 1 || s.ffn < 0)
    return "layers, width, heads, sequence and vocabulary must be positive";
  if (s.head_dim == 0 && s.C % s.NH) return "the width " + std::to_string(s.C) + " does not divide by the heads";
  if (s.NH % s.kv()) return std::to_string(s.NH) + " query heads do not group over " + std::to_string(s.kv()) + " KV heads";
  if (s.moe() && (s.top_k < 1 || s.top_k > s.experts || s.expert_ffn < 1 || s.dense_layers >= s.L))
    return "a mixture of experts needs 1 <= top-k <= experts, an expert width and at least one routed layer";
  return "";
}

double attention_params(const ModelShape& s) {
  const double C = s.C, NH = s.NH, hd = s.hd();
  if (s.mla()) {
    // Queries: C -> q_lora -> NH (hd + rope); keys and values: C -> kv_lora (+ one rope key), then
    // kv_lora -> NH (hd keys + hd values); the output NH hd -> C.
    return C * s.q_lora + s.q_lora * NH * (hd + s.rope_dim) + C * (s.kv_lora + s.rope_dim) +
           s.kv_lora * NH * 2 * hd + NH * hd * C;
  }
  return C * NH * hd + 2 * C * s.kv() * hd + NH * hd * C;
}

double mlp_params(const ModelShape& s, int width) { return (s.gated ? 3.0 : 2.0) * s.C * width; }

double dense_layer_params(const ModelShape& s) { return attention_params(s) + mlp_params(s, s.ffn) + 2.0 * s.C; }

double moe_layer_shared_params(const ModelShape& s) {
  return attention_params(s) + s.shared_experts * mlp_params(s, s.expert_ffn) + double(s.C) * s.experts + 2.0 * s.C;
}

double moe_layer_expert_params(const ModelShape& s) { return s.experts * mlp_params(s, s.expert_ffn); }

double layer_params(const ModelShape& s, int layer) {
  return s.moe_layer(layer) ? moe_layer_shared_params(s) + moe_layer_expert_params(s) : dense_layer_params(s);
}

double embedding_params(const ModelShape& s) {
  return double(s.V) * s.C + (s.learned_positions ? double(s.T) * s.C : 0.0);
}

double head_params(const ModelShape& s) { return s.tied ? 0.0 : double(s.V) * s.C; }

double total_params(const ModelShape& s) {
  double n = embedding_params(s) + head_params(s) + s.C;  // + the final norm
  for (int l = 0; l < s.L; l++) n += layer_params(s, l);
  return n;
}

double active_params(const ModelShape& s) {
  double n = double(s.V) * s.C;  // the head's product (the embedding itself is a lookup)
  for (int l = 0; l < s.L; l++)
    n += s.moe_layer(l) ? moe_layer_shared_params(s) + s.top_k * mlp_params(s, s.expert_ffn) : dense_layer_params(s);
  return n;
}

double layer_product_flops(const ModelShape& s, int layer) {
  // Every matrix a token passes through, 2 FLOPs a parameter; the norms' 2C are no product.
  const double attention = attention_params(s);
  if (!s.moe_layer(layer)) return 2 * (attention + mlp_params(s, s.ffn));
  return 2 * (attention + double(s.C) * s.experts + (s.shared_experts + s.top_k) * mlp_params(s, s.expert_ffn));
}

double layer_attention_flops(const ModelShape& s, int layer) {
  // Scores: 2 x (hd + rope) per key and head; values: 2 x hd. Causal: T/2 keys on average, but at
  // most `window` on the banded layers (here every 1/share-th layer, from the first).
  const double keys_full = s.T / 2.0;
  double keys = keys_full;
  if (s.window > 0 && s.windowed_share > 0) {
    const int every = std::max(1, int(1.0 / s.windowed_share + 0.5));
    if (layer % every == 0) keys = std::min<double>(keys_full, s.window);
  }
  return 2.0 * s.NH * keys * (2.0 * s.hd() + s.rope_dim);
}

double head_flops(const ModelShape& s) { return 2.0 * s.V * s.C; }

double model_flops_per_token(const ModelShape& s) {
  double products = head_flops(s);
  for (int l = 0; l < s.L; l++) products += layer_product_flops(s, l);
  return 3 * (products + 4.0 * s.L * s.NH * s.hd() * s.T);
}

LayerActivations layer_activations(const ModelShape& s, int layer) {
  const double hd = s.hd(), qk = hd + s.rope_dim;
  const double kv_heads = s.mla() ? s.NH : s.kv();
  const double inside = s.gated ? 2.0 : 1.0;  // SwiGLU keeps gate and up, GELU its input
  LayerActivations a;
  a.residual = 2.0 * s.C;
  a.norm_out = 2.0 * s.C;
  if (s.mla()) a.latents = s.q_lora + s.kv_lora + s.rope_dim;
  a.qkv = s.NH * qk + kv_heads * qk + kv_heads * hd;
  a.attention_out = s.NH * hd;
  a.lse = s.NH;
  const double width = s.moe_layer(layer) ? double(s.shared_experts) * s.expert_ffn : double(s.ffn);
  a.mlp_in = inside * width;
  a.mlp_product = width;
  if (s.moe_layer(layer)) {
    a.router = s.experts;
    a.routed_in = s.C, a.routed_mlp_in = inside * s.expert_ffn, a.routed_product = s.expert_ffn, a.routed_out = s.C;
  }
  return a;
}

double selective_recompute_flops(const ModelShape& s, int layer) {
  (void)layer;
  if (!s.mla()) return 0;
  return 2.0 * (s.q_lora * s.NH * (s.hd() + s.rope_dim) + s.kv_lora * s.NH * 2.0 * s.hd());
}

LayerElementwise layer_elementwise(const ModelShape& s, int layer) {
  const double activation = s.gated ? 3.0 : 2.0;  // elements read and written per unit of MLP width
  const double width = s.moe_layer(layer) ? double(s.shared_experts) * s.expert_ffn : double(s.ffn);
  LayerElementwise e;
  e.per_token = 4.0 * s.C + 6.0 * s.C + activation * width;
  if (s.moe_layer(layer)) e.per_routed_row = 4.0 * s.C + activation * s.expert_ffn;
  return e;
}

double loss_elementwise_bytes(const ModelShape& s) { return 20.0 * s.V; }
