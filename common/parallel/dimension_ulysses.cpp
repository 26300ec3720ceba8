// dimension_ulysses.cpp: Ulysses sequence parallelism as a dimension (dimension.h; docs/theory.md,
// section 13b): the exchange's buffers in the forecast and the table's line that sets them beside the
// arena on the positions held. Its axis is the grid's U (grid_axes.h: the token "ulysses" in the
// order "tp-ulysses-cp-dp-pp", inside the ring; its groups ProcessGrid::ulysses() and ring()), a data
// axis along which the parameters have copies, as DP and CP (kDataAxes). Its refusals are
// ulysses_problem(), its bytes ulysses_forward_bytes() and ulysses_backward_bytes()
// (ulysses_attention.h), which the chapters print beside the measure (ulysses_report.h). What it
// installs on a model chunk: attention through its exchanges (apply_ulysses, parallelize.h).
#include "parallel/dimension.h"
#include "parallel/parallelize.h"

#include "comm/lanes.h"  // lane_index: the calling thread's lane

#include "parallel/ulysses_attention.h"  // ulysses_buffer_bytes

double ulysses_activation_bytes(const DimensionContext& ctx, int t) {
  if (!ctx.cp.on() || ctx.cp.ulysses == 1) return 0;
  return ulysses_buffer_bytes(ctx.micro_B, ctx.held.T, ctx.model.C / t);
}

namespace {

class UlyssesDimension : public Dimension {
 public:
  const char* name() const override { return "ulysses"; }

  // One exchange's buffers, reused by every layer (the backward exchanges q, k, v and the output
  // again rather than keeping them per layer), once per lane where a pipeline's F&B pairs run at once.
  void add_memory(const DimensionContext& ctx, MemoryForecast& forecast) const override {
    forecast.activations += activations_beside_model(ctx, ctx.tp.size);
  }
  double activations_beside_model(const DimensionContext& ctx, int t) const override {
    return ctx.pp.scratch_lanes() * ulysses_activation_bytes(ctx, t);
  }

  int collective_groups(const DimensionContext&) const override { return 1; }

  // The exchange's buffers under the activations; the all-to-alls' bytes, as the Ulysses group's counters
  // measured them over the step, next to the formula on this rank's positions, channels and blocks.
  void report_rows(const DimensionContext& ctx, const StepMeasure& step, ReportTable& table) const override {
    const int u = ctx.cp.ulysses;
    table.activation_notes.push_back(report_line(
        "    (Ulysses %d x ring %d: each rank holds T/(u cp) = %d positions of all heads; the exchange's buffers "
        "14 B T C x 4 = %s, whatever u; docs/theory.md, section 13b)",
        u, ctx.cp.ring(), ctx.held.T, format_bytes(ulysses_activation_bytes(ctx, ctx.tp.size)).c_str()));
    int blocks = 0;  // this rank's, every pipeline chunk's
    for (const ModelPart& part : ctx.pp.parts.empty() ? std::vector<ModelPart>{ModelPart{}} : ctx.pp.parts)
      for (int unit = 1; unit <= ctx.model.L; unit++) blocks += part.holds(ctx.model, unit);
    const int C = ctx.model.C / ctx.tp.size, passes = ctx.model.recompute == Recompute::Full ? 2 : 1;
    const double theory = ulysses_forward_bytes(u, blocks, ctx.micro_batches, ctx.micro_B, ctx.held.T, C, passes) +
                          ulysses_backward_bytes(u, blocks, ctx.micro_batches, ctx.micro_B, ctx.held.T, C);
    const CommStats* measured = step.group("ulysses");
    const double bytes = measured ? double(measured->training_sent_bytes()) : 0;
    table.comm_rows.push_back(report_row("Ulysses bytes per step", bytes, theory));
    table.comm_rows.push_back(report_line("  (Ulysses theory: (4 x passes + 8) (u-1)/u x L' K B T C x 4, T = %d "
                                          "positions held, C = %d channels, L' = %d blocks)", ctx.held.T, C, blocks));
    table.json.add("measured_ulysses_bytes", bytes).add("theory_ulysses_bytes", theory);
  }
};

}  // namespace

std::unique_ptr<Dimension> make_ulysses_dimension(const DimensionContext& ctx) {
  if (!ctx.cp.on() || ctx.cp.ulysses == 1) return nullptr;
  return std::make_unique<UlyssesDimension>();
}

// Nothing of its own in the run record (the "cp" record has "ulysses"); in the header, how it splits
// the context-parallel ranks.
const DimensionSizes kUlyssesSizes = {
    "--ulysses", [](const Parallelism&, JsonObject&) {},
    [](const Parallelism& split) {
      return split.cp.ulysses > 1 ? " (Ulysses " + std::to_string(split.cp.ulysses) + " x ring " +
                                        std::to_string(split.cp.ring()) + ")"
                                  : std::string();
    }};

ChunkTransform apply_ulysses(const std::vector<UlyssesAttention*>& exchange_of_lane) {
  if (exchange_of_lane.empty()) return ChunkTransform();
  return [exchange_of_lane](GPT2& chunk, int) {
    auto mine = [exchange_of_lane] { return exchange_of_lane[exchange_of_lane.size() > 1 ? size_t(lane_index()) : 0]; };
    chunk.attention_hooks.attention_forward = [mine](Tensor out, Tensor lse, Tensor qkv, int NH) {
      mine()->forward(out, lse, qkv, NH);
    };
    chunk.attention_hooks.attention_backward = [mine](Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                                                      int NH) { mine()->backward(dqkv, dout, qkv, out, lse, NH); };
  };
}
