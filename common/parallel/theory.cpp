// theory.cpp: the formulas of docs/theory.md, fp32 and bf16 mixed-precision columns.
#include "parallel/theory.h"

#include <algorithm>

#include "comm/comm.h"            // wire_bytes_for
#include "model/moe.h"             // MoELayer::capacity_of
#include "ops/ring_attention.h"  // ring_buffer_bytes

Prediction predict(Strategy strategy, const ParamLayout& layout, int grad_accum, DType dtype,
                   const CollectiveFormats& wire) {
  const double psi = double(layout.num_params), N = layout.ranks;
  const double ring = (N - 1) / N;  // a ring collective sends this share of the payload per rank
  // Bytes per parameter of the parameters (= of the gradients, = of an element on the wire) and of
  // the optimizer state: 4 and 8 in fp32; 2 and 12 in mixed precision (master weights, m, v).
  const bool mixed = dtype == DType::BF16;
  const double w = mixed ? 2 : 4, k = mixed ? 12 : 8;
  const std::string W = mixed ? "2" : "4", K = mixed ? "12" : "8";
  const double K_acc = grad_accum;
  // A mixture of experts (11, 12): its experts (Ψe of this rank's Ψ) average over the ranks that
  // hold them, D = ep.replicas, never in the data-parallel group, and a shard holds the rest's 1/N
  // and the experts' 1/D. A dense model: Ψe = 0, and the formulas read as docs/theory.md's table.
  const double experts = double(layout.expert_params), D = layout.ep.replicas, dense = psi - experts;
  const bool moe = experts > 0;
  const std::string all = "Ψ", travels = moe ? "(Ψ-Ψe)" : "Ψ";
  auto full = [&](const std::string& bytes) { return bytes + all; };
  auto shard = [&](const std::string& bytes) {
    return moe ? bytes + "(Ψ-Ψe)/N + " + bytes + "Ψe/D" : bytes + "Ψ/N";
  };
  auto one_shard = [&](const std::string& bytes, const std::string& also) {  // "(4Ψ + 8Ψ)/N"
    return moe ? shard(bytes) + " + " + shard(also) : "(" + bytes + "Ψ + " + also + "Ψ)/N";
  };
  // A shard's bytes at `bytes` a parameter (the dense model's k Ψ / N, as written).
  auto sharded = [&](double bytes) { return bytes * dense / N + bytes * experts / D; };
  const std::string wire_text = W + travels;
  Prediction p;
  switch (strategy) {
    case Strategy::DP:
      p = {"DP", full(W) + " + " + full(W) + " + " + full(K), w * psi, w * psi, k * psi,
           "all-reduce: 2(N-1)/N x " + wire_text, 2 * ring * w * dense};
      break;
    case Strategy::ZeRO1:
      p = {"ZeRO-1", full(W) + " + " + full(W) + " + " + shard(K), w * psi, w * psi, sharded(k),
           "reduce-scatter + all-gather: 2(N-1)/N x " + wire_text, 2 * ring * w * dense};
      break;
    case Strategy::ZeRO2:
      p = {"ZeRO-2", full(W) + " + " + one_shard(W, K), w * psi, sharded(w), sharded(k),
           "K reduce-scatters + all-gather: (K+1)(N-1)/N x " + wire_text, (K_acc + 1) * ring * w * dense};
      break;
    case Strategy::ZeRO3:
      p = {"ZeRO-3", moe ? shard(W) + " + " + shard(W) + " + " + shard(K) : "(" + W + "Ψ + " + W + "Ψ + " + K + "Ψ)/N",
           sharded(w), sharded(w), sharded(k), "K x (2 all-gathers + reduce-scatter): 3K(N-1)/N x " + wire_text,
           3.0 * K_acc * ring * w * dense};
      break;
  }
  if (wire.gradients.fp32 && wire.weights.fp32) return p;
  // A recipe's formats on the wire (docs/theory.md, "Communication in the format"): gradients in g
  // bytes an element; ZeRO-1 and 2 gather the fp32 master weights (w); ZeRO-3 gathers each layer's
  // product weights (Ψm: the blocks' matrices, 12LC^2 for GPT-2) in m bytes and the rest in w.
  const double g = double(wire.gradients.element_bytes()), m = double(wire.weights.element_bytes());
  double matrices = 0;
  for (const ParamInfo& q : layout.params)
    if (q.ndim == 2 && q.name != "wte" && q.name != "wpe" && q.expert < 0) matrices += double(q.size);
  const std::string G = std::to_string(int(g)), M = std::to_string(int(m));
  const std::string formats = " (gradients " + wire.gradients.name() + ", weights " + wire.weights.name() + ")";
  switch (strategy) {
    case Strategy::DP:
      p.comm_formula = "all-reduce: 2(N-1)/N x " + G + travels + formats;
      p.comm_bytes = 2 * ring * g * dense;
      break;
    case Strategy::ZeRO1:
      p.comm_formula = "reduce-scatter + all-gather: (N-1)/N x (" + G + travels + " + " + W + travels + ")" + formats;
      p.comm_bytes = ring * (g + w) * dense;
      break;
    case Strategy::ZeRO2:
      p.comm_formula = "K reduce-scatters + all-gather: (N-1)/N x (K " + G + travels + " + " + W + travels + ")" + formats;
      p.comm_bytes = ring * (K_acc * g + w) * dense;
      break;
    case Strategy::ZeRO3:
      p.comm_formula = "K x (2 all-gathers + reduce-scatter): K(N-1)/N x (2(" + M + "Ψm + " + W + "(Ψ-Ψm)) + " + G +
                       "Ψ), Ψm = the blocks' matrices" + formats;
      p.comm_bytes = K_acc * ring * (2 * (m * matrices + w * (dense - matrices)) + g * dense);
      break;
  }
  return p;
}

