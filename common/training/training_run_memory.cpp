// training_run_memory.cpp: TrainingRun's memory forecast (docs/theory.md): the model's own, then each
// dimension's terms (dimension.h), checked against what a rank may use before the chapter allocates
// anything; and what the dimensions read of the run (dimension_context). See training_run.h.
#include "training/training_run.h"

#include <algorithm>
#include <cstdio>

#include "comm/p2p_collectives.h"  // p2p_scratch_bytes_at_most: --collectives

// The forecast of docs/theory.md against what this rank may use. Every rank forecasts its own
// (they are alike) and checks its own memory; the first that cannot fit says why, and all stop.
void TrainingRun::check_memory() {
  const DimensionContext ctx = dimension_context();
  // The model's own: the strategy's model state over this rank's layout, the arena of the positions
  // it holds; then each dimension's terms (dimension.h).
  forecast_ = forecast_memory(split_.strategy, layout_, global_layout_.padded_size, ctx.held, micro_B_, cfg_.grad_accum, dtype_, device_, ctx.lse_attention,
                              !cfg_.save.empty() || !cfg_.resume.empty() || !cfg_.init_from.empty(),
                              double(data_.length()), split_.tp, split_.pp);
  for (const std::unique_ptr<Dimension>& d : dimensions_) d->add_memory(ctx, forecast_);
  // A recipe's collectives stage their codes in a buffer per communicator (wire_format.h), counted
  // with the communication buffers: each dimension's bound of its groups' joins the transient
  // buffers here, so that a recipe that will not fit is refused before the work. The formats are
  // installed before this check (by the constructor for 01-12, by chapter 13 before its run).
  staging_at_most_ = 0;
  for (const std::unique_ptr<Dimension>& d : dimensions_) staging_at_most_ += d->wire_staging_at_most(ctx, ctx.formats);
  forecast_.transient += staging_at_most_;
  forecast_.precision_scratch = precision_scratch_;
  // Chapter 00's collectives (--collectives) work in scratch buffers of their own: at most twice the
  // largest payload, the whole gradient or a micro-batch's activations, for each group that carries
  // collectives. Each group's worker runs one at a time, but the groups' workers run side by side
  // (a DP reduction beside the embedding group's, or beside a TP sum). A pipeline's own group only
  // sends and receives.
  if (cfg_.collectives != "library") {
    const double w = double(dtype_size(dtype_));
    const double activations = double(micro_B_) * model_.T * model_.C * w;
    int groups = 0;
    for (const std::unique_ptr<Dimension>& d : dimensions_) groups += d->collective_groups(ctx);
    forecast_.transient += groups * p2p_scratch_bytes_at_most(std::max(w * double(layout_.padded_size), activations));
  }
  // The staged copy of an asynchronous save (docs/theory.md, the sharded checkpoint): at most this
  // rank's 1/N of the dense elements (N: the data-parallel ranks, who split them) and every expert it
  // holds, in three fp32 arrays.
  if (cfg_.async_save)
    forecast_.staged_save = 12.0 * (double(layout_.padded_size - layout_.expert_range_size) / layout_.ranks +
                                    double(layout_.expert_range_size));
  std::string how;
  const double available = memory_per_rank(device_, ranks_on_this_node(), &how);
  const double peak = forecast_.peak();
  if (is_root()) {
    std::printf("memory forecast per rank: %s peak = model state %s + activations %s + transient %s (%s)%s%s%s | "
                "available %s (%s)\n",
                format_bytes(peak).c_str(), format_bytes(forecast_.model_state).c_str(),
                format_bytes(forecast_.activations).c_str(),
                format_bytes(std::max(forecast_.transient, forecast_.checkpoint)).c_str(),
                forecast_.checkpoint > forecast_.transient ? "checkpoint copies" : "communication buffers",
                forecast_.data > 0 ? (" + data " + format_bytes(forecast_.data)).c_str() : "",
                forecast_.staged_save > 0 ? (" + staged save " + format_bytes(forecast_.staged_save)).c_str() : "",
                forecast_.precision_scratch > 0
                    ? (" + precision scratch " + format_bytes(forecast_.precision_scratch)).c_str() : "",
                format_bytes(available).c_str(), how.c_str());
    std::fflush(stdout);
  }
  const bool fits = peak <= available;
  world_.agree_or_die(fits, "this run would need about " + format_bytes(peak) + " per rank (model state " +
                               format_bytes(forecast_.model_state) + ", activations " +
                               format_bytes(forecast_.activations) + " for micro-batches of " +
                               std::to_string(micro_B_) + " sequences of " + std::to_string(model_.T) +
                               " tokens), but a rank has " + format_bytes(available) + " (" + how +
                               "). Use a smaller --batch, more " + cfg_.accumulation_flag() +
                               ", more ranks, or a smaller --preset");
}

double TrainingRun::moe_activations() const { return moe_activations_at(dimension_context(), expert_rows_); }

DimensionContext TrainingRun::dimension_context() const {
  DimensionContext ctx;
  static_cast<Parallelism&>(ctx) = split_;
  ctx.model = model_;
  ctx.held = model_;
  ctx.held.T = split_.cp.held_positions(model_.T);
  ctx.layout = &layout_;
  ctx.global_layout = &global_layout_;
  ctx.dtype = dtype_;
  ctx.device = device_;
  ctx.micro_B = micro_B_;
  ctx.micro_batches = cfg_.grad_accum;
  ctx.micro_batches_flag = cfg_.accumulation_flag();
  ctx.lse_attention = split_.cp.lse_attention(flash_);
  ctx.world_size = world_.size();
  ctx.dp_size = dp_.size();
  ctx.dp_apart = &dp_ != &world_;
  ctx.embedding_group = group("embedding") != nullptr;
  ctx.expert_group = group("ep") != nullptr;
  ctx.formats = collective_formats(world_);
  parse_collectives(cfg_.collectives, &ctx.collectives);  // (flags.cpp refused any other)
  ctx.dp_rank = dp_.rank();
  return ctx;
}
