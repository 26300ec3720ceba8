// test_planner.cpp: chapter 09's planner (common/planner/planner.h, plan_record.h). Its memory per GPU is
// what the trainers forecast for the same configuration (built here as 01-08 build it: their layout,
// their model parts, their activation slots counted from the schedule's own lists; chapter 12's grids
// against 12's own runs); its step time is
// the sum of its parts and the pipeline's is the simulator's; the search keeps only what fits; and it
// predicts Megatron-LM's Table 1 within 15% from one calibrated constant. The plan binary refuses
// every flag it cannot honour, with a sentence, and its header and tables say what it computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "ops/device.h"  // memory_per_rank
#include "base/metrics.h"  // format_bytes
#include "model/param_layout.h"
#include "pipeline/pipeline.h"
#include "planner/plan_published.h"  // one_command
#include "planner/plan_record.h"
#include "planner/planner.h"
#include "training_harness.h"  // run_command, temp_dir

namespace {

PlanInputs cpu_inputs(const std::string& preset, int gpus, int batch) {
  PlanInputs in;
  EXPECT_TRUE(find_plan_model(preset, &in.model));
  EXPECT_TRUE(find_cluster("emulated", &in.cluster));
  in.gpus = gpus, in.batch = batch, in.efficiency = 1;
  in.data_bytes = 1234567;
  return in;
}

// The largest forecast peak over the pipeline's ranks, built the way 08_pipeline/train.cpp builds
// each rank (slots: max_in_flight of the rank's own list), or 01-07's whole model when pp = 1.
struct TrainerForecast {
  MemoryForecast memory;
  Prediction model_state;
  double padding = 1;
};
TrainerForecast trainer_forecast(const PlanInputs& in, const PlanConfig& c) {
  GPT2Config cfg = in.model;
  cfg.recompute = c.recompute;
  const Strategy strategy = c.zero == 0 ? Strategy::DP : c.zero == 1 ? Strategy::ZeRO1 : c.zero == 2 ? Strategy::ZeRO2 : Strategy::ZeRO3;
  const TensorParallelism tp{c.tp, 0, c.sequence_parallel};
  TrainerForecast worst;
  double worst_peak = -1;
  const PipelineShape shape{c.pp, c.micro_batches, c.virtual_stages};
  for (int rank = 0; rank < c.pp; rank++) {
    std::vector<ModelPart> parts;
    if (c.pp > 1) {
      const std::vector<Action> actions = build_schedule(c.schedule, shape, rank);
      parts = parts_of_rank(cfg, balanced_partition(cfg, c.pp * c.virtual_stages), c.pp, rank);
      for (int ch = 0; ch < c.virtual_stages; ch++) {
        parts[ch].slots = max_in_flight(actions, ch);
        parts[ch].split_backward = c.schedule == Schedule::ZBH1;
      }
    }
    const ParamLayout layout = build_gpt2_layout(cfg, c.dp, tp, parts);
    const MemoryForecast f = forecast_memory(strategy, layout, build_gpt2_layout(cfg, 1).padded_size, cfg, c.micro_batch,
                                             c.micro_batches, in.cluster.dtype, in.cluster.device, false, false,
                                             in.data_bytes, tp, PipelineParallelism{c.pp, rank, parts, false, {}});
    if (f.peak() <= worst_peak) continue;
    worst_peak = f.peak();
    worst.memory = f;
    worst.model_state = predict(strategy, layout, c.micro_batches, in.cluster.dtype);
    worst.padding = double(layout.padded_size) / double(layout.num_params);
  }
  return worst;
}

PlanConfig config(int dp, int tp, int pp, Schedule s, int v, int B, int m, int zero, Recompute rc, bool sp) {
  return PlanConfig{dp, tp, pp, s, v, B, m, zero, rc, sp};
}

}  // namespace

