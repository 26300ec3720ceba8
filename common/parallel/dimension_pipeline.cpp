// dimension_pipeline.cpp: pipeline parallelism as a dimension (dimension.h): the embedding group's
// scratch buffers (the pipeline's own group only sends and receives), and the recompute line in the
// table, since a stage keeps the schedule's micro-batches in flight. Its stages' bubble, activations
// and bytes are 08's report (pipeline_report.h).
#include "parallel/dimension.h"

namespace {

class PipelineDimension : public Dimension {
 public:
  const char* name() const override { return "pipeline"; }

  int collective_groups(const DimensionContext& ctx) const override { return ctx.embedding_group ? 1 : 0; }

  void report_rows(const DimensionContext&, const StepMeasure&, ReportTable& table) const override {
    table.recompute_note = true;
  }
};

}  // namespace

std::unique_ptr<Dimension> make_pipeline_dimension(const DimensionContext& ctx) {
  if (ctx.pp.size == 1) return nullptr;
  return std::make_unique<PipelineDimension>();
}
