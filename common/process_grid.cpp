// process_grid.cpp: see process_grid.h.
#include "process_grid.h"

#include <vector>

#include "check.h"

GridCoords grid_coords(const GridShape& shape, int rank) {
  GridCoords c;
  c.tp = rank % shape.tp;
  c.cp = (rank / shape.tp) % shape.cp;
  c.dp = (rank / (shape.tp * shape.cp)) % shape.dp;
  c.pp = rank / (shape.tp * shape.cp * shape.dp);
  return c;
}

int grid_rank(const GridShape& shape, const GridCoords& c) {
  return ((c.pp * shape.dp + c.dp) * shape.cp + c.cp) * shape.tp + c.tp;
}

std::string grid_shape_problem(int world, int tp, int pp, int cp) {
  if (tp < 1) return "--tp must be >= 1";
  if (pp < 1) return "--pp must be >= 1";
  if (cp < 1) return "--cp must be >= 1";
  if (world % (tp * pp * cp) == 0) return "";
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
         std::to_string(tp * pp * cp) + " ranks, or change " + flag_text;
}

GridShape grid_shape(int world, int tp, int pp, int cp) {
  const std::string problem = grid_shape_problem(world, tp, pp, cp);
  if (!problem.empty()) config_error(problem);
  GridShape shape;
  shape.tp = tp;
  shape.pp = pp;
  shape.cp = cp;
  shape.dp = world / (tp * pp * cp);
  return shape;
}

ProcessGrid::ProcessGrid(Communicator& world, const GridShape& shape) : world_(world), shape_(shape) {
  ENSURE(shape.world() == world.size(), "ProcessGrid: the shape does not cover the world");
  coords_ = grid_coords(shape, world.rank());
  // Each split is keyed by the coordinate that ranks the group's members, so that a group's rank is
  // that coordinate: the TP group of a rank is ranked by tp, and so on.
  // (With CP = 1 the colors are those of the DP x TP x PP grid: c.cp is 0 and s.cp 1.)
  const GridShape& s = shape;
  const GridCoords& c = coords_;
  tp_ = world.split((c.pp * s.dp + c.dp) * s.cp + c.cp, c.tp, "tp");
  dp_ = world.split((c.pp * s.cp + c.cp) * s.tp + c.tp, c.dp, "dp");
  pp_ = world.split((c.dp * s.cp + c.cp) * s.tp + c.tp, c.pp, "pp");
  ENSURE(tp_->rank() == c.tp && dp_->rank() == c.dp && pp_->rank() == c.pp,
         "ProcessGrid: a group's rank is not the rank's coordinate");
  // The ring exists at CP = 1 too, a group of one per rank: a ring of one, which never sends (chapter 10
  // runs its attention on it whatever --cp).
  cp_ = world.split((c.pp * s.dp + c.dp) * s.tp + c.tp, c.cp, "cp");
  ENSURE(cp_->rank() == c.cp && cp_->size() == s.cp, "ProcessGrid: the ring is not the rank's CP group");
  if (s.cp > 1) {
    dp_cp_ = world.split(c.pp * s.tp + c.tp, c.dp * s.cp + c.cp, "dp_cp");
    ENSURE(dp_cp_->rank() == c.dp * s.cp + c.cp, "ProcessGrid: a group's rank is not the rank's coordinate");
  }
  if (s.pp > 1) {  // collective over the pipeline: the ends form one group, the middle another
    const bool end = coords_.pp == 0 || coords_.pp == s.pp - 1;
    embedding_ = pp_->split(end ? 0 : 1, coords_.pp, "embedding");
    if (!end) embedding_.reset();
  }
}



std::string ProcessGrid::describe() const {
  return "DP " + std::to_string(shape_.dp) + " x TP " + std::to_string(shape_.tp) + " x PP " +
         std::to_string(shape_.pp) + (shape_.cp > 1 ? " x CP " + std::to_string(shape_.cp) : "");
}

std::string expert_grid_problem(int world, int ep, int experts, const std::string& preset) {
  if (ep < 1) return "--ep must be >= 1";
  if (experts == 0)
    return "--preset " + preset + " has no experts: expert parallelism needs a mixture of experts (--preset moe-tiny "
           "or moe-small)";
  if (world % ep)
    return "the " + std::to_string(world) + " ranks do not divide into expert-parallel groups of --ep " +
           std::to_string(ep) + ": run on a multiple of " + std::to_string(ep) + " ranks, or change --ep";
  if (experts % ep)
    return "--ep " + std::to_string(ep) + " must divide the " + std::to_string(experts) + " experts of --preset " +
           preset + " (every rank of an expert-parallel group holds an equal number of them)";
  return "";
}

ExpertGrid::ExpertGrid(Communicator& world, int ep) : ep_size_(ep), dp_size_(world.size() / ep) {
  ENSURE(ep >= 1 && world.size() % ep == 0, "ExpertGrid: --ep must divide the world");
  const int ep_rank = world.rank() % ep, dp_rank = world.rank() / ep;
  ep_ = world.split(dp_rank, ep_rank, "ep");
  expert_dp_ = world.split(ep_rank, dp_rank, "expert_dp");
  ENSURE(ep_->rank() == ep_rank && expert_dp_->rank() == dp_rank, "ExpertGrid: a group's rank is not the coordinate");
}

std::string ExpertGrid::describe() const {
  return "DP " + std::to_string(dp_size_) + " x EP " + std::to_string(ep_size_);
}
