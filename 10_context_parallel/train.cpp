// Chapter 10: context parallelism: ring attention over the sequence, balanced for the causal mask.
//
// The idea. Each of the cp ranks of a ring keeps T/cp positions of every sequence through the whole
// model. Only attention mixes positions: each rank keeps its queries while the blocks of keys and
// values travel the ring (ring_attention_protocol.h), an online softmax combining them. Zig-zag
// balances the causal mask. --ulysses U trades positions for heads around attention, inside the ring.
// What to notice: after step 1, the ring's FLOPs, idle time and bytes next to their formulas.
// The whole lesson, with the why of each choice: README.md beside this file.
//
// Base chapter: 03_bucket_dp (docs/diffs/10_context_parallel.diff: what this chapter adds to it).
//
// Run:
//   make 10_context_parallel && mpiexec -n 4 ./10_context_parallel/train --cp 4 --cp-split contiguous
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "parallel/buckets.h"
#include "comm/comm.h"
#include "comm/wire_format.h"  // the gradients in the recipe's format (fp32: as they are)
#include "ops/device.h"
#include "training/chapter_main.h"  // run_chapter: main(), flags and checks
#include "training/flags.h"
#include "ops/memory.h"
#include "model/model.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "parallel/shards.h"
#include "training/training_run.h"

#include "training/context_report.h"  // RingCounters, report_ring
#include "parallel/context_split.h"
#include "comm/process_grid.h"
#include "ring_attention_protocol.h"  // RingAttention: the lesson's ring
#include "parallel/parallelize.h"  // apply_context_parallel, apply_ulysses: the attention installed
#include "parallel/ulysses_attention.h"  // UlyssesAttention: positions traded for heads around the ring
#include "training/ulysses_report.h"

// The chapter's own flags (the common ones are TrainConfig's, flags.h): declared, then checked.
struct Options {
  int cp = 0;  // 0: 2 where the rank count (over --ulysses) is even, else 1; check() sets the ring's size
  int ulysses = 1;
  std::string split = "zigzag";
  double bucket_mb = 0;
  ContextSplit context_split = ContextSplit::Zigzag;  // --cp-split, parsed by check()
  int T = 0;  // the preset's sequence length, whose positions the ring splits

  void declare(FlagParser& flags, TrainConfig&) {
    flags.add("--cp", &cp, "ranks in a context-parallel ring (default: 2 on an even rank count, over --ulysses); "
                           "the rest is data-parallel");
    flags.add("--ulysses", &ulysses, "ranks of a Ulysses group inside each ring place: they split its positions "
                                     "and trade them for heads around attention (default 1: none)");
    flags.add("--cp-split", &split, "which positions a rank holds: zigzag (chunks i and 2cp-1-i, balanced under "
                                    "the causal mask) or contiguous (default: zigzag)", "SPLIT");
    flags.add("--bucket-mb", &bucket_mb, "target bucket size in MB, a bucket holding whole tensors (default: an "
                                         "eighth of the gradient)");
  }
  // Every check before the first collective, the same on every rank: the ranks into rings of --cp,
  // each sequence into --cp parts (2 --cp chunks for zigzag), the ring's kernels in fp32 on a GPU.
  void check(TrainConfig& cfg, int ranks) {
    if (cfg.was_given("--bucket-mb") && !(bucket_mb > 0)) config_error("--bucket-mb must be > 0");
    if (cfg.was_given("--cp") && cp < 1) config_error("--cp must be >= 1");
    if (!parse_context_split(split, &context_split))
      config_error("--cp-split: '" + split + "' is neither zigzag nor contiguous");
    if (ulysses < 1) config_error("--ulysses must be >= 1");
    const int places = ranks / ulysses;  // the ring places the ranks make (0: fewer ranks than --ulysses)
    if (!cp) cp = places >= 2 && places % 2 == 0 ? 2 : 1;
    const std::string grid_problem = grid_shape_problem(ranks, 1, 1, cp);
    if (!grid_problem.empty() && ulysses == 1) config_error(grid_problem);  // (else ulysses_problem's)
    GPT2Config preset;
    if (!find_preset(cfg.preset, &preset))
      config_error("--preset: unknown preset '" + cfg.preset + "' (choose from " + preset_names() + ")");
    T = preset.T;
    const std::string split_problem = context_split_problem(T, cp, context_split, ranks);
    if (!split_problem.empty()) config_error(split_problem);
    // Ulysses splits each ring place's positions further, and the heads: both must divide.
    const std::string ulysses_problem_line = ulysses_problem(ulysses, preset.NH, 1, T, cp, context_split, ranks);
    if (!ulysses_problem_line.empty()) config_error(ulysses_problem_line);
    const Device device = pick_device(cfg.device);
    if (ulysses > 1 && device == Device::CUDA)
      config_error("--ulysses " + std::to_string(ulysses) + " runs on the CPU (its exchange has no CUDA kernels "
                   "yet): pass --device cpu, or --ulysses 1");
    if (cp > 1 && device == Device::CUDA) {  // the ring's kernels on a GPU (ring_attention_cuda.cu) are fp32
      if (cfg.dtype == "bf16")
        config_error("--dtype bf16 with --cp " + std::to_string(cp) + " on a GPU: the ring's CUDA kernels run in fp32; "
                     "pass --dtype fp32, or --cp 1 (the model's own attention takes bf16)");
      cfg.dtype = "fp32";
      const std::string ring_problem = ring_attention_problem(device, preset.C, preset.NH);
      if (!ring_problem.empty()) config_error(ring_problem + "; pass --device cpu");
    }
  }
};

