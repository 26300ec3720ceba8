// dimension_tensor.cpp: tensor parallelism as a dimension (dimension.h; docs/theory.md, section 9):
// its refusal of sizes that do not divide, its group's scratch buffers, and in the table how it splits Ψ, its activations by the formula
// without it, with it and with sequence parallelism, its bytes per step and its collectives of each
// kind next to theory; its formula of theory.h (predict_tensor_parallel); and what it installs on a
// model chunk, its collectives around the split products (apply_tensor_parallel, parallelize.h).
#include <algorithm>

#include "parallel/dimension.h"
#include "parallel/parallelize.h"
#include "parallel/tensor_parallel_hooks.h"  // 07's collectives over a group

#include "base/check.h"  // ENSURE

namespace {

// The TP group's collectives of a step, as predict_tensor_parallel counts them: under CP every TP
// collective carries T/cp positions, while the gradients held whole are the parameters' (wpe has all
// T rows whatever a rank holds). A recipe's activations travel in its format, the sums of the
// gradients held whole in its gradient format (as DP's buckets); 09's --zero2 sums those before each
// micro-batch's reduce-scatter.
TensorParallelPrediction step_prediction(const DimensionContext& ctx) {
  const Wire &wire = ctx.formats.activations, &gradients = ctx.formats.gradients;
  const int activation_bytes = wire.fp32 ? 0 : int(wire.element_bytes());
  const int gradient_bytes = gradients.fp32 ? 0 : int(gradients.element_bytes());
  TensorParallelPrediction tp =
      predict_tensor_parallel(ctx.held, ctx.micro_B, ctx.tp, ctx.dtype, ctx.pp.parts, activation_bytes);
  const TensorParallelPrediction held_whole =
      predict_tensor_parallel(ctx.model, ctx.micro_B, ctx.tp, ctx.dtype, ctx.pp.parts, 0, gradient_bytes);
  tp.partial_grad_bytes = held_whole.partial_grad_bytes;
  tp.partial_grad_all_reduces = held_whole.partial_grad_all_reduces;
  if (ctx.pp.reduce_every_micro_batch) {
    tp.partial_grad_all_reduces *= ctx.micro_batches;
    tp.partial_grad_bytes *= ctx.micro_batches;
  }
  return tp;
}

class TensorDimension : public Dimension {
 public:
  const char* name() const override { return "tensor"; }

  // It splits the heads, the MLP's 4C channels and the vocabulary over --tp ranks, and under sequence
  // parallelism the B*T positions of a micro-batch too: each must divide (param_layout.h).
  std::string problem(const DimensionContext& ctx) const override {
    return tensor_parallel_size_problem(ctx.model, ctx.tp, ctx.micro_B, ctx.micro_batches_flag);
  }

  int collective_groups(const DimensionContext&) const override { return 1; }

  // A recipe's activations and their gradients stage their codes (wire_format.h): an all-reduce
  // those of its (B, T, C) tensor, an all-gather or reduce-scatter also its 1/t piece; a forward's and
  // a backward's call may be in flight at once (--tp-overlap), in each lane (docs/theory.md, section 3).
  // Under sequence parallelism the sums of a layer's gradients held whole travel beside them, until
  // the layer's backward ends: a block's 6C (a MoE block's 5C + EC), the head's 2C, or wpe's TC.
  double wire_staging_at_most(const DimensionContext& ctx, const CollectiveFormats& formats) const override {
    const Wire& wire = formats.activations;
    if (wire.fp32 || ctx.tp.size == 1) return 0;
    const double t = ctx.tp.size, stream = double(ctx.micro_B) * ctx.held.T * ctx.model.C;
    const double call = double(wire.element_bytes()) * stream * (ctx.tp.sequence_parallel ? 1 + 1 / t : 1);
    const GPT2Config& m = ctx.model;
    const double block = m.moe() ? 5.0 * m.C + double(m.experts) * m.C : 6.0 * m.C;
    const double sums = ctx.tp.sequence_parallel && !formats.gradients.fp32
                            ? double(formats.gradients.element_bytes()) * std::max(block, double(m.T) * m.C)
                            : 0;
    return (2 * call + sums) * ctx.pp.scratch_lanes();
  }