ModelStateBytes model_state_bytes(Strategy strategy, const ParamLayout& layout, DType dtype) {
  const double w = double(dtype_size(dtype)), k = dtype == DType::BF16 ? 12 : 8;
  const double full = double(layout.padded_size), shard = double(layout.shard_size());
  switch (strategy) {
    case Strategy::DP: return {w * full, w * full, k * full};
    case Strategy::ZeRO1: return {w * full, w * full, k * shard};
    case Strategy::ZeRO2: return {w * full, w * shard, k * shard};
    case Strategy::ZeRO3: return {w * shard, w * shard, k * shard};
  }
  return {};
}

namespace {
// One tensor of the arena: its bytes, rounded up to 64 as the model's arena carves it.
double carved(double elements, double element_bytes) {
  const double bytes = elements * element_bytes;
  return double(int64_t((bytes + 63) / 64) * 64);
}
}  // namespace

double activation_bytes(const GPT2Config& cfg, int B, DType dtype, bool flash, TensorParallelism tp,
                        const ModelPart& part) {
  const double w = double(dtype_size(dtype)), f32 = 4;  // statistics and losses stay fp32
  const double t = tp.size, T = cfg.T, C = cfg.C;
  // R positions; r of them kept between the parallel layers (a 1/t slice under sequence parallelism);
  // a rank's share of the heads' channels C', MLP channels F', vocabulary V' and heads NH'.
  const double R = double(B) * T, r = tp.size > 1 && tp.sequence_parallel ? R / t : R;
  const double Cl = C / t, Fl = 4 * C / t, Vl = cfg.V / t, NHl = cfg.NH / t;
  const double att = flash ? 0 : double(B) * NHl * T * T, lse = flash ? double(B) * NHl * T : 0;
  // The part's blocks and ends (the whole model unless a pipeline stage), and whether the products'
  // output gradients are kept per micro-batch for a later weight pass (split_backward): 1 or 0.
  const int blocks = std::min(part.last(cfg), cfg.L) - (std::max(part.first_unit, 1) - 1);
  const double head = part.holds(cfg, cfg.L + 1) ? 1 : 0, kept = part.split_backward ? 1 : 0;
  const bool selective = cfg.recompute == Recompute::Selective, full = cfg.recompute == Recompute::Full;
  // Per block, what its backward reads: ln1 (rC) and its mean and 1/std (r each), qkv (3RC'), the
  // attention output (RC'), the scores before and after softmax (B NH' T T each, not with Flash-
  // Attention, which keeps B NH' T log-sum-exps instead), attproj (rC), the stream after attention
  // (rC), ln2 (rC, 2r), fc before and after GELU (RF' each), the MLP projection (rC) and the stream
  // after the block (rC). Without tensor parallelism: 18 BTC + 2 B NH T^2 + 4 BT. Kept for the
  // weight pass: the output gradients of qkv (3RC'), the projections (RC each, all rows) and fc (RF').
  // The block's tensors up to GELU's output: what full recomputation replays (the MLP's projection
  // and the block's output need no replay: the backward reads neither, and the output is kept).
  const double replayed = carved(r * C, w) + 2 * carved(r, f32) + carved(3 * R * Cl, w) + carved(R * Cl, w) +
                          carved(att, w) + carved(lse, f32) + carved(r * C, w) + carved(r * C, w) +
                          carved(r * C, w) + 2 * carved(r, f32) + 2 * carved(R * Fl, w);
  const double weight_pass = kept * (carved(3 * R * Cl, w) + 2 * carved(R * C, w) + carved(R * Fl, w));
  // Kept per block and micro-batch: everything (none); all but the scores before and after softmax
  // (selective); the block's output only, the next block's input (full, never with a weight pass).
  const double block = full ? carved(r * C, w)
                            : replayed + (selective ? -1 : 1) * carved(att, w) + carved(r * C, w) +
                                  carved(r * C, w) + weight_pass;
  // Around the blocks: the stream entering the part (the embeddings, or the previous stage's
  // output: rC); on the loss's part, the final layernorm (rC, 2r), logits and probabilities (RV'
  // each), the losses (R), under tensor parallelism the cross-entropy's row maxima, sums and target
  // logits (R each), and the kept gradient of the logits (RV').
  const double cross_entropy = tp.size > 1 ? 3 * carved(R, f32) : 0;
  const double ends = carved(r * C, w) + head * (carved(r * C, w) + 2 * carved(r, f32) + 2 * carved(R * Vl, w) +
                                                 carved(R, f32) + cross_entropy + kept * carved(R * Vl, w));
  // The backward's scratch, reused by every block and micro-batch: gradients of the stream and of a
  // layernorm's output (rC each), of the attention output (RC'), of qkv (3RC', unless kept), of the
  // scores (2 B NH' T^2), of fc before and after GELU (RF' each; before, unless kept) and of the
  // logits (RV', the loss's part, unless kept). Under sequence parallelism, three full-rows buffers
  // (RC each): a gathered input, a row-parallel partial output, a full gradient.
  const double full_rows = tp.size > 1 && tp.sequence_parallel ? 3 * carved(R * C, w) : 0;
  const double scratch = 2 * carved(r * C, w) + carved(R * Cl, w) + (1 - kept) * carved(3 * R * Cl, w) +
                         2 * carved(att, w) + (2 - kept) * carved(R * Fl, w) + head * (1 - kept) * carved(R * Vl, w) +
                         full_rows;
  // Recomputation's workspace, one for every block and micro-batch: the recomputed softmax
  // (B NH' T^2; the scores before it go where their gradient will be written, which the attention's
  // backward overwrites), or, under full recomputation, the whole replayed block (less the scores
  // before softmax, for the same reason).
  const double workspace = full ? replayed : selective ? carved(att, w) : 0;
  return part.slots * (blocks * block + ends) + scratch + (blocks > 0 ? workspace : 0);
}

