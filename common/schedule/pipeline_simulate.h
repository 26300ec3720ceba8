// pipeline_simulate.h: the simulator that times chapter 08's schedules (the lists of
// pipeline_schedule.h), and the theory the simulation is checked against. Defines ActionCosts and
// uniform_costs(), SimulatedAction, Simulation, simulate() and simulated_makespan(), theory_bubble(),
// theory_bubble_formula() and theory_in_flight().
#pragma once
#include <string>
#include <vector>

#include "schedule/pipeline_schedule.h"

// The costs of the compute actions, per chunk (each vector has v entries, every rank alike) or per
// virtual stage (p x v entries, each stage its own, as chapter 08 measures them): backward is the B action's
// cost (the whole backward for afab, 1f1b and interleaved, the input-gradient half for zb-h1), weight
// W's (zb-h1; may be left empty otherwise). p2p: the time from a send to its data's arrival.
struct ActionCosts {
  std::vector<double> forward, backward, weight;
  double p2p = 0;
  // F&B pairs overlapped (fb_pairs; --fb-overlap, pipeline.h): a pair's time, from the start of its two
  // lanes to the end of the later, per chunk or per virtual stage of its forward. Empty: the passes
  // of a pair take their own times, one after the other (F + B + W).
  std::vector<double> pair;
};
// Every chunk with the same costs.
ActionCosts uniform_costs(const PipelineShape& shape, double forward, double backward, double weight = 0,
                          double p2p = 0);

struct SimulatedAction {
  int rank;
  Action action;
  double start, end;  // end == start for sends and receive posts
};

struct Simulation {
  std::vector<SimulatedAction> actions;  // rank 0's in its list order, then rank 1's, ...
  std::vector<double> idle;              // per rank: makespan minus the time it computed
  double makespan = 0;                   // when the last rank ends: the step's time
  std::string deadlock;                  // "" or which ranks wait for what (then the rest is partial)
  // The mean over ranks of idle / makespan.
  double bubble() const;
};

// Runs every rank's list in order. A compute action takes its cost once it may start: F when its
// input activation has arrived and its receive is posted, B when its output gradient has arrived
// likewise (the last virtual stage's B when its own F is done), W when its B is done. With
// costs.pair (ByTag), an F&B pair (fb_pairs) is one action: it starts once both its F and its B may,
// as DualPipe's pair waits for both inputs before either computes, and takes costs.pair; its sends
// leave at its end. A rank's idle time is the step's makespan minus the time it computes (a pair
// counting its own time, not its passes'): waiting for its first input, waiting between passes, and
// waiting at the end for the others to finish the step. When a message arrives:
//   ByTag        the SendActivation's (SendGradient's) time + p2p; sends and receive posts take no
//                time, and nothing waits for a send.
//   ByCallOrder  a rank's groups run one after the other on its message lane, beside its compute
//                lane: a group starts once the group before it has ended and every pass before it in
//                the list has ended (NCCL's stream waits for the compute stream at issue), and ends
//                p2p after the last of its messages' partner groups has started. A message between
//                two chunks of one rank (with one stage, every message; in a V, the turn at rank
//                p-1) is a copy on the compute lane where its send is listed, in no group. (Pairs
//                run in sequence under call order: costs.pair changes nothing there.)
Simulation simulate(Schedule schedule, const PipelineShape& shape, const ActionCosts& costs,
                    Matching matching = Matching::ByTag);  // builds the lists
Simulation simulate(const PipelineShape& shape, const ActionCosts& costs,
                    const std::vector<std::vector<Action>>& per_rank, Matching matching = Matching::ByTag);
// The schedule's step time by simulate() with these costs, and in `without_p2p` the same with free
// links (the messages' share of the step is the difference): what the planner asks of a schedule.
// With costs.pair, dualpipev's pairs at once in both.
double simulated_makespan(Schedule schedule, const PipelineShape& shape, const ActionCosts& costs,
                          double* without_p2p);

// The bubble fraction (idle / step time) by the theory, with equal stages and no p2p time:
//   afab, 1f1b:  (p-1) / (m+p-1)
//   interleaved: (p-1) / (v m + p-1)
//   zb-h1:       (p-1)(F+B-W) / (m(F+B+W) + (p-1)(F+B-W))   (Qi et al. 2024, for m >= p)
//   zb-v:        (p-1)max(B,2(B-W)) / (2m(F+B+W) + (p-1)max(B,2(B-W)))   (for m >= 2p-1, F <= B)
// with F, B, W one micro-batch's forward, input-gradient and weight-gradient times on one stage
// (on one chunk for zb-v, whose rank holds two; afab, 1f1b and interleaved ignore them: their
// fraction depends on p, m and v only). zb-v's idle per rank does not grow with m: its steady state
// has no bubble, and at F = B = W what is left, (p-1)F, is the fill of the V's first arm, which no
// order can avoid (docs/theory.md, section 10). It holds while F <= B and m >= 2p-1; beyond, the
// simulator gives the real value.
//   dualpipev:   with its F&B pairs one pass after the other (pair < 0): (p-1)F / (2m(F+B+W) + (p-1)F),
//                the same fill: a floor, exact when B <= F and B <= W;
//                with its pairs at once (--fb-overlap, the default), each taking `pair` = F&B of
//                compute: rank r idles 2(p-1)(F&B-B-W) + r(F+B+W-F&B) (it runs 2m-3p+r+1 pairs;
//                docs/theory.md, section 10); exact where B <= F, B <= W and max(F, B+W) <= F&B <=
//                F+B+W, a floor otherwise. At F = B = W the last rank's idle time, (p-1)(F&B - F),
//                is DualPipe's (PP/2-1)(F&B + B - 3W) with B its whole backward.
// For zb-h1 the
// idle time per rank is taken as (p-1)(F+B) - min(m-1, p-1) W, the paper's (p-1)(F+B-W) once m >= p:
// with fewer micro-batches than stages, fewer W's are left to fill the bubble. It holds while
// W <= F and W <= B (the paper's setting, F, B and W about equal); beyond, the handcrafted order no
// longer hides every W, and the simulator gives the real value.
double theory_bubble(Schedule schedule, const PipelineShape& shape, double forward, double backward,
                     double weight, double pair = -1);
// The formula above as a short string for printing: "(p-1)/(m+p-1)" ...; `overlapped`: dualpipev's
// with its pairs at once.
std::string theory_bubble_formula(Schedule schedule, bool overlapped = false);

// The activation slots (max_in_flight) of `chunk` on `rank` by the theory: afab m; 1f1b min(p-r, m);
// zb-h1 min(p, m) on every rank (it keeps 1f1b's min(p-r, m) whole activations, max_awaiting_backward,
// and up to r more awaiting only their W); interleaved as derived in pipeline_simulate.cpp; zb-v
// and dualpipev min(2p-r, m) on chunk 0 and min(r+1, m) on chunk 1: 2p+1 chunks on every rank once m >= 2p, about
// 1f1b's p micro-batches' worth of a rank's layers (pipeline_simulate.cpp derives it).
int theory_in_flight(Schedule schedule, const PipelineShape& shape, int rank, int chunk);
