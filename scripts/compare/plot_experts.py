#!/usr/bin/env python3
"""plot_experts.py: chapter 11's experts.png, the load of each expert over the steps, from the "experts"
records of two or more runs of 11_expert_parallel (JSON lines, --json): a column per run (typically the
same run without the balancing loss, --aux-loss-coef 0, and with it), a row per layer. A line per expert:
the share of the layer's assignments routed to it (before capacity), so that a balanced router sits on
1/E (dashed) and a collapsed one sends everything to k experts (k/E... of the tokens each at 1/k).
Each panel's title names the run's coefficient, the shares' range over the run and the step from which
they stayed within 0.05 of their end, and the busiest expert's load at the last step, as a
multiple of a balanced share; the same is printed for the first and last step of every run and layer.
Usage: python3 scripts/compare/plot_experts.py --out results/experts.png RUN.jsonl [RUN.jsonl ...]
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
from run_records import read_run  # noqa: E402

WIDTH_IN, DPI = 9.0, 120  # as scripts/compare/compare_plots.py: read at a README's width
COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#EECA3B", "#9D755D"]


def load(path):
    """(run record, [experts records in step order])."""
    records = read_run(path, kinds=("run",), lists=("experts",))
    run, experts = records.get("run"), records["experts"]
    if not experts:
        sys.exit("plot_experts.py: %s has no 'experts' records: is it a run of 11_expert_parallel?" % path)
    return run, sorted(experts, key=lambda r: r["step"])


def shares(experts, layer):
    """Per expert, the share of each step's assignments in `layer` routed to it."""
    E = experts[0]["experts"]
    out = [[] for _ in range(E)]
    for r in experts:
        routed = [r["routed_L%d_E%d" % (layer, e)] for e in range(E)]
        total = float(sum(routed)) or 1.0
        for e in range(E):
            out[e].append(routed[e] / total)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    loaded = [load(p) for p in args.runs]
    L = loaded[0][1][0]["layers"]
    fig, axes = plt.subplots(L, len(loaded), sharex=True, sharey=True, figsize=(WIDTH_IN, 1.2 + 2.4 * L),
                             squeeze=False)
    for column, (path, (run, experts)) in enumerate(zip(args.runs, loaded)):
        E = experts[0]["experts"]
        steps = [r["step"] for r in experts]
        coef = experts[0].get("aux_loss_coef")
        for layer in range(L):
            ax = axes[layer][column]
            per_expert = shares(experts, layer)
            for e, ys in enumerate(per_expert):
                ax.plot(steps, ys, color=COLORS[e % len(COLORS)], linewidth=1.4, label="expert %d" % e)
            ax.axhline(1.0 / E, color="#555555", linestyle="--", linewidth=1, label="balanced: 1/E = %.3g" % (1.0 / E))
            first = max(ys[0] for ys in per_expert) * E
            last = max(ys[-1] for ys in per_expert) * E
            # The end alone would hide a router that swung on the way: the shares' range over the run,
            # and the last step at which any share stood more than 0.05 from where it ended.
            low, high = min(min(ys) for ys in per_expert), max(max(ys) for ys in per_expert)
            swings = [steps[i] for ys in per_expert for i in range(len(ys)) if abs(ys[i] - ys[-1]) > 0.05]
            settled = ("settled from step %d" % (max(swings) + 1)) if swings else "steady throughout"
            ax.set_title("layer %d, --aux-loss-coef %s: busiest %.2fx at the end;\nshares %.2f-%.2f over the run, %s"
                         % (layer, ("%g" % coef) if coef is not None else "?", last, low, high, settled), fontsize=9)
            ax.tick_params(labelsize=9)
            print("%s layer %d: %d steps, busiest expert %.2fx a balanced share at step %d, %.2fx at step %d"
                  % (path, layer, len(steps), first, steps[0], last, steps[-1]))
        axes[L - 1][column].set_xlabel("step", fontsize=10)
    for layer in range(L):
        axes[layer][0].set_ylabel("share of the\nlayer's assignments", fontsize=9.5)
    axes[0][-1].legend(fontsize=8, loc="upper right")
    fig.suptitle("Load per expert over the steps (11_expert_parallel, %s, EP %d)"
                 % (loaded[0][0]["preset"] if loaded[0][0] else "?", loaded[0][1][0]["ep"]), fontsize=11)
    fig.tight_layout()
    fig.savefig(args.out, dpi=DPI)
    print("wrote %s" % args.out)


if __name__ == "__main__":
    main()