TEST(Planner, MemoryIsTheTrainersForecastForEveryKindOfConfiguration) {
  struct Case {
    const char* preset;
    int batch;
    PlanConfig c;
  };
  const Case cases[] = {
      {"tiny", 8, config(2, 1, 1, Schedule::OneFOneB, 1, 4, 1, 0, Recompute::None, false)},
      {"tiny", 8, config(2, 1, 1, Schedule::OneFOneB, 1, 2, 2, 1, Recompute::None, false)},
      {"odd", 8, config(4, 1, 1, Schedule::OneFOneB, 1, 1, 2, 2, Recompute::None, false)},
      {"deep", 16, config(8, 1, 1, Schedule::OneFOneB, 1, 1, 2, 3, Recompute::Full, false)},
      {"small", 8, config(1, 2, 1, Schedule::OneFOneB, 1, 4, 2, 0, Recompute::Selective, false)},
      {"small", 8, config(2, 2, 1, Schedule::OneFOneB, 1, 2, 2, 1, Recompute::None, true)},
      {"tall", 8, config(1, 1, 2, Schedule::OneFOneB, 1, 2, 4, 0, Recompute::None, false)},
      {"tall", 8, config(2, 1, 2, Schedule::ZBH1, 1, 1, 4, 1, Recompute::None, false)},
      {"tall", 8, config(1, 1, 4, Schedule::Interleaved, 2, 1, 8, 0, Recompute::Full, false)},
      {"tall", 8, config(1, 1, 4, Schedule::AFAB, 1, 2, 4, 0, Recompute::None, false)},
      {"tall", 16, config(2, 2, 2, Schedule::OneFOneB, 1, 2, 4, 1, Recompute::Selective, true)},
      {"deep", 16, config(1, 4, 2, Schedule::Interleaved, 3, 2, 8, 0, Recompute::None, false)},
  };
  for (const Case& k : cases) {
    const PlanInputs in = cpu_inputs(k.preset, k.c.gpus(), k.batch);
    SCOPED_TRACE(std::string(k.preset) + ": " + k.c.describe());
    const PlanResult r = evaluate_plan(in, k.c);
    ASSERT_EQ(r.invalid, "");
    const TrainerForecast t = trainer_forecast(in, k.c);
    EXPECT_DOUBLE_EQ(r.params_bytes, t.model_state.params_bytes * t.padding);
    EXPECT_DOUBLE_EQ(r.grads_bytes, t.model_state.grads_bytes * t.padding);
    EXPECT_DOUBLE_EQ(r.optim_bytes, t.model_state.optim_bytes * t.padding);
    EXPECT_DOUBLE_EQ(r.memory.model_state, t.memory.model_state);
    EXPECT_DOUBLE_EQ(r.memory.activations, t.memory.activations);
    EXPECT_DOUBLE_EQ(r.memory.transient, t.memory.transient);
    EXPECT_DOUBLE_EQ(r.memory.peak(), t.memory.peak());
  }
}

TEST(Planner, StepTimeIsItsPartsAndThePipelinesIsTheSimulators) {
  // One rank: compute alone, 3 forwards' FLOPs (4 with full recomputation's replay counted), when
  // the FLOPs stand for all the work (no elementwise rate, as on a GPU).
  PlanInputs in = cpu_inputs("tall", 1, 8);
  in.cluster.elementwise_rate = 0;
  const PlanResult one = evaluate_plan(in, config(1, 1, 1, Schedule::OneFOneB, 1, 8, 1, 0, Recompute::None, false));
  double forward = 0;
  for (double u : unit_costs(in.model)) forward += u;
  EXPECT_NEAR(one.compute_s, 3 * forward * 8 * in.model.T / in.cluster.peak_flops, 1e-12 * one.compute_s + 1e-15);
  EXPECT_DOUBLE_EQ(one.step_s, one.compute_s);
  EXPECT_EQ(one.tp_s + one.dp_s + one.bubble_s + one.embedding_s, 0);

  // A pipeline with a free link: the step is the simulated makespan, and its bubble what is left.
  in = cpu_inputs("tall", 4, 8);
  in.cluster.inter_node = in.cluster.intra_node = LinkModel{};
  const PlanConfig c = config(1, 1, 4, Schedule::OneFOneB, 1, 1, 8, 0, Recompute::None, false);
  const PlanResult r = evaluate_plan(in, c, true);
  ASSERT_TRUE(r.simulated);
  EXPECT_NEAR(r.step_s, r.compute_s + r.bubble_s, 1e-12);
  EXPECT_GT(r.bubble_s, 0);
  EXPECT_EQ(r.pp_s, 0);
  // On a slow link the messages add to the step, and only they: the bubble with free links stays.
  PlanInputs slow_link = in;
  slow_link.cluster.inter_node = LinkModel{0.5, 50};
  const PlanResult s = evaluate_plan(slow_link, c, true);
  EXPECT_GT(s.pp_s, 0);
  EXPECT_NEAR(s.bubble_s, r.bubble_s, 1e-12);
  EXPECT_NEAR(s.step_s, s.compute_s + s.bubble_s + s.pp_s + s.embedding_s, 1e-12);
  // The estimate (theory_bubble on the slowest stage) is close to the simulation on balanced stages.
  const PlanResult estimate = evaluate_plan(in, c, false);
  EXPECT_NEAR(estimate.step_s, r.step_s, 0.15 * r.step_s);

  // Data parallelism on a slow link costs exposed time; a faster link less.
  in = cpu_inputs("small", 2, 8);
  in.cluster.peak_flops = in.cluster.elementwise_rate = 1e13;  // compute too short to hide the gradients behind
  const PlanConfig dp = config(2, 1, 1, Schedule::OneFOneB, 1, 4, 1, 0, Recompute::None, false);
  const double slow = evaluate_plan(in, dp).dp_s;
  in.cluster.inter_node.gbps *= 100;
  EXPECT_GT(slow, evaluate_plan(in, dp).dp_s);
  EXPECT_GT(slow, 0);
}