// The whole run, in a function: the grid's groups must end before MPI does.
int train(Communicator& world, TrainConfig& cfg, const Options& opt) {
  const int cp = opt.cp, T = opt.T;
  const ContextSplit split = opt.context_split;
  // Under --ulysses u the grid has a Ulysses axis of u ranks inside the ring: a rank's coordinates
  // are its ring place (cp) and its Ulysses rank (u).
  const int u = opt.ulysses;
  ProcessGrid grid(world, grid_shape(world.size(), 1, 1, cp, 1, u));
  const int place = grid.coords().cp, ulysses_rank = grid.coords().u;
  // Every rank of the ring knows which positions each member holds: its own, and those of the blocks
  // that come by (their causal mask is by absolute position). Under Ulysses those of its ring place,
  // of which it holds its group's slice.
  std::vector<std::vector<int>> positions;
  for (int r = 0; r < cp; r++) positions.push_back(context_positions(T, cp, r, split));
  const bool ring_attention = cp > 1 || u > 1 || world.device() == Device::CPU;  // on a GPU, --cp 1 is the model's own
  ContextParallelism held;
  if (ring_attention)
    held = {cp * u, context_rank(grid.shape(), grid.coords()), ulysses_positions(positions[size_t(place)], u, ulysses_rank),
            u};
  Parallelism parallelism;  // data parallelism (DP) over the grid's DP x CP ranks, and this rank's positions
  parallelism.cp = held;
  TrainingRun run(grid, cfg, parallelism);
  // Ulysses' groups, the grid's: the u ranks of a ring place, which trade positions for heads, and
  // the ring of the cp ranks that share a Ulysses rank (at u = 1, the grid's cp group).
  if (Communicator* ulysses_group = grid.ulysses()) {
    run.add_group("ulysses", *ulysses_group);
    run.add_group("ring", grid.ring());
  }
  const Device device = run.device();
  const DType dtype = run.dtype();  // fp32, or bf16 mixed precision on GPUs
  const ParamLayout& layout = run.layout();
  Communicator& replicas = grid.dp_cp();  // every rank that holds the same parameters

  // Every rank holds all parameters, all gradients and the whole optimizer state.
  Buffer params(layout.padded_size, MemCategory::Params, dtype, device);
  Buffer grads(layout.padded_size, MemCategory::Grads, dtype, device);
  const double bucket_bytes =
      cfg.was_given("--bucket-mb") ? opt.bucket_mb * 1e6 : default_bucket_bytes(layout, dtype_size(dtype));
  GradientBuckets buckets(layout, bucket_bytes, dtype_size(dtype));
  run.set_gradient_all_reduces(buckets.sizes());  // the theory table's: one all-reduce a bucket
  AdamW optimizer(layout, ShardPlan::unsharded(layout), cfg.weight_decay, device, dtype);
  GPT2 model(run.model_config(), layout, run.micro_batch_size(), device, dtype, {}, {}, held);
  model.bind_all(params.data(), grads.data());
  const int start = run.init_or_resume(params, optimizer);
  if (run.is_root()) std::printf("%s\n", buckets.describe(bucket_bytes).c_str());

  // The lesson, wired in: the model's attention runs on the ring of this rank's CP group.
  std::unique_ptr<RingAttention> ring;
  std::unique_ptr<UlyssesAttention> ulysses;
  if (ring_attention) {
    const GPT2Config& m = run.model_config();
    ring = std::make_unique<RingAttention>(grid.ring(), positions, run.micro_batch_size(), m.C / u, m.NH / u);
    AttentionHooks around_the_ring;
    around_the_ring.attention_forward = [&](Tensor out, Tensor lse, Tensor qkv, int NH) {
      ring->forward(out, lse, qkv, NH);
    };
    around_the_ring.attention_backward = [&](Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int NH) {
      ring->backward(dqkv, dout, qkv, out, lse, NH);
    };
    // Ulysses around the ring: an all-to-all trades this rank's positions of every head for its NH/u
    // heads over the ring place's positions, the ring runs on those, and a second all-to-all trades back.
    std::vector<UlyssesAttention*> exchange;
    if (u > 1) {
      ulysses = std::make_unique<UlyssesAttention>(*grid.ulysses(), run.micro_batch_size(), int(held.positions.size()),
                                                   m.C, around_the_ring.attention_forward,
                                                   around_the_ring.attention_backward);
      exchange.push_back(ulysses.get());
    }
    // Each dimension installs its attention on the model: the ring, then Ulysses around it (parallelize.h).
    parallelize({&model}, {apply_context_parallel(around_the_ring), apply_ulysses(exchange)});
  }

  // 03's buckets: when a bucket's last gradient is final, start averaging it, over DP x CP.
  std::vector<CommHandle> in_flight;
  bool last_micro_batch = false;
  model.hooks.grad_ready = [&](int p) {
    if (!last_micro_batch) return;  // no_sync: gradients are not final until the last micro-batch
    const int b = buckets.mark_ready(p);
    if (b < 0) return;  // the bucket still waits for other gradients
    in_flight.push_back(wire_all_reduce_async(replicas, grads.view().slice1d(buckets.begin(b), buckets.size(b)),
                                              ReduceOp::Avg, collective_formats(replicas).gradients));
  };

  // This rank's positions of each micro-batch's sequences.
  std::vector<int> inputs(size_t(run.micro_batch_size()) * held.positions.size()),
      targets(inputs.size());
  for (int step = start; step < cfg.steps; step++) {
    run.begin_step(step);
    if (ring) ring->counters = RingCounters{};
    if (ulysses) ulysses->counters = UlyssesCounters{};
    fill_zero(grads.view());
    float loss = 0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
      last_micro_batch = micro == cfg.grad_accum - 1;
      MicroBatch batch = run.micro_batch(step, micro);
      if (held.on()) {
        gather_positions(batch.inputs, batch.B, T, held.positions, inputs.data());
        gather_positions(batch.targets, batch.B, T, held.positions, targets.data());
        batch.inputs = inputs.data(), batch.targets = targets.data();
      }
      // The mean over this rank's positions: equal counts on every rank, so their average over the
      // ring (the gradients' all-reduce, the step's loss) is the mean over whole sequences.
      loss += model.forward(batch.inputs, batch.targets, batch.B) / cfg.grad_accum;
      model.backward(1.0f / cfg.grad_accum);
    }

    // Most of them finished while backward ran; wait for the rest.
    for (CommHandle& handle : in_flight) handle.wait();
    in_flight.clear();
    buckets.reset();

    // Every rank now holds the same full gradient, so its norm is already global.
    const double norm = std::sqrt(sum_of_squares(grads.view()));
    optimizer.update(params.view(), grads.view(), step + 1, run.lr(step), clip_factor(norm, cfg.grad_clip));
    run.end_step(step, loss, norm);
    // After step 1, every rank's ring next to the formulas of docs/theory.md, section 13 (context_report.h).
    if (ring && step == std::max(start, 1)) report_ring(run, world, cp, ring->counters, split, u);
    if (ulysses && step == std::max(start, 1))
      report_ulysses(run, world, u, run.model_config().L, int(held.positions.size()), run.model_config().C, ulysses->counters);
    if (run.checkpoint_due(step)) run.save_checkpoint(step + 1, params, optimizer);
    if (run.stopping()) break;  // Ctrl-C or a diverging loss: every rank agreed to stop here
  }
  return run.finish();
}

// Where training starts: run_chapter (chapter_main.h) parses the flags, checks them, then calls train().
int main(int argc, char** argv) {
  return run_chapter(argc, argv, "10_context_parallel",
                     "Chapter 10: context parallelism, ring attention over the sequence, on a DP x CP grid.", train);
}
