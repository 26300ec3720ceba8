#!/usr/bin/env python3
"""precision_table.py: make precision's table and plots, from the runs' JSON records (precision.sh).

Usage: precision_table.py RESULTS_DIR OUT.png

The table: each recipe's final loss (the mean of the last 10 steps, which smooths the batch's noise)
and its gap to fp32; the steps skipped for overflow; per tensor kind the share of non-zero values
that underflowed to zero and that overflowed; the operand values each product read per step against
their formula, and the bytes of those operands as the products read them (fp8's LM head in bf16) against
theirs (underflow: a non-zero value that became zero, as a share of all the kind's operand values); the
model state per rank, each category against its formula: parameters 4P, gradients 4P, AdamW 8P bytes
(P padded parameters). The plot: loss curves, fp16's loss scale, delayed fp8's scales.
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
    print("%-26s %9s %9s %5s %7s | %-23s | %-23s | %-23s | %-23s | %s" % (
        "recipe", "loss", "vs fp32", "steps", "skipped", "underflow w / a / g %", "overflow w / a / g %",
        "operand values = formula", "operand bytes = formula", "params, grads, optim = 4P, 4P, 8P"))
    runs = dict(sorted(runs.items(), key=lambda item: (item[0] != "fp32", item[0])))
    for name, recs in runs.items():
        loss, steps = final_loss(recs)
        summary = next((r for r in recs if r["type"] == "precision_summary"), None)
        end = next((r for r in recs if r["type"] == "summary"), {})
        run = next(r for r in recs if r["type"] == "run")
        P = run["padded_params"]
        ended = "" if end.get("ended", "completed") == "completed" else "  (" + end.get("ended", "?") + ")"
        if summary is None:  # fp32: no emulation
            print("%-26s %9.4f %+9.4f %5d %7s | %-23s | %-23s | %-23s | %-23s | %s%s" % (
                name, loss, loss - base, steps, "-", "-", "-", "-", "4 B a value", "-", ended))
            continue
        kinds = ("weights", "activations", "gradients")
        counted = {k: summary[k + "_values_per_step"] for k in kinds}
        formula = {k: summary[k + "_values_formula"] for k in kinds}
        nonzero = {k: max(1.0, counted[k] * steps) for k in kinds}
        under = " / ".join("%.2g" % (100.0 * summary[k + "_underflow"] / nonzero[k]) for k in kinds)
        over = " / ".join("%.2g" % (100.0 * summary[k + "_overflow"] / nonzero[k]) for k in kinds)
        values_ok = all(counted[k] == formula[k] for k in kinds)
        total_values = sum(counted.values())
        operand_bytes = sum(summary[k + "_bytes_per_step"] for k in kinds)
        bytes_ok = all(summary[k + "_bytes_per_step"] == summary[k + "_bytes_formula"] for k in kinds)
        # Each category against its formula, computed here from P (not read from the record).
        state_ok = (summary["params_bytes"], summary["grads_bytes"], summary["optim_bytes"]) == (4 * P, 4 * P, 8 * P)
        state = summary["params_bytes"] + summary["grads_bytes"] + summary["optim_bytes"]
        print("%-26s %9.4f %+9.4f %5d %7d | %-23s | %-23s | %-23s | %-23s | %s%s" % (
            name, loss, loss - base, steps, summary["skipped"], under, over,
            "%.3g %s" % (total_values, "yes" if values_ok else "NO"),
            "%.3g B (%.2gx) %s" % (operand_bytes, operand_bytes / (4 * total_values), "yes" if bytes_ok else "NO"),
            "%d B %s" % (state, "yes" if state_ok else "NO"), ended))
    print("underflow and overflow: share of all operand values, over all steps (w weights, a activations,")
    print("g gradients); operand bytes: of one step's operands as the products read them, against fp32's,")
    print("and = the formula (docs/theory.md, section 18); model state: 16P in all, each category its formula")

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
