// training_run_checkpoint.cpp: TrainingRun's checkpoints: the initial weights or a resumed checkpoint,
// saving one, and the mapping between the whole model's flat arrays (what a file holds) and this
// rank's slices of them. See training_run.h.
#include "training/training_run.h"

#include <cstdio>

#include "training/checkpoint.h"
#include "training/checkpoint_sharded.h"  // is_sharded_path
#include "training/mixed_precision.h"  // MixedPrecision::save, load
#include "model/model.h"  // GPT2::init_weights
#include "ops/ops.h"    // copy_tensor, convert_tensor, fill_zero
#include "comm/trace.h"  // now_ms

TrainingSettings TrainingRun::settings() const {
  TrainingSettings s;
  s.steps = cfg_.steps;
  s.warmup = cfg_.warmup;
  s.lr = cfg_.lr;
  s.weight_decay = cfg_.weight_decay;
  s.grad_clip = cfg_.grad_clip;
  s.data_length = uint64_t(data_.length());
  s.data_hash = data_.hash();
  s.capacity_factor = model_.capacity_factor;
  s.aux_loss_coef = model_.aux_loss_coef;
  s.grad_accum = cfg_.grad_accum;
  return s;
}

int micro_batches_a_resume_keeps(Communicator& world, const TrainConfig& cfg, const GPT2Config& model) {
  if (cfg.resume.empty() || !model.moe()) return 0;
  const CheckpointHeader header = read_checkpoint_header(world, cfg.resume);
  if (!header.has_moe_settings || header.experts != model.experts) return 0;  // (refused as another model later)
  const TrainingSettings& saved = header.settings;
  return saved.capacity_factor > 0 || saved.aux_loss_coef > 0 ? int(saved.grad_accum) : 0;
}

namespace {

// A full padded fp32 copy, in host memory, of `values`: a full flat buffer (a plain copy) or this
// rank's shard of `plan` (every rank's shard gathered, then put in place: group by group of the plan,
// each over its communicator, `groups[g]`). Transient, counted as "other". Simple rather than lean:
// while saving, every rank briefly holds full parameters, m and v, and rank 0 the file's bytes too
// (the memory forecast counts 6 full copies). A model that does not fit that would gather to rank 0
// tensor by tensor instead.
Buffer gather_full(const std::vector<Communicator*>& groups, const ShardPlan& plan, Tensor values) {
  ENSURE(values.dtype == DType::F32, "checkpoints hold fp32 values");
  Buffer full(plan.flat_size(), MemCategory::Other);
  if (values.numel() == plan.flat_size()) {
    transfer(full.view(), values);
    return full;
  }
  ENSURE(values.numel() == plan.size(), "gather_full: neither a full buffer nor this rank's shard");
  ENSURE(int(groups.size()) >= plan.groups(), "gather_full: a communicator for every group of the plan");
  for (int g = 0; g < plan.groups(); g++) {
    Communicator& comm = *groups[size_t(g)];
    const int64_t packed = plan.group_size(g);
    ENSURE(comm.size() == plan.ranks(g) && comm.rank() == plan.rank(g), "gather_full: a group is not the plan's");
    Buffer gathered(packed * plan.ranks(g), MemCategory::Other, values.device);
    Tensor mine = gathered.view().slice1d(packed * plan.rank(g), packed);
    plan.pack_group(values, g, mine);
    comm.all_gather(mine, gathered.view());
    if (values.device == Device::CPU) {
      plan.assemble_full(gathered.view(), full.view(), g);
      continue;
    }
    Buffer host(packed * plan.ranks(g), MemCategory::Other);
    transfer(host.view(), gathered.view());
    plan.assemble_full(host.view(), full.view(), g);
  }
  return full;
}

// dst (a full buffer, or this rank's shard of `plan`; on any device, fp32 or bf16) = host_f32 (full),
// rounded to dst's dtype on the host first.
void upload(Tensor dst, Tensor host_f32, const ShardPlan& plan) {
  Buffer converted;
  if (dst.dtype != host_f32.dtype) {
    converted = Buffer(host_f32.numel(), MemCategory::Other, dst.dtype, Device::CPU);
    convert_tensor(converted.view(), host_f32);
    host_f32 = converted.view();
  }
  if (dst.numel() == host_f32.numel()) return transfer(dst, host_f32);
  plan.copy_to_shard(host_f32, dst);
}

}  // namespace

