// training_run_sharded.cpp: TrainingRun's sharded checkpoints (checkpoint_sharded.h): which slices
// this rank alone writes, the staged copy they are written from, and the slices a rank reads back on
// whatever grid it runs. See training_run.h.
#include <algorithm>
#include <cstdio>

#include "checkpoint_sharded.h"
#include "ops.h"  // convert_tensor
#include "trace.h"  // now_ms
#include "training_run.h"

namespace {

// The elements [o, o + n) of the local flat array whose values `src` holds: a full flat buffer, or
// this rank's shard of `plan` (the elements must then lie in one of its pieces).
Tensor local_elements(const Tensor& src, const ShardPlan& plan, int64_t o, int64_t n) {
  if (src.numel() == plan.flat_size()) return src.slice1d(o, n);
  for (int i = 0; i < plan.count(); i++) {
    const FlatRange piece = plan.piece(i);
    if (o >= piece.begin && o + n <= piece.end) return plan.piece_of_shard(src, i).slice1d(o - piece.begin, n);
  }
  ENSURE(false, "local_elements: not in this rank's shard");
  return src;
}

SliceKey part_key(const ParamInfo& p, int tensor, int array, int64_t begin, int64_t end) {
  SliceKey k;
  k.tensor = tensor;
  k.array = array;
  k.shard = p.shard;
  k.rows = p.shape[0];
  k.cols = p.ndim == 2 ? p.shape[1] : 1;
  k.begin = begin;
  k.end = end;
  return k;
}

}  // namespace

// The one rule of which copy a checkpoint keeps, as to_global() counts it: among the ranks that hold
// the same values of a tensor, the first. `replicas_split`: the ranks that hold the same parameters
// (the data-parallel group, or an expert's replicas) split them into pieces, each writing its own.
bool TrainingRun::saves_copy(const ParamInfo& p, bool replicas_split) const {
  const GridCoords& at = grid_.coords();
  if (p.expert >= 0) return replicas_split || at.edp == 0;
  return (replicas_split || (at.dp == 0 && at.cp == 0)) && (!p.shard.whole() || at.tp == 0) &&
         !(p.name == "wte" && at.pp != 0);
}

// Each element once: a tensor's part on the replica that saves_copy() names, cut by the optimizer's
// plan where it shards (each rank its pieces). Where the plan shards nothing, the data-parallel ranks
// split the writing anyway (each 1/N of every unit: their copies are equal), so that every rank
// writes, not the first alone. An expert's tensor, unless its replicas shard it, is written whole.
std::vector<TrainingRun::Span> TrainingRun::owned_spans(const ShardPlan& plan) const {
  const bool split_replicas = plan.groups() == 1 && plan.ranks(0) == 1 && dp_.size() > 1;
  const ShardPlan write = split_replicas ? ShardPlan({{0, layout_.padded_size}}, dp_.size(), dp_.rank()) : plan;
  const bool experts_sharded = plan.groups() > 1 && plan.ranks(1) > 1;
  std::vector<Span> spans;
  for (size_t t = 0; t < layout_.params.size(); t++) {
    const ParamInfo& p = layout_.params[t];
    if (!p.held()) continue;
    if (p.expert >= 0 && !experts_sharded) {
      if (saves_copy(p, false)) spans.push_back({int(t), 0, p.size});
      continue;
    }
    for (int i = 0; i < write.count(); i++) {
      const FlatRange piece = write.piece(i);
      const int64_t lo = std::max(p.offset, piece.begin), hi = std::min(p.offset + p.size, piece.end);
      if (lo < hi && saves_copy(p, write.ranks(write.group_of(i)) > 1))
        spans.push_back({int(t), lo - p.offset, hi - p.offset});
    }
  }
  return spans;
}

