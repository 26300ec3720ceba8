// process_grid.cpp: see process_grid.h.
#include "process_grid.h"

#include "check.h"

GridCoords grid_coords(const GridShape& shape, int rank) {
  GridCoords c;
  c.tp = rank % shape.tp;
  c.dp = (rank / shape.tp) % shape.dp;
  c.pp = rank / (shape.tp * shape.dp);
  return c;
}

int grid_rank(const GridShape& shape, const GridCoords& c) { return (c.pp * shape.dp + c.dp) * shape.tp + c.tp; }

std::string grid_shape_problem(int world, int tp, int pp) {
  if (tp < 1) return "--tp must be >= 1";
  if (pp < 1) return "--pp must be >= 1";
  if (world % (tp * pp) == 0) return "";
  // Only the sizes above 1 are named: a chapter without --tp (08) passes 1 for it, as does one
  // without --pp (07), so the message names the chapter's own flags.
  std::string groups, flags;
  if (tp > 1) groups = "tensor-parallel groups of --tp " + std::to_string(tp), flags = "--tp";
  if (tp > 1 && pp > 1) groups += " times ", flags += " or ";
  if (pp > 1) groups += "pipelines of --pp " + std::to_string(pp) + " stages", flags += "--pp";
  return "the " + std::to_string(world) + " ranks do not divide into " + groups + ": run on a multiple of " +
         std::to_string(tp * pp) + " ranks, or change " + flags;
}

GridShape grid_shape(int world, int tp, int pp) {
  const std::string problem = grid_shape_problem(world, tp, pp);
  if (!problem.empty()) config_error(problem);
  GridShape shape;
  shape.tp = tp;
  shape.pp = pp;
  shape.dp = world / (tp * pp);
  return shape;
}

ProcessGrid::ProcessGrid(Communicator& world, const GridShape& shape) : world_(world), shape_(shape) {
  ENSURE(shape.world() == world.size(), "ProcessGrid: the shape does not cover the world");
  coords_ = grid_coords(shape, world.rank());
  // Each split is keyed by the coordinate that ranks the group's members, so that a group's rank is
  // that coordinate: the TP group of a rank is ranked by tp, and so on.
  const GridShape& s = shape;
  tp_ = world.split(coords_.pp * s.dp + coords_.dp, coords_.tp, "tp");
  dp_ = world.split(coords_.pp * s.tp + coords_.tp, coords_.dp, "dp");
  pp_ = world.split(coords_.dp * s.tp + coords_.tp, coords_.pp, "pp");
  ENSURE(tp_->rank() == coords_.tp && dp_->rank() == coords_.dp && pp_->rank() == coords_.pp,
         "ProcessGrid: a group's rank is not the rank's coordinate");
  if (s.pp > 1) {  // collective over the pipeline: the ends form one group, the middle another
    const bool end = coords_.pp == 0 || coords_.pp == s.pp - 1;
    embedding_ = pp_->split(end ? 0 : 1, coords_.pp, "embedding");
    if (!end) embedding_.reset();
  }
}

std::string ProcessGrid::describe() const {
  return "DP " + std::to_string(shape_.dp) + " x TP " + std::to_string(shape_.tp) + " x PP " + std::to_string(shape_.pp);
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
