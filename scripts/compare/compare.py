#!/usr/bin/env python3
"""compare.py: reads the JSON-lines records of `make compare` (results/*.jsonl, and every round of each
run in results/rounds/, compare_timing.py beside this file), prints every run side by side with what each
chapter changed, and writes the plots:
  throughput.png     tokens/s per chapter and rank count at the median step, the 10th-90th percentile as
                     error bars, the modelled step as a marker, with the speed-up against 01
  communication.png  per chapter at the largest rank count: time communication was in flight per step,
                     and the part of it the trainer waited for (exposed), next to the step time
  memory.png         per rank at the largest rank count: model state (parameters, gradients, optimizer
                     state), and below it the activations and the communication buffers (activations:
                     tensor parallelism keeps every row of the stream, sequence parallelism, 07+SP,
                     splits them)                                             (compare_plots.py)
  comm_volume.png    bytes each rank sends per step, at the largest rank count (compare_plots.py)
  loss.png           loss curves: one line where they coincide (the same global batch), and how far
                     apart they are at most                                   (compare_plots.py)
  (cp_balance.png, chapter 10's ring contiguous against zig-zag, is scripts/bench/cp_balance.sh's, which
   compare.sh runs after the table: scripts/bench/plot_cp_balance.py)
Usage: python3 scripts/compare/compare.py RESULTS_DIR
"""
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

# loss.png, memory.png and comm_volume.png are drawn in a module of their own, next to this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
from compare_plots import plot_comm_volume, plot_loss, plot_memory  # noqa: E402
import compare_timing as timing  # noqa: E402
from run_records import read_run  # noqa: E402

def load_runs(folder):
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        run = read_run(path, kinds=("run", "summary", "theory", "pipeline", "ring"))
        run["name"] = os.path.basename(path)[: -len(".jsonl")]
        if "summary" in run and "run" in run:
            runs.append(run)
    runs.sort(key=lambda r: (name(r), r["run"]["ranks"]))
    return runs


def name(run):
    """The chapter, and +SP for 07's run with sequence parallelism."""
    return run["run"]["chapter"] + ("+SP" if run["run"].get("sequence_parallel") else "")


def measured(run):
    return run["summary"].get("measured_steps", 0) > 0


def label(run):
    return "%s x%d" % (name(run), run["run"]["ranks"])


def short(run):
    """'03', or '07+SP'."""
    return run["run"]["chapter"][:2] + ("+SP" if run["run"].get("sequence_parallel") else "")


def mb(x):
    return x / 1e6


def model_state(run):
    """Parameters + gradients + optimizer state per rank, measured after the first measured step."""
    t = run.get("theory")
    return t["measured_model_state_bytes"] if t else float("nan")


def peak_over_steps(run, key):
    return max((s.get(key, 0) for s in run["steps"]), default=0)


def own_model(runs, run):
    """Whether the run trains another model than 01's (11's mixture of experts): then its own run on one
    rank is its baseline, not 01."""
    first = next((r for r in runs if r["run"]["chapter"].startswith("01")), None)
    return first is not None and first["run"].get("preset") != run["run"].get("preset")


def baseline(runs, run):
    """01 at the same rank count, the run every chapter is compared with; a chapter with a model of its
    own (own_model) is compared with its own run on one rank."""
    for r in runs:
        if own_model(runs, run):
            if r["run"]["chapter"] == run["run"]["chapter"] and r["run"]["ranks"] == 1 and measured(r):
                return r
        elif r["run"]["chapter"].startswith("01") and r["run"]["ranks"] == run["run"]["ranks"] and measured(r):
            return r
    return None


def speedup(runs, run):
    """Tokens/s against 01's at the same rank count, both at their median step."""
    base = baseline(runs, run)
    return timing.tokens_per_s(run) / timing.tokens_per_s(base) if base else None


