// dimension_data.cpp: data parallelism as a dimension (dimension.h): the world's and the
// data-parallel group's scratch buffers, and the group's bytes per step next to theory: the
// strategy's, or, where the gradients travel otherwise, the rule they follow (ZeRO-2's every
// micro-batch; chapter 11's experts averaged apart). Its formulas of theory.h: predict(),
// model_state_bytes() and strategy_transient_bytes().
#include <algorithm>
#include <map>

#include "comm/comm_p2p.h"            // algorithm_for, collective_sent_bytes: --collectives
#include "parallel/data_parallel.h"  // GradientSync: ZeRO-2's rule
#include "parallel/dimension.h"
#include "parallel/weight_gather.h"  // is_product_weight: what a recipe's gathers move in its format

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

// Ψm: the elements of the product weights this rank holds (the blocks' matrices), which a recipe's
// gathers move in its weights' format.
double matrix_elements(const ParamLayout& layout) {
  double matrices = 0;
  for (const ParamInfo& q : layout.params)
    if (q.held() && is_product_weight(q)) matrices += double(q.size);
  return matrices;
}

// This group's bytes per step where the gradients do not follow the strategy's rule.
void own_rule(const DimensionContext& ctx, Prediction& p) {
  if (ctx.pp.reduce_every_micro_batch) {
    // 08, 09, 12 --zero2: every micro-batch reduce-scattered, but the tied wte's bucket (summed over
    // the stages first, once a step) held back to the step's end (data_parallel.h, set_every_micro_batch).
    // A MoE model's experts travel over their own group (12), not this one.
    const int64_t held_back = wte_summed_over_stages(ctx) ? ctx.layout->tied_wte_end : 0;
    const int64_t dense = ctx.layout->padded_size - ctx.layout->expert_range_size;
    const Wire& wire = ctx.formats.gradients;  // a recipe's gradients travel in its format
    // The gather: the blocks' matrices in the recipe's weights format, the rest as they are; per
    // element of the flat buffer on average.
    const Wire& weights = ctx.formats.weights;
    const double w = double(dtype_size(ctx.dtype)), matrices = matrix_elements(*ctx.layout);
    const double gathered = weights.fp32 ? w : (double(weights.element_bytes()) * matrices + w * (double(dense) - matrices)) / double(dense);
    const double g = wire.fp32 ? w : double(wire.element_bytes());
    p.comm_bytes = GradientSync::every_micro_batch_sent_bytes(ctx.dp_size, ctx.micro_batches, dense, held_back, g, gathered);
    p.comm_formula = GradientSync::kEveryMicroBatchFormula;
    if (!ctx.collectives.library) {  // the step's reduce-scatters and its gather, each by its algorithm
      const double m = ctx.micro_batches, E = double(held_back);
      p.comm_bytes = zero_sent_bytes(ctx, g * (m * (double(dense) - E) + E), gathered * double(dense));
      p.comm_formula += std::string(" (reduce-scatters by ") +
                        algorithm_name(algorithm_for(ctx.collectives, CollectiveKind::ReduceScatter, 0)) +
                        ", the gather by " + algorithm_name(algorithm_for(ctx.collectives, CollectiveKind::AllGather, 0)) +
                        ": their bytes from rank " + std::to_string(ctx.dp_rank) + ", section 15)";
    }
    if (!weights.fp32)  // w: the reduce-scatters' bytes (the gradients' format), the gather's but its matrices
      p.comm_formula += " (reduce-scatters in " + wire.name() + "; the gather's Ψm matrices in " + weights.name() +
                        ", the rest fp32)";
  } else if (ctx.ep.routing_counts_over_data_group) {
    // 11: the experts' gradients go over their expert-data-parallel group; this one carries the rest
    // of the model's and every layer's routing counts (docs/theory.md, 14).
    // A recipe's gradients travel in its format (g bytes an element; fp32 4).
    // Under chapter 00's collectives each all-reduce (the chapter's list) and each counts' gather
    // sends what its algorithm sends from this rank (section 15).
    ExpertGradientCalls calls;
    calls.collectives = ctx.collectives;
    calls.world = ctx.gradient_all_reduces;
    calls.world_rank = ctx.dp_rank;
    const ExpertTheory theory = expert_theory(*ctx.layout, ctx.model, ctx.world_size, ctx.ep.size, ctx.micro_B,
                                              ctx.micro_batches, ctx.formats, calls);
    p.comm_bytes = theory.world_all_reduce + theory.counts_all_gather;
    p.comm_formula = "2(W-1)/W x " + std::to_string(ctx.formats.gradients.element_bytes()) +
                     " x non-expert elements (padding included) + K x L x (W-1) x 4E counts";
    if (!ctx.collectives.library)
      p.comm_formula += std::string(" (each all-reduce and gather by its algorithm: ") +
                        algorithm_name(algorithm_for(ctx.collectives, CollectiveKind::AllGather, 0)) +
                        " for the gathers; their bytes from rank " + std::to_string(ctx.dp_rank) + ", section 15)";
  }
}

