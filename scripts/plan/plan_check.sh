#!/usr/bin/env bash
# plan_check.sh: `make plan-check`. Chapter 09's planner (09_3d_parallel/plan --one) against runs of the
# chapters on this machine: for each configuration below, the chapter trains a few steps (--json) and
# the planner predicts the same configuration on the "emulated" cluster (CPU ranks, fp32, the same
# emulated link). Printed side by side:
#   memory per rank (rank 0), by category: parameters, gradients, optimizer state, activations must be
#   exact (both include the padding of the flat buffers); communication buffers are an upper bound.
#   step time, at 2 ranks: the prediction within 20% of the measured step (the run's median step: the
#   calibration is read the same way, so that both sides meet the machine's load alike). The planner's compute speed comes from ONE calibration run (01_vanilla_dp on 2
#   ranks without a link, named in the output), as two rates: the matrix products' FLOPs over the time
#   the run spent in them (its step records' matmul_ms), with efficiency 1; and the activation bytes
#   of a step over the rest of the step (layernorms, GELU, attention, the loss, the optimizer), the
#   planner's --elementwise-rate. Communication is the emulated link's alpha-beta model; the bubble
#   is 08's simulator.
# Settings: PRESET=small, STEPS=8 (step 0 is warm-up; the calibration runs CAL_STEPS=24, so that its
# median step, which every prediction scales with, is a steady one), RUNS="name name ..." to run only
# some rows. (The fastest step on each side was tried first: the fastest of 24 calibration steps is
# systematically faster than the fastest of a row's 7, so every prediction came out too fast.)
# The machine's cores are shared: timings are noisy; memory is not.
set -euo pipefail
cd "$(dirname "$0")/../.."
preset=${PRESET:-small}
steps=${STEPS:-8}
cal_steps=${CAL_STEPS:-24}
out=results/plan_check
mkdir -p "$out"
plan=09_3d_parallel/plan

# Two emulated links (bench-tp's "in a node" and "across nodes").
fast="5 5"
slow="0.5 50"
# name | ranks | chapter | the chapter's flags | the planner's flags | link ("fast" or "slow") | timed (1: check time)
# Every row trains --batch 8. Extend by adding a row; a chapter that is not built is skipped.
runs=(
  "dp2|2|03_bucket_dp||--zero 0|slow|1"
  "dp2-fast|2|03_bucket_dp||--zero 0|fast|1"
  "zero1|2|04_zero1||--zero 1|slow|1"
  "zero2|2|05_zero2|--grad-accum 2|--zero 2 --micro-batches 2|slow|1"
  "zero3|2|06_zero3||--zero 3|fast|1"
  "tp2|2|07_tensor_parallel|--tp 2|--tp 2|fast|1"
  "tp2-sp|2|07_tensor_parallel|--tp 2 --sequence-parallel|--tp 2 --sequence-parallel|fast|1"
  "pp2-1f1b|2|08_pipeline|--pp 2 --micro-batches 4 --schedule 1f1b|--pp 2 --micro-batches 4 --schedule 1f1b|fast|1"
  "pp2-interleaved|2|08_pipeline|--pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2|--pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2|fast|1"
  "pp2-zbh1|2|08_pipeline|--pp 2 --micro-batches 4 --schedule zb-h1|--pp 2 --micro-batches 4 --schedule zb-h1|slow|1"
  "zero3-4|4|06_zero3||--zero 3|fast|0"
  "dp2xtp2|4|07_tensor_parallel|--tp 2 --zero1|--tp 2 --zero 1|fast|0"
  "dp2xpp2|4|08_pipeline|--pp 2 --micro-batches 2 --zero1|--pp 2 --micro-batches 2 --zero 1|fast|0"
  "pp4-afab|4|08_pipeline|--pp 4 --micro-batches 4 --schedule afab|--pp 4 --micro-batches 4 --schedule afab|fast|0"
  "zero2-8|8|05_zero2||--zero 2|fast|0"
  "dp4xtp2|8|07_tensor_parallel|--tp 2 --sequence-parallel|--tp 2 --sequence-parallel|fast|0"
  "dp2xpp4|8|08_pipeline|--pp 4 --micro-batches 4 --schedule 1f1b|--pp 4 --micro-batches 4 --schedule 1f1b|fast|0"
  "dp2-recompute-full|2|03_bucket_dp|--recompute full|--recompute full|fast|1"
  "tp2-selective|2|07_tensor_parallel|--tp 2 --recompute selective|--tp 2 --recompute selective|fast|1"
  "dp2xpp2-full|4|08_pipeline|--pp 2 --micro-batches 2 --recompute full|--pp 2 --micro-batches 2 --recompute full|fast|0"
  "tp2x4-sp-full|8|07_tensor_parallel|--tp 2 --sequence-parallel --recompute full|--tp 2 --sequence-parallel --recompute full|fast|0"
  "tp2xpp2-selective|4|09_3d_parallel|--tp 2 --pp 2 --micro-batches 2 --recompute selective|--tp 2 --pp 2 --micro-batches 2 --recompute selective|fast|0"
  "dp2xtp2xpp2|8|09_3d_parallel|--tp 2 --pp 2 --micro-batches 2 --sequence-parallel|--tp 2 --pp 2 --micro-batches 2 --sequence-parallel|fast|0"
  "3d-pp2|2|09_3d_parallel|--tp 1 --pp 2 --micro-batches 4|--pp 2 --micro-batches 4|fast|1"
  "3d-dp2xpp2-zbh1-sel|4|09_3d_parallel|--tp 1 --pp 2 --micro-batches 2 --schedule zb-h1 --recompute selective|--pp 2 --micro-batches 2 --schedule zb-h1 --recompute selective|slow|0"
  "3d-int-zero1|8|09_3d_parallel|--tp 2 --pp 2 --micro-batches 4 --schedule interleaved --zero1|--tp 2 --pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2 --zero 1|fast|0"
)

