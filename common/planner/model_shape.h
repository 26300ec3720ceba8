// model_shape.h: the planner's models as the published runs define them (the FFN width, a gated MLP,
// grouped-query attention, tied or untied embeddings, the vocabulary and sequence length, and a
// mixture of experts with shared experts and dense layers). Defines ModelShape, its presets
// (find_model_shape: Llama 3 8B/70B/405B, the nine GPT models of Megatron-LM's H100 table,
// DeepSeek-V3, GPT-OSS 120B), shape_of() for the chapters' own GPT-2, and the counts the planner
// needs per layer and per token: parameters, FLOPs and activation bytes (docs/theory.md, section 16,
// derives each).
//
// Dimensions keep the project's names: L layers, C the model width, NH query heads, T sequence, V
// vocabulary; besides them KV (key/value heads), F (the dense MLP's width), E (routed experts) and
// k (experts a token goes to). Counts are per token and per layer unless said otherwise.
#pragma once
#include <string>

#include "model/model_config.h"  // GPT2Config

struct ModelShape {
  std::string name, note;    // note: where the shape comes from, and what is approximated
  int L = 0, C = 0, NH = 0, T = 0, V = 0;
  int KV = 0;                // key/value heads (grouped-query attention); NH: every head its own
  int head_dim = 0;          // 0: C / NH
  int ffn = 0;               // F, the dense MLP's hidden width (4C for GPT)
  bool gated = false;        // SwiGLU: gate, up and down matrices (3) instead of up and down (2)
  bool tied = true;          // the output head is the token embedding (one copy of V x C)
  bool learned_positions = false;  // GPT-2's T x C position table (RoPE has none)
  // Mixture of experts: 0 experts = dense. The first `dense_layers` layers keep a dense MLP of F;
  // the others route each token to top_k of `experts` MLPs of width expert_ffn, plus
  // `shared_experts` MLPs of that width that every token passes through.
  int experts = 0, top_k = 0, shared_experts = 0, expert_ffn = 0, dense_layers = 0;
  // DeepSeek's multi-head latent attention (MLA): queries through a rank-q_lora bottleneck, keys and
  // values through a rank-kv_lora latent, plus a rope_dim part of every query and one shared key. Its
  // parameters and FLOPs are counted from those matrices; its activations and its traffic under TP
  // and CP are approximated as NH heads of head_dim (+ rope_dim) keys and values, which is what
  // training materialises after the up-projection (docs/theory.md, section 16).
  int q_lora = 0, kv_lora = 0, rope_dim = 0;
  // Banded attention on a share of the layers (GPT-OSS alternates dense and 128-wide bands): those
  // layers' queries see at most `window` keys.
  int window = 0;
  double windowed_share = 0;
  int default_batch = 512;

  bool moe() const { return experts > 0; }
  bool mla() const { return kv_lora > 0; }
  int hd() const { return head_dim > 0 ? head_dim : C / NH; }
  int kv() const { return KV > 0 ? KV : NH; }
  bool moe_layer(int layer) const { return moe() && layer >= dense_layers; }  // 0-based
  int moe_layers() const { return moe() ? L - dense_layers : 0; }
};

// The published presets; false for any other name.
bool find_model_shape(const std::string& name, ModelShape* out);
std::string model_shape_names();  // "llama3-8b, llama3-70b, ...", for --model's help and refusal
// The chapters' GPT-2 (model_config.h) as a shape: a GELU MLP of 4C, every head its own keys and
// values, the head tied to the embedding, learned positions; experts (moe-tiny, moe-small) of 4C,
// no shared ones, every layer routed.
ModelShape shape_of(const GPT2Config& cfg);
// What makes a shape no model at all, or "": sizes that must be positive and divide.
std::string model_shape_problem(const ModelShape& s);