double context_parallel_activation_bytes(const GPT2Config& cfg, int B, int cp) {
  GPT2Config held = cfg;
  held.T = cfg.T / cp;
  return activation_bytes(held, B, DType::F32, true) + ring_buffer_bytes(cp, B, held.T, cfg.C, cfg.NH);
}

double recompute_flops_per_token(const GPT2Config& cfg, TensorParallelism tp, const ModelPart& part,
                                 bool lse_attention) {
  const int blocks = std::min(part.last(cfg), cfg.L) - (std::max(part.first_unit, 1) - 1);
  const double C = cfg.C, T = cfg.T;
  // A block's forward, per token: qkv 6C^2, the attention's two products 4TC (the score and value
  // products, over the full T x T as section 8 counts them), attn.proj 2C^2, fc 8C^2, mlp.proj 8C^2.
  // Full replays all but mlp.proj; selective only the two attention products (and the softmax, whose
  // few FLOPs per score are not counted, as section 8 does not count them).
  double per_block = 0;
  if (cfg.recompute == Recompute::Full) per_block = 16 * C * C + 4 * T * C;
  if (cfg.recompute == Recompute::Selective && !lse_attention) per_block = 4 * T * C;
  return blocks * per_block / tp.size;
}

TensorParallelPrediction predict_tensor_parallel(const GPT2Config& cfg, int micro_B, TensorParallelism tp,
                                                 DType dtype, const std::vector<ModelPart>& parts, int activation_bytes) {
  TensorParallelPrediction p;
  if (tp.size <= 1) return p;
  // The units this rank runs: every block, the embedding and the head, unless a pipeline stage's.
  int blocks = 0;
  bool embedding = parts.empty(), head = parts.empty();
  for (const ModelPart& part : parts) {
    blocks += std::min(part.last(cfg), cfg.L) - (std::max(part.first_unit, 1) - 1);
    embedding = embedding || part.first_unit == 0;
    head = head || part.holds(cfg, cfg.L + 1);
  }
  if (parts.empty()) blocks = cfg.L;
  const double t = tp.size, L = blocks, E = embedding ? 1 : 0, H = head ? 1 : 0, w = double(dtype_size(dtype));
  const std::string Ls = parts.empty() ? "L" : "L'";  // L': the blocks of this rank's stage
  // One B*T*C tensor, in the recipe's format on the wire where there is one.
  const double activations = double(micro_B) * cfg.T * cfg.C * (activation_bytes > 0 ? activation_bytes : w);
  const double rows = double(micro_B) * cfg.T * 4;                  // one fp32 value per position
  p.loss_all_reduces = head ? 3 : 0;
  const double loss_bytes = p.loss_all_reduces * 2 * (t - 1) / t * rows;
  // Full recomputation replays each block's forward up to GELU: its collectives again, but for the
  // MLP projection's g (docs/theory.md, "Activation recomputation").
  const bool full = cfg.recompute == Recompute::Full;
  if (!tp.sequence_parallel) {
    // Per block 2 all-reduces in forward (after the two row-parallel layers), 2 in backward (the inputs
    // of the two column-parallel layers); the embedding's in forward, the head's input in backward;
    // under full recomputation, the attention projection's g once more.
    p.recomputed = full ? int(L) : 0;
    p.all_reduces = int(4 * L + E + H) + p.recomputed;
    p.bytes_per_micro_batch = p.all_reduces * 2 * (t - 1) / t * activations + loss_bytes;
    p.formula = "(4" + Ls + (full ? " + " + Ls + " replayed" : "") +
                (parts.empty() ? " + 2" : std::string(embedding ? " + 1 embedding" : "") + (head ? " + 1 head" : "")) +
                ") all-reduces x 2(t-1)/t x BTC" + (head ? " + 3 x 2(t-1)/t x BT x 4 B" : "") +
                (parts.empty() ? "" : ", L' = " + std::to_string(blocks) + " blocks on this stage");
    return p;
  }
  // Each all-reduce becomes an all-gather and a reduce-scatter: forward, per block 2 all-gathers
  // (column inputs) and 2 reduce-scatters (row outputs); backward, 2 all-gathers (row outputs'
  // gradients), 2 reduce-scatters (column inputs' gradients), and 2 all-gathers of the column inputs
  // again, for the weights' gradients. The embedding: a reduce-scatter, then an all-gather; the head:
  // an all-gather, a reduce-scatter, and its input gathered again. Full recomputation replays per
  // block the two column inputs' all-gathers and the attention projection's reduce-scatter.
  // A MoE block (chapter 12; SP is then required) splits only its attention: half of those, and its
  // router, held whole, is summed with the layernorms and the projection's bias (no MLP biases).
  const double halves = cfg.moe() ? 1 : 2;
  p.regathers = int(halves * L + H);
  p.recomputed = full ? int(3 * L) : 0;
  p.all_gathers = int(2 * halves * L + E + H) + p.regathers + (full ? int(2 * L) : 0);
  p.reduce_scatters = int(2 * halves * L + E + H) + (full ? int(L) : 0);
  p.bytes_per_micro_batch = (p.all_gathers + p.reduce_scatters) * (t - 1) / t * activations + loss_bytes;
  const double per_block = cfg.moe() ? 5.0 * cfg.C + double(cfg.experts) * cfg.C : 6.0 * cfg.C;
  const double whole_params = L * per_block + H * 2 * cfg.C + E * double(cfg.T) * cfg.C;
  p.partial_grad_all_reduces = int(6 * L + E + 2 * H);
  p.partial_grad_bytes = 2 * (t - 1) / t * whole_params * w;
  if (cfg.moe())
    p.formula = "(5" + Ls + (embedding ? " + 2 embedding" : "") + (head ? " + 3 head" : "") +
                ") gathers/scatters x (t-1)/t x BTC (a MoE block splits its attention only)" +
                (head ? " + 3 x 2(t-1)/t x BT x 4 B" : "") + "; per step 6" + Ls +
                " all-reduces of the tensors held whole, 2(t-1)/t x (" + Ls + "(5C + EC)" +
                (embedding ? " + TC" : "") + (head ? " + 2C" : "") + ")";
  else if (parts.empty())
    p.formula = std::string(full ? "(13L + 5)" : "(10L + 5)") +
                " gathers/scatters x (t-1)/t x BTC + 3 x 2(t-1)/t x BT x 4 B; per step (6L + 3) all-reduces, "
                "2(t-1)/t x (6LC + 2C + TC)";
  else
    p.formula = "(" + std::string(full ? "13L'" : "10L'") + (embedding ? " + 2 embedding" : "") +
                (head ? " + 3 head" : "") + ") gathers/scatters x (t-1)/t x BTC" +
                (head ? " + 3 x 2(t-1)/t x BT x 4 B" : "") + "; per step (6L'" + (embedding ? " + 1" : "") +
                (head ? " + 2" : "") + ") all-reduces, 2(t-1)/t x (6L'C" + (embedding ? " + TC" : "") +
                (head ? " + 2C" : "") + "), L' = " + std::to_string(blocks) + " blocks on this stage";
  return p;
}

