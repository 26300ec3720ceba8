"""compare_plots.py: three of make compare's plots, drawn from the runs' records as scripts/compare/compare.py
loads them (a list of runs, each {"name", "run", "summary", "theory", "steps", ...}), sized to be read
at a README's width (about 900 pixels):
  loss.png         the loss curves; where they coincide (the same global batch), one line and how far
                   apart they are at most, step by step; runs that differ are drawn and named apart
  memory.png       per rank at the largest rank count, one panel above the other: the model state
                   (parameters, gradients, optimizer state) and the peaks of the activations and of the
                   communication buffers, each bar with its value
  comm_volume.png  bytes each rank sends per step at the largest rank count, each bar with its value
compare.py calls plot_loss, plot_memory and plot_comm_volume(runs, folder).
"""
import os

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

MODEL_STATE = [("params", "parameters", "#4C78A8"), ("grads", "gradients", "#F58518"),
               ("optim", "optimizer state", "#54A24B")]
# Runs "coincide" when every loss is within this relative difference of the reference run's: the
# bound the tests hold every chapter to against one rank of 01 (fp32).
COINCIDE = 1e-5
WIDTH_IN, DPI = 9.0, 120
DIFFER_COLORS = ["#F58518", "#E45756", "#54A24B", "#B279A2", "#9D755D", "#72B7B2", "#EECA3B", "#FF9DA6"]  # 1080 pixels: shrunk to a README's width, text stays legible


def name(run):
    """The chapter, and +SP for 07's run with sequence parallelism."""
    return run["run"]["chapter"] + ("+SP" if run["run"].get("sequence_parallel") else "")


def label(run):
    return "%s x%d" % (name(run), run["run"]["ranks"])


def mb(x):
    return x / 1e6


def measured(run):
    return run["summary"].get("measured_steps", 0) > 0


def peak_over_steps(run, key):
    return max((s.get(key, 0) for s in run["steps"]), default=0)


def at_largest_rank_count(runs):
    """The measured runs with the most ranks: memory and bytes per rank only compare at the same N."""
    n = max(r["run"]["ranks"] for r in runs)
    return [r for r in runs if r["run"]["ranks"] == n and measured(r)], n


def value_labels(ax, bars, values, fmt, fontsize=8):
    """Each bar's value above it; fmt a format, or a function of the value."""
    for bar, value in zip(bars, values):
        ax.annotate(fmt(value) if callable(fmt) else fmt % value, (bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height()),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=fontsize)


def slanted_names(ax):
    """The runs' names under the bars, slanted and ending at their bar, so that long ones do not meet."""
    ax.tick_params(axis="both", labelsize=9)
    plt.setp(ax.get_xticklabels(), rotation=25, ha="right", rotation_mode="anchor")


def loss_differences(runs, reference):
    """Per run: {step: relative difference of its loss from the reference run's at that step}."""
    ref = {s["step"]: s["loss"] for s in reference["steps"]}
    return {label(r): {s["step"]: abs(s["loss"] - ref[s["step"]]) / max(abs(ref[s["step"]]), 1e-30)
                       for s in r["steps"] if s["step"] in ref}
            for r in runs}


LAST_LOSS_TITLE = ""  # the title plot_loss() drew last, for scripts/checks/check_plots.sh


