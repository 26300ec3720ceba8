// dimension.cpp: what the dimensions share (dimension.h): parallelize() (parallelize.h), the list of a run's dimensions and of their
// sizes (the run record's fields, the header's words), the
// activations' formula for another split, the MoE model's rows and activations, and the table's lines.
#include "parallel/dimension.h"
#include "parallel/parallelize.h"

#include <cstdarg>
#include <cstdio>


Dimension::~Dimension() = default;

const CommStats* StepMeasure::group(const std::string& name) const {
  for (const auto& [group_name, stats] : groups)
    if (group_name == name) return &stats;
  return nullptr;
}

std::vector<std::unique_ptr<Dimension>> make_dimensions(const DimensionContext& ctx) {
  std::vector<std::unique_ptr<Dimension>> dims;
  for (auto make : {make_data_dimension, make_expert_dimension, make_context_dimension, make_ulysses_dimension,
                    make_tensor_dimension, make_pipeline_dimension})
    if (std::unique_ptr<Dimension> d = make(ctx)) dims.push_back(std::move(d));
  return dims;
}

namespace {
constexpr const DimensionSizes* kSizes[] = {&kContextSizes, &kUlyssesSizes, &kTensorSizes, &kPipelineSizes,
                                            &kExpertSizes};
}  // namespace

void add_dimension_sizes(const Parallelism& split, JsonObject& record) {
  for (const DimensionSizes* d : kSizes) d->record(split, record);
}

std::string dimension_grid_words(const Parallelism& split, const std::function<bool(const std::string&)>& takes) {
  std::string words;
  for (const DimensionSizes* d : kSizes)
    if (takes(d->flag)) words += d->grid_words(split);
  return words;
}

double activations_by_formula(const DimensionContext& ctx, int t, bool sp, Recompute recompute) {
  GPT2Config cfg = ctx.held;
  cfg.recompute = recompute;
  double bytes = 0;
  for (const std::unique_ptr<Dimension>& d : make_dimensions(ctx)) bytes += d->activations_beside_model(ctx, t);
  for (const ModelPart& part : ctx.pp.parts.empty() ? std::vector<ModelPart>{ModelPart{}} : ctx.pp.parts)
    bytes += activation_bytes(cfg, ctx.micro_B, ctx.dtype, ctx.lse_attention, {t, 0, sp}, part);
  return bytes;
}

std::string report_line(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string line(size_t(n > 0 ? n : 0) + 1, '\0');
  std::vsnprintf(&line[0], line.size(), format, again);
  va_end(again);
  line.resize(line.size() - 1);
  return line;
}

std::string report_row(const char* what, double measured, double theory) {
  return report_line("  %-22s %12s %12s", what, format_bytes(measured).c_str(), format_bytes(theory).c_str());
}

void parallelize(const std::vector<GPT2*>& chunks, const std::vector<ChunkTransform>& dimensions) {
  for (const ChunkTransform& apply : dimensions)
    for (size_t c = 0; c < chunks.size() && apply; c++) apply(*chunks[c], int(c));
}
