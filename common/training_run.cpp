// training_run.cpp: see training_run.h.
#include "training_run.h"

#include <cmath>
#include <cstdio>

#include "checkpoint.h"
#include "device.h"
#include "model.h"
#include "ops.h"
#include "optimizer.h"
#include "trace.h"

namespace {

// Training traffic only: the loss and norm scalars are metrics, not what theory counts.
int64_t training_calls(const CommStats& s) {
  return s.total_calls() - s.kind[int(CollectiveKind::Scalar)].calls;
}
int64_t training_wire_bytes(const CommStats& s) {
  return s.total_sent_bytes() - s.kind[int(CollectiveKind::Scalar)].sent_bytes;
}

}  // namespace

TrainingRun::TrainingRun(Communicator& comm, const TrainConfig& cfg, Strategy strategy)
    : comm_(comm), cfg_(cfg), strategy_(strategy), device_(comm.device()), dtype_(pick_dtype(cfg.dtype, device_)) {
  const int N = comm.size();
  // Every check below sees the same flags on every rank, so config_error() is collective-safe.
  if (!find_preset(cfg.preset, &model_))
    config_error("--preset: unknown preset '" + cfg.preset + "' (choose from " + preset_names() + ")");
  batch_ = cfg.batch > 0 ? cfg.batch : model_.default_batch;
  if (cfg.lr <= 0) cfg_.lr = model_.default_lr;
  const int per_step = N * cfg.grad_accum;
  if (batch_ % per_step != 0) {
    int suggestion = (batch_ / per_step + 1) * per_step;
    config_error("--batch " + std::to_string(batch_) + " is not divisible by ranks x grad-accum = " +
                 std::to_string(N) + " x " + std::to_string(cfg.grad_accum) + " = " + std::to_string(per_step) +
                 "; try --batch " + std::to_string(suggestion));
  }
  if (model_.C % model_.NH != 0) config_error("the model's C must divide by NH");
  model_.flash_attention = cfg.attention == "flash";
  const bool flash = model_.flash_attention && flash_attention_available(dtype_, device_, model_.C, model_.NH);
  micro_B_ = batch_ / per_step;
  layout_ = build_gpt2_layout(model_, N);

  std::string error;
  bool ok = load_token_data(cfg.data, model_.T, &data_, &error);
  comm.agree_or_die(ok, error);
  inputs_.resize(size_t(micro_B_) * model_.T);
  targets_.resize(size_t(micro_B_) * model_.T);
  if (device_ != Device::CPU)
    device_tokens_ = Buffer(2 * int64_t(micro_B_) * model_.T, MemCategory::Activations, DType::I32, device_);
  device_info_ = describe_device(device_, dtype_);

  comm.set_link_model({cfg.link_gbps, cfg.link_latency_us});
  enable_tracing(!cfg.trace.empty());

  if (is_root()) {
    if (!cfg.json.empty()) json_.open(cfg.json);
    std::printf("%s | %d rank%s | preset %s (L=%d C=%d NH=%d T=%d V=%d) | %lld parameters\n", cfg.chapter.c_str(), N,
                N > 1 ? "s" : "", model_.preset.c_str(), model_.L, model_.C, model_.NH, model_.T, model_.V,
                (long long)layout_.num_params);
    std::printf("global batch %d x %d tokens | %d per rank in %d micro-batch%s of %d | data: %s\n", batch_, model_.T,
                batch_ / N, cfg.grad_accum, cfg.grad_accum > 1 ? "es" : "", micro_B_, data_.description().c_str());
    std::printf("device %s | communicator %s | %s | attention %s\n", device_info_.name.c_str(), comm.name().c_str(),
                dtype_ == DType::BF16 ? "bf16 mixed precision (fp32 master weights and AdamW state)" : "fp32",
                flash ? "flash" : "materialized (B,NH,T,T)");
    if (cfg.link_gbps > 0)
      std::printf("emulated link: %.3g Gbit/s, %.3g us latency (alpha-beta ring model, see README)\n", cfg.link_gbps,
                  cfg.link_latency_us);
    std::fflush(stdout);
    json_.write(JsonObject()
                    .add("type", "run")
                    .add("chapter", cfg.chapter)
                    .add("ranks", N)
                    .add("preset", model_.preset)
                    .add("L", model_.L).add("C", model_.C).add("NH", model_.NH).add("T", model_.T).add("V", model_.V)
                    .add("params", int64_t(layout_.num_params))
                    .add("padded_params", int64_t(layout_.padded_size))
                    .add("batch", batch_)
                    .add("grad_accum", cfg.grad_accum)
                    .add("micro_batch", micro_B_)
                    .add("steps", cfg.steps)
                    .add("lr", double(cfg_.lr))
                    .add("seed", int64_t(cfg.seed))
                    .add("data", data_.description())
                    .add("device", device_info_.name)
                    .add("dtype", dtype_name(dtype_))
                    .add("attention", flash ? "flash" : "materialized")
                    .add("communicator", comm.name())
                    .add("link_gbps", cfg.link_gbps)
                    .add("link_latency_us", cfg.link_latency_us));
  }
}

