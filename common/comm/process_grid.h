// process_grid.h: the ranks of a job laid out as one DP x CP x TP x PP grid, with expert parallelism
// (EP) folded inside it, and a communicator per group. Defines RankOrder, GridGroup, grid_coords(),
// grid_rank(), group_ranks() and ProcessGrid (GridShape and GridCoords: grid_axes.h).
//
// Tensor parallelism (TP) exchanges activations inside every layer, so its groups must be the ranks
// with the fastest links: consecutive ranks, which launchers place on one node. Pipeline parallelism
// (PP) exchanges one activation per micro-batch between stages, so it can span nodes. Hence TP
// innermost, PP outermost:
//     world rank = ((pp_rank x DP + dp_rank) x CP + cp_rank) x TP + tp_rank
// Context parallelism (CP, chapter 10) passes keys and values around a ring inside every attention:
// next to TP, inside DP, as Megatron-LM orders them. Without CP (CP = 1) the layout is the
// DP x TP x PP one of 07-09. Ulysses (U, --ulysses) splits each ring place's positions once more and
// trades them for heads around attention (USP: Ulysses inside, the ring outside): its U ranks sit
// between TP and CP, so that its all-to-alls take the faster links:
//     world rank = (((pp_rank x DP + dp_rank) x CP + cp_rank) x U + u_rank) x TP + tp_rank
// CP and U together are the ranks that split a sequence (at U = 1, CP alone).
//
// Expert parallelism (EP, chapter 11) is not a fifth factor of the world: it re-splits the ranks of
// each pipeline stage, as Megatron-Core folds it. A stage holds DP x CP x TP consecutive world ranks,
// numbered inside it by (dp_rank x CP + cp_rank) x TP + tp_rank; the same numbers are cut again as
// expert-DP x EP, EP innermost, because its all-to-alls run in every MoE layer and want the fastest
// links:
//     rank inside the stage = edp_rank x EP + ep_rank        (EP must divide DP x CP x TP)
// So EP is carved out of DP x CP and out of TP too: an expert is never split by TP (Megatron's expert
// tensor parallelism of 1), and the TP ranks of an EP group hold different experts. Under TP > 1 a MoE
// model therefore needs sequence parallelism, so that each TP rank routes its own tokens rather than
// the whole group's copy of them. With TP = CP = PP = 1 this is chapter 11's layout:
//     world rank = edp_rank x EP + ep_rank.
//
// The groups, each the ranks that share the coordinates named, ranked by the ones they do not share:
//   tp:        the same pp, dp and cp: TP consecutive ranks, which split every layer's matrices.
//   cp:        the same pp, dp and tp: the CP x U ranks that split a sequence, ranked by cp_rank x U +
//              u_rank (at U = 1 the ring of CP ranks, every TP-th rank).
//   ulysses:   the same pp, dp, cp and tp: the U ranks of a ring place, which trade positions for heads.
//   ring:      the same pp, dp, u and tp: the ring of CP ranks that pass keys and values (at U = 1 the cp
//              group itself).
//   dp:        the same pp, cp and tp: DP replicas of the same parameters, fed different batches.
//   dp_cp:     the same pp and tp: DP x CP x U ranks, ranked by (dp_rank x CP + cp_rank) x U + u_rank.
//              They all hold the same parameters, so gradients are averaged over this group.
//   pp:        the same dp, cp and tp: the PP stages of one pipeline, one in each stage.
//   embedding: the first and last ranks of a pipeline (pp_rank 0 and PP-1), which both hold the tied
//              wte and sum its gradient (Megatron-LM's embedding group). None with one stage, and
//              none for the stages between, which hold no wte.
//   ep:        the same stage and edp_rank: EP consecutive ranks that hold the experts between them,
//              E/EP each, and exchange tokens by all-to-all.
//   expert_dp: the same stage and ep_rank: every EP-th rank of the stage, DP x CP x TP / EP ranks that
//              hold the same experts and average their gradients (the rest of the model is averaged
//              over dp_cp).
// For example DP 4 x TP 2 (one stage of 8 ranks) with EP 4: TP groups {0,1} {2,3} {4,5} {6,7}, DP
// groups {0,2,4,6} {1,3,5,7}, EP groups {0,1,2,3} {4,5,6,7} (two TP groups each), expert-DP groups
// {0,4} {1,5} {2,6} {3,7}.
// The layout is an order and the sizes, as Megatron-Core's RankGenerator makes it: the order string
// "tp-ulysses-cp-dp-pp" lists the axes innermost first, a rank's coordinate on each is a digit of the world
// rank in that mixed radix, and the group of any set of axes (a mask, AxisSet) is the ranks that share
// this rank's coordinates on the others, ranked by theirs in the same order. The experts' order is
// "ep-edp-pp" over the same ranks. A new axis is a token in the order, not a case in a switch.
// The layout and every group are plain functions, so that a test checks them without MPI, and
// ProcessGrid builds its communicators from the same function.
//
// Chapters 01-06 split nothing but the batch: their grid is data parallelism alone, DP = the world
// (ProcessGrid(world)), whose one group is the world itself.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/grid_axes.h"  // GridCoords, GridShape, kAxes

