// dimension_expert.cpp: expert parallelism, and a mixture of experts on any grid, as a dimension
// (dimension.h; docs/theory.md, section 14): its routers' and experts' activations and its exchange
// buffers at the bound in the forecast, then in the table at the step's routing next to balanced
// routing and the bound; the expert-parallel group's scratch buffers. Also its refusal of an --ep
// that does not divide the experts (expert_count_problem, chapters 11 and 12) and the MoE helpers
// the run reads (moe_routed_tokens, moe_activations_at).
#include "parallel/dimension.h"

#include <algorithm>

namespace {

// A table of `rows` for every micro-batch of a step and every block (the bound's, the balanced ones).
std::vector<std::vector<int64_t>> every_micro_batch_and_layer(const DimensionContext& ctx, int64_t rows) {
  return std::vector<std::vector<int64_t>>(size_t(ctx.micro_batches), std::vector<int64_t>(size_t(ctx.model.L), rows));
}

// The most rows any expert of a block may receive, for any routing (moe_expert_rows_at_most_of).
int64_t rows_at_most(const DimensionContext& ctx) {
  return moe_expert_rows_at_most_of(ctx.model, moe_routed_tokens(ctx), ctx.ep.size, ctx.world_size / ctx.pp.size);
}

// The MoE layers' activations at `rows`, replayed in the schedule's order.
double replayed(const DimensionContext& ctx, const std::vector<std::vector<int64_t>>& rows) {
  return moe_schedule_activation_bytes(ctx.model, moe_routed_tokens(ctx), ctx.pp.parts, ctx.pp.actions, rows);
}

// Chapter 11's exchange buffers at the bound, as the forecast counts them: once per lane where a
// pipeline's F&B pairs run at once (lanes.h; each lane's reach the most rows of any layer, every layer
// exchanging as many rows backward as forward).
double exchange_at_most(const DimensionContext& ctx) {
  if (!ctx.expert_group) return 0;
  return ctx.pp.scratch_lanes() *
         moe_exchange_buffer_bytes(ctx.model, std::vector<int64_t>(size_t(ctx.model.L), rows_at_most(ctx)));
}

class ExpertDimension : public Dimension {
 public:
  const char* name() const override { return "expert"; }

  // The routing is not known before the step, so the forecast takes the bound.
  void add_memory(const DimensionContext& ctx, MemoryForecast& forecast) const override {
    forecast.activations += replayed(ctx, every_micro_batch_and_layer(ctx, rows_at_most(ctx)));
    forecast.transient += exchange_at_most(ctx);
  }

  int collective_groups(const DimensionContext& ctx) const override { return ctx.expert_group ? 1 : 0; }

