#!/usr/bin/env bash
# test_busy.sh (make test-busy): the test suite on a machine whose cores are all busy. Starts LOAD
# CPU-bound processes (yes > /dev/null; default 2, the cores of a small machine) and runs the whole
# suite (tests/run_tests.sh) RUNS times in a row beside them (default 2), then prints each run's
# result and time. Tests that wait for another process (its end, a file it writes, a step it
# reaches) must pass here as on a quiet machine: they poll with generous bounds (wait_until in
# tests/training_harness.h) instead of looking once. CI runs the plain make test; this is the check
# to repeat after changing such a test. Exits non-zero when any run failed.
# The load ends with this script, however it ends: an EXIT trap kills it, and each load process is
# started with a parent-death signal where setpriv exists, so that even a kill -9 of the script
# takes it along.
set -u
cd "$(dirname "$0")/../.."
load=${LOAD:-2}
runs=${RUNS:-2}
load_pids=()
stop_load() {
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${load_pids[@]}"; do wait "$pid" 2>/dev/null; done
  load_pids=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM HUP  # (through the EXIT trap)

die_with_us=()
setpriv --pdeathsig KILL true 2>/dev/null && die_with_us=(setpriv --pdeathsig KILL --)
for ((i = 0; i < load; i++)); do
  "${die_with_us[@]}" yes >/dev/null &
  load_pids+=($!)
done
echo "make test-busy: $load CPU-bound processes (yes > /dev/null) on $(nproc) cores, beside $runs runs of the tests"
echo "  load before: $(cut -d' ' -f1-3 /proc/loadavg)"

results=()
failed=0
for ((run = 1; run <= runs; run++)); do
  echo "=== busy run $run of $runs"
  log=$(mktemp)
  start=$SECONDS
  tests/run_tests.sh 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  seconds=$((SECONDS - start))
  summary=$(tail -n 1 "$log")
  rm -f "$log"
  results+=("run $run: $summary in $((seconds / 60))m$((seconds % 60))s, load $(cut -d' ' -f1 /proc/loadavg)")
  [ "$rc" -eq 0 ] || failed=1
done
stop_load
echo "=== make test-busy: $load CPU-bound processes beside the tests"
for line in "${results[@]}"; do echo "  $line"; done
exit "$failed"
