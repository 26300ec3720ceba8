#!/usr/bin/env bash
# schedules.sh: `make schedules`. Chapter 08's four pipeline schedules (afab, 1f1b, interleaved,
# zb-h1), one run each on the same model and batch, drawn as the classic pipeline diagram
# (scripts/plot_pipeline.py): per schedule, the measured step from the trace next to the ideal one,
# simulated (build/pipeline_ideal) with one set of pass times for all four: those zb-h1's run measured,
# the one run that times the inputs' gradients (B) and the weights' (W) apart; the others' backward is
# B + W. Each run's own pass times differ by the noise of its run, which would order the ideal steps by
# noise; the same times order them by schedule alone, as the theory does. Read it with the lists of
# actions in common/pipeline_schedule.cpp.
#   results/schedules/<schedule>.{jsonl,trace.json,log}   one run each
#   results/schedules/<schedule>.ideal.jsonl              its ideal step, simulated with zb-h1's pass times
#   results/schedules.png                                  the diagram, one row per schedule
# Settings: PP=4 stages (as many ranks), M=8 micro-batches (a multiple of PP for interleaved, which
# runs with v = 2 chunks per rank), PRESET=deep (12 blocks: 4 stages x 2 chunks fit), STEPS=10.
# With fewer cores than PP ranks the ranks take turns on a core and the measured panels stretch;
# the ideal ones are the schedule without that noise (the plot's titles say when it happened).
set -euo pipefail
cd "$(dirname "$0")/.."
pp=${PP:-4}
m=${M:-8}
preset=${PRESET:-deep}
steps=${STEPS:-10}
cores=$(nproc)
out=results/schedules
echo "schedules: 08_pipeline on $pp ranks, --pp $pp --micro-batches $m --preset $preset --steps $steps"
echo "  (PP=, M=, PRESET=, STEPS= change it)"
if [ "$cores" -lt "$pp" ]; then
  echo "  note: $pp ranks on $cores cores: ranks take turns, so the measured panels are stretched (oversubscribed)"
fi
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.trace.json "$out"/*.log results/schedules.png
[ -x build/pipeline_ideal ] || { echo "build/pipeline_ideal is missing: run make schedules (it builds it)"; exit 1; }
# zb-h1 first: its pass times are every schedule's ideal's.
for schedule in zb-h1 afab 1f1b interleaved; do
  flags="--schedule $schedule"
  [ "$schedule" = interleaved ] && flags="$flags --virtual-stages 2"
  echo "training 08_pipeline $flags"
  # shellcheck disable=SC2086
  mpiexec -n "$pp" ./08_pipeline/train --preset "$preset" --steps "$steps" --pp "$pp" --micro-batches "$m" $flags \
    --json "$out/$schedule.jsonl" --trace "$out/$schedule.trace.json" </dev/null >"$out/$schedule.log" 2>&1 \
    || { echo "  failed: see $out/$schedule.log"; tail -n 5 "$out/$schedule.log"; exit 1; }
  grep -E "^(average over|no measured steps)" "$out/$schedule.log" | sed 's/^/  /'
done
# Per stage F/B/W ms of zb-h1's run (its "pipeline_stage" records, v = 1: one chunk per stage).
measured=$(python3 - "$out/zb-h1.jsonl" <<'EOF'
import json, sys
stages = sorted((r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "pipeline_stage"),
                key=lambda r: r["stage"])
if not stages:
    sys.exit("%s: no pipeline_stage records (did the run finish a measured step?)" % sys.argv[1])
print(",".join("%.6g/%.6g/%.6g" % (r["forward_ms"], r["backward_ms"], r["weight_ms"]) for r in stages))
EOF
)
echo "ideal steps: every schedule simulated with zb-h1's pass times (F/B/W ms per stage: $measured)"
runs=()
for schedule in afab 1f1b interleaved zb-h1; do
  flags="--schedule $schedule"
  [ "$schedule" = interleaved ] && flags="$flags --virtual-stages 2"
  # shellcheck disable=SC2086
  build/pipeline_ideal --preset "$preset" --pp "$pp" --micro-batches "$m" $flags --measured "$measured" \
    --measured-by zb-h1 >"$out/$schedule.ideal.jsonl"
  runs+=("$out/$schedule")
done
python3 scripts/plot_pipeline.py --cores "$cores" --out results/schedules.png "${runs[@]}"
