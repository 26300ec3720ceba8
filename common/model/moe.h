// moe.h: the mixture-of-experts MLP of the MoE presets (model_config.h: moe-tiny, moe-small), in fp32
// on the CPU or a GPU. Defines ExpertWeights, ExpertMLPs, ExpertHooks, RoutingStats, MoELayer and
// moe_run_problem().
//
// In a MoE block the MLP becomes E experts, each an MLP of the dense one's shape (fc 4C x C, GELU,
// proj C x 4C), and a router, a linear map without bias (E x C: a row per expert). Per token x:
//   probs  = softmax(router x)                              (E)
//   chosen = the k largest probs (ties: the lower expert)    top-k
//   out    = sum over the chosen e that kept the token: probs[e] * expert_e(x)
// The top-k weights are the softmax's probabilities as they are, NOT renormalized over the k chosen
// (as GShard and Switch do; Mixtral renormalizes): with k = 1 the router then still learns from
// the loss, and a token whose experts dropped it simply adds less to the residual stream.
//
// Capacity (--capacity-factor f, 0 = unlimited): expert e takes at most
//   capacity = floor(f x tokens x k / E)   (at most tokens: an expert takes a token once)
// of the assignments (token, choice) routed to it, where tokens counts the whole global micro-batch
// (every data-parallel rank's tokens; with --grad-accum K, one of the step's K micro-batches, so the
// capacity, like the balance loss below, is per micro-batch: training_run.h's micro_batch() gives
// micro-batch m the same sequences on every grid). Assignments claim places in the global token order: the
// batch's tokens in data order (rank 0's sequences first, data.h), and within a token its choices
// in order of probability. That order is the same on any grid, so the same assignments are dropped
// on one rank as on eight. A dropped assignment contributes nothing; a token that all its experts
// dropped passes through the block on the residual stream alone.
//
// Load-balancing loss (Switch Transformer, GShard), --aux-loss-coef a:
//   aux = a x E x sum_e f_e x P_e,
//   f_e = (assignments routed to e, before capacity) / (k x tokens),   P_e = mean over tokens of probs[e]
// f sums to 1, so a perfectly balanced router gives aux = a. f_e is a count (no gradient); the
// gradient flows through P_e. Both are over the global micro-batch, so the loss and its gradient
// equal one rank's on any grid: each rank adds a x E x sum_e f_e x (its own tokens' mean of
// probs[e]), whose average over the ranks is aux.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/memory.h"
#include "ops/tensor.h"

// One expert MLP's parameters and their gradients: fc (4C,C) + (4C), proj (C,4C) + (C).
struct ExpertWeights {
  Tensor fc_w, fc_b, proj_w, proj_b;
  Tensor dfc_w, dfc_b, dproj_w, dproj_b;
};

// Runs a set of experts on rows grouped by expert (counts[e] rows of expert e, in that order), and
// keeps, per layer, what the backward reads. Used for all E experts on one rank, and for a rank's
// own E/ep experts under expert parallelism (chapter 11). Its activations follow the routing exactly
// (docs/theory.md, 14): a layer's forward allocates 9C floats per row it runs, its backward frees
// them; the first backward of a step allocates the scratch (8C floats per row of the layer with the
// most rows), freed with the last layer's. Between steps it holds nothing. Its buffers live on
// `device`, where the rows and the experts' weights are.
class ExpertMLPs {
 public:
  ExpertMLPs(int layers, int C, Device device = Device::CPU);
  // out(n,C) = expert_e(rows) for each group; rows and counts are kept for backward.
  void forward(int layer, const std::vector<ExpertWeights>& experts, Tensor rows, const std::vector<int64_t>& counts,
               Tensor out);
  // drows(n,C) = the rows' gradients (overwritten); the experts' weight gradients += theirs.
  void backward(int layer, const std::vector<ExpertWeights>& experts, Tensor dout, Tensor drows);
  int64_t rows(int layer) const { return kept_[size_t(layer)].rows; }  // of the layer's last forward
  std::vector<int64_t> rows_per_layer() const;                         // (L) rows(l), the routing's

