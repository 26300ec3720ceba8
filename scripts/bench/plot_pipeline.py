#!/usr/bin/env python3
"""plot_pipeline.py: the classic pipeline diagram of chapter 08, measured and ideal. For each run of
08_pipeline/train, one row of two panels with a lane per stage (stage 0 on top) and time across:

  measured  one step as it ran, from the --trace file: every stage's F, B and W spans (the executor's
            "F3.c1" ...) inside its own "step N" span, placed on the common clock with x = 0 at stage 0's
            start of the step; the optimizer in grey (after the pipeline's part of the step); blank is
            waiting. Default: the middle measured step (step 0 is warm-up and not measured).
            The ranks' clocks agree only to within the barrier that starts them: a rank whose clock
            started late (on an oversubscribed core, by several ms) is moved back in line by causality
            (align_clocks; --raw-clocks draws the spans as recorded); moves of 0.5 ms or more are named
            in the panel's title.
  ideal     the same step as the chapter simulates it with each stage's measured mean pass times and no
            noise or p2p time: the "simulated_action" records of the --json file. Where RUN.ideal.jsonl
            exists (make schedules writes one per schedule with build/pipeline_ideal), the ideal is that
            file's instead: every schedule simulated with the same pass times, measured once (by
            zb-h1's run, the one that times B and W apart), so that the ideal rows differ by their
            schedule only, not by the noise of their own runs.

Boxes: F (forward) blue, B (backward; under zb-h1 only the inputs' gradients) orange, W (zb-h1: the
weights' gradients) green; under interleaved, chunk 1 is a lighter shade of the same colour. Each box
is labelled with its micro-batch where it is wide enough. A row's title: schedule, p, m, v, and the
bubble (idle / step time, mean over stages) measured, simulated and by the theory, from the
"pipeline" record.

Every panel, measured and ideal, of every run, shares one time axis: a pass is as wide in the ideal
panel as in the measured one, so what the measured step adds (noise, waits longer than the schedule's,
the optimizer) shows as extra length, and the schedules compare by length down the figure. Several runs:
a row each, measured left and ideal right; one run: the measured step above the ideal one.

Usage:
  python3 scripts/bench/plot_pipeline.py --out results/schedules.png results/schedules/afab results/schedules/1f1b
Each RUN is the path prefix of one 08 run: RUN.trace.json (its --trace) and RUN.jsonl (its --json),
as make compare and make schedules name them (results/08_pipeline_n2 -> results/08_pipeline_n2.trace.json,
results/08_pipeline_n2.jsonl); a path ending in .jsonl or .trace.json is taken as that prefix too.
Options: --step N (default: each run's middle measured step); --raw-clocks; --cores C (the cores the runs ran on,
default this machine's): with fewer cores than ranks (on the CPU), the ranks took turns on a core and
the measured panels say "oversubscribed".
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

# run_records.py, the reader of a run's records, lives with make compare's scripts in scripts/compare/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compare"))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
from run_records import COMPUTE, read_run, step_spans  # noqa: E402

KIND_COLORS = {"F": "#4C78A8", "B": "#F58518", "W": "#54A24B"}
KIND_NAMES = {"F": "F forward", "B": "B backward (zb-h1: the inputs' gradients)", "W": "W weights' gradients (zb-h1)"}
OPTIMIZER_COLOR = "#BAB0AC"
ACTION = re.compile(r"([FBW])(\d+)\.c(\d+)")  # "F3.c1": forward of micro-batch 3 through chunk 1

DPI = 110
LABEL_PT = 8
CHAR_PX = 0.6 * LABEL_PT * DPI / 72  # average width of a character of the box labels, in pixels


def shade(kind, chunk, chunks):
    """The kind's colour for chunk 0, lighter for each further chunk (mixed with white)."""
    base = to_rgb(KIND_COLORS[kind])
    if chunks < 2 or chunk == 0:
        return base
    mix = 0.55 * chunk / (chunks - 1)
    return tuple(c + (1 - c) * mix for c in base)


def text_color(chunk):
    return "white" if chunk == 0 else "black"  # black on the lighter shades