// The order of the axes that factor the world, innermost first, and the experts' order over the same
// ranks (grid_axes.h names the tokens).
constexpr const char* kGridOrder = "tp-ulysses-cp-dp-pp";
constexpr const char* kExpertOrder = "ep-edp-pp";

// The coordinates of world rank `rank`, and the rank of coordinates (from pp, dp, cp, u and tp: ep
// and edp follow from them), in the layout above.
GridCoords grid_coords(const GridShape& shape, int rank);
int grid_rank(const GridShape& shape, const GridCoords& coords);

// The ranks of an order string over `shape` (kGridOrder or kExpertOrder, or any order of the same
// tokens): each token's coordinate is a digit of the world rank, the first token's the fastest.
class RankOrder {
 public:
  RankOrder(const GridShape& shape, const std::string& order);
  int coord(int rank, GridAxis axis) const;
  int rank(const GridCoords& at) const;  // the rank of the coordinates on the order's axes
  // The ranks that share `rank`'s coordinates on every axis of the order outside `axes`, ranked by
  // their coordinates on `axes` (the first token's the fastest). `axes` must all be in the order.
  std::vector<int> group(int rank, AxisSet axes) const;
  bool has(AxisSet axes) const;  // every axis of `axes` is in the order

 private:
  struct Digit {
    GridAxis axis;
    int size, stride;
  };
  std::vector<Digit> digits_;  // innermost first
};

// The axes named by a token ("tp", "cp", "ulysses", "dp", "pp", "ep", "edp"), joined by '-' ("dp-cp"); 0 for a token
// no axis has.
AxisSet axes_named(const std::string& tokens);

// The ranks of the group of the axes `axes` that holds `rank`: from the grid's order, or from the
// experts' order for EP and EDP.
std::vector<int> axis_group_ranks(const GridShape& shape, int rank, AxisSet axes);

// The groups a run uses: each a set of axes (the embedding group: the two ends of the PP axis).
enum class GridGroup { TP, CP, DP, DPxCP, PP, Embedding, EP, ExpertDP, Ulysses, Ring };
// "tp", "cp", "dp", "dp_cp", "pp", "embedding", "ep", "expert_dp", "ulysses", "ring"
const char* group_name(GridGroup which);
AxisSet group_axes(GridGroup which);  // kAxisTP, kAxisCP | kAxisU, ... (Embedding: kAxisPP)

// The world ranks of the `which` group that holds `rank`, in the order of their rank within it: the
// list above. Every member gets the same list. Empty for the embedding group of a rank that has none.
std::vector<int> group_ranks(const GridShape& shape, int rank, GridGroup which);

// The shape for `world` ranks with `tp`, `pp`, `cp`, `ep` and `u` (Ulysses) given: dp = world /
// (tp x pp x cp x u). A world that does not divide stops every rank with a message naming the flags
// (config_error): grid_shape_problem's, "" when the shape is sound.
GridShape grid_shape(int world, int tp, int pp, int cp = 1, int ep = 1, int u = 1);
std::string grid_shape_problem(int world, int tp, int pp, int cp = 1, int ep = 1, int u = 1);

// Chapter 11's checks of --ep (TP, PP and CP 1) against the world and the preset (it has experts):
// "" when sound. Whether --ep divides the experts is the expert dimension's (dimension.h,
// expert_count_problem), which 11 and 12 ask first.
std::string expert_grid_problem(int world, int ep, int experts, const std::string& preset);