// On a CPU the work that is not a matrix product is a third of a step and does not shrink as the
// products do under TP: with an elementwise rate, a pass costs the matrix products' FLOPs (attention's
// two left out) at peak and the activation bytes of activation_bytes() (as if nothing were kept
// back) at that rate; recomputation adds the bytes it does not keep, a forward's third of them.
TEST(Planner, CpuComputeCountsTheWorkBesidesTheMatrixProducts) {
  PlanInputs in = cpu_inputs("small", 2, 8);
  const GPT2Config& cfg = in.model;
  const double tokens = 4.0 * cfg.T;
  auto compute_s = [&](double peak, double elementwise, int tp, Recompute recompute) {
    PlanInputs x = in;
    x.cluster.peak_flops = peak, x.cluster.elementwise_rate = elementwise;
    x.batch = 4 * (2 / tp);  // micro-batches of 4 on every rank
    return evaluate_plan(x, config(2 / tp, tp, 1, Schedule::OneFOneB, 1, 4, 1, 0, recompute, false)).compute_s;
  };
  auto activations = [&](int tp, Recompute recompute) {
    GPT2Config c = cfg;
    c.recompute = recompute;
    return activation_bytes(c, 4, DType::F32, false, TensorParallelism{tp, 0, false});
  };
  // The elementwise work: the activations, with the backward's scratch (the arena with no slot) once
  // for every block instead of once (it is written by each block's backward).
  auto work = [&](int tp) {
    ModelPart none;
    none.slots = 0;
    return activations(tp, Recompute::None) +
           (cfg.L - 1) * activation_bytes(cfg, 4, DType::F32, false, TensorParallelism{tp, 0, false}, none);
  };
  const double free = 1e30;  // a rate at which that part costs nothing
  double products = 0;
  for (double u : unit_costs(cfg)) products += u;
  products -= cfg.L * attention_flops_per_token(cfg);
  EXPECT_NEAR(compute_s(1, free, 1, Recompute::None), 3 * tokens * products, 1e-9 * 3 * tokens * products);
  EXPECT_NEAR(compute_s(1, free, 2, Recompute::None), 3 * tokens * products / 2, 1e-9 * 3 * tokens * products);
  const double whole = work(1), split = work(2);
  EXPECT_NEAR(compute_s(free, 1, 1, Recompute::None), whole, 1e-9 * whole);
  EXPECT_NEAR(compute_s(free, 1, 2, Recompute::None), split, 1e-9 * whole);
  // Tensor parallelism halves the products, not the rest: each rank normalises every row (0.58 of the
  // whole here: the heads' and the MLP's activations and their scratch halve, the stream's do not).
  EXPECT_GT(split, 0.55 * whole);
  // Full recomputation replays the forward's bytes that it did not keep.
  const double kept = activations(1, Recompute::None);
  EXPECT_NEAR(compute_s(free, 1, 1, Recompute::Full), whole + (kept - activations(1, Recompute::Full)) / 3,
              1e-9 * whole);
  // Both at once add up; with no rate the FLOPs stand for everything, attention's included.
  EXPECT_NEAR(compute_s(2e10, 5e8, 1, Recompute::None), 3 * tokens * products / 2e10 + whole / 5e8, 1e-9);
  EXPECT_NEAR(compute_s(2e10, 0, 1, Recompute::None), 3 * tokens * (products + cfg.L * attention_flops_per_token(cfg)) / 2e10,
              1e-9);
}

// A synchronization's cost (Cluster::sync_s, plan --sync-us: what make plan-check measures beside each
// calibration) is paid once for each blocking collective and message: TP's collectives of every
// micro-batch (predict_tensor_parallel's counts), under SP one wait a block and one for the rest for
// the sums of the gradients held whole, the ring's hops (cp - 1 a block forward, twice that backward)
// and the experts' 5 all-to-alls a block; sync_added_s is their sum on the step.
TEST(Planner, ASynchronizationIsPaidOnceForEachBlockingCollective) {
  const double sync = 1e-3;
  auto both = [&](PlanInputs in, const PlanConfig& c) {
    const PlanResult without = evaluate_plan(in, c);
    in.cluster.sync_s = sync;
    const PlanResult with = evaluate_plan(in, c);
    EXPECT_EQ(without.sync_added_s, 0.0);
    EXPECT_NEAR(with.sync_added_s, with.step_s - without.step_s, 1e-12);
    return std::make_pair(without, with);
  };
  PlanInputs in = cpu_inputs("small", 2, 8);
  in.cluster.peak_flops = 2e10, in.cluster.elementwise_rate = 1e9;
  const GPT2Config& cfg = in.model;
  for (bool sp : {false, true})
    for (int m : {1, 2}) {
      SCOPED_TRACE(std::string(sp ? "SP" : "TP") + " m " + std::to_string(m));
      const TensorParallelPrediction tpp = predict_tensor_parallel(cfg, 8 / m, TensorParallelism{2, 0, sp}, DType::F32);
      const int per_micro = tpp.all_reduces + tpp.all_gathers + tpp.reduce_scatters + tpp.loss_all_reduces;
      EXPECT_GE(per_micro, 4 * cfg.L) << "two collectives a block each pass";
      const auto [without, with] = both(in, config(1, 2, 1, Schedule::OneFOneB, 1, 8 / m, m, 0, Recompute::None, sp));
      const double syncs = m * per_micro + (sp ? cfg.L + 1 : 0);
      EXPECT_NEAR(with.tp_s - without.tp_s, syncs * sync, 1e-12);
      EXPECT_NEAR(with.sync_added_s, syncs * sync, 1e-12) << "nothing hides TP's collectives";
    }
  // With the compute free nothing hides the ring's hops or the all-to-alls either.
  in.cluster.peak_flops = in.cluster.elementwise_rate = 1e30;
  for (int cp : {2, 4}) {
    PlanConfig c = config(1, 1, 1, Schedule::OneFOneB, 1, 8, 1, 0, Recompute::None, false);
    c.cp = cp;
    PlanInputs x = in;
    x.gpus = cp;
    const auto [without, with] = both(x, c);
    EXPECT_NEAR(with.cp_s - without.cp_s, cfg.L * 3.0 * (cp - 1) * sync, 1e-12) << "cp " << cp;
  }
  PlanInputs moe = cpu_inputs("moe-small", 2, 8);
  moe.cluster.peak_flops = moe.cluster.elementwise_rate = 1e30;
  PlanConfig c = config(2, 1, 1, Schedule::OneFOneB, 1, 2, 2, 0, Recompute::None, false);
  c.ep = 2;
  const auto [without, with] = both(moe, c);
  EXPECT_NEAR(with.ep_s - without.ep_s, 2 * moe.model.L * 5.0 * sync, 1e-12);
}

