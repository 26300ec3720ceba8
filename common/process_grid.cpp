// process_grid.cpp: see process_grid.h.
#include "process_grid.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "check.h"
#include "lanes.h"  // LaneCommunicator: give_each_lane_its_groups

GridCoords grid_coords(const GridShape& shape, int rank) {
  GridCoords c;
  c.tp = rank % shape.tp;
  c.cp = (rank / shape.tp) % shape.cp;
  c.dp = (rank / (shape.tp * shape.cp)) % shape.dp;
  c.pp = rank / shape.stage_ranks();
  const int inside = rank % shape.stage_ranks();  // the rank's number inside its stage
  c.ep = inside % shape.ep;
  c.edp = inside / shape.ep;
  return c;
}

int grid_rank(const GridShape& shape, const GridCoords& c) {
  return ((c.pp * shape.dp + c.dp) * shape.cp + c.cp) * shape.tp + c.tp;
}

const char* group_name(GridGroup which) {
  switch (which) {
    case GridGroup::TP: return "tp";
    case GridGroup::CP: return "cp";
    case GridGroup::DP: return "dp";
    case GridGroup::DPxCP: return "dp_cp";
    case GridGroup::PP: return "pp";
    case GridGroup::Embedding: return "embedding";
    case GridGroup::EP: return "ep";
    case GridGroup::ExpertDP: return "expert_dp";
  }
  return "?";
}

std::vector<int> group_ranks(const GridShape& s, int rank, GridGroup which) {
  const GridCoords c = grid_coords(s, rank);
  auto at = [&](int pp, int dp, int cp, int tp) { return grid_rank(s, {dp, tp, pp, cp}); };
  const int stage = c.pp * s.stage_ranks();  // the stage's first world rank
  std::vector<int> members;
  switch (which) {
    case GridGroup::TP:
      for (int i = 0; i < s.tp; i++) members.push_back(at(c.pp, c.dp, c.cp, i));
      break;
    case GridGroup::CP:
      for (int i = 0; i < s.cp; i++) members.push_back(at(c.pp, c.dp, i, c.tp));
      break;
    case GridGroup::DP:
      for (int i = 0; i < s.dp; i++) members.push_back(at(c.pp, i, c.cp, c.tp));
      break;
    case GridGroup::DPxCP:
      for (int d = 0; d < s.dp; d++)
        for (int k = 0; k < s.cp; k++) members.push_back(at(c.pp, d, k, c.tp));
      break;
    case GridGroup::PP:
      for (int i = 0; i < s.pp; i++) members.push_back(at(i, c.dp, c.cp, c.tp));
      break;
    case GridGroup::Embedding:
      if (s.pp > 1 && (c.pp == 0 || c.pp == s.pp - 1))
        members = {at(0, c.dp, c.cp, c.tp), at(s.pp - 1, c.dp, c.cp, c.tp)};
      break;
    case GridGroup::EP:
      for (int i = 0; i < s.ep; i++) members.push_back(stage + c.edp * s.ep + i);
      break;
    case GridGroup::ExpertDP:
      for (int i = 0; i < s.edp(); i++) members.push_back(stage + i * s.ep + c.ep);
      break;
  }
  return members;
}

std::string grid_shape_problem(int world, int tp, int pp, int cp, int ep) {
  if (tp < 1) return "--tp must be >= 1";
  if (pp < 1) return "--pp must be >= 1";
  if (cp < 1) return "--cp must be >= 1";
  if (ep < 1) return "--ep must be >= 1";
  // EP re-splits a stage's DP x CP x TP ranks; a stage that holds a multiple of TP x CP and of EP
  // ranks fits, so the world must be PP times a multiple of their least common multiple.
  const int fits = pp * std::lcm(tp * cp, ep);
  if (world % (tp * pp * cp) != 0) {
    // Only the sizes above 1 are named: a chapter without --tp (08) passes 1 for it, as does one
    // without --pp (07), so the message names the chapter's own flags.
    std::vector<std::string> groups, flags;
    if (tp > 1) groups.push_back("tensor-parallel groups of --tp " + std::to_string(tp)), flags.push_back("--tp");
    if (cp > 1) groups.push_back("context-parallel rings of --cp " + std::to_string(cp)), flags.push_back("--cp");
    if (pp > 1) groups.push_back("pipelines of --pp " + std::to_string(pp) + " stages"), flags.push_back("--pp");
    std::string group_text, flag_text;
    for (size_t i = 0; i < groups.size(); i++) {
      group_text += (i ? " times " : "") + groups[i];
      flag_text += (i ? " or " : "") + flags[i];
    }
    return "the " + std::to_string(world) + " ranks do not divide into " + group_text + ": run on a multiple of " +
           std::to_string(fits) + " ranks, or change " + flag_text;
  }
  const int stage = world / pp;
  if (stage % ep == 0) return "";
  const std::string ranks =
      pp > 1 ? std::to_string(stage) + " ranks of each pipeline stage" : std::to_string(world) + " ranks";
  return "the " + ranks + " do not divide into expert-parallel groups of --ep " + std::to_string(ep) +
         ": run on a multiple of " + std::to_string(fits) + " ranks, or change --ep";
}