def print_table(runs):
    """The step columns are over every round (compare_timing.py): the median, its spread, and the
    modelled step (docs/theory.md); the rest is counted, the same in every round."""
    header = "%-24s %8s %6s %8s %13s %8s %17s %5s %9s %11s %5s %10s %11s %7s" % (
        "run", "tok/s", "vs 01", "step ms", "spread", "modelled", "exposed/total ms", "coll", "MB sent",
        "model state", "", "transient", "activations", "loss")
    print(header)
    print("%-24s %8s %6s %8s %13s %8s %17s %5s %9s %11s %5s %10s %11s %7s" % (
        "", "median", "", "median", "p10-p90 ms", "ms", "comm per step", "/step", "/step", "per rank", "/Ψ",
        "peak/rank", "per rank", "final"))
    print("-" * len(header))
    for run in runs:
        s = run["summary"]
        if not measured(run):
            print("%-24s (no measured steps: run more than one step)" % label(run))
            continue
        x = speedup(runs, run)
        stats = run["timing"]["measured_stats"]
        spread = "%5.1f-%-6.1f" % (stats["low"], stats["high"])
        if stats["spread"] != "p10-p90":
            spread = spread.rstrip() + "*"
        modelled = timing.modelled_ms(run)
        print("%-24s %8.0f %6s %8.1f %13s %8s %8.1f / %6.1f %5.0f %9.2f %8.1f MB %4.1fΨ %7.1f MB %8.1f MB %7.3f" % (
            label(run), timing.tokens_per_s(run), "%5.2fx" % x if x else "   -  ", stats["median"], spread,
            "%.1f" % modelled if modelled == modelled else "-", timing.exposed_ms(run), timing.comm_ms(run),
            s["collectives_per_step"], mb(s["comm_bytes_per_step"]), mb(model_state(run)),
            model_state(run) / run["run"]["params"], mb(peak_over_steps(run, "mem_comm")),
            mb(peak_over_steps(run, "mem_activations")), s["final_loss"]))
    rounds = max(r["timing"]["rounds"] for r in runs)
    print("step ms: the median over every measured step of %d round%s (step 0 of each is warm-up); spread: the "
          "10th-90th percentile (* min-max: under 10 steps); modelled: the step the chapter's schedule predicts "
          "from the run's own host time and the link model (docs/theory.md, 11); /Ψ: model state in bytes per "
          "parameter of the model; exposed/total: the medians over the same steps; the rest is counted, the same in "
          "every round." % (rounds, "s" if rounds > 1 else ""))
    own = sorted({run["run"]["chapter"][:2] + " (--preset %s)" % run["run"].get("preset") for run in runs
                  if own_model(runs, run)})
    if own:
        print("%s: a model of its own, so its 'vs 01' is against its own run on one rank, and its losses "
              "against that run's." % ", ".join(own))


