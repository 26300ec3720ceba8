// test_process_grid.cpp: the one process grid (process_grid.h) as data, without MPI. Over every shape of
// up to 16 ranks (DP 2 x CP 2 x TP 2 x PP 2 with EP 1, 2, 4 and 8, DP 3 x TP 2 with EP 3, ...), and
// with Ulysses of up to 8 (CP 2 x Ulysses 2 x TP 2, ...):
// coordinates and ranks are inverse; every group's member list (group_ranks, from which ProcessGrid
// builds its communicators) has its size, holds the rank at the place of its coordinate, is the same
// list from every member, and the groups of one kind partition the world; TP groups are consecutive
// ranks; an EP group stays inside one pipeline stage and meets its expert-DP group in one rank; with
// TP = CP = PP = 1, EP is chapter 11's layout; Ulysses inside the ring lays the ranks out as the one
// context axis of CP x U ranks did. Then the refusals of shapes that do not divide, whose
// suggestions must fit. The communicators themselves: test_tensor_parallel.cpp, under mpiexec.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "parallel/dimension.h"     // expert_count_problem: the expert dimension's refusal of --ep
#include "model/model_config.h"  // find_preset
#include "comm/process_grid.h"

namespace {

// Every kind but the embedding group, which pairs the ends of a pipeline only (tested on its own).
const GridGroup kPartitions[] = {GridGroup::TP, GridGroup::CP,       GridGroup::DP,      GridGroup::DPxCP,
                                 GridGroup::PP, GridGroup::EP,       GridGroup::ExpertDP, GridGroup::Ulysses,
                                 GridGroup::Ring};

std::string name_of(const GridShape& s) {
  return "DP " + std::to_string(s.dp) + " x CP " + std::to_string(s.cp) + " x U " + std::to_string(s.u) + " x TP " +
         std::to_string(s.tp) + " x PP " + std::to_string(s.pp) + ", EP " + std::to_string(s.ep);
}

// Every shape of 1 to 16 ranks, and with Ulysses 2 or 4 of up to 8 (the suite's time), with every EP
// that divides a stage's DP x CP x U x TP ranks.
std::vector<GridShape> all_shapes() {
  std::vector<GridShape> shapes;
  for (int u : {1, 2, 4})
    for (int dp = 1, most = u == 1 ? 16 : 8; dp * u <= most; dp++)
      for (int cp = 1; dp * cp * u <= most; cp++)
        for (int tp = 1; dp * cp * u * tp <= most; tp++)
          for (int pp = 1; dp * cp * u * tp * pp <= most; pp++)
            for (int ep = 1; ep <= dp * cp * u * tp; ep++)
              if ((dp * cp * u * tp) % ep == 0) shapes.push_back({dp, tp, pp, cp, ep, u});
  return shapes;
}

bool has_shape(const std::vector<GridShape>& shapes, GridShape want) {
  return std::any_of(shapes.begin(), shapes.end(), [&](const GridShape& s) {
    return s.dp == want.dp && s.tp == want.tp && s.pp == want.pp && s.cp == want.cp && s.ep == want.ep &&
           s.u == want.u;
  });
}

// The size of a group of `which`, and the place a rank with coordinates `c` holds in it.
int expected_size(const GridShape& s, GridGroup which) {
  switch (which) {
    case GridGroup::TP: return s.tp;
    case GridGroup::CP: return s.cp * s.u;
    case GridGroup::DP: return s.dp;
    case GridGroup::DPxCP: return s.dp * s.cp * s.u;
    case GridGroup::PP: return s.pp;
    case GridGroup::Embedding: return 2;
    case GridGroup::EP: return s.ep;
    case GridGroup::ExpertDP: return s.edp();
    case GridGroup::Ulysses: return s.u;
    case GridGroup::Ring: return s.cp;
  }
  return -1;
}

int expected_place(const GridShape& s, const GridCoords& c, GridGroup which) {
  switch (which) {
    case GridGroup::TP: return c.tp;
    case GridGroup::CP: return c.cp * s.u + c.u;  // context_rank
    case GridGroup::DP: return c.dp;
    case GridGroup::DPxCP: return (c.dp * s.cp + c.cp) * s.u + c.u;
    case GridGroup::PP: return c.pp;
    case GridGroup::Embedding: return c.pp == 0 ? 0 : 1;
    case GridGroup::EP: return c.ep;
    case GridGroup::ExpertDP: return c.edp;
    case GridGroup::Ulysses: return c.u;
    case GridGroup::Ring: return c.cp;
  }
  return -1;
}

TEST(GridShapes, CoverTheShapesOfTheLesson) {
  const std::vector<GridShape> shapes = all_shapes();
  for (int ep : {1, 2, 4, 8}) EXPECT_TRUE(has_shape(shapes, {2, 2, 2, 2, ep})) << ep;
  EXPECT_TRUE(has_shape(shapes, {3, 2, 1, 1, 3}));
  EXPECT_TRUE(has_shape(shapes, {4, 1, 1, 1, 2}));  // chapter 11's DP 2 x EP 2
  EXPECT_TRUE(has_shape(shapes, {1, 2, 1, 2, 1, 2}));  // 12's CP 2 x Ulysses 2 x TP 2
  EXPECT_TRUE(has_shape(shapes, {2, 1, 2, 1, 4, 2}));  // 12's Ulysses 2 x PP 2 x EP 4
}

TEST(GridLayout, CoordinatesAndRanksAreInverse) {
  for (const GridShape& s : all_shapes()) {
    SCOPED_TRACE(name_of(s));
    for (int r = 0; r < s.world(); r++) {
      const GridCoords c = grid_coords(s, r);
      ASSERT_TRUE(c.dp >= 0 && c.dp < s.dp && c.tp >= 0 && c.tp < s.tp && c.pp >= 0 && c.pp < s.pp && c.cp >= 0 &&
                  c.cp < s.cp && c.ep >= 0 && c.ep < s.ep && c.edp >= 0 && c.edp < s.edp() && c.u >= 0 &&
                  c.u < s.u)
          << "rank " << r;
      EXPECT_EQ(grid_rank(s, c), r);
      // The header's two numberings of a rank inside its stage are one number.
      const int inside = ((c.dp * s.cp + c.cp) * s.u + c.u) * s.tp + c.tp;
      EXPECT_EQ(c.pp * s.stage_ranks() + inside, r);
      EXPECT_EQ(c.edp * s.ep + c.ep, inside) << "rank " << r;
    }
  }
}

// Each group: its size, the rank at the place of its coordinate, the same list from every member;
// and the groups of one kind, each counted once, cover every rank exactly once.
TEST(GridGroups, EveryKindPartitionsTheWorldRankedByItsCoordinate) {
  for (const GridShape& s : all_shapes()) {
    for (GridGroup which : kPartitions) {
      SCOPED_TRACE(name_of(s) + ", group " + group_name(which));
      std::vector<int> covered(s.world(), 0);
      for (int r = 0; r < s.world(); r++) {
        const std::vector<int> members = group_ranks(s, r, which);
        ASSERT_EQ(int(members.size()), expected_size(s, which)) << "rank " << r;
        const int place = expected_place(s, grid_coords(s, r), which);
        ASSERT_EQ(members[place], r) << "rank " << r << " is not at its coordinate";
        for (int m : members) {
          ASSERT_TRUE(m >= 0 && m < s.world()) << m;
          EXPECT_EQ(group_ranks(s, m, which), members) << "rank " << r << " and member " << m << " disagree";
        }
        if (members.front() == r) for (int m : members) covered[m]++;  // each group counted at its first member
      }
      for (int r = 0; r < s.world(); r++) EXPECT_EQ(covered[r], 1) << "rank " << r;
    }
  }
}

// The members differ from the rank in the group's own coordinates only: a TP group keeps pp, dp and cp,
// an EP group its stage and edp, and so on.
TEST(GridGroups, MembersShareEveryOtherCoordinate) {
  for (const GridShape& s : all_shapes()) {
    SCOPED_TRACE(name_of(s));
    for (int r = 0; r < s.world(); r++) {
      const GridCoords c = grid_coords(s, r);
      auto coords_of = [&](GridGroup which) {
        std::vector<GridCoords> out;
        for (int m : group_ranks(s, r, which)) out.push_back(grid_coords(s, m));
        return out;
      };
      for (const GridCoords& m : coords_of(GridGroup::TP))
        EXPECT_TRUE(m.pp == c.pp && m.dp == c.dp && m.cp == c.cp && m.u == c.u);
      for (const GridCoords& m : coords_of(GridGroup::CP)) EXPECT_TRUE(m.pp == c.pp && m.dp == c.dp && m.tp == c.tp);
      for (const GridCoords& m : coords_of(GridGroup::Ulysses))
        EXPECT_TRUE(m.pp == c.pp && m.dp == c.dp && m.cp == c.cp && m.tp == c.tp);
      for (const GridCoords& m : coords_of(GridGroup::Ring))
        EXPECT_TRUE(m.pp == c.pp && m.dp == c.dp && m.u == c.u && m.tp == c.tp);
      for (const GridCoords& m : coords_of(GridGroup::DP))
        EXPECT_TRUE(m.pp == c.pp && m.cp == c.cp && m.u == c.u && m.tp == c.tp);
      for (const GridCoords& m : coords_of(GridGroup::DPxCP)) EXPECT_TRUE(m.pp == c.pp && m.tp == c.tp);
      for (const GridCoords& m : coords_of(GridGroup::PP))
        EXPECT_TRUE(m.dp == c.dp && m.cp == c.cp && m.u == c.u && m.tp == c.tp);
      for (const GridCoords& m : coords_of(GridGroup::EP)) EXPECT_TRUE(m.pp == c.pp && m.edp == c.edp);
      for (const GridCoords& m : coords_of(GridGroup::ExpertDP)) EXPECT_TRUE(m.pp == c.pp && m.ep == c.ep);
    }
  }
}

// TP wants the fastest links, so its groups are consecutive ranks (one node); so are EP's, inside one
// stage. An EP group and its expert-DP group are the two axes through a rank: they meet only there.
TEST(GridGroups, TensorAndExpertGroupsAreConsecutiveAndExpertGroupsStayInAStage) {
  for (const GridShape& s : all_shapes()) {
    SCOPED_TRACE(name_of(s));
    for (int r = 0; r < s.world(); r++) {
      const std::vector<int> tp = group_ranks(s, r, GridGroup::TP);
      for (size_t i = 0; i < tp.size(); i++) EXPECT_EQ(tp[i], tp[0] + int(i)) << "rank " << r;
      const std::vector<int> ep = group_ranks(s, r, GridGroup::EP);
      for (size_t i = 0; i < ep.size(); i++) EXPECT_EQ(ep[i], ep[0] + int(i)) << "rank " << r;
      const int stage = r / s.stage_ranks();
      for (int m : ep) EXPECT_EQ(grid_coords(s, m).pp, stage) << "rank " << r << "'s EP group leaves the stage: " << m;
      std::vector<int> edp = group_ranks(s, r, GridGroup::ExpertDP), both;
      std::vector<int> ep_sorted = ep;
      std::sort(edp.begin(), edp.end());
      std::sort(ep_sorted.begin(), ep_sorted.end());
      std::set_intersection(ep_sorted.begin(), ep_sorted.end(), edp.begin(), edp.end(), std::back_inserter(both));
      EXPECT_EQ(both, std::vector<int>{r});
    }
  }
}

// With TP = CP = PP = 1, chapter 11's layout before the grids were one: world rank = dp_rank x EP +
// ep_rank, the EP group the consecutive ranks of one dp_rank, expert-DP the ranks of one ep_rank.
TEST(GridGroups, WithoutTensorContextOrPipelineExpertsKeepChapter11sLayout) {
  for (int world = 1; world <= 16; world++)
    for (int ep = 1; ep <= world; ep++) {
      if (world % ep) continue;
      const GridShape s = grid_shape(world, 1, 1, 1, ep);
      SCOPED_TRACE(name_of(s));
      for (int r = 0; r < world; r++) {
        const int dp_rank = r / ep, ep_rank = r % ep;
        std::vector<int> ep_group, expert_dp;
        for (int i = 0; i < ep; i++) ep_group.push_back(dp_rank * ep + i);
        for (int i = 0; i < world / ep; i++) expert_dp.push_back(i * ep + ep_rank);
        EXPECT_EQ(group_ranks(s, r, GridGroup::EP), ep_group);
        EXPECT_EQ(group_ranks(s, r, GridGroup::ExpertDP), expert_dp);
      }
    }
}

// The grid is its order and sizes (RankOrder): the group of any set of axes holds the ranks that share
// every other coordinate, as many as the product of its axes' sizes, ranked by their coordinates with
// the order's first token fastest; and the formula of the lesson is the order "tp-ulysses-cp-dp-pp".
TEST(GridOrder, TheGroupOfAnySetOfAxesSharesEveryOtherCoordinate) {
  const GridAxis axes[] = {kAxisTP, kAxisU, kAxisCP, kAxisDP, kAxisPP};  // the order's
  for (const GridShape& s : all_shapes()) {
    if (s.ep > 1) continue;  // (EP re-splits a stage: the dense axes are the same for every EP)
    SCOPED_TRACE(name_of(s));
    std::vector<GridCoords> at;  // every rank's
    for (int r = 0; r < s.world(); r++) {
      at.push_back(grid_coords(s, r));
      const GridCoords& c = at.back();
      ASSERT_EQ(r, (((c.pp * s.dp + c.dp) * s.cp + c.cp) * s.u + c.u) * s.tp + c.tp);
    }
    for (unsigned subset = 0; subset < 32; subset++) {  // every subset of the five axes
      AxisSet mask = 0;
      for (size_t i = 0; i < 5; i++)
        if (subset & (1u << i)) mask |= axes[i];
      int size = 1;
      for (GridAxis a : axes) size *= (mask & a) ? s.size(a) : 1;
      for (int r = 0; r < s.world(); r++) {
        const std::vector<int> members = axis_group_ranks(s, r, mask);
        ASSERT_EQ(int(members.size()), size) << "mask " << mask;
        int place = 0, stride = 1;  // r's place: its coordinates on the mask, the order's first fastest
        for (GridAxis a : axes)
          if (mask & a) place += axis_coord(at[size_t(r)], a) * stride, stride *= s.size(a);
        EXPECT_EQ(members[size_t(place)], r) << "mask " << mask;
        for (int m : members)
          for (GridAxis a : axes)
            if (!(mask & a)) {
              EXPECT_EQ(axis_coord(at[size_t(m)], a), axis_coord(at[size_t(r)], a)) << "mask " << mask;
            }
      }
    }
  }
  // Another order is another layout of the same groups: DP innermost puts the DP replicas side by side.
  const GridShape s{2, 2, 1, 1, 1};  // DP 2 x TP 2
  const RankOrder dp_first(s, "dp-tp-cp-pp");
  EXPECT_EQ(dp_first.group(0, kAxisDP), (std::vector<int>{0, 1}));
  EXPECT_EQ(dp_first.group(0, kAxisTP), (std::vector<int>{0, 2}));
  EXPECT_EQ(axes_named("dp-cp"), AxisSet(kAxisDP | kAxisCP));
  EXPECT_EQ(axes_named("cp-ulysses"), kContextAxes);
  EXPECT_EQ(axes_named("dp-xx"), 0u);
}

// Ulysses is an axis of its own inside the ring, and the layout is the one a single context axis of
// CP x U ranks gave (the chapters' before it was an axis): the same world ranks, the cp group ranked
// by ring place x U + Ulysses rank (context_rank), so every rank holds the same positions as before.
// The ulysses group is U consecutive places of the cp group, the ring every U-th.
TEST(GridOrder, UlyssesInsideTheRingIsTheContextAxisOfCpTimesU) {
  for (const GridShape& s : all_shapes()) {
    if (s.u == 1) continue;
    SCOPED_TRACE(name_of(s));
    GridShape folded = s;  // one context axis of CP x U ranks
    folded.cp = s.cp * s.u, folded.u = 1;
    const RankOrder old_order(folded, "tp-cp-dp-pp");
    for (int r = 0; r < s.world(); r++) {
      const GridCoords c = grid_coords(s, r);
      EXPECT_EQ(old_order.coord(r, kAxisCP), context_rank(s, c)) << "rank " << r;
      EXPECT_EQ(group_ranks(s, r, GridGroup::CP), group_ranks(folded, r, GridGroup::CP)) << "rank " << r;
      EXPECT_EQ(group_ranks(s, r, GridGroup::DPxCP), group_ranks(folded, r, GridGroup::DPxCP)) << "rank " << r;
      const std::vector<int> context = group_ranks(s, r, GridGroup::CP);
      const int place = c.cp;
      for (int i = 0; i < s.u; i++)
        EXPECT_EQ(group_ranks(s, r, GridGroup::Ulysses)[size_t(i)], context[size_t(place * s.u + i)]);
      for (int i = 0; i < s.cp; i++)
        EXPECT_EQ(group_ranks(s, r, GridGroup::Ring)[size_t(i)], context[size_t(i * s.u + c.u)]);
    }
  }
}

// A dense parameter's copies lie along DP, CP and U (and TP where it is whole): of the ranks that
// hold one, exactly one counts it (the norm, the checkpoint), whatever the shape.
TEST(GridAxes, OneCopyOfADenseParameterCountsAmongTheDataAndContextRanks) {
  for (const GridShape& s : all_shapes()) {
    if (s.ep > 1) continue;
    SCOPED_TRACE(name_of(s));
    for (int r = 0; r < s.world(); r++) {
      int counted = 0;
      for (int m : group_ranks(s, r, GridGroup::DPxCP))
        counted += first_copy(kAxisDP | kContextAxes, grid_coords(s, m), kEveryAxis);
      EXPECT_EQ(counted, 1) << "rank " << r;
    }
  }
}

// The ends of every pipeline pair up; the stages between, and a pipeline of one stage, have none.
TEST(GridGroups, EmbeddingGroupsPairTheEndsOfEachPipeline) {
  for (const GridShape& s : all_shapes()) {
    SCOPED_TRACE(name_of(s));
    std::vector<int> covered(s.world(), 0);
    for (int r = 0; r < s.world(); r++) {
      const GridCoords c = grid_coords(s, r);
      const std::vector<int> members = group_ranks(s, r, GridGroup::Embedding);
      const bool end = s.pp > 1 && (c.pp == 0 || c.pp == s.pp - 1);
      if (!end) {
        EXPECT_TRUE(members.empty()) << "rank " << r;
        continue;
      }
      GridCoords first = c, last = c;
      first.pp = 0;
      last.pp = s.pp - 1;
      ASSERT_EQ(members, (std::vector<int>{grid_rank(s, first), grid_rank(s, last)})) << "rank " << r;
      EXPECT_EQ(members[expected_place(s, c, GridGroup::Embedding)], r);
      EXPECT_EQ(group_ranks(s, members[0], GridGroup::Embedding), group_ranks(s, members[1], GridGroup::Embedding));
      if (members.front() == r) for (int m : members) covered[m]++;
    }
    for (int r = 0; r < s.world(); r++) {
      const int pp = grid_coords(s, r).pp;
      EXPECT_EQ(covered[r], s.pp > 1 && (pp == 0 || pp == s.pp - 1) ? 1 : 0) << "rank " << r;
    }
  }
}

// The world size a refusal suggests ("run on a multiple of N ranks"), or 0.
int suggested_world(const std::string& problem) {
  const std::string before = "run on a multiple of ";
  const size_t at = problem.find(before);
  return at == std::string::npos ? 0 : std::stoi(problem.substr(at + before.size()));
}

TEST(GridShapeProblem, ExpertGroupsMustDivideAStageAndTheSuggestionFits) {
  // Chapter 11's message, as before the grids were one.
  EXPECT_EQ(grid_shape_problem(3, 1, 1, 1, 2),
            "the 3 ranks do not divide into expert-parallel groups of --ep 2: run on a multiple of 2 ranks, or change "
            "--ep");
  EXPECT_EQ(grid_shape_problem(12, 1, 2, 1, 4),
            "the 6 ranks of each pipeline stage do not divide into expert-parallel groups of --ep 4: run on a multiple "
            "of 8 ranks, or change --ep");
  EXPECT_EQ(grid_shape_problem(4, 1, 1, 1, 0), "--ep must be >= 1");
  EXPECT_EQ(grid_shape_problem(16, 2, 2, 2, 8), "");
  EXPECT_EQ(grid_shape_problem(6, 2, 1, 1, 3), "");
  // Whatever the flags, a refused world suggests one that fits, and the shape made of a sound one holds
  // what was asked.
  for (int world = 1; world <= 16; world++)
    for (int tp : {1, 2, 3})
      for (int pp : {1, 2, 3})
        for (int cp : {1, 2})
          for (int ep : {1, 2, 3, 4, 6, 8})
            for (int u : {1, 2}) {
              const std::string problem = grid_shape_problem(world, tp, pp, cp, ep, u);
              SCOPED_TRACE(std::to_string(world) + " ranks, tp " + std::to_string(tp) + " pp " + std::to_string(pp) +
                           " cp " + std::to_string(cp) + " ep " + std::to_string(ep) + " u " + std::to_string(u) +
                           ": " + problem);
              if (problem.empty()) {
                const GridShape s = grid_shape(world, tp, pp, cp, ep, u);
                EXPECT_EQ(s.world(), world);
                EXPECT_TRUE(s.tp == tp && s.pp == pp && s.cp == cp && s.ep == ep && s.u == u);
                EXPECT_EQ(s.stage_ranks() % ep, 0);
                continue;
              }
              const int fits = suggested_world(problem);
              ASSERT_GT(fits, 0);
              EXPECT_EQ(grid_shape_problem(fits, tp, pp, cp, ep, u), "");
              EXPECT_EQ(grid_shape_problem(2 * fits, tp, pp, cp, ep, u), "");
            }
}

// Whether --ep divides the experts is the expert dimension's refusal, asked first by 11 and 12: it
// names --ep and the values that would work, each of which divides the experts and the ranks the
// groups fold over (so the grid takes it too).
TEST(GridShapeProblem, AnEpThatDoesNotDivideTheExpertsNamesTheValuesThatDo) {
  GPT2Config tiny, small, dense;
  ASSERT_TRUE(find_preset("moe-tiny", &tiny) && find_preset("moe-small", &small) && find_preset("tiny", &dense));
  const std::string why = " (every rank of an expert-parallel group holds an equal number of them): pass --ep ";
  EXPECT_EQ(expert_count_problem(tiny, 3, 6), "--ep 3 must divide the 4 experts of --preset moe-tiny" + why +
                                                  "1 or 2, which divide both the experts and the 6 ranks");
  EXPECT_EQ(expert_count_problem(tiny, 8, 8), "--ep 8 must divide the 4 experts of --preset moe-tiny" + why +
                                                  "1, 2 or 4, which divide both the experts and the 8 ranks");
  EXPECT_EQ(expert_count_problem(tiny, 3, 3), "--ep 3 must divide the 4 experts of --preset moe-tiny" + why +
                                                  "1, which divides both the experts and the 3 ranks");
  EXPECT_EQ(expert_count_problem(small, 3, 4, 2), "--ep 3 must divide the 8 experts of --preset moe-small" + why +
                                                      "1, 2 or 4, which divide both the experts and the 4 ranks of "
                                                      "each pipeline stage");
  EXPECT_EQ(expert_count_problem(small, 5, 0), "--ep 5 must divide the 8 experts of --preset moe-small" + why +
                                                   "1, 2, 4 or 8");
  for (int ep : {1, 2, 4}) EXPECT_EQ(expert_count_problem(tiny, ep, 8), "") << ep;
  EXPECT_EQ(expert_count_problem(dense, 3, 6), "");  // a dense preset's --ep is refused for that
  EXPECT_EQ(expert_count_problem(tiny, 0, 6), "");   // and --ep 0 for being below 1
}

TEST(GridShapeProblem, ChapterElevenChecksTheExpertsToo) {
  EXPECT_EQ(expert_grid_problem(4, 2, 4, "moe-tiny"), "");
  EXPECT_EQ(expert_grid_problem(3, 2, 4, "moe-tiny"), grid_shape_problem(3, 1, 1, 1, 2));
  EXPECT_NE(expert_grid_problem(2, 2, 0, "tiny").find("has no experts"), std::string::npos);
  EXPECT_EQ(expert_grid_problem(2, 0, 4, "moe-tiny"), "--ep must be >= 1");
}

}  // namespace