 private:
  struct Kept {
    Buffer inp, fch, fch_gelu;  // (rows,C), (rows,4C), (rows,4C): from the forward to the backward
    int64_t rows = 0;
    bool held = false;
    std::vector<int64_t> counts;
  };
  std::vector<Kept> kept_;
  Buffer dfch_, dfch_gelu_;  // backward scratch (most rows,4C)
  int C_;
  Device device_;
};

// What a MoE layer asks of the program around it. Left empty (one rank): every count is this rank's
// and every expert runs here.
struct ExpertHooks {
  // The global micro-batch's routing counts: `mine` holds this rank's record (below); fills `all`
  // (ranks x the record) with every routing rank's, in order (an all-gather over the ranks that route
  // the micro-batch's tokens). `rank` and `ranks`: this rank's place among them and their number.
  std::function<void(Tensor mine, Tensor all)> gather_counts;
  int rank = 0, ranks = 1;
  // Where this rank's tokens stand in the global token order (sequence x T + position, the sequences
  // in data order). Empty (chapter 11): rank r's N rows are the run [r N, (r+1) N), and its record is
  // its E counts. Under context or sequence parallelism (chapter 12) a rank's rows are several runs
  // of that order, interleaved with other ranks' runs: `token_index` gives each row's place, and the
  // record lists up to `max_runs` runs (the same bound on every rank: the records have one size),
  // each with its place and its E counts, so that every assignment claims capacity in the one order
  // a single rank would.
  std::vector<int64_t> token_index;
  int max_runs = 0;
  // The experts: rows (n,C) grouped by expert 0..E-1 (counts[e] rows each) -> out (n,C), the same
  // order. Expert parallelism sends each group to the rank that holds its expert and back. `slot`:
  // the model's activation slot (a pipeline's micro-batch in flight; 0 without a pipeline).
  std::function<void(int slot, int layer, Tensor rows, const std::vector<int64_t>& counts, Tensor out)> experts_forward;
  // The reverse: dout (n,C) of slot's last forward's rows -> drows (n,C), overwritten.
  std::function<void(int slot, int layer, Tensor dout, Tensor drows)> experts_backward;
  // The size of one rank's record for gather_counts, in int32s.
  int64_t record_size(int E) const { return token_index.empty() ? E : 1 + int64_t(max_runs) * (2 + E); }
};

// One layer's routing in the last forward, over the global micro-batch (the same on every rank).
struct RoutingStats {
  std::vector<int64_t> routed;   // (E) assignments routed to each expert, before capacity
  std::vector<int64_t> dropped;  // (E) of them over capacity
  std::vector<int64_t> by_rank;  // (ranks x E) each data-parallel rank's routed, in data order (gathered)
  int64_t capacity = -1;         // -1: unlimited
  int64_t tokens = 0;            // the global micro-batch's tokens
  double aux_loss = 0;           // the balance loss (coefficient included), global
};

// The MoE MLP of one block, forward and backward over this rank's tokens.
// On a GPU (`device` CUDA; the tensors passed in live there) the rows stay on the GPU: the router's
// product, the dispatch, the experts, the combine and their backwards run there (moe_rows.h). The
// routing's decisions (softmax, top-k, the capacity's claims in the global order, the balance loss)
// are made on the host from the router's (N,E) logits, copied down once per layer, exactly as on
// the CPU, and go up as index arrays: a few KB each way, and the same drops on either device.
class MoELayer {
 public:
  // `slot`: the model's activation slot this router serves (handed to the hooks).
  MoELayer(int C, int E, int k, double capacity_factor, double aux_coef, int64_t max_tokens, int slot = 0,
           Device device = Device::CPU);
  // x (N,C): the block's ln2 output; router (E,C); out (N,C) overwritten. Returns this rank's share of
  // the balance loss (its average over the ranks is the global one: see the file comment).
  // `run_local` runs the experts when hooks.experts_forward is empty.
  float forward(int layer, Tensor x, Tensor router, Tensor out, const ExpertHooks& hooks,
                const std::function<void(Tensor rows, const std::vector<int64_t>& counts, Tensor out)>& run_local);
  // dout (N,C): the gradient of out. Accumulates dx (N,C) and drouter (E,C); the experts' weight
  // gradients through hooks.experts_backward, or run_local. loss_weight scales the balance loss's
  // gradient as the cross-entropy's (gradient accumulation).
  void backward(Tensor dout, Tensor x, Tensor router, Tensor dx, Tensor drouter, float loss_weight,
                const ExpertHooks& hooks, int layer, const std::function<void(Tensor dout, Tensor drows)>& run_local);
  const RoutingStats& stats() const { return stats_; }