def describe(runs):
    """What each chapter changed, read from the numbers at the largest rank count."""
    n = max(r["run"]["ranks"] for r in runs)
    at = {short(r): r for r in runs if r["run"]["ranks"] == n and measured(r)}
    if n < 2 or "01" not in at:
        return
    print("\nWhat changed, at %d ranks (speed-up: tokens/s against 01's; comm: exposed of total ms per step):" % n)

    def s(c):
        return at[c]["summary"]

    def faster(c, than="01"):
        x = timing.tokens_per_s(at[c]) / timing.tokens_per_s(at[than])
        if abs(x - 1) < 0.02:
            return "as fast as %s (%.2fx)" % (than, x)
        return "%.2fx %s %s" % (x if x >= 1 else 1 / x, "faster than" if x >= 1 else "slower than", than)

    def comm(c):
        return "%.1f of %.1f ms" % (timing.exposed_ms(at[c]), timing.comm_ms(at[c]))

    def modelled_faster(c, than="01"):
        """The same comparison on the modelled column (docs/theory.md, 11)."""
        a, b = timing.modelled_ms(at[c]), timing.modelled_ms(at[than])
        if a != a or b != b:
            return ""
        x = b / a
        return " (modelled: %s)" % ("as fast" if abs(x - 1) < 0.02 else "%.2fx %s" % (
            x if x >= 1 else 1 / x, "faster" if x >= 1 else "slower"))

    lines = []
    if "01" in at:
        lines.append("01  one all-reduce after backward: all of it exposed (%s)." % comm("01"))
    if "02" in at:
        lines.append("02  an all-reduce per tensor from backward's hooks: exposed %s, %.0f collectives, %s%s."
                     % (comm("02"), s("02")["collectives_per_step"], faster("02"), modelled_faster("02")))
    if "03" in at and "02" in at:
        lines.append("03  buckets: %.0f collectives instead of %.0f, communication %.1f ms in all instead of %.1f, "
                     "exposed %.1f; %s, %s." % (s("03")["collectives_per_step"], s("02")["collectives_per_step"],
                                               timing.comm_ms(at["03"]), timing.comm_ms(at["02"]),
                                               timing.exposed_ms(at["03"]),
                                               faster("03") + modelled_faster("03"), faster("03", "02")))
    for c, what in (("04", "optimizer state sharded"), ("05", "gradients sharded too"),
                    ("06", "parameters sharded too")):
        if c not in at or "03" not in at:
            continue
        line = "%s  %s: model state %.1f MB per rank instead of %.1f (03); exposed %s; %s" % (
            c, what, mb(model_state(at[c])), mb(model_state(at["03"])), comm(c), faster(c, "03"))
        if c == "04":
            line += " (the all-gather after the optimizer waits, exposed)"
        if c == "06":
            line += "; %.2fx the bytes of 03, its gathers prefetched under compute" % (
                s("06")["comm_bytes_per_step"] / s("03")["comm_bytes_per_step"])
        lines.append(line + ".")
    if "07" in at and "03" in at:
        run = at["07"]["run"]
        link = ""
        if (run.get("tp_link_gbps"), run.get("tp_link_latency_us")) != (run["link_gbps"], run["link_latency_us"]):
            link = " (its group on a node's faster link: %g Gbit/s, %g us)" % (run["tp_link_gbps"],
                                                                             run["tp_link_latency_us"])
        line = ("07  tensor parallelism over %d ranks%s: model state %.1f MB per rank instead of %.1f (03), "
                "without gathering parameters; %.0f collectives move %.1f MB of activations inside the layers, "
                "on the critical path: exposed %s; %s" % (
                    run["tp"], link, mb(model_state(at["07"])), mb(model_state(at["03"])),
                    s("07")["collectives_per_step"], mb(s("07")["comm_bytes_per_step"]), comm("07"),
                    faster("07", "03")))
        lines.append(line + ".")
    if "07+SP" in at and "07" in at and "03" in at:
        act = {c: mb(peak_over_steps(at[c], "mem_activations")) for c in ("03", "07", "07+SP")}
        lines.append("07+SP  sequence parallelism: activations %.1f MB per rank instead of %.1f (07; 03: %.1f, "
                     "half the batch each); %.2fx 07's bytes (the inputs re-gathered for the weights' gradients), "
                     "exposed %s; %s." % (act["07+SP"], act["07"], act["03"],
                                           s("07+SP")["comm_bytes_per_step"] / s("07")["comm_bytes_per_step"],
                                           comm("07+SP"), faster("07+SP", "07")))
    if "08" in at and "03" in at and "pipeline" in at["08"]:
        pipe = at["08"]["pipeline"]
        lines.append("08  pipeline of %d stages (%s, %d micro-batches): model state %.1f MB and activations %.1f MB per "
                     "rank instead of %.1f and %.1f (03); %.2f MB sent per step instead of %.2f, point to point; but "
                     "each stage idles %.0f%% of the step (the bubble; theory %.0f%%, simulated %.0f%%): %s." % (
                         pipe["p"], pipe["schedule"], pipe["m"], mb(model_state(at["08"])),
                         mb(peak_over_steps(at["08"], "mem_activations")), mb(model_state(at["03"])),
                         mb(peak_over_steps(at["03"], "mem_activations")), mb(s("08")["comm_bytes_per_step"]),
                         mb(s("03")["comm_bytes_per_step"]), 100 * pipe["measured_bubble"],
                         100 * pipe["theory_bubble"], 100 * pipe["simulated_bubble"], faster("08", "03")))
    if "09" in at and "07" in at:
        lines.append("09  at 2 ranks is 07's TP 2 with --recompute selective (its own grid, TP 2 x PP 2, is in the "
                     "4-rank section below): "
                     "activations %.1f MB per rank instead of 07's %.1f, the attention's scores recomputed in "
                     "backward; %s." % (mb(peak_over_steps(at["09"], "mem_activations")),
                                       mb(peak_over_steps(at["07"], "mem_activations")), faster("09", "07")))
    if "10" in at and "03" in at:
        run, steps = at["10"]["run"], at["10"]["steps"][1:] or at["10"]["steps"]
        ring_mb = sum(x.get("cp_comm_bytes", 0) for x in steps) / len(steps) / 1e6
        ring_exposed = sum(x.get("cp_exposed_comm_ms", 0) for x in steps) / len(steps)
        lines.append("10  context parallelism, a ring of %d (%s): each rank holds T/%d positions of every sequence, and "
                     "no (B,NH,T,T) scores; activations %.1f MB per rank instead of %.1f (03); the ring sends %.2f MB "
                     "of keys, values and their gradients a step (%.1f ms of it exposed); %s: here the ring shares the "
                     "gradients' slow link and T is short, where CP is for long contexts on a node's links. Its "
                     "memory and balance on a long context: results/cp_balance.png." % (
                         run.get("cp", 1), at["10"].get("ring", {}).get("split", "zigzag"),
                         run.get("cp", 1), mb(peak_over_steps(at["10"], "mem_activations")),
                         mb(peak_over_steps(at["03"], "mem_activations")), ring_mb, ring_exposed, faster("10", "03")))
    one_11 = next((r for r in runs if r["run"]["chapter"].startswith("11") and r["run"]["ranks"] == 1 and measured(r)),
                  None)
    if "11" in at and one_11:
        lines.append("11  a mixture of experts (--preset %s) with its experts over %d ranks (EP %d): model state %.1f MB "
                     "per rank instead of %.1f on one rank (expert weights fall as 1/EP), %.2f MB sent per step by "
                     "all-to-all and all-reduce; %.2fx the tokens/s of its own run on one rank, whose experts need no "
                     "exchange (two all-to-alls a layer each way, over the slow link) (results/experts.png: each "
                     "expert's load)." % (
                         at["11"]["run"].get("preset"), n, n, mb(model_state(at["11"])), mb(model_state(one_11)),
                         mb(s("11")["comm_bytes_per_step"]),
                         timing.tokens_per_s(at["11"]) / timing.tokens_per_s(one_11)))
    for line in lines:
        print("  " + line)


