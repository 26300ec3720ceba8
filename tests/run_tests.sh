#!/usr/bin/env bash
# run_tests.sh: runs every test binary listed in tests/manifest.txt (multi-rank ones under mpiexec),
# adds up GoogleTest's own counts and ends with one line: "N passed, M failed".
# A binary that crashes or exits non-zero without a GoogleTest failure counts as one failed test,
# so nothing fails silently.
set -u
cd "$(dirname "$0")/.."
# One temporary folder for the whole run, removed however the run ends: every test's files go under
# it (TMPDIR, which the harness's temp_dir() and mktemp honour), so a binary that crashes or is
# killed by its time limit, and so never removes its own folders, leaves nothing behind either.
# GPT_TEST_KEEP=1 keeps it, for a look after a failure.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpt_run_tests.XXXXXX") || { echo "cannot create a temporary folder"; exit 1; }
if [ -n "${GPT_TEST_KEEP:-}" ]; then
  trap 'echo "temporary files kept in $scratch"' EXIT
else
  trap 'rm -rf "$scratch"' EXIT
fi
trap 'exit 130' INT TERM  # (through the EXIT trap)
export TMPDIR=$scratch
passed=0
failed=0
skipped=0
failures=()

# CPU seconds (user + system) of every child this shell has waited for, ranks under mpiexec
# included: a binary's share is the difference around it. On a busy machine the wall time says how
# loaded the machine was; the CPU time says what the test itself cost.
# (`times` runs in this shell, not in a $(...) subshell, whose children would be none.)
children_cpu() {  # variable to set
  times >"$scratch/.times"
  printf -v "$1" '%s' "$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] }
                              printf "%.2f", t }' "$scratch/.times")"
}

run_one() {  # label, command...
  local label=$1; shift
  local log; log=$(mktemp)
  echo "=== $label"
  local start=$SECONDS cpu_before cpu_after; children_cpu cpu_before
  "$@" </dev/null >"$log" 2>&1
  local rc=$?
  children_cpu cpu_after
  local cpu; cpu=$(awk -v a="$cpu_before" -v b="$cpu_after" 'BEGIN { printf "%.1f", b - a }')
  local p f
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  local k
  k=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  p=${p:-0}; f=${f:-0}; k=${k:-0}
  skipped=$((skipped + k))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$f" -ne 0 ]; then
    failures+=("$label")
    cat "$log"
  else
    grep -E '^\[ *(OK|SKIPPED) *\]' "$log" | sed 's/^/  /' | head -n 200
    # A skip must say why (no GPU, ...): show the reasons.
    awk 'skip { print "  skipped because: " $0; skip = 0 } /: Skipped$/ { skip = 1 }' "$log" | sort -u | head -n 3
  fi
  echo "--- $label: $p passed, $f failed, $k skipped ($((SECONDS - start)) s, CPU $cpu s)"
  rm -f "$log"
}

while read -r name mode ranks; do
  case "$name" in ''|'#'*) continue ;; esac
  # TESTS="test_comm test_devices ..." runs only those (a machine lent for minutes, say).
  if [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $name "* ]]; then continue; fi
  if [ "$mode" = "script" ]; then
    echo "=== $name"
    start=$SECONDS; children_cpu cpu_before
    if $ranks </dev/null; then passed=$((passed + 1)); result=passed
    else failed=$((failed + 1)); failures+=("$name"); result=FAILED; fi
    children_cpu cpu_after
    echo "--- $name: $result ($((SECONDS - start)) s, CPU $(awk -v a="$cpu_before" -v b="$cpu_after" 'BEGIN { printf "%.1f", b - a }') s)"
    continue
  fi
  bin=build/tests/$name
  if [ ! -x "$bin" ]; then
    echo "=== $name: missing binary $bin (did 'make tests' fail?)"
    failed=$((failed + 1)); failures+=("$name (not built)")
    continue
  fi
  if [ "$mode" = "plain" ]; then
    run_one "$name" "$bin"
  else
    for n in $ranks; do
      run_one "$name (mpiexec -n $n)" timeout 300 mpiexec -n "$n" "$bin"
    done
  fi
done < tests/manifest.txt

if [ ${#failures[@]} -gt 0 ]; then
  echo "failed: ${failures[*]}"
fi
children_cpu cpu_after
echo "$passed passed, $failed failed, $skipped skipped ($SECONDS s, CPU $(awk -v b="$cpu_after" 'BEGIN { printf "%.0f", b }') s)"
[ "$failed" -eq 0 ]