def plot_loss(runs, folder):
    """Returns the labels of the runs that differ from the reference, and the largest difference as
    (run's label, step, relative difference); None without steps."""
    runs = [r for r in runs if r["steps"]]
    if not runs:
        return None
    # The reference: 01 on the fewest ranks, the run every chapter must reproduce.
    reference = min(runs, key=lambda r: (not r["run"]["chapter"].startswith("01"), r["run"]["ranks"]))
    # Only the runs of its model: a chapter with a model of its own (11's mixture of experts) has its
    # own loss curve, compared with its own one-rank run in the table.
    others = [r for r in runs if r["run"].get("preset") != reference["run"].get("preset")]
    runs = [r for r in runs if r["run"].get("preset") == reference["run"].get("preset")]
    diffs = loss_differences(runs, reference)
    differ = [r for r in runs if max(diffs[label(r)].values(), default=0) > COINCIDE]
    same = [r for r in runs if r not in differ]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(WIDTH_IN, 5.6),
                                      gridspec_kw={"height_ratios": [2.4, 1]})
    steps = [s["step"] for s in reference["steps"]]
    top.plot(steps, [s["loss"] for s in reference["steps"]], color="#4C78A8", linewidth=2,
             label="%s: %d of %d runs coincide (within %.0e of %s at every step)"
                   % ("all" if not differ else "these", len(same), len(runs), COINCIDE, label(reference)))
    for r, color in zip(differ, DIFFER_COLORS * len(differ)):
        top.plot([s["step"] for s in r["steps"]], [s["loss"] for s in r["steps"]], linewidth=1.3, color=color,
                 label=label(r))
    # The largest difference over all runs and steps, marked where it is.
    worst_run, worst_step, worst = max(((run, step, d) for run, per in diffs.items() for step, d in per.items()),
                                       key=lambda x: x[2])
    loss_at = {s["step"]: s["loss"] for s in next(r for r in runs if label(r) == worst_run)["steps"]}
    top.plot([worst_step], [loss_at[worst_step]], "o", markersize=9, markerfacecolor="none",
             markeredgecolor="#D62728", markeredgewidth=1.5)
    top.annotate("largest difference: %s at step %d,\n%.1e relative to %s" % (worst_run, worst_step, worst,
                                                                               label(reference)),
                 (worst_step, loss_at[worst_step]), xytext=(0.45, 0.62), textcoords="axes fraction", fontsize=9,
                 color="#D62728", ha="left", va="bottom",
                 arrowprops={"arrowstyle": "->", "color": "#D62728", "linewidth": 1})
    top.set_ylabel("loss", fontsize=10)
    left_out = ""
    if others:  # said, not silently dropped: they are checked against their own one-rank run
        chapters = sorted({r["run"]["chapter"] for r in others})
        left_out = "\n(not drawn: %s, %d run%s on a model of its own, held to its own one-rank run)" % (
            ", ".join(chapters), len(others), "s" if len(others) > 1 else "")
    global LAST_LOSS_TITLE
    LAST_LOSS_TITLE = "Training loss of every run on %s (the same global batch, so the curves should coincide)%s" % (
        reference["run"].get("preset"), left_out)
    top.set_title(LAST_LOSS_TITLE, fontsize=10)
    top.legend(fontsize=9, loc="upper right")
    top.tick_params(labelsize=9)

    # Below: how far apart, step by step: the largest difference over the runs at each step.
    per_step = {}
    for per in diffs.values():
        for step, d in per.items():
            per_step[step] = max(per_step.get(step, 0), d)
    xs = sorted(per_step)
    floor = 1e-9  # a bit-for-bit equal step would sit at minus infinity on a log axis
    equal = any(per_step[x] == 0 for x in xs)
    bottom.semilogy(xs, [max(per_step[x], floor) for x in xs], color="#54A24B", marker=".", linewidth=1.2)
    bottom.axhline(COINCIDE, color="#D62728", linestyle="--", linewidth=1)
    bottom.set_title("Per step: the largest relative difference of any run from %s (dashed: the tests' bound)"
                     % label(reference), fontsize=9.5)
    if equal:
        bottom.text(0.99, 0.04, "on the floor: equal, bit for bit", transform=bottom.transAxes, ha="right",
                    va="bottom", fontsize=8, color="#54A24B")
    bottom.set_ylim(floor / 2, max(COINCIDE * 10, worst * 2))
    bottom.set_xlabel("step", fontsize=10)
    bottom.set_ylabel("relative\ndifference", fontsize=9)
    bottom.tick_params(labelsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "loss.png"), dpi=DPI)
    plt.close(fig)
    return [label(r) for r in differ], (worst_run, worst_step, worst)


def plot_memory(runs, folder):
    runs, n = at_largest_rank_count(runs)
    if not runs:
        return
    names = [name(r) for r in runs]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(WIDTH_IN, 7.4))
    stacked = [0.0] * len(runs)
    for key, what, color in MODEL_STATE:
        values = [mb(r["theory"]["measured_%s_bytes" % key]) if r.get("theory") else 0 for r in runs]
        top.bar(names, values, bottom=stacked, label=what, color=color)
        stacked = [b + v for b, v in zip(stacked, values)]
    for i, total in enumerate(stacked):
        top.annotate("%.1f" % total, (i, total), xytext=(0, 2), textcoords="offset points", ha="center",
                     va="bottom", fontsize=9)
    top.set_ylabel("MB per rank", fontsize=10)
    top.set_title("Model state per rank at N = %d: ZeRO's 1/N steps, tensor parallelism's 1/t" % n, fontsize=11)
    top.legend(fontsize=9)
    top.margins(y=0.15)

    x = range(len(runs))
    transient = [mb(peak_over_steps(r, "mem_comm")) for r in runs]
    activations = [mb(peak_over_steps(r, "mem_activations")) for r in runs]
    value_labels(bottom, bottom.bar([i - 0.2 for i in x], activations, 0.4, label="activations (peak)",
                                    color="#BAB0AC"), activations, "%.1f")
    value_labels(bottom, bottom.bar([i + 0.2 for i in x], transient, 0.4, label="communication buffers (peak)",
                                    color="#72B7B2"), transient, "%.1f")
    bottom.set_xticks(list(x))
    bottom.set_xticklabels(names)
    bottom.set_ylabel("MB per rank", fontsize=10)
    bottom.set_title("Activations and communication buffers per rank at N = %d (peak during a step)" % n,
                     fontsize=11)
    bottom.legend(fontsize=9)
    bottom.margins(y=0.15)
    for ax in (top, bottom):
        slanted_names(ax)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "memory.png"), dpi=DPI)
    plt.close(fig)


def plot_comm_volume(runs, folder):
    runs, n = at_largest_rank_count(runs)
    if not runs:
        return
    values = [mb(r["summary"]["comm_bytes_per_step"]) for r in runs]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4))
    value_labels(ax, ax.bar([name(r) for r in runs], values, color="tab:orange"), values,
                 lambda v: "%.2f" % v if v < 1 else "%.1f" % v, fontsize=9)
    ax.set_ylabel("MB sent per rank per step", fontsize=10)
    ax.set_title("Communication volume, N = %d (ZeRO-3 moves 1.5x DP; TP moves activations)" % n, fontsize=11)
    slanted_names(ax)
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "comm_volume.png"), dpi=DPI)
    plt.close(fig)