// The cluster of docs/cluster.md (make cluster-up): 2 CPU ranks a node, MPI's shared memory inside
// it, the tbf-shaped link between nodes. Its memory per rank is the trainers' own check, and the
// inter-node rate (--inter-gbps, the cluster's GBPS) moves exactly the groups the grid puts across
// nodes: with compute and latencies made free, a 10x slower link makes their time 10x longer (the
// bandwidth term of modelled_ms), and the groups inside a node do not move at all.
TEST(Planner, TheNamespacesClusterSlowsOnlyWhatCrossesItsShapedLink) {
  Cluster k;
  ASSERT_TRUE(find_cluster("namespaces", &k));
  EXPECT_NE(std::string(cluster_names()).find("namespaces"), std::string::npos);
  EXPECT_EQ(k.gpus_per_node, 2);
  EXPECT_EQ(k.device, Device::CPU);
  EXPECT_EQ(k.dtype, DType::F32);
  EXPECT_DOUBLE_EQ(k.memory_bytes, memory_per_rank(Device::CPU, 2));
  EXPECT_DOUBLE_EQ(namespaces_cluster(1).memory_bytes, memory_per_rank(Device::CPU, 1));
  EXPECT_GT(k.intra_node.gbps, 10 * k.inter_node.gbps) << "shared memory is far faster than the shaped link";

  PlanInputs in;
  ASSERT_TRUE(find_plan_model("small", &in.model));
  in.gpus = 4, in.batch = 8, in.efficiency = 1;
  auto predict = [&](double inter_gbps, double intra_gbps, const PlanConfig& c) {
    PlanInputs x = in;
    x.cluster = k;
    x.cluster.peak_flops = x.cluster.elementwise_rate = 1e30;  // compute free: nothing hides the traffic
    x.cluster.inter_node = {inter_gbps, 0};
    x.cluster.intra_node = {intra_gbps, 0};
    return evaluate_plan(x, c);
  };
  const double shm = k.intra_node.gbps;
  // 07 --tp 2 on 2 nodes x 2 ranks: TP pairs inside a node, DP across the nodes.
  const PlanConfig tp_dp = config(2, 2, 1, Schedule::OneFOneB, 1, 4, 1, 0, Recompute::None, false);
  const PlanResult fast = predict(1, shm, tp_dp), slow = predict(0.1, shm, tp_dp);
  // The gradients' all-reduce hides behind the last backward, here (compute free) its two thirds of
  // TP's collectives, the same on both links: the all-reduce itself is 10x longer.
  EXPECT_GT(fast.dp_s, 0);
  const double hidden = fast.tp_s * 2 / 3;
  EXPECT_NEAR(slow.dp_s + hidden, 10 * (fast.dp_s + hidden), 1e-9 * slow.dp_s);
  EXPECT_GT(fast.tp_s, 0);
  EXPECT_DOUBLE_EQ(slow.tp_s, fast.tp_s);
  // The same run with the pairs across the nodes (-ppn 1): TP on the shaped link, DP on shared
  // memory, which the planner is told by giving the inside-node link the shaped rate and the
  // between-node link shared memory's (scripts/cluster/cluster_lessons.sh does so).
  const PlanResult across = predict(shm, 0.1, tp_dp), across_fast = predict(shm, 1, tp_dp);
  EXPECT_NEAR(across.tp_s, 10 * across_fast.tp_s, 1e-9 * across.tp_s);
  EXPECT_DOUBLE_EQ(across.dp_s, across_fast.dp_s);
  EXPECT_GT(across.tp_s, slow.tp_s) << "TP on the shaped link costs more than on shared memory";
  // 09 --tp 2 --pp 2: the pipeline's messages cross the nodes, TP stays inside.
  const PlanConfig tp_pp = config(1, 2, 2, Schedule::OneFOneB, 1, 2, 4, 0, Recompute::None, false);
  const PlanResult pp_fast = predict(1, shm, tp_pp), pp_slow = predict(0.1, shm, tp_pp);
  EXPECT_GT(pp_fast.pp_s, 0);
  EXPECT_GT(pp_slow.pp_s, 5 * pp_fast.pp_s);
  EXPECT_DOUBLE_EQ(pp_slow.tp_s, pp_fast.tp_s);

  // The plan binary takes the cluster and its link, and --gpus-per-node divides the memory anew.
  RunResult r = run_command("./09_3d_parallel/plan --one --model small --cluster namespaces --gpus 4 --batch 8 --tp 2 "
                            "--inter-gbps 0.1",
                            60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cluster namespaces:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 GPUs a node"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0.1 Gb/s 50 us between nodes"), std::string::npos) << r.output;
  r = run_command("./09_3d_parallel/plan --one --model small --cluster namespaces --gpus 2 --batch 8 --pp 2 "
                  "--micro-batches 4 --gpus-per-node 1",
                  60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 GPU a node"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(format_bytes(memory_per_rank(Device::CPU, 1)) + " each"), std::string::npos) << r.output;
}

