// dimension_data.cpp: data parallelism as a dimension (dimension.h): the world's and the
// data-parallel group's scratch buffers, and the strategy's bytes per step next to theory.
#include "dimension.h"

namespace {

class DataDimension : public Dimension {
 public:
  const char* name() const override { return "data"; }

  // The world (the loss, the agreement to stop), and the data-parallel group where it is another.
  int collective_groups(const DimensionContext& ctx) const override {
    return 1 + ctx.dp_apart;
  }

  void report_rows(const DimensionContext& ctx, const StepMeasure& step, ReportTable& table) const override {
    const Prediction& p = table.strategy;
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
