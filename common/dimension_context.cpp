// dimension_context.cpp: context parallelism as a dimension (dimension.h; docs/theory.md, section
// 13): the ring's blocks in flight in the forecast, the ring's scratch buffers, and the table's line
// that sets the arena on T/cp positions beside one rank's and 01's materialized attention.
#include "dimension.h"

#include "ring_attention.h"  // ring_buffer_bytes

namespace {

class ContextDimension : public Dimension {
 public:
  const char* name() const override { return "context"; }

  // The model holds T/cp positions and keeps a log-sum-exp per query instead of the attention
  // matrices (the context's `held`); the ring adds its blocks in flight, of this rank's heads (NH/t
  // under tensor parallelism: 12).
  void add_memory(const DimensionContext& ctx, MemoryForecast& forecast) const override {
    forecast.activations += ring_buffer_bytes(ctx.cp.size, ctx.micro_B, ctx.held.T, ctx.model.C / ctx.tp.size,
                                              ctx.model.NH / ctx.tp.size);
  }

  int collective_groups(const DimensionContext&) const override { return 1; }

  // Every term of the arena is linear in the positions a rank holds, T/cp, once attention keeps a
  // log-sum-exp per query rather than the T x T matrices; the ring adds its blocks in flight.
  void report_rows(const DimensionContext& ctx, const StepMeasure&, ReportTable& table) const override {
    const int held = ctx.held.T;
    GPT2Config local = ctx.model;
    local.T = held;
    table.activation_notes.push_back(report_line(
        "    (by the formula: CP %d: the arena on T/cp = %d positions %s + the ring's blocks in flight %s | "
        "CP 1 %s | 01's materialized attention %s; docs/theory.md, section 13)",
        ctx.cp.size, held, format_bytes(activation_bytes(local, ctx.micro_B, ctx.dtype, true)).c_str(),
        format_bytes(ring_buffer_bytes(ctx.cp.size, ctx.micro_B, held, ctx.model.C, ctx.model.NH)).c_str(),
        format_bytes(context_parallel_activation_bytes(ctx.model, ctx.micro_B, 1)).c_str(),
        format_bytes(activation_bytes(ctx.model, ctx.micro_B, ctx.dtype, false)).c_str()));
  }
};

}  // namespace

std::unique_ptr<Dimension> make_context_dimension(const DimensionContext& ctx) {
  if (!ctx.cp.on()) return nullptr;
  return std::make_unique<ContextDimension>();
}