TEST(Planner, RefusesWhatCannotRunAndKeepsOnlyWhatFits) {
  const PlanInputs in = cpu_inputs("tall", 4, 8);
  EXPECT_NE(evaluate_plan(in, config(2, 1, 1, Schedule::OneFOneB, 1, 4, 1, 0, Recompute::None, false)).invalid, "")
      << "2 GPUs of 4";
  EXPECT_NE(evaluate_plan(in, config(4, 1, 1, Schedule::OneFOneB, 1, 1, 1, 0, Recompute::None, false)).invalid, "")
      << "batch 4 of 8";
  EXPECT_NE(evaluate_plan(in, config(1, 1, 4, Schedule::Interleaved, 2, 1, 6, 0, Recompute::None, false)).invalid, "")
      << "interleaved needs m a multiple of p";
  EXPECT_NE(evaluate_plan(in, config(1, 1, 4, Schedule::OneFOneB, 1, 2, 4, 2, Recompute::None, false)).invalid, "")
      << "ZeRO-2 with dp 1";
  EXPECT_NE(evaluate_plan(in, config(1, 1, 4, Schedule::ZBH1, 1, 2, 4, 0, Recompute::Full, false)).invalid, "")
      << "zb-h1's weight pass reads what full recomputation does not keep";

  // What our chapters cannot run yet is predicted, but marked (and left out under --runnable-here).
  EXPECT_NE(not_runnable_here(config(2, 2, 1, Schedule::OneFOneB, 1, 1, 2, 3, Recompute::None, false)), "");
  // 09 runs zb-h1 under TP, with its W pass (test_3d_parallel.cpp, tp2_pp2_zbh1).
  EXPECT_EQ(not_runnable_here(config(1, 2, 2, Schedule::ZBH1, 1, 1, 4, 0, Recompute::None, false)), "");
  EXPECT_EQ(not_runnable_here(config(2, 2, 2, Schedule::Interleaved, 2, 1, 4, 1, Recompute::Full, true)), "");
  EXPECT_EQ(not_runnable_here(config(4, 1, 1, Schedule::OneFOneB, 1, 1, 2, 3, Recompute::None, false)), "");

  // A 1T model on one DGX H100 does not fit at all; on 64 nodes it does, with what fits first.
  PlanInputs big;
  big.model = gpt_like_model(1e12);
  find_cluster("dgx-h100", &big.cluster);
  big.gpus = 8, big.batch = 64;
  SearchSpace space;  // a smaller space than the command line's, to keep the test quick
  space.micro_batch = {1, 2};
  space.recompute = {Recompute::None, Recompute::Full};
  space.sequence_parallel = {true};
  std::vector<PlanResult> results = search_plans(big, space);
  ASSERT_FALSE(results.empty());
  EXPECT_FALSE(results.front().fits);
  EXPECT_NE(results.front().overflow.find("model state alone"), std::string::npos) << results.front().overflow;
  big.gpus = 512, big.batch = 512;
  results = search_plans(big, space);
  ASSERT_TRUE(results.front().fits);
  for (size_t i = 1; i < results.size(); i++) {
    if (!results[i].fits) break;
    EXPECT_LE(results[i].memory.peak(), big.cluster.memory_bytes);
    if (results[i - 1].simulated == results[i].simulated) {
      EXPECT_LE(results[i - 1].step_s, results[i].step_s * 1.001);  // ties within 0.1% go to the simpler
    }
  }
  // Tensor parallelism stays inside a node (beyond it, every pass waits for the network).
  EXPECT_LE(results.front().config.tp, big.cluster.gpus_per_node) << results.front().config.describe();
}

