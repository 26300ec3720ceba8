// planner_search.cpp: the planner's search (planner.h, search_plans and best_per_grid): every grid of
// TP x U x CP x PP x DP (x EP inside DP x CP x U) with its schedule, micro-batch, ZeRO stage and recomputation,
// pruned where memory says a larger micro-batch cannot fit, ranked by predicted step time.
#include <algorithm>
#include <cmath>
#include <string>

#include "planner/planner.h"

namespace {
bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

std::vector<int> powers_of_two_dividing(int n, int at_most) {
  std::vector<int> out;
  for (int x = 1; x <= at_most; x *= 2)
    if (n % x == 0) out.push_back(x);
  return out;
}

// Among configurations equally fast (within 0.1%: ZeRO's traffic hidden behind the compute, say),
// the simpler: less sharding, less recomputation, no sequence parallelism, fewer model-parallel ranks.
bool faster(const PlanResult& a, const PlanResult& b) {
  if (std::fabs(a.step_s - b.step_s) > 1e-3 * std::max(a.step_s, b.step_s)) return a.step_s < b.step_s;
  const PlanConfig &x = a.config, &y = b.config;
  if (x.zero != y.zero) return x.zero < y.zero;
  if (x.recompute != y.recompute) return int(x.recompute) < int(y.recompute);
  if (x.sequence_parallel != y.sequence_parallel) return !x.sequence_parallel;
  if (x.tp * x.pp * x.context() != y.tp * y.pp * y.context()) return x.tp * x.pp * x.context() < y.tp * y.pp * y.context();
  if (x.ulysses != y.ulysses) return x.ulysses < y.ulysses;
  if (x.ep != y.ep) return x.ep < y.ep;
  return a.step_s < b.step_s;
}

bool better(const PlanResult& a, const PlanResult& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.fits) return faster(a, b);
  return a.memory.peak() < b.memory.peak();
}
}  // namespace

namespace {
struct Degrees {
  std::vector<int> tp, cp, pp, ep, ulysses;
};

// Ulysses' u on a grid of tp and cp: the given ones, or powers of two from 1 that split the heads
// NH/(t u) whole, keep the all-to-all inside a node (t u ranks) and leave a rank at least 2,048
// positions, as CP does.
std::vector<int> ulysses_degrees(const PlanInputs& in, const SearchSpace& space, int t, int cp) {
  if (!space.ulysses.empty()) return space.ulysses;
  const ModelShape shape = plan_shape(in);
  std::vector<int> us = {1};
  for (int u = 2; t * u <= in.cluster.gpus_per_node && shape.T / (cp * u) >= 2048; u *= 2)
    if ((shape.NH / t) % u == 0 && in.gpus % (t * cp * u) == 0) us.push_back(u);
  return us;
}

// The degrees the search tries, each axis apart (a grid is one of each whose product divides the GPUs).
Degrees search_degrees(const PlanInputs& in, const SearchSpace& space) {
  const ModelShape shape = plan_shape(in);
  const bool published = !in.chapters_model;
  // TP beyond a node pays the network on every pass: a published shape's search stops at the node.
  std::vector<int> tps =
      space.tp.empty() ? powers_of_two_dividing(in.gpus, published ? in.cluster.gpus_per_node : 64) : space.tp;
  std::vector<int> pps = space.pp;
  if (pps.empty())
    for (int p = 1; p <= shape.L; p++)
      if (in.gpus % p == 0 && (is_power_of_two(p) || shape.L % p == 0)) pps.push_back(p);
  // CP: powers of two that leave a rank at least 2048 positions (shorter blocks are latency, not
  // bandwidth, and no published run cuts finer); EP: powers of two that divide the experts.
  std::vector<int> cps = space.cp, eps = space.ep;
  if (cps.empty())
    for (int cp = 1; cp <= 64 && (cp == 1 || shape.T / cp >= 2048); cp *= 2)
      if (in.gpus % cp == 0 && (cp == 1 || shape.T % (2 * cp) == 0)) cps.push_back(cp);
  if (eps.empty())
    for (int ep = 1; ep <= std::max(1, shape.experts); ep *= 2)
      if (shape.experts == 0 ? ep == 1 : shape.experts % ep == 0) eps.push_back(ep);
  return Degrees{tps, cps, pps, eps, space.ulysses};
}
}  // namespace

std::string why_no_configuration(const PlanInputs& in, const SearchSpace& space) {
  const Degrees d = search_degrees(in, space);
  std::vector<int> dps;
  PlanConfig sample;
  bool sampled = false;
  for (int t : d.tp)
    for (int cp : d.cp)
      for (int u : ulysses_degrees(in, space, t, cp))
        for (int p : d.pp) {
          if (in.gpus % (t * cp * u * p)) continue;
          const int dp = in.gpus / (t * cp * u * p);
          if (std::find(dps.begin(), dps.end(), dp) == dps.end()) dps.push_back(dp);
          if (in.batch % dp || sampled) continue;
          sample = PlanConfig{dp, t, p, Schedule::OneFOneB, 1, 1, in.batch / dp, 0, Recompute::None, t > 1, cp,
                              d.ep.empty() ? 1 : d.ep.front(), u};
          sampled = true;
        }
  std::sort(dps.begin(), dps.end());
  std::string list;
  for (size_t i = 0; i < dps.size() && i < 8; i++) list += (i ? ", " : "") + std::to_string(dps[i]);
  if (dps.size() > 8) list += ", ...";
  if (d.ep.empty()) return "no configuration: no expert-parallel degree of the ones allowed divides the experts (--ep)";
  if (dps.empty())
    return "no configuration: no tp x cp x u x pp of the degrees allowed (--tp, --cp, --ulysses, --pp, or the model's) "
           "divides --gpus " +
           std::to_string(in.gpus);
  if (!sampled)
    return "no configuration: --batch " + std::to_string(in.batch) + " does not split over any data-parallel degree " +
           "that --gpus " + std::to_string(in.gpus) + " leaves (" + list + "): the batch, not memory, is the limit; " +
           "pass a --batch that one of them divides, or other --gpus";
  const PlanResult r = evaluate_plan(in, sample, false);
  return "no configuration: every grid is refused, " + sample.describe() + " because " +
         (r.invalid.empty() ? std::string("of the restrictions given") : r.invalid);
}

