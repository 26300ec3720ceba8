// training_run.cpp: TrainingRun's construction (settings from the flags, the checkpoint or the preset;
// the checks; the data; the run header and record), its micro-batches and learning rate, and the
// steps' measurements. Its memory forecast, theory report and checkpoints are in training_run_*.cpp.
// See training_run.h.
#include "training/training_run.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <sstream>

#include "training/checkpoint.h"
#include "ops/device.h"
#include "base/fileio.h"  // writable_problem
#include "training/link_limits.h"  // link_timeout_problem, step_transfers
#include "training/mixed_precision.h"  // MixedPrecision: --precision
#include "model/model.h"
#include "model/moe.h"  // moe_run_problem
#include "ops/ops.h"
#include "training/optimizer.h"
#include "base/output_paths.h"
#include "comm/trace.h"
#include "base/watchdog.h"  // set_device_wait_timeout

namespace {

// Training traffic only: the loss and norm scalars are metrics, not what theory counts.
int64_t training_calls(const CommStats& s) {
  return s.total_calls() - s.kind[int(CollectiveKind::Scalar)].calls;
}
int64_t training_sent_bytes(const CommStats& s) { return s.training_sent_bytes(); }

// Ctrl-C (SIGINT; mpiexec passes it on to every rank), SIGTERM (what schedulers and `kill` send) and
// SIGHUP (a closed terminal) only raise a flag: the ranks agree at the end of the step to stop
// together, write what they measured and exit non-zero. A second Ctrl-C makes mpiexec kill the job
// outright. A file-size limit (ulimit -f) makes a write fail with EFBIG, which the writers report,
// rather than kill the process with SIGXFSZ in the middle of a record.
std::atomic<int> g_signal{0};
void on_signal(int signal) {
  g_signal = signal;
  interrupt_link_emulation();  // a stop never waits out the modelled link (comm.h)
}
void catch_interrupts() {
  struct sigaction action = {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
  std::signal(SIGXFSZ, SIG_IGN);
}

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// "0.5 Gbit/s, 50 us latency", or "unlimited bandwidth, 2000 us latency" for a link that models latency
// alone (0 Gbit/s would read as a link that carries nothing), or "none" when it models nothing.
std::string link_text(const LinkModel& link) {
  if (!link.on()) return "none";
  return (link.gbps > 0 ? number(link.gbps) + " Gbit/s" : std::string("unlimited bandwidth")) + ", " +
         number(link.latency_us) + " us latency";
}

// "1, 2, 4 or 8": the rank counts that split `batch` evenly (with one micro-batch each).
std::string divisors_text(int batch) {
  std::vector<int> d;
  for (int n = 1; n <= batch && d.size() < 12; n++)
    if (batch % n == 0) d.push_back(n);
  std::string text;
  for (size_t i = 0; i < d.size(); i++) text += (i == 0 ? "" : i + 1 == d.size() ? " or " : ", ") + std::to_string(d[i]);
  return text;
}

}  // namespace

TrainingRun::TrainingRun(ProcessGrid& grid, TrainConfig& cfg, const Parallelism& split)
    : world_(grid.world()), dp_(grid.dp_cp()), data_ranks_(grid.shape().dp), data_rank_(grid.coords().dp),
      split_(split), grid_(grid), device_(world_.device()) {
  const TensorParallelism& tp = split.tp;
  const PipelineParallelism& pp = split.pp;
  const ContextParallelism& cp = split.cp;
  ENSURE(tp.size == grid.shape().tp && tp.rank == grid.coords().tp && pp.size == grid.shape().pp &&
             pp.rank == grid.coords().pp,
         "TrainingRun: the split is not the grid's");
  ENSURE(pp.size == 1 || !pp.parts.empty(), "TrainingRun: a pipeline stage needs its model parts");
  // The ranks holding the same experts (11, 12): the layout pads their ranges for them, and ZeRO-1
  // shards their optimizer state over them.
  if (split.moe) split_.ep.replicas = grid.expert_dp().size();
  // The groups the run counts: the world, the data-parallel group where it is another, and those of
  // the grid that its split uses (the tensor-parallel group on any grid but data parallelism's alone).
  groups_.push_back({"world", &world_, {}});
  if (&dp_ != &world_) groups_.push_back({"dp", &dp_, {}});
  if (!grid.data_parallel_only()) groups_.push_back({"tp", &grid.tp(), {}});
  if (pp.size > 1) groups_.push_back({"pp", &grid.pp(), {}});
  if (grid.embedding()) groups_.push_back({"embedding", grid.embedding(), {}});
  if (grid.shape().cp * grid.shape().u > 1) groups_.push_back({"cp", &grid.cp(), {}});
  if (split.moe) groups_.push_back({"ep", &grid.ep(), {}});
  if (split.moe) groups_.push_back({"expert_dp", &grid.expert_dp(), {}});  // the experts' gradients
  ENSURE(cp.size == grid.shape().cp * grid.shape().u && cp.ulysses == grid.shape().u && (cp.size == 1 || cp.on()),
         "TrainingRun: the context-parallel split is not the grid's");
  if (!find_preset(cfg.preset, &model_))
    config_error("--preset: unknown preset '" + cfg.preset + "' (choose from " + preset_names() + ")");
  if (model_.C % model_.NH != 0) config_error("the model's C must divide by NH");
  PrecisionRecipe precision;  // fp32 unless --precision asks otherwise (13 registers and applies its own)
  if (cfg.precision.registered) precision = precision_recipe_from_flags(cfg.precision, cfg);
  // A recipe: this chapter's --precision, or 13's, which installs its formats before the run (every
  // recipe's gradients travel in 2 bytes). Its model's tensors stay fp32 (--dtype auto: fp32).
  const bool recipe = precision.precision != Precision::FP32 || !collective_formats(world_).gradients.fp32;
  dtype_ = pick_dtype(cfg.dtype, device_, recipe);
  // A recipe's collectives move codes encoded on the host (wire_format.cpp), so on a GPU a recipe
  // trains on one rank, where no collective moves a byte.
  if (recipe && device_ == Device::CUDA && world_.size() > 1)
    config_error("--precision other than fp32 on a GPU trains on one rank for now: the collectives in the recipe's "
                 "formats are encoded on the host; run 1 rank, or --device cpu");
  // A mixture of experts under a recipe: its experts' products emulated on the CPU, its router in
  // fp32 (moe.cpp); its layer's rows on a GPU have no recipe path yet.
  if (precision.precision != Precision::FP32 && model_.moe() && device_ != Device::CPU)
    config_error("--precision " + cfg.precision.precision + " with a mixture of experts (--preset " + model_.preset +
                 ") runs on the CPU for now: pass --device cpu, or --precision fp32");
  // A mixture of experts: neither a pipeline stage's layout nor ring attention takes its blocks (08-10).
  if (model_.moe() && !group("ep") && (!pp.parts.empty() || cp.on()))
    config_error("--preset " + model_.preset + " is a mixture of experts, whose blocks " + cfg.chapter + " cannot " +
                 (cp.on() ? "run with ring attention" : "split into pipeline stages") +
                 ": train it with 11_expert_parallel, or with 01-07 on one rank");
  if (model_.moe()) {  // a mixture of experts: where it can run (moe.h)
    const std::string problem = moe_run_problem(model_.preset, cfg.chapter, device_, group("ep") != nullptr, world_.size(),
                                                tp.size, pp.size, cfg.recompute);
    if (!problem.empty()) config_error(problem);
    const MoESettings moe = split.moe ? *split.moe : MoESettings{};
    model_.capacity_factor = moe.capacity_factor;
    model_.aux_loss_coef = moe.aux_loss_coef;
  }
  cfg_ = cfg;
  check_outputs();  // the paths alone: before any file is read
  // A resumed run reads the checkpoint's header first: its settings stand in for absent flags, and
  // its batch decides whether this rank count can take it at all.
  CheckpointHeader header;
  if (!cfg_.resume.empty()) header = read_checkpoint_header(world_, cfg_.resume);
  if (!cfg_.init_from.empty()) {
    const CheckpointHeader start = read_checkpoint_header(world_, cfg_.init_from);
    const std::string other_model = checkpoint_model_problem(cfg_.init_from, start, model_);
    if (!other_model.empty()) config_error(other_model);
    init_from_batch_ = start.global_batch;
  }
  resolve_settings(cfg_.resume.empty() ? nullptr : &header);
  cfg = cfg_;  // the caller sees what the run uses
  if (model_.moe()) {  // the capacity of the global micro-batch (moe.h), once batch and grad-accum are known
    const std::string problem = moe_capacity_problem(model_.capacity_factor, int64_t(cfg_.batch / cfg_.grad_accum) * model_.T,
                                                     model_.top_k, model_.experts);
    if (!problem.empty()) config_error(problem);
  }

  model_.flash_attention = cfg_.attention == "flash";
  parse_recompute(cfg_.recompute, &model_.recompute);  // (checked by parse_train_flags)
  for (const ModelPart& part : split_.pp.parts)
    if (part.split_backward && model_.recompute == Recompute::Full)
      config_error("--recompute full keeps no product's input for the later weight pass of zb-h1, zb-v and dualpipev: use --recompute "
                   "selective, or another --schedule");
  flash_ = model_.flash_attention &&
           flash_attention_available(dtype_, device_, model_.C / split_.tp.size, model_.NH / split_.tp.size);
  micro_B_ = cfg_.batch / (data_ranks_ * cfg_.grad_accum);
  // The dimensions that split this run (data parallelism always), each refusing first what it
  // cannot split, before the layout is built.
  dimensions_ = make_dimensions(dimension_context());
  for (const std::unique_ptr<Dimension>& d : dimensions_) {
    const std::string problem = d->problem(dimension_context());
    if (!problem.empty()) config_error(problem);
  }
  layout_ = build_gpt2_layout(model_, dp_.size(), split_.tp, split_.pp.parts, split_.ep);
  global_layout_ = split_.tp.size > 1 || split_.pp.size > 1 || split_.ep.size > 1 ? build_gpt2_layout(model_, 1) : layout_;
  const std::string slow_link = link_timeout_problem(
      step_transfers(layout_, model_, split_.strategy, int(dtype_size(dtype_)), micro_B_, world_.size(), dp_.size(), split_.tp,
                     split_.pp.size, {cfg_.link_gbps, cfg_.link_latency_us}, tensor_parallel_link()),
      cfg_.timeout_s);
  if (!slow_link.empty()) config_error(slow_link);

  std::string error;
  const bool ok = load_token_data(cfg_.data, model_.T, &data_, &error);
  world_.agree_or_die(ok, error);
  // Every rank reads the file itself: one that changes as it is read (a /proc file, a log being
  // written) would give each rank other data. Rank 0's hash is the run's.
  uint64_t root_hash = data_.hash();
  world_.broadcast_bytes(&root_hash, sizeof root_hash, 0);
  world_.agree_or_die(root_hash == data_.hash(),
                      "--data " + cfg_.data + " reads differently on this rank than on rank 0 (" + data_.description() +
                          "): it changed while the ranks read it, or they see different files; copy it to a "
                          "file that does not change and pass that");
  if (header.has_settings && (header.settings.data_length != uint64_t(data_.length()) ||
                              header.settings.data_hash != data_.hash())) {
    config_error("checkpoint '" + cfg_.resume + "' was trained on other data: " +
                 std::to_string(header.settings.data_length) + " bytes with hash " +
                 std::to_string(header.settings.data_hash) + ", but " + data_.description() + " has hash " +
                 std::to_string(data_.hash()) + "; pass the --data it was trained on");
  }
  // The recipe's collective formats, installed before the forecast, which counts the codes they
  // stage (MixedPrecision installs them again below, with fp16's loss scale: the bytes are the same).
  if (precision.precision != Precision::FP32) set_collective_formats(world_, collective_formats_of(precision, 1.0f));
  // The recipe's products on the CPU keep their rounded operands in scratch of their own (fp32: none).
  // A mixture of experts' expert takes at most the rows its expert-parallel group routes, and at
  // most the capacity of the global micro-batch (moe.h).
  if (precision.precision != Precision::FP32 && device_ == Device::CPU) {
    int64_t expert_rows = 0;
    if (model_.moe()) {
      const int64_t routed = int64_t(micro_B_) * model_.T / cp.size / (tp.sequence_parallel ? tp.size : 1);
      const int64_t capacity = MoELayer::capacity_of(model_.capacity_factor, int64_t(cfg_.batch / cfg_.grad_accum) * model_.T,
                                                     model_.top_k, model_.experts);
      expert_rows = capacity < 0 ? split_.ep.size * routed : std::min<int64_t>(capacity, split_.ep.size * routed);
    }
    precision_scratch_ = precision_scratch_bytes(model_.C, model_.V, int64_t(micro_B_) * model_.T,
                                                 precision.precision == Precision::FP16, expert_rows);
  }
  check_memory();  // before the chapter allocates anything

  // Every micro-batch of a step keeps its own tokens: a pipeline (08) has several in flight, and
  // reads a micro-batch's targets and inputs again in its backward, after others' forwards.
  inputs_.resize(size_t(cfg_.grad_accum) * micro_B_ * model_.T);
  targets_.resize(inputs_.size());
  if (device_ != Device::CPU)
    device_tokens_ = Buffer(2 * int64_t(inputs_.size()), MemCategory::Activations, DType::I32, device_);
  device_info_ = describe_device(device_, dtype_);

  for (Group& g : groups_) g.comm->set_link_model({cfg_.link_gbps, cfg_.link_latency_us});
  if (Communicator* tp_group = group("tp")) tp_group->set_link_model(tensor_parallel_link());
  set_comm_timeout(cfg_.timeout_s);
  set_device_wait_timeout(cfg_.timeout_s);
  enable_tracing(!cfg_.trace.empty());
  catch_interrupts();

  const int N = world_.size();
  if (is_root()) {
    if (!cfg_.json.empty()) {
      json_.open(cfg_.json);
      set_fatal_hook([this](const std::string& error) {
        write_run_record();  // (when the job ends before the first step)
        json_.abort(error);
      });
    }
    // Across hosts (mpiexec -f hostfile), the nodes as MPI sees them: ranks that share memory.
    const std::string nodes = nodes_in_job() > 1 ? " on " + std::to_string(nodes_in_job()) + " nodes (" +
                                                       std::to_string(ranks_on_this_node()) + " on rank 0's node)"
                                                 : "";
    std::printf("%s | %d rank%s%s | preset %s (L=%d C=%d NH=%d T=%d V=%d) | %lld parameters\n", cfg_.chapter.c_str(),
                N, N > 1 ? "s" : "", nodes.c_str(), model_.preset.c_str(), model_.L, model_.C, model_.NH, model_.T,
                model_.V, (long long)global_layout_.num_params);
    if (!grid_.data_parallel_only()) std::printf("grid: %s\n", grid_line().c_str());
    std::printf("global batch %d x %d tokens | %d per data-parallel rank in %d micro-batch%s of %d | data: %s\n",
                cfg_.batch, model_.T, cfg_.batch / data_ranks_, cfg_.grad_accum, cfg_.grad_accum > 1 ? "es" : "",
                micro_B_, data_.description().c_str());
    std::printf("%d steps | lr %s, warm-up %d steps, cosine to lr/10 | weight decay %s | clip %s\n", cfg_.steps,
                number(cfg_.lr).c_str(), cfg_.warmup, number(cfg_.weight_decay).c_str(), number(cfg_.grad_clip).c_str());
    std::printf("device %s | communicator %s | %s | attention %s | recompute %s\n", device_info_.name.c_str(),
                world_.name().c_str(),
                dtype_ == DType::BF16 ? "bf16 mixed precision (fp32 master weights and AdamW state)" : "fp32",
                flash_ ? "flash" : split_.cp.on() ? "ring (blockwise, online softmax)" : "materialized (B,NH,T,T)",
                recompute_name(model_.recompute));
    if (world_.link_model().on())
      std::printf("emulated link: %s (alpha-beta ring model, docs/communicator.md)\n", link_text(world_.link_model()).c_str());
    const LinkModel tp_link = tensor_parallel_link();
    if (group("tp") && split_.tp.size > 1 && (tp_link.gbps != cfg_.link_gbps || tp_link.latency_us != cfg_.link_latency_us))
      std::printf("tensor-parallel group's emulated link: %s (a node's faster links)\n", link_text(tp_link).c_str());
    std::fflush(stdout);
    // Written at the first step, after the chapter's own fields (add_to_run_record).
    run_record_.add("type", "run")
                    .add("chapter", cfg_.chapter)
                    .add("ranks", N)
                    .add("nodes", nodes_in_job())
                    .add("dp", data_ranks_);
    add_dimension_sizes(split_, run_record_);  // "cp", "tp", "sequence_parallel", "pp", "ep"
    run_record_.add("preset", model_.preset)
                    .add("L", model_.L).add("C", model_.C).add("NH", model_.NH).add("T", model_.T).add("V", model_.V)
                    .add("params", int64_t(global_layout_.num_params))
                    .add("rank_params", int64_t(layout_.num_params))
                    .add("padded_params", int64_t(layout_.padded_size))
                    .add("batch", cfg_.batch)
                    .add("grad_accum", cfg_.grad_accum)
                    .add("micro_batch", micro_B_)
                    .add("steps", cfg_.steps)
                    .add("lr", double(cfg_.lr))
                    .add("warmup", cfg_.warmup)
                    .add("seed", int64_t(cfg_.seed))
                    .add("data", data_.description())
                    .add("device", device_info_.name)
                    .add("dtype", dtype_name(dtype_))
                    .add("attention", flash_ ? "flash" : split_.cp.on() ? "ring" : "materialized")
                    .add("recompute", recompute_name(model_.recompute))
                    .add("communicator", world_.name())
                    .add("collectives", cfg_.collectives)
                    .add("link_gbps", cfg_.link_gbps)
                    .add("link_latency_us", cfg_.link_latency_us)
                    .add("tp_link_gbps", tensor_parallel_link().gbps)
                    .add("tp_link_latency_us", tensor_parallel_link().latency_us)
                    .add("forecast_peak_bytes", forecast_.peak())
                    .add("forecast_model_state_bytes", forecast_.model_state)
                    .add("forecast_activations_bytes", forecast_.activations)
                    .add("forecast_transient_bytes", forecast_.transient)
                    .add("forecast_checkpoint_bytes", forecast_.checkpoint)
                    .add(moe_run_fields());
  }
  if (precision.precision != Precision::FP32) {
    // A tensor's amax is the largest over the ranks holding parts of it: the data-parallel group
    // (slices of the batch; under CP, of the sequences too) and the tensor-parallel group (slices of
    // the weights and of the activations between the two halves of a block).
    std::vector<Communicator*> amax_groups{&dp_};
    if (Communicator* tp = group("tp"); tp && split_.tp.size > 1) amax_groups.push_back(tp);
    const int wte = layout_.find("wte");
    precision_ = std::make_unique<MixedPrecision>(precision, cfg_.precision, *this, world_, amax_groups,
                                                  wte >= 0 ? layout_.params[size_t(wte)].offset : -1);
    // An expert's copies live on its expert-data-parallel group only (11, 12): its amaxes are the
    // largest over that group, whose ranks see between them every row routed to the expert.
    if (Communicator* holders = group("expert_dp")) {
      std::vector<int64_t> experts;
      for (const ParamInfo& p : layout_.params)
        if (p.expert >= 0 && p.held() && p.ndim == 2) experts.push_back(p.offset);
      precision_->reduce_experts_over(experts, *holders);
    }
  }
}

// A MoE model's own fields of the run record (beside "ep", which every record has): its experts and
// how they are trained.
JsonObject TrainingRun::moe_run_fields() const {
  JsonObject fields;
  if (!model_.moe()) return fields;
  return fields.add("experts", model_.experts).add("top_k", model_.top_k)
      .add("capacity_factor", model_.capacity_factor).add("aux_loss_coef", model_.aux_loss_coef);
}

// Every dimension the chapter has (its grid flags: --cp, --ulysses, --tp, --pp), sizes of 1 included, so
// that a header names the whole grid whichever sizes were chosen; each dimension says its own words.
std::string TrainingRun::grid_line() const {
  std::string line = std::to_string(data_ranks_) + " data-parallel";
  line += dimension_grid_words(split_, [&](const std::string& flag) { return cfg_.chapter_takes(flag); });
  if (split_.cp.on())
    line += " | each rank holds " + std::to_string(split_.cp.positions.size()) + " of the " + std::to_string(model_.T) +
            " positions of every sequence";
  return line + " | " + std::to_string(layout_.num_params) + " parameters " +
         (split_.pp.parts.empty() ? "a rank" : "on rank 0");
}

Communicator* TrainingRun::group(const std::string& name) const {
  for (const Group& g : groups_)
    if (g.name == name) return g.comm;
  return nullptr;
}

void TrainingRun::add_to_run_record(const JsonObject& fields) {
  ENSURE(!run_record_written_, "add_to_run_record after the run record was written (the first begin_step)");
  run_record_.add(fields);
}

void TrainingRun::write_run_record() {
  if (is_root() && !run_record_written_.exchange(true)) json_.write(run_record_);
}

LinkModel TrainingRun::tensor_parallel_link() const {
  return {cfg_.tp_link_gbps >= 0 ? cfg_.tp_link_gbps : cfg_.link_gbps,
          cfg_.tp_link_latency_us >= 0 ? cfg_.tp_link_latency_us : cfg_.link_latency_us,
          cfg_.chapter_takes("--tp-link-gbps") ? "--tp-link" : "--link"};
}

TrainingRun::~TrainingRun() {
  if (async_.writer.joinable()) async_.writer.join();  // (finish() has waited already but on an error path)
  set_fatal_hook(nullptr);
}  // the hook writes into this run's JSON

// Each setting: the flag where given; else, resuming, the checkpoint's; else the preset's (batch,
// lr) or a default. A flag that contradicts the checkpoint is refused, naming both values: the run
// would continue another trajectory than the one the checkpoint belongs to.
void TrainingRun::resolve_settings(const CheckpointHeader* resumed) {
  const bool settings = resumed && resumed->has_settings;
  const std::string file = resumed ? "checkpoint '" + cfg_.resume + "'" : "";
  auto conflict = [&](const std::string& flag, const std::string& given, const std::string& saved) {
    config_error(flag + " " + given + " differs from the " + saved + " that " + file +
                 " was trained with (the resumed run would follow another schedule); leave " + flag +
                 " out to continue with the checkpoint's, or start a new run without --resume");
  };
  auto take_int = [&](const std::string& flag, int* value, int64_t saved, bool known) {
    if (!known) return;
    if (cfg_.was_given(flag) && *value != saved) conflict(flag, std::to_string(*value), std::to_string(saved));
    *value = int(saved);
  };
  auto take_float = [&](const std::string& flag, float* value, double saved) {
    if (!settings) return;
    if (cfg_.was_given(flag) && double(*value) != saved) conflict(flag, number(*value), number(saved));
    *value = float(saved);
  };
  if (resumed) {
    const std::string other_model = checkpoint_model_problem(cfg_.resume, *resumed, model_);
    if (!other_model.empty()) config_error(other_model);
    take_int("--batch", &cfg_.batch, resumed->global_batch, true);
    take_int("--steps", &cfg_.steps, resumed->settings.steps, settings);
    take_int("--warmup", &cfg_.warmup, resumed->settings.warmup, settings);
    take_float("--lr", &cfg_.lr, resumed->settings.lr);
    take_float("--weight-decay", &cfg_.weight_decay, resumed->settings.weight_decay);
    take_float("--grad-clip", &cfg_.grad_clip, resumed->settings.grad_clip);
    if (resumed->has_moe_settings && model_.moe()) resolve_moe_settings(*resumed);
    if (resumed->step > cfg_.steps)
      config_error(file + " is at step " + std::to_string(resumed->step) + ", past --steps " + std::to_string(cfg_.steps));
    // Nothing would run: say so, rather than run 0 steps and report a success with no numbers.
    if (resumed->step == cfg_.steps)
      config_error(file + " already holds all " + std::to_string(cfg_.steps) +
                   " steps of its schedule (the learning rate has decayed to its end): there is nothing to resume. "
                   "A longer run needs a new schedule: --init-from " + cfg_.resume +
                   " --steps N starts one from its weights (new warm-up and decay, fresh AdamW moments)");
  }
  if (!cfg_.was_given("--batch") && !resumed) cfg_.batch = model_.default_batch;
  if (!cfg_.was_given("--lr") && !settings) cfg_.lr = model_.default_lr;
  if (!cfg_.was_given("--warmup") && !settings) cfg_.warmup = cfg_.steps / 10;
  if (cfg_.warmup > cfg_.steps)  // the learning rate would never reach --lr, and the cosine never start
    config_error("--warmup " + std::to_string(cfg_.warmup) + " is longer than the run's " + std::to_string(cfg_.steps) +
                 " steps: the learning rate would never reach --lr; give a --warmup of at most --steps");

  const int N = data_ranks_, per_step = N * cfg_.grad_accum;
  if (cfg_.batch % per_step == 0) return;
  if (resumed && !cfg_.was_given("--batch")) {
    config_error(file + " was trained with a global batch of " + std::to_string(cfg_.batch) +
                 " sequences, which cannot be split over " + std::to_string(N) + " ranks x " +
                 std::to_string(cfg_.grad_accum) + " micro-batches = " + std::to_string(per_step) +
                 " (the data order needs the same batch): resume it on a rank count that divides the batch (" +
                 divisors_text(cfg_.batch) + " ranks, with a " + cfg_.accumulation_flag() + " that divides what each gets)");
  }
  const int suggestion = (cfg_.batch / per_step + 1) * per_step;
  // A pipeline's micro-batches are its accumulation (08 takes them as --micro-batches); with other
  // groups in the grid, only the data-parallel ranks split the batch.
  const std::string ranks = data_ranks_ == world_.size() ? "ranks" : "data-parallel ranks";
  const std::string accumulation = cfg_.accumulation_flag().substr(2);
  config_error("--batch " + std::to_string(cfg_.batch) + " is not divisible by " + ranks + " x " + accumulation + " = " +
               std::to_string(N) + " x " + std::to_string(cfg_.grad_accum) + " = " + std::to_string(per_step) +
               "; try --batch " + std::to_string(suggestion));
}

// A MoE checkpoint's capacity factor and balance-loss coefficient, and with either its --grad-accum
// (they are per micro-batch, moe.h): as the settings above in chapter 11, whose flags they are.
// Elsewhere a MoE model trains with neither, so a checkpoint that had one is refused there.
void TrainingRun::resolve_moe_settings(const CheckpointHeader& resumed) {
  const TrainingSettings& saved = resumed.settings;
  const std::string file = "checkpoint '" + cfg_.resume + "'";
  auto conflict = [&](const std::string& flag, const std::string& given, const std::string& was) {
    config_error(flag + " " + given + " differs from the " + was + " that " + file +
                 " was trained with (the resumed run would follow another trajectory); leave " + flag +
                 " out to continue with the checkpoint's, or start a new run without --resume");
  };
  auto take = [&](const std::string& flag, double* value, double was) {
    if (cfg_.was_given(flag) && *value != was) conflict(flag, number(*value), number(was));
    *value = was;
  };
  if (group("ep")) {
    take("--capacity-factor", &model_.capacity_factor, saved.capacity_factor);
    take("--aux-loss-coef", &model_.aux_loss_coef, saved.aux_loss_coef);
  } else if (saved.capacity_factor != model_.capacity_factor || saved.aux_loss_coef != model_.aux_loss_coef) {
    config_error(file + " was trained by 11_expert_parallel with --capacity-factor " + number(saved.capacity_factor) +
                 " and --aux-loss-coef " + number(saved.aux_loss_coef) + ", but " + cfg_.chapter +
                 " trains a mixture of experts with neither (another trajectory); resume it with "
                 "11_expert_parallel, or pass it to --init-from for its weights only");
  }
  // Without either, any count trains alike. A pipeline's schedule is already built for its count
  // (12 takes the checkpoint's as its default, micro_batches_a_resume_keeps): another is refused.
  const bool per_micro_batch = model_.capacity_factor > 0 || model_.aux_loss_coef > 0;
  if (per_micro_batch && saved.grad_accum != cfg_.grad_accum) {
    const std::string flag = cfg_.accumulation_flag();
    if (cfg_.was_given(flag) || !split_.pp.actions.empty())
      config_error(flag + " " + std::to_string(cfg_.grad_accum) + " differs from the " +
                   std::to_string(saved.grad_accum) + " that " + file +
                   " was trained with: its capacity and balance loss are per micro-batch (moe.h), so another count "
                   "would follow another trajectory; leave " + flag + " out to continue with the checkpoint's");
    cfg_.grad_accum = int(saved.grad_accum);
  }
}

// Every file the run will write, checked now, so that a typo in a folder does not cost the run, and
// no output replaces an input, another output or a device (output_paths.h).
void TrainingRun::check_outputs() {
  std::string problem;
  if (is_root()) {
    const RunPaths paths = {cfg_.data, cfg_.resume, cfg_.init_from, cfg_.save, cfg_.json, cfg_.trace};
    problem = run_paths_problem(paths);
    if (problem.empty()) problem = lock_outputs(paths);  // held by rank 0, which writes them, until finish()
  }
  world_.agree_or_die(problem.empty(), problem);
}


MicroBatch TrainingRun::micro_batch(int step, int micro) {
  // no_sync (02, 03) promises no communication before the last micro-batch: measure it.
  if (micro == cfg_.grad_accum - 1)
    launched_before_last_micro_ = all_stats().total_launched() - comm_at_step_start_.total_launched();
  // By data-parallel rank: the ranks of a tensor-parallel group train on the same sequences. A MoE
  // model's micro-batch m is the step's m-th B/grad_accum on any grid (training_run.h).
  const int per_rank = cfg_.batch / data_ranks_;
  const int first = model_.moe() ? micro * (cfg_.batch / cfg_.grad_accum) + data_rank_ * micro_B_
                                 : data_rank_ * per_rank + micro * micro_B_;
  const int64_t n = int64_t(micro_B_) * model_.T;
  int* inputs = inputs_.data() + micro * n;
  int* targets = targets_.data() + micro * n;
  data_.fill(step, cfg_.batch, first, micro_B_, model_.T, inputs, targets);
  if (device_ == Device::CPU) return {inputs, targets, micro_B_};
  // Uploaded once per micro-batch, so the ops read device memory (ops_cuda.h).
  Tensor on_device = device_tokens_.view().slice1d(2 * micro * n, 2 * n);
  transfer(on_device.slice1d(0, n), make_view(inputs, {n}, DType::I32));
  transfer(on_device.slice1d(n, n), make_view(targets, {n}, DType::I32));
  return {on_device.i32(), on_device.i32() + n, micro_B_};
}

float TrainingRun::lr(int step) const { return learning_rate(cfg_, cfg_.lr, step); }

CommStats TrainingRun::all_stats() const {
  CommStats sum;
  for (const Group& g : groups_) sum += g.comm->stats();
  return sum;
}

void TrainingRun::add_group(const std::string& name, Communicator& comm) {
  comm.set_link_model({cfg_.link_gbps, cfg_.link_latency_us});
  groups_.push_back({name, &comm, comm.stats()});
}

void TrainingRun::begin_step(int step) {
  write_run_record();
  set_error_phase("step " + std::to_string(step));
  run_peak_bytes_ = std::max(run_peak_bytes_, memory_stats().peak_total);  // the summary's peak is the run's
  reset_memory_peaks();  // each step's own peak, for its line and record
  for (Group& g : groups_) g.at_step_start = g.comm->stats();
  comm_at_step_start_ = all_stats();
  step_start_ms_ = now_ms();
  matmul_at_step_start_ = cpu_matmul_ms();
  matmul_by_rows_at_step_start_ = cpu_matmul_by_rows();
}

void TrainingRun::end_step(int step, float local_loss, double grad_norm,
                           const std::vector<std::vector<int64_t>>& expert_rows) {
  expert_rows_ = expert_rows;
  if (precision_) grad_norm = precision_->after_step(step, grad_norm);  // fp16: an overflow is a skipped step
  // Everything the step measures is read before the loss is averaged: that scalar is bookkeeping.
  // On a GPU the host is ahead of the device (ops only queue kernels): the step ends when the
  // device has run them.
  synchronize(device_);
  for (Group& g : groups_) g.comm->collect_stats();
  const double step_end_ms = now_ms(), step_ms = step_end_ms - step_start_ms_;
  trace_span(Track::Compute, "step " + std::to_string(step), step_start_ms_, step_end_ms);
  CommStats step_comm, dp_step;
  std::vector<std::pair<std::string, CommStats>> by_group;
  for (const Group& g : groups_) {
    const CommStats d = g.comm->stats().since(g.at_step_start);
    step_comm += d;
    by_group.emplace_back(g.name, d);
    if (g.name == "dp" || (g.name == "world" && &dp_ == &world_)) dp_step = d;  // (the world: its data split)
  }
  // A pipeline stage waiting for a receive has nothing to compute: that is its bubble (08 measures
  // and prints it), not communication the step could have hidden; and its receives, posted at the
  // start of the step, are "in flight" until their data comes. The pipeline group's time is left
  // out of exposed and total communication (its bytes stay in).
  double pipeline_waits = 0, comm_ms = step_comm.in_flight_ms;
  for (const auto& [name, d] : by_group)
    if (name == "pp") pipeline_waits = d.exposed_ms, comm_ms -= d.in_flight_ms;
  const double exposed_ms = step_comm.exposed_ms - pipeline_waits;
  const MemoryStats& mem = memory_stats();
  // Every rank of a tensor-parallel group has the same loss, and only a pipeline's last stage has one:
  // the sum over the world, over the ranks that hold a loss, is the average over the data-parallel
  // ranks.
  const double loss_holders = double(world_.size()) / split_.pp.size;
  // A MoE model's stages each add their blocks' share of the balance loss, and the ranks of a
  // tensor-parallel group each their own share (moe.h): every rank counts.
  const bool counts = holds_loss() || model_.moe();
  const float loss = float(world_.all_reduce_scalar(counts ? local_loss : 0.0, ReduceOp::Sum) / loss_holders);
  // Whether to go on, agreed by all: the largest reason any rank has to stop.
  const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
  const int reason = !finite ? int(Stop::Diverged) : g_signal != 0 ? int(Stop::Interrupted) : int(Stop::No);
  stop_ = Stop(int(world_.all_reduce_scalar(reason, ReduceOp::Max)));
  last_step_ = step;
  // The largest share of one call that any rank sent or received, per kind of collective: (N-1)/N
  // when every reduce-scatter and all-gather is balanced (comm.h). Every rank made the same calls.
  // (The same six reductions on every rank, whatever each counted: a count that differed between ranks
  // would make them issue different collectives.) The shares are the largest so far in the run.
  double max_share[kCollectiveKinds][2] = {};
  for (CollectiveKind k : {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter, CollectiveKind::AllGather}) {
    const CollectiveCounters& c = step_comm.kind[int(k)];
    max_share[int(k)][0] = world_.all_reduce_scalar(c.max_sent_share, ReduceOp::Max);
    max_share[int(k)][1] = world_.all_reduce_scalar(c.max_received_share, ReduceOp::Max);
  }
  const double tokens_per_s = double(cfg_.batch) * model_.T / (step_ms / 1e3);

  count_step_during_save(step, step_ms);
  if (step > 0) {  // step 0 is warm-up
    totals_.steps++;
    totals_.step_ms += step_ms;
    totals_.exposed_ms += exposed_ms;
    totals_.comm_ms += comm_ms;
    totals_.tokens_per_s += tokens_per_s;
    totals_.collectives += double(training_calls(step_comm));
    totals_.comm_bytes += double(training_sent_bytes(step_comm));
  }
  totals_.last_loss = loss;
  if (!is_root()) return;

  if (!cfg_.quiet) {
    const StepLine line{step, cfg_.steps, double(loss), double(lr(step)), grad_norm, step_ms, tokens_per_s, exposed_ms,
                        double(mem.peak_total)};
    std::printf("%s\n", step_line(line).c_str());
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
      .add("exposed_comm_ms", exposed_ms)
      .add("pipeline_waits_ms", pipeline_waits)
      .add("comm_ms", comm_ms)
      .add("matmul_ms", cpu_matmul_ms() - matmul_at_step_start_)  // root's, on the CPU (ops.h)
      .add("comm_bytes", training_sent_bytes(step_comm))
      .add("comm_received_bytes", step_comm.total_received_bytes() - step_comm.kind[int(CollectiveKind::Scalar)].received_bytes)
      .add("collectives", training_calls(step_comm))
      .add("launched_before_last_micro", launched_before_last_micro_);
  // The products by the rows of their activations (ops.h): matmul_ms_rows<N> and matmul_flops_rows<N>
  // for the class of rows [N, 2N), where the step ran any; the planner's rate per class.
  const MatmulByRows by_rows = cpu_matmul_by_rows();
  for (int b = 0; b < kMatmulRowClasses; b++) {
    const double flops = by_rows.flops[b] - matmul_by_rows_at_step_start_.flops[b];
    if (flops <= 0) continue;
    const std::string rows = std::to_string(int64_t(1) << b);
    record.add("matmul_ms_rows" + rows, by_rows.ms[b] - matmul_by_rows_at_step_start_.ms[b])
        .add("matmul_flops_rows" + rows, flops);
  }
  for (int k = 0; k < kCollectiveKinds; k++) {
    const CollectiveCounters& c = step_comm.kind[k];
    if (!c.calls) continue;
    const std::string name = collective_name(CollectiveKind(k));
    record.add("calls_" + name, c.calls);
    if (max_share[k][0] > 0 || max_share[k][1] > 0)  // the largest so far in the run
      record.add("max_sent_share_" + name, max_share[k][0]).add("max_received_share_" + name, max_share[k][1]);
  }
  for (int c = 0; c < kMemCategories; c++) record.add(std::string("mem_") + mem_category_name(MemCategory(c)), mem.peak[c]);
  record.add("mem_total", mem.peak_total);
  // Each group apart: what tensor or pipeline parallelism costs, next to data parallelism.
  for (const auto& [name, d] : by_group) {
    if (name == "world") continue;
    record.add(name + "_comm_bytes", training_sent_bytes(d))
        .add(name + "_exposed_comm_ms", d.exposed_ms)
        .add(name + "_comm_ms", d.in_flight_ms)
        .add(name + "_collectives", training_calls(d));
    for (CollectiveKind k : {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter, CollectiveKind::AllGather,
                             CollectiveKind::SendRecv, CollectiveKind::AllToAll})
      if (d.kind[int(k)].calls) record.add(name + "_bytes_" + collective_name(k), d.kind[int(k)].sent_bytes);
  }
  json_.write(record);
  if (step >= 1 && !reported_theory_) report_vs_theory({dp_step, by_group, expert_rows_});
  if (stop_ == Stop::Diverged) {
    std::fprintf(stderr, "error: the loss or the gradient norm is not finite at step %d (loss %g, gradient norm %g): "
                 "training diverged; lower --lr (now %g) or raise --warmup. Every rank stops here.\n",
                 step, double(loss), grad_norm, double(cfg_.lr));
    std::fflush(stderr);
  } else if (stop_ == Stop::Interrupted) {
    std::printf("interrupted after step %d: every rank stops here; what was measured is written\n", step);
    std::fflush(stdout);
  }
}