def prefix_of(arg):
    for suffix in (".trace.json", ".jsonl"):
        if arg.endswith(suffix):
            return arg[: -len(suffix)]
    return arg


def pipeline_records(path):
    """A JSON-lines file's "run" and "pipeline" records and its "simulated_action" records (under
    "simulated"): what 08's runs and build/pipeline_ideal both write."""
    records = read_run(path, kinds=("run", "pipeline"), lists=("simulated_action",))
    records["simulated"] = records.pop("simulated_action")
    return records


def load_records(path):
    """The run and pipeline records and the simulated actions of one --json file."""
    if not os.path.exists(path):
        sys.exit("%s: no such file (run 08_pipeline/train with --json %s)" % (path, path))
    run = pipeline_records(path)
    if "run" not in run or run["run"].get("chapter") != "08_pipeline":
        sys.exit("%s: not a run of 08_pipeline/train (no run record of chapter 08_pipeline)" % path)
    if "pipeline" not in run or not run["simulated"]:
        sys.exit("%s: no pipeline or simulated_action records: 08 writes them at the end of a run with at least "
                 "one measured step (--steps 2 or more); did it finish? (see its log)" % path)
    return run


def load_trace(path):
    """{pid: [span]} of the compute track: 'X' events as dicts with name, start and end in ms."""
    if not os.path.exists(path):
        sys.exit("%s: no such file: the measured panel needs the run's trace (run 08_pipeline/train with "
                 "--trace %s)" % (path, path))
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("cannot read trace %s: %s (written by 08_pipeline/train --trace PATH?)" % (path, e))
    spans = {}
    for e in events:
        if e.get("ph") != "X" or e.get("tid", COMPUTE) != COMPUTE:
            continue
        start = e["ts"] / 1e3
        spans.setdefault(e.get("pid", 0), []).append({"name": e["name"], "start": start, "end": start + e["dur"] / 1e3})
    return spans


