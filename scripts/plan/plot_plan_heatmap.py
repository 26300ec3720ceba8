#!/usr/bin/env python3
"""plot_plan_heatmap.py CSV PNG: chapter 09's planner over models, node counts and sequence lengths, as
the Ultra-Scale Playbook draws it. Three panels (plan --heatmap writes the CSV): dense models and
mixtures of experts over 1 to 512 nodes of 8 H100s, and Llama 3 70B over the sequence length on 64
nodes, all at 16M tokens a batch. Each cell is the best configuration the planner predicts, coloured by
its predicted MFU; its text is the grid (t, c, p, d, e), the schedule where there is a pipeline, the
micro-batch, the ZeRO stage, the recomputation and SP, with a key for every abbreviation under the
map. Grey: nothing fits."""
import csv
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# Every abbreviation a cell may use, and what it means (drawn under the map; check_plots.sh checks
# that each one label() writes is here).
KEY_TERMS = {
    "t, c, p, d, e": "tensor-, context-, pipeline-, data- and expert-parallel degrees (t8 c2 p16 d8 e8; "
                     "e is inside d x c)",
    "1f1b, zb-h1, dualpipev": "the pipeline's schedule",
    "zb-v": "zero-bubble's V schedule, 2 chunks a rank",
    "interleaved/4": "interleaved 1F1B with 4 virtual stages a rank",
    "B8": "a micro-batch of 8 sequences",
    "Z1, Z2, Z3": "ZeRO stage (Z2 under a pipeline: Llama 3's FSDP)",
    "rc full, rc selective": "activation recomputation",
    "SP": "sequence parallelism",
    "%": "predicted MFU, by the published count (attention over the full T x T, PaLM's): the causal half "
         "that is computed lets it pass the efficiency at long sequences",
}
KEY = "    ".join("%s: %s" % kv for kv in list(KEY_TERMS.items())[:4]) + "\n" + \
      "    ".join("%s: %s" % kv for kv in list(KEY_TERMS.items())[4:])


def abbreviations(row):
    """The abbreviations label(row) uses, as they appear in KEY_TERMS' keys."""
    used = ["t, c, p, d, e", "B8"]
    if int(row["pp"]) > 1:
        used.append("interleaved/4" if row["schedule"] == "interleaved" else
                    "zb-v" if row["schedule"] == "zb-v" else "1f1b, zb-h1, dualpipev")
    if int(row["zero"]) > 0:
        used.append("Z1, Z2, Z3")
    if row["recompute"] != "none":
        used.append("rc full, rc selective")
    if row["sp"] == "1":
        used.append("SP")
    return used


def label(row):
    grid = "t%s c%s p%s d%s" % (row["tp"], row["cp"], row["pp"], row["dp"])
    if int(row["ep"]) > 1:
        grid += " e%s" % row["ep"]
    extra = []
    if int(row["pp"]) > 1:
        extra.append(row["schedule"] + ("/%s" % row["v"] if row["schedule"] == "interleaved" else ""))
    extra.append("B%s" % row["micro_batch"])
    if int(row["zero"]) > 0:
        extra.append("Z%s" % row["zero"])
    if row["recompute"] != "none":
        extra.append("rc " + row["recompute"])
    if row["sp"] == "1":
        extra.append("SP")
    return grid + "\n" + " ".join(extra[:3]) + ("\n" + " ".join(extra[3:]) if len(extra) > 3 else "")


def size_label(params):
    """'13B'; '1T' for a model of about a trillion (998B would read as a size class of its own)."""
    if params < 0.95e12:
        return "%.0fB" % (params / 1e9)
    return "%.3gT" % (params / 1e12) if abs(params - 1e12) > 0.05e12 else "1T"


def panel(ax, rows, across, title, xlabel):
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    xs = sorted({int(r[across]) for r in rows})
    mfu = np.full((len(models), len(xs)), np.nan)
    for r in rows:
        i, j = models.index(r["model"]), xs.index(int(r[across]))
        if r["fits"] == "1":
            mfu[i, j] = 100 * float(r["mfu"])
            ax.text(j, i, label(r) + "\n%.0f%%" % mfu[i, j], ha="center", va="center", fontsize=7)
        else:
            ax.text(j, i, "does not fit", ha="center", va="center", fontsize=6.5, color="0.3")
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("0.85")
    image = ax.imshow(np.ma.masked_invalid(mfu), cmap=cmap, aspect="auto", origin="lower", vmin=0, vmax=70, alpha=0.75)
    ax.set_xticks(range(len(xs)), [("%dK" % (x // 1024)) if across == "T" else str(x) for x in xs])
    names = []
    for m in models:
        params = float(next(r["params"] for r in rows if r["model"] == m))
        # A name that says its size ("Llama 3 405B", "GPT 1T") keeps it, as the docs write it.
        names.append(m if re.search(r"\d[BT]\b", m) else "%s (%s)" % (m, size_label(params)))
    ax.set_yticks(range(len(models)), names)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    return image


def main(path, out):
    rows = list(csv.DictReader(open(path)))
    first = rows[0]
    dense = [r for r in rows if r["panel"] == "dense"]
    moe = [r for r in rows if r["panel"] == "moe"]
    seq = [r for r in rows if r["panel"] == "sequence"]
    fig = plt.figure(figsize=(22, 15))
    grid = fig.add_gridspec(2, 2, height_ratios=[len({r["model"] for r in dense}), 2.4], width_ratios=[3, 1.2])
    nodes = "nodes of 8 H100 (80 GB, 989 TFLOP/s bf16, NVLink in a node, 400 Gb/s per GPU between)"
    image = panel(fig.add_subplot(grid[0, :]), dense, "nodes", "Dense models", nodes)
    panel(fig.add_subplot(grid[1, 0]), moe, "nodes", "Mixtures of experts", nodes)
    if seq:
        panel(fig.add_subplot(grid[1, 1]), seq, "T", "%s on %s nodes, over the sequence length" %
              (seq[0]["model"], seq[0]["nodes"]), "sequence length T")
    fig.suptitle("Best configuration predicted by 09_3d_parallel/plan, and its MFU (%.0fM tokens a batch, "
                 "efficiency %s)" % (int(first["batch"]) * int(first["T"]) / 2 ** 20, first["efficiency"]))
    fig.colorbar(image, cax=fig.add_axes([0.9, 0.3, 0.012, 0.4]), label="predicted MFU, %")
    fig.text(0.01, 0.005, KEY, fontsize=8, va="bottom", ha="left", color="0.2")
    fig.subplots_adjust(left=0.1, right=0.86, top=0.94, bottom=0.08, hspace=0.25)
    fig.savefig(out, dpi=110)
    print("wrote %s" % out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_plan_heatmap.py CSV PNG")
    main(sys.argv[1], sys.argv[2])