GridShape grid_shape(int world, int tp, int pp, int cp, int ep) {
  const std::string problem = grid_shape_problem(world, tp, pp, cp, ep);
  if (!problem.empty()) config_error(problem);
  GridShape shape;
  shape.tp = tp;
  shape.pp = pp;
  shape.cp = cp;
  shape.ep = ep;
  shape.dp = world / (tp * pp * cp);
  return shape;
}

std::string expert_grid_problem(int world, int ep, int experts, const std::string& preset) {
  if (ep < 1) return "--ep must be >= 1";
  if (experts == 0)
    return "--preset " + preset + " has no experts: expert parallelism needs a mixture of experts (--preset moe-tiny "
           "or moe-small)";
  return grid_shape_problem(world, 1, 1, 1, ep);
}

ProcessGrid::ProcessGrid(Communicator& world, const GridShape& shape) : world_(world), shape_(shape) {
  ENSURE(shape.world() == world.size(), "ProcessGrid: the shape does not cover the world");
  ENSURE(shape.ep >= 1 && shape.stage_ranks() % shape.ep == 0, "ProcessGrid: EP must divide DP x CP x TP");
  coords_ = grid_coords(shape, world.rank());
  tp_ = split(GridGroup::TP);
  dp_ = split(GridGroup::DP);
  pp_ = split(GridGroup::PP);
  // The ring exists at CP = 1 too, a group of one per rank: a ring of one, which never sends (chapter 10
  // runs its attention on it whatever --cp).
  cp_ = split(GridGroup::CP);
  if (shape.cp > 1) dp_cp_ = split(GridGroup::DPxCP);
  if (shape.pp > 1) embedding_ = split(GridGroup::Embedding);  // null on the stages between
  // Both exist at EP = 1 too (chapter 11 runs --ep 1 on them): this rank alone, and the whole stage.
  ep_ = split(GridGroup::EP);
  expert_dp_ = split(GridGroup::ExpertDP);
}

ProcessGrid::ProcessGrid(Communicator& world) : world_(world), data_parallel_only_(true) {
  shape_.dp = world.size();
  coords_ = grid_coords(shape_, world.rank());
}

Communicator& ProcessGrid::group(const std::unique_ptr<Communicator>& comm, GridGroup which) const {
  ENSURE(comm != nullptr, std::string("ProcessGrid: the grid of data parallelism alone has no ") + group_name(which) +
                              " group");
  return *comm;
}

std::unique_ptr<Communicator> ProcessGrid::split(GridGroup which) {
  const std::vector<int> members = group_ranks(shape_, world_.rank(), which);
  // Groups of one kind do not overlap, so a group's first member names it (the color), and a rank's
  // place in the list is its rank in the group (the key). A rank in no group still takes part in the
  // split, which is collective over the world, alone under a color no group uses; it keeps nothing.
  if (members.empty()) {
    world_.split(world_.size() + world_.rank(), 0, group_name(which));
    return nullptr;
  }
  const int key = int(std::find(members.begin(), members.end(), world_.rank()) - members.begin());
  ENSURE(key < int(members.size()), "ProcessGrid: a rank is missing from its own group");
  std::unique_ptr<Communicator> group = world_.split(members.front(), key, group_name(which));
  ENSURE(group->size() == int(members.size()) && group->rank() == key,
         "ProcessGrid: a group's communicator does not hold the ranks of the layout");
  return group;
}

void ProcessGrid::give_each_lane_its_groups() {
  if (data_parallel_only_) return;
  for (std::unique_ptr<Communicator>* group : {&tp_, &cp_, &ep_, &expert_dp_})
    *group = std::make_unique<LaneCommunicator>(std::move(*group));
}

std::string ProcessGrid::describe() const {
  const GridShape& s = shape_;
  return "DP " + std::to_string(s.dp) + " x TP " + std::to_string(s.tp) + " x PP " + std::to_string(s.pp) +
         (s.cp > 1 ? " x CP " + std::to_string(s.cp) : "") +
         (s.ep > 1 ? " x EP " + std::to_string(s.ep) + " (expert DP " + std::to_string(s.edp()) + ")" : "");
}