double pipeline_buffer_bytes(const GPT2Config& cfg, const ModelPart& part, int stages, int micro_B, DType dtype,
                             TensorParallelism tp) {
  // The messages: the input received (unless the part starts with the embedding) and its gradient
  // sent (with one stage, or from a V's turn, copied straight into the previous chunk's buffer
  // instead); the output's gradient received (unless it ends with the loss). The output is sent from
  // the activations.
  const int kinds = (part.first_unit > 0 ? (stages > 1 && !part.input_is_local ? 2 : 1) : 0) +
                    (part.holds(cfg, cfg.L + 1) ? 0 : 1);
  const double rows_divisor = tp.size > 1 && tp.sequence_parallel ? tp.size : 1;
  return kinds * double(part.slots) * double(micro_B) * cfg.T * cfg.C * double(dtype_size(dtype)) / rows_divisor;
}

double MemoryForecast::peak() const {
  return model_state + activations + data + staged_save + std::max(transient, checkpoint);
}

double moe_activation_bytes(const GPT2Config& cfg, int B, const std::vector<int64_t>& expert_rows) {
  if (!cfg.moe()) return 0;
  const double N = double(B) * cfg.T, E = cfg.experts, k = cfg.top_k, C = cfg.C;
  const double fixed = 4 * (N * E + 2 * N * k + 4 * N * k * C);  // per layer
  double rows = 0, most = 0;
  for (int64_t n : expert_rows) rows += double(n), most = std::max(most, double(n));
  return cfg.L * fixed + 4 * 9 * C * rows + 4 * 8 * C * most;
}