// Each axis is described once (kAxes, grid_axes.h): a bit of its own, a token that names it, the size
// of its field in a shape and the coordinate of its field, which the rules of the grid read.
TEST(GridAxes, EachAxisIsDescribedOnceAndItsRowIsWhatTheGridReads) {
  AxisSet seen = 0;
  for (const AxisDescriptor& d : kAxes) {
    EXPECT_EQ(seen & d.axis, 0u) << d.token << " shares a bit";
    seen |= d.axis;
    EXPECT_EQ(axes_named(d.token), AxisSet(d.axis)) << d.token;
  }
  EXPECT_EQ(seen, kEveryAxis);
  const GridShape s{2, 2, 2, 2, 4, 2};  // DP 2 x TP 2 x PP 2 x CP 2 x U 2, EP 4: expert DP 4
  const int fields[] = {s.dp, s.tp, s.pp, s.cp, s.ep, s.edp(), s.u};
  const GridAxis order[] = {kAxisDP, kAxisTP, kAxisPP, kAxisCP, kAxisEP, kAxisEDP, kAxisU};
  for (size_t i = 0; i < 7; i++) EXPECT_EQ(s.size(order[i]), fields[i]) << i;
  for (int r = 0; r < s.world(); r++) {
    const GridCoords c = grid_coords(s, r);
    const int coords[] = {c.dp, c.tp, c.pp, c.cp, c.ep, c.edp, c.u};
    for (size_t i = 0; i < 7; i++) EXPECT_EQ(axis_coord(c, order[i]), coords[i]) << "rank " << r << " axis " << i;
    EXPECT_EQ(grid_rank(s, c), r);
  }
}