def measured_boxes(trace_path, trace, run, step, fix_clocks=True):
    """Per stage, the F/B/W boxes and optimizer spans of step `step`, in ms from stage 0's start of it;
    the step's length (to the last stage's end of it); and each stage's clock shift (see align_clocks).
    Stage r's spans are taken from world rank r x dp (the first pipeline, PP outermost), inside that
    rank's own 'step N' span."""
    p = run["pipeline"]["p"]
    dp = max(run["run"]["ranks"] // p, 1)
    windows, boxes = [], []
    for stage in range(p):
        pid = stage * dp
        if pid not in trace:
            sys.exit("%s: no spans of rank %d (stage %d): was the trace written by this run?"
                     % (trace_path, pid, stage))
        steps = step_spans(trace[pid])
        if step not in steps:
            sys.exit("%s: rank %d has no 'step %d' span (it has steps %s)" % (trace_path, pid, step,
                                                                             ", ".join(map(str, sorted(steps)))))
        windows.append(steps[step])
    t0 = windows[0]["start"]
    for stage, window in enumerate(windows):
        row = []
        for s in trace[stage * dp]:
            if s["end"] <= window["start"] or s["start"] >= window["end"]:
                continue
            start, end = max(s["start"], window["start"]) - t0, min(s["end"], window["end"]) - t0
            m = ACTION.fullmatch(s["name"])
            if m:
                row.append({"kind": m.group(1), "micro": int(m.group(2)), "chunk": int(m.group(3)),
                            "start": start, "end": end})
            elif s["name"] == "optimizer":
                row.append({"kind": "optimizer", "start": start, "end": end})
        if not any(b["kind"] in KIND_COLORS for b in row):
            sys.exit("%s: rank %d's step %d holds no F/B/W spans (named like F3.c0): not a trace of 08_pipeline?"
                     % (trace_path, stage * dp, step))
        boxes.append(row)
    shifts = align_clocks(boxes) if fix_clocks else [0.0] * p
    for row, shift in zip(boxes, shifts):
        for b in row:
            b["start"] += shift
            b["end"] += shift
    length = max(w["end"] - t0 + shift for w, shift in zip(windows, shifts))
    return boxes, length, shifts


def align_clocks(boxes):
    """The shift in ms to add to each stage's times so that the diagram is causal. The ranks' trace
    clocks start together at a barrier (sync_clock_epoch in common/comm/trace.cpp), but a rank that the OS
    schedules late after it (oversubscribed cores) starts its clock late, and its spans then seem
    early: a stage would begin a forward before the stage in front of it finished that micro-batch's.
    Between stages r-1 and r, forward of micro-batch i through chunk c must start on r after it ended
    on r-1 (its activation goes forward), and the backward on r-1 after it ended on r (the gradient
    comes back): a window [lo, hi] for r's shift against r-1's. The shift is the smallest move into
    that window: 0 where the clocks already agree, as they do within a barrier's skew on free cores.
    (Interleaved's wrap from the last stage to stage 0's next chunk is not used.)"""
    shifts = [0.0]
    for r in range(1, len(boxes)):
        def ends(row, kind):
            return {(b["micro"], b["chunk"]): b for b in row if b["kind"] == kind}

        before, mine = boxes[r - 1], boxes[r]
        prev_f, my_f = ends(before, "F"), ends(mine, "F")
        prev_b, my_b = ends(before, "B"), ends(mine, "B")
        lo = max((prev_f[k]["end"] + shifts[-1] - my_f[k]["start"] for k in prev_f if k in my_f), default=0.0)
        hi = min((prev_b[k]["start"] + shifts[-1] - my_b[k]["end"] for k in prev_b if k in my_b), default=0.0)
        if lo <= 0 <= hi:
            shift = 0.0
        elif lo > 0:
            shift = lo  # this stage's clock started late: move its spans later
        else:
            shift = hi  # started early: move them earlier
        shifts.append(shift)
    return shifts


def load_ideal(prefix, run):
    """RUN.ideal.jsonl's pipeline record and simulated actions (build/pipeline_ideal), or None."""
    path = prefix + ".ideal.jsonl"
    if not os.path.exists(path):
        return None
    ideal = pipeline_records(path)
    mine, its = run["pipeline"], ideal.get("pipeline")
    if not its or not ideal["simulated"]:
        sys.exit("%s: no pipeline or simulated_action records (written by build/pipeline_ideal?)" % path)
    if any(its[k] != mine[k] for k in ("schedule", "p", "m", "v")):
        sys.exit("%s: simulates %s p %d m %d v %d, but its run is %s p %d m %d v %d" % (
            path, its["schedule"], its["p"], its["m"], its["v"], mine["schedule"], mine["p"], mine["m"], mine["v"]))
    return ideal


def ideal_boxes(run):
    p = run["pipeline"]["p"]
    boxes = [[] for _ in range(p)]
    for a in run["simulated"]:
        boxes[a["stage"]].append({"kind": a["op"], "micro": a["micro"], "chunk": a["chunk"], "start": a["start_ms"],
                                  "end": a["end_ms"]})
    return boxes


def draw_boxes(ax, boxes, chunks, px_per_ms):
    p = len(boxes)
    for stage, row in enumerate(boxes):
        y = stage  # the axis is inverted: stage 0 on top
        for b in row:
            width = b["end"] - b["start"]
            if b["kind"] == "optimizer":
                ax.barh(y, width, left=b["start"], height=0.5, color=OPTIMIZER_COLOR, edgecolor="white", linewidth=0.5)
                if width * px_per_ms > CHAR_PX * 3 + 4:
                    ax.text(b["start"] + width / 2, y, "opt", ha="center", va="center", fontsize=LABEL_PT,
                            color="black", clip_on=True)
                continue
            ax.barh(y, width, left=b["start"], height=0.8, color=shade(b["kind"], b["chunk"], chunks),
                    edgecolor="white", linewidth=0.6)
            label = str(b["micro"])
            if width * px_per_ms > CHAR_PX * len(label) + 3:
                ax.text(b["start"] + width / 2, y, label, ha="center", va="center", fontsize=LABEL_PT,
                        color=text_color(b["chunk"]), clip_on=True)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p))
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def row_title(run, ideal):
    """Schedule and shape, and the bubble measured, in the ideal step, and by the theory. The ideal's
    bubble and the theory's come from the ideal panel's pass times (the common ones where given)."""
    pl = run["pipeline"]
    model = ideal["pipeline"] if ideal else pl
    return ("%s   p %d, m %d, v %d   |   bubble: measured %.1f%%, ideal %.1f%%, theory %.1f%% = %s"
            % (pl["schedule"], pl["p"], pl["m"], pl["v"], 100 * pl["measured_bubble"], 100 * model["simulated_bubble"],
               100 * model["theory_bubble"], model["theory_formula"]))


