// Chapter 10: context parallelism: ring attention over the sequence, balanced for the causal mask.
//
// The idea. Every chapter so far keeps all T positions of a sequence on each rank that runs it, and
// activations grow with T (the materialized attention with T^2). Context parallelism (CP) splits the
// sequence itself through the whole model: each of the cp ranks of a ring keeps T/cp positions of
// every sequence in every layer. Layernorms, products, GELU, the residual adds and the loss act
// position by position and run unchanged on the rank's positions. Attention is the one op that mixes
// positions: each rank keeps its queries, and the blocks of keys and values travel the ring, cp - 1
// steps, each rank folding every block that passes into an online softmax (a running maximum and sum
// per query, the FlashAttention way: no T x T matrix ever exists). The send of the next block is
// started before the current block is computed, so the ring's traffic hides behind the work (the
// trace shows "ring block" spans on the compute track while the sends fly). The backward sends the
// blocks around again, with the accumulators of their keys' and values' gradients, which every rank
// adds to on the way and which arrive home after the last step.
//
// The balance (--cp-split). Under the causal mask a query at position p sees p + 1 keys. Split
// contiguously, the first rank's queries see almost nothing and the last rank's almost everything:
// it computes 2cp - 1 times the first's scores, and everyone waits for it. Zig-zag cuts the sequence
// into 2cp chunks and gives rank r chunks r and 2cp-1-r, an early one and a late one: every rank
// computes exactly T(T+1)/(2cp) scores. The position embeddings follow the positions a rank holds.
//
// What changed since 03: a DP x CP grid; each rank keeps its positions of the micro-batch's tokens
// and targets; the model's attention runs on the ring (its ContextParallelHooks); gradients are
// averaged over DP x CP (the ranks of a ring hold the same parameters and saw different positions:
// averaging their means over equal token counts gives the mean over whole sequences); --zero1 shards
// AdamW over DP x CP. What stayed: the losses equal 01's.
// At --cp 1 the attention is the same blockwise kernel, a ring of one (on a GPU: the model's own).
//
// Base chapter: 03_bucket_dp (docs/diffs/10_context_parallel.diff: what this chapter adds to it).
//
// Run:
//   make 10_context_parallel
//   mpiexec -n 2 ./10_context_parallel/train                                    # CP 2, zigzag
//   mpiexec -n 4 ./10_context_parallel/train --cp 4 --cp-split contiguous       # the imbalance
//   mpiexec -n 2 ./10_context_parallel/train --preset long --trace cp.json      # T = 1024
// Output: as 03, plus, after step 1, per rank: attention FLOPs next to both splits' formulas, the
// time spent idle in the ring, and the ring's bytes next to 2(cp-1)/cp of K and V; the activations'
// measured bytes next to their formula on T/cp positions (docs/context_parallel.md reads them).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "buckets.h"
#include "comm.h"
#include "comm_factory.h"
#include "context_split.h"
#include "data_parallel.h"
#include "device.h"
#include "flags.h"
#include "memory.h"
#include "metrics.h"  // JsonObject, format_bytes
#include "model.h"
#include "ops.h"
#include "optimizer.h"
#include "process_grid.h"
#include "ring_attention.h"
#include "shards.h"
#include "trace.h"
#include "training_run.h"

struct Options {
  int cp = 0;  // 0: 2 where the rank count is even, else 1
  std::string split = "zigzag";
  bool zero1 = false;
  double bucket_mb = 0;
};

// What a rank's ring did, summed over a step's layers and micro-batches.
struct RingCounters {
  int64_t forward_pairs = 0, backward_pairs = 0;  // (query, key) pairs computed, over sequences and heads
  int64_t forward_bytes = 0, backward_bytes = 0;  // sent, from the ring communicator's counters
  double forward_idle_ms = 0, backward_idle_ms = 0;  // blocked waiting for a block (its exposed time)
  double compute_ms = 0;                             // in the blocks' kernels, wall-clock
  double compute_cpu_ms = 0;  // the same, this thread's CPU time: what a core spent, however busy the machine
};

