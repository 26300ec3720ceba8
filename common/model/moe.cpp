// moe.cpp: the mixture-of-experts MLP of moe.h (routing, capacity, balance loss, experts), on the CPU or,
// its rows and experts, on a GPU (the routing's decisions on the host either way).
#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "ops/device.h"  // transfer: the router's logits down, the routing's index arrays up
#include "ops/matmul_emulation.h"  // Fp32Products: the router in fp32 under any recipe
#include "comm/lanes.h"  // free_when_pair_ends
#include "ops/moe_rows.h"  // the rows' trips around the experts, on the tensors' device
#include "ops/ops.h"

namespace {
Tensor rows_of(const Buffer& b, int64_t n, int64_t cols) {
  return make_view(b.data(), {n, cols}, DType::F32, b.view().device);
}
Tensor rows_of(Tensor t, int64_t begin, int64_t n) {
  const int64_t cols = t.shape[1];
  return make_view(t.f32() + begin * cols, {n, cols}, DType::F32, t.device);
}
// Makes b hold exactly `count` fp32 activations on `device` (contents are not kept). The old block is
// freed before the new one is taken, so that the peak counts only the new (docs/theory.md, 14).
void resize_exactly(Buffer& b, int64_t count, Device device) {
  if (b.count() == count) return;
  b = Buffer();
  if (count > 0) b = Buffer(count, MemCategory::Activations, device);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// The experts

ExpertMLPs::ExpertMLPs(int layers, int C, Device device) : kept_(size_t(layers)), C_(C), device_(device) {}

void ExpertMLPs::forward(int layer, const std::vector<ExpertWeights>& experts, Tensor rows,
                         const std::vector<int64_t>& counts, Tensor out) {
  ENSURE(counts.size() == experts.size(), "ExpertMLPs: one count per expert");
  Kept& k = kept_[size_t(layer)];
  const int64_t n = rows.numel() / C_, F = 4 * int64_t(C_);
  resize_exactly(k.inp, n * C_, device_);
  resize_exactly(k.fch, n * F, device_);
  resize_exactly(k.fch_gelu, n * F, device_);
  k.rows = n;
  k.held = true;
  k.counts = counts;
  if (n > 0) copy_tensor(rows_of(k.inp, n, C_), make_view(rows.data, {n, int64_t(C_)}, DType::F32, rows.device));
  int64_t begin = 0;
  for (size_t e = 0; e < experts.size(); e++) {
    const int64_t m = counts[e];
    if (m == 0) continue;
    const Tensor inp = rows_of(rows_of(k.inp, n, C_), begin, m), fch = rows_of(rows_of(k.fch, n, F), begin, m);
    const Tensor gelu = rows_of(rows_of(k.fch_gelu, n, F), begin, m);
    matmul_forward(fch, inp, experts[e].fc_w, experts[e].fc_b);
    gelu_forward(gelu, fch);
    matmul_forward(rows_of(out, begin, m), gelu, experts[e].proj_w, experts[e].proj_b);
    begin += m;
  }
  ENSURE(begin == n, "ExpertMLPs: the counts do not add up to the rows");
}

void ExpertMLPs::backward(int layer, const std::vector<ExpertWeights>& experts, Tensor dout, Tensor drows) {
  Kept& k = kept_[size_t(layer)];
  const int64_t n = k.rows, F = 4 * int64_t(C_);
  ENSURE(k.held && dout.numel() == n * C_ && drows.numel() == n * C_, "ExpertMLPs::backward: not the forward's rows");
  // The scratch serves every layer of the step: sized at the first backward, for the most rows held.
  int64_t most = 0;
  for (const Kept& held : kept_)
    if (held.held) most = std::max(most, held.rows);
  if (dfch_.count() < most * F) resize_exactly(dfch_, most * F, device_), resize_exactly(dfch_gelu_, most * F, device_);
  if (n > 0) fill_zero(drows);
  int64_t begin = 0;
  for (size_t e = 0; e < experts.size(); e++) {
    const int64_t m = k.counts[e];
    if (m == 0) continue;
    const Tensor inp = rows_of(rows_of(k.inp, n, C_), begin, m), fch = rows_of(rows_of(k.fch, n, F), begin, m);
    const Tensor gelu = rows_of(rows_of(k.fch_gelu, n, F), begin, m);
    const Tensor dgelu = rows_of(dfch_, m, F), dfch = rows_of(dfch_gelu_, m, F);
    fill_zero(dgelu);
    fill_zero(dfch);
    const ExpertWeights& w = experts[e];
    matmul_backward(dgelu, w.dproj_w, w.dproj_b, rows_of(dout, begin, m), gelu, w.proj_w);
    gelu_backward(dfch, fch, dgelu);
    matmul_backward(rows_of(drows, begin, m), w.dfc_w, w.dfc_b, dfch, inp, w.fc_w);
    begin += m;
  }
  // The layer's activations are spent; with the last layer's, the scratch too. Inside a pipeline's
  // F&B pair they go when the pair ends, so that the peak does not depend on which lane got where
  // first (lanes.h).
  for (Buffer* spent : {&k.inp, &k.fch, &k.fch_gelu}) free_when_pair_ends(*spent);
  k.held = false;
  if (std::none_of(kept_.begin(), kept_.end(), [](const Kept& x) { return x.held; }))
    free_when_pair_ends(dfch_), free_when_pair_ends(dfch_gelu_);
}

std::vector<int64_t> ExpertMLPs::rows_per_layer() const {
  std::vector<int64_t> rows;
  for (const Kept& k : kept_) rows.push_back(k.rows);
  return rows;
}

// ---------------------------------------------------------------------------------------------
// Routing

MoELayer::MoELayer(int C, int E, int k, double capacity_factor, double aux_coef, int64_t max_tokens, int slot,
                   Device device)
    : C_(C), E_(E), k_(k), slot_(slot), device_(device), factor_(capacity_factor), coef_(aux_coef) {
  ENSURE(E >= 1 && k >= 1 && k <= E, "MoELayer: need 1 <= k <= E");
  probs_ = Buffer(max_tokens * E, MemCategory::Activations, DType::F32, device);
  chosen_ = Buffer(max_tokens * k, MemCategory::Activations, DType::I32, device);
  row_ = Buffer(max_tokens * k, MemCategory::Activations, DType::I32, device);
  rows_ = Buffer(max_tokens * k * C, MemCategory::Activations, DType::F32, device);
  y_ = Buffer(max_tokens * k * C, MemCategory::Activations, DType::F32, device);
  dy_ = Buffer(max_tokens * k * C, MemCategory::Activations, DType::F32, device);
  drows_ = Buffer(max_tokens * k * C, MemCategory::Activations, DType::F32, device);
  if (device == Device::CPU) return;
  host_probs_.resize(size_t(max_tokens * E));
  host_chosen_.resize(size_t(max_tokens * k));
  host_row_.resize(size_t(max_tokens * k));
  dgate_ = Buffer(max_tokens * k, MemCategory::Other, DType::F32, device);
  dlogits_ = Buffer(max_tokens * E, MemCategory::Other, DType::F32, device);
}

void MoELayer::top_k(const float* probs, int64_t N, int E, int k, int* chosen) {
  for (int64_t t = 0; t < N; t++) {
    const float* p = probs + t * E;
    int* out = chosen + t * k;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int i = 0; i < j; i++) taken = taken || out[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;  // strict: a tie keeps the lower expert
      }
      out[j] = best;
    }
  }
}