mpirun_flags=()
if mpiexec --help 2>&1 | grep -q -- --oversubscribe; then mpirun_flags+=(--oversubscribe); fi

# The calibration: 01 on 2 ranks without a link, the same model and batch as every row: each rank
# computes what a 2-rank row computes, under the same sharing of the cores, and communicates for free.
cal="$out/calibration"
echo "calibration run: mpiexec -n 2 01_vanilla_dp/train --preset $preset --batch 8 --steps $cal_steps (no link)"
mpiexec "${mpirun_flags[@]}" -n 2 ./01_vanilla_dp/train --preset "$preset" --batch 8 --steps "$cal_steps" --quiet \
  --json "$cal.jsonl" </dev/null >"$cal.log" 2>&1 || { echo "calibration failed"; tail -n 5 "$cal.log"; exit 1; }

selected=" ${RUNS:-} "
: >"$out/rows.tsv"
for row in "${runs[@]}"; do
  IFS='|' read -r name ranks chapter chapter_flags plan_flags link timed <<<"$row"
  if [ -n "${RUNS:-}" ] && [[ "$selected" != *" $name "* ]]; then continue; fi
  if [ ! -x "$chapter/train" ]; then
    printf '%s\tskipped\t%s is not built\n' "$name" "$chapter" >>"$out/rows.tsv"
    continue
  fi
  read -r gbps latency <<<"${!link}"
  log="$out/$name"
  if ! timeout 600 mpiexec "${mpirun_flags[@]}" -n "$ranks" "./$chapter/train" --preset "$preset" --batch 8 \
      --steps "$steps" --quiet --link-gbps "$gbps" --link-latency-us "$latency" $chapter_flags \
      --json "$log.jsonl" </dev/null >"$log.log" 2>&1; then
    printf '%s\tfailed\t%s\n' "$name" "$(tail -n 1 "$log.log")" >>"$out/rows.tsv"
    continue
  fi
  printf '%s\tran\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$ranks" "$chapter" "$gbps" "$latency" "$timed" "$plan_flags" \
    >>"$out/rows.tsv"
done

python3 - "$out" "$preset" "$plan" <<'EOF'
import json, statistics, subprocess, sys
out, preset, plan = sys.argv[1:4]

def records(path):
    rows = []
    for line in open(path):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows

def median_step(path):
    # The measured step of median time (its own matmul_ms with it), for the calibration and every row
    # alike: a minimum would depend on how many steps a run has.
    steps = sorted((r for r in records(path) if r.get("type") == "step" and r.get("step", 0) > 0),
                   key=lambda r: r["step_ms"])
    return steps[(len(steps) - 1) // 2]

def step_ms(path):
    return median_step(path)["step_ms"]

def predict(ranks, batch, gbps, latency, flags, peak, elementwise):
    cmd = [plan, "--one", "--model", preset, "--cluster", "emulated", "--gpus", str(ranks), "--batch", str(batch),
           "--inter-gbps", gbps, "--inter-latency-us", latency, "--efficiency", "1", "--peak-flops", repr(peak),
           "--elementwise-rate", repr(elementwise)]
    cmd += flags.split()
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l[len("plan-json "):]) for l in text.splitlines() if l.startswith("plan-json ")]