double moe_exchange_buffer_bytes(const GPT2Config& cfg, const std::vector<int64_t>& expert_rows) {
  if (!cfg.moe()) return 0;
  int64_t most = 0;
  for (int64_t n : expert_rows) most = std::max(most, n);
  return 4.0 * 4 * cfg.C * double(most);
}

int64_t moe_expert_rows_balanced(const GPT2Config& cfg, int B) { return int64_t(B) * cfg.T * cfg.top_k; }

int64_t moe_expert_rows_at_most_of(const GPT2Config& cfg, int64_t tokens, int ep, int routers) {
  const int64_t N = tokens, local = cfg.experts / ep;
  const int64_t capacity = MoELayer::capacity_of(cfg.capacity_factor, N * routers, cfg.top_k, cfg.experts);
  const int64_t per_expert = capacity < 0 ? ep * N : std::min(capacity, ep * N);
  return std::min(ep * N * cfg.top_k, local * per_expert);
}

double moe_schedule_activation_bytes(const GPT2Config& cfg, int64_t tokens, const std::vector<ModelPart>& parts,
                                     const std::vector<Action>& actions,
                                     const std::vector<std::vector<int64_t>>& rows) {
  if (!cfg.moe()) return 0;
  const std::vector<ModelPart> run = parts.empty() ? std::vector<ModelPart>{ModelPart{}} : parts;
  const double N = double(tokens), E = cfg.experts, k = cfg.top_k, C = cfg.C;
  auto blocks_of = [&](const ModelPart& part) {
    std::vector<int> blocks;
    for (int u = std::max(part.first_unit, 1); u <= std::min(part.last(cfg), cfg.L); u++) blocks.push_back(u - 1);
    return blocks;
  };
  double fixed = 0;
  for (const ModelPart& part : run) fixed += double(part.slots) * double(blocks_of(part).size());
  fixed *= 4 * (N * E + 2 * N * k + 4 * N * k * C);
  std::vector<Action> order = actions;
  if (order.empty())
    for (int micro = 0; micro < int(rows.size()); micro++) order.push_back({Op::F, micro, 0}), order.push_back({Op::B, micro, 0});
  // The replay: which slot each micro-batch takes (the executor's: the lowest free first, the last
  // freed next), what each slot's experts hold, and its scratch. A chunk's slots are its own (chapter
  // 12 keys the experts by chunk and slot, so that the two passes of an F&B pair never share one):
  // slot s of chunk c is the replay's c x (the most slots of a chunk) + s.
  std::vector<std::vector<int>> free_slots(run.size());
  int most_slots = 0;
  for (const ModelPart& part : run) most_slots = std::max(most_slots, part.slots);
  for (size_t c = 0; c < run.size(); c++)
    for (int s = run[c].slots - 1; s >= 0; s--) free_slots[c].push_back(int(c) * most_slots + s);
  std::vector<std::vector<int>> slot_of(run.size(), std::vector<int>(rows.size(), -1));
  const size_t keys = run.size() * size_t(most_slots);
  std::vector<std::vector<int64_t>> held(keys, std::vector<int64_t>(size_t(cfg.L), -1));  // -1: none
  std::vector<double> scratch(keys, 0);
  double now = 0, peak = 0;
  for (const Action& a : order) {
    const size_t c = size_t(a.chunk);
    if (a.op == Op::F) {
      const int slot = free_slots[c].back();
      free_slots[c].pop_back();
      slot_of[c][size_t(a.micro)] = slot;
      for (int l : blocks_of(run[c])) {
        const int64_t n = rows[size_t(a.micro)][size_t(l)];
        held[size_t(slot)][size_t(l)] = n;
        now += 4 * 9 * C * double(n);
        peak = std::max(peak, now);
      }
    } else if (a.op == Op::B) {
      const int slot = slot_of[c][size_t(a.micro)];
      std::vector<int> blocks = blocks_of(run[c]);
      for (auto l = blocks.rbegin(); l != blocks.rend(); ++l) {
        int64_t most = 0;
        for (int64_t n : held[size_t(slot)]) most = std::max(most, n);
        if (scratch[size_t(slot)] < 4 * 8 * C * double(most)) {  // the old block goes first
          now += 4 * 8 * C * double(most) - scratch[size_t(slot)];
          scratch[size_t(slot)] = 4 * 8 * C * double(most);
          peak = std::max(peak, now);
        }
        now -= 4 * 9 * C * double(held[size_t(slot)][size_t(*l)]);
        held[size_t(slot)][size_t(*l)] = -1;
        bool any = false;
        for (int64_t n : held[size_t(slot)]) any = any || n >= 0;
        if (!any) now -= scratch[size_t(slot)], scratch[size_t(slot)] = 0;
      }
      if (!run[c].split_backward) free_slots[c].push_back(slot);
    } else if (a.op == Op::W) {
      free_slots[c].push_back(slot_of[c][size_t(a.micro)]);
    }
  }
  return fixed + peak;
}