int64_t MoELayer::capacity_of(double factor, int64_t tokens, int k, int E) {
  if (factor <= 0) return -1;
  // An expert takes a token at most once, so a capacity of every token drops nothing: a larger
  // factor (1e30) means the same, and casting its product to an integer would overflow.
  const double places = std::floor(factor * double(tokens) * k / E);
  return places >= double(tokens) ? tokens : int64_t(places);
}

void MoELayer::claim_capacity(const int* chosen, int64_t assignments, int E, const std::vector<int64_t>& earlier,
                              int64_t capacity, char* kept) {
  std::vector<int64_t> claimed = earlier;
  claimed.resize(size_t(E), 0);
  for (int64_t a = 0; a < assignments; a++) {
    const int e = chosen[a];
    kept[a] = capacity < 0 || claimed[size_t(e)] < capacity;
    claimed[size_t(e)]++;
  }
}

namespace {
// A run of a rank's rows that are consecutive in the global token order.
struct TokenRun {
  int64_t first_row, length, start;  // start: the global index of its first token
};
std::vector<TokenRun> token_runs(const std::vector<int64_t>& token_index) {
  std::vector<TokenRun> runs;
  for (int64_t i = 0; i < int64_t(token_index.size()); i++) {
    if (!runs.empty() && token_index[size_t(i)] == runs.back().start + runs.back().length) runs.back().length++;
    else runs.push_back({i, 1, token_index[size_t(i)]});
  }
  return runs;
}
}  // namespace

