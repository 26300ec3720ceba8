#!/usr/bin/env python3
"""plot_timeline.py: one training step of each chapter, drawn one above the other, from the Chrome-trace
files that `--trace` writes (common/comm/trace.cpp). Shows at a glance where communication runs: after backward
in 01, under backward in 02 and 03.

Each panel is one step of one rank, with a lane per track of the trace:
  compute          forward / backward spans per layer, then the optimizer; in 08, the pipeline's passes
                   (F, B and W of one micro-batch, "F3.c0"), coloured as forward, backward and the
                   weights' gradients (the layers inside a pass are the thin strip along its foot)
  tensor-parallel  the tensor-parallel group's collectives (07; the lane appears when a trace has them)
  communication    the other collectives (data parallelism, ZeRO), link time included
  waiting          the time the training thread sat blocked in wait(): the exposed communication
All panels share one time axis, in ms from the start of their step; a dotted line marks the end of backward.

A panel's header counts communication as make compare's table does, from the run's --json records of the
drawn step (the trace file's name with .jsonl for .trace.json): "communication" is the time some collective
was in flight, "exposed" the part the training thread waited for; "run's mean" gives both averaged over the
measured steps, the table's figures. A pipeline's sends and receives (08) are
left out of both, as in the table, and named apart: its receives are posted at the start of the step and
stay in flight until their data comes, and its waits for them are the bubble, not communication that
could have been hidden. Without the records (or for a rank other than 0, which writes them), the header
sums the trace's spans, pipeline spans left out likewise, and says so.

Usage:
  python3 scripts/compare/plot_timeline.py --out results/timeline.png results/01_vanilla_dp_n2.trace.json \\
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
from run_records import COMM, COMPUTE, TENSOR, WAIT, step_spans  # noqa: E402

LANES = [(COMPUTE, "compute"), (TENSOR, "tensor-parallel"), (COMM, "communication"), (WAIT, "waiting")]
COLLECTIVE_TRACKS = (COMM, TENSOR)

PHASE_COLORS = {"forward": "#4C78A8", "backward": "#F58518", "optimizer": "#54A24B"}
WEIGHT_COLOR = "#B5540B"  # zb-h1's W passes (the weights' gradients): a darker backward
PASS = re.compile(r"([FBW])(\d+)\.c(\d+)")  # 08's passes: "F3.c1", forward of micro-batch 3 through chunk 1
PASS_PHASES = {"F": "forward", "B": "backward"}
COLLECTIVE_COLORS = {  # collectives by kind, so that later chapters' reduce-scatters stand out
    "all_reduce": "#B279A2",
    "reduce_scatter": "#E7BA52",
    "all_gather": "#72B7B2",
    "broadcast": "#BCBD22",
    "send": "#9D755D",
    "recv": "#9D755D",
    "all_to_all": "#FF9DA6",  # 11's experts: tokens out to their experts and back
    "barrier": "#BAB0AC",
    "all_reduce_scalar": "#BAB0AC",
    "broadcast_bytes": "#BAB0AC",
}
RING_COLOR = "#393B79"  # 10's ring passes keys and values to the next rank: not 08's pipeline
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
        if is_ring(span):
            return RING_COLOR
        return COLLECTIVE_COLORS.get(collective_kind(span["name"]), OTHER_COLOR)
    m = PASS.fullmatch(span["name"])
    if m:
        return WEIGHT_COLOR if m.group(1) == "W" else PHASE_COLORS[PASS_PHASES[m.group(1)]]
    return PHASE_COLORS.get(span["name"].split(" ")[0], OTHER_COLOR)


def is_ring(span):
    """A context-parallel ring's send or receive (10): the trace's detail names the group, "..., cp"."""
    return span["name"] in ("send", "recv") and span["detail"].endswith(", cp")


def is_pipeline(span):
    """A pipeline's send or receive (08): the trace's detail names the group, "..., pp"."""
    return span["tid"] == COMM and span["detail"].endswith(", pp")


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
    m = PASS.fullmatch(name)
    if m:
        return [name, m.group(1) + m.group(2)]  # "F3.c0", "F3"
    short = name.replace("forward ", "F ").replace("backward ", "B ").replace("optimizer", "opt")
    return [name, short]


def nesting(spans, t0, t1):
    """{id(span): how many compute spans of the step enclose it}: 08's layers sit inside its passes."""
    compute = sorted((s for s in spans if s["tid"] == COMPUTE and s["end"] > t0 and s["start"] < t1
                      and not re.fullmatch(r"step \d+", s["name"])), key=lambda s: (s["start"], -s["end"]))
    depth, open_ = {}, []
    for s in compute:
        while open_ and open_[-1]["end"] <= s["start"]:
            open_.pop()
        depth[id(s)] = len(open_)
        open_.append(s)
    return depth


def load_step_record(trace_path, number):
    """The drawn step's record from the run's --json file next to the trace, with the run's summary
    record under "summary" where there is one; None without the file or the step."""
    path = trace_path[: -len(".trace.json")] + ".jsonl" if trace_path.endswith(".trace.json") else None
    if not path or not os.path.exists(path):
        return None
    step, summary = None, None
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("type") == "step" and record.get("step") == number:
                step = record
            elif record.get("type") == "summary":
                summary = record
    if step is not None and summary is not None and summary.get("measured_steps", 0) > 0:
        step = dict(step, summary=summary)
    return step