def print_losses(runs):
    agree = timing.losses_agree(runs)
    if agree is None:
        return
    worst, where, count, ok = agree
    if ok:
        print("losses: all %d runs equal 01 x1's at every step (largest relative difference %.1e%s; the rule: 1e-5)"
              % (count, worst, ", " + where if where else ""))
    else:
        print("WARNING: losses differ from 01 x1's by %.1e (relative) at %s: more than the 1e-5 every chapter keeps"
              % (worst, where))


def print_model_reading(runs):
    """Where the median and the modelled step part by more than the spread, says so, and why."""
    lines = []
    for run in runs:
        if run["run"]["ranks"] < 2 or not measured(run):
            continue
        stats, modelled = run["timing"]["measured_stats"], timing.modelled_ms(run)
        if modelled != modelled or stats["low"] <= modelled <= stats["high"]:
            continue
        beyond = run["timing"]["beyond_link_ms"]
        if modelled < stats["low"]:
            why = ("slower than modelled: the model counts the link's hold only; the collectives were busy %.1f ms "
                   "a step beyond it (MPI's own copy and reduction after the hold, a peer descheduled by other "
                   "work), of which the trainer waited for some (exposed %.1f ms measured)" % (
                       beyond, timing.exposed_ms(run)))
        else:
            why = ("faster than modelled: the modelled step waits for every collective's last rank; measured steps "
                   "also vary with the load between rounds")
        if run["run"].get("pp", 1) > 1:
            why = ("08's model is its schedule simulated from its measured passes alone (the bubble, docs/theory.md "
                   "10): the optimizer, the embedding's all-reduce and the link's holds are left out")
        lines.append("%s: median %.1f ms (%s %.1f-%.1f), modelled %.1f: %s." % (
            label(run), stats["median"], stats["spread"], stats["low"], stats["high"], modelled, why))
    if lines:
        print("\nMeasured and modelled part by more than the spread:")
        for line in lines:
            print("  " + line)