void MoELayer::claim_in_global_order(const int* chosen, int64_t N, const ExpertHooks& hooks, char* kept) {
  const int64_t record = hooks.record_size(E_);
  const bool runs_given = !hooks.token_index.empty();
  ENSURE(!runs_given || int64_t(hooks.token_index.size()) == N, "MoELayer: token_index must list every row");
  const std::vector<TokenRun> runs = runs_given ? token_runs(hooks.token_index) : std::vector<TokenRun>{{0, N, 0}};
  ENSURE(int(runs.size()) <= std::max(1, hooks.max_runs), "MoELayer: more runs of the token order than max_runs");
  // This rank's record: its counts per expert (per run, each run placed, when runs are given).
  std::vector<int32_t> mine(size_t(record), 0), all(size_t(record) * hooks.ranks, 0);
  auto counts_at = [&](std::vector<int32_t>& r, size_t base, int64_t run) -> int32_t* {
    return runs_given ? &r[base + 1 + size_t(run) * (2 + E_) + 2] : &r[base];
  };
  if (runs_given) mine[0] = int32_t(runs.size());
  for (size_t j = 0; j < runs.size(); j++) {
    if (runs_given) {
      mine[1 + j * (2 + E_)] = int32_t(runs[j].start);
      mine[2 + j * (2 + E_)] = int32_t(runs[j].length);
    }
    int32_t* counts = counts_at(mine, 0, int64_t(j));
    for (int64_t a = runs[j].first_row * k_; a < (runs[j].first_row + runs[j].length) * k_; a++) counts[chosen[a]]++;
  }
  if (hooks.gather_counts) {
    hooks.gather_counts(make_view(mine.data(), {record}, DType::I32), make_view(all.data(), {int64_t(all.size())}, DType::I32));
  } else {
    ENSURE(hooks.ranks == 1, "MoELayer: several ranks need a gather_counts hook");
    all = mine;
  }
  // Every run of every rank: its place in the global order and its counts. Chapter 11's ranks are
  // runs in rank order.
  struct Placed {
    int rank;
    int64_t start;
    const int32_t* counts;
  };
  std::vector<Placed> placed;
  for (int r = 0; r < hooks.ranks; r++) {
    const size_t base = size_t(r) * size_t(record);
    const int n = runs_given ? all[base] : 1;
    for (int j = 0; j < n; j++)
      placed.push_back({r, runs_given ? int64_t(all[base + 1 + size_t(j) * (2 + E_)]) : int64_t(r),
                        counts_at(all, base, j)});
  }
  stats_.routed.assign(size_t(E_), 0);
  stats_.by_rank.assign(size_t(hooks.ranks) * E_, 0);
  for (const Placed& p : placed)
    for (int e = 0; e < E_; e++) {
      stats_.routed[size_t(e)] += p.counts[e];
      stats_.by_rank[size_t(p.rank) * E_ + e] += p.counts[e];
    }
  stats_.tokens = N * hooks.ranks;
  stats_.capacity = capacity_of(factor_, stats_.tokens, k_, E_);
  stats_.dropped.assign(size_t(E_), 0);
  for (int e = 0; e < E_; e++)
    if (stats_.capacity >= 0) stats_.dropped[size_t(e)] = std::max<int64_t>(0, stats_.routed[size_t(e)] - stats_.capacity);
  // Each of this rank's runs claims its places after every run before it in the global order.
  for (const TokenRun& run : runs) {
    const int64_t start = runs_given ? run.start : hooks.rank;
    std::vector<int64_t> earlier(size_t(E_), 0);
    for (const Placed& p : placed)
      if (p.start < start)
        for (int e = 0; e < E_; e++) earlier[size_t(e)] += p.counts[e];
    claim_capacity(chosen + run.first_row * k_, run.length * k_, E_, earlier, stats_.capacity, kept + run.first_row * k_);
  }
}

