#!/usr/bin/env bash
# collectives.sh: `make collectives`. Chapter 00's program at each rank count in COLL_RANKS, over MPI's
# own transport (shared memory on one machine) and over the emulated link, every size from 4 B to
# COLL_MAX; then results/collectives.png (scripts/bench/plot_collectives.py): bus bandwidth against size per
# algorithm, measured as points and modelled as lines, so the crossover from the latency-bound doubling
# and tree to the bandwidth-bound ring shows. Read it with docs/collectives.md.
#   results/collectives/<link>_n<N>.{jsonl,log}   one run each
# Settings: COLL_RANKS="2 4 8", COLL_MAX=67108864, COLL_LINK="--link-gbps 10 --link-latency-us 20",
# COLL_BUDGET_MB=64 (bytes reduced per size and algorithm: more calls, steadier medians), COLL_BRIEF=1
# (print each run's constants, crossovers and model errors, not its tables: make compare's form).
# With fewer cores than ranks, ranks take turns on a core: the times stretch, the bytes do not.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${COLL_RANKS:-"2 4 8"}
max=${COLL_MAX:-67108864}
link=${COLL_LINK:-"--link-gbps 10 --link-latency-us 20"}
budget=${COLL_BUDGET_MB:-64}
out=results/collectives
[ -x 00_collectives/collectives ] || { echo "00_collectives/collectives is missing: run make 00_collectives"; exit 1; }
echo "collectives: 00_collectives at ${ranks// / and } ranks, 4 B to $max B, over shared memory and over '$link'"
echo "  (COLL_RANKS=, COLL_MAX=, COLL_LINK=, COLL_BUDGET_MB= change it)"
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.log results/collectives.png
runs=()
for n in $ranks; do
  [ "$n" -gt "$(nproc)" ] && echo "  note: $n ranks on $(nproc) cores: ranks take turns, times stretch"
  for where in shm link; do
    name="$out/${where}_n$n"
    flags=""
    [ "$where" = link ] && flags=$link
    echo "--- $n ranks, $([ "$where" = shm ] && echo "shared memory" || echo "emulated link: $link")"
    # shellcheck disable=SC2086
    mpiexec -n "$n" ./00_collectives/collectives --max-bytes "$max" --budget-mb "$budget" $flags \
      --json "$name.jsonl" </dev/null >"$name.log" 2>&1 \
      || { echo "  failed: see $name.log"; tail -n 5 "$name.log"; exit 1; }
    if [ -n "${COLL_BRIEF:-}" ]; then  # make compare: the constants, the crossovers and the model's error
      sed -n '1,2p; /^fastest algorithm/,$p' "$name.log"
    else
      cat "$name.log"
    fi
    runs+=("$name.jsonl")
  done
done
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 scripts/bench/plot_collectives.py --out results/collectives.png "${runs[@]}"
else
  echo "matplotlib missing: no plot (make deps installs it)"
fi
