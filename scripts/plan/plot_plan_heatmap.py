#!/usr/bin/env python3
"""plot_plan_heatmap.py CSV PNG: chapter 09's planner over model sizes and node counts, as the
Ultra-Scale Playbook draws it. Each cell is the best configuration the planner predicts for that
model on that many nodes of 8 H100s (plan --heatmap writes the CSV), coloured by its predicted MFU;
its text is the grid (d x t x p), the schedule where there is a pipeline, the micro-batch, the ZeRO
stage and the recomputation, with a key under the map. Grey: nothing fits."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def label(row):
    text = "d%s t%s p%s" % (row["dp"], row["tp"], row["pp"])
    extra = []
    if int(row["pp"]) > 1:
        extra.append(row["schedule"] + ("/%s" % row["v"] if int(row["v"]) > 1 else ""))
    extra.append("B%s" % row["micro_batch"])
    if int(row["zero"]) > 0:
        extra.append("Z%s" % row["zero"])
    if row["recompute"] != "none":
        extra.append("rc " + row["recompute"])
    if row["sp"] == "1":
        extra.append("SP")
    return text + "\n" + " ".join(extra[:3]) + ("\n" + " ".join(extra[3:]) if len(extra) > 3 else "")


# What each cell's abbreviations mean, drawn under the map.
KEY = ("d, t, p: data-, tensor- and pipeline-parallel degrees    B8: micro-batch of 8 sequences    "
       "1f1b, interleaved/4: the pipeline's schedule (/4: 4 virtual stages a rank)\n"
       "Z1, Z2, Z3: ZeRO stage    rc selective, rc full: activation recomputation    SP: sequence parallelism    "
       "%: predicted MFU")


def size_label(params):
    """'13B'; '1T (998B)' for the model sized for 1T, whose 998B would read as a size class of its own."""
    if params < 0.95e12:
        return "%.0fB" % (params / 1e9)
    return "%.3gT" % (params / 1e12) if params >= 999.5e9 else "%.0fT (%.0fB)" % (params / 1e12, params / 1e9)


def main(path, out):
    rows = list(csv.DictReader(open(path)))
    sizes = sorted({float(r["params"]) for r in rows})
    nodes = sorted({int(r["nodes"]) for r in rows})
    mfu = np.full((len(sizes), len(nodes)), np.nan)
    fig, ax = plt.subplots(figsize=(1.9 * len(nodes) + 2, 1.0 * len(sizes) + 2))
    for r in rows:
        i, j = sizes.index(float(r["params"])), nodes.index(int(r["nodes"]))
        if r["fits"] == "1":
            mfu[i, j] = 100 * float(r["mfu"])
            ax.text(j, i, label(r) + "\n%.0f%%" % mfu[i, j], ha="center", va="center", fontsize=6.5)
        else:
            ax.text(j, i, "does not fit", ha="center", va="center", fontsize=7, color="0.3")
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("0.85")
    image = ax.imshow(np.ma.masked_invalid(mfu), cmap=cmap, aspect="auto", origin="lower", vmin=0,
                      vmax=np.nanmax(mfu) if np.isfinite(mfu).any() else 1, alpha=0.75)
    ax.set_xticks(range(len(nodes)), [str(n) for n in nodes])
    ax.set_yticks(range(len(sizes)), [size_label(s) for s in sizes])
    ax.set_xlabel("nodes of 8 H100 (80 GB, 989 TFLOP/s bf16, NVLink in a node, 400 Gb/s per GPU between)")
    ax.set_ylabel("model parameters (GPT, sequence 2048)")
    first = rows[0]
    ax.set_title("Best configuration predicted by 09_3d_parallel/plan, and its MFU "
                 "(global batch %s sequences, efficiency %s)" % (first["batch"], first["efficiency"]))
    fig.colorbar(image, ax=ax, label="predicted MFU, %")
    fig.text(0.01, 0.005, KEY, fontsize=7.5, va="bottom", ha="left", color="0.2")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=130)
    print("wrote %s" % out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_plan_heatmap.py CSV PNG")
    main(sys.argv[1], sys.argv[2])
