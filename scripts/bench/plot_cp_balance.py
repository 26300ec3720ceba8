#!/usr/bin/env python3
"""plot_cp_balance.py: chapter 10's balance, contiguous against zig-zag, from the runs' JSON-lines records
(scripts/bench/cp_balance.sh makes them), drawn at a README's width like scripts/compare/compare_plots.py. One row per
ring size (cp), three panels:
  attention work    each rank's attention FLOPs per step, as its kernels counted them (bars), and the
                    formula of docs/theory.md, section 13 (markers): contiguous grows with the rank,
                    zig-zag is flat
  time              each rank's time in the ring's kernels (its thread's CPU time: the work, which other
                    processes on the cores do not stretch) and, stacked on it, its time blocked in the
                    ring waiting for a block: contiguous's first ranks wait for the last one
  step time         the median step of each split (the step every rank shares)
Usage: python3 scripts/bench/plot_cp_balance.py --out results/cp_balance.png RUN.jsonl...
Each RUN.jsonl is one run of 10_context_parallel with a "ring" record (printed after step 1).
"""
import argparse
import os
import sys
import statistics

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

# run_records.py, the reader of a run's records, lives with make compare's scripts in scripts/compare/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compare"))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
from run_records import read_run  # noqa: E402

WIDTH_IN, DPI = 9.0, 120
COLORS = {"contiguous": "#E45756", "zigzag": "#4C78A8"}


def load(path):
    run = read_run(path, kinds=("run", "ring", "summary"))
    missing = [k for k in ("run", "ring") if k not in run]
    if missing:
        raise SystemExit("%s: no %s record (a run of 10_context_parallel with --steps 2 or more?)"
                         % (path, " or ".join(missing)))
    return run


def per_rank(run, key):
    ring, ranks = run["ring"], run["run"]["ranks"]
    return [ring["rank%d_%s" % (q, key)] for q in range(ranks)]


def median_step_ms(run):
    measured = [s["step_ms"] for s in run["steps"] if s["step"] > 0]
    return statistics.median(measured) if measured else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    runs = [load(p) for p in args.runs]
    sizes = sorted({r["ring"]["cp"] for r in runs})
    fig, axes = plt.subplots(len(sizes), 3, figsize=(WIDTH_IN, 3.1 * len(sizes) + 0.5), squeeze=False,
                             gridspec_kw={"width_ratios": [2.2, 2.2, 1]})
    preset = runs[0]["run"]["preset"]
    for row, cp in zip(axes, sizes):
        work, time, step = row
        at = {r["ring"]["split"]: r for r in runs if r["ring"]["cp"] == cp}
        splits = [s for s in ("contiguous", "zigzag") if s in at]
        width = 0.8 / len(splits)
        for i, split in enumerate(splits):
            run = at[split]
            ranks = run["run"]["ranks"]
            xs = [q + (i - (len(splits) - 1) / 2) * width for q in range(ranks)]
            flops = [x / 1e9 for x in per_rank(run, "flops")]
            work.bar(xs, flops, width, color=COLORS[split], label=split)
            work.plot(xs, [x / 1e9 for x in per_rank(run, "theory_flops")], "k_", markersize=12,
                      label="formula" if i == 0 else None)
            # The kernels' CPU time: the work itself, which other processes on the cores do not stretch.
            compute, idle = per_rank(run, "compute_cpu_ms"), [
                a + b for a, b in zip(per_rank(run, "idle_forward_ms"), per_rank(run, "idle_backward_ms"))]
            time.bar(xs, compute, width, color=COLORS[split], label="%s: in the kernels (CPU time)" % split)
            time.bar(xs, idle, width, bottom=compute, color=COLORS[split], alpha=0.35, hatch="//",
                     label="%s: idle in the ring" % split)
            bar = step.bar([i], [median_step_ms(run)], 0.6, color=COLORS[split])
            step.annotate("%.0f" % median_step_ms(run), (i, median_step_ms(run)), xytext=(0, 2),
                          textcoords="offset points", ha="center", va="bottom", fontsize=8)
            del bar
        ranks = max(at[s]["run"]["ranks"] for s in splits)
        for ax in (work, time):
            ax.set_xticks(range(ranks))
            ax.set_xticklabels(["rank %d" % q for q in range(ranks)], fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
        work.set_title("CP %d: attention GFLOP per step" % cp, fontsize=9.5)
        work.legend(fontsize=7.5, loc="upper left")
        time.set_title("CP %d: ms per step in attention (solid), idle in the ring (hatched)" % cp, fontsize=9)
        if cp == sizes[0]:
            handles, labels = time.get_legend_handles_labels()
        step.set_xticks(range(len(splits)))
        step.set_xticklabels(splits, fontsize=8)
        step.set_title("step ms (median)", fontsize=9.5)
        step.tick_params(axis="y", labelsize=8)
        step.margins(y=0.15)
    fig.suptitle("Ring attention's balance under the causal mask (10_context_parallel, preset %s): contiguous vs "
                 "zig-zag" % preset, fontsize=10.5)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(args.out, dpi=DPI)
    plt.close(fig)
    print("wrote %s" % args.out)


if __name__ == "__main__":
    main()