TEST(Planner, PredictsMegatronTable1WithinFifteenPercentFromOneRow) {
  const std::vector<RecordRow> rows = read_megatron_table("docs/data/megatron_table1.csv");
  ASSERT_EQ(rows.size(), 10u);
  // Only the rows' own configurations (the free search is make plan's): cheap.
  const int calibration = 6;
  const double e = calibrate_efficiency(rows[calibration]);
  EXPECT_GT(e, 0.3);
  EXPECT_LT(e, 0.9);
  for (const RecordRow& row : rows) {
    const PlanResult r = plan_paper_config(row, e);
    // Our trainers' forecast fits the paper's runs up to 310.1B: 08's message buffers are the
    // micro-batches in flight, not the step's m (144 to 512 on the largest rows). On 529.6B and 1T
    // the interleaved schedule's ~2p micro-batches in flight, three (B,T,C) buffers each, still
    // overflow, but they no longer outweigh the model state and activations (docs/planner.md).
    if (row.params_b < 500) {
      EXPECT_TRUE(r.fits) << row.name() << ": " << r.overflow;
    } else {
      EXPECT_LT(r.memory.transient, r.memory.model_state + r.memory.activations) << row.name();
    }
    const double predicted = predicted_tflops(row, r.step_s);
    EXPECT_NEAR(predicted, row.tflops_per_gpu, 0.15 * row.tflops_per_gpu) << row.name() << " " << r.config.describe();
  }
  EXPECT_NEAR(predicted_tflops(rows[calibration], plan_paper_config(rows[calibration], e).step_s),
              rows[calibration].tflops_per_gpu, 0.5);
}

// A mixture-of-experts preset in a pipeline (chapter 12's grid) is predicted, not refused, and not
// as its dense twin (tiny: the same L, C, NH, T and V), whose layout once filled the cache under the
// same key (the plan binary stopped at an internal check of param_layout.cpp). Under TP it needs
// sequence parallelism, as 12 does; the search still finds it an expert-parallel grid.
TEST(Planner, AMixtureOfExpertsIsPlannedOnChapter12sGridsNotAsItsDenseTwin) {
  const PlanInputs tiny = cpu_inputs("tiny", 2, 8);
  const PlanConfig c = config(1, 1, 2, Schedule::OneFOneB, 1, 2, 4, 0, Recompute::None, false);
  const PlanResult dense = evaluate_plan(tiny, c);
  ASSERT_EQ(dense.invalid, "");
  const PlanInputs moe = cpu_inputs("moe-tiny", 2, 8);
  const PlanResult experts = evaluate_plan(moe, c);
  ASSERT_EQ(experts.invalid, "");
  EXPECT_GT(experts.params_bytes, dense.params_bytes);
  EXPECT_NE(evaluate_plan(moe, config(1, 2, 1, Schedule::OneFOneB, 1, 8, 1, 0, Recompute::None, false)).invalid.find(
                "needs sequence parallelism"),
            std::string::npos);
  RunResult r = run_command("./09_3d_parallel/plan --one --model moe-tiny --cluster emulated --gpus 2 --batch 8 --pp 2 "
                            "--micro-batches 4",
                            60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  r = run_command("./09_3d_parallel/plan --model moe-tiny --cluster emulated --gpus 4 --batch 8 --top 3", 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\\n1 +dp 4 tp 1 pp 1 ep [24] "))) << r.output;
}

// Chapter 12's grids: the planner's memory of rank 0 is what 12_5d_parallel's own run forecasts
// (TrainingRun::check_memory: T/cp positions under TP and a pipeline, the ring's blocks of NH/t heads,
// a mixture of experts' routers and rows replayed over the schedule at the bound, the exchange's
// buffers, ZeRO-1's shards of a MoE model over two groups), and the model state is what it allocates.
// The trainer runs two steps on 4 ranks.
TEST(Planner, Chapter12sGridsAreForecastAsItsTrainerForecastsThem) {
  struct Case {
    const char* preset;
    const char* flags;
    PlanConfig c;
  };
  PlanConfig tp_cp = config(1, 2, 1, Schedule::OneFOneB, 1, 8, 1, 0, Recompute::None, false);
  tp_cp.cp = 2;
  PlanConfig cp_pp = config(1, 1, 2, Schedule::OneFOneB, 1, 2, 4, 0, Recompute::None, false);
  cp_pp.cp = 2;
  PlanConfig moe = config(1, 2, 2, Schedule::OneFOneB, 1, 2, 4, 0, Recompute::None, true);
  moe.ep = 2;
  // ZeRO-1 with experts: the dense state over DP x CP, the experts' over their replicas (4 and 2 here;
  // 2 and 4 under TP with ep 1).
  PlanConfig moe_zero1 = config(4, 1, 1, Schedule::OneFOneB, 1, 2, 1, 1, Recompute::None, false);
  moe_zero1.ep = 2;
  const PlanConfig moe_tp_zero1 = config(2, 2, 1, Schedule::OneFOneB, 1, 2, 2, 1, Recompute::None, true);
  const Case cases[] = {
      {"tiny", "--tp 2 --cp 2 --micro-batches 1", tp_cp},
      {"tiny", "--cp 2 --pp 2 --micro-batches 4", cp_pp},
      {"moe-tiny", "--tp 2 --pp 2 --ep 2 --sequence-parallel --micro-batches 4", moe},
      {"moe-tiny", "--ep 2 --zero1 --micro-batches 1", moe_zero1},
      {"moe-tiny", "--tp 2 --sequence-parallel --zero1 --micro-batches 2", moe_tp_zero1},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.preset) + " " + k.flags);
    const std::string json = temp_dir() + "/12.jsonl";
    const RunResult run = run_trainer("12_5d_parallel", 4,
                                      std::string("--preset ") + k.preset + " --batch 8 --steps 2 --json " + json + " " + k.flags);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const std::string record = read_record(json, "run"), theory = read_record(json, "theory");
    ASSERT_NE(record, "");
    ASSERT_NE(theory, "");
    PlanInputs in = cpu_inputs(k.preset, 4, 8);
    const PlanResult r = evaluate_plan(in, k.c);
    ASSERT_EQ(r.invalid, "");
    const StageMemory first = stage_memory(in, k.c, 0);  // world rank 0's stage
    EXPECT_DOUBLE_EQ(first.memory.activations, number_field(record, "forecast_activations_bytes"));
    EXPECT_DOUBLE_EQ(first.memory.transient, number_field(record, "forecast_transient_bytes"));
    EXPECT_DOUBLE_EQ(first.memory.model_state, number_field(record, "forecast_model_state_bytes"));
    EXPECT_DOUBLE_EQ(first.params_bytes, number_field(theory, "measured_params_bytes"));
    EXPECT_DOUBLE_EQ(first.grads_bytes, number_field(theory, "measured_grads_bytes"));
    EXPECT_DOUBLE_EQ(first.optim_bytes, number_field(theory, "measured_optim_bytes"));
  }
}

