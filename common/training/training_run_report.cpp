// training_run_report.cpp: what TrainingRun reports besides the step line: once, after the first
// measured step, memory and communication next to theory (docs/theory.md); at the end, the averages
// over the measured steps with the model's FLOPs (and MFU on a GPU). See training_run.h.
#include "training/training_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fcntl.h>   // open: /dev/null for the abort's banner
#include <unistd.h>  // close, dup2: rank 0 hands the launcher its output before an abort

#include "training/mixed_precision.h"  // MixedPrecision::finish
#include "base/output_paths.h"    // release_output_locks
#include "comm/trace.h"           // write_merged_trace

// The frame every run prints (the strategy's model state, the activations, the transient buffers),
// each dimension's rows in it (dimension.h), and the same numbers as a "theory" record.
void TrainingRun::report_vs_theory(const StepMeasure& step) {
  reported_theory_ = true;
  const DimensionContext ctx = dimension_context();
  ReportTable table;
  table.strategy = predict(split_.strategy, layout_, cfg_.grad_accum, dtype_, ctx.formats);  // a recipe's bytes
  table.activations = forecast_.activations;
  table.transient = forecast_.transient;  // a recipe's staged codes included (check_memory)
  if (staging_at_most_ > 0)
    table.transient_theory = "at most, " + format_bytes(staging_at_most_) + " of it the codes staged, section 3";
  for (const std::unique_ptr<Dimension>& d : dimensions_) d->report_rows(ctx, step, table);

  const Prediction& p = table.strategy;
  const MemoryStats& mem = memory_stats();
  const double model_state = double(mem.current[int(MemCategory::Params)] + mem.current[int(MemCategory::Grads)] +
                                    mem.current[int(MemCategory::OptState)]);
  std::printf("per rank, measured vs theory (docs/theory.md; %s: %s; Ψ = %lld%s, padded to %lld)\n", p.strategy.c_str(),
              p.memory_formula.c_str(), (long long)layout_.num_params, table.params_split.c_str(),
              (long long)layout_.padded_size);
  std::printf("  %-22s %12s %12s\n", "", "measured", "theory");
  auto row = [](const char* what, double measured, double theory) {
    std::printf("%s\n", report_row(what, measured, theory).c_str());
  };
  row("parameters", double(mem.current[int(MemCategory::Params)]), p.params_bytes);
  row("gradients", double(mem.current[int(MemCategory::Grads)]), p.grads_bytes);
  row("optimizer state", double(mem.current[int(MemCategory::OptState)]), p.optim_bytes);
  row("  model state", model_state, p.params_bytes + p.grads_bytes + p.optim_bytes);
  row(table.activations_label.c_str(), double(mem.peak[int(MemCategory::Activations)]), table.activations);
  for (const std::string& line : table.activation_notes) std::printf("%s\n", line.c_str());
  // The same formula for each way of recomputing this rank's part of the model (all of it, or its
  // pipeline stage with the schedule's micro-batches in flight).
  const Recompute now = model_.recompute;
  if (table.recompute_note || now != Recompute::None)
    std::printf("    (recompute none %s | selective %s | full %s%s; docs/theory.md, section 12)\n",
                format_bytes(activations_by_formula(ctx, split_.tp.size, split_.tp.sequence_parallel, Recompute::None)).c_str(),
                format_bytes(activations_by_formula(ctx, split_.tp.size, split_.tp.sequence_parallel, Recompute::Selective)).c_str(),
                format_bytes(activations_by_formula(ctx, split_.tp.size, split_.tp.sequence_parallel, Recompute::Full)).c_str(),
                std::any_of(split_.pp.parts.begin(), split_.pp.parts.end(), [](const ModelPart& x) { return x.split_backward; })
                    ? " (not with zb-h1 or zb-v)" : "");
  std::printf("  %-22s %12s %12s   (transient; theory: %s)\n", table.transient_label.c_str(),
              format_bytes(double(mem.peak[int(MemCategory::CommBuffers)])).c_str(),
              format_bytes(table.transient).c_str(), table.transient_theory.c_str());
  // A recipe's products on the CPU: their operands' rounded copies, beside the formula of the whole
  // model's products (a bound where the grid splits the model: TP's slices, a stage's, CP's tokens).
  // (and, past one expert-parallel rank, an expert's rows: the routing decides them)
  const bool whole_model = split_.tp.size == 1 && split_.pp.size == 1 && !split_.cp.on() && split_.ep.size == 1;
  const double scratch = precision_ ? double(precision_->scratch_bytes()) : 0;
  if (precision_scratch_ > 0)
    std::printf("%s   (theory%s: the products' operands, docs/theory.md, section 18)\n",
                report_row("precision scratch", scratch, precision_scratch_).c_str(), whole_model ? "" : " at most");
  for (const std::string& line : table.comm_rows) std::printf("%s\n", line.c_str());
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
      .add("theory_activations_bytes", table.activations)
      .add("measured_transient_bytes", mem.peak[int(MemCategory::CommBuffers)])
      .add("theory_transient_bytes_at_most", forecast_.transient)
      .add("theory_transient_bytes", table.transient)
      .add(table.json);
  if (precision_scratch_ > 0)  // (fp32 installs no recipe: its record is as it was)
    record.add("measured_precision_scratch_bytes", scratch)
        .add("theory_precision_scratch_bytes", precision_scratch_)
        .add("theory_precision_scratch_exact", int64_t(whole_model ? 1 : 0));
  json_.write(record);
}

