// pipeline_report.cpp: see pipeline_report.h.
#include "pipeline/pipeline_report.h"


#include <cstdio>
#include <string>

#include "base/check.h"
#include "base/metrics.h"
#include "ops/ring_attention.h"  // ring_buffer_bytes
#include "parallel/ulysses_attention.h"  // ulysses_buffer_bytes
#include "parallel/theory.h"
#include "comm/wire_format.h"  // collective_formats: the tied wte's sum in a recipe's format

namespace {

std::string units_text(const GPT2Config& cfg, const ModelPart& part) {
  const int first_block = std::max(part.first_unit, 1) - 1, last_block = std::min(part.last(cfg), cfg.L) - 1;
  std::string text = part.first_unit == 0 ? "embedding + " : "";
  text += first_block == last_block ? "block " + std::to_string(first_block)
                                    : "blocks " + std::to_string(first_block) + "-" + std::to_string(last_block);
  if (part.holds(cfg, cfg.L + 1)) text += " + head";
  return text;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::F: return "F";
    case Op::B: return "B";
    case Op::W: return "W";
    default: return "p2p";
  }
}

}  // namespace

void print_partition(const TrainingRun& run, const GPT2Config& cfg, const std::vector<int>& blocks, int stages,
                     Placement placement) {
  if (!run.is_root()) return;
  const std::vector<double> cost = unit_costs(cfg);
  double total = 0;
  for (double c : cost) total += c;
  std::printf("partition: %zu virtual stages, blocks %s (the LM head costs %.2f blocks' FLOPs, the embedding none; "
              "--partition changes it)\n",
              blocks.size(), [&] {
                std::string text;
                for (size_t i = 0; i < blocks.size(); i++) text += (i ? "," : "") + std::to_string(blocks[i]);
                return text;
              }().c_str(), cost.back() / cost[1]);
  for (int r = 0; r < stages; r++) {
    const std::vector<ModelPart> parts = parts_of_rank(cfg, blocks, stages, r, placement);
    for (size_t c = 0; c < parts.size(); c++) {
      double share = 0;
      for (int u = parts[c].first_unit; u <= parts[c].last(cfg); u++) share += cost[u];
      const ParamLayout layout = build_gpt2_layout(cfg, 1, {}, {parts[c]});
      std::printf("  stage %d%s: %-28s %9lld parameters  %5.1f%% of the FLOPs\n", r,
                  parts.size() > 1 ? (" chunk " + std::to_string(c)).c_str() : "",
                  units_text(cfg, parts[c]).c_str(), (long long)layout.num_params, 100 * share / total);
    }
  }
  std::fflush(stdout);
}

JsonObject simulated_action_record(const SimulatedAction& a) {
  return JsonObject()
      .add("type", "simulated_action")
      .add("stage", a.rank)
      .add("op", op_name(a.action.op))
      .add("micro", a.action.micro)
      .add("chunk", a.action.chunk)
      .add("start_ms", a.start)
      .add("end_ms", a.end);
}

PipelineReport::PipelineReport(TrainingRun& run, const ProcessGrid& grid, const PipelineShape& shape,
                               Schedule schedule, Matching matching, std::vector<ModelPart> parts)
    : run_(run), world_(grid.world()), pipeline_(grid.pp()), shape_(shape), schedule_(schedule), matching_(matching),
      parts_(std::move(parts)), forward_(shape.chunks, 0), backward_(shape.chunks, 0), weight_(shape.chunks, 0),
      pair_(shape.chunks, 0),
      embedding_(shape.placement == Placement::V ? nullptr : grid.embedding()) {  // a V: wte on rank 0 only
  pipeline_before_ = pipeline_.stats();
  if (embedding_) embedding_before_ = embedding_->stats();
}

