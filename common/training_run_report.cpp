// training_run_report.cpp: what TrainingRun reports besides the step line: once, after the first
// measured step, memory and communication next to theory (docs/theory.md); at the end, the averages
// over the measured steps with the model's FLOPs (and MFU on a GPU). See training_run.h.
#include "training_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fcntl.h>   // open: /dev/null for the abort's banner
#include <unistd.h>  // close, dup2: rank 0 hands the launcher its output before an abort

#include "output_paths.h"    // release_output_locks
#include "ring_attention.h"  // ring_buffer_bytes
#include "trace.h"           // write_merged_trace

void TrainingRun::report_vs_theory(const CommStats& step_comm, const CommStats* dp_step, const CommStats* tp_step) {
  reported_theory_ = true;
  Prediction p = predict(strategy_, layout_, cfg_.grad_accum, dtype_);
  if (dp_comm_theory_ >= 0) p.comm_bytes = dp_comm_theory_, p.comm_formula = dp_comm_formula_;
  const MemoryStats& mem = memory_stats();
  const double padding = double(dtype_size(dtype_)) * double(layout_.padded_size - layout_.num_params);
  auto row = [](const char* what, double measured, double theory) {
    std::printf("  %-22s %12s %12s\n", what, format_bytes(measured).c_str(), format_bytes(theory).c_str());
  };
  const double model_state = double(mem.current[int(MemCategory::Params)] + mem.current[int(MemCategory::Grads)] +
                                    mem.current[int(MemCategory::OptState)]);
  std::string split;  // under tensor parallelism, Ψ = its slices of the split tensors + the tensors held whole
  if (tp_.size > 1) {
    int64_t sliced = 0, whole = 0;
    for (size_t i = 0; i < layout_.params.size(); i++)
      (layout_.params[i].shard.whole() ? whole : sliced) += global_layout_.params[i].size;
    split = " on this tensor-parallel rank = " + std::to_string(sliced) + " split / " + std::to_string(tp_.size) +
            " + " + std::to_string(whole) + " held whole";
  }
  std::printf("per rank, measured vs theory (docs/theory.md; %s: %s; Ψ = %lld%s, padded to %lld)\n", p.strategy.c_str(),
              p.memory_formula.c_str(), (long long)layout_.num_params, split.c_str(), (long long)layout_.padded_size);
  std::printf("  %-22s %12s %12s\n", "", "measured", "theory");
  row("parameters", double(mem.current[int(MemCategory::Params)]), p.params_bytes);
  row("gradients", double(mem.current[int(MemCategory::Grads)]), p.grads_bytes);
  row("optimizer state", double(mem.current[int(MemCategory::OptState)]), p.optim_bytes);
  row("  model state", model_state, p.params_bytes + p.grads_bytes + p.optim_bytes);
  // A MoE model's layers at this step's routing (set_expert_rows), next to balanced routing and the bound.
  double activations = forecast_.activations, moe_balanced = 0, moe_at_most = 0;
  // The most rows of any layer, over the step's micro-batches.
  std::vector<int64_t> most_rows_each(size_t(model_.L), 0);
  for (const std::vector<int64_t>& rows : expert_rows_)
    for (size_t l = 0; l < rows.size(); l++) most_rows_each[l] = std::max(most_rows_each[l], rows[l]);
  if (model_.moe()) {
    const double dense = forecast_.activations - moe_forecast_;
    auto replayed = [&](const std::vector<std::vector<int64_t>>& rows) {
      return dense + moe_schedule_activation_bytes(model_, routed_tokens(), pp_.parts, pp_.actions, rows);
    };
    moe_balanced = replayed(every_micro_batch_and_layer(routed_tokens() * model_.top_k));
    moe_at_most = replayed(every_micro_batch_and_layer(
        moe_expert_rows_at_most_of(model_, routed_tokens(), ep_.size, world_.size() / pp_.size)));
    activations = expert_rows_.empty() ? moe_at_most : replayed(expert_rows_);
  }
  row(model_.moe() && !expert_rows_.empty() ? "activations (routing)" : "activations",
      double(mem.peak[int(MemCategory::Activations)]), activations);
  if (model_.moe()) {
    std::string rows;
    for (int64_t n : most_rows_each) rows += (rows.empty() ? "" : " ") + std::to_string(n);
    rows = expert_rows_.empty() ? "theory = the bound (exact on one rank without a capacity)"
                                : "theory at these routing counts, replayed in the schedule's order; the most rows per layer [" +
                                      rows + "]";
    std::printf("    (MoE, docs/theory.md 14: %s | balanced routing %s | at most %s, ep %d, capacity factor %g)\n",
                rows.c_str(), format_bytes(moe_balanced).c_str(), format_bytes(moe_at_most).c_str(), ep_.size,
                model_.capacity_factor);
  }
  // The same formula for the other ways of running this rank's part of the model (all of it, or its
  // pipeline stage with the schedule's micro-batches in flight), so that the reader sees what tensor
  // parallelism alone keeps (every position's stream between the products), what sequence
  // parallelism then splits, and what recomputation drops.
  auto predicted = [&](int t, bool sp, Recompute recompute) {
    GPT2Config cfg = model_;
    cfg.recompute = recompute;
    double bytes = 0;
    if (cp_.on()) {  // section 13: T/cp positions, a log-sum-exp per query, and the ring's blocks
      cfg.T = int(cp_.positions.size());
      bytes += ring_buffer_bytes(cp_.size, micro_B_, cfg.T, cfg.C / t, cfg.NH / t);
    }
    for (const ModelPart& part : pp_.parts.empty() ? std::vector<ModelPart>{ModelPart{}} : pp_.parts)
      bytes += activation_bytes(cfg, micro_B_, dtype_, flash_ || cp_.on(), {t, 0, sp}, part);
    return format_bytes(bytes);
  };
  const Recompute now = model_.recompute;
  if (cp_.on()) {
    // Every term of the arena is linear in the positions a rank holds, T/cp, once attention keeps a
    // log-sum-exp per query rather than the T x T matrices; the ring adds its blocks in flight.
    const int held = int(cp_.positions.size());
    GPT2Config local = model_;
    local.T = held;
    std::printf("    (by the formula: CP %d: the arena on T/cp = %d positions %s + the ring's blocks in flight %s | "
                "CP 1 %s | 01's materialized attention %s; docs/theory.md, section 13)\n",
                cp_.size, held, format_bytes(activation_bytes(local, micro_B_, dtype_, true)).c_str(),
                format_bytes(ring_buffer_bytes(cp_.size, micro_B_, held, model_.C, model_.NH)).c_str(),
                format_bytes(context_parallel_activation_bytes(model_, micro_B_, 1)).c_str(),
                format_bytes(activation_bytes(model_, micro_B_, dtype_, false)).c_str());
  }
  if (tp_.size > 1)
    std::printf("    (by the formula: no TP %s | TP %d %s | TP %d + SP %s; docs/theory.md, section 9, derives it and "
                "sets it beside Korthikanti et al.'s)\n",
                predicted(1, false, now).c_str(), tp_.size, predicted(tp_.size, false, now).c_str(), tp_.size,
                predicted(tp_.size, true, now).c_str());
  if (tp_.size > 1 || pp_.size > 1 || now != Recompute::None)
    std::printf("    (recompute none %s | selective %s | full %s%s; docs/theory.md, section 12)\n",
                predicted(tp_.size, tp_.sequence_parallel, Recompute::None).c_str(),
                predicted(tp_.size, tp_.sequence_parallel, Recompute::Selective).c_str(),
                predicted(tp_.size, tp_.sequence_parallel, Recompute::Full).c_str(),
                std::any_of(pp_.parts.begin(), pp_.parts.end(), [](const ModelPart& x) { return x.split_backward; })
                    ? " (not with zb-h1 or zb-v)" : "");
  // Chapter 11's exchange buffers at this step's routing, as the activations above; else the bound.
  const bool exchange_routed = ep_comm_ && model_.moe() && !expert_rows_.empty();
  const double transient = exchange_routed ? forecast_.transient - moe_exchange_forecast_ +
                                                 moe_exchange_buffer_bytes(model_, most_rows_each)
                                           : forecast_.transient;
  std::printf("  %-22s %12s %12s   (transient; theory: %s)\n",
              exchange_routed ? "comm buffers (routing)" : "communication buffers",
              format_bytes(double(mem.peak[int(MemCategory::CommBuffers)])).c_str(), format_bytes(transient).c_str(),
              exchange_routed ? ("the expert exchange at these routing counts, docs/theory.md 14; at most " +
                                 format_bytes(forecast_.transient)).c_str()
                              : "at most");
  const int64_t dp_bytes = dp_step->training_sent_bytes();
  const bool groups = tp_step || pp_.size > 1 || cp_comm_;
  row(cp_comm_ ? "DP x CP bytes per step" : groups ? "DP bytes per step" : "comm bytes per step", double(dp_bytes),
      p.comm_bytes);
  std::printf("  (%scomm theory: %s; padding adds up to %s per full copy)\n", groups ? "DP " : "",
              p.comm_formula.c_str(), format_bytes(padding).c_str());
  GPT2Config held_positions = model_;  // under CP, every TP collective carries T/cp positions
  if (cp_.on()) held_positions.T = int(cp_.positions.size());
  TensorParallelPrediction tp = predict_tensor_parallel(held_positions, micro_B_, tp_, dtype_, pp_.parts);
  // (the gradients held whole are the parameters': wpe has all T rows whatever a rank holds)
  const TensorParallelPrediction whole = predict_tensor_parallel(model_, micro_B_, tp_, dtype_, pp_.parts);
  tp.partial_grad_bytes = whole.partial_grad_bytes;
  tp.partial_grad_all_reduces = whole.partial_grad_all_reduces;
  if (pp_.reduce_every_micro_batch) {  // (09's --zero2: the gradients held whole summed before each reduce-scatter)
    tp.partial_grad_all_reduces *= cfg_.grad_accum;
    tp.partial_grad_bytes *= cfg_.grad_accum;
  }
  const double tp_theory = cfg_.grad_accum * tp.bytes_per_micro_batch + tp.partial_grad_bytes;
  int64_t tp_bytes = 0;
  if (tp_step) {
    tp_bytes = tp_step->training_sent_bytes();
    row("TP bytes per step", double(tp_bytes), tp_theory);
    std::printf("  (TP theory, per micro-batch: %s)\n", tp.formula.c_str());
    for (CollectiveKind k : {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::ReduceScatter}) {
      const int per_micro_batch = k == CollectiveKind::AllReduce ? tp.all_reduces + tp.loss_all_reduces
                                  : k == CollectiveKind::AllGather ? tp.all_gathers : tp.reduce_scatters;
      const int per_step = k == CollectiveKind::AllReduce ? tp.partial_grad_all_reduces : 0;
      const int64_t calls = tp_step->kind[int(k)].calls;
      if (calls || per_micro_batch || per_step)
        std::printf("  TP %-19s %12lld %12d   (%d a micro-batch x %d%s)\n",
                    (std::string(collective_name(k)) + "s").c_str(), (long long)calls,
                    per_micro_batch * cfg_.grad_accum + per_step, per_micro_batch, cfg_.grad_accum,
                    per_step ? (" + " + std::to_string(per_step) + " for the gradients held whole").c_str() : "");
    }
  }
  std::fflush(stdout);
  JsonObject record;
  record.add("type", "theory")
      .add("strategy", p.strategy)
      .add("memory_formula", p.memory_formula)
      .add("comm_formula", p.comm_formula)
      .add("params", int64_t(layout_.num_params))
      .add("padded_params", int64_t(layout_.padded_size))
      .add("measured_params_bytes", mem.current[int(MemCategory::Params)])
      .add("theory_params_bytes", p.params_bytes)
      .add("measured_grads_bytes", mem.current[int(MemCategory::Grads)])
      .add("theory_grads_bytes", p.grads_bytes)
      .add("measured_optim_bytes", mem.current[int(MemCategory::OptState)])
      .add("theory_optim_bytes", p.optim_bytes)
      .add("measured_model_state_bytes", model_state)
      .add("measured_activations_bytes", mem.peak[int(MemCategory::Activations)])
      .add("theory_activations_bytes", activations)
      .add("measured_transient_bytes", mem.peak[int(MemCategory::CommBuffers)])
      .add("theory_transient_bytes_at_most", forecast_.transient)
      .add("theory_transient_bytes", transient)
      .add("measured_comm_bytes", dp_bytes)
      .add("theory_comm_bytes", p.comm_bytes);
  if (model_.moe())
    record.add("theory_activations_balanced_bytes", moe_balanced).add("theory_activations_at_most_bytes", moe_at_most);
  if (tp_step) {
    record.add("measured_tp_comm_bytes", tp_bytes)
        .add("theory_tp_comm_bytes", tp_theory)
        .add("theory_tp_all_reduces", (tp.all_reduces + tp.loss_all_reduces) * cfg_.grad_accum + tp.partial_grad_all_reduces)
        .add("theory_tp_all_gathers", tp.all_gathers * cfg_.grad_accum)
        .add("theory_tp_reduce_scatters", tp.reduce_scatters * cfg_.grad_accum)
        .add("measured_tp_all_reduces", tp_step->kind[int(CollectiveKind::AllReduce)].calls)
        .add("measured_tp_all_gathers", tp_step->kind[int(CollectiveKind::AllGather)].calls)
        .add("measured_tp_reduce_scatters", tp_step->kind[int(CollectiveKind::ReduceScatter)].calls);
  }
  json_.write(record);
  (void)step_comm;
}

