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

run_one() {  # label, command...
  local label=$1; shift
  local log; log=$(mktemp)
  echo "=== $label"
  local start=$SECONDS
  "$@" </dev/null >"$log" 2>&1
  local rc=$?
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
  echo "--- $label: $p passed, $f failed, $k skipped ($((SECONDS - start)) s)"
  rm -f "$log"
}

while read -r name mode ranks; do
  case "$name" in ''|'#'*) continue ;; esac
  # TESTS="test_comm test_devices ..." runs only those (a machine lent for minutes, say).
  if [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $name "* ]]; then continue; fi
  if [ "$mode" = "script" ]; then
    echo "=== $name"
    if $ranks </dev/null; then passed=$((passed + 1)); echo "--- $name: passed"
    else failed=$((failed + 1)); failures+=("$name"); echo "--- $name: FAILED"; fi
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
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
