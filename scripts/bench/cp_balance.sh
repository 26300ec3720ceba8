#!/usr/bin/env bash
# cp_balance.sh: `make cp-balance`, and the end of `make compare`. Chapter 10 on rings of each size in
# CPS (as many ranks), contiguous and zig-zag, alternated, on a long context where attention is a
# large part of the step; then results/cp_balance.png (scripts/bench/plot_cp_balance.py): each rank's
# attention FLOPs next to the formula, its time in the kernels and idle in the ring, and the step time
# of each split. Read it with docs/context_parallel.md.
#   results/cp_balance/cp<N>_<split>.{jsonl,log}   one run each
# Settings: CPS="2 4", PRESET=long (T = 1024), BATCH=2, STEPS=4 (step 0 is warm-up), EXTRA= more flags.
# With fewer cores than ranks, ranks take turns on a core: the times stretch (the FLOPs do not).
set -euo pipefail
cd "$(dirname "$0")/../.."
cps=${CPS:-"2 4"}
preset=${PRESET:-long}
batch=${BATCH:-2}
steps=${STEPS:-4}
extra=${EXTRA:-}
out=results/cp_balance
[ -x 10_context_parallel/train ] || { echo "10_context_parallel/train is missing: run make 10_context_parallel"; exit 1; }
echo "cp-balance: 10_context_parallel at --cp ${cps// / and }, contiguous and zigzag, --preset $preset --batch $batch --steps $steps $extra"
echo "  (CPS=, PRESET=, BATCH=, STEPS=, EXTRA= change it)"
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.log results/cp_balance.png
runs=()
for cp in $cps; do
  [ "$cp" -gt "$(nproc)" ] && echo "  note: $cp ranks on $(nproc) cores: ranks take turns, times stretch"
  for split in contiguous zigzag; do
    name="$out/cp${cp}_$split"
    printf "training --cp %s --cp-split %s ..." "$cp" "$split"
    # shellcheck disable=SC2086
    mpiexec -n "$cp" ./10_context_parallel/train --device cpu --preset "$preset" --batch "$batch" --steps "$steps" \
      --cp "$cp" --cp-split "$split" $extra --json "$name.jsonl" </dev/null >"$name.log" 2>&1 \
      || { echo; echo "  failed: see $name.log"; tail -n 5 "$name.log"; exit 1; }
    # The median step, as the plot draws it (the run's own summary line gives the mean).
    python3 -c 'import json, statistics, sys
steps = [r["step_ms"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step" and r["step"] > 0]
print(" median %.1f ms/step over %d measured steps" % (statistics.median(steps), len(steps)) if steps else " no measured steps")' "$name.jsonl"
    sed -n '/^ring attention per rank/,/ring bytes per rank/p' "$name.log" | sed 's/^/  /'
    runs+=("$name.jsonl")
  done
done
python3 scripts/bench/plot_cp_balance.py --out results/cp_balance.png "${runs[@]}"
