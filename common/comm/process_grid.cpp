// process_grid.cpp: see process_grid.h.
#include "comm/process_grid.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "base/check.h"
#include "comm/lanes.h"  // LaneCommunicator: give_each_lane_its_groups

namespace {

std::vector<std::string> tokens_of(const std::string& order) {
  std::vector<std::string> tokens;
  size_t from = 0;
  for (size_t dash; (dash = order.find('-', from)) != std::string::npos; from = dash + 1)
    tokens.push_back(order.substr(from, dash - from));
  tokens.push_back(order.substr(from));
  return tokens;
}

}  // namespace

AxisSet axes_named(const std::string& tokens) {
  AxisSet axes = 0;
  for (const std::string& token : tokens_of(tokens)) {
    const AxisDescriptor* found = std::find_if(std::begin(kAxes), std::end(kAxes),
                                               [&](const AxisDescriptor& d) { return token == d.token; });
    if (found == std::end(kAxes)) return 0;
    axes |= found->axis;
  }
  return axes;
}

RankOrder::RankOrder(const GridShape& shape, const std::string& order) {
  int stride = 1;
  for (const std::string& token : tokens_of(order)) {
    const AxisSet axis = axes_named(token);
    ENSURE(axis != 0 && !has(axis), "RankOrder: '" + order + "' names an axis twice or one no grid has");
    digits_.push_back({GridAxis(axis), shape.size(GridAxis(axis)), stride});
    stride *= digits_.back().size;
  }
}

bool RankOrder::has(AxisSet axes) const {
  AxisSet mine = 0;
  for (const Digit& d : digits_) mine |= d.axis;
  return (axes & ~mine) == 0;
}

int RankOrder::rank(const GridCoords& at) const {
  int rank = 0;
  for (const Digit& d : digits_) rank += axis_coord(at, d.axis) * d.stride;
  return rank;
}

int RankOrder::coord(int rank, GridAxis axis) const {
  for (const Digit& d : digits_)
    if (d.axis == axis) return rank / d.stride % d.size;
  return 0;
}

std::vector<int> RankOrder::group(int rank, AxisSet axes) const {
  ENSURE(has(axes), "RankOrder: a group of axes outside the order");
  int base = rank;  // this rank with its coordinates on `axes` set to 0: the group's first member
  for (const Digit& d : digits_)
    if (d.axis & axes) base -= coord(rank, d.axis) * d.stride;
  std::vector<int> members = {base};
  for (const Digit& d : digits_) {
    if (!(d.axis & axes)) continue;
    const size_t before = members.size();  // each member so far, then again one step further out
    for (int i = 1; i < d.size; i++)
      for (size_t m = 0; m < before; m++) members.push_back(members[m] + i * d.stride);
  }
  return members;
}

GridCoords grid_coords(const GridShape& shape, int rank) {
  const RankOrder grid(shape, kGridOrder), experts(shape, kExpertOrder);
  GridCoords c;
  for (const AxisDescriptor& d : kAxes) c.*d.coord = (grid.has(d.axis) ? grid : experts).coord(rank, d.axis);
  return c;
}

int grid_rank(const GridShape& shape, const GridCoords& c) {
  return RankOrder(shape, kGridOrder).rank(c);  // (((pp x DP + dp) x CP + cp) x U + u) x TP + tp
}

std::vector<int> axis_group_ranks(const GridShape& shape, int rank, AxisSet axes) {
  const RankOrder grid(shape, kGridOrder);
  return grid.has(axes) ? grid.group(rank, axes) : RankOrder(shape, kExpertOrder).group(rank, axes);
}

namespace {

struct GroupAxes {
  GridGroup which;
  const char* name;
  AxisSet axes;
};
constexpr GroupAxes kGroups[] = {
    {GridGroup::TP, "tp", kAxisTP},          {GridGroup::CP, "cp", kContextAxes},
    {GridGroup::DP, "dp", kAxisDP},          {GridGroup::DPxCP, "dp_cp", kAxisDP | kContextAxes},
    {GridGroup::PP, "pp", kAxisPP},          {GridGroup::Embedding, "embedding", kAxisPP},
    {GridGroup::EP, "ep", kAxisEP},          {GridGroup::ExpertDP, "expert_dp", kAxisEDP},
    {GridGroup::Ulysses, "ulysses", kAxisU}, {GridGroup::Ring, "ring", kAxisCP}};

const GroupAxes& group_of(GridGroup which) {
  return *std::find_if(std::begin(kGroups), std::end(kGroups), [&](const GroupAxes& g) { return g.which == which; });
}

}  // namespace