int64_t moe_expert_rows_at_most(const GPT2Config& cfg, int B, int ep, int world) {
  const int64_t N = int64_t(B) * cfg.T, local = cfg.experts / ep;
  const int64_t capacity = MoELayer::capacity_of(cfg.capacity_factor, N * world, cfg.top_k, cfg.experts);
  const int64_t per_expert = capacity < 0 ? ep * N : std::min(capacity, ep * N);
  return std::min(ep * N * cfg.top_k, local * per_expert);
}

MemoryForecast forecast_memory(Strategy strategy, const ParamLayout& layout, int64_t whole_model_size,
                               const GPT2Config& cfg, int micro_B, int micro_batches, DType dtype, Device device,
                               bool flash, bool saves_or_resumes, double data_bytes, TensorParallelism tp,
                               const PipelineParallelism& pp) {
  const std::vector<ModelPart>& parts = pp.parts;
  const double w = double(dtype_size(dtype)), N = layout.ranks;
  MemoryForecast m;
  // The buffers are padded (param_layout.h): the formula's Ψ is the padded length here, and a shard's
  // the layout's shard_size (a MoE model's experts over their replicas, the rest over N).
  m.model_state = model_state_bytes(strategy, layout, dtype).total();
  m.activations = 0;
  for (const ModelPart& part : parts.empty() ? std::vector<ModelPart>{ModelPart{}} : parts)
    m.activations += activation_bytes(cfg, micro_B, dtype, flash, tp, part);
  if (device == Device::CUDA) m.activations += 2.0 * micro_batches * micro_B * cfg.T * 4;  // token ids, in and out

  // Communication buffers, at most (docs/theory.md, "Transient buffers"): the largest block U, the
  // embedding unit E (which the tied head keeps gathered, and whose gradient stays open from the
  // head's backward to the embedding's).
  double U = 0;
  for (int u = 1; u + 1 < layout.num_units(); u++) U = std::max(U, double(layout.unit_size(u)));
  const double E = double(layout.unit_size(0)), head = double(layout.unit_size(layout.num_units() - 1));
  // ZeRO-2/3's layer gradients: two reduce-scatters in flight, each with the piece it receives, one of
  // which may be the embedding's (reduce-scattered last, it is open from the head's backward on).
  const double layer_grads = (E + 2 * U) * (1 + 1 / N);
  switch (strategy) {
    case Strategy::DP: m.transient = 0; break;
    case Strategy::ZeRO1:  // the gradient shard; under ZeRO-2's rule also each micro-batch's pieces
      m.transient = w * double(layout.shard_size()) * (pp.reduce_every_micro_batch ? 2 : 1);
      break;
    case Strategy::ZeRO2: m.transient = w * layer_grads; break;
    case Strategy::ZeRO3: m.transient = w * (layer_grads + E + 2 * U + head); break;  // + gathered layers
  }
  for (const ModelPart& part : parts) m.transient += pipeline_buffer_bytes(cfg, part, pp.size, micro_B, dtype, tp);
  // Full fp32 host copies of the whole model, Ψg = whole_model_size elements (docs/theory.md, section
  // 4): one to initialise, and where tensor, pipeline or expert parallelism splits the model, this
  // rank's part of it (its own Ψ) cut from it beside it; saving or resuming holds parameters, m and v
  // whole with a rank's part of one beside them, and rank 0 the file's bytes besides the three (as
  // many again): 6 whole copies. On a GPU these live on the host, except the shards gathered from
  // every rank.
  const bool split = tp.size > 1 || pp.size > 1 || layout.ep.size > 1;
  const double whole = 4.0 * double(split ? whole_model_size : layout.padded_size);
  const double own = split ? 4.0 * double(layout.padded_size) : 0;
  if (device == Device::CPU) {
    m.checkpoint = saves_or_resumes ? std::max(6 * whole, 3 * whole + own) : whole + own;
    m.data = data_bytes;
  } else {
    m.checkpoint = saves_or_resumes ? 4.0 * double(layout.padded_size) * tp.size : 0;
  }
  return m;
}

