#!/usr/bin/env bash
# schedules.sh: `make schedules`. Chapter 08's six pipeline schedules (afab, 1f1b, interleaved,
# zb-h1, zb-v, dualpipev), one run each on the same model and batch, drawn as the classic pipeline diagram
# (scripts/bench/plot_pipeline.py): per schedule, the measured step from the trace next to the ideal one,
# simulated (build/pipeline_ideal) with one set of pass times for all six: zb-h1's run, the one that
# times the inputs' gradients (B) and the weights' (W) apart, measures F, B and W summed over its
# stages, and each schedule's stages get their share by FLOPs (common/pipeline/pipeline_costs.h; the others'
# backward is B + W). Each run's own pass times differ by the noise of its run (more so with ranks
# taking turns on a core), which would order the ideal steps by noise; the same times order them by
# schedule alone, as the theory does. Read it with the lists of actions in common/schedule/pipeline_schedule.cpp.
#   results/schedules/<schedule>.{jsonl,trace.json,log}   one run each
#   results/schedules/<schedule>.ideal.jsonl              its ideal step, simulated with zb-h1's pass times
#   results/schedules.png                                  the diagram, one row per schedule
# Settings: PP=4 stages (as many ranks), M=8 micro-batches (a multiple of PP for interleaved, which
# runs with v = 2 chunks per rank), PRESET=deep (12 blocks: 4 stages x 2 chunks fit), STEPS=10.
# PLOT_ONLY=1 draws again from the runs already in results/schedules (the ideal steps included), without
# training. With fewer cores than PP ranks the ranks take turns on a core and the measured panels stretch;
# the ideal ones are the schedule without that noise (the plot's titles say when it happened).
set -euo pipefail
cd "$(dirname "$0")/../.."
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
[ -x build/pipeline_ideal ] || { echo "build/pipeline_ideal is missing: run make schedules (it builds it)"; exit 1; }
[ "${PLOT_ONLY:-}" = 1 ] || rm -f "$out"/*.jsonl "$out"/*.trace.json "$out"/*.log results/schedules.png
# zb-h1 first: its pass times are every schedule's ideal's.
for schedule in zb-h1 afab 1f1b interleaved zb-v dualpipev; do
  [ "${PLOT_ONLY:-}" = 1 ] && break
  flags="--schedule $schedule"
  [ "$schedule" = interleaved ] && flags="$flags --virtual-stages 2"
  echo "training 08_pipeline $flags"
  # shellcheck disable=SC2086
  mpiexec -n "$pp" ./08_pipeline/train --preset "$preset" --steps "$steps" --pp "$pp" --micro-batches "$m" $flags \
    --json "$out/$schedule.jsonl" --trace "$out/$schedule.trace.json" </dev/null >"$out/$schedule.log" 2>&1 \
    || { echo "  failed: see $out/$schedule.log"; tail -n 5 "$out/$schedule.log"; exit 1; }
  grep -E "^(average over|no measured steps)" "$out/$schedule.log" | sed 's/^/  /'
done
# zb-h1's F/B/W ms of one micro-batch through the whole model: its "pipeline_stage" records summed.
measured=$(python3 - "$out/zb-h1.jsonl" <<'EOF'
import json, sys
stages = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "pipeline_stage"]
if not stages:
    sys.exit("%s: no pipeline_stage records (did the run finish a measured step?)" % sys.argv[1])
print("/".join("%.6g" % sum(r[k] for r in stages) for k in ("forward_ms", "backward_ms", "weight_ms")))
EOF
)
echo "ideal steps: every schedule simulated with zb-h1's pass times (F/B/W ms through the whole model: $measured)"
runs=()
for schedule in afab 1f1b interleaved zb-h1 zb-v dualpipev; do
  flags="--schedule $schedule"
  [ "$schedule" = interleaved ] && flags="$flags --virtual-stages 2"
  # shellcheck disable=SC2086
  build/pipeline_ideal --preset "$preset" --pp "$pp" --micro-batches "$m" $flags --measured "$measured" \
    --measured-by zb-h1 >"$out/$schedule.ideal.jsonl"
  runs+=("$out/$schedule")
done
python3 scripts/bench/plot_pipeline.py --cores "$cores" --out results/schedules.png "${runs[@]}"