# Calibration: the planner's own prediction of the 2-rank run with one rate at 1 a second and the
# other free gives the run's matrix-product FLOPs (3 forwards' worth: forward and backward) and its
# activation bytes; the median measured step, split into its time in the matrix products and the
# rest, gives the two rates.
cal = median_step(out + "/calibration.jsonl")
cal_ms, cal_matmul_ms = cal["step_ms"], cal["matmul_ms"]
flops = predict(2, 8, "0", "0", "", 1.0, 1e30)[0]["compute_s"]
act_bytes = predict(2, 8, "0", "0", "", 1e30, 1.0)[0]["compute_s"]
peak = flops / (cal_matmul_ms / 1e3)
elementwise = act_bytes / ((cal_ms - cal_matmul_ms) / 1e3)
print("calibration: 01_vanilla_dp, 2 ranks, no link, --preset %s --batch 8: %.1f ms a step (median), of which %.1f ms "
      "in matrix products of %.3g FLOPs a rank -> %.2f GFLOP/s, and %.1f ms for the rest, %.3g activation bytes a "
      "rank -> %.3f GB/s: the planner's peak x efficiency and --elementwise-rate for every row below"
      % (preset, cal_ms, cal_matmul_ms, flops, peak / 1e9, cal_ms - cal_matmul_ms, act_bytes, elementwise / 1e9))
print()
cats = [("params", "params_bytes", "measured_params_bytes"), ("grads", "grads_bytes", "measured_grads_bytes"),
        ("optim", "optim_bytes", "measured_optim_bytes"), ("activ", "activations_bytes", "measured_activations_bytes")]
head = "%-20s %5s %-19s %-10s" % ("run", "ranks", "chapter", "link")
head += "".join(" %19s" % ("%s meas/plan" % c[0]) for c in cats) + " %17s %s" % ("buffers meas<=plan", "| step ms meas / plan (error)")
print(head)
memory_ok = time_ok = 0
memory_rows = time_rows = 0
for line in open(out + "/rows.tsv"):
    f = line.rstrip("\n").split("\t")
    if f[1] != "ran":
        print("%-20s %s: %s" % (f[0], f[1], f[2]))
        continue
    name, _, ranks, chapter, gbps, latency, timed, flags = f
    recs = records("%s/%s.jsonl" % (out, name))
    theory = [r for r in recs if r.get("type") == "theory"]
    if not theory:
        print("%-20s no theory record" % name)
        continue
    t = theory[0]
    p = predict(int(ranks), 8, gbps, latency, flags, peak, elementwise)[0]  # stage 0: world rank 0's
    cells, exact = [], True
    for _, pk, mk in cats:
        meas, pred = t[mk], p[pk]
        same = abs(meas - pred) < 1
        exact = exact and same
        cells.append("%9.0f/%-9.0f" % (meas / 1e3, pred / 1e3) + ("" if same else "!"))
    buf_ok = t["measured_transient_bytes"] <= p["transient_bytes"] + 1
    memory_rows += 1
    memory_ok += exact and buf_ok
    row = "%-20s %5s %-19s %-10s" % (name, ranks, chapter, "%sG/%sus" % (gbps, latency))
    row += "".join(" %19s" % c for c in cells)
    row += " %8.0f<=%-8.0f" % (t["measured_transient_bytes"] / 1e3, p["transient_bytes"] / 1e3)
    if timed == "1":
        meas_ms, pred_ms = step_ms("%s/%s.jsonl" % (out, name)), p["step_s"] * 1e3
        err = (pred_ms - meas_ms) / meas_ms
        time_rows += 1
        time_ok += abs(err) <= 0.20
        row += " | %7.1f / %7.1f (%+5.1f%%) compute %.1f TP %.1f bubble %.1f PP %.1f DP %.1f" % (
            meas_ms, pred_ms, 100 * err, p["compute_s"] * 1e3, p["tp_s"] * 1e3, p["bubble_s"] * 1e3, p["pp_s"] * 1e3,
            p["dp_s"] * 1e3)
    print(row)
print("(memory in kB, rank 0, by category: measured/planned, '!' where they differ; buffers: the measured peak of "
      "the communication buffers and the planner's bound)")
print("memory exact (and buffers within the bound) in %d of %d runs; step time within 20%% in %d of %d timed runs "
      "at 2 ranks" % (memory_ok, memory_rows, time_ok, time_rows))
sys.exit(0 if memory_ok == memory_rows else 1)
EOF