  // The pure pieces, exposed for tests.
  // Top-k of each row of probs (N,E): chosen (N*k) expert indices, largest first, ties to the lower.
  static void top_k(const float* probs, int64_t N, int E, int k, int* chosen);
  // Which assignments keep their place: assignment a = t*k + j of expert chosen[a] is kept when the
  // experts' places claimed before it (earlier[e]: by the ranks before this one, then by this rank's
  // earlier assignments) are fewer than capacity (-1: unlimited).
  static void claim_capacity(const int* chosen, int64_t assignments, int E, const std::vector<int64_t>& earlier,
                             int64_t capacity, char* kept);
  // -1 when factor is 0; at most `tokens` (a larger capacity drops nothing more)
  static int64_t capacity_of(double factor, int64_t tokens, int k, int E);

 private:
  // The counts' exchange and the capacity's claims (file comment): sets stats_ and kept.
  void claim_in_global_order(const int* chosen, int64_t N, const ExpertHooks& hooks, char* kept);

  int C_, E_, k_, slot_;
  Device device_;
  double factor_, coef_;
  int64_t N_ = 0, n_kept_ = 0;
  // Sized once for max_tokens (counted as activations, docs/theory.md 14), on `device`.
  Buffer probs_;                 // (N,E) fp32
  Buffer chosen_;                // (N*k) int32
  Buffer row_;                   // (N*k) int32: the assignment's row in the dispatch buffers, -1 dropped
  // On a GPU, the routing's host copies of those three (host memory, outside the GPU's counts), and
  // scratch on the GPU for the gates' gradients (N*k) and the router's logits' (N,E): memory "other".
  std::vector<float> host_probs_;
  std::vector<int> host_chosen_, host_row_;
  Buffer dgate_, dlogits_;
  std::vector<int64_t> counts_;  // (E) kept rows per expert, this rank
  std::vector<double> f_;        // (E) f_e of the last forward
  Buffer rows_, y_, dy_, drows_;  // (n_kept,C): dispatched inputs, expert outputs, their gradients
  RoutingStats stats_;
};

// What a chapter trains a MoE model with besides its preset: chapter 11's --capacity-factor and
// --aux-loss-coef. Elsewhere both are 0 (no capacity, no balance loss). Checkpoints store both.
struct MoESettings {
  double capacity_factor = 0, aux_loss_coef = 0;
};

// What stops a MoE preset from running as asked, as the message to print (config_error's), or "":
// on a GPU it runs in 11 and 12 only (`expert_parallel`; they force fp32), elsewhere --device cuda is
// refused, not silently moved; routing
// statistics span every rank, which only chapter 11 arranges (`expert_parallel`), so elsewhere a MoE
// preset runs on one rank only; neither --tp nor --pp splits a MoE block; --recompute full would
// route a block twice.
std::string moe_run_problem(const std::string& preset, const std::string& chapter, Device device, bool expert_parallel,
                            int world, int tp, int pp, const std::string& recompute);
// "" when --capacity-factor `factor` leaves every expert at least one place in a global micro-batch of
// `tokens`, else the refusal naming the smallest factor that does (capacity_of's floor would be 0,
// and every assignment dropped).
std::string moe_capacity_problem(double factor, int64_t tokens, int k, int E);