float MoELayer::forward(int layer, Tensor x, Tensor router, Tensor out, const ExpertHooks& hooks,
                        const std::function<void(Tensor, const std::vector<int64_t>&, Tensor)>& run_local) {
  const int64_t N = x.shape[0], A = N * k_;
  ENSURE(N * E_ <= probs_.count(), "MoELayer: more tokens than it was sized for");
  N_ = N;
  const bool gpu = device_ == Device::CUDA;
  // The routing reads and writes host memory: the buffers themselves on the CPU, their copies on a GPU.
  float* probs = gpu ? host_probs_.data() : probs_.f32();
  int* chosen = gpu ? host_chosen_.data() : static_cast<int*>(chosen_.data());
  int* row = gpu ? host_row_.data() : static_cast<int*>(row_.data());
  // Router: logits (N,E), then the softmax of each row, kept for backward. Its products stay in fp32
  // under a mixed-precision recipe (as DeepSeek-V3 keeps its gating, docs/mixed_precision.md): the
  // top-k and the capacity's claims are decisions, which a logit rounded to bf16 (3 significant
  // digits) would flip between near ties, and the router is E x C, a sliver of the products.
  std::fill(probs, probs + N * E_, 0.0f);
  const Tensor logits = make_view(probs, {N, int64_t(E_)});
  if (gpu) {
    const Tensor on_gpu = make_view(probs_.data(), {N, int64_t(E_)}, DType::F32, device_);
    {
      const Fp32Products router_in_fp32;
      matmul_forward(on_gpu, x, router, Tensor());
    }
    transfer(logits, on_gpu);  // waits for the product: the routing needs its values
  } else {
    const Fp32Products router_in_fp32;
    matmul_forward(logits, x, router, Tensor());
  }
  for (int64_t t = 0; t < N; t++) {
    float* p = probs + t * E_;
    const float top = *std::max_element(p, p + E_);
    double sum = 0;
    for (int e = 0; e < E_; e++) sum += (p[e] = std::exp(p[e] - top));
    for (int e = 0; e < E_; e++) p[e] = float(p[e] / sum);
  }
  top_k(probs, N, E_, k_, chosen);

  std::vector<char> kept(size_t(A), 0);
  claim_in_global_order(chosen, N, hooks, kept.data());

  // The dispatch order: grouped by expert, each group in claim order.
  counts_.assign(size_t(E_), 0);
  for (int64_t a = 0; a < A; a++)
    if (kept[size_t(a)]) counts_[size_t(chosen[size_t(a)])]++;
  std::vector<int64_t> next(size_t(E_), 0);
  for (int e = 1; e < E_; e++) next[size_t(e)] = next[size_t(e - 1)] + counts_[size_t(e - 1)];
  n_kept_ = 0;
  for (int64_t c : counts_) n_kept_ += c;
  std::fill(row, row + A, -1);
  const Tensor rows = rows_of(rows_, n_kept_, C_), y = rows_of(y_, n_kept_, C_);
  for (int64_t a = 0; a < A; a++)
    if (kept[size_t(a)]) row[size_t(a)] = int(next[size_t(chosen[size_t(a)])]++);
  if (gpu) {  // the decisions go up; the rows then move on the GPU
    transfer(make_view(probs_.data(), {N * E_}, DType::F32, device_), make_view(probs, {N * E_}));
    transfer(make_view(chosen_.data(), {A}, DType::I32, device_), make_view(chosen, {A}, DType::I32));
    transfer(make_view(row_.data(), {A}, DType::I32, device_), make_view(row, {A}, DType::I32));
  }
  // Where the row ops find the routing: the buffers, on the device of the rows.
  const float* routed_probs = probs_.f32();
  const int* routed_chosen = static_cast<const int*>(chosen_.data());
  const int* routed_row = static_cast<const int*>(row_.data());
  moe_dispatch(rows, x, routed_row, k_);
  if (hooks.experts_forward) hooks.experts_forward(slot_, layer, rows, counts_, y);
  else run_local(rows, counts_, y);

  // Combine: each token's kept expert outputs, weighted by their probabilities.
  moe_combine(out, y, routed_probs, routed_chosen, routed_row, k_, E_);

  // The balance loss: f_e over the global micro-batch, P_e this rank's mean (file comment).
  f_.assign(size_t(E_), 0.0);
  double local = 0;
  for (int e = 0; e < E_; e++) {
    f_[size_t(e)] = double(stats_.routed[size_t(e)]) / double(k_ * stats_.tokens);
    double p_sum = 0;
    for (int64_t t = 0; t < N; t++) p_sum += probs[size_t(t * E_ + e)];
    local += f_[size_t(e)] * p_sum / double(N);
  }
  const double aux = coef_ * E_ * local;
  stats_.aux_loss = aux;  // this rank's share; the caller averages it over the ranks for the global value
  return float(aux);
}

