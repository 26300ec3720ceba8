// dimension_tensor.cpp: tensor parallelism as a dimension (dimension.h; docs/theory.md, section 9):
// its refusal of sizes that do not divide, its group's scratch buffers, and in the table how it splits Ψ, its activations by the formula
// without it, with it and with sequence parallelism, its bytes per step and its collectives of each
// kind next to theory.
#include "parallel/dimension.h"

#include "base/check.h"  // ENSURE

namespace {

class TensorDimension : public Dimension {
 public:
  const char* name() const override { return "tensor"; }

  // It splits the heads, the MLP's 4C channels and the vocabulary over --tp ranks, and under sequence
  // parallelism the B*T positions of a micro-batch too: each must divide (param_layout.h).
  std::string problem(const DimensionContext& ctx) const override {
    return tensor_parallel_size_problem(ctx.model, ctx.tp, ctx.micro_B, ctx.micro_batches_flag);
  }

  int collective_groups(const DimensionContext&) const override { return 1; }

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

    // Under CP every TP collective carries T/cp positions; the gradients held whole are the
    // parameters' (wpe has all T rows whatever a rank holds).
    const Wire& wire = collective_formats().activations;  // a recipe's activations travel in its format
    const int activation_bytes = wire.fp32 ? 0 : int(wire.element_bytes());
    TensorParallelPrediction tp =
        predict_tensor_parallel(ctx.held, ctx.micro_B, t, ctx.dtype, ctx.pp.parts, activation_bytes);
    const TensorParallelPrediction held_whole = predict_tensor_parallel(ctx.model, ctx.micro_B, t, ctx.dtype, ctx.pp.parts);
    tp.partial_grad_bytes = held_whole.partial_grad_bytes;
    tp.partial_grad_all_reduces = held_whole.partial_grad_all_reduces;
    if (ctx.pp.reduce_every_micro_batch) {  // (09's --zero2: the gradients held whole summed before each reduce-scatter)
      tp.partial_grad_all_reduces *= ctx.micro_batches;
      tp.partial_grad_bytes *= ctx.micro_batches;
    }
    const int m = ctx.micro_batches;
    const double theory = m * tp.bytes_per_micro_batch + tp.partial_grad_bytes;
    const CommStats* measured = step.group("tp");
    ENSURE(measured, "the tensor-parallel dimension without its group's counters");
    const int64_t bytes = measured->training_sent_bytes();
    table.comm_rows.push_back(report_row("TP bytes per step", double(bytes), theory));
    table.comm_rows.push_back(report_line("  (TP theory, per micro-batch: %s)", tp.formula.c_str()));
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

std::unique_ptr<Dimension> make_tensor_dimension(const DimensionContext& ctx) {
  if (ctx.tp.size == 1) return nullptr;
  return std::make_unique<TensorDimension>();
}