// Parameters.
double attention_params(const ModelShape& s);          // one layer's Q, K, V and output matrices
double mlp_params(const ModelShape& s, int width);     // one MLP of this hidden width
double dense_layer_params(const ModelShape& s);        // attention + dense MLP + the two norms
double moe_layer_shared_params(const ModelShape& s);   // attention + shared experts + router + norms
double moe_layer_expert_params(const ModelShape& s);   // the routed experts, all E of them
double layer_params(const ModelShape& s, int layer);   // everything a layer holds
double embedding_params(const ModelShape& s);          // V x C (+ T x C for learned positions)
double head_params(const ModelShape& s);               // V x C untied, 0 tied (it is the embedding)
double total_params(const ModelShape& s);
// What one token passes through: every dense matrix, its top_k experts and the shared ones, the head.
double active_params(const ModelShape& s);

// FLOPs per token, forward. The matrix products: 2 per parameter a token passes through (router
// included). Attention's two products (scores and values), causal, as FlashAttention computes them:
// a query at position i meets i + 1 keys, T/2 on average (at most `window`). The head: 2VC.
double layer_product_flops(const ModelShape& s, int layer);
double layer_attention_flops(const ModelShape& s, int layer);
double head_flops(const ModelShape& s);
// The count the published tables divide by (PaLM's appendix B, Megatron-LM's
// num_floating_point_operations): 3 x (2 x matrix-product parameters a token passes through + the
// attention products over the full T x T, 4 x NH x head_dim x T a layer): 6N + 12 L NH hd T for
// multi-head attention of width C.
double model_flops_per_token(const ModelShape& s);

// The activations one layer keeps per token for the backward, in elements, with FlashAttention (a
// log-sum-exp per query and head instead of T x T scores) and no dropout (docs/theory.md, section 16).
// Split by TP (heads, the MLP's width) or kept whole on every TP rank unless sequence parallelism
// splits it too; "inputs" are a matrix product's inputs (which an FP8 recipe may cache in one byte),
// the rest is kept in bf16 (the log-sum-exp and the router's probabilities in fp32).
struct LayerActivations {
  double residual = 0;      // whole: the two norms' inputs (the residual stream), 2C
  double norm_out = 0;      // whole, inputs: the norms' outputs (attention's and the MLP's inputs), 2C
  double latents = 0;       // whole, inputs: MLA's query and key/value latents (the up-projections' inputs)
  double qkv = 0;           // split: queries, keys, values (MLA: after the up-projection)
  double attention_out = 0;  // split, inputs: attention's output (the output product's input)
  double lse = 0;           // split, fp32: a log-sum-exp per head
  double mlp_in = 0;        // split: GELU's input, or SwiGLU's gate and up outputs (the dense and shared MLPs)
  double mlp_product = 0;   // split, inputs: GELU's output or SwiGLU's product (the down product's input)
  double router = 0;        // whole, fp32: the router's probabilities, E
  // Per routed row (a token's copy at one of its experts): its input (inputs), the MLP's inside as
  // above, and the expert's output (which the combine's gradient for the router weight reads).
  double routed_in = 0, routed_mlp_in = 0, routed_product = 0, routed_out = 0;
};
LayerActivations layer_activations(const ModelShape& s, int layer);
// The elementwise work of one layer's forward, in elements read and written per token (each op reads
// its inputs and writes its output once, fused as Megatron-Core fuses them): the two norms (C in, C
// out each), the two residual adds with their bias (2C in, C out each), the MLP's activation (GELU: F
// in, F out; SwiGLU: 2F in, F out); per routed row the permutation to the expert and back (2C each
// way) and the expert's activation. The backward reads what the forward read and the output's
// gradient, and writes the input's: twice the forward's. docs/theory.md, section 16.
struct LayerElementwise {
  double per_token = 0, per_routed_row = 0;
};
LayerElementwise layer_elementwise(const ModelShape& s, int layer);
// The loss's elementwise bytes per token, forward and backward: the head's bf16 logits read into an
// fp32 copy (2V + 4V), the softmax's two passes over it (8V), the gradient written back (2V + 4V).
double loss_elementwise_bytes(const ModelShape& s);

// Selective recomputation of a published shape (DeepSeek-V3's, section 3.2.3, and Megatron-Core's
// cheap modules): the norms' outputs, MLA's up-projections (q, k, v from the latents) and the
// MLP's activation (GELU's or SwiGLU's product) are recomputed in the backward, not kept. Its extra
// FLOPs per token, forward: MLA's up-projections only (the rest is elementwise).
double selective_recompute_flops(const ModelShape& s, int layer);