class ProcessGrid {
 public:
  // Collective over `world`: splits it into every group above (comm.h, split) but the DP x CP group
  // when CP x U = 1 (it is then the DP group) and the ulysses and ring groups when U = 1 (none, and
  // the cp group), each a communicator of the same kind as `world`.
  ProcessGrid(Communicator& world, const GridShape& shape);
  // Data parallelism alone (chapters 01-06): every rank a replica, the world the data-parallel group.
  // Splits nothing: a group split off is a communicator of its own (over NCCL one more NCCL
  // communicator, with its stream and memory; under --collectives a worker thread), which a run that
  // averages over the world alone has no use for. Only world(), dp() and dp_cp() exist (the world).
  explicit ProcessGrid(Communicator& world);

  const GridShape& shape() const { return shape_; }
  const GridCoords& coords() const { return coords_; }
  // True for the grid of data parallelism alone: it has no group but the world.
  bool data_parallel_only() const { return data_parallel_only_; }
  Communicator& world() const { return world_; }
  Communicator& dp() const { return dp_ ? *dp_ : world_; }
  Communicator& tp() const { return lent(tp_, GridGroup::TP); }
  Communicator& pp() const { return group(pp_, GridGroup::PP); }
  // The ranks that split a sequence, CP x U, ranked by cp x U + u (at CP = U = 1 this rank alone: a
  // ring of one); and the ranks that hold the same parameters, DP x CP x U, ranked by dp x CP x U +
  // cp x U + u: the DP group itself when CP x U = 1.
  Communicator& cp() const { return lent(cp_, GridGroup::CP); }
  Communicator& dp_cp() const { return dp_cp_ ? *dp_cp_ : dp(); }
  // Under Ulysses (U > 1): the ring of CP ranks that share this rank's Ulysses rank, over which keys
  // and values travel (the cp group itself at U = 1); and the U ranks of this rank's ring place,
  // which trade positions for heads (null at U = 1).
  Communicator& ring() const { return ring_ ? lent(ring_, GridGroup::Ring) : cp(); }
  Communicator* ulysses() const { return ulysses_ ? &lent(ulysses_, GridGroup::Ulysses) : nullptr; }
  // The two ends of this rank's pipeline, which sum the tied wte's gradient. Null with one stage, and
  // on the stages between, which hold no wte.
  Communicator* embedding() const { return embedding_.get(); }
  // The expert-parallel group, ranked by ep (at EP = 1 this rank alone), and the ranks that hold the
  // same experts, ranked by edp (at EP = 1 the whole stage).
  Communicator& ep() const { return lent(ep_, GridGroup::EP); }
  Communicator& expert_dp() const { return lent(expert_dp_, GridGroup::ExpertDP); }
  // "DP 2 x TP 2 x PP 1", then " x CP 2" with CP > 1, " x Ulysses 2" with U > 1 and " x EP 4 (expert DP
  // 2)" with EP > 1: EP re-splits a stage's DP x CP x U x TP ranks, so the expert-DP degree says what is
  // left of them.
  std::string describe() const;
  // DualPipe's F&B pairs at once (lanes.h): a pair's forward and backward run side by side, and both
  // talk to tp, cp (ring and ulysses), ep and expert_dp from inside their layers. Each of those groups becomes a
  // LaneCommunicator: the group itself for the forward lane, a copy of it for the backward lane, their
  // statistics together. Everything that reaches the groups through the grid (the run's counters, the
  // chapter's hooks) then reaches both lanes, by the calling thread's lane. Collective over the world;
  // before anything keeps a reference to those groups: refused (an internal error) once one of them was
  // handed out. (dp, dp_cp, pp and embedding hear from one lane
  // at a time: the gradients' sums from the backward's, the messages from the executor's thread.)
  void give_each_lane_its_groups();

 private:
  // Splits the world into the groups of kind `which`, this rank's named `group_name(which)`.
  std::unique_ptr<Communicator> split(GridGroup which);
  // A group that was split (refused on the grid of data parallelism alone).
  Communicator& group(const std::unique_ptr<Communicator>& comm, GridGroup which) const;
  // The same for a group a lane may talk to, noting that it was handed out: from then on
  // give_each_lane_its_groups() is refused, so that nothing keeps a reference to a group that a
  // lane's copy replaces (the order is enforced, not remembered).
  Communicator& lent(const std::unique_ptr<Communicator>& comm, GridGroup which) const {
    handed_out_ = true;
    return group(comm, which);
  }

  Communicator& world_;
  GridShape shape_;
  GridCoords coords_;
  bool data_parallel_only_ = false;
  mutable bool handed_out_ = false;  // a lane's group was handed out (lent)
  std::unique_ptr<Communicator> dp_, tp_, pp_, embedding_, cp_, dp_cp_, ep_, expert_dp_, ulysses_, ring_;
};