def print_four_ranks(folder):
    """make compare's 4-rank section (compare.sh, results/four_ranks/): 09 on its own grid, TP 2 x PP 2,
    next to 01, 07 as TP 2 x DP 2 and 08 as PP 2 x DP 2 at 4 ranks, and 12 as TP 2 x CP 2, the same model
    and global batch.
    Apart from the table above, whose plots and 'what changed' stay at its own largest rank count."""
    runs = load_runs(folder) if os.path.isdir(folder) else []
    if not runs:
        return
    timing.attach_rounds(runs, folder)
    steps = max(r["run"]["steps"] for r in runs)
    print("\n09 on its own grid, at 4 ranks (one round of %d steps: a short look, noisier than the table above):"
          % steps)
    print_table(runs)
    agree = timing.losses_agree(runs, baseline_ranks=4)
    if agree:
        worst, where, count, ok = agree
        print("losses: %s %d runs %s 01 x4's at every step (largest relative difference %.1e%s; 01 x4 trains as 01 "
              "x1 does, the same global batch)" % ("all" if ok else "WARNING: of", count,
                                                    "equal" if ok else "some differ from", worst,
                                                    ", " + where if where else ""))
    at = {short(r): r for r in runs if measured(r)}
    if "09" not in at:
        return
    run9 = at["09"]
    grids = {"01": "DP 4", "07": "TP 2 x DP 2", "08": "PP 2 x DP 2", "09": "TP 2 x PP 2"}
    others = [c for c in ("07", "08", "01") if c in at]

    def each(value, fmt="%.1f"):
        return ", ".join("%s %s: %s" % (c, grids[c], fmt % value(at[c])) for c in others)

    line = ("09  TP 2 x PP 2: model state %.1f MB per rank (%s), each rank a quarter of the model, without "
            "gathering it; activations %.1f MB (%s)" % (
                mb(model_state(run9)), each(lambda r: mb(model_state(r))),
                mb(peak_over_steps(run9, "mem_activations")), each(lambda r: mb(peak_over_steps(r, "mem_activations")))))
    if "pipeline" in run9:
        pipe = run9["pipeline"]
        line += "; %s over %d micro-batches, each stage idle %.0f%% of the step (theory %.0f%%)" % (
            pipe["schedule"], pipe["m"], 100 * pipe["measured_bubble"], 100 * pipe["theory_bubble"])
    if "01" in at:
        x = timing.tokens_per_s(run9) / timing.tokens_per_s(at["01"])
        line += "; %.2fx 01 x4's tokens/s" % x
    print("  " + line + ".")
    if "12" in at:  # 12 composes 10's ring with 07's TP: each rank half the positions and half the heads
        run12 = at["12"]
        line = ("12  TP 2 x CP 2: model state %.1f MB per rank (07 TP 2 x DP 2: %.1f MB), activations %.1f MB "
                "(07: %.1f MB): the ring keeps T/2 positions of each sequence on each rank" % (
                    mb(model_state(run12)), mb(model_state(at["07"])) if "07" in at else float("nan"),
                    mb(peak_over_steps(run12, "mem_activations")),
                    mb(peak_over_steps(at["07"], "mem_activations")) if "07" in at else float("nan")))
        if "01" in at:
            line += "; %.2fx 01 x4's tokens/s" % (timing.tokens_per_s(run12) / timing.tokens_per_s(at["01"]))
        print("  " + line + ".")


def draw_throughput(ax, runs, subset):
    """The bars of `subset` (runs of one model) on `ax`, grouped by chapter, one bar per rank count."""
    chapters = sorted({name(r) for r in subset})
    rank_counts = sorted({r["run"]["ranks"] for r in subset})
    width = 0.8 / len(rank_counts)
    for i, n in enumerate(rank_counts):
        xs, ys, runs_n = [], [], []
        for j, c in enumerate(chapters):
            r = next((r for r in subset if name(r) == c and r["run"]["ranks"] == n and measured(r)), None)
            if r:
                xs.append(j + (i - (len(rank_counts) - 1) / 2) * width)
                ys.append(timing.tokens_per_s(r))
                runs_n.append(r)
        # Error bars: the spread of the step (a slower step is fewer tokens/s: the low end is the slow one).
        stats = [r["timing"]["measured_stats"] for r in runs_n]
        low = [y - timing.tokens_per_s(r, t["high"]) for y, r, t in zip(ys, runs_n, stats)]
        high = [timing.tokens_per_s(r, t["low"]) - y for y, r, t in zip(ys, runs_n, stats)]
        bars = ax.bar(xs, ys, width, yerr=[low, high], capsize=3, error_kw={"elinewidth": 1},
                      color="C%d" % i, label="%d rank%s" % (n, "s" if n > 1 else ""))
        modelled = {}
        for x, r in zip(xs, runs_n):
            if timing.modelled_ms(r) == timing.modelled_ms(r) and n > 1:
                modelled[x] = timing.tokens_per_s(r, timing.modelled_ms(r))
        if modelled:
            ax.plot(list(modelled), list(modelled.values()), "kD", markersize=5,
                    label="modelled" if i == len(rank_counts) - 1 else None)
        for bar, r, up in zip(bars, runs_n, high):
            x = speedup(runs, r)
            if x and n > 1:
                centre = bar.get_x() + bar.get_width() / 2
                # Above the error bar and the ◆, whichever is higher, so that neither hides the label.
                top = max(bar.get_height() + up, modelled.get(bar.get_x() + bar.get_width() / 2, 0))
                ax.annotate("%.2fx" % x, (centre, top), xytext=(0, 4), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8)
    ax.set_xticks(range(len(chapters)))
    ax.set_xticklabels(chapters, rotation=20, fontsize=8)
    ax.margins(y=0.15)