void PipelineReport::add_step(int step, const PipelineExecutor::Times& t) {
  const CommStats now = pipeline_.stats();
  const CommStats d = now.since(pipeline_before_);
  pipeline_before_ = now;
  CommStats embedding;
  if (embedding_) {
    const CommStats e = embedding_->stats();
    embedding = e.since(embedding_before_);
    embedding_before_ = e;
  }
  buffer_bytes_ = t.buffer_bytes;
  if (step == 0) return;  // warm-up
  steps_++;
  for (int c = 0; c < shape_.chunks; c++) {
    forward_[c] += t.forward[c], backward_[c] += t.backward[c], weight_[c] += t.weight[c];
    pair_[c] += t.pair[c];
  }
  pairs_ += t.pairs, pair_ms_ += t.pair_ms, pair_passes_ms_ += t.pair_passes_ms;
  waiting_ += t.waiting;
  step_ += t.step;
  p2p_bytes_ += double(d.kind[int(CollectiveKind::SendRecv)].sent_bytes);
  embedding_bytes_ += double(embedding.kind[int(CollectiveKind::AllReduce)].sent_bytes);
}

void PipelineReport::finish(bool wte_copies_equal) {
  const int p = shape_.stages, v = shape_.chunks, m = shape_.micro_batches, rank = pipeline_.rank();
  const GPT2Config& cfg = run_.model_config();
  const int n = std::max(steps_, 1);
  // This rank's averages: per chunk F, B, W ms and an F&B pair's (its forward's chunk); then the
  // step, the waiting, the compute, p2p bytes, activations measured and by the formula, p2p bytes by
  // the formula, the micro-batches in flight, the message buffers measured and by the formula, and
  // the pairs' count, wall time and their passes' own time.
  const int fields = 4 * v + 13;
  std::vector<float> mine(fields, 0.0f), all(size_t(fields) * world_.size());
  double compute = 0;
  for (int c = 0; c < v; c++) {
    mine[c] = float(forward_[c] / n), mine[v + c] = float(backward_[c] / n), mine[2 * v + c] = float(weight_[c] / n);
    mine[3 * v + c] = float(pair_[c] / n);
    compute += (forward_[c] + backward_[c] + weight_[c]) * m / n;
  }
  // The time this rank computed: its passes', less what its pairs' two lanes ran side by side.
  const double overlapped = std::max(0.0, pair_passes_ms_ - pair_ms_) / n;
  compute -= overlapped;
  double act_theory = 0, p2p_theory = 0, buffers_theory = 0;
  // A message is a micro-batch's stream: B*T rows of C, or this rank's B*T/t under sequence parallelism.
  const TensorParallelism& tp = run_.tensor_parallelism();
  const double rows_divisor = tp.size > 1 && tp.sequence_parallel ? tp.size : 1;
  // Under context parallelism (12) a rank holds T/cp positions, and its attention keeps a log-sum-exp
  // per query (section 13): the stage's formula on them, plus the ring's blocks in flight.
  const ContextParallelism& cp = run_.context_parallelism();
  GPT2Config held = cfg;
  if (cp.on()) held.T = int(cp.positions.size());
  const double message = double(run_.micro_batch_size()) * held.T * cfg.C * dtype_size(run_.dtype()) / rows_divisor;
  // Under a recipe a message travels in its format (wire_p2p.h): its bytes' share of the dtype's.
  auto share = [&](const Wire& w) { return w.fp32 ? 1.0 : double(w.element_bytes()) / dtype_size(run_.dtype()); };
  const double activation_share = share(collective_formats(pipeline_).activations);
  const double gradient_share = share(collective_formats(pipeline_).gradients);
  int in_flight = 0;  // micro-batches held at once by the schedule's formula, summed over the chunks
  for (int c = 0; c < v; c++) {
    ModelPart by_theory = parts_[c];  // (its slots are the list's count: the formula's must agree)
    by_theory.slots = theory_in_flight(schedule_, shape_, rank, c);
    in_flight += by_theory.slots;
    act_theory += activation_bytes(held, run_.micro_batch_size(), run_.dtype(), run_.flash_attention() || cp.on(), tp,
                                   by_theory);
    buffers_theory += pipeline_buffer_bytes(held, by_theory, p, run_.micro_batch_size(), run_.dtype(), tp);
    const int s = virtual_stage(shape_, rank, c);
    // Its output forward, its input's gradient back; to a chunk of this rank (one stage, a V's turn)
    // they are copies, not messages.
    const bool output_leaves = s < p * v - 1 && rank_of_stage(shape_, s + 1) != rank;
    const bool input_grad_leaves = s > 0 && rank_of_stage(shape_, s - 1) != rank;
    p2p_theory += m * message * ((output_leaves ? activation_share : 0) + (input_grad_leaves ? gradient_share : 0));
  }
  if (cp.on())  // a ring per lane where F&B pairs run at once (lanes.h)
    act_theory += run_.pipeline().scratch_lanes() *
                  (ring_buffer_bytes(cp.ring(), run_.micro_batch_size(), held.T, cfg.C / tp.size, cfg.NH / tp.size) +
                   (cp.ulysses > 1 ? ulysses_buffer_bytes(run_.micro_batch_size(), held.T, cfg.C / tp.size) : 0));
  act_theory += run_.moe_activations();  // a MoE model's routers and experts, at the last step's routing
  float* tail = &mine[4 * v];
  tail[0] = float(step_ / n), tail[1] = float(waiting_ / n), tail[2] = float(compute);
  tail[3] = float(p2p_bytes_ / n);
  tail[4] = float(memory_stats().peak[int(MemCategory::Activations)]);
  tail[5] = float(act_theory), tail[6] = float(p2p_theory), tail[7] = float(in_flight);
  tail[8] = float(buffer_bytes_), tail[9] = float(buffers_theory);
  tail[10] = float(pairs_ / n), tail[11] = float(pair_ms_ / n), tail[12] = float(pair_passes_ms_ / n);
  world_.all_gather(make_view(mine.data(), {fields}), make_view(all.data(), {int64_t(all.size())}));
  if (!run_.is_root() || steps_ == 0) return;

  // The first pipeline's ranks (data-parallel rank 0): world ranks 0..p-1 when DP is 1; in general the
  // grid's layout, PP outermost.
  const int dp = world_.size() / p;
  auto row = [&](int r) { return &all[size_t(fields) * size_t(r * dp)]; };
  ActionCosts costs;
  costs.forward.assign(p * v, 0), costs.backward.assign(p * v, 0), costs.weight.assign(p * v, 0);
  double F = 0, Bk = 0, W = 0, pairs = 0, pair_ms = 0, pair_passes_ms = 0;
  for (int r = 0; r < p; r++) {
    for (int c = 0; c < v; c++) {
      const int s = virtual_stage(shape_, r, c);
      costs.forward[s] = row(r)[c], costs.backward[s] = row(r)[v + c], costs.weight[s] = row(r)[2 * v + c];
      F += costs.forward[s] / (p * v), Bk += costs.backward[s] / (p * v), W += costs.weight[s] / (p * v);
    }
    pairs += row(r)[4 * v + 10], pair_ms += row(r)[4 * v + 11], pair_passes_ms += row(r)[4 * v + 12];
  }
  // Pairs at once: the simulation times each as its measured pair (a stage whose chunk led none
  // takes its passes' sum), and the formula takes their mean, F&B.
  const bool overlapped_pairs = pairs > 0;
  double pair_time = -1;
  if (overlapped_pairs) {
    costs.pair.assign(p * v, 0);
    for (int r = 0; r < p; r++)
      for (int c = 0; c < v; c++) {
        const int s = virtual_stage(shape_, r, c), other = virtual_stage(shape_, r, v - 1 - c);
        costs.pair[s] = row(r)[3 * v + c] > 0 ? row(r)[3 * v + c]
                                              : costs.forward[s] + costs.backward[other] + costs.weight[other];
      }
    pair_time = pair_ms / pairs;
  }
  const Simulation sim = simulate(schedule_, shape_, costs, matching_);
  const double theory = theory_bubble(schedule_, shape_, F, Bk, W, pair_time);
  std::printf("pipeline, %s schedule, p %d, m %d%s, messages matched by %s, averaged over %d measured steps "
              "(docs/theory.md, section 10):\n",
              schedule_name(schedule_), p, m, v > 1 ? (", v " + std::to_string(v)).c_str() : "", matching_name(matching_),
              steps_);
  std::printf("  %-5s %8s %8s %8s %9s %10s %9s %12s %16s %10s %10s %10s %10s\n", "stage", "F ms", "B ms", "W ms",
              "bubble", "simulated", "theory", "activations", "formula (held)", "p2p bytes", "formula", "buffers",
              "formula");
  double measured_mean = 0, simulated_mean = 0;
  for (int r = 0; r < p; r++) {
    const float* x = row(r);
    double f = 0, b = 0, w = 0;
    for (int c = 0; c < v; c++) f += x[c], b += x[v + c], w += x[2 * v + c];
    const float* t = x + 4 * v;
    const double measured = t[0] > 0 ? 1.0 - t[2] / t[0] : 0;
    const double simulated = sim.makespan > 0 ? sim.idle[r] / sim.makespan : 0;
    measured_mean += measured / p, simulated_mean += simulated / p;
    std::printf("  %-5d %8.2f %8.2f %8.2f %8.1f%% %9.1f%% %8.1f%% %12s %11s (%2.0f) %10s %10s %10s %10s\n", r, f, b,
                w, 100 * measured, 100 * simulated, 100 * theory, format_bytes(t[4]).c_str(),
                format_bytes(t[5]).c_str(), double(t[7]), format_bytes(t[3]).c_str(), format_bytes(t[6]).c_str(),
                format_bytes(t[8]).c_str(), format_bytes(t[9]).c_str());
    run_.write_record(JsonObject()
                          .add("type", "pipeline_stage")
                          .add("stage", r)
                          .add("forward_ms", f)
                          .add("backward_ms", b)
                          .add("weight_ms", w)
                          .add("step_ms", double(t[0]))
                          .add("waiting_ms", double(t[1]))
                          .add("measured_bubble", measured)
                          .add("simulated_bubble", simulated)
                          .add("theory_bubble", theory)
                          .add("measured_activations_bytes", double(t[4]))
                          .add("theory_activations_bytes", double(t[5]))
                          .add("theory_micro_batches_held", double(t[7]))
                          .add("measured_p2p_bytes", double(t[3]))
                          .add("theory_p2p_bytes", double(t[6]))
                          .add("measured_message_buffer_bytes", double(t[8]))
                          .add("theory_message_buffer_bytes", double(t[9])));
  }
  std::printf("  bubble = idle / step time, idle = the step minus this stage's F, B and W passes%s; the theory: %s;\n"
              "  simulated: the schedule run with each stage's measured pass times%s (%s, mean over stages %.1f%% "
              "against %.1f%% measured)\n",
              overlapped_pairs ? " (a pair's two lanes counted once: its wall time)" : "",
              theory_bubble_formula(schedule_, overlapped_pairs).c_str(), overlapped_pairs ? " and pair times" : "",
              sim.deadlock.empty() ? "no p2p time" : sim.deadlock.c_str(), 100 * simulated_mean, 100 * measured_mean);
  if (overlapped_pairs) {
    // What the overlap hid, per rank: a pair's two passes take their own times (F + B + W, each timed
    // in its lane) but, side by side, only the pair's wall time; the difference is the time the two
    // lanes ran at once, the messages inside one pass (and, with a core to spare, its compute) under
    // the other's work. The step gains that much only where nothing else then waits: the pipeline's
    // next stage for the pair's sends, a machine's saturated cores, a saturated link.
    std::printf("  F&B pairs at once (--fb-overlap on; docs/pipelines.md): per step, per rank\n");
    std::printf("  %-5s %6s %14s %12s %10s %8s\n", "stage", "pairs", "F+B+W in them", "their wall", "hidden", "of step");
    for (int r = 0; r < p; r++) {
      const float* x = row(r);
      const double count = x[4 * v + 10], wall = x[4 * v + 11], passes = x[4 * v + 12], step = x[4 * v];
      const double hidden = std::max(0.0, passes - wall);
      std::printf("  %-5d %6.0f %11.2f ms %9.2f ms %7.2f ms %7.1f%%\n", r, count, passes, wall, hidden,
                  step > 0 ? 100 * hidden / step : 0.0);
      run_.write_record(JsonObject()
                            .add("type", "pipeline_pairs")
                            .add("stage", r)
                            .add("pairs", count)
                            .add("pair_passes_ms", passes)
                            .add("pair_wall_ms", wall)
                            .add("hidden_ms", hidden)
                            .add("step_ms", step));
    }
    std::printf("  hidden = the pairs' passes (each timed in its lane) minus the pairs' wall time: the time the two "
                "lanes ran at once, which the pairs would take longer one pass after the other (--fb-overlap off; "
                "the step gains it where nothing else then waits)\n");
  }
  std::fflush(stdout);
  JsonObject pipeline;
  pipeline.add("type", "pipeline")
      .add("schedule", schedule_name(schedule_))
      .add("matching", matching_name(matching_))
      .add("p", p)
      .add("m", m)
      .add("v", v)
      .add("theory_formula", theory_bubble_formula(schedule_))
      .add("theory_bubble", theory)
      .add("simulated_bubble", simulated_mean)
      .add("measured_bubble", measured_mean)
      .add("simulated_step_ms", sim.makespan)
      .add("wte_copies_equal", wte_copies_equal);
  // Root is the first stage: a member of the embedding group whenever there is one. Its all-reduce
  // of wte's gradient over the two stages: 2(2-1)/2 = 1 copy of wte sent per step, in a recipe's
  // gradient format where there is one (b_g bytes an element).
  const ParamInfo& wte = run_.layout().params[run_.layout().find("wte")];
  const double embedding_measured = embedding_bytes_ / n;
  const Wire& gradients = collective_formats(world_).gradients;
  const int element_bytes = int(gradients.fp32 ? dtype_size(run_.dtype()) : gradients.element_bytes());
  const double embedding_theory =
      embedding_ ? double(wire_bytes_for(CollectiveKind::AllReduce, wte.size * int64_t(element_bytes), 2)) : 0;
  pipeline.add("measured_embedding_bytes", embedding_measured).add("theory_embedding_bytes", embedding_theory);
  run_.write_record(pipeline);
  if (p > 1 && shape_.placement == Placement::V) {
    std::printf("  the tied wte: one copy, on rank 0 with the embedding and the LM head (the V's two ends): "
                "no embedding group, %s per step\n", format_bytes(embedding_measured).c_str());
  } else if (p > 1) {
    std::printf("  embedding group (stage 0 and stage %d sum wte's gradient): %s per step, theory "
                "2(2-1)/2 x V C x %d bytes = %s\n",
                p - 1, format_bytes(embedding_measured).c_str(), element_bytes,
                format_bytes(embedding_theory).c_str());
    std::printf("  the tied wte's two copies (first and last stage) after the run: %s\n",
                wte_copies_equal ? "equal, bit for bit" : "DIFFERENT (their gradients were not summed alike)");
  }
  std::fflush(stdout);
  for (const SimulatedAction& a : sim.actions) {
    if (a.end <= a.start) continue;  // sends and receive posts take no time
    run_.write_record(simulated_action_record(a));
  }
}