def communication_header(spans, step, record):
    """The header's communication figures: the step record's, as the table counts them, else the trace's."""
    t0, t1 = step["start"], step["end"]

    def busy(keep):
        return sum(min(s["end"], t1) - max(s["start"], t0) for s in spans
                   if keep(s) and s["end"] > t0 and s["start"] < t1)

    if record is not None:
        mean = record.get("summary")  # the table's figures: the same counts, averaged over the measured steps
        text = "communication %.1f ms%s, exposed %.1f ms%s" % (
            record["comm_ms"], " (run's mean %.1f)" % mean["comm_ms"] if mean else "",
            record["exposed_comm_ms"], " (%.1f)" % mean["exposed_comm_ms"] if mean else "")
        if record.get("tp_comm_ms"):
            text += "; tensor-parallel: %.1f ms of the communication" % record["tp_comm_ms"]
        if "pp_comm_ms" in record:
            text += ("   |   pipeline p2p apart: in flight %.1f ms, waited %.1f ms (the bubble)"
                     % (record["pp_comm_ms"], record.get("pipeline_waits_ms", record.get("pp_exposed_comm_ms", 0))))
        return text
    pipeline = any(is_pipeline(s) for s in spans)
    text = "from the trace: communication busy %.1f ms" % busy(lambda s: s["tid"] in COLLECTIVE_TRACKS
                                                               and not is_pipeline(s))
    if any(s["tid"] == TENSOR for s in spans):
        text += " (tensor-parallel %.1f ms of it)" % busy(lambda s: s["tid"] == TENSOR)
    text += ", waited for %.1f ms" % busy(lambda s: s["tid"] == WAIT)
    if pipeline:
        text += " (pipeline's waits included); pipeline sends/receives %.1f ms" % busy(is_pipeline)
    return text


def draw_panel(ax, spans, step, title, px_per_ms, lanes, record, panel_px):
    t0, t1 = step["start"], step["end"]
    lane_y = {tid: len(lanes) - 1 - i for i, (tid, _) in enumerate(lanes)}  # compute on top
    height = 0.7
    depth = nesting(spans, t0, t1)
    for s in spans:
        if s["name"] == step["name"] or s["end"] <= t0 or s["start"] >= t1:
            continue
        start, end = max(s["start"], t0) - t0, min(s["end"], t1) - t0  # clipped to the step
        y = lane_y.get(s["tid"])
        if y is None:
            continue
        if depth.get(id(s), 0) > 0:  # a layer inside one of 08's passes: a thin strip along its foot
            ax.barh(y - height / 2 + 0.06, end - start, left=start, height=0.12, color=color_of(s),
                    edgecolor="white", linewidth=0.5, zorder=3)
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

    header = "%s   step %s: %.1f ms   |   %s" % (title, step["name"].split()[1], t1 - t0,
                                                 communication_header(spans, step, record))
    fits = panel_px / (0.6 * DPI / 72)  # characters at 1 point: a long header (08's) gets smaller
    ax.set_title(header, loc="left", fontsize=min(10, fits / len(header)))
    print("  " + header)
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
        record = load_step_record(path, number) if args.rank == 0 else None  # rank 0 writes the records
        panels.append((chapter_name(path), spans, steps[number], record))

    # The tensor-parallel lane only in the panels that have tensor-parallel collectives (07's).
    def lanes_of(spans):
        return [lane for lane in LANES if lane[0] != TENSOR or any(s["tid"] == TENSOR for s in spans)]
    lanes = max((lanes_of(spans) for _, spans, _, _ in panels), key=len)
    longest = max(step["end"] - step["start"] for _, _, step, _ in panels)
    width_in, left, right = 13.0, 0.09, 0.98
    px_per_ms = width_in * DPI * (right - left) / longest  # decides which boxes get a label
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(width_in, 0.5 + (0.45 * len(lanes) + 0.55) * len(panels)),
                             squeeze=False)
    for ax, (title, spans, step, record) in zip(axes[:, 0], panels):
        draw_panel(ax, spans, step, "%s (rank %d)" % (title, args.rank), px_per_ms, lanes_of(spans), record,
                   width_in * DPI * (right - left))
    axes[-1, 0].set_xlim(0, longest)
    axes[-1, 0].set_xlabel("ms since the start of the step")

    used, ring = set(), False
    for _, spans, _, _ in panels:
        used.update(collective_kind(s["name"]) for s in spans if s["tid"] in COLLECTIVE_TRACKS and not is_ring(s))
        ring |= any(is_ring(s) for s in spans if s["tid"] in COLLECTIVE_TRACKS)
    legend = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items()]
    if any(s["name"].startswith("W") and PASS.fullmatch(s["name"]) for _, spans, _, _ in panels for s in spans):
        legend.insert(2, Patch(color=WEIGHT_COLOR, label="weights' gradients (W)"))
    if "recv" in used:
        used.add("send")  # one colour, one entry
    names = {"send": "send, recv (08's pipeline)", "all_to_all": "all_to_all (11's experts)"}
    legend += [Patch(color=c, label=names.get(n, n)) for n, c in COLLECTIVE_COLORS.items()
               if n in used and n not in ("recv", "all_reduce_scalar", "broadcast_bytes")]
    if ring:
        legend.append(Patch(color=RING_COLOR, label="send, recv (10's ring)"))
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