// With tensor or pipeline parallelism, checkpoints and the initial weights are the whole model's
// tensors, and a rank's part is its slices of its stage's tensors: every grid starts from the same
// model and saves the same file.
Buffer TrainingRun::to_local(Buffer global) const {
  if (split_.tp.size == 1 && split_.pp.size == 1 && split_.ep.size == 1) return global;
  Buffer local(layout_.padded_size, MemCategory::Other);
  slice_from_global(global_layout_, global.f32(), layout_, local.f32());
  return local;
}

Buffer TrainingRun::to_global(Buffer local) const {
  if (split_.tp.size == 1 && split_.pp.size == 1 && split_.ep.size == 1) return local;
  // Any grid, one way: every rank places its own slices into the whole model's zeros, then leaves in
  // only what it alone must count, so that a sum over the world holds each element exactly once (a
  // sum of one value and zeros is exact): the first of its copies along every axis (its placement,
  // ParamInfo::counts_here). A tensor tensor parallelism splits counts on every TP rank (each its
  // slice), one it holds whole on TP rank 0; any tensor on the first data replica, wte on the first
  // stage, an expert on the first replica of its holders.
  Buffer global(global_layout_.padded_size, MemCategory::Other);  // zeros
  place_into_global(layout_, local.f32(), global_layout_, global.f32());
  for (size_t i = 0; i < layout_.params.size(); i++) {
    const ParamInfo& p = layout_.params[i];
    const ParamInfo& whole = global_layout_.params[i];
    if (p.held() && !p.counts_here(grid_.coords(), kEveryAxis)) fill_zero(global.view().slice1d(whole.offset, whole.size));
  }
  world_.all_reduce(global.view(), ReduceOp::Sum);
  return global;
}

int TrainingRun::init_or_resume(Tensor params, AdamW& optimizer) {
  if (precision_ && !cfg_.resume.empty()) precision_->load(cfg_.resume, layout_, world_);  // the loss scale, amaxes
  const ShardPlan& plan = optimizer.plan();
  // A folder: each rank reads only the slices its own part needs (training_run_sharded.cpp).
  if (!cfg_.init_from.empty() && is_sharded_path(cfg_.init_from)) {
    const int trained = load_sharded_checkpoint(cfg_.init_from, true, params, optimizer);
    if (is_root())
      std::printf("started from the weights of %s (after its %d steps), on a new schedule of %d steps\n",
                  cfg_.init_from.c_str(), trained, cfg_.steps);
    return 0;
  }
  const double start = now_ms();  // (the load's time is printed: make bench-checkpoint reads it)
  if (!cfg_.resume.empty() && is_sharded_path(cfg_.resume)) {
    const int step = load_sharded_checkpoint(cfg_.resume, false, params, optimizer);
    if (is_root()) std::printf("resumed from %s at step %d in %.1f ms\n", cfg_.resume.c_str(), step, now_ms() - start);
    return step;
  }
  Buffer global_params(global_layout_.padded_size, MemCategory::Other);
  int64_t step = 0;
  if (!cfg_.init_from.empty()) {
    // Its weights only: the schedule, the step count and AdamW's moments start afresh (a moment
    // estimate belongs to the learning rates that made it).
    Buffer unused_m(global_layout_.padded_size, MemCategory::Other), unused_v(global_layout_.padded_size, MemCategory::Other);
    const int64_t trained = load_checkpoint(world_, cfg_.init_from, model_, global_layout_, init_from_batch_,
                                            global_params.f32(), unused_m.f32(), unused_v.f32());
    if (is_root())
      std::printf("started from the weights of %s (after its %lld steps), on a new schedule of %d steps\n",
                  cfg_.init_from.c_str(), (long long)trained, cfg_.steps);
  } else if (cfg_.resume.empty()) {
    GPT2::init_weights(global_layout_, cfg_.seed, global_params.f32());
  } else {
    Buffer global_m(global_layout_.padded_size, MemCategory::Other), global_v(global_layout_.padded_size, MemCategory::Other);
    step = load_checkpoint(world_, cfg_.resume, model_, global_layout_, cfg_.batch, global_params.f32(),
                           global_m.f32(), global_v.f32());
    plan.copy_to_shard(to_local(std::move(global_m)).view(), optimizer.m());
    plan.copy_to_shard(to_local(std::move(global_v)).view(), optimizer.v());
    if (is_root())
      std::printf("resumed from %s at step %lld in %.1f ms\n", cfg_.resume.c_str(), (long long)step, now_ms() - start);
  }
  const Buffer full_params = to_local(std::move(global_params));
  if (optimizer.mixed_precision()) plan.copy_to_shard(full_params.view(), optimizer.master());
  upload(params, full_params.view(), plan);
  return int(step);
}

