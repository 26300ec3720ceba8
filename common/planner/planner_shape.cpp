// planner_shape.cpp: the planner's prediction for a published shape (planner.h, evaluate_shape_plan)
// in all six dimensions: TP inside a node, then Ulysses, CP, DP, with EP over DP x CP x U and PP
// outermost.
// Memory by category and the FLOPs are model_shape.h's counts (docs/theory.md, section 16); each
// group's traffic is timed by the communicator's alpha-beta model (comm.h, modelled_ms) on the link
// its span reaches; the pipeline's bubble is 08's simulator (pipeline_simulate.h). What overlaps what
// is written where it is decided, and gathered in docs/planner.md.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "base/metrics.h"  // format_bytes
#include "schedule/pipeline_simulate.h"  // simulated_makespan, theory_bubble, theory_in_flight
#include "planner/planner.h"
#include "planner/planner_kernel_rates.h"  // the grouped experts' rate
#include "planner/planner_shape_refusals.h"  // shape_invalid_reason

namespace {

constexpr double kWidth = 2;  // bf16: what the collectives move and the activations keep, per element

const LinkModel& link_for(const Cluster& cluster, int span) {
  return span <= cluster.gpus_per_node ? cluster.intra_node : cluster.inter_node;
}

double ms(const LinkModel& link, CollectiveKind kind, double payload, int ranks) {
  return modelled_ms(link, kind, int64_t(payload), ranks) / 1e3;
}

// A virtual stage: its layers [first, last) and whether it holds the embedding and the head.
struct StageSpan {
  int first = 0, last = 0;
  bool embedding = false, head = false;
};

double layer_cost(const ModelShape& s, int l) { return layer_product_flops(s, l) + layer_attention_flops(s, l); }

// Layers over `stages` virtual stages, contiguous, each at least one, the head's FLOPs with the last:
// the costliest stage as cheap as possible (exact, by dynamic programming over the cut points; Llama 3
// gives its first and last stages a layer fewer for the same reason). Cached: a search asks again.
const std::vector<StageSpan>& shape_partition(const ModelShape& s, int stages) {
  static std::map<std::string, std::vector<StageSpan>> cache;
  std::ostringstream key;
  key << s.name << ' ' << s.L << ' ' << s.C << ' ' << s.T << ' ' << s.V << ' ' << s.experts << ' ' << stages;
  auto it = cache.find(key.str());
  if (it != cache.end()) return it->second;
  const int L = s.L;
  std::vector<double> prefix(size_t(L) + 1, 0);
  for (int l = 0; l < L; l++) prefix[size_t(l) + 1] = prefix[size_t(l)] + layer_cost(s, l);
  const double head = head_flops(s);
  auto cost = [&](int a, int b) { return prefix[size_t(b)] - prefix[size_t(a)] + (b == L ? head : 0.0); };
  const double inf = 1e300;
  // best[k][i]: the least costliest stage that puts the first i layers on k stages; cut: where the last began.
  std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(stages) + 1, std::vector<int>(size_t(L) + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; k++)
    for (int i = k; i <= L - (stages - k); i++)
      for (int j = k - 1; j < i; j++) {
        const double v = std::max(best[size_t(k) - 1][size_t(j)], cost(j, i));
        if (v < best[size_t(k)][size_t(i)]) best[size_t(k)][size_t(i)] = v, cut[size_t(k)][size_t(i)] = j;
      }
  std::vector<StageSpan> spans(static_cast<size_t>(stages));
  for (int k = stages, i = L; k >= 1; k--) {
    const int j = cut[size_t(k)][size_t(i)];
    spans[size_t(k) - 1] = StageSpan{j, i, k == 1, k == stages};
    i = j;
  }
  if (cache.size() > 4096) cache.clear();
  return cache.emplace(key.str(), spans).first->second;
}

// The micro-batches each chunk of `rank` holds in flight, at every forward (when the sum can grow),
// replayed in the schedule's own order: a forward adds one to its chunk, the pass that ends the
// micro-batch there (the backward; W where the schedule splits it, keeping the whole activations
// until then) takes it away. The distinct vectors only, cached: a search asks for the same shapes.
const std::vector<std::vector<int>>& in_flight_counts(Schedule schedule, const PipelineShape& shape, int rank) {
  static std::map<std::string, std::vector<std::vector<int>>> cache;
  std::ostringstream key;
  key << schedule_name(schedule) << ' ' << shape.stages << ' ' << shape.micro_batches << ' ' << shape.chunks << ' ' << rank;
  auto it = cache.find(key.str());
  if (it != cache.end()) return it->second;
  const bool split = splits_backward(schedule);
  std::vector<int> now(size_t(shape.chunks), 0);
  std::set<std::vector<int>> seen;
  for (const Action& a : build_schedule(schedule, shape, rank)) {
    if (a.op == Op::F) {
      now[size_t(a.chunk)]++;
      seen.insert(now);
    } else if ((a.op == Op::B && !split) || a.op == Op::W) {
      now[size_t(a.chunk)]--;
    }
  }
  if (cache.size() > 4096) cache.clear();
  return cache.emplace(key.str(), std::vector<std::vector<int>>(seen.begin(), seen.end())).first->second;
}

// Every weight product one token passes through on layer `l` of a TP rank: n outputs from k inputs
// (TP splits the outputs of Q, K, V, the up and gate products and the router, the inputs of the
// output and down products; MLA's down-projections are counted split as their FLOPs are), and
// whether it is a routed expert's (one of top-k). Their 2 n k add up to layer_product_flops() / t.
struct WeightProduct {
  double n = 0, k = 0;
  bool routed = false;
};
template <typename Visit>
void for_each_product(const ModelShape& s, int l, int t, Visit visit) {
  const double C = s.C, hd = s.hd(), NH = s.NH, gates = s.gated ? 2 : 1;
  if (s.mla()) {
    visit(WeightProduct{s.q_lora / double(t), C});
    visit(WeightProduct{NH * (hd + s.rope_dim) / t, double(s.q_lora)});
    visit(WeightProduct{(s.kv_lora + s.rope_dim) / double(t), C});
    visit(WeightProduct{NH * 2 * hd / t, double(s.kv_lora)});
  } else {
    visit(WeightProduct{(NH + 2.0 * s.kv()) * hd / t, C});
  }
  visit(WeightProduct{C, NH * hd / t});
  if (!s.moe_layer(l)) {
    visit(WeightProduct{gates * s.ffn / t, C});
    visit(WeightProduct{C, double(s.ffn) / t});
    return;
  }
  visit(WeightProduct{double(s.experts) / t, C});  // the router
  if (s.shared_experts > 0) {
    visit(WeightProduct{gates * s.shared_experts * s.expert_ffn / t, C});
    visit(WeightProduct{C, double(s.shared_experts) * s.expert_ffn / t});
  }
  visit(WeightProduct{gates * s.expert_ffn / t, C, true});
  visit(WeightProduct{C, double(s.expert_ffn) / t, true});
}

// One virtual stage's work for one micro-batch, and its memory on the rank that runs it.
struct ChunkCost {
  double product_s = 0, attention_s = 0;  // forward compute
  double attention_backward_s = 0;         // attention's backward (2.5 x its FLOPs, at the backward's rate)
  double tp_s = 0, cp_s = 0, ep_s = 0;    // exposed, forward + backward (+ the replay)
  double ulysses_s = 0, ulysses_bytes = 0;  // of cp_s, Ulysses' all-to-alls; the bytes they send
  double forward_s = 0, backward_s = 0, weight_s = 0;  // for the simulator, communication included
  double dense_params = 0, expert_params = 0;          // held by this rank
  double activations = 0, logits = 0;                  // per micro-batch in flight (logits: once)
  double head_input = 0;   // the head's saved input where SP keeps it gathered (once, beside the logits)
  double working_set = 0;  // full recomputation: one layer's whole activations, once
  double routed_rows = 0;  // the largest MoE layer's rows at this rank's experts, per micro-batch
  double replay_s = 0;     // recomputation's forward work
  double elementwise_s = 0;  // the elementwise work of forward and backward
  int layers = 0;
};

}  // namespace

