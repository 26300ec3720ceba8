// grid_axes.h: the axes of the process grid, a rank's coordinates on them, and where a parameter's
// copies lie along them. Defines GridAxis, AxisSet, GridCoords, axis_coord() and first_copy().
//
// A parameter carries its placement (ParamInfo::copies, param_layout.h): the axes along which every
// rank holds the same tensor. Its gradient is summed over those copies, and when something must count
// the tensor once (the gradient norm, a checkpoint gathered by a sum over the world) the copy that
// counts is the first one along each of them: first_copy(). That rule is written here only; the
// chapters, the norm and the checkpoint call it, each naming the axes its sum runs over.
#pragma once

// One bit per axis. DP, CP, TP and PP factor the world; EP and EDP (expert data parallelism) re-split
// the ranks of a pipeline stage (process_grid.h).
enum GridAxis : unsigned { kAxisTP = 1, kAxisCP = 2, kAxisDP = 4, kAxisPP = 8, kAxisEP = 16, kAxisEDP = 32 };
using AxisSet = unsigned;  // a union of GridAxis bits
constexpr AxisSet kEveryAxis = kAxisTP | kAxisCP | kAxisDP | kAxisPP | kAxisEP | kAxisEDP;
// The axes a ZeRO shard is cut along: a sharded gradient has no copies there, each rank its own piece.
constexpr AxisSet kDataAxes = kAxisDP | kAxisCP | kAxisEDP;

// The axes along which a sum over `summed_over` meets copies of a tensor: all of them, less the data
// axes where the gradients are sharded (ZeRO: each rank holds a piece of its own there).
inline AxisSet counted_along(AxisSet summed_over, bool sharded) {
  return sharded ? summed_over & ~kDataAxes : summed_over;
}

struct GridCoords {
  int dp = 0, tp = 0, pp = 0, cp = 0, ep = 0, edp = 0;
};

inline int axis_coord(const GridCoords& at, GridAxis axis) {
  switch (axis) {
    case kAxisTP: return at.tp;
    case kAxisCP: return at.cp;
    case kAxisDP: return at.dp;
    case kAxisPP: return at.pp;
    case kAxisEP: return at.ep;
    case kAxisEDP: return at.edp;
  }
  return 0;
}

// True when the rank at `at` holds the copy that counts among a tensor's `copies` along the axes
// `among` (the axes a sum over ranks runs over): coordinate 0 on each axis that is in both. Along an
// axis outside `among` every rank counts its own (a sum elsewhere, or none, takes care of it).
inline bool first_copy(AxisSet copies, const GridCoords& at, AxisSet among) {
  for (GridAxis axis : {kAxisTP, kAxisCP, kAxisDP, kAxisPP, kAxisEP, kAxisEDP})
    if ((copies & among & axis) && axis_coord(at, axis) != 0) return false;
  return true;
}