// The gradients' all-reduces of a step over the data-parallel group, in elements: one a tensor (02),
// one a bucket (03, 07-12: TrainingRun::set_gradient_all_reduces), else the whole buffer (01),
// padding included.
std::vector<int64_t> gradient_all_reduces(const DimensionContext& ctx) {
  if (!ctx.gradient_all_reduces.empty()) return ctx.gradient_all_reduces;
  return {ctx.layout->padded_size};
}

// Under chapter 00's collectives (--collectives ours, or one algorithm) each collective sends what
// its algorithm sends from this rank (docs/theory.md, section 15: p2p_collectives.h's closed forms,
// never a run), the algorithm picked by comm_p2p.h's rule for its kind and size: `ours` runs the
// all-reduces up to 64 KB by recursive doubling (lg N times the vector), so 02's all-reduces of one
// tensor each, and 03's small buckets, send more than the ring's formula says. The strategies'
// reduce-scatters and all-gathers keep their terms, each sent by its own algorithm. True where the
// bytes are the calls' own, element for element (01's whole padded buffer, 02's tensors, 03's
// buckets), rather than a formula over Ψ that the padding stretches.
bool chosen_algorithms(const DimensionContext& ctx, Prediction& p) {
  const CollectivesChoice& choice = ctx.collectives;
  const int N = ctx.dp_size, r = ctx.dp_rank;
  if (choice.library || N == 1) return false;
  const double w = double(dtype_size(ctx.dtype));
  const int64_t g = ctx.formats.gradients.fp32 ? int64_t(w) : int64_t(ctx.formats.gradients.element_bytes());
  const int64_t dense = ctx.layout->num_params - ctx.layout->expert_params;
  const auto name = [&](CollectiveKind kind, int64_t bytes) { return algorithm_name(algorithm_for(choice, kind, bytes)); };
  if (ctx.strategy == Strategy::DP) {
    std::map<std::string, int> by_algorithm;
    for (int64_t n : gradient_all_reduces(ctx))
      if (n > 0) by_algorithm[name(CollectiveKind::AllReduce, n * g)]++;
    p.comm_bytes = all_reduces_sent_bytes(ctx);
    std::string calls;
    for (const auto& [algorithm, count] : by_algorithm)
      calls += (calls.empty() ? "" : ", ") + std::to_string(count) + " by " + algorithm;
    p.comm_formula = "each all-reduce of n bytes, its algorithm's bytes from rank " + std::to_string(r) +
                     " (section 15): " + calls + " (--collectives " + (choice.by_size ? "ours" : algorithm_name(choice.forced)) + ")";
    return true;
  }
  // ZeRO: the gradients' reduce-scatters (g bytes an element) and the parameters' gathers, their
  // bytes a step as the strategy's formula counts them before its (N-1)/N; each kind's algorithm's
  // share of them from this rank (linear in the payload, so the step's calls add up as one).
  const double K = ctx.micro_batches, psi = double(dense);
  const Wire& weights = ctx.formats.weights;
  const double m = weights.fp32 ? w : double(weights.element_bytes()), matrices = matrix_elements(*ctx.layout);
  const double gathered = m * matrices + w * (psi - matrices);  // one gather of every parameter
  double scattered = 0, gathers = 0;
  switch (ctx.strategy) {
    case Strategy::ZeRO1: scattered = double(g) * psi, gathers = gathered; break;
    case Strategy::ZeRO2: scattered = K * double(g) * psi, gathers = gathered; break;
    case Strategy::ZeRO3: scattered = K * double(g) * psi, gathers = 2 * K * gathered; break;
    default: return false;
  }
  p.comm_bytes = zero_sent_bytes(ctx, scattered, gathers);
  p.comm_formula += std::string(" (reduce-scatters by ") + name(CollectiveKind::ReduceScatter, int64_t(scattered)) +
                    ", all-gathers by " + name(CollectiveKind::AllGather, int64_t(gathers)) + ": their bytes from rank " +
                    std::to_string(r) + ", section 15)";
  return false;
}