PlanResult evaluate_shape_plan(const PlanInputs& in, const PlanConfig& c, bool simulate_pipeline) {
  PlanResult r;
  r.config = c;
  r.invalid = shape_invalid_reason(in, c);
  if (!r.invalid.empty()) return r;
  const ModelShape& s = in.shape;
  const Cluster& k = in.cluster;
  const int t = c.tp, p = c.pp, v = c.virtual_stages, m = c.micro_batches, B = c.micro_batch, cp = c.cp, ep = c.ep;
  const int u = c.ulysses;
  const bool sp = c.sequence_parallel;
  PipelineShape shape{p, m, v, placement_of(c.schedule)};
  const int S = p * v;
  const std::vector<StageSpan>& spans = shape_partition(s, S);

  // The kernel-rate tables of the cluster's GPU (planner_kernel_rates.h), each read at the shape it
  // prices, times the residual `efficiency`; without a table, every product at peak x efficiency.
  DenseRateTable dense_table;
  AttentionRateTable attention_table;
  const bool dense_rates = find_dense_rate_table(k.gpu, &dense_table);
  const bool attention_rates = find_attention_rate_table(k.gpu, in.attention_kernel, &attention_table);
  const double fp8 = in.fp8 ? in.fp8_speedup : 1.0;
  const double product_rate = k.peak_flops * in.efficiency * fp8 * (dense_rates ? dense_table.ceiling() : 1.0);
  auto rate_at_depth = [&](double depth) {
    return k.peak_flops * in.efficiency * fp8 * (dense_rates ? dense_product_efficiency(dense_table, depth) : 1.0);
  };
  // Attention's rate on a layer whose queries see `keys` keys in one kernel call. Under CP a rank's
  // diagonal blocks (1/cp of its work, zigzag-balanced) run the causal kernel, the others the unmasked
  // one; without CP the whole causal T x T.
  auto attention_rate_for = [&](double keys) {
    if (in.attention_efficiency > 0) return k.peak_flops * in.attention_efficiency;
    if (attention_rates) {
      const double hd = s.hd() + s.rope_dim / 2.0;
      const double causal = attention_kernel_efficiency(attention_table, hd, keys, true);
      const double unmasked = attention_kernel_efficiency(attention_table, hd, keys, false);
      return k.peak_flops * in.efficiency / (1.0 / cp / causal + (1 - 1.0 / cp) / unmasked);
    }
    return k.peak_flops * in.efficiency * (dense_rates ? dense_table.ceiling() : 1.0);
  };
  const double tokens = double(B) * s.T / (cp * u);  // a micro-batch's positions on one rank of the CP x U group
  const double stream = tokens * s.C * kWidth;  // the residual stream of those positions
  const double routed_share = in.capacity_factor > 0 ? std::min(1.0, in.capacity_factor) : 1.0;
  const double inputs = in.fp8_activations ? 1 : kWidth;  // a matrix product's cached input, per element
  // The routed experts' products at the grouped rate (planner_kernel_rates.h): each of this rank's
  // experts takes the rows that ep ranks route to it, a micro-batch at a time; the up (and gate)
  // product is (2) F/t x C, the down one C x F/t, each at its own factor, combined by their time.
  double expert_rows = 0, expert_factor = 1;
  GroupedRateTable grouped;
  if (s.moe() && find_grouped_rate_table(k.gpu, &grouped)) {
    expert_rows = tokens * s.top_k * routed_share * ep / s.experts;
    const double gates = s.gated ? 2 : 1, width = double(s.expert_ffn) / t;
    const double up = grouped_expert_factor(grouped, expert_rows, gates * width, s.C);
    const double down = grouped_expert_factor(grouped, expert_rows, s.C, width);
    expert_factor = 1 / (gates / (gates + 1) / up + 1 / (gates + 1) / down);
  }
  // Every product of a layer, priced pass by pass at the rate of its own contraction depth: the
  // forward contracts over its k inputs, the input gradient over its n outputs, the weight gradient
  // over the rows (the micro-batch's tokens; an expert's routed rows). `share` scales the FLOPs (the
  // routed experts' top-k copies), `factor` the rate (the grouped products').
  struct Passes {
    double forward = 0, input_grad = 0, weight_grad = 0, flops = 0, table_flops = 0;
  };
  auto add_product = [&](Passes* p, double n, double kk, double rows, double share, double factor) {
    const double flops = tokens * 2 * n * kk * share;
    p->forward += flops / (rate_at_depth(kk) * factor);
    p->input_grad += flops / (rate_at_depth(n) * factor);
    p->weight_grad += flops / (rate_at_depth(rows) * factor);
    p->flops += 3 * flops;
    if (dense_rates)
      p->table_flops += flops * (dense_product_efficiency(dense_table, kk) + dense_product_efficiency(dense_table, n) +
                                 dense_product_efficiency(dense_table, rows));
  };
  auto layer_products = [&](int l) {
    Passes p;
    // The routed experts at the grouped rate: each of the rank's experts takes expert_rows rows.
    for_each_product(s, l, t, [&](const WeightProduct& w) {
      if (!w.routed) return add_product(&p, w.n, w.k, tokens, 1, 1);
      const double factor = expert_rows > 0 ? grouped_expert_factor(grouped, expert_rows, w.n, w.k) : 1.0;
      add_product(&p, w.n, w.k, expert_rows > 0 ? expert_rows : tokens, s.top_k * routed_share, factor);
    });
    return p;
  };
  double all_flops = 0, all_table_flops = 0, widest_attention_share = 0;
  r.expert_rows = expert_rows, r.expert_rate_factor = expert_factor;
  const int kv_heads = s.mla() ? s.NH : s.kv();
  // Under Ulysses a rank attends with NH/(t u) query heads over u x tokens positions, and the key/value
  // heads they share: kv/(t u), or one whole where a TP rank holds fewer than u of them.
  const double kv_after = u == 1 ? double(kv_heads) / t : std::max(1.0, double(kv_heads) / t / u);
  const double kv_bytes = tokens * u * kv_after * (2.0 * s.hd() + s.rope_dim) * kWidth;  // this rank's K and V (a ring's block)
  // Ulysses' two all-to-alls a pass (docs/theory.md, section 13b), each of u chunks: q, k, v to heads
  // (a chunk: the rank's positions of a peer's NH/(t u) query heads and their key/value heads), the
  // output back. Its backward sends the output's gradient to heads and q, k, v's gradients back: the
  // head layout is kept for attention's backward, as DeepSpeed-Ulysses keeps it.
  const double ulysses_qkv = u * tokens * (double(s.NH) / t / u * (s.hd() + s.rope_dim) + kv_after * (2.0 * s.hd() + s.rope_dim)) * kWidth;
  const double ulysses_out = tokens * double(s.NH) / t * s.hd() * kWidth;
  // The grid's spans: TP innermost (t ranks), then Ulysses (t u), CP (t u cp), DP (t u cp dp), PP the
  // whole grid; EP is ep consecutive ranks of DP x CP x U, t apart.
  const LinkModel& tp_link = link_for(k, t);
  const LinkModel& ulysses_link = link_for(k, t * u);
  const LinkModel& cp_link = link_for(k, t * u * cp);
  const LinkModel& ep_link = link_for(k, t * ep);
  const LinkModel& dp_link = link_for(k, t * u * cp * c.dp);
  const LinkModel& pp_link = link_for(k, c.gpus());
  const bool full = c.recompute == Recompute::Full;
  // The embedding (virtual stage 0) and the head (the last) on one rank: no pipeline, or a V. A tied
  // head on another rank holds a copy of the embedding, summed with it once a step.
  const bool ends_together = p == 1 || rank_of_stage(shape, 0) == rank_of_stage(shape, S - 1);
  const int passes = full ? 3 : 2;  // forward, backward (and the replay of the forward)

  // TP: per layer and pass two collectives of the stream (all-reduces; under SP an all-gather and a
  // reduce-scatter). Megatron-Core's --tp-comm-overlap hides them behind the products they feed.
  const double tp_pair = t == 1 ? 0.0
                         : sp   ? ms(tp_link, CollectiveKind::AllGather, stream, t) + ms(tp_link, CollectiveKind::ReduceScatter, stream, t)
                                : 2 * ms(tp_link, CollectiveKind::AllReduce, stream, t);

  std::vector<ChunkCost> chunks(static_cast<size_t>(S));
  for (int vs = 0; vs < S; vs++) {
    ChunkCost& ch = chunks[size_t(vs)];
    const StageSpan& span = spans[size_t(vs)];
    ch.layers = span.last - span.first;
    double attention_s = 0, attention_backward_s = 0, selective_flops = 0, elementwise_bytes = 0, replayed_bytes = 0;
    double forward_products_flops = 0;
    Passes products;
    for (int l = span.first; l < span.last; l++) {
      const bool routed = s.moe_layer(l);
      const Passes layer = layer_products(l);
      products.forward += layer.forward, products.input_grad += layer.input_grad, products.weight_grad += layer.weight_grad;
      forward_products_flops += layer.flops / 3;
      all_flops += layer.flops, all_table_flops += layer.table_flops;
      // The keys one kernel call sees: a banded layer's window, a ring's block of T/cp, else T.
      const double attention_flops = tokens * layer_attention_flops(s, l) / t;
      const bool banded = layer_attention_flops(s, l) < 2.0 * s.NH * (s.T / 2.0) * (2.0 * s.hd() + s.rope_dim);
      double keys = cp > 1 && in.cp_method == ContextMethod::Ring ? double(s.T) / cp : double(s.T);
      if (banded) keys = std::min<double>(keys, s.window);
      const double layer_attention_rate = attention_rate_for(keys);
      // Reported: the share on the layers that see the most keys (the costliest; a band's is lower).
      if (attention_rates && in.attention_efficiency <= 0)
        widest_attention_share = std::max(widest_attention_share, layer_attention_rate / (k.peak_flops * in.efficiency));
      const double layer_attention_s = attention_flops / layer_attention_rate;
      // The backward: 2.5 x the forward's FLOPs (FlashAttention's backward recomputes the scores: five
      // products to the forward's two), at the kernel's published backward rate where there is one.
      const double backward_factor =
          attention_rates && in.attention_efficiency <= 0
              ? attention_backward_factor(attention_table, s.hd() + s.rope_dim / 2.0, keys)
              : 1.0;
      const double layer_attention_backward_s = 2.5 * layer_attention_s / backward_factor;
      attention_s += layer_attention_s;
      attention_backward_s += layer_attention_backward_s;
      const double layer_all_s = layer.forward + layer.input_grad + layer.weight_grad;
      // TP, exposed, for this layer's passes.
      const double tp_layer = passes * tp_pair;
      ch.tp_s += in.tp_overlap ? std::max(0.0, tp_layer - layer_all_s) : tp_layer;
      // CP: the ring's cp - 1 hops each hide behind the attention on the block before (the backward's
      // carry the blocks and their gradients); the all-gather is exposed, and so is the reduce-scatter
      // of the keys' and values' gradients.
      if (cp > 1) {
        if (in.cp_method == ContextMethod::Ring) {
          const double hop = ms(cp_link, CollectiveKind::SendRecv, kv_bytes, 2);
          const double per_block = layer_attention_s / cp;
          const double forward = (cp - 1) * std::max(0.0, hop - per_block);
          const double backward = (cp - 1) * std::max(0.0, 2 * hop - layer_attention_backward_s / cp);
          ch.cp_s += forward * (full ? 2 : 1) + backward;
        } else {
          const double gather = ms(cp_link, CollectiveKind::AllGather, kv_bytes * cp, cp);
          const double scatter = ms(cp_link, CollectiveKind::ReduceScatter, kv_bytes * cp, cp);
          ch.cp_s += gather * (full ? 2 : 1) + scatter;
        }
      }
      // Ulysses: on the critical path (attention waits for its heads, the next product for its
      // positions); the forward's pair replayed under full recomputation.
      if (u > 1) {
        const double pair = ms(ulysses_link, CollectiveKind::AllToAll, ulysses_qkv, u) +
                            ms(ulysses_link, CollectiveKind::AllToAll, ulysses_out, u);
        ch.cp_s += pair * (full ? 3 : 2);
        ch.ulysses_s += pair * (full ? 3 : 2);
        ch.ulysses_bytes += (full ? 3 : 2) * (ulysses_qkv + ulysses_out) * (u - 1) / u;
      }
      // EP: a dispatch and a combine each pass, every routed row out of the rank but its own share.
      if (routed && ep > 1) {
        const double rows = tokens * s.top_k * routed_share / (sp ? t : 1);
        const double a2a = ms(ep_link, CollectiveKind::AllToAll, rows * s.C * kWidth, ep);
        const double exchange = 2 * passes * a2a;
        ch.ep_s += in.ep_overlap ? std::max(0.0, exchange - (layer_all_s + layer_attention_s + layer_attention_backward_s))
                                 : exchange;
        ch.routed_rows = std::max(ch.routed_rows, tokens * s.top_k * routed_share / t);
      } else if (routed) {
        ch.routed_rows = std::max(ch.routed_rows, tokens * s.top_k * routed_share / t);
      }
      // Parameters this rank holds: the dense ones split by TP, the routed experts by EP (and TP).
      if (routed) {
        ch.dense_params += moe_layer_shared_params(s) / t;
        ch.expert_params += moe_layer_expert_params(s) / (double(t) * ep);
      } else {
        ch.dense_params += dense_layer_params(s) / t;
      }
      // Activations: what TP splits, over t; what it keeps whole, over t under SP only; the routed rows.
      // Selective recomputation drops the norms' outputs, MLA's q, k, v and the MLPs' products.
      const LayerActivations a = layer_activations(s, l);
      const bool selective = c.recompute == Recompute::Selective;
      // The norms' outputs feed the column-parallel products: under DTensor's SP (sp_gathered_inputs)
      // each product keeps its all-gathered input, t times a rank's shard.
      const bool gathered = sp && in.sp_gathered_inputs;
      const double norm_out = selective ? 0 : inputs * a.norm_out;
      const double whole = kWidth * a.residual + (gathered ? 0 : norm_out) + inputs * a.latents + 4 * a.router;
      const double split = (selective && s.mla() ? 0 : kWidth * a.qkv) + inputs * a.attention_out + 4 * a.lse +
                           kWidth * a.mlp_in + (selective ? 0 : inputs * a.mlp_product);
      const double row = inputs * a.routed_in + (in.fp8_activations ? 1 : kWidth) * a.routed_mlp_in +
                         (selective ? 0 : inputs * a.routed_product) + kWidth * a.routed_out;
      const double layer_bytes = tokens * (split / t + whole / (sp ? t : 1) + (gathered ? norm_out : 0)) +
                                 (routed ? tokens * s.top_k * routed_share * row / t : 0.0);
      // The elementwise work at the memory's bandwidth (a third in the forward, two in the backward);
      // what recomputation drops it writes once more.
      const LayerElementwise el = layer_elementwise(s, l);
      const double moved = kWidth * 3 * tokens *
                           (el.per_token / (sp ? t : 1) + (routed ? s.top_k * routed_share * el.per_routed_row / t : 0.0));
      elementwise_bytes += moved;
      if (full) replayed_bytes += moved;
      else if (selective) replayed_bytes += moved / 3;
      if (full) {
        ch.activations += tokens * s.C * kWidth / (sp ? t : 1);  // the layer's input alone
        ch.working_set = std::max(ch.working_set, layer_bytes);
      } else {
        ch.activations += layer_bytes;
      }
      if (selective) selective_flops += tokens * selective_recompute_flops(s, l) / t;
    }
    if (span.head) {
      Passes head;
      add_product(&head, double(s.V) / t, s.C, tokens, 1, 1);
      products.forward += head.forward, products.input_grad += head.input_grad, products.weight_grad += head.weight_grad;
      forward_products_flops += head.flops / 3;
      all_flops += head.flops, all_table_flops += head.table_flops;
      ch.dense_params += ((!s.tied || !ends_together ? double(s.V) * s.C : 0.0) + s.C) / t;  // + the final norm
      ch.logits = tokens * s.V * in.loss_bytes_per_logit / t;  // the loss's copies of the logits, vocabulary-parallel
      if (sp && in.sp_gathered_inputs) ch.head_input = tokens * s.C * kWidth;  // the final norm's output, gathered
      elementwise_bytes += tokens * loss_elementwise_bytes(s) / t;
    }
    if (span.embedding) ch.dense_params += embedding_params(s) / t;
    ch.product_s = products.forward;
    ch.attention_s = attention_s;
    ch.attention_backward_s = attention_backward_s;
    const double elementwise_s = k.memory_bandwidth > 0 ? elementwise_bytes / k.memory_bandwidth : 0.0;
    const double replayed_s = k.memory_bandwidth > 0 ? replayed_bytes / k.memory_bandwidth / 3 : 0.0;  // a forward's
    ch.elementwise_s = elementwise_s;
    const double forward = ch.product_s + ch.attention_s + elementwise_s / 3;
    // The backward: the products' input and weight gradients, attention's backward (above).
    const double input_grad = products.input_grad + ch.attention_backward_s + 2 * elementwise_s / 3;
    const double weight_grad = products.weight_grad;
    // Selective recomputation replays MLA's up-projections at the forward products' mean rate.
    const double forward_rate = forward_products_flops > 0 ? forward_products_flops / products.forward : product_rate;
    const double replay = (full ? ch.product_s + ch.attention_s : selective_flops / forward_rate) + replayed_s;
    ch.replay_s = replay;
    const double comm = ch.tp_s + ch.cp_s + ch.ep_s;
    const double work = forward + input_grad + weight_grad + replay;
    ch.forward_s = forward + comm * forward / work;
    if (splits_backward(c.schedule)) {
      ch.backward_s = replay + input_grad + comm * (work - forward - weight_grad) / work;
      ch.weight_s = weight_grad + comm * weight_grad / work;
    } else {
      ch.backward_s = replay + input_grad + weight_grad + comm * (work - forward) / work;
    }
  }

  r.product_share = all_flops > 0 ? all_table_flops / all_flops : 0.0;
  r.attention_share = widest_attention_share;

  // Memory, rank by rank: the rank with the largest peak is the one shown.
  const int dense_group = c.dp * cp * u, expert_group = dense_group / ep;
  double worst = -1, slowest_busy = -1;
  double slowest_compute = 0, slowest_tp = 0, slowest_cp = 0, slowest_ep = 0, slowest_ulysses = 0;
  double worst_dense = 0, worst_expert = 0;  // parameters of the rank with the most (for DP's traffic)
  int worst_layers = 0;
  ActionCosts costs;
  costs.forward.assign(size_t(S), 0), costs.backward.assign(size_t(S), 0), costs.weight.assign(size_t(S), 0);
  for (int rank = 0; rank < p; rank++) {
    double dense = 0, expert = 0, logits = 0, working = 0, rows = 0, head_input = 0;
    double compute = 0, tp = 0, cpt = 0, ept = 0, ulysses = 0;
    int layers = 0;
    for (int chunk = 0; chunk < v; chunk++) {
      const int vs = p == 1 ? 0 : virtual_stage(shape, rank, chunk);
      const ChunkCost& ch = chunks[size_t(vs)];
      dense += ch.dense_params, expert += ch.expert_params, layers += ch.layers;
      logits = std::max(logits, ch.logits);
      head_input = std::max(head_input, ch.head_input);
      working = std::max(working, ch.working_set);
      rows = std::max(rows, ch.routed_rows);
      compute += 3 * ch.product_s + ch.attention_s + ch.attention_backward_s + ch.elementwise_s + ch.replay_s;
      tp += ch.tp_s, cpt += ch.cp_s, ept += ch.ep_s, ulysses += ch.ulysses_s;
      if (rank == 0) r.ulysses_bytes += m * ch.ulysses_bytes;
      costs.forward[size_t(vs)] = ch.forward_s, costs.backward[size_t(vs)] = ch.backward_s;
      costs.weight[size_t(vs)] = ch.weight_s;
    }
    // Activations at their peak, replayed in the schedule's order: each chunk's micro-batches in
    // flight at the moment their sum is largest (not each chunk's largest count, which come at
    // different times under interleaved and the V schedules).
    std::vector<double> chunk_bytes(size_t(v), 0);
    for (int chunk = 0; chunk < v; chunk++)
      chunk_bytes[size_t(chunk)] = chunks[size_t(p == 1 ? 0 : virtual_stage(shape, rank, chunk))].activations;
    double activations = p == 1 ? chunk_bytes[0] : 0;
    if (p > 1)
      for (const std::vector<int>& counts : in_flight_counts(c.schedule, shape, rank)) {
        double sum = 0;
        for (int chunk = 0; chunk < v; chunk++) sum += counts[size_t(chunk)] * chunk_bytes[size_t(chunk)];
        activations = std::max(activations, sum);
      }
    // Model state: 2 bytes a parameter, 2 a gradient, 12 of optimizer state (fp32 master, m, v), the
    // dense ones sharded over DP x CP and the experts over what is left of it, by ZeRO's stage.
    auto state = [&](double params, int group) {
      const double n = group;
      return std::array<double, 3>{2 * params / (c.zero >= 3 ? n : 1), 2 * params / (c.zero >= 2 ? n : 1),
                                   12 * params / (c.zero >= 1 ? n : 1)};
    };
    const auto d = state(dense, dense_group), e = state(expert, expert_group);
    // Buffers: a message each way per chunk, the ring's next block, the all-to-all's rows out and in,
    // ZeRO-3's gathered layer.
    const double message = stream / (sp ? t : 1);
    double buffers = p > 1 ? 2.0 * v * message : 0.0;
    if (cp > 1) buffers += 2 * kv_bytes;
    if (u > 1) buffers += 2 * ulysses_qkv;  // the all-to-all's send and receive buffers
    if (ep > 1) buffers += 2 * rows * s.C * kWidth;
    if (c.zero >= 3 && layers > 0) buffers += 2 * kWidth * (dense + expert) / layers;
    MemoryForecast f;
    f.model_state = d[0] + d[1] + d[2] + e[0] + e[1] + e[2];
    f.activations = activations + logits + head_input + working;
    f.transient = buffers;
    // The allocator's reserve beside what the tensors hold (PlanInputs::allocator_overhead).
    f.transient += in.allocator_overhead * (f.activations + buffers);
    f.data = in.data_bytes;
    if (simulate_pipeline) r.stages.push_back(StageMemory{d[0] + e[0], d[1] + e[1], d[2] + e[2], f});
    if (f.peak() > worst) {
      worst = f.peak();
      r.stage = rank, r.memory = f;
      r.params_bytes = d[0] + e[0], r.grads_bytes = d[1] + e[1], r.optim_bytes = d[2] + e[2];
      r.expert_params_bytes = e[0], r.logits_bytes = logits;
    }
    if (dense + expert > worst_dense + worst_expert) worst_dense = dense, worst_expert = expert, worst_layers = layers;
    if (compute + tp + cpt + ept > slowest_busy) {
      slowest_busy = compute + tp + cpt + ept;
      slowest_compute = compute, slowest_tp = tp, slowest_cp = cpt, slowest_ep = ept, slowest_ulysses = ulysses;
    }
  }
  r.fits = r.memory.peak() <= k.memory_bytes;
  if (!r.fits) {
    std::ostringstream o;
    o << "needs " << format_bytes(r.memory.peak()) << " of " << format_bytes(k.memory_bytes) << " (stage " << r.stage
      << ": model state " << format_bytes(r.memory.model_state) << ", activations " << format_bytes(r.memory.activations)
      << ", buffers " << format_bytes(r.memory.transient) << ")";
    if (r.memory.model_state > k.memory_bytes) o << ": the model state alone overflows";
    r.overflow = o.str();
  }

  r.compute_s = m * slowest_compute, r.tp_s = m * slowest_tp, r.cp_s = m * slowest_cp, r.ep_s = m * slowest_ep;
  r.ulysses_s = m * slowest_ulysses;
  const double busy = r.compute_s + r.tp_s + r.cp_s + r.ep_s;
  double pipeline_s = busy;
  if (p > 1) {
    costs.p2p = ms(pp_link, CollectiveKind::SendRecv, stream / (sp ? t : 1), 2);
    double without_p2p = 0;
    if (simulate_pipeline) {
      pipeline_s = simulated_makespan(c.schedule, shape, costs, &without_p2p);
      r.simulated = true;
    } else {
      const double per_micro = busy / m, f = per_micro / 3;
      const bool split = splits_backward(c.schedule);
      const double bubble = theory_bubble(c.schedule, shape, f, split ? f : 2 * f, split ? f : 0);
      without_p2p = busy / (1 - bubble);
      pipeline_s = without_p2p + 2 * (p - 1) * costs.p2p;
    }
    r.pp_s = std::max(0.0, pipeline_s - without_p2p);
  }
  r.bubble_s = std::max(0.0, pipeline_s - busy - r.pp_s);

  // DP over the dense parameters' group (dp x cp x u) and the experts' (dp x cp x u / ep): the gradients go
  // out behind the last micro-batch's backward and the updated parameters come back behind the first
  // forward (Megatron-Core's --overlap-grad-reduce and --overlap-param-gather; without dp_overlap both
  // are exposed). What overlaps has a floor: the last bucket of the backward (the first stage's
  // embedding and first layer) has no backward left to hide behind, nor the first bucket of the forward.
  // ZeRO-2 reduce-scatters every micro-batch's gradients behind its own backward (FSDP, also under a
  // pipeline as Llama 3 runs it); ZeRO-3 also gathers the parameters for every forward and backward.
  // One collective a layer (buckets).
  if (dense_group > 1) {
    auto sync = [&](CollectiveKind kind, double params, int group) {
      if (group <= 1 || params <= 0) return 0.0;
      return ms(dp_link, kind, kWidth * params, group) + std::max(0, worst_layers - 1) * ms(dp_link, kind, 0, group);
    };
    auto both = [&](CollectiveKind kind) { return sync(kind, worst_dense, dense_group) + sync(kind, worst_expert, expert_group); };
    const double per_micro = slowest_busy;  // one micro-batch's work on the slowest rank
    const double hide_backward = in.dp_overlap ? per_micro * 2 / 3 : 0, hide_forward = in.dp_overlap ? per_micro / 3 : 0;
    const double edge_params = (embedding_params(s) + (s.moe_layer(0) ? moe_layer_shared_params(s) : dense_layer_params(s))) / t;
    auto edge = [&](CollectiveKind kind) { return in.dp_overlap ? ms(dp_link, kind, kWidth * edge_params, dense_group) : 0.0; };
    auto exposed = [&](CollectiveKind kind, double hidden) { return std::max(edge(kind), both(kind) - hidden); };
    switch (c.zero) {
      case 0: r.dp_s = exposed(CollectiveKind::AllReduce, hide_backward); break;
      case 1:
        r.dp_s = exposed(CollectiveKind::ReduceScatter, hide_backward) + exposed(CollectiveKind::AllGather, hide_forward);
        break;
      case 2:
        r.dp_s = (m - 1) * std::max(0.0, both(CollectiveKind::ReduceScatter) - hide_backward) +
                 exposed(CollectiveKind::ReduceScatter, hide_backward) + exposed(CollectiveKind::AllGather, hide_forward);
        break;
      case 3:
        r.dp_s = m * std::max(0.0, 2 * both(CollectiveKind::AllGather) + both(CollectiveKind::ReduceScatter) -
                                       (in.dp_overlap ? per_micro : 0));
        break;
    }
  }
  // A tied embedding's two copies (first and last stage) summed once a step.
  if (s.tied && !ends_together) r.embedding_s = ms(pp_link, CollectiveKind::AllReduce, kWidth * double(s.V) * s.C / t, 2);
  r.step_s = pipeline_s + r.dp_s + r.embedding_s;

  const double step_tokens = double(in.batch) * s.T;
  r.tokens_per_s = step_tokens / r.step_s;
  r.flops_per_gpu = r.tokens_per_s * model_flops_per_token(s) / in.gpus;
  r.mfu = r.flops_per_gpu / k.peak_flops;
  return r;
}

double dense_product_share(const ModelShape& s, const std::string& gpu, int tp, double rows) {
  DenseRateTable table;
  if (!find_dense_rate_table(gpu, &table)) return 1;
  double flops = 0, weighted = 0;
  auto add = [&](double n, double k, double times) {
    const double f = 2 * n * k * times;
    flops += 3 * f;
    weighted += f * (dense_product_efficiency(table, k) + dense_product_efficiency(table, n) +
                     dense_product_efficiency(table, rows));
  };
  for (int l = 0; l < s.L; l++)
    for_each_product(s, l, tp, [&](const WeightProduct& w) { add(w.n, w.k, w.routed ? s.top_k : 1); });
  add(double(s.V) / tp, s.C, 1);
  return weighted / flops;
}
