#!/usr/bin/env python3
"""plot_timeline.py: one training step of each chapter, drawn one above the other, from the Chrome-trace
files that `--trace` writes (common/trace.cpp). Shows at a glance where communication runs: after backward
in 01, under backward in 02 and 03.

Each panel is one step of one rank, with a lane per track of the trace:
  compute          forward / backward spans per layer, then the optimizer
  tensor-parallel  the tensor-parallel group's collectives (07; the lane appears when a trace has them)
  communication    the other collectives (data parallelism, ZeRO), link time included
  waiting          the time the training thread sat blocked in wait(): the exposed communication
All panels share one time axis, in ms from the start of their step; a dotted line marks the end of backward.

Usage:
  python3 scripts/plot_timeline.py --out results/timeline.png results/01_vanilla_dp_n2.trace.json \\
      results/02_overlap_dp_n2.trace.json results/03_bucket_dp_n2.trace.json
Options: --step N (default 5 when every file has it, else each file's middle step), --rank R (default 0).
Run the chapters with an emulated link (--link-gbps 0.5 --link-latency-us 50) so communication is visible.
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COMPUTE, COMM, WAIT, TENSOR = 0, 1, 2, 3  # the trace's tids (Track in common/trace.h)
LANES = [(COMPUTE, "compute"), (TENSOR, "tensor-parallel"), (COMM, "communication"), (WAIT, "waiting")]
COLLECTIVE_TRACKS = (COMM, TENSOR)

PHASE_COLORS = {"forward": "#4C78A8", "backward": "#F58518", "optimizer": "#54A24B"}
COLLECTIVE_COLORS = {  # collectives by kind, so that later chapters' reduce-scatters stand out
    "all_reduce": "#B279A2",
    "reduce_scatter": "#E7BA52",
    "all_gather": "#72B7B2",
    "broadcast": "#BCBD22",
    "send": "#9D755D",
    "recv": "#9D755D",
    "barrier": "#BAB0AC",
    "all_reduce_scalar": "#BAB0AC",
    "broadcast_bytes": "#BAB0AC",
}
OTHER_COLOR = "#BAB0AC"
WAIT_COLOR = "#D62728"

DPI = 130
LABEL_PT = 7.5
CHAR_PX = 0.6 * LABEL_PT * DPI / 72  # average width of a character of the box labels, in pixels


def load_spans(path, rank):
    """The 'X' events of one rank as dicts with start and end in ms, plus name, tid and detail."""
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("cannot read trace %s: %s (written by a chapter's --trace PATH?)" % (path, e))
    spans = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != rank:
            continue
        start = e["ts"] / 1e3
        spans.append({"name": e["name"], "tid": e.get("tid", COMPUTE), "start": start,
                      "end": start + e["dur"] / 1e3, "detail": e.get("args", {}).get("detail", "")})
    if not spans:
        sys.exit("%s holds no spans of rank %d" % (path, rank))
    return spans


def step_spans(spans):
    """{step number: its 'step N' span} from the compute track."""
    steps = {}
    for s in spans:
        m = re.fullmatch(r"step (\d+)", s["name"])
        if m and s["tid"] == COMPUTE:
            steps[int(m.group(1))] = s
    return steps


def chapter_name(path):
    """results/02_overlap_dp_n2.trace.json -> 02_overlap_dp"""
    name = os.path.basename(path)
    name = name[: -len(".trace.json")] if name.endswith(".trace.json") else os.path.splitext(name)[0]
    return re.sub(r"_n\d+$", "", name)


def collective_kind(name):
    """reduce_scatter_v and all_gather_v (ZeRO's uneven splits) are drawn as their kind."""
    return name[:-2] if name.endswith("_v") else name


def color_of(span):
    if span["tid"] == WAIT:
        return WAIT_COLOR
    if span["tid"] in COLLECTIVE_TRACKS:
        return COLLECTIVE_COLORS.get(collective_kind(span["name"]), OTHER_COLOR)
    return PHASE_COLORS.get(span["name"].split(" ")[0], OTHER_COLOR)


def human_bytes(detail):
    """'65536 B' -> '64 KB' (binary units: tensor sizes are powers of two more often than not)."""
    try:
        n = float(detail.split()[0])
    except (IndexError, ValueError):
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return ("%.0f %s" if n >= 10 or unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024


def labels_for(span):
    """Candidate labels, longest first; the plot uses the first that fits in the box."""
    name = span["name"]
    if span["tid"] in COLLECTIVE_TRACKS:
        size = human_bytes(span["detail"])
        return [name + " " + size, size] if size else [name]
    if span["tid"] == WAIT:
        return ["wait"]
    short = name.replace("forward ", "F ").replace("backward ", "B ").replace("optimizer", "opt")
    return [name, short]


def draw_panel(ax, spans, step, title, px_per_ms, lanes):
    t0, t1 = step["start"], step["end"]
    lane_y = {tid: len(lanes) - 1 - i for i, (tid, _) in enumerate(lanes)}  # compute on top
    height = 0.7
    for s in spans:
        if s["name"] == step["name"] or s["end"] <= t0 or s["start"] >= t1:
            continue
        start, end = max(s["start"], t0) - t0, min(s["end"], t1) - t0  # clipped to the step
        y = lane_y.get(s["tid"])
        if y is None:
            continue
        ax.barh(y, end - start, left=start, height=height, color=color_of(s), edgecolor="white", linewidth=0.6)
        width_px = (end - start) * px_per_ms
        for text in labels_for(s):
            if width_px > CHAR_PX * len(text) + 6:
                ax.text(start + (end - start) / 2, y, text, ha="center", va="center", fontsize=LABEL_PT,
                        color="white", clip_on=True)
                break

    inside = [s for s in spans if t0 <= s["start"] < t1]
    backward_ends = [s["end"] for s in inside if s["tid"] == COMPUTE and s["name"].startswith("backward")]
    if backward_ends:
        x = max(backward_ends) - t0
        ax.axvline(x, color="black", linestyle=":", linewidth=1)
        ax.text(x, len(lanes) - 0.5, " backward done", fontsize=7.5, va="bottom", ha="left")

    def busy(tid):
        return sum(min(s["end"], t1) - max(s["start"], t0) for s in spans
                   if s["tid"] == tid and s["end"] > t0 and s["start"] < t1)

    tensor = "tensor-parallel %.1f ms, " % busy(TENSOR) if any(s["tid"] == TENSOR for s in spans) else ""
    ax.set_title("%s   step %s: %.1f ms   |   %scommunication %.1f ms, waited for %.1f ms"
                 % (title, step["name"].split()[1], t1 - t0, tensor, busy(COMM), busy(WAIT)),
                 loc="left", fontsize=10)
    ax.set_yticks([lane_y[tid] for tid, _ in lanes])
    ax.set_yticklabels([name for _, name in lanes])
    ax.set_ylim(-0.6, len(lanes) - 0.1)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def main():
    parser = argparse.ArgumentParser(description="Draw one training step per chapter from --trace files.")
    parser.add_argument("traces", nargs="+", help="Chrome-trace files, one per chapter, drawn in this order")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--step", type=int, help="step number to draw (default 5, else the middle step)")
    parser.add_argument("--rank", type=int, default=0, help="rank to draw (default 0)")
    args = parser.parse_args()

    panels = []
    for path in args.traces:
        spans = load_spans(path, args.rank)
        steps = step_spans(spans)
        if not steps:
            sys.exit("%s has no 'step N' spans on the compute track" % path)
        if args.step is not None:
            if args.step not in steps:
                sys.exit("%s has no step %d (it has steps %d..%d)" % (path, args.step, min(steps), max(steps)))
            number = args.step
        else:
            number = 5 if 5 in steps else sorted(steps)[len(steps) // 2]
        panels.append((chapter_name(path), spans, steps[number]))

    # The tensor-parallel lane only in the panels that have tensor-parallel collectives (07's).
    def lanes_of(spans):
        return [lane for lane in LANES if lane[0] != TENSOR or any(s["tid"] == TENSOR for s in spans)]
    lanes = max((lanes_of(spans) for _, spans, _ in panels), key=len)
    longest = max(step["end"] - step["start"] for _, _, step in panels)
    width_in, left, right = 13.0, 0.09, 0.98
    px_per_ms = width_in * DPI * (right - left) / longest  # decides which boxes get a label
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(width_in, 0.5 + (0.45 * len(lanes) + 0.55) * len(panels)),
                             squeeze=False)
    for ax, (title, spans, step) in zip(axes[:, 0], panels):
        draw_panel(ax, spans, step, "%s (rank %d)" % (title, args.rank), px_per_ms, lanes_of(spans))
    axes[-1, 0].set_xlim(0, longest)
    axes[-1, 0].set_xlabel("ms since the start of the step")

    used = set()
    for _, spans, _ in panels:
        used.update(collective_kind(s["name"]) for s in spans if s["tid"] in COLLECTIVE_TRACKS)
    legend = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items()]
    legend += [Patch(color=c, label=n) for n, c in COLLECTIVE_COLORS.items()
               if n in used and n not in ("recv", "all_reduce_scalar", "broadcast_bytes")]
    legend += [Patch(color=OTHER_COLOR, label="scalars, other"), Patch(color=WAIT_COLOR, label="waiting")]
    fig.legend(handles=legend, loc="upper center", ncol=len(legend), frameon=False, fontsize=9)
    fig.subplots_adjust(left=left, right=right, top=1 - 0.45 / fig.get_figheight(), bottom=0.5 / fig.get_figheight(),
                        hspace=0.55)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=DPI)
    plt.close(fig)
    print("timeline: %s" % args.out)


if __name__ == "__main__":
    main()