  // The MoE layers at this step's routing (end_step's), next to balanced routing and the bound;
  // the exchange buffers at the same routing.
  void report_rows(const DimensionContext& ctx, const StepMeasure& step, ReportTable& table) const override {
    if (!ctx.model.moe()) return;
    // The experts' share of Ψ and the ranks that hold them: the strategy's formula (theory.h, predict)
    // averages them there, and a ZeRO shard holds Ψe/D of them.
    table.params_split += "; Ψe = " + std::to_string(ctx.layout->expert_params) + " in experts, D = " +
                          std::to_string(ctx.layout->ep.replicas) + " ranks hold them, N = " +
                          std::to_string(ctx.dp_size);
    table.json.add("expert_params", ctx.layout->expert_params)
        .add("padded_expert_params", ctx.layout->expert_range_size)
        .add("expert_replicas", ctx.layout->ep.replicas);
    const std::vector<std::vector<int64_t>>& rows = step.expert_rows;
    std::vector<int64_t> most_rows_each(size_t(ctx.model.L), 0);  // over the step's micro-batches
    for (const std::vector<int64_t>& micro_batch : rows)
      for (size_t l = 0; l < micro_batch.size(); l++) most_rows_each[l] = std::max(most_rows_each[l], micro_batch[l]);
    const double dense = table.activations - replayed(ctx, every_micro_batch_and_layer(ctx, rows_at_most(ctx)));
    const double balanced =
        dense + replayed(ctx, every_micro_batch_and_layer(ctx, moe_routed_tokens(ctx) * ctx.model.top_k));
    const double at_most = dense + replayed(ctx, every_micro_batch_and_layer(ctx, rows_at_most(ctx)));
    table.activations = rows.empty() ? at_most : dense + replayed(ctx, rows);
    if (!rows.empty()) table.activations_label = "activations (routing)";
    std::string counts;
    for (int64_t n : most_rows_each) counts += (counts.empty() ? "" : " ") + std::to_string(n);
    counts = rows.empty() ? "theory = the bound (exact on one rank without a capacity)"
                          : "theory at these routing counts, replayed in the schedule's order; the most rows per layer [" +
                                counts + "]";
    table.activation_notes.push_back(
        report_line("    (MoE, docs/theory.md 14: %s | balanced routing %s | at most %s, ep %d, capacity factor %g)",
                    counts.c_str(), format_bytes(balanced).c_str(), format_bytes(at_most).c_str(), ctx.ep.size,
                    ctx.model.capacity_factor));
    if (ctx.expert_group && !rows.empty()) {
      table.transient_theory = "the expert exchange at these routing counts, docs/theory.md 14; at most " +
                               format_bytes(table.transient);
      table.transient = table.transient - exchange_at_most(ctx) +
                        ctx.pp.scratch_lanes() * moe_exchange_buffer_bytes(ctx.model, most_rows_each);
      table.transient_label = "comm buffers (routing)";
    }
    table.json.add("theory_activations_balanced_bytes", balanced).add("theory_activations_at_most_bytes", at_most);
  }
};

}  // namespace

std::string expert_count_problem(const GPT2Config& model, int ep, int stage_ranks, int stages) {
  if (!model.moe() || ep < 1 || model.experts % ep == 0) return "";
  // What would work: an --ep that divides the experts and, where the ranks are known, the ranks it
  // folds over (grid_shape_problem's other condition), so that the suggestion is one the run takes.
  std::vector<int> fits;
  for (int e = 1; e <= model.experts; e++)
    if (model.experts % e == 0 && (stage_ranks < 1 || stage_ranks % e == 0)) fits.push_back(e);
  std::string values;
  for (size_t i = 0; i < fits.size(); i++)
    values += (i == 0 ? "" : i + 1 == fits.size() ? " or " : ", ") + std::to_string(fits[i]);
  std::string problem = "--ep " + std::to_string(ep) + " must divide the " + std::to_string(model.experts) +
                        " experts of --preset " + model.preset +
                        " (every rank of an expert-parallel group holds an equal number of them): pass --ep " + values;
  if (stage_ranks > 0)
    problem += std::string(fits.size() > 1 ? ", which divide" : ", which divides") + " both the experts and the " +
               std::to_string(stage_ranks) + " ranks" + (stages > 1 ? " of each pipeline stage" : "");
  return problem;
}

int64_t moe_routed_tokens(const DimensionContext& ctx) {
  return int64_t(ctx.micro_B) * ctx.held.T / (ctx.tp.sequence_parallel ? ctx.tp.size : 1);
}

double moe_activations_at(const DimensionContext& ctx, const std::vector<std::vector<int64_t>>& rows) {
  if (!ctx.model.moe()) return 0;
  return replayed(ctx, rows.empty() ? every_micro_batch_and_layer(ctx, rows_at_most(ctx)) : rows);
}

// Its experts, or the group they would be spread over (chapter 11 trains any preset).
std::unique_ptr<Dimension> make_expert_dimension(const DimensionContext& ctx) {
  if (!ctx.model.moe() && !ctx.expert_group) return nullptr;
  return std::make_unique<ExpertDimension>();
}
