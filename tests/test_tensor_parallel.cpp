// test_tensor_parallel.cpp: the pieces chapter 07 (and 08) stand on, below the trainer:
//   - the process grid: coordinates and ranks are inverse, TP innermost, and every group split from
//     the world (the EP and expert-DP ones too) holds exactly the ranks the layout says (group_ranks,
//     checked without MPI in test_process_grid.cpp), ranked by their coordinate;
//   - the tensor-parallel layout: each rank's slices are Megatron's (qkv cut by heads within each of
//     q, k and v; fc by rows; proj by columns; wte by vocabulary), and the slices of every rank
//     together give back the whole model;
//   - the size checks of --tp: each size that does not divide (heads, vocabulary, 4C, positions under
//     sequence parallelism) is refused with its message, on models no preset has;
//   - initialisation: TrainingRun's real init path on a DP x TP grid gives, gathered, the TP = 1
//     initialisation of the same seed bit for bit (the whole model is made, then sliced);
//   - the tensor-parallel model: t ranks, each running its slices with f and g as collectives, give
//     the whole model's loss and, gathered, its gradients, with and without sequence parallelism.
// Runs under mpiexec at 1, 2 and 4 ranks (tests/manifest.txt); the model and initialisation tests
// split over every rank (and, on 4, TP 2 x DP 2 too; odd at TP 3 where the rank count is 3 or 6).
// Each layer on its own, without MPI: test_tp_layers.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <cstring>

#include "comm/comm.h"
#include "training/flags.h"
#include "ops/memory.h"
#include "model/model.h"
#include "mpi_test_env.h"
#include "ops/ops.h"
#include "training/optimizer.h"
#include "model/param_layout.h"
#include "comm/process_grid.h"
#include "parallel/shards.h"
#include "test_util.h"
#include "tp_test_hooks.h"
#include "training/training_run.h"

