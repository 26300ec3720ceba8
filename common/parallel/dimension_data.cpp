// dimension_data.cpp: data parallelism as a dimension (dimension.h): the world's and the
// data-parallel group's scratch buffers, and the group's bytes per step next to theory: the
// strategy's, or, where the gradients travel otherwise, the rule they follow (ZeRO-2's every
// micro-batch; chapter 11's experts averaged apart).
#include "parallel/data_parallel.h"  // GradientSync: ZeRO-2's rule
#include "parallel/dimension.h"

namespace {

// The tied wte is summed over the pipeline's two ends (08's embedding group) before it is reduced
// over this group, unless this rank runs both ends itself (one stage, or a V: zb-v, dualpipev).
bool wte_summed_over_stages(const DimensionContext& ctx) {
  const ParamLayout& layout = *ctx.layout;
  const int wte = layout.find("wte");
  if (!ctx.embedding_group || !layout.params[size_t(wte)].held()) return false;
  bool embedding = false, head = false;
  for (const ModelPart& part : ctx.pp.parts) {
    embedding = embedding || part.holds(ctx.model, 0);
    head = head || part.holds(ctx.model, ctx.model.L + 1);
  }
  return !(embedding && head);
}

// This group's bytes per step where the gradients do not follow the strategy's rule.
void own_rule(const DimensionContext& ctx, Prediction& p) {
  if (ctx.pp.reduce_every_micro_batch) {
    // 08, 09, 12 --zero2: every micro-batch reduce-scattered, but the tied wte's bucket (summed over
    // the stages first, once a step) held back to the step's end (data_parallel.h, set_every_micro_batch).
    // A MoE model's experts travel over their own group (12), not this one.
    const int64_t held_back = wte_summed_over_stages(ctx) ? ctx.layout->tied_wte_end : 0;
    const int64_t dense = ctx.layout->padded_size - ctx.layout->expert_range_size;
    const Wire& wire = collective_formats().gradients;  // a recipe's gradients travel in its format
    p.comm_bytes = GradientSync::every_micro_batch_sent_bytes(ctx.dp_size, ctx.micro_batches, dense, held_back,
                                                              wire.fp32 ? double(dtype_size(ctx.dtype)) : double(wire.element_bytes()),
                                                              double(dtype_size(ctx.dtype)));
    p.comm_formula = GradientSync::kEveryMicroBatchFormula;
  } else if (ctx.ep.routing_counts_over_data_group) {
    // 11: the experts' gradients go over their expert-data-parallel group; this one carries the rest
    // of the model's and every layer's routing counts (docs/theory.md, 14).
    const ExpertTheory theory =
        expert_theory(*ctx.layout, ctx.model, ctx.world_size, ctx.ep.size, ctx.micro_B, ctx.micro_batches);
    p.comm_bytes = theory.world_all_reduce + theory.counts_all_gather;
    p.comm_formula = "2(W-1)/W x 4 x non-expert elements (padding included) + K x L x (W-1) x 4E counts";
  }
}

class DataDimension : public Dimension {
 public:
  const char* name() const override { return "data"; }

  // The world (the loss, the agreement to stop), and the data-parallel group where it is another.
  int collective_groups(const DimensionContext& ctx) const override {
    return 1 + ctx.dp_apart;
  }

  void report_rows(const DimensionContext& ctx, const StepMeasure& step, ReportTable& table) const override {
    Prediction& p = table.strategy;
    own_rule(ctx, p);
    const double padding =
        double(dtype_size(ctx.dtype)) * double(ctx.layout->padded_size - ctx.layout->num_params);
    // Named apart where other groups have rows of their own (TP, PP, CP); the strategy runs over
    // DP x CP under context parallelism, whose ranks hold the same parameters.
    const bool alone = ctx.dp_size == ctx.world_size && !ctx.cp.on();
    const int64_t bytes = step.data.training_sent_bytes();
    table.comm_rows.push_back(report_row(ctx.cp.on() ? "DP x CP bytes per step" : alone ? "comm bytes per step"
                                                                                       : "DP bytes per step",
                                         double(bytes), p.comm_bytes));
    table.comm_rows.push_back(report_line("  (%scomm theory: %s; padding adds up to %s per full copy)", alone ? "" : "DP ",
                                          p.comm_formula.c_str(), format_bytes(padding).c_str()));
    table.json.add("measured_comm_bytes", bytes).add("theory_comm_bytes", p.comm_bytes);
  }
};

}  // namespace

std::unique_ptr<Dimension> make_data_dimension(const DimensionContext&) { return std::make_unique<DataDimension>(); }