def throughput_panels(runs):
    """throughput.png's panels: the runs of 01's model, then (if any) those of a model of their own."""
    own = [r for r in runs if own_model(runs, r)]
    return [[r for r in runs if r not in own]] + ([own] if own else [])


def plot_throughput(runs, folder, busy=""):
    # A chapter with a model of its own (11's mixture of experts, several times 01's tokens/s on its
    # smaller step) gets a panel and a scale of its own: on one axis it would flatten every other bar.
    panels = throughput_panels(runs)
    shared, own = panels[0], panels[1] if len(panels) > 1 else []
    n_shared, n_own = len({name(r) for r in shared}), len({name(r) for r in own})
    fig, axes = plt.subplots(1, len(panels), figsize=(max(7, 1.3 * (n_shared + n_own)), 4.2), squeeze=False,
                             gridspec_kw={"width_ratios": [max(n_shared, 1)] + ([max(n_own, 1) + 0.6] if own else [])})
    for ax, subset in zip(axes[0], panels):
        draw_throughput(ax, runs, subset)
    axes[0][0].set_ylabel("tokens / s")
    axes[0][0].legend(fontsize=8)
    if own:
        axes[0][1].set_title("own model (--preset %s): its own scale,\nspeed-up against its own 1-rank run"
                             % own[0]["run"].get("preset"), fontsize=8)
    fig.suptitle("Throughput at the median step (bars: p10-p90; ◆ modelled)\nlabels: speed-up against 01 at the "
                 "same rank count%s" % busy, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "throughput.png"), dpi=120)
    plt.close(fig)


def at_largest_rank_count(runs):
    """The measured runs with the most ranks: memory and bytes per rank only compare at the same N."""
    n = max(r["run"]["ranks"] for r in runs)
    return [r for r in runs if r["run"]["ranks"] == n and measured(r)], n


def communication_bars(runs):
    """communication.png's total and exposed bars and step marks, each run's: the medians over every
    round's steps, the steps the table's columns are over."""
    return ([timing.comm_ms(r) for r in runs], [timing.exposed_ms(r) for r in runs],
            [timing.median_ms(r) for r in runs])


def plot_communication(runs, folder, busy=""):
    runs, n = at_largest_rank_count(runs)
    if n < 2 or not runs:
        return
    total, exposed, step = communication_bars(runs)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(runs)), 4.2))
    x = range(len(runs))
    ax.bar(x, total, 0.6, color="#B7D4EA", label="communication in flight (total)")
    ax.bar(x, exposed, 0.6, color="#D62728", label="exposed: the trainer waited")
    ax.plot(x, step, "k_", markersize=30, markeredgewidth=2, label="step time (median)")
    for i in x:
        ax.annotate("%.0f%%" % (100 * exposed[i] / total[i] if total[i] else 0), (i, exposed[i]), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([name(r) for r in runs], rotation=20, fontsize=8)
    ax.set_ylabel("ms per step")
    ax.set_title("Communication per step at %d ranks, medians over every round's steps: total, and the exposed "
                 "part (%% of total)%s" % (n, busy),
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.margins(y=0.1)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "communication.png"), dpi=120)
    plt.close(fig)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "results"
    runs = load_runs(folder)
    if not runs:
        sys.exit("no finished runs in %s (expected *.jsonl from make compare)" % folder)
    timing.attach_rounds(runs, folder)
    largest = max(r["run"]["ranks"] for r in runs)
    load = timing.read_load(folder)
    busy = timing.busy_note(load, largest)
    if busy:
        print("WARNING: %s. Timings are slower and noisier than on a quiet machine: read the medians with their "
              "spread, and the modelled column. Every collective also waits for its ranks to get a core, so the "
              "chapters with many (02's one per tensor, 06, 07) lose most.\n" % busy)
    print_table(runs)
    print_losses(runs)
    describe(runs)
    print_model_reading(runs)
    print_four_ranks(os.path.join(folder, "four_ranks"))
    plot_throughput(runs, folder, timing.busy_title(load, largest))
    plot_communication(runs, folder, timing.busy_title(load, largest))
    plot_memory(runs, folder)
    plot_comm_volume(runs, folder)
    plot_loss(runs, folder)
    plots = [p for p in ("throughput.png", "communication.png", "memory.png", "comm_volume.png", "loss.png")
             if os.path.exists(os.path.join(folder, p))]
    print("plots: %s" % ", ".join(os.path.join(folder, p) for p in plots))


if __name__ == "__main__":
    main()