const char* group_name(GridGroup which) { return group_of(which).name; }
AxisSet group_axes(GridGroup which) { return group_of(which).axes; }

std::vector<int> group_ranks(const GridShape& s, int rank, GridGroup which) {
  std::vector<int> members = axis_group_ranks(s, rank, group_axes(which));
  if (which != GridGroup::Embedding) return members;
  // The pipeline's two ends (Megatron-LM's embedding group); none for the stages between.
  const int pp = grid_coords(s, rank).pp;
  if (s.pp == 1 || (pp != 0 && pp != s.pp - 1)) return {};
  return {members.front(), members.back()};
}

std::string grid_shape_problem(int world, int tp, int pp, int cp, int ep, int u) {
  if (tp < 1) return "--tp must be >= 1";
  if (pp < 1) return "--pp must be >= 1";
  if (cp < 1) return "--cp must be >= 1";
  if (ep < 1) return "--ep must be >= 1";
  if (u < 1) return "--ulysses must be >= 1";
  // EP re-splits a stage's DP x CP x U x TP ranks; a stage that holds a multiple of TP x CP x U and of
  // EP ranks fits, so the world must be PP times a multiple of their least common multiple.
  const int fits = pp * std::lcm(tp * cp * u, ep);
  if (world % (tp * pp * cp * u) != 0) {
    // Only the sizes above 1 are named: a chapter without --tp (08) passes 1 for it, as does one
    // without --pp (07), so the message names the chapter's own flags.
    std::vector<std::string> groups, flags;
    if (tp > 1) groups.push_back("tensor-parallel groups of --tp " + std::to_string(tp)), flags.push_back("--tp");
    if (cp > 1) groups.push_back("context-parallel rings of --cp " + std::to_string(cp)), flags.push_back("--cp");
    if (u > 1) groups.push_back("Ulysses groups of --ulysses " + std::to_string(u)), flags.push_back("--ulysses");
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

GridShape grid_shape(int world, int tp, int pp, int cp, int ep, int u) {
  const std::string problem = grid_shape_problem(world, tp, pp, cp, ep, u);
  if (!problem.empty()) config_error(problem);
  GridShape shape;
  shape.tp = tp;
  shape.pp = pp;
  shape.cp = cp;
  shape.ep = ep;
  shape.u = u;
  shape.dp = world / (tp * pp * cp * u);
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
  ENSURE(shape.ep >= 1 && shape.stage_ranks() % shape.ep == 0, "ProcessGrid: EP must divide DP x CP x U x TP");
  coords_ = grid_coords(shape, world.rank());
  tp_ = split(GridGroup::TP);
  dp_ = split(GridGroup::DP);
  pp_ = split(GridGroup::PP);
  // The ring exists at CP = 1 too, a group of one per rank: a ring of one, which never sends (chapter 10
  // runs its attention on it whatever --cp).
  cp_ = split(GridGroup::CP);
  if (shape.cp * shape.u > 1) dp_cp_ = split(GridGroup::DPxCP);
  if (shape.u > 1) ulysses_ = split(GridGroup::Ulysses), ring_ = split(GridGroup::Ring);
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
  ENSURE(!handed_out_, "ProcessGrid: give_each_lane_its_groups() after a lane's group was handed out");
  for (std::unique_ptr<Communicator>* group : {&tp_, &cp_, &ep_, &expert_dp_, &ulysses_, &ring_})
    if (*group) *group = std::make_unique<LaneCommunicator>(std::move(*group));
}

std::string ProcessGrid::describe() const {
  std::string text;
  for (const AxisDescriptor& d : kAxes) {
    if (d.shown_with && shape_.size(GridAxis(d.shown_with)) == 1) continue;
    char words[64];
    std::snprintf(words, sizeof(words), d.described_as, d.size(shape_));
    text += words;
  }
  return text;
}