def default_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main():
    parser = argparse.ArgumentParser(description="Draw chapter 08's pipeline diagram, measured and ideal.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="path prefix of an 08 run: RUN.trace.json and RUN.jsonl; drawn top to bottom")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--step", type=int, help="step to draw from the traces (default: the middle measured step)")
    parser.add_argument("--raw-clocks", action="store_true",
                        help="draw the ranks' spans as recorded, without moving a late-started clock")
    parser.add_argument("--cores", type=int, default=default_cores(),
                        help="cores the runs ran on (default: this machine's), to tell oversubscribed runs")
    args = parser.parse_args()

    panels = []
    for arg in args.runs:
        prefix = prefix_of(arg)
        run = load_records(prefix + ".jsonl")
        trace_path = prefix + ".trace.json"
        trace = load_trace(trace_path)
        first = trace.get(0, [])
        steps = sorted(step_spans(first))
        if not steps:
            sys.exit("%s: no 'step N' spans of rank 0: not a trace of a training run?" % trace_path)
        if args.step is not None:
            step = args.step
        else:
            measured = [s for s in steps if s >= 1] or steps  # step 0 is warm-up
            step = measured[len(measured) // 2]
        measured_rows, measured_ms, shifts = measured_boxes(trace_path, trace, run, step, not args.raw_clocks)
        ideal = load_ideal(prefix, run)
        ideal_rows = ideal_boxes(ideal or run)
        ranks = run["run"]["ranks"]
        over = run["run"].get("device", "cpu") == "cpu" and ranks > args.cores
        notes = ["oversubscribed: %d ranks on %d cores" % (ranks, args.cores)] if over else []
        moved = ", ".join("%d %+.1f" % (r, x) for r, x in enumerate(shifts) if abs(x) >= 0.5)
        if moved:
            notes.append("clocks moved: stage " + moved + " ms")
        ideal_ms = (ideal or run)["pipeline"]["simulated_step_ms"]
        panels.append({"name": prefix, "run": run, "step": step, "measured": measured_rows, "measured_ms": measured_ms,
                       "ideal": ideal_rows, "ideal_ms": ideal_ms, "ideal_of": ideal, "notes": "; ".join(notes),
                       "oversubscribed": over})

    # Sized to be read at a README's width (about 900 pixels): 12 inches at DPI, lanes of half an inch
    # where there are few stages. Several runs: measured | ideal side by side, a row per run; one run:
    # measured above ideal, each the figure's whole width.
    longest = max(max(p["measured_ms"], p["ideal_ms"]) for p in panels)
    stacked = len(panels) == 1
    width_in = 12.0
    left, right, gap = (0.11 if stacked else 0.09), 0.99, 0.02
    panel_px = width_in * DPI * ((right - left) if stacked else (right - left - gap) / 2)
    px_per_ms = panel_px / longest  # decides which boxes get a label
    lane_in = max(0.25, min(0.45, 1.6 / max(p["run"]["pipeline"]["p"] for p in panels)))
    title_in, axis_in = 0.7, 0.5
    heights = []
    for p in panels:
        lanes = lane_in * p["run"]["pipeline"]["p"]
        heights.append(title_in + 2 * (lanes + axis_in + 0.3) if stacked else title_in + lanes + axis_in)
    legend_in = 0.75
    fig = plt.figure(figsize=(width_in, sum(heights) + legend_in))
    rows = fig.subfigures(len(panels) + 1, 1, height_ratios=[legend_in] + heights, squeeze=False)[:, 0]
    chunks_any = max(p["run"]["pipeline"]["v"] for p in panels)
    for sub, panel, height in zip(rows[1:], panels, heights):
        run, pl = panel["run"], panel["run"]["pipeline"]
        sub.suptitle(row_title(run, panel["ideal_of"]), x=0.01, ha="left", fontsize=10.5, fontweight="bold")
        if stacked:
            measured_ax, ideal_ax = sub.subplots(2, 1, sharex=True)
            sub.subplots_adjust(left=left, right=right, hspace=(0.3 + axis_in) / (height - title_in - axis_in) * 2,
                                top=1 - title_in / height - 0.25 / height, bottom=axis_in / height)
        else:
            measured_ax, ideal_ax = sub.subplots(1, 2, sharey=True)
            sub.subplots_adjust(left=left, right=right, wspace=gap / ((right - left) / 2),
                                top=1 - (title_in + 0.05) / height, bottom=axis_in / height)
        draw_boxes(measured_ax, panel["measured"], pl["v"], px_per_ms)
        draw_boxes(ideal_ax, panel["ideal"], pl["v"], px_per_ms)
        dp = max(run["run"]["ranks"] // pl["p"], 1)
        stage_names = ["stage %d" % r if dp == 1 else "stage %d (rank %d)" % (r, r * dp) for r in range(pl["p"])]
        for ax in (measured_ax, ideal_ax) if stacked else (measured_ax,):
            ax.set_yticklabels(stage_names, fontsize=9)
        notes = "   (%s)" % panel["notes"] if panel["notes"] else ""
        color = "#B22222" if panel["oversubscribed"] else "black"
        measured_ax.set_title("measured: step %d, %.1f ms" % (panel["step"], panel["measured_ms"]), loc="left",
                              fontsize=9.5, color=color, pad=15 if notes else 6)
        if notes:  # a line of its own, smaller where it is long, not into the ideal's title
            limit = 150 if stacked else 90  # characters that fit across the panel at 8 points
            measured_ax.text(0, 1.02, panel["notes"], transform=measured_ax.transAxes, ha="left", va="bottom",
                             fontsize=min(8, 8 * limit / len(panel["notes"])), color=color)
        ideal = panel["ideal_of"]
        source = ("%s's pass times, the same in every row" % ideal["pipeline"]["measured_by"] if ideal
                  else "this run's mean pass times")
        ideal_ax.set_title("ideal: simulated with %s: %.1f ms" % (source, panel["ideal_ms"]), loc="left", fontsize=9.5)
        for ax in (measured_ax, ideal_ax):
            ax.set_xlim(0, longest)
            ax.tick_params(axis="x", labelsize=9)
        ideal_ax.set_xlabel("ms since the start of the step", fontsize=9)
        if not stacked:
            measured_ax.set_xlabel("ms since the start of the step", fontsize=9)
        model = (ideal or run)["pipeline"]
        print("%s: %s, p %d, m %d, v %d: step %d measured %.1f ms, ideal %.1f ms (%s); bubble measured %.1f%%, "
              "ideal %.1f%%, theory %.1f%%%s" % (panel["name"], pl["schedule"], pl["p"], pl["m"], pl["v"],
                                               panel["step"], panel["measured_ms"], panel["ideal_ms"], source,
                                               100 * pl["measured_bubble"], 100 * model["simulated_bubble"],
                                               100 * model["theory_bubble"], notes))

    used = {a["op"] for p in panels for a in p["run"]["simulated"]}
    legend = [Patch(color=c, label=KIND_NAMES[k] if "W" in used else KIND_NAMES[k].split(" (")[0])
              for k, c in KIND_COLORS.items() if k in used]
    if chunks_any > 1:
        legend += [Patch(color=shade(k, 1, 2), label="%s chunk 1" % k) for k in ("F", "B")]
    legend += [Patch(color=OPTIMIZER_COLOR, label="optimizer (measured)")]
    rows[0].legend(handles=legend, loc="center", ncol=min(len(legend), 4), frameon=False, fontsize=9,
                   title="box label: micro-batch;  blank: idle (the bubble)", title_fontsize=9)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=DPI)
    plt.close(fig)
    print("pipeline diagram: %s" % args.out)


if __name__ == "__main__":
    main()
