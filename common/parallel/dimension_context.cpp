// dimension_context.cpp: context parallelism as a dimension (dimension.h; docs/theory.md, section
// 13): the ring's blocks in flight in the forecast, the ring's scratch buffers, and the table's line
// that sets the arena on T/cp positions beside one rank's and 01's materialized attention; its
// formulas of theory.h (context_parallel_activation_bytes, ring_sent_bytes); and what it installs on a
// model chunk, attention around the chapter's ring (apply_context_parallel, parallelize.h).
#include "parallel/dimension.h"
#include "parallel/parallelize.h"

#include "ops/ring_attention.h"  // ring_buffer_bytes

namespace {

class ContextDimension : public Dimension {
 public:
  const char* name() const override { return "context"; }

  // The model holds T/cp positions and keeps a log-sum-exp per query instead of the attention
  // matrices (the context's `held`); the ring adds its blocks in flight, of this rank's heads (NH/t
  // under tensor parallelism: 12), once per lane where a pipeline's F&B pairs run at once (lanes.h).
  void add_memory(const DimensionContext& ctx, MemoryForecast& forecast) const override {
    forecast.activations += activations_beside_model(ctx, ctx.tp.size);
  }

  // The ring's blocks in flight, of NH/t heads, on the positions held (section 13): the one place the
  // forecast and the activations' formula take them from.
  double activations_beside_model(const DimensionContext& ctx, int t) const override {
    return ctx.pp.scratch_lanes() * ring_buffer_bytes(ctx.cp.ring(), ctx.micro_B, ctx.held.T, ctx.model.C / t, ctx.model.NH / t);
  }

  int collective_groups(const DimensionContext&) const override { return 1; }

  // Every term of the arena is linear in the positions a rank holds, T/cp, once attention keeps a
  // log-sum-exp per query rather than the T x T matrices; the ring adds its blocks in flight. Each
  // figure is this rank's part (its heads under TP, its stage's chunks under PP: 12), beside the
  // same part at CP 1 and 01's whole model with materialized attention.
  void report_rows(const DimensionContext& ctx, const StepMeasure&, ReportTable& table) const override {
    const int t = ctx.tp.size;
    auto arena = [&](const GPT2Config& cfg) {
      double bytes = 0;
      for (const ModelPart& part : ctx.pp.parts.empty() ? std::vector<ModelPart>{ModelPart{}} : ctx.pp.parts)
        bytes += activation_bytes(cfg, ctx.micro_B, ctx.dtype, true, ctx.tp, part);
      return bytes;
    };
    const double one_ring = arena(ctx.model) + ring_buffer_bytes(1, ctx.micro_B, ctx.model.T, ctx.model.C / t, ctx.model.NH / t);
    table.activation_notes.push_back(report_line(
        "    (by the formula: CP %d: the arena on T/cp = %d positions %s + the ring's blocks in flight %s | "
        "CP 1 %s | 01's materialized attention %s; docs/theory.md, section 13)",
        ctx.cp.size, ctx.held.T, format_bytes(arena(ctx.held)).c_str(),
        format_bytes(ring_buffer_bytes(ctx.cp.ring(), ctx.micro_B, ctx.held.T, ctx.model.C / t, ctx.model.NH / t)).c_str(),
        format_bytes(one_ring).c_str(), format_bytes(activation_bytes(ctx.model, ctx.micro_B, ctx.dtype, false)).c_str()));
  }
};

}  // namespace

std::unique_ptr<Dimension> make_context_dimension(const DimensionContext& ctx) {
  if (!ctx.cp.on()) return nullptr;
  return std::make_unique<ContextDimension>();
}

// The ring's formulas (theory.h; docs/theory.md, sections 13 and 17).

double context_parallel_activation_bytes(const GPT2Config& cfg, int B, int cp) {
  GPT2Config held = cfg;
  held.T = cfg.T / cp;
  return activation_bytes(held, B, DType::F32, true) + ring_buffer_bytes(cp, B, held.T, cfg.C, cfg.NH);
}
double ring_sent_bytes(const GPT2Config& cfg, int blocks, int m, int B, int cp, int tp) {
  const double passes = cfg.recompute == Recompute::Full ? 2 : 1;
  return (2 * passes + 4) * double(cp - 1) / cp * blocks * double(m) * B * cfg.T * (double(cfg.C) / tp) * 4;
}

// Its size in the run record and the header (Ulysses' ranks included: they are the inner part of the axis).
const DimensionSizes kContextSizes = {
    "--cp", [](const Parallelism& split, JsonObject& record) { record.add("cp", split.cp.size); },
    [](const Parallelism& split) { return " x " + std::to_string(split.cp.size) + " context-parallel"; }};

ChunkTransform apply_context_parallel(AttentionHooks ring) {
  return [ring](GPT2& chunk, int) { chunk.attention_hooks = ring; };
}