double ring_sent_bytes(const GPT2Config& cfg, int blocks, int m, int B, int cp, int tp) {
  const double passes = cfg.recompute == Recompute::Full ? 2 : 1;
  return (2 * passes + 4) * double(cp - 1) / cp * blocks * double(m) * B * cfg.T * (double(cfg.C) / tp) * 4;
}

double routing_counts_bytes(int blocks, int m, int group, int64_t chunk, int64_t record) {
  return double(blocks) * m * (group - 1) * double(chunk) * double(record) * 4;
}

namespace {
// The elements of the ranges whose gradients chapter 11 averages over the expert-data-parallel group:
// each run of expert tensors (held) and the padding after it, up to the next tensor held or the end.
int64_t expert_range_elements(const ParamLayout& layout) {
  int64_t elements = 0, begin = -1;  // begin: where the run of expert tensors being read began
  bool first = true;
  for (const ParamInfo& p : layout.params) {
    if (!p.held()) continue;
    const bool expert = p.expert >= 0;
    if (expert && begin < 0) begin = first ? 0 : p.offset;
    if (!expert && begin >= 0) elements += p.offset - begin, begin = -1;
    first = false;
  }
  if (begin >= 0) elements += layout.padded_size - begin;
  return elements;
}
}  // namespace

ExpertTheory expert_theory(const ParamLayout& layout, const GPT2Config& cfg, int world, int ep, int micro_B,
                           int micro_batches) {
  ExpertTheory t;
  const int W = world, D = world / ep, P = ep, L = cfg.L, E = cfg.experts;
  const double C = cfg.C;
  const int64_t expert_range = expert_range_elements(layout);
  for (const ParamInfo& p : layout.params)
    if (p.expert >= 0) t.expert_elements += p.size;
  t.world_all_reduce = W > 1 ? 2.0 * (W - 1) / W * 4.0 * double(layout.padded_size - expert_range) : 0;
  t.expert_dp_all_reduce = D > 1 ? 2.0 * (D - 1) / D * 4.0 * double(expert_range) : 0;
  t.counts_all_gather =
      double(micro_batches) * double(L * wire_bytes_for(CollectiveKind::AllGather, int64_t(W) * E * 4, W));
  const double rows = double(micro_B) * cfg.T * cfg.top_k;  // n k: a rank's assignments, none dropped
  t.a2a_balanced = P > 1 ? L * (double(P - 1) / P * 4 * E + 4.0 * (P - 1) / P * rows * C * 4) : 0;
  t.expert_params = 4.0 * L * (E / ep) * (8 * C * C + 5 * C);
  return t;
}