// This thread's CPU time in ms: unlike the wall clock, it does not count the time another process had
// the core.
double thread_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// The lesson: attention on a ring of cp ranks. Rank r holds the queries, keys and values of its
// positions; at step s it computes against the block of rank r - s, which it received at step s - 1
// while it computed the one before.
class RingAttention {
 public:
  RingAttention(Communicator& ring, std::vector<std::vector<int>> positions, int max_B, int C, int NH)
      : ring_(ring), positions_(std::move(positions)), cp_(ring.size()), rank_(ring.rank()), C_(C),
        buffers_(cp_, max_B, int(positions_[0].size()), C, NH) {}

  RingCounters counters;

  void forward(Tensor out, Tensor lse, Tensor qkv, int NH) {
    const int B = int(out.shape[0]), T = int(out.shape[1]);
    const Measure measure(*this, counters.forward_bytes, counters.forward_idle_ms);
    // The running state: out accumulates the weighted values (not yet divided), lse holds the running
    // maximum, buffers_.stat the running sum.
    fill_zero(out);
    float* row_max = lse.f32();
    float* row_sum = buffers_.stat.f32();
    for (int64_t i = 0; i < lse.numel(); i++) row_max[i] = -INFINITY, row_sum[i] = 0.0f;
    Tensor kv[2] = {block(buffers_.kv[0], B, T), cp_ > 1 ? block(buffers_.kv[1], B, T) : Tensor()};
    pack_kv(kv[0], qkv, B, T, C_);  // this rank's own keys and values start the ring
    for (int s = 0; s < cp_; s++) {
      const Tensor current = kv[s % 2], next = kv[(s + 1) % 2];
      CommHandle passing;  // the block goes on to the next rank while this rank computes with it
      if (s < cp_ - 1) passing = ring_.send_recv_async({{true, current, next_rank(), kBlockTag},
                                                        {false, next, previous_rank(), kBlockTag}});
      const int owner = owner_at(s);
      const double start = now_ms(), start_cpu = thread_cpu_ms();
      {
        TraceScope span("ring block " + std::to_string(owner));
        counters.forward_pairs += attention_block_forward(
            RowBlock{out.f32(), C_, T}, row_max, row_sum, qkv_rows(qkv, 0, B, T, C_), kv_rows(current, 0, B, T, C_),
            kv_rows(current, 1, B, T, C_), positions_[size_t(rank_)].data(), positions_[size_t(owner)].data(), B, NH,
            C_);
      }
      counters.compute_ms += now_ms() - start;
      counters.compute_cpu_ms += thread_cpu_ms() - start_cpu;
      if (passing.valid()) passing.wait();
    }
    attention_block_finish(RowBlock{out.f32(), C_, T}, lse.f32(), row_max, row_sum, B, NH, C_);
  }