int TrainingRun::finish() {
  const int status = stop_ == Stop::Diverged ? 1 : stop_ == Stop::Interrupted ? 130 : 0;
  const char* ended = stop_ == Stop::Diverged ? "diverged" : stop_ == Stop::Interrupted ? "interrupted" : "completed";
  write_run_record();
  if (is_root()) {
    JsonObject summary;
    summary.add("type", "summary")
        .add("ended", ended)
        .add("last_step", last_step_)
        .add("measured_steps", totals_.steps)
        .add("final_loss", double(totals_.last_loss))
        .add("peak_mem_bytes", std::max(run_peak_bytes_, memory_stats().peak_total));
    if (totals_.steps == 0) {
      std::printf("no measured steps: step 0 is warm-up and is left out of the averages; run --steps 2 or more to "
                  "measure time, throughput and communication | final loss %.4f\n", totals_.last_loss);
    } else {
      const int n = totals_.steps;
      const double step_ms = totals_.step_ms / n, tokens_per_s = totals_.tokens_per_s / n;
      const double exposed = totals_.exposed_ms / n, comm_ms = totals_.comm_ms / n;
      // FLOPs per token, as the PaLM paper counts them (appendix B): 6 per parameter (forward 2,
      // backward 4) without the position embedding, plus 12 L C T for attention's score and value
      // products. MFU divides the achieved FLOP/s by the device's peak (device.h).
      const double flops_per_token =
          6.0 * double(flops_params(global_layout_)) + 12.0 * model_.L * model_.C * model_.T;
      const double flops_per_rank = tokens_per_s * flops_per_token / world_.size();
      std::printf("average over %d measured steps: %.1f ms/step | %s tok/s | exposed comm %.2f ms of %.2f ms | "
                  "%.0f collectives/step | %s/step | peak mem %s | final loss %.4f\n",
                  n, step_ms, format_count(tokens_per_s).c_str(), exposed, comm_ms, totals_.collectives / n,
                  format_bytes(totals_.comm_bytes / n).c_str(),
                  format_bytes(double(std::max(run_peak_bytes_, memory_stats().peak_total))).c_str(),
                  totals_.last_loss);
      std::printf("model FLOPs: 6N + 12LCT = %.3g per token x %s tok/s = %.3g %s per rank", flops_per_token,
                  format_count(tokens_per_s / world_.size()).c_str(),
                  flops_per_rank >= 1e12 ? flops_per_rank / 1e12 : flops_per_rank / 1e9,
                  flops_per_rank >= 1e12 ? "TFLOP/s" : "GFLOP/s");
      if (device_info_.peak_flops > 0) {
        std::printf(" | MFU %.1f%% of %s (%.0f TFLOP/s)", 100.0 * flops_per_rank / device_info_.peak_flops,
                    device_info_.peak_source.c_str(), device_info_.peak_flops / 1e12);
      }
      std::printf("\n");
      // Recomputation's FLOPs are done besides the model's: hardware FLOPs, not model FLOPs (MFU
      // counts the model's only; docs/theory.md, section 12).
      // An attention that keeps a log-sum-exp per query (FlashAttention, the ring) recomputes its scores
      // in its own backward in every mode: selective has nothing to drop, and adds nothing.
      const bool lse_attention = flash_ || cp_.on();
      const double recompute_flops = recompute_flops_per_token(model_, {}, {}, lse_attention);
      if (model_.recompute == Recompute::Selective && lse_attention) {
        std::printf("recompute selective: + 0 FLOPs per token: the %s attention keeps no (B,NH,T,T) scores to drop, "
                    "and its backward recomputes them from the log-sum-exp in every mode (docs/theory.md, section "
                    "12)\n", cp_.on() ? "ring's" : "FlashAttention");
        summary.add("recompute_flops_per_token", recompute_flops);
      } else if (recompute_flops > 0) {
        std::printf("recompute %s: + %.3g FLOPs per token (%s) = +%.1f%% of the model's, in the %.1f ms/step above\n",
                    recompute_name(model_.recompute), recompute_flops,
                    model_.recompute == Recompute::Full ? "L(16C^2 + 4TC)" : "4LTC",
                    100.0 * recompute_flops / flops_per_token, step_ms);
        summary.add("recompute_flops_per_token", recompute_flops);
      }
      summary.add("step_ms", step_ms)
          .add("tokens_per_s", tokens_per_s)
          .add("exposed_comm_ms", exposed)
          .add("comm_ms", comm_ms)
          .add("collectives_per_step", totals_.collectives / n)
          .add("comm_bytes_per_step", totals_.comm_bytes / n)
          .add("flops_per_token", flops_per_token);
      if (device_info_.peak_flops > 0) {
        summary.add("mfu", flops_per_rank / device_info_.peak_flops)
            .add("peak_flops", device_info_.peak_flops)
            .add("peak_source", device_info_.peak_source);
      }
    }
    std::fflush(stdout);
    json_.write(summary);
    json_.close();
  }
  if (!cfg_.trace.empty()) write_merged_trace(world_, cfg_.trace);
  release_output_locks();
  if (stop_ == Stop::Interrupted) {
    // Everything is written. MPICH's mpiexec (hydra) forwards Ctrl-C to the ranks, and then loses
    // some of their exit statuses: a job whose every rank returned 130 was reported as 0 in about
    // half of the runs measured. An MPI_Abort with the code is reported faithfully, so rank 0 ends the
    // job that way once every rank got here; the others wait for it.
    // The abort tears the job down at once, and the launcher drops whatever of rank 0's output its
    // proxy has not relayed yet (the summary's last lines went missing so, once, on a busy machine).
    // So rank 0 closes its standard output first, which hands the proxy an end of file, and gives it
    // a moment to pass the rest on.
    // MPICH's MPI_Abort prints its own banner to standard error ("Abort(130) on node 0 ...: application
    // called MPI_Abort"), which would be the job's last line: an error the user did not make, after our
    // summary. Every rank has stopped by agreement and written what it had, so rank 0 sends that
    // banner to /dev/null.
    world_.barrier();
    if (is_root()) {
      std::fflush(stdout);
      std::fflush(stderr);
      close(STDOUT_FILENO);
      const int null_device = open("/dev/null", O_WRONLY);
      if (null_device >= 0) dup2(null_device, STDERR_FILENO);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      end_job(status);
    }
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return status;
}
