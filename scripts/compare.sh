#!/usr/bin/env bash
# compare.sh: the main job. Trains every chapter that exists with the default configuration, on one
# rank and on two, then prints one table side by side and writes plots (scripts/compare.py).
# Results land in results/: one JSON-lines file per run, logs, the table (compare.txt) and PNGs.
# Environment: RANKS="1 2" (rank counts), STEPS=30, EXTRA="--link-gbps 1" (flags for every run).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-"1 2"}
steps=${STEPS:-30}
extra=${EXTRA:-}
mkdir -p results
rm -f results/*.jsonl results/*.trace.json
for chapter in $(ls -d [0-9][0-9]_*/ | tr -d /); do
  [ -x "$chapter/train" ] || continue
  for n in $ranks; do
    run="${chapter}_n${n}"
    echo "training $chapter on $n rank(s): mpiexec -n $n ./$chapter/train --steps $steps $extra"
    # shellcheck disable=SC2086
    mpiexec -n "$n" "./$chapter/train" --steps "$steps" --json "results/$run.jsonl" \
      --trace "results/$run.trace.json" $extra </dev/null >"results/$run.log" 2>&1 \
      || { echo "  failed: see results/$run.log"; tail -n 5 "results/$run.log"; exit 1; }
    tail -n 1 "results/$run.log" | sed 's/^/  /'
  done
done
python3 scripts/compare.py results | tee results/compare.txt
# One step of every chapter's 2-rank run, one above the other: where communication sits in time.
traces=$(ls results/*_n2.trace.json 2>/dev/null | sort || true)
if [ -n "$traces" ]; then
  # shellcheck disable=SC2086
  python3 scripts/plot_timeline.py --out results/timeline.png $traces
fi