// Each flag the planner is given is honoured or refused: a zero or a negative never falls back to
// the default silently; --megatron and --heatmap are two runs.
TEST(PlanFlags, AZeroANegativeOrTwoRunsAreRefusedNamingTheFlag) {
  const std::string base = "./09_3d_parallel/plan --model tiny --cluster emulated ";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--gpus 0", "--gpus must be positive"},
           {"--nodes 0", "--nodes must be positive"},
           {"--batch 0", "--batch must be positive"},
           {"--efficiency 0", "--efficiency must be positive"},
           {"--memory-gb -1", "--memory-gb must be positive"},
           {"--peak-flops -1e12", "--peak-flops must be positive"},
           {"--inter-gbps -1", "--inter-gbps must be 0 or more"},
           {"--megatron docs/data/megatron_table1.csv --heatmap " + temp_dir() + "/never.csv",
            "--megatron, --published, --kernel-rates and --heatmap: give one"},
           {"--published --kernel-rates", "--megatron, --published, --kernel-rates and --heatmap: give one"}}) {
    SCOPED_TRACE(args);
    RunResult r = run_command(base + args, 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("error: " + message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("configurations predicted"), std::string::npos) << r.output;
  }
}

// The header shows the cluster the predictions used, overrides included; a cell never outgrows its
// column; a batch too small for the GPUs is blamed, not memory.
TEST(PlanFlags, TheOutputSaysWhatWasComputed) {
  RunResult r = run_command("./09_3d_parallel/plan --model tiny --cluster dgx-h100 --gpus 2 --batch 8 --top 2 "
                            "--intra-gbps 7 --inter-gbps 3 --peak-flops 2e12",
                            60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 TFLOP/s bf16 each, links per GPU 7 Gb/s 5 us in a node, 3 Gb/s 10 us between nodes"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("989"), std::string::npos) << r.output;

  r = run_command("./09_3d_parallel/plan --model tiny --cluster dgx-h100 --gpus 2 --batch 8 --top 2 --efficiency 1e-300",
                  60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("compute efficiency 1e-300"), std::string::npos) << r.output;
  std::istringstream lines(r.output);
  std::string line;
  int rows = 0;
  static const std::regex row("^[0-9]+ +dp ");
  while (std::getline(lines, line)) {
    if (!std::regex_search(line, row)) continue;
    rows++;
    std::istringstream cells(line);
    std::string cell;
    while (cells >> cell) EXPECT_LE(cell.size(), 12u) << line;
  }
  EXPECT_GT(rows, 0) << r.output;

  r = run_command("./09_3d_parallel/plan --model gpt2 --gpus 1048576 --batch 8", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the batch, not memory, is the limit"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("the least short"), std::string::npos) << r.output;
}

// A Table 1 row that is no configuration (t = -8) is refused naming the file and the row.
TEST(PlanRecord, AMalformedRowIsRefusedNotAnInternalError) {
  const std::string csv = temp_dir() + "/table1.csv";
  std::ifstream in("docs/data/megatron_table1.csv");
  std::ofstream out(csv);
  std::string line;
  bool header = true, changed = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#' && !header && !changed) {  // the first row: t = -8
      std::vector<std::string> fields;
      std::stringstream cells(line);
      for (std::string f; std::getline(cells, f, ',');) fields.push_back(f);
      fields[4] = "-8";
      line.clear();
      for (size_t i = 0; i < fields.size(); i++) line += (i ? "," : "") + fields[i];
      changed = true;
    } else if (!line.empty() && line[0] != '#') {
      header = false;
    }
    out << line << "\n";
  }
  out.close();
  ASSERT_TRUE(changed) << "no row found";
  RunResult r = run_command("./09_3d_parallel/plan --megatron " + csv, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("t = -8 and p = "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

// make plan-check's chapters, as its runs list them (scripts/plan/plan_check.sh: "name|ranks|NN_chapter|..."),
// are the range every description of it gives (docs/benchmarks.md once said 03-11 after 12's rows came).
TEST(PlanCheck, EveryDescriptionNamesTheChaptersItRuns) {
  auto text_of = [](const std::string& path) {
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << path;
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  };
  const std::string script = text_of("scripts/plan/plan_check.sh");
  static const std::regex run("\n  \"[^|\"]+\\|[0-9]+\\|([0-9][0-9])_[a-z0-9_]+\\|");
  std::string first = "99", last = "00";
  for (auto it = std::sregex_iterator(script.begin(), script.end(), run); it != std::sregex_iterator(); ++it) {
    first = std::min(first, (*it)[1].str());
    last = std::max(last, (*it)[1].str());
  }
  ASSERT_LE(first, last) << "no runs found in scripts/plan/plan_check.sh";
  const std::string range = first + "-" + last;
  EXPECT_NE(script.find("chapters (" + range + ")"), std::string::npos) << range;
  EXPECT_NE(text_of("docs/benchmarks.md").find("next to runs of " + range + " on this"), std::string::npos) << range;
  EXPECT_NE(text_of("docs/planner.md").find("against runs of " + range + " on this"), std::string::npos) << range;
  EXPECT_NE(text_of("Makefile").find("against runs of " + range + " on this"), std::string::npos) << range;
}

// A Table 1 row's printed command names the planner's model and the paper's implementation, and
// running it gives the row's teraFLOP/s by the paper's own count.
TEST(PlanRecord, ARowsCommandReproducesItsPrediction) {
  const std::vector<RecordRow> rows = read_megatron_table("docs/data/megatron_table1.csv");
  const RecordRow* row = nullptr;
  for (const RecordRow& r : rows)
    if (r.name() == "145.6B") row = &r;
  ASSERT_NE(row, nullptr);
  const double efficiency = 0.5;
  const PlanResult paper = plan_paper_config(*row, efficiency);
  const std::string command = one_command(record_inputs(*row, efficiency), paper.config);
  for (const char* flag : {"--model megatron-146b ", "--recompute full", "--attention materialized", "--no-dp-overlap",
                           "--efficiency 0.5"})
    EXPECT_NE(command.find(flag), std::string::npos) << flag << "\n" << command;
  const RunResult r = run_command("./" + command, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("model TFLOP/s ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_NEAR(std::atof(r.output.c_str() + at + 14), predicted_tflops(*row, paper.step_s), 0.051) << r.output;
}

// A chapters' mixture of experts timed at a measured routing's load (--expert-load, PlanInputs): the
// slowest EP rank's experts run load x their balanced rows, each a forward of 16 C^2 FLOPs a row (two
// products of C x 4C) and a backward of twice that; memory keeps the bound whatever the load.
TEST(Planner, TheExpertsAreTimedAtTheMeasuredLoad) {
  PlanInputs in = cpu_inputs("moe-small", 2, 8);
  in.cluster.peak_flops = 1e10, in.cluster.elementwise_rate = 0;
  PlanConfig c = config(2, 1, 1, Schedule::OneFOneB, 1, 4, 1, 0, Recompute::None, false);
  c.ep = 2;
  const PlanResult balanced = evaluate_plan(in, c);
  in.expert_load = 1.38;
  const PlanResult loaded = evaluate_plan(in, c);
  ASSERT_EQ(loaded.invalid, "");
  const GPT2Config& m = in.model;
  const double rows = 4.0 * m.T * m.top_k;  // a rank's routed rows a block at balanced routing
  EXPECT_NEAR(loaded.compute_s - balanced.compute_s, m.L * 0.38 * rows * 3 * 16.0 * m.C * m.C / 1e10, 1e-9);
  EXPECT_EQ(loaded.memory.activations, balanced.memory.activations);
}