void MoELayer::backward(Tensor dout, Tensor x, Tensor router, Tensor dx, Tensor drouter, float loss_weight,
                        const ExpertHooks& hooks, int layer,
                        const std::function<void(Tensor dout, Tensor drows)>& run_local) {
  const int64_t N = N_, A = N * k_;
  ENSURE(dout.shape[0] == N, "MoELayer::backward: not the forward's tokens");
  const bool gpu = device_ == Device::CUDA;
  // The routing's host values (the forward's), and where the row ops find them (the rows' device).
  const float* probs = gpu ? host_probs_.data() : probs_.f32();
  const int* chosen = gpu ? host_chosen_.data() : static_cast<const int*>(chosen_.data());
  const int* row = gpu ? host_row_.data() : static_cast<const int*>(row_.data());
  const int* routed_row = static_cast<const int*>(row_.data());
  const Tensor y = rows_of(y_, n_kept_, C_), dy = rows_of(dy_, n_kept_, C_), drows = rows_of(drows_, n_kept_, C_);
  // d probs: from the combine (kept assignments), and from the balance loss (every probability).
  std::vector<float> dprobs(size_t(N * E_), 0.0f), dgate(static_cast<size_t>(A), 0.0f);
  if (gpu) {
    moe_combine_backward(dy, dgate_.f32(), dout, y, probs_.f32(), static_cast<const int*>(chosen_.data()), routed_row,
                         k_, E_);
    transfer(make_view(dgate.data(), {A}), make_view(dgate_.data(), {A}, DType::F32, device_));
  } else {
    moe_combine_backward(dy, dgate.data(), dout, y, probs, chosen, row, k_, E_);
  }
  for (int64_t a = 0; a < A; a++)
    if (row[size_t(a)] >= 0) dprobs[size_t((a / k_) * E_ + chosen[size_t(a)])] += dgate[size_t(a)];
  for (int e = 0; e < E_; e++) {
    const float d_aux = float(loss_weight * coef_ * E_ * f_[size_t(e)] / double(N));
    for (int64_t t = 0; t < N; t++) dprobs[size_t(t * E_ + e)] += d_aux;
  }
  // The experts, then each kept row's gradient back to its token.
  if (hooks.experts_backward) hooks.experts_backward(slot_, layer, dy, drows);
  else run_local(dy, drows);
  moe_return_rows(dx, drows, routed_row, k_);
  // Softmax backward: dlogits = p * (dprobs - sum_j p_j dprobs_j); then the router's product.
  std::vector<float> dlogits(size_t(N * E_), 0.0f);
  for (int64_t t = 0; t < N; t++) {
    const float* p = probs + t * E_;
    const float* dp = dprobs.data() + t * E_;
    double inner = 0;
    for (int e = 0; e < E_; e++) inner += double(p[e]) * dp[e];
    for (int e = 0; e < E_; e++) dlogits[size_t(t * E_ + e)] = float(p[e] * (dp[e] - inner));
  }
  Tensor dlogits_rows = make_view(dlogits.data(), {N, int64_t(E_)});
  if (gpu) {
    const Tensor on_gpu = make_view(dlogits_.data(), {N, int64_t(E_)}, DType::F32, device_);
    transfer(on_gpu, dlogits_rows);
    dlogits_rows = on_gpu;
  }
  const Fp32Products router_in_fp32;  // as its forward
  matmul_backward(dx, drouter, Tensor(), dlogits_rows, x, router);
}

