// dimension_expert.cpp: expert parallelism, and a mixture of experts on any grid, as a dimension
// (dimension.h; docs/theory.md, section 14): its routers' and experts' activations and its exchange
// buffers at the bound in the forecast, then in the table at the step's routing next to balanced
// routing and the bound; the expert-parallel group's scratch buffers. Also its refusal of an --ep
// that does not divide the experts (expert_count_problem, chapters 11 and 12) and the MoE helpers
// the run reads (moe_routed_tokens, moe_activations_at), and its formulas of theory.h (moe_*,
// routing_counts_bytes, expert_theory); and what it installs on a model chunk, its experts through the
// chapter's exchange (apply_expert_parallel, parallelize.h).
#include "parallel/dimension.h"
#include "parallel/parallelize.h"

#include <algorithm>

#include "comm/comm_p2p.h"  // collective_sent_bytes: the counts' gathers, 11's all-reduces
#include "model/moe.h"  // MoELayer::capacity_of

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

  // Under a recipe the exchange stages its rows' codes (wire_format.h, wire_all_to_all_v_async): one
  // call at a time per lane, its rows out (at most a rank's n k assignments) beside its rows in (at
  // most what its experts can take), in the larger of the two formats the rows travel in. Twice
  // that: the staging keeps the block of the largest call so far, and a later step's larger call
  // (another routing) spills beside it until the block grows.
  double wire_staging_at_most(const DimensionContext& ctx, const CollectiveFormats& formats) const override {
    if (!ctx.expert_group || ctx.ep.size == 1 || (formats.activations.fp32 && formats.gradients.fp32)) return 0;
    const double bytes = double(std::max(formats.activations.element_bytes(), formats.gradients.element_bytes()));
    const double rows = double(moe_routed_tokens(ctx)) * ctx.model.top_k + double(rows_at_most(ctx));
    return 2 * ctx.pp.scratch_lanes() * bytes * ctx.model.C * rows;
  }

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
      // (A recipe's staged codes stay at their bound: the staging keeps its largest call's.)
      table.transient_theory = "the expert exchange at these routing counts, docs/theory.md 14" +
                               std::string(wire_staging_at_most(ctx, ctx.formats) > 0 ? ", its staged codes at most" : "") +
                               "; at most " + format_bytes(table.transient);
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

// A mixture of experts' formulas (theory.h; docs/theory.md, sections 14 and 17).

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
double routing_counts_bytes(const CollectivesChoice& collectives, int blocks, int m, int group, int rank, int64_t chunk,
                            int64_t record) {
  const int64_t gathered = int64_t(group) * chunk * record * 4;  // int32 records
  return double(blocks) * m * double(collective_sent_bytes(collectives, CollectiveKind::AllGather, gathered, 4, group, rank));
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
                           int micro_batches, const CollectiveFormats& formats, const ExpertGradientCalls& calls) {
  ExpertTheory t;
  const int W = world, D = world / ep, P = ep, L = cfg.L, E = cfg.experts;
  const double C = cfg.C;
  const int64_t expert_range = expert_range_elements(layout);
  for (const ParamInfo& p : layout.params)
    if (p.expert >= 0) t.expert_elements += p.size;
  const double g = double(formats.gradients.element_bytes()), a = double(formats.activations.element_bytes());
  t.world_all_reduce = W > 1 ? 2.0 * (W - 1) / W * g * double(layout.padded_size - expert_range) : 0;
  t.expert_dp_all_reduce = D > 1 ? 2.0 * (D - 1) / D * g * double(expert_range) : 0;
  // Call by call where the chapter listed them: each call's algorithm's bytes from this rank.
  const auto sent = [&](const std::vector<int64_t>& elements, int ranks, int rank) {
    double bytes = 0;
    for (int64_t n : elements)
      bytes += double(collective_sent_bytes(calls.collectives, CollectiveKind::AllReduce, n * int64_t(g), int(g), ranks, rank));
    return bytes;
  };
  if (!calls.world.empty()) t.world_all_reduce = sent(calls.world, W, calls.world_rank);
  if (!calls.expert_dp.empty()) t.expert_dp_all_reduce = sent(calls.expert_dp, D, calls.expert_dp_rank);
  t.counts_all_gather = routing_counts_bytes(calls.collectives, L, micro_batches, W, calls.world_rank, 1, E);
  const double rows = double(micro_B) * cfg.T * cfg.top_k;  // n k: a rank's assignments, none dropped
  t.a2a_balanced = P > 1 ? L * (double(P - 1) / P * 4 * E + 2.0 * (P - 1) / P * rows * C * (a + g)) : 0;
  t.expert_params = 4.0 * L * (E / ep) * (8 * C * C + 5 * C);
  return t;
}

// Its group's size in the run record (every run's, "ep": 1 without experts); the header's grid line
// leaves it out, since EP re-splits the ranks the other sizes already count.
const DimensionSizes kExpertSizes = {
    "--ep", [](const Parallelism& split, JsonObject& record) { record.add("ep", split.ep.size); },
    [](const Parallelism&) { return std::string(); }};

ChunkTransform apply_expert_parallel(std::vector<ExpertHooks> of_chunk) {
  return [of_chunk](GPT2& chunk, int index) { chunk.expert_hooks = of_chunk.at(size_t(index)); };
}
