#!/usr/bin/env python3
"""compare.py: reads the JSON-lines records of `make compare` (results/*.jsonl) and prints every run
side by side, then writes the plots:
  throughput.png  tokens/s per run (bar chart)
  loss.png        loss curves, overlaid
  memory.png      memory per rank by category, every chapter at the largest rank count (stacked bars)
  comm_volume.png bytes each rank sends per step, every chapter at the largest rank count
Usage: python3 scripts/compare.py RESULTS_DIR
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

# Activations are the same in every chapter (each rank runs the same micro-batch), and in the tiny
# model they dwarf the rest: the plot shows what the chapters change.
MEMORY_CATEGORIES = ["params", "grads", "optim", "comm"]


def load_runs(folder):
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        run = {"name": os.path.basename(path)[: -len(".jsonl")], "steps": []}
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                kind = record.get("type")
                if kind == "step":
                    run["steps"].append(record)
                elif kind in ("run", "summary", "theory"):
                    run[kind] = record
        if "summary" in run:
            runs.append(run)
    runs.sort(key=lambda r: (r["run"]["chapter"], r["run"]["ranks"]))
    return runs


def label(run):
    return "%s x%d" % (run["run"]["chapter"], run["run"]["ranks"])


def mb(x):
    return x / 1e6


def print_table(runs):
    header = "%-20s %9s %8s %11s %8s %10s %12s %14s %10s" % (
        "run", "tok/s", "step ms", "exposed ms", "comm ms", "coll/step", "MB/step", "peak mem/rank", "final loss")
    print(header)
    print("-" * len(header))
    for run in runs:
        s = run["summary"]
        print("%-20s %9.0f %8.1f %11.2f %8.2f %10.0f %12.3f %11.2f MB %10.4f" % (
            label(run), s["tokens_per_s"], s["step_ms"], s["exposed_comm_ms"], s["comm_ms"],
            s["collectives_per_step"], mb(s["comm_bytes_per_step"]), mb(s["peak_mem_bytes"]), s["final_loss"]))


def plot_throughput(runs, folder):
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(runs)), 4))
    ax.bar([label(r) for r in runs], [r["summary"]["tokens_per_s"] for r in runs], color="tab:blue")
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput (mean over measured steps)")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "throughput.png"), dpi=120)
    plt.close(fig)


def plot_loss(runs, folder):
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        steps = run["steps"]
        ax.plot([s["step"] for s in steps], [s["loss"] for s in steps], label=label(run), linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Training loss (same global batch: curves coincide)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "loss.png"), dpi=120)
    plt.close(fig)


def at_largest_rank_count(runs):
    """The runs with the most ranks: memory and bytes per rank only compare at the same N."""
    n = max(r["run"]["ranks"] for r in runs)
    return [r for r in runs if r["run"]["ranks"] == n], n


def plot_memory(runs, folder):
    runs, n = at_largest_rank_count(runs)
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(runs)), 4))
    names = [label(r) for r in runs]
    bottom = [0.0] * len(runs)
    for category in MEMORY_CATEGORIES:
        values = [mb(r["steps"][-1].get("mem_" + category, 0)) for r in runs]
        ax.bar(names, values, bottom=bottom, label="comm (transient)" if category == "comm" else category)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("MB per rank")
    ax.margins(y=0.08)
    ax.set_title("Model state per rank, N = %d (activations, the same everywhere, left out)" % n, fontsize=10)
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "memory.png"), dpi=120)
    plt.close(fig)


def plot_comm_volume(runs, folder):
    runs, n = at_largest_rank_count(runs)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(runs)), 4))
    ax.bar([label(r) for r in runs], [mb(r["summary"]["comm_bytes_per_step"]) for r in runs], color="tab:orange")
    ax.set_ylabel("MB sent per rank per step")
    ax.set_title("Communication volume, N = %d (ZeRO-3 moves 1.5x DP)" % n)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "comm_volume.png"), dpi=120)
    plt.close(fig)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "results"
    runs = load_runs(folder)
    if not runs:
        sys.exit("no finished runs in %s (expected *.jsonl from make compare)" % folder)
    print_table(runs)
    plot_throughput(runs, folder)
    plot_loss(runs, folder)
    plot_memory(runs, folder)
    plot_comm_volume(runs, folder)
    plots = ("throughput.png", "loss.png", "memory.png", "comm_volume.png")
    print("plots: %s" % ", ".join(os.path.join(folder, p) for p in plots))


if __name__ == "__main__":
    main()
