#!/usr/bin/env bash
# scripts/bench/checkpoint_bench.sh: `make bench-checkpoint` (and `make elastic`, --elastic-only).
# Prints, for chapter 04 (ZeRO-1) on PRESET (default deep): the save and load time and the peak memory
# (largest resident set of any rank, /usr/bin/time) at 2, 4 and 8 ranks, the single file against the
# sharded folder; the step time with an asynchronous save in flight against without; the time from a
# killed rank to training again under scripts/elastic/elastic.sh; then the estimate at the published
# scales (build/checkpoint_scale). Times are one run each on this machine: a table to read, not a test.
set -u
cd "$(dirname "$0")/../.." || exit 1
PRESET="${PRESET:-deep}" RANKS="${RANKS:-2 4 8}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/bench_checkpoint.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
field() { grep -o "\"$2\":[0-9.eE+-]*" "$1" | head -1 | cut -d: -f2; }
# Largest "rss_kb N" that /usr/bin/time printed for a rank, in MB.
peak_mb() { awk '$1 == "rss_kb" && $2 > m { m = $2 } END { printf "%.0f", m / 1024 }' "$1"; }
run() {  # ranks, output file, trainer flags...
  local n="$1" out="$2"; shift 2
  timeout 600 mpiexec -n "$n" /usr/bin/time -f "rss_kb %M" ./04_zero1/train --preset "$PRESET" --quiet --device cpu "$@" > "$out" 2>&1
}

elastic() {
  local e="$dir/elastic"
  scripts/elastic/elastic.sh --grids "4:;2:" --retries 2 --dir "$e" 04_zero1 --preset tiny --steps 40 --save-every 4 \
    --quiet --device cpu --link-latency-us 20000 > "$dir/elastic.out" 2>&1 &
  local launcher=$!
  for _ in $(seq 600); do [ -f "$e/ckpt/checkpoint.meta" ] && break; sleep 0.1; done
  local victim
  victim="$(pgrep -f "04_zero1/train.*$e" | tail -1)"
  local killed
  killed="$(date +%s.%N)"
  [ -n "$victim" ] && kill -9 "$victim"
  # Training again: the next attempt's first step record.
  local again=""
  for _ in $(seq 1200); do
    if cat "$e"/attempt1.jsonl "$e"/attempt1.jsonl.tmp.* 2>/dev/null | grep -q '"type":"step"'; then again="$(date +%s.%N)"; break; fi
    sleep 0.05
  done
  wait "$launcher"
  grep "restart" "$e/elastic.log"
  [ -n "$again" ] && awk -v a="$killed" -v b="$again" 'BEGIN { printf "time from the killed rank to the first step of the restarted run: %.1f s\n", b - a }'
}

if [ "${1:-}" = "--elastic-only" ]; then elastic; exit 0; fi

echo "checkpoints of --preset $PRESET in 04_zero1 (one run each; save and load: rank 0's timing; peak: largest rank RSS)"
printf "%-6s %-7s %10s %10s %12s %12s\n" ranks form save_ms load_ms peak_save_MB peak_load_MB
for n in $RANKS; do
  for form in file folder; do
    # Saved after step 2 of 4 (and at the end), resumed from the first.
    pattern="$dir/c${n}_{step}.bin" path="$dir/c${n}_2.bin"
    [ "$form" = folder ] && pattern="$dir/c${n}_{step}/" path="$dir/c${n}_2/"
    run "$n" "$dir/s.out" --steps 4 --save-every 2 --save "$pattern" --json "$dir/s.jsonl" || { tail -3 "$dir/s.out"; continue; }
    save_ms="$(field "$dir/s.jsonl" save_ms)" peak_save="$(peak_mb "$dir/s.out")"
    run "$n" "$dir/l.out" --steps 4 --resume "$path" || { tail -3 "$dir/l.out"; continue; }
    load_ms="$(grep -o 'resumed from .* in [0-9.]* ms' "$dir/l.out" | grep -o '[0-9.]* ms' | cut -d' ' -f1)"
    printf "%-6s %-7s %10.1f %10.1f %12s %12s\n" "$n" "$form" "$save_ms" "$load_ms" "$peak_save" "$(peak_mb "$dir/l.out")"
  done
done
echo
run 2 "$dir/a.out" --steps 12 --save "$dir/a/" --save-every 2 --async-save --json "$dir/a.jsonl"
grep "step time with an asynchronous save" "$dir/a.out"
echo
elastic
echo
build/checkpoint_scale
