#!/usr/bin/env python3
# plan_calibrate.py: the planner's two CPU compute rates from one calibration run (docs/planner.md,
# "The compute of a pass, on this CPU"), for scripts that set the planner's prediction beside a
# measurement on this machine (scripts/cluster/cluster_lessons.sh).
#   plan_calibrate.py RUN.jsonl PLAN PRESET RANKS BATCH   ->  "PEAK ELEMENTWISE" on stdout, the why on stderr
# RUN.jsonl: 01_vanilla_dp's run on RANKS ranks of one host without a link, --preset PRESET --batch BATCH.
# Its median measured step is split into the time spent in matrix products (the step record's
# matmul_ms) and the rest; the planner's own prediction of that run, with one rate at 1 a second and
# the other free, gives the FLOPs and the activation bytes a rank; their quotients are the rates
# (--peak-flops with --efficiency 1, and --elementwise-rate). The median, not the fastest step, so that
# the calibration meets the machine's load as the runs it predicts do. scripts/plan/plan_check.sh does the
# same inline for its 2-rank rows.
import json
import subprocess
import sys


def median_step(path):
    steps = []
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("type") == "step" and r.get("step", 0) > 0:
            steps.append(r)
    if not steps:
        sys.exit("plan_calibrate: %s has no measured step (step 0 is warm-up): run more steps" % path)
    steps.sort(key=lambda r: r["step_ms"])
    return steps[(len(steps) - 1) // 2]


def compute_s(plan, preset, ranks, batch, peak, elementwise):
    cmd = [plan, "--one", "--model", preset, "--cluster", "namespaces", "--gpus", str(ranks), "--batch", str(batch),
           "--efficiency", "1", "--peak-flops", repr(peak), "--elementwise-rate", repr(elementwise)]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l[len("plan-json "):]) for l in text.splitlines() if l.startswith("plan-json ")][0]["compute_s"]


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: plan_calibrate.py RUN.jsonl PLAN PRESET RANKS BATCH")
    path, plan, preset, ranks, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    step = median_step(path)
    step_ms, matmul_ms = step["step_ms"], step["matmul_ms"]
    if not 0 < matmul_ms < step_ms:
        sys.exit("plan_calibrate: matmul_ms %.1f of a %.1f ms step: the run must be on the CPU" % (matmul_ms, step_ms))
    flops = compute_s(plan, preset, ranks, batch, 1.0, 1e30)
    act_bytes = compute_s(plan, preset, ranks, batch, 1e30, 1.0)
    peak = flops / (matmul_ms / 1e3)
    elementwise = act_bytes / ((step_ms - matmul_ms) / 1e3)
    print("calibration: 01_vanilla_dp, %d ranks on one host, no link, --preset %s --batch %d: %.1f ms a step (median), "
          "%.1f ms in matrix products -> %.2f GFLOP/s, the rest -> %.3f GB/s of activations"
          % (ranks, preset, batch, step_ms, matmul_ms, peak / 1e9, elementwise / 1e9), file=sys.stderr)
    print("%r %r" % (peak, elementwise))


if __name__ == "__main__":
    main()
