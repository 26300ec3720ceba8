// dimension_pipeline.cpp: pipeline parallelism as a dimension (dimension.h): the embedding group's
// scratch buffers (the pipeline's own group only sends and receives), and the recompute line in the
// table, since a stage keeps the schedule's micro-batches in flight. Its stages' bubble, activations
// and bytes are 08's report (pipeline_report.h). Its formula of theory.h: pipeline_buffer_bytes.
#include "parallel/dimension.h"

#include <algorithm>

namespace {

class PipelineDimension : public Dimension {
 public:
  const char* name() const override { return "pipeline"; }

  int collective_groups(const DimensionContext& ctx) const override { return ctx.embedding_group ? 1 : 0; }

  void report_rows(const DimensionContext&, const StepMeasure&, ReportTable& table) const override {
    table.recompute_note = true;
  }

  // A recipe's messages stage their codes (wire_p2p.h): every message buffer's, a receive posted into
  // each, and a sent output's from each activation slot of a chunk whose output leaves it, b_a
  // bytes an element where the buffers hold 4; and the tied wte's sum (docs/theory.md, section 3).
  double wire_staging_at_most(const DimensionContext& ctx, const CollectiveFormats& formats) const override {
    const Wire& wire = formats.activations;
    if (wire.fp32) return 0;
    const double rows_divisor = ctx.tp.size > 1 && ctx.tp.sequence_parallel ? ctx.tp.size : 1;
    const double message = double(ctx.micro_B) * ctx.held.T * ctx.model.C / rows_divisor;  // elements
    double elements = 0;
    for (const ModelPart& part : ctx.pp.parts) {
      elements += pipeline_buffer_bytes(ctx.held, part, ctx.pp.size, ctx.micro_B, DType::F32, ctx.tp) / 4;
      if (!part.holds(ctx.model, ctx.model.L + 1)) elements += double(part.slots) * message;
    }
    // The tied wte's gradient, summed over the first and last stage in the gradients' format, stages
    // its codes in the embedding group's own buffer: b_g x this rank's wte.
    const int wte = ctx.layout->find("wte");
    const bool sums_wte = ctx.embedding_group && wte >= 0 && ctx.layout->params[size_t(wte)].held();
    const double wte_sum =
        sums_wte ? double(formats.gradients.element_bytes()) * double(ctx.layout->params[size_t(wte)].size) : 0;
    return double(std::max(wire.element_bytes(), formats.gradients.element_bytes())) * elements + wte_sum;
  }
};

}  // namespace

std::unique_ptr<Dimension> make_pipeline_dimension(const DimensionContext& ctx) {
  if (ctx.pp.size == 1) return nullptr;
  return std::make_unique<PipelineDimension>();
}

// A stage's message buffers (theory.h; docs/theory.md, section 3).

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

// Its stages in the run record and the header.
const DimensionSizes kPipelineSizes = {
    "--pp", [](const Parallelism& split, JsonObject& record) { record.add("pp", split.pp.size); },
    [](const Parallelism& split) {
      return " x " + std::to_string(split.pp.size) + " pipeline stage" + (split.pp.size > 1 ? "s" : "");
    }};