class DataDimension : public Dimension {
 public:
  const char* name() const override { return "data"; }

  // The world (the loss, the agreement to stop), and the data-parallel group where it is another.
  int collective_groups(const DimensionContext& ctx) const override {
    return 1 + ctx.dp_apart;
  }

  double wire_staging_at_most(const DimensionContext& ctx, const CollectiveFormats& formats) const override {
    return strategy_staging_bytes(ctx.strategy, *ctx.layout, formats);
  }

  void report_rows(const DimensionContext& ctx, const StepMeasure& step, ReportTable& table) const override {
    Prediction& p = table.strategy;
    own_rule(ctx, p);
    // ZeRO-2's rule counts the padded buffer, as the calls carry it, whichever algorithm runs.
    // So does 11's, whose calls the chapter lists (the padding of its ranges included).
    const bool per_call = ctx.pp.reduce_every_micro_batch || ctx.ep.routing_counts_over_data_group ||
                          chosen_algorithms(ctx, p);
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
    if (per_call) table.json.add("theory_comm_per_call", int64_t(1));  // (no padding to stretch it by)
  }
};

}  // namespace

double every_micro_batch_bytes(const DimensionContext& ctx) {
  Prediction p;
  own_rule(ctx, p);
  return p.comm_bytes;
}

double zero_sent_bytes(const DimensionContext& ctx, double scattered, double gathered) {
  const auto sent = [&](CollectiveKind kind, double bytes) {
    return double(collective_sent_bytes(ctx.collectives, kind, int64_t(bytes), 1, ctx.dp_size, ctx.dp_rank));
  };
  return sent(CollectiveKind::ReduceScatter, scattered) + sent(CollectiveKind::AllGather, gathered);
}

double all_reduces_sent_bytes(const DimensionContext& ctx) {
  const Wire& wire = ctx.formats.gradients;  // a recipe's gradients travel in its format
  const int g = wire.fp32 ? int(dtype_size(ctx.dtype)) : int(wire.element_bytes());
  double bytes = 0;
  for (int64_t n : gradient_all_reduces(ctx))
    bytes += double(collective_sent_bytes(ctx.collectives, CollectiveKind::AllReduce, n * g, g, ctx.dp_size, ctx.dp_rank));
  return bytes;
}

std::unique_ptr<Dimension> make_data_dimension(const DimensionContext&) { return std::make_unique<DataDimension>(); }