std::vector<PlanResult> search_plans(const PlanInputs& in, const SearchSpace& space, int simulate_top) {
  const bool published = !in.chapters_model;
  const Degrees d = search_degrees(in, space);
  const std::vector<int>&tps = d.tp, &cps = d.cp, &pps = d.pp, &eps = d.ep;
  const bool any_sp = std::count(space.sequence_parallel.begin(), space.sequence_parallel.end(), true) > 0;
  std::vector<PlanResult> results;
  for (int t : tps) {
   for (int cp : cps) {
    for (int u : ulysses_degrees(in, space, t, cp)) {
    for (int p : pps) {
      if (in.gpus % (t * cp * u * p)) continue;
      const int dp = in.gpus / (t * cp * u * p);
      if (in.batch % dp) continue;
      for (int ep : eps) {
      if ((dp * cp * u) % ep) continue;
      for (bool sp : space.sequence_parallel) {
        if (sp && t == 1) continue;
        // A published shape under TP always splits the sequence too: it only trims memory, the same
        // bytes move (all-gather + reduce-scatter for each all-reduce).
        if (published && t > 1 && !sp && any_sp) continue;
        std::vector<std::pair<Schedule, int>> schedules;
        if (p == 1) {
          schedules.push_back({Schedule::OneFOneB, 1});
        } else {
          for (Schedule s : space.schedules) {
            if (s == Schedule::Interleaved)
              for (int v : space.virtual_stages) schedules.push_back({s, v});
            else
              schedules.push_back({s, placement_of(s) == Placement::V ? 2 : 1});
          }
        }
        for (auto [schedule, v] : schedules) {
          for (int zero : space.zero) {
            for (Recompute rc : space.recompute) {
              PlanResult overflowing;
              bool any = false, overflow_kept = false;
              for (int B : space.micro_batch) {
                if ((in.batch / dp) % B) continue;
                PlanConfig c{dp, t, p, schedule, v, B, in.batch / dp / B, zero, rc, sp, cp, ep, u};
                if (space.runnable_here_only && !not_runnable_here(c).empty()) continue;
                PlanResult r = evaluate_plan(in, c, false);
                if (!r.invalid.empty()) continue;
                if (!space.require_fit) {
                  results.push_back(r);
                  continue;
                }
                if (!r.fits) {  // a larger micro-batch needs more still
                  if (!any && !overflow_kept) overflowing = r, overflow_kept = true;
                  break;
                }
                any = true;
                results.push_back(r);
              }
              if (!any && overflow_kept) results.push_back(overflowing);
            }
          }
        }
      }
      }
    }
    }
   }
  }
  auto order = [&](const PlanResult& a, const PlanResult& b) {
    return space.require_fit ? better(a, b) : faster(a, b);
  };
  std::sort(results.begin(), results.end(), order);
  // The best by the estimate, simulated; then the order by the simulation.
  const int n = std::min(int(results.size()), simulate_top);
  for (int i = 0; i < n; i++)
    if (results[i].fits || !space.require_fit) results[i] = evaluate_plan(in, results[i].config, true);
  std::stable_sort(results.begin(), results.end(), order);
  return results;
}

std::vector<PlanResult> best_per_grid(const PlanInputs& in, const std::vector<PlanResult>& sorted) {
  // The estimate (theory_bubble on the slowest stage) can misorder a grid's schedules, so the first
  // few of each grid by it are simulated and the fastest kept, not the first alone.
  constexpr int kCandidatesPerGrid = 4;
  std::vector<PlanResult> out;
  std::vector<int> tried;
  for (const PlanResult& r : sorted) {
    size_t g = 0;
    while (g < out.size() && !(out[g].config.tp == r.config.tp && out[g].config.pp == r.config.pp &&
                               out[g].config.cp == r.config.cp && out[g].config.ep == r.config.ep &&
                               out[g].config.ulysses == r.config.ulysses))
      g++;
    if (g < out.size() && tried[g] >= kCandidatesPerGrid) continue;
    const PlanResult candidate = r.fits && !r.simulated ? evaluate_plan(in, r.config, true) : r;
    if (g == out.size()) {
      out.push_back(candidate);
      tried.push_back(1);
    } else {
      tried[g]++;
      if (candidate.fits == out[g].fits && better(candidate, out[g])) out[g] = candidate;
    }
  }
  std::stable_sort(out.begin(), out.end(), better);
  return out;
}