std::string moe_run_problem(const std::string& preset, const std::string& chapter, Device device, bool expert_parallel,
                            int world, int tp, int pp, const std::string& recompute) {
  const std::string what = "--preset " + preset + " is a mixture of experts";
#ifndef GPT_WITH_CUDA
  if (device != Device::CPU) return what + ": this program was built without CUDA; pass --device cpu";
#endif
  // On a GPU (fp32: the chapters force it) where the experts have their chapters: 11 and 12.
  if (device != Device::CPU && !expert_parallel)
    return what + ", which runs on a GPU in 11_expert_parallel and 12_5d_parallel only: run it there, or pass "
                  "--device cpu";
  if (!expert_parallel && world > 1)
    return what + ": its balance loss and capacity count every rank's tokens, which only 11_expert_parallel and "
                  "12_5d_parallel arrange; run it there (mpiexec -n " + std::to_string(world) +
                  " ./11_expert_parallel/train --ep N), or run " + chapter + " on one rank";
  if (!expert_parallel && (tp > 1 || pp > 1))
    return what + ": neither --tp nor --pp splits its blocks here; use 11_expert_parallel's --ep, or 12_5d_parallel";
  if (recompute == "full") return what + ": --recompute full would route each block twice; use selective or none";
  return "";
}

std::string moe_capacity_problem(double factor, int64_t tokens, int k, int E) {
  if (factor <= 0 || MoELayer::capacity_of(factor, tokens, k, E) >= 1) return "";
  // The smallest factor with floor(f x tokens x k / E) >= 1 is E / (tokens x k); printed with as few
  // digits as still give one place once read back.
  const double smallest = double(E) / (double(tokens) * k);
  std::string shown;
  for (int digits = 3; digits <= 17; digits++) {
    char text[40];
    std::snprintf(text, sizeof text, "%.*g", digits, smallest * (1 + 1e-12));
    shown = text;
    if (MoELayer::capacity_of(std::strtod(text, nullptr), tokens, k, E) >= 1) break;
  }
  char given[40];
  std::snprintf(given, sizeof given, "%g", factor);
  return "--capacity-factor " + std::string(given) + " gives each expert a capacity of 0 assignments (floor(factor x " +
         std::to_string(tokens) + " tokens a micro-batch x top-" + std::to_string(k) + " / " + std::to_string(E) +
         " experts)), which drops every token; pass at least --capacity-factor " + shown +
         " (one token per expert), or 0 for no capacity";
}
