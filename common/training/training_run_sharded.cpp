// training_run_sharded.cpp: TrainingRun's sharded checkpoints (checkpoint_sharded.h): which slices
// this rank alone writes, the staged copy they are written from, and the slices a rank reads back on
// whatever grid it runs. See training_run.h.
#include <algorithm>
#include <cstdio>

#include "training/checkpoint_sharded.h"
#include "ops/ops.h"  // convert_tensor
#include "comm/trace.h"  // now_ms
#include "training/training_run.h"

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
// That is the project's one copy rule (ParamInfo::counts_here), along every axis but the data axes
// where the replicas each write a piece of their own.
bool TrainingRun::saves_copy(const ParamInfo& p, bool replicas_split) const {
  return p.counts_here(grid_.coords(), counted_along(kEveryAxis, replicas_split));
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
  wait_for_save("the next save");  // one save at a time: the staged copy is reused
  const double start = now_ms();
  const ShardPlan& plan = optimizer.plan();
  const std::vector<Span> spans = owned_spans(plan);
  int64_t owned = 0;
  for (const Span& s : spans) owned += s.end - s.begin;
  // The staged copy: this rank's slices of the parameters, then of m, then of v, on the host. The
  // step after a save may change the originals while the writer still reads the copy.
  async_.staged = Buffer(3 * owned, MemCategory::Other);
  const Tensor sources[3] = {optimizer.mixed_precision() ? optimizer.master() : params, optimizer.m(), optimizer.v()};
  std::vector<SliceKey> keys;
  int64_t at = 0;
  for (int array = 0; array < 3; array++) {
    ENSURE(sources[array].dtype == DType::F32, "checkpoints hold fp32 values");
    for (const Span& s : spans) {
      const ParamInfo& p = layout_.params[size_t(s.tensor)];
      const int64_t n = s.end - s.begin;
      transfer(async_.staged.view().slice1d(at, n), local_elements(sources[array], plan, p.offset + s.begin, n));
      keys.push_back(part_key(p, s.tensor, array, s.begin, s.end));
      at += n;
    }
  }
  CheckpointData data;
  data.step = next_step;
  data.global_batch = cfg_.batch;
  data.seed = cfg_.seed;
  data.settings = settings();
  async_.path = sharded_folder(path);
  async_.step = next_step;
  async_.started_ms = start;
  const double staged_ms = now_ms() - start;
  // Written by the writer thread (asynchronous) or right here; rank 0 prints the bytes beside 12 Psi.
  auto write = [this, path, data, keys, staged_ms, owned](Communicator& comm) {
    const ShardedSaveSizes sizes = save_sharded(comm, path, model_, global_layout_, data, keys, async_.staged.f32());
    async_.written_ms = now_ms() - async_.started_ms;
    async_.meta_bytes = sizes.meta_bytes;
    async_.total_bytes = 0;
    std::string per_rank;
    for (int64_t b : sizes.rank_bytes) {
      async_.total_bytes += b;
      per_rank += (per_rank.empty() ? "" : " ") + std::to_string(b);
    }
    if (comm.rank() != 0) return;
    // Each element of the model once, in three fp32 arrays: 12 bytes per parameter (docs/theory.md).
    const int64_t predicted = 12 * global_layout_.num_params;
    std::printf("checkpoint %s: %d shard files, bytes per rank [%s] (12 x its owned elements), sum %lld vs 12 x Psi = "
                "%lld (%s), + %lld of metadata; staged %.1f MB (forecast at most %.1f MB) in %.1f ms, written in %.1f "
                "ms%s\n",
                async_.path.c_str(), int(sizes.rank_bytes.size()), per_rank.c_str(), (long long)async_.total_bytes,
                (long long)predicted, async_.total_bytes == predicted ? "equal" : "DIFFERENT",
                (long long)sizes.meta_bytes, 12.0 * double(owned) / 1e6, forecast_.staged_save / 1e6, staged_ms,
                async_.written_ms, cfg_.async_save ? " (in the background)" : "");
    std::fflush(stdout);
  };
  if (!cfg_.async_save) {
    write(world_);
    async_.done_ms = now_ms();
    return report_save();
  }
  if (!async_.comm) async_.comm = world_.duplicate("checkpoint");
  async_.in_flight = true;
  async_.writer = std::thread([this, write]() {
    write(*async_.comm);
    async_.done_ms = now_ms();
    async_.in_flight = false;
  });
}

void TrainingRun::report_save() {
  if (!is_root()) return;
  JsonObject record;
  record.add("type", "checkpoint").add("step", async_.step).add("path", async_.path);
  record.add("bytes_total", async_.total_bytes).add("bytes_predicted", 12 * global_layout_.num_params);
  record.add("meta_bytes", async_.meta_bytes).add("save_ms", async_.written_ms).add("wait_ms", async_.wait_ms);
  record.add("asynchronous", cfg_.async_save).add("staged_forecast_bytes", forecast_.staged_save);
  json_.write(record);
}

void TrainingRun::wait_for_save(const char* before) {
  if (!async_.writer.joinable()) return;
  const double start = now_ms();
  async_.writer.join();
  async_.wait_ms = now_ms() - start;
  async_.waited_ms += async_.wait_ms;
  async_.staged = Buffer();
  if (is_root()) {
    std::printf("waited %.1f ms before %s for the checkpoint of step %d to be written\n", async_.wait_ms, before,
                async_.step);
    std::fflush(stdout);
  }
  report_save();
}

void TrainingRun::count_step_during_save(int step, double step_ms) {
  if (!cfg_.async_save || step == 0) return;
  // In flight at any moment of the step: still writing, or done after the step began.
  const bool saving = async_.in_flight || async_.done_ms.load() > now_ms() - step_ms;
  (saving ? async_.saving_steps : async_.other_steps)++;
  (saving ? async_.saving_ms : async_.other_ms) += step_ms;
}

void TrainingRun::report_async_saves() {
  if (!cfg_.async_save || !is_root()) return;
  auto mean = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
  std::printf("step time with an asynchronous save in flight: %.1f ms (%d steps) vs without: %.1f ms (%d steps); "
              "waited %.1f ms for saves in all\n",
              mean(async_.saving_ms, async_.saving_steps), async_.saving_steps,
              mean(async_.other_ms, async_.other_steps), async_.other_steps, async_.waited_ms);
  std::fflush(stdout);
  JsonObject record;
  record.add("type", "async_save").add("saving_step_ms", mean(async_.saving_ms, async_.saving_steps));
  record.add("saving_steps", async_.saving_steps).add("other_step_ms", mean(async_.other_ms, async_.other_steps));
  record.add("other_steps", async_.other_steps).add("waited_ms", async_.waited_ms);
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
