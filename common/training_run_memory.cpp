// training_run_memory.cpp: TrainingRun's memory forecast (docs/theory.md), checked against what a rank
// may use before the chapter allocates anything, and a MoE model's share of it at the bound or at a
// step's routing. See training_run.h.
#include "training_run.h"

#include <algorithm>
#include <cstdio>

#include "p2p_collectives.h"  // p2p_scratch_bytes_at_most: --collectives
#include "ring_attention.h"   // ring_buffer_bytes

// The forecast of docs/theory.md against what this rank may use. Every rank forecasts its own
// (they are alike) and checks its own memory; the first that cannot fit says why, and all stop.
void TrainingRun::check_memory() {
  // Under context parallelism the model holds T/cp positions and keeps a log-sum-exp per query instead
  // of the attention matrices; the ring adds its blocks in flight (context_parallel_activation_bytes).
  GPT2Config held = model_;
  if (cp_.on()) held.T = int(cp_.positions.size());
  forecast_ = forecast_memory(strategy_, layout_, held, micro_B_, cfg_.grad_accum, dtype_, device_, flash_ || cp_.on(),
                              !cfg_.save.empty() || !cfg_.resume.empty() || !cfg_.init_from.empty(),
                              double(data_.length()), tp_, pp_);
  // The ring's blocks in flight, of this rank's heads (NH/t under tensor parallelism: 12).
  if (cp_.on())
    forecast_.activations += ring_buffer_bytes(cp_.size, micro_B_, held.T, model_.C / tp_.size, model_.NH / tp_.size);
  // A MoE model's layers: the routing is not known before the step, so the forecast takes the bound.
  const int64_t most_rows = moe_expert_rows_at_most_of(model_, routed_tokens(), ep_.size, world_.size() / pp_.size);
  moe_forecast_ = moe_schedule_activation_bytes(model_, routed_tokens(), pp_.parts, pp_.actions,
                                                every_micro_batch_and_layer(most_rows));
  forecast_.activations += moe_forecast_;
  // Chapter 11's exchange buffers (moe_exchange_buffer_bytes) at the same bound.
  if (ep_comm_)
    moe_exchange_forecast_ = moe_exchange_buffer_bytes(model_, std::vector<int64_t>(size_t(model_.L), most_rows));
  forecast_.transient += moe_exchange_forecast_;
  // Chapter 00's collectives (--collectives) work in scratch buffers of their own: at most twice the
  // largest payload, the whole gradient or a micro-batch's activations, for each group that carries
  // collectives. Each group's worker runs one at a time, but the groups' workers run side by side
  // (a DP reduction beside the embedding group's, or beside a TP sum). A pipeline's own group only
  // sends and receives.
  if (cfg_.collectives != "library") {
    const double w = double(dtype_size(dtype_));
    const double activations = double(micro_B_) * model_.T * model_.C * w;
    const int groups = 1 + (&dp_ != &world_) + (tp_comm_ && tp_.size > 1) + (embedding_comm_ != nullptr) +
                       (cp_comm_ != nullptr) + (ep_comm_ != nullptr);
    forecast_.transient += groups * p2p_scratch_bytes_at_most(std::max(w * double(layout_.padded_size), activations));
  }
  std::string how;
  const double available = memory_per_rank(device_, ranks_on_this_node(), &how);
  const double peak = forecast_.peak();
  if (is_root()) {
    std::printf("memory forecast per rank: %s peak = model state %s + activations %s + transient %s (%s)%s | "
                "available %s (%s)\n",
                format_bytes(peak).c_str(), format_bytes(forecast_.model_state).c_str(),
                format_bytes(forecast_.activations).c_str(),
                format_bytes(std::max(forecast_.transient, forecast_.checkpoint)).c_str(),
                forecast_.checkpoint > forecast_.transient ? "checkpoint copies" : "communication buffers",
                forecast_.data > 0 ? (" + data " + format_bytes(forecast_.data)).c_str() : "",
                format_bytes(available).c_str(), how.c_str());
    std::fflush(stdout);
  }
  const bool fits = peak <= available;
  world_.agree_or_die(fits, "this run would need about " + format_bytes(peak) + " per rank (model state " +
                               format_bytes(forecast_.model_state) + ", activations " +
                               format_bytes(forecast_.activations) + " for micro-batches of " +
                               std::to_string(micro_B_) + " sequences of " + std::to_string(model_.T) +
                               " tokens), but a rank has " + format_bytes(available) + " (" + how +
                               "). Use a smaller --batch, more " + accumulation_flag() +
                               ", more ranks, or a smaller --preset");
}

double TrainingRun::moe_activations() const {
  if (!model_.moe()) return 0;
  if (expert_rows_.empty()) return moe_forecast_;
  return moe_schedule_activation_bytes(model_, routed_tokens(), pp_.parts, pp_.actions, expert_rows_);
}

int64_t TrainingRun::routed_tokens() const {
  const int64_t held = cp_.on() ? int64_t(cp_.positions.size()) : model_.T;
  return int64_t(micro_B_) * held / (tp_.sequence_parallel ? tp_.size : 1);
}

std::vector<std::vector<int64_t>> TrainingRun::every_micro_batch_and_layer(int64_t rows) const {
  return std::vector<std::vector<int64_t>>(size_t(cfg_.grad_accum), std::vector<int64_t>(size_t(model_.L), rows));
}