  void report_rows(const DimensionContext& ctx, const StepMeasure& step, ReportTable& table) const override {
    const TensorParallelism& t = ctx.tp;
    // Ψ = its slices of the split tensors + the tensors held whole.
    int64_t sliced = 0, whole = 0;
    for (size_t i = 0; i < ctx.layout->params.size(); i++)
      (ctx.layout->params[i].shard.whole() ? whole : sliced) += ctx.global_layout->params[i].size;
    table.params_split = " on this tensor-parallel rank = " + std::to_string(sliced) + " split / " +
                         std::to_string(t.size) + " + " + std::to_string(whole) + " held whole" + table.params_split;
    // What tensor parallelism alone keeps (every position's stream between the products), and what
    // sequence parallelism then splits.
    const Recompute now = ctx.model.recompute;
    table.activation_notes.push_back(report_line(
        "    (by the formula: no TP %s | TP %d %s | TP %d + SP %s; docs/theory.md, section 9, derives it and "
        "sets it beside Korthikanti et al.'s)",
        format_bytes(activations_by_formula(ctx, 1, false, now)).c_str(), t.size,
        format_bytes(activations_by_formula(ctx, t.size, false, now)).c_str(), t.size,
        format_bytes(activations_by_formula(ctx, t.size, true, now)).c_str()));
    table.recompute_note = true;

    const Wire &wire = ctx.formats.activations, &gradients = ctx.formats.gradients;
    const TensorParallelPrediction tp = step_prediction(ctx);
    const int m = ctx.micro_batches;
    const double theory = tensor_parallel_step_bytes(ctx);
    const CommStats* measured = step.group("tp");
    ENSURE(measured, "the tensor-parallel dimension without its group's counters");
    const int64_t bytes = measured->training_sent_bytes();
    table.comm_rows.push_back(report_row("TP bytes per step", double(bytes), theory));
    const std::string by_algorithm =
        ctx.collectives.library ? ""
                                : "; each call by the algorithm its kind and size pick (--collectives " +
                                      std::string(ctx.collectives.by_size ? "ours" : algorithm_name(ctx.collectives.forced)) +
                                      "), its bytes from TP rank " + std::to_string(t.rank) + ", section 15";
    table.comm_rows.push_back(report_line("  (TP theory, per micro-batch: %s%s%s)", tp.formula.c_str(),
                                          wire.fp32 ? ""
                                                    : ("; BTC in " + wire.name() + ", the tensors held whole in " +
                                                       gradients.name())
                                                          .c_str(),
                                          by_algorithm.c_str()));
    for (CollectiveKind k : {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::ReduceScatter}) {
      const int per_micro_batch = k == CollectiveKind::AllReduce ? tp.all_reduces + tp.loss_all_reduces
                                  : k == CollectiveKind::AllGather ? tp.all_gathers : tp.reduce_scatters;
      const int per_step = k == CollectiveKind::AllReduce ? tp.partial_grad_all_reduces : 0;
      const int64_t calls = measured->kind[int(k)].calls;
      if (calls || per_micro_batch || per_step)
        table.comm_rows.push_back(report_line(
            "  TP %-19s %12lld %12d   (%d a micro-batch x %d%s)", (std::string(collective_name(k)) + "s").c_str(),
            (long long)calls, per_micro_batch * m + per_step, per_micro_batch, m,
            per_step ? (" + " + std::to_string(per_step) + " for the gradients held whole").c_str() : ""));
    }
    table.json.add("measured_tp_comm_bytes", bytes)
        .add("theory_tp_comm_bytes", theory)
        .add("theory_tp_all_reduces", (tp.all_reduces + tp.loss_all_reduces) * m + tp.partial_grad_all_reduces)
        .add("theory_tp_all_gathers", tp.all_gathers * m)
        .add("theory_tp_reduce_scatters", tp.reduce_scatters * m)
        .add("measured_tp_all_reduces", measured->kind[int(CollectiveKind::AllReduce)].calls)
        .add("measured_tp_all_gathers", measured->kind[int(CollectiveKind::AllGather)].calls)
        .add("measured_tp_reduce_scatters", measured->kind[int(CollectiveKind::ReduceScatter)].calls);
  }
};

}  // namespace