TrainingRun::~TrainingRun() = default;

MicroBatch TrainingRun::micro_batch(int step, int micro) {
  // no_sync (02, 03) promises no communication before the last micro-batch: measure it.
  if (micro == cfg_.grad_accum - 1)
    launched_before_last_micro_ = comm_.stats().total_launched() - comm_at_step_start_.total_launched();
  const int per_rank = batch_ / comm_.size();
  const int first = comm_.rank() * per_rank + micro * micro_B_;
  data_.fill(step, batch_, first, micro_B_, model_.T, inputs_.data(), targets_.data());
  if (device_ == Device::CPU) return {inputs_.data(), targets_.data(), micro_B_};
  // Uploaded once per micro-batch, so the ops read device memory (ops_cuda.h).
  const int64_t n = int64_t(micro_B_) * model_.T;
  Tensor on_device = device_tokens_.view();
  transfer(on_device.slice1d(0, n), make_view(inputs_.data(), {n}, DType::I32));
  transfer(on_device.slice1d(n, n), make_view(targets_.data(), {n}, DType::I32));
  return {on_device.i32(), on_device.i32() + n, micro_B_};
}

float TrainingRun::lr(int step) const { return learning_rate(cfg_, cfg_.lr, step); }

namespace {

// A full padded copy, in host memory, of [begin, begin + piece.numel()) from every rank's piece: a
// plain copy when the piece already is everything, an all-gather (on the piece's device) when it is
// a shard. Transient, counted as "other". Simple rather than lean: while saving, every rank briefly
// holds full parameters, m and v (12Ψ bytes, outside the step's peak). A model that does not fit
// once per rank would gather to rank 0 tensor by tensor instead.
Buffer gather_full(Communicator& comm, const ParamLayout& layout, Tensor piece, int64_t begin) {
  Buffer full(layout.padded_size, MemCategory::Other);
  if (piece.numel() == layout.padded_size) {
    transfer(full.view(), piece);
    return full;
  }
  ENSURE(piece.numel() == layout.shard_size() && begin == layout.shard_begin(comm.rank()), "a piece must be all or a shard");
  Buffer gathered(layout.padded_size, MemCategory::Other, piece.device);
  copy_tensor(gathered.view().slice1d(begin, piece.numel()), piece);
  comm.all_gather(gathered.view().slice1d(begin, piece.numel()), gathered.view());
  transfer(full.view(), gathered.view());
  return full;
}

// dst (on any device, fp32 or bf16) = host_f32, rounded to dst's dtype on the host first.
void upload_converted(Tensor dst, Tensor host_f32) {
  if (dst.dtype == host_f32.dtype) return transfer(dst, host_f32);
  Buffer converted(host_f32.numel(), MemCategory::Other, dst.dtype, Device::CPU);
  convert_tensor(converted.view(), host_f32);
  transfer(dst, converted.view());
}

}  // namespace

int TrainingRun::init_or_resume(Tensor params, int64_t params_begin, AdamW& optimizer) {
  Buffer full_params(layout_.padded_size, MemCategory::Other);
  int64_t step = 0;
  if (cfg_.resume.empty()) {
    GPT2::init_weights(layout_, cfg_.seed, full_params.f32());
  } else {
    Buffer full_m(layout_.padded_size, MemCategory::Other), full_v(layout_.padded_size, MemCategory::Other);
    step = load_checkpoint(comm_, cfg_.resume, model_, layout_, batch_, full_params.f32(), full_m.f32(), full_v.f32());
    const int64_t n = optimizer.end() - optimizer.begin();
    transfer(optimizer.m(), full_m.view().slice1d(optimizer.begin(), n));
    transfer(optimizer.v(), full_v.view().slice1d(optimizer.begin(), n));
    if (is_root()) std::printf("resumed from %s at step %lld\n", cfg_.resume.c_str(), (long long)step);
    if (step > cfg_.steps)
      config_error("checkpoint '" + cfg_.resume + "' is at step " + std::to_string(step) + ", past --steps " +
                   std::to_string(cfg_.steps));
  }
  if (optimizer.mixed_precision()) {
    const int64_t n = optimizer.end() - optimizer.begin();
    transfer(optimizer.master(), full_params.view().slice1d(optimizer.begin(), n));
  }
  upload_converted(params, full_params.view().slice1d(params_begin, params.numel()));
  return int(step);
}

