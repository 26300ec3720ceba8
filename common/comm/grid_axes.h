// grid_axes.h: the axes of the process grid, a rank's coordinates on them, and where a parameter's
// copies lie along them. Defines GridAxis, AxisSet, GridCoords, GridShape, AxisDescriptor (kAxes: each
// axis's token, coordinate, size and name, once), axis_coord() and first_copy().
//
// A parameter carries its placement (ParamInfo::copies, param_layout.h): the axes along which every
// rank holds the same tensor. Its gradient is summed over those copies, and when something must count
// the tensor once (the gradient norm, a checkpoint gathered by a sum over the world) the copy that
// counts is the first one along each of them: first_copy(). That rule is written here only; the
// chapters, the norm and the checkpoint call it, each naming the axes its sum runs over.
#pragma once

// One bit per axis. DP, CP, TP, PP and U (Ulysses, inside the context-parallel ring) factor the world;
// EP and EDP (expert data parallelism) re-split the ranks of a pipeline stage (process_grid.h).
enum GridAxis : unsigned {
  kAxisTP = 1, kAxisCP = 2, kAxisDP = 4, kAxisPP = 8, kAxisEP = 16, kAxisEDP = 32, kAxisU = 64
};
using AxisSet = unsigned;  // a union of GridAxis bits

struct GridCoords {
  int dp = 0, tp = 0, pp = 0, cp = 0, ep = 0, edp = 0, u = 0;
};

// The grid's sizes (process_grid.h lays the ranks out from them).
struct GridShape {
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, u = 1;
  int size(GridAxis axis) const;  // an axis's size (EDP: edp())
  int world() const { return dp * tp * pp * cp * u; }  // (EP re-splits a stage: it multiplies nothing)
  int stage_ranks() const { return dp * cp * u * tp; }
  int edp() const { return stage_ranks() / ep; }  // the expert-data-parallel degree
};

// Each axis described once: its bit, its token in an order string (process_grid.h, RankOrder), the
// field of its coordinate, its size in a shape, and how the grid's description names it (a printf
// format of its size, shown always, or only where the axis `shown_with` is larger than 1). Every
// per-axis rule (a coordinate, a token, a size, a copy's place, the description) reads this table: a
// new axis is a row here, a field in GridCoords and GridShape, and its token in an order. Listed in
// the description's order.
struct AxisDescriptor {
  GridAxis axis;
  const char* token;
  int GridCoords::*coord;
  int (*size)(const GridShape&);
  const char* described_as;
  unsigned shown_with;  // 0: always
};
inline constexpr AxisDescriptor kAxes[] = {
    {kAxisDP, "dp", &GridCoords::dp, [](const GridShape& s) { return s.dp; }, "DP %d", 0},
    {kAxisTP, "tp", &GridCoords::tp, [](const GridShape& s) { return s.tp; }, " x TP %d", 0},
    {kAxisPP, "pp", &GridCoords::pp, [](const GridShape& s) { return s.pp; }, " x PP %d", 0},
    {kAxisCP, "cp", &GridCoords::cp, [](const GridShape& s) { return s.cp; }, " x CP %d", kAxisCP},
    {kAxisU, "ulysses", &GridCoords::u, [](const GridShape& s) { return s.u; }, " x Ulysses %d", kAxisU},
    {kAxisEP, "ep", &GridCoords::ep, [](const GridShape& s) { return s.ep; }, " x EP %d", kAxisEP},
    {kAxisEDP, "edp", &GridCoords::edp, [](const GridShape& s) { return s.edp(); }, " (expert DP %d)", kAxisEP}};

inline int GridShape::size(GridAxis axis) const {
  for (const AxisDescriptor& d : kAxes)
    if (d.axis == axis) return d.size(*this);
  return 1;
}

constexpr AxisSet every_axis() {
  AxisSet all = 0;
  for (const AxisDescriptor& d : kAxes) all |= d.axis;
  return all;
}
constexpr AxisSet kEveryAxis = every_axis();
// The axes a ZeRO shard is cut along: a sharded gradient has no copies there, each rank its own piece.
constexpr AxisSet kDataAxes = kAxisDP | kAxisCP | kAxisU | kAxisEDP;
// The axes that split a sequence: the ring's places (CP) and, inside each, the Ulysses ranks (U).
constexpr AxisSet kContextAxes = kAxisCP | kAxisU;
// A rank's place among the ranks that split its sequences (the cp group, process_grid.h): ring place x
// U + Ulysses rank, Ulysses inside.
inline int context_rank(const GridShape& s, const GridCoords& at) { return at.cp * s.u + at.u; }

// The axes along which a sum over `summed_over` meets copies of a tensor: all of them, less the data
// axes where the gradients are sharded (ZeRO: each rank holds a piece of its own there).
inline AxisSet counted_along(AxisSet summed_over, bool sharded) {
  return sharded ? summed_over & ~kDataAxes : summed_over;
}

inline int axis_coord(const GridCoords& at, GridAxis axis) {
  for (const AxisDescriptor& d : kAxes)
    if (d.axis == axis) return at.*d.coord;
  return 0;
}

// True when the rank at `at` holds the copy that counts among a tensor's `copies` along the axes
// `among` (the axes a sum over ranks runs over): coordinate 0 on each axis that is in both. Along an
// axis outside `among` every rank counts its own (a sum elsewhere, or none, takes care of it).
inline bool first_copy(AxisSet copies, const GridCoords& at, AxisSet among) {
  for (const AxisDescriptor& d : kAxes)
    if ((copies & among & d.axis) && at.*d.coord != 0) return false;
  return true;
}