  // The backward sends the blocks around again. The gradient of block j's keys and values sums the
  // shares of every rank whose queries met it: the owner adds its own share to its dqkv at step 0;
  // the block's first visitor (step 1) starts an accumulator with its share and passes it on; each
  // next visitor adds its share; the last visitor (step cp - 1) is the owner's predecessor, whose
  // send brings the accumulator home. So cp - 1 sends of the blocks and cp - 1 of the accumulators:
  // twice the forward's bytes.
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
    const int B = int(out.shape[0]), T = int(out.shape[1]);
    const Measure measure(*this, counters.backward_bytes, counters.backward_idle_ms);
    float* D = buffers_.stat.f32();  // <dout, out> per query, which every block's softmax backward needs
    attention_row_dots(D, RowBlock{dout.f32(), C_, T}, RowBlock{out.f32(), C_, T}, B, NH, C_);
    Tensor kv[2] = {block(buffers_.kv[0], B, T), cp_ > 1 ? block(buffers_.kv[1], B, T) : Tensor()};
    pack_kv(kv[0], qkv, B, T, C_);
    CommHandle sending[2], arriving;  // the accumulators leaving (one per buffer), the one coming
    for (int s = 0; s < cp_; s++) {
      const Tensor current = kv[s % 2], next = kv[(s + 1) % 2];
      CommHandle passing;
      if (s < cp_ - 1) passing = ring_.send_recv_async({{true, current, next_rank(), kBlockTag},
                                                        {false, next, previous_rank(), kBlockTag}});
      const int owner = owner_at(s);
      // Step 0: the own block's share straight into dqkv. Later: into an accumulator, which must not
      // still be on its way from two steps ago.
      Tensor acc;
      if (s > 0) {
        if (sending[s % 2].valid()) sending[s % 2].wait();
        acc = block(buffers_.dkv_out[s % 2], B, T);
        fill_zero(acc);
      }
      const RowBlock dk = s == 0 ? qkv_rows(dqkv, 1, B, T, C_) : kv_rows(acc, 0, B, T, C_);
      const RowBlock dv = s == 0 ? qkv_rows(dqkv, 2, B, T, C_) : kv_rows(acc, 1, B, T, C_);
      const double start = now_ms(), start_cpu = thread_cpu_ms();
      {
        TraceScope span("ring block " + std::to_string(owner) + " backward");
        counters.backward_pairs += attention_block_backward(
            qkv_rows(dqkv, 0, B, T, C_), dk, dv, qkv_rows(qkv, 0, B, T, C_), kv_rows(current, 0, B, T, C_),
            kv_rows(current, 1, B, T, C_), RowBlock{dout.f32(), C_, T}, lse.f32(), D,
            positions_[size_t(rank_)].data(), positions_[size_t(owner)].data(), B, NH, C_);
      }
      counters.compute_ms += now_ms() - start;
      counters.compute_cpu_ms += thread_cpu_ms() - start_cpu;
      if (s > 0) {
        // Add what the earlier visitors summed (none at step 1: the owner kept its own share), pass
        // it on, and post the receive of the next one.
        const Tensor incoming = block(buffers_.dkv_in, B, T);
        if (arriving.valid()) {
          arriving.wait();
          add_inplace(acc, incoming);
        }
        sending[s % 2] = ring_.send_async(acc, next_rank(), kGradientTag);
        arriving = ring_.recv_async(incoming, previous_rank(), kGradientTag);
      }
      if (passing.valid()) passing.wait();
    }
    if (arriving.valid()) {  // this rank's own block's accumulator, home from the ring
      arriving.wait();
      add_kv_grad(dqkv, block(buffers_.dkv_in, B, T), B, T, C_);
    }
    for (CommHandle& h : sending)
      if (h.valid()) h.wait();
  }

 private:
  static constexpr int kBlockTag = 10, kGradientTag = 11;
  int next_rank() const { return (rank_ + 1) % cp_; }
  int previous_rank() const { return (rank_ + cp_ - 1) % cp_; }
  int owner_at(int step) const { return (rank_ - step + cp_) % cp_; }  // whose block rank_ holds at `step`
  Tensor block(const Buffer& buffer, int B, int T) const { return buffer.view().slice1d(0, int64_t(B) * T * 2 * C_); }

  // The ring communicator's sent bytes and blocked time during one pass, added to the counters.
  struct Measure {
    Measure(const RingAttention& r, int64_t& bytes, double& idle)
        : ring(r.ring_), bytes_(bytes), idle_(idle), before(r.ring_.stats()) {}
    ~Measure() {
      const CommStats d = ring.stats().since(before);
      bytes_ += d.kind[int(CollectiveKind::SendRecv)].sent_bytes;
      idle_ += d.exposed_ms;
    }
    Communicator& ring;
    int64_t& bytes_;
    double& idle_;
    CommStats before;
  };

  Communicator& ring_;
  std::vector<std::vector<int>> positions_;  // of every rank of the ring
  int cp_, rank_, C_;
  RingBuffers buffers_;
};