namespace {

// Every shape whose dp x tp x pp is `world`.
// The world ranks of a group's members, in the group's order (gathered over the group).
std::vector<float> world_ranks_in(Communicator& world, Communicator& group) {
  std::vector<float> mine{float(world.rank())}, all(group.size());
  group.all_gather(make_view(mine.data(), {1}), make_view(all.data(), {int64_t(all.size())}));
  return all;
}

std::vector<GridShape> shapes_of(int world) {
  std::vector<GridShape> shapes;
  for (int tp = 1; tp <= world; tp++)
    for (int pp = 1; pp <= world; pp++)
      if (world % (tp * pp) == 0) shapes.push_back({world / (tp * pp), tp, pp});
  return shapes;
}

TEST(GridLayout, CoordinatesAndRanksAreInverseWithTensorParallelInnermost) {
  for (int world : {1, 2, 4, 6, 8, 12}) {
    for (const GridShape& s : shapes_of(world)) {
      std::vector<int> seen(world, 0);
      for (int r = 0; r < world; r++) {
        const GridCoords c = grid_coords(s, r);
        ASSERT_LT(c.dp, s.dp);
        ASSERT_LT(c.tp, s.tp);
        ASSERT_LT(c.pp, s.pp);
        EXPECT_EQ(grid_rank(s, c), r);
        seen[r]++;
        // Consecutive ranks share a TP group; the pipeline stage changes slowest.
        EXPECT_EQ(c.tp, r % s.tp);
        EXPECT_EQ(c.pp, r / (s.tp * s.dp));
      }
      for (int r = 0; r < world; r++) EXPECT_EQ(seen[r], 1);
    }
  }
}

// Each group, all-gathering its members' world ranks, finds the ranks whose other coordinates are
// its own, in the order of its coordinate.
TEST(ProcessGrid, EachGroupHoldsTheRanksOfTheLayout) {
  Communicator& world = test_comm();
  for (const GridShape& s : shapes_of(world.size())) {
    SCOPED_TRACE("DP " + std::to_string(s.dp) + " x TP " + std::to_string(s.tp) + " x PP " + std::to_string(s.pp));
    ProcessGrid grid(world, s);
    const GridCoords me = grid.coords();
    auto members = [&](Communicator& group) { return world_ranks_in(world, group); };
    const std::vector<float> tp = members(grid.tp()), dp = members(grid.dp()), pp = members(grid.pp());
    ASSERT_EQ(int(tp.size()), s.tp);
    ASSERT_EQ(int(dp.size()), s.dp);
    ASSERT_EQ(int(pp.size()), s.pp);
    for (int i = 0; i < s.tp; i++) EXPECT_EQ(tp[i], grid_rank(s, {me.dp, i, me.pp}));
    for (int i = 0; i < s.dp; i++) EXPECT_EQ(dp[i], grid_rank(s, {i, me.tp, me.pp}));
    for (int i = 0; i < s.pp; i++) EXPECT_EQ(pp[i], grid_rank(s, {me.dp, me.tp, i}));
  }
}

// With context parallelism (chapter 10): CP sits between TP and DP, coordinates and ranks stay
// inverse, and at CP = 1 every rank keeps the coordinates of the DP x TP x PP layout.
TEST(GridLayout, ContextParallelSitsBetweenTensorAndDataParallel) {
  for (int world : {1, 2, 4, 8, 12}) {
    for (int cp = 1; cp <= world; cp++) {
      for (const GridShape& base : shapes_of(world)) {
        if (base.dp % cp != 0) continue;
        GridShape s = base;
        s.dp = base.dp / cp;
        s.cp = cp;
        std::vector<int> seen(world, 0);
        for (int r = 0; r < world; r++) {
          const GridCoords c = grid_coords(s, r);
          EXPECT_EQ(grid_rank(s, c), r);
          EXPECT_EQ(c.tp, r % s.tp);
          EXPECT_EQ(c.cp, (r / s.tp) % s.cp);
          seen[r]++;
          if (cp == 1) {
            const GridCoords old = grid_coords(base, r);
            EXPECT_EQ(c.dp, old.dp);
            EXPECT_EQ(c.pp, old.pp);
          }
        }
        for (int r = 0; r < world; r++) EXPECT_EQ(seen[r], 1);
      }
    }
  }
  EXPECT_EQ(grid_shape_problem(6, 1, 1, 4),
            "the 6 ranks do not divide into context-parallel rings of --cp 4: run on a multiple of 4 ranks, or change "
            "--cp");
  EXPECT_EQ(grid_shape_problem(12, 2, 1, 4),
            "the 12 ranks do not divide into tensor-parallel groups of --tp 2 times context-parallel rings of --cp 4: "
            "run on a multiple of 8 ranks, or change --tp or --cp");
}

// The ring and the DP x CP group hold the ranks the layout says, ranked by cp and by dp x CP + cp. At
// CP 1 the ring is the rank alone (chapter 10's ring of one) and DP x CP is DP.
TEST(ProcessGrid, ContextParallelGroupsHoldTheRanksOfTheLayout) {
  Communicator& world = test_comm();
  for (int cp = 1; cp <= world.size(); cp++) {
    if (world.size() % cp != 0) continue;
    SCOPED_TRACE("CP " + std::to_string(cp));
    const GridShape s = grid_shape(world.size(), 1, 1, cp);
    ProcessGrid grid(world, s);
    const GridCoords me = grid.coords();
    auto members = [&](Communicator& group) { return world_ranks_in(world, group); };
    const std::vector<float> ring = members(grid.cp()), replicas = members(grid.dp_cp()), dp = members(grid.dp());
    ASSERT_EQ(int(ring.size()), cp);
    ASSERT_EQ(int(replicas.size()), s.dp * cp);
    ASSERT_EQ(int(dp.size()), s.dp);
    for (int i = 0; i < cp; i++) EXPECT_EQ(ring[i], grid_rank(s, {me.dp, 0, 0, i}));
    for (int i = 0; i < s.dp; i++) EXPECT_EQ(dp[i], grid_rank(s, {i, 0, 0, me.cp}));
    for (int d = 0; d < s.dp; d++)
      for (int c = 0; c < cp; c++) EXPECT_EQ(replicas[d * cp + c], grid_rank(s, {d, 0, 0, c}));
  }
}

// Chapters 01-06's grid, data parallelism alone, splits no communicator off the world (over NCCL each
// would be an NCCL communicator of its own): its data-parallel group is the world itself.
TEST(ProcessGrid, DataParallelAloneIsTheWorld) {
  Communicator& world = test_comm();
  ProcessGrid grid(world);
  EXPECT_TRUE(grid.data_parallel_only());
  EXPECT_EQ(&grid.dp(), &world);
  EXPECT_EQ(&grid.dp_cp(), &world);
  EXPECT_EQ(grid.embedding(), nullptr);
  EXPECT_EQ(grid.shape().dp, world.size());
  EXPECT_EQ(grid.shape().world(), world.size());
  EXPECT_EQ(grid.coords().dp, world.rank());
  EXPECT_EQ(grid.describe(), "DP " + std::to_string(world.size()) + " x TP 1 x PP 1");
  EXPECT_FALSE(ProcessGrid(world, grid_shape(world.size(), 1, 1)).data_parallel_only());
}

// Every communicator of the grid, with expert parallelism folded in (every TP, PP, CP, Ulysses and EP
// that divide the world), holds the ranks group_ranks lists, in its order: the plain function
// test_process_grid.cpp checks is the one the communicators are built from. (At U = 1 there is no
// Ulysses group, and the ring is the cp group.)
TEST(ProcessGrid, EveryCommunicatorHoldsTheRanksOfGroupRanks) {
  Communicator& world = test_comm();
  const int W = world.size();
  for (int tp = 1; tp <= W; tp++)
    for (int pp = 1; pp <= W; pp++)
      for (int cp = 1; cp <= W; cp++)
        for (int u = 1; u <= W; u++) {
          if (W % (tp * pp * cp * u) != 0) continue;
          for (int ep = 1; ep <= W / pp; ep++) {
            if ((W / pp) % ep != 0) continue;
            const GridShape s = grid_shape(W, tp, pp, cp, ep, u);
            ProcessGrid grid(world, s);
            SCOPED_TRACE(grid.describe());
            const std::pair<GridGroup, Communicator*> groups[] = {
                {GridGroup::TP, &grid.tp()},        {GridGroup::CP, &grid.cp()},
                {GridGroup::DP, &grid.dp()},        {GridGroup::DPxCP, &grid.dp_cp()},
                {GridGroup::PP, &grid.pp()},        {GridGroup::Embedding, grid.embedding()},
                {GridGroup::EP, &grid.ep()},        {GridGroup::ExpertDP, &grid.expert_dp()},
                {GridGroup::Ulysses, grid.ulysses()}, {GridGroup::Ring, &grid.ring()}};
            for (const auto& [which, comm] : groups) {
              std::vector<int> want = group_ranks(s, world.rank(), which);
              if (which == GridGroup::Ulysses && u == 1) want.clear();
              if (want.empty()) {
                EXPECT_EQ(comm, nullptr) << group_name(which);
                continue;
              }
              ASSERT_NE(comm, nullptr) << group_name(which);
              // Gathered before any check, so that a rank that fails leaves none of its peers waiting.
              const std::vector<float> got = world_ranks_in(world, *comm);
              EXPECT_EQ(got.size(), want.size()) << group_name(which);
              for (size_t i = 0; i < std::min(got.size(), want.size()); i++)
                EXPECT_EQ(got[i], float(want[i])) << group_name(which) << " member " << i;
              EXPECT_EQ(comm->rank() < int(want.size()) ? want[comm->rank()] : -1, world.rank()) << group_name(which);
            }
            EXPECT_EQ(grid.ep().rank(), grid.coords().ep);
            EXPECT_EQ(grid.expert_dp().rank(), grid.coords().edp);
            if (u == 1) {
              EXPECT_EQ(&grid.ring(), &grid.cp());
            }
          }
        }
  if (W == 4) {  // EP is named only when it is above 1, so that 07-10 keep their strings
    ProcessGrid experts(world, grid_shape(4, 1, 1, 1, 2));
    EXPECT_EQ(experts.describe(), "DP 4 x TP 1 x PP 1 x EP 2 (expert DP 2)");
    ProcessGrid dense(world, grid_shape(4, 2, 1, 2));
    EXPECT_EQ(dense.describe(), "DP 1 x TP 2 x PP 1 x CP 2");
    ProcessGrid ulysses(world, grid_shape(4, 1, 1, 1, 1, 2));
    EXPECT_EQ(ulysses.describe(), "DP 2 x TP 1 x PP 1 x Ulysses 2");
  }
}

// A model every tested split divides: NH, 4C and V by 2, 3 and 4; B*T by 2 and 4 (sequence parallel).
GPT2Config small_config() {
  GPT2Config cfg;
  cfg.preset = "custom";
  cfg.L = 2; cfg.C = 24; cfg.NH = 12; cfg.T = 6; cfg.V = 36;
  return cfg;
}

std::vector<float> random_model(const ParamLayout& global, uint64_t seed) {
  std::vector<float> params(global.padded_size, 0.0f);
  GPT2::init_weights(global, seed, params.data());
  const std::vector<float> noise = random_vector(params.size(), seed + 1, -0.05f, 0.05f);
  for (const ParamInfo& p : global.params)  // (padding stays zero)
    for (int64_t i = p.offset; i < p.offset + p.size; i++) params[i] += noise[i];
  return params;
}

TEST(TensorParallelLayout, SlicesAreMegatronsAndTogetherGiveTheWholeModel) {
  const GPT2Config cfg = small_config();
  const ParamLayout global = build_gpt2_layout(cfg, 1);
  const std::vector<float> whole = random_model(global, 5);
  const int64_t C = cfg.C;
  for (int t : {1, 2, 3, 4}) {
    SCOPED_TRACE("t = " + std::to_string(t));
    std::vector<float> rebuilt(global.padded_size, 0.0f);
    int64_t sliced_params = 0;
    for (int r = 0; r < t; r++) {
      const ParamLayout local = build_gpt2_layout(cfg, 2, {t, r, false});
      std::vector<float> mine(local.padded_size);
      slice_from_global(global, whole.data(), local, mine.data());
      auto at = [&](const std::string& name, int64_t row, int64_t col) {  // this rank's element
        const ParamInfo& p = local.params[local.find(name)];
        return mine[p.offset + row * p.shape[1] + col];
      };
      auto global_at = [&](const std::string& name, int64_t row, int64_t col) {
        const ParamInfo& p = global.params[global.find(name)];
        return whole[p.offset + row * p.shape[1] + col];
      };
      // qkv: rank r's rows of q, then of k, then of v: its heads in each.
      const int64_t c = C / t;
      for (int block = 0; block < 3; block++)
        for (int64_t i : {int64_t(0), c - 1})
          EXPECT_EQ(at("h0.attn.qkv.weight", block * c + i, 3), global_at("h0.attn.qkv.weight", block * C + r * c + i, 3));
      EXPECT_EQ(at("h1.mlp.fc.weight", 1, 2), global_at("h1.mlp.fc.weight", r * 4 * C / t + 1, 2));
      EXPECT_EQ(at("h1.mlp.proj.weight", 2, 1), global_at("h1.mlp.proj.weight", 2, r * 4 * C / t + 1));
      EXPECT_EQ(at("h0.attn.proj.weight", 0, c - 1), global_at("h0.attn.proj.weight", 0, r * c + c - 1));
      EXPECT_EQ(at("wte", 1, 0), global_at("wte", r * cfg.V / t + 1, 0));
      const ParamInfo& ln = local.params[local.find("h0.ln1.weight")];
      EXPECT_TRUE(ln.shard.whole());
      EXPECT_EQ(ln.size, C);
      for (const ParamInfo& p : local.params)
        if (!p.shard.whole()) sliced_params += p.size;
      place_into_global(local, mine.data(), global, rebuilt.data());
    }
    EXPECT_EQ(rebuilt, whole);
    // Every sliced tensor is cut into t disjoint parts that cover it.
    int64_t split_globally = 0;
    for (const ParamInfo& p : build_gpt2_layout(cfg, 1, {t, 0, false}).params)
      if (!p.shard.whole()) split_globally += p.global_shape[0] * std::max<int64_t>(1, p.global_shape[1]);
    EXPECT_EQ(sliced_params, split_globally);
  }
}

// The size checks of --tp, on hand-made models. Through the trainer only the heads' refusal is
// reachable: every preset that splits its heads also splits its vocabulary, and t | NH | C implies
// t | 4C, so the 4C check stands guard for a model whose C its heads do not divide.
TEST(TensorParallelSizes, EachSizeThatDoesNotDivideIsRefusedByName) {
  const GPT2Config fits = small_config();  // NH 12, V 36, 4C 96: divide by 2, 3 and 4
  auto problem = [](const GPT2Config& cfg, int t, bool sequence_parallel = false, int micro_batch = 2) {
    return tensor_parallel_size_problem(cfg, {t, 0, sequence_parallel}, micro_batch);
  };
  auto names = [](const std::string& problem, const std::string& what) {
    return problem.find(what) != std::string::npos ? testing::AssertionSuccess()
                                                   : testing::AssertionFailure() << "'" << what << "' not in '"
                                                                                 << problem << "'";
  };
  for (int t : {1, 2, 3, 4}) {
    EXPECT_EQ(problem(fits, t), "") << "t = " << t;
    EXPECT_EQ(problem(fits, t, true), "") << "t = " << t << ", sequence parallel";
  }

  GPT2Config vocabulary = fits;  // the heads split over 4, the vocabulary does not
  vocabulary.V = fits.V + 2;
  const std::string v = problem(vocabulary, 4);
  EXPECT_TRUE(names(v, "--tp 4 must divide the vocabulary V = " + std::to_string(vocabulary.V) + " of --preset " +
                           vocabulary.preset + " (every tensor-parallel rank takes an equal part of it)"));
  EXPECT_EQ(problem(vocabulary, 2), "") << "V = " << vocabulary.V << " splits over 2";

  GPT2Config width = fits;  // heads and vocabulary split over 8, 4C does not
  width.NH = 8;
  width.C = 9;
  width.V = 40;
  EXPECT_TRUE(names(problem(width, 8), "--tp 8 must divide the MLP's width 4C = " + std::to_string(4 * width.C)));

  GPT2Config nothing = fits;  // nothing divides: the heads are named first, then the vocabulary
  nothing.NH = 3;
  nothing.V = 37;
  EXPECT_TRUE(names(problem(nothing, 2), "the number of heads NH = 3"));
  EXPECT_TRUE(names(problem(nothing, 3), "the vocabulary V = 37"));
  EXPECT_EQ(problem(nothing, 1, true, 1), "") << "one rank splits nothing";

  // Sequence parallelism: the B*T positions of a micro-batch must divide too, and only then.
  const int t = 4, odd_micro_batch = 1;
  ASSERT_NE(odd_micro_batch * fits.T % t, 0) << "test bug: the positions divide";
  EXPECT_EQ(problem(fits, t, false, odd_micro_batch), "");
  EXPECT_TRUE(names(problem(fits, t, true, odd_micro_batch),
                    "--sequence-parallel splits the B*T = " + std::to_string(odd_micro_batch) + " x " +
                        std::to_string(fits.T) + " positions of a micro-batch over --tp " + std::to_string(t)));
}

// TrainingRun as a chapter builds it: quiet, on the built-in corpus, with a batch every grid tested
// here splits over its data-parallel ranks.
TrainConfig init_config(const std::string& preset) {
  TrainConfig cfg;
  cfg.chapter = "test_tensor_parallel";
  cfg.preset = preset;
  cfg.batch = 12;
  cfg.given.insert("--batch");
  cfg.steps = 1;
  cfg.quiet = true;
  return cfg;
}

// This rank's parameters after TrainingRun::init_or_resume on a DP x `t` grid of every rank, and the
// layout of each rank of its tensor-parallel group. The groups must end before the test does.
struct Initialised {
  std::vector<float> params;              // this rank's, in layouts[its TP rank]
  std::vector<ParamLayout> layouts;       // every TP rank's, in TP order
  std::vector<float> gathered;            // every TP rank's params, in TP order
};
Initialised initialise(Communicator& world, const std::string& preset, int t) {
  ProcessGrid grid(world, {world.size() / t, t, 1});
  TrainConfig cfg = init_config(preset);
  const TensorParallelism tp{t, grid.coords().tp, false};
  TrainingRun run(grid, cfg, Parallelism{Strategy::DP, tp});
  const ParamLayout& layout = run.layout();
  Buffer params(layout.padded_size, MemCategory::Params);
  AdamW optimizer(layout, ShardPlan::unsharded(layout), cfg.weight_decay);
  EXPECT_EQ(run.init_or_resume(params, optimizer), 0);
  Initialised out;
  out.params.assign(params.f32(), params.f32() + layout.padded_size);
  for (int q = 0; q < t; q++)
    out.layouts.push_back(build_gpt2_layout(run.model_config(), grid.dp().size(), {t, q, false}));
  out.gathered.resize(size_t(layout.padded_size) * t);
  grid.tp().all_gather(make_view(out.params.data(), {layout.padded_size}),
                       make_view(out.gathered.data(), {int64_t(out.gathered.size())}));
  return out;
}

// TrainingRun makes the whole model from the seed and then slices it, so the grid cannot change the
// model: each rank's slices, gathered over its TP group and placed by the layout, are the TP = 1
// model bit for bit, padding included. (A model initialised rank by rank from its own slices fails.)
TEST(TensorParallelInit, GatheredSlicesAreTheOneRankInitialisationBitForBit) {
  Communicator& world = test_comm();
  std::vector<std::pair<std::string, int>> splits;  // preset, TP size
  if (world.size() > 1) splits.push_back({"tiny", world.size()});
  if (world.size() == 4) splits.push_back({"tiny", 2});  // DP 2 x TP 2
  if (world.size() % 3 == 0) splits.push_back({"odd", 3});
  if (splits.empty()) GTEST_SKIP() << "needs 2 or more ranks to split the model";
  for (const auto& [preset, t] : splits) {
    SCOPED_TRACE("preset " + preset + ", TP " + std::to_string(t) + " x DP " + std::to_string(world.size() / t));
    const Initialised whole = initialise(world, preset, 1);
    const ParamLayout& global = whole.layouts[0];
    const Initialised split = initialise(world, preset, t);
    ASSERT_EQ(int(split.layouts.size()), t);
    const int64_t local_size = split.layouts[0].padded_size;
    std::vector<float> placed(global.padded_size, 0.0f);
    for (int q = 0; q < t; q++)
      place_into_global(split.layouts[q], &split.gathered[size_t(local_size) * q], global, placed.data());
    for (const ParamInfo& p : global.params)
      EXPECT_EQ(std::memcmp(&placed[p.offset], &whole.params[p.offset], size_t(p.size) * sizeof(float)), 0) << p.name;
    EXPECT_EQ(std::memcmp(placed.data(), whole.params.data(), placed.size() * sizeof(float)), 0);
    // The split is real: a rank's buffer holds slices, not the whole model.
    EXPECT_LT(local_size, global.padded_size);
  }
}


// Two micro-batches of gradient accumulation, so that the split model's accumulation is checked too.
TEST(TensorParallelModel, LossesAndGatheredGradientsEqualTheWholeModels) {
  Communicator& world = test_comm();
  const int t = world.size();
  if (t == 1) GTEST_SKIP() << "needs 2 or more ranks to split the model";
  const GPT2Config cfg = small_config();
  const int B = 2;
  const ParamLayout global = build_gpt2_layout(cfg, 1);
  std::vector<float> whole = random_model(global, 11);
  const std::vector<int> inputs = random_ints(2 * B * cfg.T, cfg.V, 3), targets = random_ints(2 * B * cfg.T, cfg.V, 4);

  // The whole model on one rank: the reference.
  std::vector<float> whole_grads(global.padded_size, 0.0f);
  GPT2 reference(cfg, global, B);
  reference.bind_all(whole.data(), whole_grads.data());
  std::vector<float> reference_losses;
  for (int micro = 0; micro < 2; micro++) {
    reference_losses.push_back(reference.forward(&inputs[micro * B * cfg.T], &targets[micro * B * cfg.T], B));
    reference.backward(0.5f);
  }

  for (bool sequence_parallel : {false, true}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "tensor parallel");
    const TensorParallelism tp{t, world.rank(), sequence_parallel};
    const ParamLayout local = build_gpt2_layout(cfg, 1, tp);
    std::vector<float> params(local.padded_size), grads(local.padded_size, 0.0f);
    slice_from_global(global, whole.data(), local, params.data());
    GPT2 model(cfg, local, B, Device::CPU, DType::F32, tp);
    model.bind_all(params.data(), grads.data());
    set_tensor_parallel_hooks(model, world, sequence_parallel);
    for (int micro = 0; micro < 2; micro++) {
      const float loss = model.forward(&inputs[micro * B * cfg.T], &targets[micro * B * cfg.T], B);
      EXPECT_NEAR(loss, reference_losses[micro], 1e-5 * reference_losses[micro]) << "micro-batch " << micro;
      model.backward(0.5f);
    }
    // Under sequence parallelism a tensor held whole has each rank's rows' share of its gradient: on
    // its own, not the gradient (the classic silent bug, the final layernorm's included), until it
    // is summed over the group.
    if (sequence_parallel) {
      for (const char* name : {"h0.ln1.weight", "h1.attn.proj.bias", "lnf.weight", "lnf.bias", "wpe"}) {
        const ParamInfo& p = local.params[local.find(name)];
        const ParamInfo& g = global.params[global.find(name)];
        EXPECT_FALSE(allclose(&grads[p.offset], &whole_grads[g.offset], p.size, 1e-6, 1e-4))
            << name << ": one rank's share already equals the whole gradient, so the test proves nothing";
      }
      for (const ParamInfo& p : local.params)
        if (p.shard.whole()) world.all_reduce(make_view(&grads[p.offset], {p.size}), ReduceOp::Sum);
    }
    // Gather every rank's slices of the gradient into the whole model's places.
    std::vector<float> all(local.padded_size * t), gathered(global.padded_size, 0.0f);
    world.all_gather(make_view(grads.data(), {local.padded_size}), make_view(all.data(), {int64_t(all.size())}));
    for (int q = 0; q < t; q++)
      place_into_global(build_gpt2_layout(cfg, 1, {t, q, sequence_parallel}), &all[local.padded_size * q], global,
                        gathered.data());
    for (const ParamInfo& p : global.params)
      EXPECT_TRUE(allclose(&gathered[p.offset], &whole_grads[p.offset], p.size, 1e-6, 1e-4)) << p.name;
  }
}

}  // namespace