double tensor_parallel_step_bytes(const DimensionContext& ctx) {
  const TensorParallelism& t = ctx.tp;
  if (t.size == 1) return 0;
  const TensorParallelPrediction tp = step_prediction(ctx);
  const int m = ctx.micro_batches;
  if (ctx.collectives.library) return m * tp.bytes_per_micro_batch + tp.partial_grad_bytes;
  // Chapter 00's collectives: each call's algorithm by its kind and size (docs/theory.md, section
  // 15), so that at 4 ranks under `ours` the small all-reduces (the loss's rows, the tensors held
  // whole, a tiny model's activations) go by doubling, lg t of their vector each.
  const auto sent = [&](CollectiveKind kind, int64_t elements, int element_bytes) {
    return double(collective_sent_bytes(ctx.collectives, kind, elements * element_bytes, element_bytes, t.size, t.rank));
  };
  const Wire &wire = ctx.formats.activations, &gradients = ctx.formats.gradients;
  const int a = wire.fp32 ? int(dtype_size(ctx.dtype)) : int(wire.element_bytes());
  const int g = gradients.fp32 ? int(dtype_size(ctx.dtype)) : int(gradients.element_bytes());
  const int64_t stream = int64_t(ctx.micro_B) * ctx.held.T * ctx.model.C, rows = int64_t(ctx.micro_B) * ctx.held.T;
  const double per_micro_batch = tp.all_reduces * sent(CollectiveKind::AllReduce, stream, a) +
                                 tp.all_gathers * sent(CollectiveKind::AllGather, stream, a) +
                                 tp.reduce_scatters * sent(CollectiveKind::ReduceScatter, stream, a) +
                                 tp.loss_all_reduces * sent(CollectiveKind::AllReduce, rows, 4);
  // Under sequence parallelism each tensor held whole is summed by an all-reduce of its own
  // (gradient_router.cpp), once a step, or once a micro-batch under --zero2.
  double held_whole = 0;
  if (t.sequence_parallel)
    for (const ParamInfo& q : ctx.layout->params)
      if (q.held() && (q.copies & kAxisTP)) held_whole += sent(CollectiveKind::AllReduce, q.size, g);
  return m * per_micro_batch + held_whole * (ctx.pp.reduce_every_micro_batch ? m : 1);
}

std::unique_ptr<Dimension> make_tensor_dimension(const DimensionContext& ctx) {
  if (ctx.tp.size == 1) return nullptr;
  return std::make_unique<TensorDimension>();
}

// Tensor parallelism's traffic (theory.h; docs/theory.md, section 9).

TensorParallelPrediction predict_tensor_parallel(const GPT2Config& cfg, int micro_B, TensorParallelism tp,
                                                 DType dtype, const std::vector<ModelPart>& parts, int activation_bytes,
                                                 int gradient_bytes) {
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
  p.partial_grad_bytes = 2 * (t - 1) / t * whole_params * (gradient_bytes > 0 ? gradient_bytes : w);
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

// Its size and whether it splits the positions too, in the run record and the header.
const DimensionSizes kTensorSizes = {
    "--tp",
    [](const Parallelism& split, JsonObject& record) {
      record.add("tp", split.tp.size).add("sequence_parallel", split.tp.sequence_parallel);
    },
    [](const Parallelism& split) {
      return " x " + std::to_string(split.tp.size) + " tensor-parallel" +
             (split.tp.sequence_parallel ? " (sequence parallel)" : "");
    }};

ChunkTransform apply_tensor_parallel(ProductHooks collectives) {
  return [collectives](GPT2& chunk, int) { chunk.product_hooks = collectives; };
}

ChunkTransform apply_tensor_parallel(Communicator& group, bool sequence_parallel, bool overlap) {
  return apply_tensor_parallel(tensor_parallel_hooks(group, sequence_parallel, overlap));
}
