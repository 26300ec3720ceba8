#!/usr/bin/env bash
# bench_pp.sh: `make bench-pp`. Chapter 08's six schedules at one pipeline depth and several
# micro-batch counts, one run after the other; prints one table: the step time, the bubble measured
# (idle / step, mean over stages), simulated with the measured pass times, and by the schedule's
# formula, and the activations the first and the last stage hold.
# Settings: RANKS=2 (the stages), PRESET=small, STEPS=12, MS="2 4 8 16" (micro-batches; each must
# divide the global batch, --batch 16 here so that 16 micro-batches of one sequence fit).
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${RANKS:-2}
preset=${PRESET:-small}
steps=${STEPS:-12}
ms=${MS:-"2 4 8 16"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bench-pp: $ranks stages, --preset $preset --batch 16 --steps $steps, micro-batches: $ms (RANKS=, PRESET=, STEPS=, MS= change it)"
[ "$(nproc)" -lt "$ranks" ] && echo "note: $ranks ranks on $(nproc) cores: ranks take turns on a core, which the measured bubble shows and the simulated one does not"
i=0
for schedule in afab 1f1b interleaved zb-h1 zb-v dualpipev; do
  for m in $ms; do
    if [ "$schedule" = interleaved ] && [ $((m % ranks)) -ne 0 ]; then continue; fi
    if [ "$schedule" = dualpipev ] && [ "$m" -lt $((2 * ranks)) ]; then continue; fi
    # shellcheck disable=SC2086
    if ! mpiexec -n "$ranks" ./08_pipeline/train --preset "$preset" --batch 16 --steps "$steps" --quiet \
        --schedule "$schedule" --micro-batches "$m" --json "$out/$i.jsonl" </dev/null >"$out/$i.log" 2>&1; then
      echo "failed: $schedule m=$m"; tail -n 3 "$out/$i.log"; exit 1
    fi
    i=$((i + 1))
  done
done
python3 - "$out" "$i" <<'PY'
import json, sys
folder, count = sys.argv[1], int(sys.argv[2])
print("%-12s %4s %9s %9s %10s %8s %14s %14s" % ("schedule", "m", "step ms", "bubble", "simulated", "theory",
                                              "act. stage 0", "act. last"))
for i in range(count):
    pipe, stages, summary = None, [], None
    with open("%s/%d.jsonl" % (folder, i)) as f:
        for line in f:
            r = json.loads(line)
            if r["type"] == "pipeline":
                pipe = r
            elif r["type"] == "pipeline_stage":
                stages.append(r)
            elif r["type"] == "summary":
                summary = r
    print("%-12s %4d %9.1f %8.1f%% %9.1f%% %7.1f%% %11.2f MB %11.2f MB" % (
        pipe["schedule"] + (" v%d" % pipe["v"] if pipe["v"] > 1 else ""), pipe["m"], summary["step_ms"],
        100 * pipe["measured_bubble"], 100 * pipe["simulated_bubble"], 100 * pipe["theory_bubble"],
        stages[0]["measured_activations_bytes"] / 1e6, stages[-1]["measured_activations_bytes"] / 1e6))
print("(bubble: idle / step time, mean over stages; simulated: the schedule with each stage's measured pass times;")
print(" theory: the formula with equal stages; activations: the arena a stage holds, measured)")
PY
