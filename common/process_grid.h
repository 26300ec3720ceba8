// process_grid.h: the ranks of a job laid out as a DP x CP x TP x PP grid, and a communicator per group.
// Defines GridShape, GridCoords, grid_coords(), grid_rank() and ProcessGrid.
//
// Tensor parallelism (TP) exchanges activations inside every layer, so its groups must be the ranks
// with the fastest links: consecutive ranks, which launchers place on one node. Pipeline parallelism
// (PP) exchanges one activation per micro-batch between stages, so it can span nodes. Hence TP
// innermost, PP outermost:
//     world rank = ((pp_rank x DP + dp_rank) x CP + cp_rank) x TP + tp_rank
// Ranks r and r+1 share a TP group; a DP group holds the ranks with the same TP, CP and PP
// coordinates; a PP group those with the same TP, CP and DP coordinates. Context parallelism (CP,
// chapter 10) passes keys and values around a ring inside every attention: next to TP, inside DP, as
// Megatron-LM orders them. Its ranks hold the same parameters as their DP peers, so gradients are
// averaged over DP x CP (dp_cp()). Without CP (CP = 1) the layout is the DP x TP x PP one of 07-09.
// The layout is a plain function, so that a test checks it without MPI.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm.h"

struct GridShape {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int world() const { return dp * tp * pp * cp; }
};

struct GridCoords {
  int dp = 0, tp = 0, pp = 0, cp = 0;
};

// The coordinates of world rank `rank`, and the rank of coordinates, in the layout above.
GridCoords grid_coords(const GridShape& shape, int rank);
int grid_rank(const GridShape& shape, const GridCoords& coords);

// The shape for `world` ranks with `tp`, `pp` and `cp` given: dp = world / (tp x pp x cp). A world that
// does not divide stops every rank with a message naming the flags (config_error): grid_shape_problem's,
// "" when the shape is sound.
GridShape grid_shape(int world, int tp, int pp, int cp = 1);
std::string grid_shape_problem(int world, int tp, int pp, int cp = 1);

class ProcessGrid {
 public:
  // Collective over `world`: splits it into the DP, TP and PP groups (comm.h, split), each a
  // communicator of the same kind as `world`, the CP group, and with CP > 1 the DP x CP group.
  ProcessGrid(Communicator& world, const GridShape& shape);

  const GridShape& shape() const { return shape_; }
  const GridCoords& coords() const { return coords_; }
  Communicator& world() const { return world_; }
  Communicator& dp() const { return *dp_; }
  Communicator& tp() const { return *tp_; }
  Communicator& pp() const { return *pp_; }
  // The context-parallel ring, ranked by cp (at CP = 1 this rank alone: a ring of one); and the ranks
  // that hold the same parameters, DP x CP, ranked by dp x CP + cp: the DP group itself when CP = 1.
  Communicator& cp() const { return *cp_; }
  Communicator& dp_cp() const { return dp_cp_ ? *dp_cp_ : *dp_; }
  // Under pipeline parallelism, the first and last stages of this rank's pipeline both hold the tied
  // wte (the embedding, the LM head) and sum its gradient in this group of two (Megatron-LM's
  // embedding group). Null with one stage, and on the stages between, which hold no wte.
  Communicator* embedding() const { return embedding_.get(); }
  // "DP 2 x TP 2 x PP 1" (and " x CP 2" with CP > 1)
  std::string describe() const;

 private:
  Communicator& world_;
  GridShape shape_;
  GridCoords coords_;
  std::unique_ptr<Communicator> dp_, tp_, pp_, embedding_, cp_, dp_cp_;
};

// Expert parallelism (chapter 11): the world as DP x EP, EP innermost, because its all-to-alls run in
// every layer, forward and backward, and want the fastest links:
//     world rank = dp_rank x EP + ep_rank
// The EP group (the same dp_rank) holds the E experts between them, E/EP each, and exchanges tokens;
// the expert-data-parallel group (the same ep_rank) holds the same experts and averages their
// gradients. Everything else is replicated on every rank and averaged over the world.
std::string expert_grid_problem(int world, int ep, int experts, const std::string& preset);  // "" when sound

class ExpertGrid {
 public:
  // Collective over `world`: splits it into the two groups, "ep" and "expert_dp".
  ExpertGrid(Communicator& world, int ep);
  int ep_size() const { return ep_size_; }
  int dp_size() const { return dp_size_; }
  Communicator& ep() const { return *ep_; }
  Communicator& expert_dp() const { return *expert_dp_; }
  std::string describe() const;  // "DP 2 x EP 2"

 private:
  int ep_size_, dp_size_;
  std::unique_ptr<Communicator> ep_, expert_dp_;
};