int TrainingRun::finish() {
  if (precision_)  // the operands' formula counts the whole dense model on each rank; the state's, unsharded
    precision_->finish(layout_.padded_size, model_.L, model_.C, model_.V, int64_t(micro_B_) * model_.T * cfg_.grad_accum,
                       cfg_.grad_accum, split_.tp.size == 1 && split_.pp.size == 1 && !split_.cp.on() && !model_.moe(),
                       split_.strategy == Strategy::DP);
  wait_for_save("the end of the run");  // a run ends only once its checkpoint is complete
  report_async_saves();
  async_.comm.reset();  // (a group's communicator goes before MPI does)
  const int status = stop_ == Stop::Diverged ? 1 : stop_ == Stop::Interrupted ? 130 : 0;
  const char* ended = stop_ == Stop::Diverged ? "diverged" : stop_ == Stop::Interrupted ? "interrupted" : "completed";
  write_run_record();
  // Every rank's peak over the run, next to its own forecast (check_memory): the summary's peak is
  // the largest, compared with the forecast of the rank that had it.
  const int W = world_.size();
  const double my_peak = double(std::max(run_peak_bytes_, memory_stats().peak_total));
  std::vector<double> peaks(static_cast<size_t>(W)), forecasts(static_cast<size_t>(W));
  int largest = 0;
  for (int q = 0; q < W; q++) {
    peaks[size_t(q)] = world_.all_reduce_scalar(world_.rank() == q ? my_peak : 0.0, ReduceOp::Sum);
    forecasts[size_t(q)] = world_.all_reduce_scalar(world_.rank() == q ? forecast_.peak() : 0.0, ReduceOp::Sum);
    if (peaks[size_t(q)] > peaks[size_t(largest)]) largest = q;
  }
  const double peak = peaks[size_t(largest)], peak_forecast = forecasts[size_t(largest)];
  const std::string peak_text =
      format_bytes(peak) + (W > 1 ? " (rank " + std::to_string(largest) + ", the largest of " + std::to_string(W) +
                                        "; its forecast " + format_bytes(peak_forecast) + ")"
                                  : " (forecast " + format_bytes(peak_forecast) + ")");
  if (is_root()) {
    JsonObject summary;
    summary.add("type", "summary")
        .add("ended", ended)
        .add("last_step", last_step_)
        .add("measured_steps", totals_.steps)
        .add("final_loss", double(totals_.last_loss))
        .add("peak_mem_bytes", peak)
        .add("peak_mem_rank", largest)
        .add("forecast_peak_bytes", peak_forecast);
    for (int q = 0; q < W; q++)
      summary.add("rank" + std::to_string(q) + "_peak_mem_bytes", peaks[size_t(q)])
          .add("rank" + std::to_string(q) + "_forecast_peak_bytes", forecasts[size_t(q)]);
    if (totals_.steps == 0) {
      std::printf("no measured steps: step 0 is warm-up and is left out of the averages; run --steps 2 or more to "
                  "measure time, throughput and communication | peak mem %s | final loss %.4f\n", peak_text.c_str(),
                  totals_.last_loss);
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
                  format_bytes(totals_.comm_bytes / n).c_str(), peak_text.c_str(), totals_.last_loss);
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
      const bool lse_attention = split_.cp.lse_attention(flash_);
      const double recompute_flops = recompute_flops_per_token(model_, {}, {}, lse_attention);
      if (model_.recompute == Recompute::Selective && lse_attention) {
        std::printf("recompute selective: + 0 FLOPs per token: the %s attention keeps no (B,NH,T,T) scores to drop, "
                    "and its backward recomputes them from the log-sum-exp in every mode (docs/theory.md, section "
                    "12)\n", split_.cp.on() ? "ring's" : "FlashAttention");
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