bool TrainingRun::checkpoint_due(int step) const {
  if (cfg_.save.empty() || stop_ == Stop::Diverged) return false;
  return step == cfg_.steps - 1 || stop_ == Stop::Interrupted ||
         (cfg_.save_every > 0 && (step + 1) % cfg_.save_every == 0);
}

void TrainingRun::save_checkpoint(int next_step, Tensor params, AdamW& optimizer) {
  const std::string path = checkpoint_path(cfg_.save, next_step);  // "{step}" keeps one per checkpoint
  if (precision_) precision_->save(path, layout_, world_);  // beside it: the loss scale, amaxes
  if (is_sharded_path(path)) {  // a folder: every rank writes its own slices
    save_sharded_checkpoint(path, next_step, params, optimizer);
    if (is_root() && stop_ == Stop::Interrupted) {
      std::printf("saved the %d completed steps to %s\n", next_step, path.c_str());
      std::fflush(stdout);
    }
    return;
  }
  const double start = now_ms();
  const ShardPlan& plan = optimizer.plan();
  // The plan's groups: the data-parallel group, and a MoE model's experts' replicas (12's ZeRO-1).
  const std::vector<Communicator*> groups = {&dp_, group("expert_dp")};
  // Under mixed precision the weights are the fp32 master copy, which covers the optimizer's shard.
  Buffer full_params = to_global(gather_full(groups, plan, optimizer.mixed_precision() ? optimizer.master() : params));
  Buffer full_m = to_global(gather_full(groups, plan, optimizer.m()));
  Buffer full_v = to_global(gather_full(groups, plan, optimizer.v()));
  CheckpointData data;
  data.step = next_step;
  data.global_batch = cfg_.batch;
  data.seed = cfg_.seed;
  data.settings = settings();
  data.params = full_params.f32();
  data.adam_m = full_m.f32();
  data.adam_v = full_v.f32();
  ::save_checkpoint(world_, path, model_, global_layout_, data);
  if (is_root()) {  // beside the sharded folder's record (training_run_sharded.cpp), for make bench-checkpoint
    JsonObject record;
    record.add("type", "checkpoint").add("step", next_step).add("path", path).add("save_ms", now_ms() - start);
    record.add("asynchronous", false).add("sharded", false);
    json_.write(record);
  }
  if (is_root() && stop_ == Stop::Interrupted) {
    std::printf("saved the %d completed steps to %s\n", next_step, path.c_str());
    std::fflush(stdout);
  }
}