bool TrainingRun::checkpoint_due(int step) const {
  if (cfg_.save.empty()) return false;
  return step == cfg_.steps - 1 || (cfg_.save_every > 0 && (step + 1) % cfg_.save_every == 0);
}

void TrainingRun::save_checkpoint(int next_step, Tensor params, int64_t params_begin, AdamW& optimizer) {
  // Under mixed precision the weights are the fp32 master copy, which covers the optimizer's range.
  Buffer full_params = optimizer.mixed_precision() ? gather_full(comm_, layout_, optimizer.master(), optimizer.begin())
                                                   : gather_full(comm_, layout_, params, params_begin);
  Buffer full_m = gather_full(comm_, layout_, optimizer.m(), optimizer.begin());
  Buffer full_v = gather_full(comm_, layout_, optimizer.v(), optimizer.begin());
  CheckpointData data;
  data.step = next_step;
  data.global_batch = batch_;
  data.seed = cfg_.seed;
  data.params = full_params.f32();
  data.adam_m = full_m.f32();
  data.adam_v = full_v.f32();
  std::string path = cfg_.save;  // "{step}" in --save keeps one file per checkpoint
  size_t at = path.find("{step}");
  if (at != std::string::npos) path.replace(at, 6, std::to_string(next_step));
  ::save_checkpoint(comm_, path, model_, layout_, data);
}

void TrainingRun::begin_step(int /*step*/) {
  reset_memory_peaks();
  comm_at_step_start_ = comm_.stats();
  step_start_ms_ = now_ms();
}

void TrainingRun::end_step(int step, float local_loss, double grad_norm) {
  // Everything the step measures is read before the loss is averaged: that scalar is bookkeeping.
  // On a GPU the host is ahead of the device (ops only queue kernels): the step ends when the
  // device has run them.
  synchronize(device_);
  comm_.collect_stats();
  const double step_end_ms = now_ms(), step_ms = step_end_ms - step_start_ms_;
  trace_span(Track::Compute, "step " + std::to_string(step), step_start_ms_, step_end_ms);
  const CommStats step_comm = comm_.stats().since(comm_at_step_start_);
  const MemoryStats& mem = memory_stats();
  const float loss = float(comm_.all_reduce_scalar(local_loss, ReduceOp::Avg));
  const double tokens_per_s = double(batch_) * model_.T / (step_ms / 1e3);

  if (step > 0) {  // step 0 is warm-up
    totals_.steps++;
    totals_.step_ms += step_ms;
    totals_.exposed_ms += step_comm.exposed_ms;
    totals_.comm_ms += step_comm.in_flight_ms;
    totals_.tokens_per_s += tokens_per_s;
    totals_.collectives += double(training_calls(step_comm));
    totals_.comm_bytes += double(training_wire_bytes(step_comm));
  }
  totals_.last_loss = loss;
  if (!is_root()) return;

  if (!cfg_.quiet) {
    std::printf("%s\n", step_line(step, loss, step_ms, tokens_per_s, step_comm.exposed_ms, double(mem.peak_total)).c_str());
    std::fflush(stdout);
  }
  JsonObject record;
  record.add("type", "step")
      .add("step", step)
      .add("loss", double(loss))
      .add("lr", double(lr(step)))
      .add("grad_norm", grad_norm)
      .add("step_ms", step_ms)
      .add("tokens_per_s", tokens_per_s)
      .add("exposed_comm_ms", step_comm.exposed_ms)
      .add("comm_ms", step_comm.in_flight_ms)
      .add("comm_bytes", training_wire_bytes(step_comm))
      .add("collectives", training_calls(step_comm))
      .add("launched_before_last_micro", launched_before_last_micro_);
  for (int k = 0; k < kCollectiveKinds; k++)
    if (step_comm.kind[k].calls) record.add(std::string("calls_") + collective_name(CollectiveKind(k)), step_comm.kind[k].calls);
  for (int c = 0; c < kMemCategories; c++) record.add(std::string("mem_") + mem_category_name(MemCategory(c)), mem.peak[c]);
  record.add("mem_total", mem.peak_total);
  json_.write(record);
  if (step >= 1 && !reported_theory_) report_vs_theory(step_comm);
}