void TrainingRun::save_sharded_checkpoint(const std::string& path, int next_step, Tensor params, AdamW& optimizer) {
  const double start = now_ms();
  const ShardPlan& plan = optimizer.plan();
  const std::vector<Span> spans = owned_spans(plan);
  int64_t owned = 0;
  for (const Span& s : spans) owned += s.end - s.begin;
  // The staged copy: this rank's slices of the parameters, then of m, then of v, on the host.
  Buffer staged(3 * owned, MemCategory::Other);
  const Tensor sources[3] = {optimizer.mixed_precision() ? optimizer.master() : params, optimizer.m(), optimizer.v()};
  std::vector<SliceKey> keys;
  int64_t at = 0;
  for (int array = 0; array < 3; array++) {
    ENSURE(sources[array].dtype == DType::F32, "checkpoints hold fp32 values");
    for (const Span& s : spans) {
      const ParamInfo& p = layout_.params[size_t(s.tensor)];
      const int64_t n = s.end - s.begin;
      transfer(staged.view().slice1d(at, n), local_elements(sources[array], plan, p.offset + s.begin, n));
      keys.push_back(part_key(p, s.tensor, array, s.begin, s.end));
      at += n;
    }
  }
  CheckpointData data;
  data.step = next_step;
  data.global_batch = cfg_.batch;
  data.seed = cfg_.seed;
  data.settings = settings();
  const ShardedSaveSizes sizes = save_sharded(world_, path, model_, global_layout_, data, keys, staged.f32());
  const double ms = now_ms() - start;
  if (!is_root()) return;
  // Each element of the model once, in three arrays of fp32: 12 bytes per parameter (docs/theory.md).
  int64_t total = 0;
  std::string per_rank;
  for (int64_t b : sizes.rank_bytes) {
    total += b;
    per_rank += (per_rank.empty() ? "" : " ") + std::to_string(b);
  }
  const int64_t predicted = 12 * global_layout_.num_params;
  std::printf("checkpoint %s: %d shard files, bytes per rank [%s] (12 x its owned elements), sum %lld vs 12 x Psi = "
              "%lld (%s), + %lld of metadata; %.1f ms\n",
              sharded_folder(path).c_str(), int(sizes.rank_bytes.size()), per_rank.c_str(), (long long)total,
              (long long)predicted, total == predicted ? "equal" : "DIFFERENT", (long long)sizes.meta_bytes, ms);
  std::fflush(stdout);
  JsonObject record;
  record.add("type", "checkpoint").add("step", next_step).add("path", sharded_folder(path));
  record.add("bytes_total", total).add("bytes_predicted", predicted).add("meta_bytes", sizes.meta_bytes);
  record.add("bytes_rank0", sizes.rank_bytes.empty() ? int64_t(0) : sizes.rank_bytes[0]).add("save_ms", ms);
  json_.write(record);
}

int TrainingRun::load_sharded_checkpoint(const std::string& path, bool weights_only, Tensor params, AdamW& optimizer) {
  const ShardPlan& plan = optimizer.plan();
  const ShardedMeta meta = broadcast_sharded_meta(world_, path);
  std::string error = sharded_model_problem(path, meta, global_layout_);
  const int64_t batch = weights_only ? init_from_batch_ : cfg_.batch;
  if (error.empty() && meta.header.global_batch != batch)
    error = "checkpoint '" + sharded_folder(path) + "' was trained with --batch " +
            std::to_string(meta.header.global_batch) + "; pass --batch " + std::to_string(meta.header.global_batch) +
            " to resume (another batch would change the data order)";
  world_.agree_or_die(error.empty(), error);
  // This rank's parts: every held tensor's whole part of the parameters (every rank keeps full
  // weights but under ZeRO-3, whose shard is cut from them below), and of m and v the plan's pieces.
  Buffer local[3] = {Buffer(layout_.padded_size, MemCategory::Other), Buffer(), Buffer()};
  if (!weights_only)
    for (int a = 1; a < 3; a++) local[a] = Buffer(layout_.padded_size, MemCategory::Other);
  std::vector<SliceRequest> requests;
  for (size_t t = 0; t < layout_.params.size(); t++) {
    const ParamInfo& p = layout_.params[t];
    if (!p.held()) continue;
    requests.push_back({part_key(p, int(t), kParams, 0, p.size), local[0].f32() + p.offset});
    if (weights_only) continue;
    for (int i = 0; i < plan.count(); i++) {
      const FlatRange piece = plan.piece(i);
      const int64_t lo = std::max(p.offset, piece.begin), hi = std::min(p.offset + p.size, piece.end);
      if (lo >= hi) continue;
      for (int a = 1; a < 3; a++)
        requests.push_back({part_key(p, int(t), a, lo - p.offset, hi - p.offset), local[a].f32() + lo});
    }
  }
  error = load_sharded_slices(path, meta, requests);
  world_.agree_or_die(error.empty(), error);
  if (!weights_only) {
    plan.copy_to_shard(local[1].view(), optimizer.m());
    plan.copy_to_shard(local[2].view(), optimizer.v());
  }
  if (optimizer.mixed_precision()) plan.copy_to_shard(local[0].view(), optimizer.master());
  Buffer converted;
  Tensor host = local[0].view();
  if (params.dtype != host.dtype) {
    converted = Buffer(host.numel(), MemCategory::Other, params.dtype, Device::CPU);
    convert_tensor(converted.view(), host);
    host = converted.view();
  }
  if (params.numel() == host.numel()) transfer(params, host);
  else plan.copy_to_shard(host, params);
  return int(meta.header.step);
}
