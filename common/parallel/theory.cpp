// theory.cpp: the formulas of docs/theory.md that belong to no one dimension: the model's activation
// arena, recomputation's FLOPs and the memory forecast that adds the dimensions' terms. Each
// dimension's own formulas (theory.h lists them all) live in its file: the data-parallel strategies'
// in dimension_data.cpp, tensor parallelism's in dimension_tensor.cpp, the pipeline's buffers in
// dimension_pipeline.cpp, the ring's in dimension_context.cpp, the experts' in dimension_expert.cpp.
#include "parallel/theory.h"

#include <algorithm>


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
  // scores (2 B NH' T^2), of fc's output (RF', unless kept; GELU's backward runs on the MLP
  // projection's input gradient where it is written, so the gradient of GELU's output has no buffer)
  // and of the logits (RV', the loss's part, unless kept). Under sequence parallelism, three
  // full-rows buffers (RC each): a gathered input, a row-parallel partial output, a full gradient.
  const double full_rows = tp.size > 1 && tp.sequence_parallel ? 3 * carved(R * C, w) : 0;
  const double scratch = 2 * carved(r * C, w) + carved(R * Cl, w) + (1 - kept) * carved(3 * R * Cl, w) +
                         2 * carved(att, w) + (1 - kept) * carved(R * Fl, w) + head * (1 - kept) * carved(R * Vl, w) +
                         full_rows;
  // Recomputation's workspace, one for every block and micro-batch: the recomputed softmax
  // (B NH' T^2; the scores before it go where their gradient will be written, which the attention's
  // backward overwrites), or, under full recomputation, the whole replayed block (less the scores
  // before softmax, for the same reason).
  const double workspace = full ? replayed : selective ? carved(att, w) : 0;
  return part.slots * (blocks * block + ends) + scratch + (blocks > 0 ? workspace : 0);
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

double MemoryForecast::peak() const {
  return model_state + activations + data + staged_save + precision_scratch + std::max(transient, checkpoint);
}

double precision_scratch_bytes(int C, int V, int64_t tokens, bool gradient_scaled, int64_t expert_rows) {
  const double c = C, M = double(expert_rows);
  const double products[][3] = {{c, 3 * c, double(tokens)}, {c, c, double(tokens)},      {c, 4 * c, double(tokens)},
                                {4 * c, c, double(tokens)}, {c, double(V), double(tokens)}, {c, 4 * c, M},
                                {4 * c, c, M}};  // {I, O, N}: the experts' last, over their rows
  double rounded_a = 0, rounded_b = 0, transposed = 0, result = 0, scaled = 0;
  for (const auto& [I, O, N] : products) {
    rounded_a = std::max(rounded_a, N * std::max(I, O));
    rounded_b = std::max(rounded_b, I * std::max(O, N));
    transposed = std::max(transposed, std::max(I * O, N * std::max(I, O)));
    result = std::max(result, I * std::max(N, O));
    if (gradient_scaled) scaled = std::max(scaled, N * O);
  }
  return 4 * (rounded_a + rounded_b + transposed + result + scaled);
}

MemoryForecast forecast_memory(Strategy strategy, const ParamLayout& layout, int64_t whole_model_size,
                               const GPT2Config& cfg, int micro_B, int micro_batches, DType dtype, Device device,
                               bool flash, bool saves_or_resumes, double data_bytes, TensorParallelism tp,
                               const PipelineParallelism& pp) {
  const std::vector<ModelPart>& parts = pp.parts;
  MemoryForecast m;
  // The buffers are padded (param_layout.h): the formula's Ψ is the padded length here, and a shard's
  // the layout's shard_size (a MoE model's experts over their replicas, the rest over N).
  m.model_state = model_state_bytes(strategy, layout, dtype).total();
  m.activations = 0;
  for (const ModelPart& part : parts.empty() ? std::vector<ModelPart>{ModelPart{}} : parts)
    m.activations += activation_bytes(cfg, micro_B, dtype, flash, tp, part);
  if (device == Device::CUDA) m.activations += 2.0 * micro_batches * micro_B * cfg.T * 4;  // token ids, in and out

  m.transient = strategy_transient_bytes(strategy, layout, dtype, pp.reduce_every_micro_batch);
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