void TrainingRun::report_vs_theory(const CommStats& step_comm) {
  reported_theory_ = true;
  const Prediction p = predict(strategy_, layout_, cfg_.grad_accum, dtype_);
  const MemoryStats& mem = memory_stats();
  const double padding = double(dtype_size(dtype_)) * double(layout_.padded_size - layout_.num_params);
  auto row = [](const char* what, double measured, double theory) {
    std::printf("  %-22s %12s %12s\n", what, format_bytes(measured).c_str(), format_bytes(theory).c_str());
  };
  std::printf("per rank, measured vs theory (%s: %s; Ψ = %lld, padded to %lld)\n", p.strategy.c_str(),
              p.memory_formula.c_str(), (long long)layout_.num_params, (long long)layout_.padded_size);
  std::printf("  %-22s %12s %12s\n", "", "measured", "theory");
  row("parameters", double(mem.current[int(MemCategory::Params)]), p.params_bytes);
  row("gradients", double(mem.current[int(MemCategory::Grads)]), p.grads_bytes);
  row("optimizer state", double(mem.current[int(MemCategory::OptState)]), p.optim_bytes);
  std::printf("  %-22s %12s   (transient, outside the formula)\n", "activations",
              format_bytes(double(mem.peak[int(MemCategory::Activations)])).c_str());
  std::printf("  %-22s %12s   (transient, outside the formula)\n", "communication buffers",
              format_bytes(double(mem.peak[int(MemCategory::CommBuffers)])).c_str());
  row("comm bytes per step", double(training_wire_bytes(step_comm)), p.comm_bytes);
  std::printf("  (comm theory: %s; padding adds up to %s per full copy)\n", p.comm_formula.c_str(),
              format_bytes(padding).c_str());
  std::fflush(stdout);
  json_.write(JsonObject()
                  .add("type", "theory")
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
                  .add("measured_comm_bytes", training_wire_bytes(step_comm))
                  .add("theory_comm_bytes", p.comm_bytes));
}

void TrainingRun::finish() {
  const int n = totals_.steps > 0 ? totals_.steps : 1;
  if (is_root()) {
    const double step_ms = totals_.step_ms / n, tokens_per_s = totals_.tokens_per_s / n;
    const double exposed = totals_.exposed_ms / n, comm_ms = totals_.comm_ms / n;
    // FLOPs per token, as the PaLM paper counts them (appendix B): 6 per parameter (forward 2,
    // backward 4) without the position embedding, plus 12 L C T for attention's score and value
    // products. MFU divides the achieved FLOP/s by the device's peak (device.h).
    const double flops_per_token = 6.0 * double(flops_params(layout_)) + 12.0 * model_.L * model_.C * model_.T;
    const double achieved_flops = tokens_per_s * flops_per_token;
    std::printf("average over %d measured steps: %.1f ms/step | %s tok/s | exposed comm %.2f ms | comm %.2f ms | "
                "%.0f collectives/step | %s/step | peak mem %s | final loss %.4f\n",
                totals_.steps, step_ms, format_count(tokens_per_s).c_str(), exposed, comm_ms, totals_.collectives / n,
                format_bytes(totals_.comm_bytes / n).c_str(), format_bytes(double(memory_stats().peak_total)).c_str(),
                totals_.last_loss);
    const double flops_per_rank = achieved_flops / comm_.size();
    std::printf("model FLOPs: 6N + 12LCT = %.3g per token x %s tok/s = %.3g %s per rank", flops_per_token,
                format_count(tokens_per_s / comm_.size()).c_str(), flops_per_rank >= 1e12 ? flops_per_rank / 1e12 : flops_per_rank / 1e9,
                flops_per_rank >= 1e12 ? "TFLOP/s" : "GFLOP/s");
    if (device_info_.peak_flops > 0) {
      std::printf(" | MFU %.1f%% of %s (%.0f TFLOP/s)", 100.0 * flops_per_rank / device_info_.peak_flops,
                  device_info_.peak_source.c_str(), device_info_.peak_flops / 1e12);
    }
    std::printf("\n");
    std::fflush(stdout);
    JsonObject summary;
    summary.add("type", "summary")
        .add("measured_steps", totals_.steps)
        .add("step_ms", step_ms)
        .add("tokens_per_s", tokens_per_s)
        .add("exposed_comm_ms", exposed)
        .add("comm_ms", comm_ms)
        .add("collectives_per_step", totals_.collectives / n)
        .add("comm_bytes_per_step", totals_.comm_bytes / n)
        .add("peak_mem_bytes", memory_stats().peak_total)
        .add("final_loss", double(totals_.last_loss))
        .add("flops_per_token", flops_per_token);
    if (device_info_.peak_flops > 0) {
      summary.add("mfu", flops_per_rank / device_info_.peak_flops)
          .add("peak_flops", device_info_.peak_flops)
          .add("peak_source", device_info_.peak_source);
    }
    json_.write(summary);
    json_.close();
  }
  if (!cfg_.trace.empty()) write_merged_trace(comm_, cfg_.trace);
}