// After the first measured step: every rank's ring, next to the formulas of docs/theory.md, section 13.
void report_ring(TrainingRun& run, Communicator& world, int cp, const RingCounters& c, ContextSplit split) {
  const GPT2Config& m = run.model_config();
  const int K = run.cfg().grad_accum, B = run.micro_batch_size();
  const double passes = m.recompute == Recompute::Full ? 2 : 1;  // full recomputation replays the forward
  // FLOPs per (query, key) pair and channel of a head: forward 4 (q.k, p v), backward 10 (q.k again to
  // recompute p, then dP, dV, dQ, dK), per layer, micro-batch, sequence and head.
  const double hs = double(m.C) / m.NH, per_pair = hs * (4 * passes + 10), layers = double(m.L) * K * B * m.NH;
  auto flops_formula = [&](int cp_rank, ContextSplit s) {
    return layers * double(causal_pairs_formula(m.T, cp, cp_rank, s)) * per_pair;
  };
  const double kv = double(m.L) * K * B * m.T * m.C * 4;  // K (or V) over a step: L K B T C fp32 values
  const double forward_formula = passes * 2.0 * (cp - 1) / cp * kv, backward_formula = 2 * 2.0 * (cp - 1) / cp * kv;
  // Every rank's numbers, to rank 0 (scalars, counted apart from the training traffic).
  const std::vector<double> mine = {double(c.forward_pairs) * hs * 4 + double(c.backward_pairs) * hs * 10,
                                    c.compute_ms, c.forward_idle_ms, c.backward_idle_ms, double(c.forward_bytes),
                                    double(c.backward_bytes), c.compute_cpu_ms};
  std::vector<std::vector<double>> all(size_t(world.size()));
  for (int q = 0; q < world.size(); q++)
    for (double x : mine) all[size_t(q)].push_back(world.all_reduce_scalar(world.rank() == q ? x : 0.0, ReduceOp::Sum));
  if (!run.is_root()) return;
  // The busiest rank of each ring sets the pace: a rank with less work waits, in the ring, for the
  // difference, predicted as the busiest's measured time in the kernels x (1 - its work / the busiest's).
  double most = 0;
  for (int r = 0; r < cp; r++) most = std::max(most, flops_formula(r, split));
  std::vector<double> pace(size_t(world.size() / cp), 0.0);  // per ring: the busiest rank's kernel time
  for (int q = 0; q < world.size(); q++) {
    double& ring_pace = pace[size_t(q / cp)];  // (CP inside DP: ring q / cp, place q % cp)
    if (flops_formula(q % cp, split) == most) ring_pace = std::max(ring_pace, all[size_t(q)][1]);
  }
  std::printf("ring attention per rank, step 1 (CP %d, %s; docs/theory.md, section 13):\n", cp,
              context_split_name(split));
  std::printf("  %4s %14s %14s %24s %11s %8s %22s %15s\n", "rank", "attn FLOPs", "formula", "(contiguous | zigzag)",
              "compute ms", "cpu ms", "idle in ring fwd+bwd", "predicted idle");
  JsonObject record;
  record.add("type", "ring").add("cp", cp).add("split", context_split_name(split))
      .add("theory_forward_bytes", forward_formula).add("theory_backward_bytes", backward_formula);
  for (int q = 0; q < world.size(); q++) {
    const std::vector<double>& x = all[size_t(q)];
    const int r = q % cp;  // the rank's place in its ring (CP is inside DP: grid_coords)
    const double predicted_idle = pace[size_t(q / cp)] * (1 - flops_formula(r, split) / most);
    std::printf("  %4d %14.4g %14.4g %11.4g | %-10.4g %11.2f %8.2f %13.2f + %-8.2f %12.2f\n", q, x[0],
                flops_formula(r, split), flops_formula(r, ContextSplit::Contiguous),
                flops_formula(r, ContextSplit::Zigzag), x[1], x[6], x[2], x[3], predicted_idle);
    const std::string k = "rank" + std::to_string(q) + "_";
    record.add(k + "flops", x[0]).add(k + "theory_flops", flops_formula(r, split))
        .add(k + "compute_ms", x[1]).add(k + "compute_cpu_ms", x[6])
        .add(k + "idle_forward_ms", x[2]).add(k + "idle_backward_ms", x[3])
        .add(k + "predicted_idle_ms", predicted_idle).add(k + "forward_bytes", x[4]).add(k + "backward_bytes", x[5]);
  }
  std::printf("  ring bytes per rank: forward %s (theory %s2(cp-1)/cp x L K B T C x 4 = %s: (cp-1)/cp of K and V) | "
              "backward %s (theory 2 x 2(cp-1)/cp x L K B T C x 4 = %s: the blocks again and their gradients)\n",
              format_bytes(all[0][4]).c_str(), passes > 1 ? "2 passes x " : "", format_bytes(forward_formula).c_str(),
              format_bytes(all[0][5]).c_str(), format_bytes(backward_formula).c_str());
  std::fflush(stdout);
  run.write_record(record);
}

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt, ContextSplit split) {
  const int cp = opt.cp ? opt.cp : world.size() % 2 == 0 ? 2 : 1;
  // Sizes that must divide, refused on every rank before anything is built: the ranks into rings of
  // --cp, and each sequence into --cp parts (2 --cp chunks for zigzag).
  const GridShape shape = grid_shape(world.size(), 1, 1, cp);
  GPT2Config preset;
  if (find_preset(cfg.preset, &preset)) {
    const std::string problem = context_split_problem(preset.T, cp, split);
    if (!problem.empty()) config_error(problem);
  }
  ProcessGrid grid(world, shape);
  // Every rank of the ring knows which positions each member holds: its own, and those of the blocks
  // that come by (their causal mask is by absolute position).
  std::vector<std::vector<int>> positions;
  for (int r = 0; r < cp; r++) positions.push_back(context_positions(preset.T, cp, r, split));
  const bool ring_attention = cp > 1 || world.device() == Device::CPU;  // on a GPU, --cp 1 is the model's own
  ContextParallelism held;
  if (ring_attention) held = {cp, grid.coords().cp, positions[size_t(grid.coords().cp)]};
  TrainingRun run(grid, cfg, opt.zero1 ? Strategy::ZeRO1 : Strategy::DP, TensorParallelism{}, PipelineParallelism{},
                  held);
  const Device device = run.device();
  const DType dtype = run.dtype();
  const ParamLayout& layout = run.layout();
  const GPT2Config& model_cfg = run.model_config();
  Communicator& replicas = grid.dp_cp();  // every rank that holds the same parameters

  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype),
                          opt.zero1 ? BucketCut::AtLayers : BucketCut::AtTensors);
  const ShardPlan plan = opt.zero1 ? GradientSync::zero1_plan(buckets, replicas) : ShardPlan::unsharded(layout);
  Buffer grad_shard(opt.zero1 ? plan.size() : 0, MemCategory::CommBuffers, dtype, device);
  GradientSync data_parallel(replicas, buckets, grads.view(), opt.zero1 ? &plan : nullptr, grad_shard.view());
  AdamW optimizer(layout, plan, cfg.weight_decay, device, dtype);
  GPT2 model(model_cfg, layout, run.micro_batch_size(), device, dtype, {}, {}, held);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);

  // The lesson, wired in: the model's attention runs on the ring.
  std::unique_ptr<RingAttention> ring;
  if (ring_attention) {
    Communicator& group = cp > 1 ? grid.cp() : grid.dp();  // (a ring of one never sends)
    ring = std::make_unique<RingAttention>(group, positions, run.micro_batch_size(), model_cfg.C, model_cfg.NH);
    model.cp_hooks.attention_forward = [&](Tensor out, Tensor lse, Tensor qkv, int NH) {
      ring->forward(out, lse, qkv, NH);
    };
    model.cp_hooks.attention_backward = [&](Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
      ring->backward(dqkv, dout, qkv, out, lse, NH);
    };
  }

  // Data parallelism over DP x CP, on the last micro-batch (03, or with --zero1 04).
  bool last_micro_batch = false;
  model.hooks.grad_ready = [&](int p) {
    if (last_micro_batch) data_parallel.gradient_ready(p);  // no_sync before
  };

  // This rank's positions of each micro-batch's sequences.
  const std::vector<int>& mine = held.on() ? held.positions : positions[0];
  std::vector<int> inputs(size_t(run.micro_batch_size()) * mine.size()), targets(inputs.size());
  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    if (ring) ring->counters = RingCounters{};
    fill_zero(grads.view());
    float loss = 0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
      last_micro_batch = micro == cfg.grad_accum - 1;
      MicroBatch batch = run.micro_batch(step, micro);
      const int* batch_inputs = batch.inputs;
      const int* batch_targets = batch.targets;
      if (held.on()) {
        gather_positions(batch.inputs, batch.B, preset.T, held.positions, inputs.data());
        gather_positions(batch.targets, batch.B, preset.T, held.positions, targets.data());
        batch_inputs = inputs.data(), batch_targets = targets.data();
      }
      // The mean over this rank's positions: equal counts on every rank, so their average over the
      // ring (the gradients' all-reduce, the step's loss) is the mean over whole sequences.
      loss += model.forward(batch_inputs, batch_targets, batch.B) / cfg.grad_accum;
      model.backward(1.0f / cfg.grad_accum);
    }
    data_parallel.finish();

    // Without --zero1 every rank holds the whole averaged gradient; with it, its pieces.
    const double squares = opt.zero1 ? gradient_squares(layout, plan, grad_shard.view()) : sum_of_squares(grads.view());
    const double norm = std::sqrt(opt.zero1 ? replicas.all_reduce_scalar(squares, ReduceOp::Sum) : squares);
    const Tensor my_grads = opt.zero1 ? grad_shard.view() : grads.view();
    optimizer.update(params.view(), my_grads, step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    if (opt.zero1) data_parallel.gather_parameters(params.view());

    run.end_step(step, loss, norm);
    if (ring && step == std::max(start, 1)) report_ring(run, world, cp, ring->counters, split);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;
  }
  return run.finish();
}

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  flags.add("--cp", &opt.cp, "ranks in a context-parallel ring (default: 2 on an even rank count); the rest is "
                            "data-parallel");
  flags.add("--cp-split", &opt.split, "which positions a rank holds: zigzag (chunks i and 2cp-1-i, balanced under "
                                      "the causal mask) or contiguous (default: zigzag)", "SPLIT");
  flags.add_switch("--zero1", &opt.zero1, "shard the optimizer state over the DP x CP group (chapter 04)");
  flags.add("--bucket-mb", &opt.bucket_mb, "data-parallel bucket size in MB (default: an eighth of the gradient)");
  if (!parse_train_flags(argc, argv, "10_context_parallel",
                         "Chapter 10: context parallelism, ring attention over the sequence, on a DP x CP grid.", flags,
                         &cfg)) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  if (cfg.was_given("--bucket-mb") && !(opt.bucket_mb > 0)) config_error("--bucket-mb must be > 0");
  if (cfg.was_given("--cp") && opt.cp < 1) config_error("--cp must be >= 1");
  ContextSplit split;
  if (!parse_context_split(opt.split, &split))
    config_error("--cp-split: '" + opt.split + "' is neither zigzag nor contiguous");
  // The ring's kernels run on the CPU: a ring needs --device cpu (auto picks it).
  const int cp = opt.cp ? opt.cp : comm->size() % 2 == 0 ? 2 : 1;
  if (cp > 1 && cfg.device == "cuda")
    config_error("--cp " + std::to_string(cp) + " with --device cuda: ring attention runs on the CPU only in this "
                 "project (docs/context_parallel.md); pass --device cpu, or --cp 1 on a GPU");
  if (cp > 1 && cfg.device == "auto") cfg.device = "cpu";
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);  // NCCL on GPUs (comm_factory.h)
  const int status = train(*comm, cfg, opt, split);
  shutdown_mpi(std::move(comm));
  return status;
}
