#!/usr/bin/env python3
"""precision_table.py: make precision's table and plots, from the runs' JSON records (precision.sh).

Usage: precision_table.py RESULTS_DIR OUT.png

The table: each recipe's final loss (the mean of the last 10 steps, which smooths the batch's noise)
and its gap to fp32; the steps skipped for overflow; per tensor kind the share of non-zero values
that underflowed to zero and that overflowed; the operand values each product read per step against
their formula, and the bytes of those operands in the recipe's formats (underflow: a non-zero value that became zero,
as a share of all the kind's operand values); the model state per rank
against 4 + 4 + 8 bytes a parameter. The plot: loss curves, fp16's loss scale, delayed fp8's scales.
"""
import glob
import json
import os
import sys


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    results, png = sys.argv[1], sys.argv[2]
    runs = {}
    for path in sorted(glob.glob(os.path.join(results, "*.jsonl"))):
        runs[os.path.basename(path)[:-6]] = records(path)
    if "fp32" not in runs:
        sys.exit("precision_table.py: no fp32 run in " + results)

    def final_loss(recs):
        losses = [r["loss"] for r in recs if r["type"] == "step"]
        tail = losses[-10:]
        return sum(tail) / len(tail) if tail else float("nan"), len(losses)

    base, _ = final_loss(runs["fp32"])
    print()
    print("%-26s %9s %9s %5s %7s | %-23s | %-23s | %-23s | %-14s | %s" % (
        "recipe", "loss", "vs fp32", "steps", "skipped", "underflow w / a / g %", "overflow w / a / g %",
        "operand values = formula", "operand bytes", "model state = 16P"))
    runs = dict(sorted(runs.items(), key=lambda item: (item[0] != "fp32", item[0])))
    for name, recs in runs.items():
        loss, steps = final_loss(recs)
        summary = next((r for r in recs if r["type"] == "precision_summary"), None)
        end = next((r for r in recs if r["type"] == "summary"), {})
        run = next(r for r in recs if r["type"] == "run")
        P = run["padded_params"]
        ended = "" if end.get("ended", "completed") == "completed" else "  (" + end.get("ended", "?") + ")"
        if summary is None:  # fp32: no emulation
            print("%-26s %9.4f %+9.4f %5d %7s | %-23s | %-23s | %-23s | %-14s | %s%s" % (
                name, loss, loss - base, steps, "-", "-", "-", "-", "4 B each", "-", ended))
            continue
        kinds = ("weights", "activations", "gradients")
        counted = {k: summary[k + "_values_per_step"] for k in kinds}
        formula = {k: summary[k + "_values_formula"] for k in kinds}
        nonzero = {k: max(1.0, counted[k] * steps) for k in kinds}
        under = " / ".join("%.2g" % (100.0 * summary[k + "_underflow"] / nonzero[k]) for k in kinds)
        over = " / ".join("%.2g" % (100.0 * summary[k + "_overflow"] / nonzero[k]) for k in kinds)
        values_ok = all(counted[k] == formula[k] for k in kinds)
        total_values = sum(counted.values())
        fmt = run["precision"]
        bytes_per = {"bf16": 2, "fp16": 2, "fp8": 1}[fmt]
        grad_bytes = 1 if fmt == "fp8" else 2
        operand_bytes = (counted["weights"] + counted["activations"]) * bytes_per + counted["gradients"] * grad_bytes
        state = summary["params_bytes"] + summary["grads_bytes"] + summary["optim_bytes"]
        print("%-26s %9.4f %+9.4f %5d %7d | %-23s | %-23s | %-23s | %-14s | %s%s" % (
            name, loss, loss - base, steps, summary["skipped"], under, over,
            "%.3g %s" % (total_values, "yes" if values_ok else "NO"),
            "%.3g B (%.2gx)" % (operand_bytes, operand_bytes / (4 * total_values)),
            "%d B %s" % (state, "yes" if state == 16 * P else "NO"), ended))
    print("underflow and overflow: share of all operand values, over all steps (w weights, a activations,")
    print("g gradients); operand bytes: of one step's operands in the recipe's formats, against fp32's")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (make deps installs it)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    for name, recs in runs.items():
        steps = [r["step"] for r in recs if r["type"] == "step"]
        losses = [r["loss"] for r in recs if r["type"] == "step"]
        style = "--" if ("no_" in name) else "-"
        ax.plot(steps, losses, style, label=name, linewidth=1.2 if name != "fp32" else 2.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("loss by recipe (dashed: without scaling)")
    ax.legend(fontsize=7)
    ax = axes[1]
    for name in ("fp16",):
        if name in runs:
            recs = [r for r in runs[name] if r["type"] == "precision" and r["rank"] == 0]
            ax.semilogy([r["step"] for r in recs], [r["loss_scale"] for r in recs], label="loss scale")
            skipped = [r for r in recs if not r["applied"]]
            ax.semilogy([r["step"] for r in skipped], [r["loss_scale"] for r in skipped], "rv", label="skipped: halved")
    ax.set_xlabel("step")
    ax.set_title("fp16: dynamic loss scale")
    ax.legend(fontsize=8)
    ax = axes[2]
    if "fp8_delayed" in runs:
        recs = [r for r in runs["fp8_delayed"] if r["type"] == "precision" and r["rank"] == 0]
        for kind in ("weights", "activations", "gradients"):
            ax.semilogy([r["step"] for r in recs], [max(r["scale_" + kind], 1e-30) for r in recs], label=kind)
    ax.set_xlabel("step")
    ax.set_title("delayed fp8: scale of the first block's qkv operands")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print("wrote " + png)


if __name__ == "__main__":
    main()