// The strategies' formulas (theory.h; docs/theory.md, sections 1-6): each the data dimension's rule.

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
  // bytes an element; every ZeRO gathers the product weights (Ψm: the blocks' matrices, 12LC^2 for
  // GPT-2) in m bytes and the rest in w (ZeRO-1 and 2 the updated parameters, ZeRO-3 each layer).
  const double g = double(wire.gradients.element_bytes()), m = double(wire.weights.element_bytes());
  const double matrices = matrix_elements(layout);
  const std::string G = std::to_string(int(g)), M = std::to_string(int(m));
  const std::string formats = " (gradients " + wire.gradients.name() + ", weights " + wire.weights.name() + ")";
  switch (strategy) {
    case Strategy::DP:
      p.comm_formula = "all-reduce: 2(N-1)/N x " + G + travels + formats;
      p.comm_bytes = 2 * ring * g * dense;
      break;
    case Strategy::ZeRO1:
      p.comm_formula = "reduce-scatter + all-gather: (N-1)/N x (" + G + travels + " + " + M + "Ψm + " + W + "(" +
                       travels + "-Ψm)), Ψm = the blocks' matrices" + formats;
      p.comm_bytes = ring * (g * dense + m * matrices + w * (dense - matrices));
      break;
    case Strategy::ZeRO2:
      p.comm_formula = "K reduce-scatters + all-gather: (N-1)/N x (K " + G + travels + " + " + M + "Ψm + " + W + "(" +
                       travels + "-Ψm)), Ψm = the blocks' matrices" + formats;
      p.comm_bytes = ring * (K_acc * g * dense + m * matrices + w * (dense - matrices));
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

double strategy_transient_bytes(Strategy strategy, const ParamLayout& layout, DType dtype,
                                bool reduce_every_micro_batch) {
  const double w = double(dtype_size(dtype)), N = layout.ranks;
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
    case Strategy::DP: return 0;
    case Strategy::ZeRO1:  // the gradient shard; under ZeRO-2's rule also each micro-batch's pieces
      return w * double(layout.shard_size()) * (reduce_every_micro_batch ? 2 : 1);
    case Strategy::ZeRO2: return w * layer_grads;
    case Strategy::ZeRO3: return w * (layer_grads + E + 2 * U + head);  // + gathered layers
  }
  return 0;
}

double strategy_staging_bytes(Strategy strategy, const ParamLayout& layout, const CollectiveFormats& formats) {
  if ((formats.gradients.fp32 && formats.weights.fp32) || layout.ranks == 1) return 0;
  const double N = layout.ranks, psi = double(layout.padded_size);
  const double g = formats.gradients.fp32 ? 4 : double(formats.gradients.element_bytes());
  const double m = formats.weights.fp32 ? 4 : double(formats.weights.element_bytes());
  // The bytes of flat range [begin, end) in the gather's formats: its matrices m bytes, the rest 4.
  auto in_formats = [&](int64_t begin, int64_t end) {
    double matrices = 0;
    for (const ParamInfo& q : layout.params)
      if (q.held() && is_product_weight(q) && q.offset >= begin && q.offset + q.size <= end) matrices += double(q.size);
    return m * matrices + 4 * (double(end - begin) - matrices);
  };
  // Each region is rounded up to an even byte (an fp8 chunk of odd length): 2 regions a range.
  const double rounding = 2.0 * 2 * (layout.num_units() + 1);
  switch (strategy) {
    case Strategy::DP: return g * psi;  // every bucket's all-reduce in flight at once
    case Strategy::ZeRO1:
    case Strategy::ZeRO2:  // the reduce-scatters of a step (04) or of a micro-batch (05), then the gather
      return std::max(g * psi * (1 + 1 / N), in_formats(0, layout.padded_size) + 4 * psi / N) + rounding;
    case Strategy::ZeRO3: {  // the layers in flight: E, two blocks, the head (strategy_transient_bytes)
      const int head = layout.num_units() - 1;
      double U = 0, block = 0;
      for (int u = 1; u < head; u++) {
        U = std::max(U, double(layout.unit_size(u)));
        block = std::max(block, in_formats(layout.unit_begin[size_t(u)], layout.unit_begin[size_t(u) + 1]));
      }
      const double E = double(layout.unit_size(0));
      const double gathered = in_formats(layout.unit_begin[0], layout.unit_begin[1]) + 2 * block +
                              in_formats(layout.unit_begin[size_t(head)], layout.unit_begin[size_t(head) + 1]);
      return (1 + 1 / N) * (gathered + g * (E + 2 * U)) + rounding;
    }
  }
  return 0;
}
