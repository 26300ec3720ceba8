#!/usr/bin/env bash
# run_tests.sh: runs every test binary listed in tests/manifest.txt (multi-rank ones under mpiexec),
# adds up GoogleTest's own counts and ends with one line: "N passed, M failed".
# A binary that crashes or exits non-zero without a GoogleTest failure counts as one failed test,
# so nothing fails silently.
#
# The jobs (one per binary and rank count, one per script) run in lanes: one more at once than the
# machine has cores (TEST_LANES=1 runs them one after another). Most jobs wait part of the time (on
# messages between ranks, on a process they started), so one job a core still leaves cores idle
# (docs/build_and_tests.md has the measurements). Each job's
# output is printed whole when it ends, so the lines of two jobs never mix. The manifest lists the
# heaviest jobs first, so that no lane is left with a long one at the end.
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
  trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$scratch"' EXIT
fi
trap 'exit 130' INT TERM  # (through the EXIT trap)
export TMPDIR=$scratch
cores=$(nproc 2>/dev/null || echo 1)
lanes=${TEST_LANES:-$((cores + 1))}
[ "$lanes" -ge 1 ] 2>/dev/null || { echo "TEST_LANES must be a whole number of at least 1 (got '$lanes')"; exit 1; }
# A job shares the machine with the other lanes: it may count on its share of the cores only. The
# communicator reads this (common/comm/comm_mpi.cpp) so that its waits do not spin for a message
# while another lane's job could use the core.
export GPT_CORES_PER_JOB=$(( cores / lanes > 0 ? cores / lanes : 1 ))

# CPU seconds (user + system) of every child this shell has waited for, ranks under mpiexec
# included: a job's share is the difference around it. On a busy machine the wall time says how
# loaded the machine was; the CPU time says what the test itself cost.
# (`times` runs in this shell, not in a $(...) subshell, whose children would be none.)
children_cpu() {  # variable to set
  local file=$scratch/.times.$BASHPID  # (this lane's: $BASHPID inside the $(...) below would be another)
  times >"$file"
  printf -v "$1" '%s' "$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] }
                              printf "%.2f", t }' "$file")"
  rm -f "$file"
}

# One job, run in its own lane (a background subshell). It writes its report to $job.out and its
# counts ("passed failed skipped label") to $job.res, which the main loop reads when the job ends.
# Both kinds run their command through run_timed, which sets the caller's rc, wall and cpu.
run_timed() {  # log command...
  local log=$1; shift
  local start=$SECONDS before after; children_cpu before
  "$@" </dev/null >"$log" 2>&1
  rc=$?
  children_cpu after
  wall=$((SECONDS - start))
  cpu=$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.1f", b - a }')
}

run_gtest() {  # job label command...
  local job=$1 label=$2; shift 2
  local log=$job.log rc wall cpu
  run_timed "$log" "$@"
  local p f k
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  k=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  p=${p:-0}; f=${f:-0}; k=${k:-0}
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  {
    echo "=== $label"
    if [ "$f" -ne 0 ]; then
      cat "$log"
    else
      grep -E '^\[ *(OK|SKIPPED) *\]' "$log" | sed 's/^/  /' | head -n 200
      # A skip must say why (no GPU, ...): show the reasons.
      awk 'skip { print "  skipped because: " $0; skip = 0 } /: Skipped$/ { skip = 1 }' "$log" | sort -u | head -n 3
    fi
    echo "--- $label: $p passed, $f failed, $k skipped ($wall s, CPU $cpu s)"
  } >"$job.out"
  echo "$p $f $k $label" >"$job.res"
}

run_script() {  # job label command...
  local job=$1 label=$2; shift 2
  local rc wall cpu result p=0 f=0
  run_timed "$job.log" "$@"
  if [ "$rc" -eq 0 ]; then p=1; result=passed; else f=1; result=FAILED; fi
  {
    echo "=== $label"
    cat "$job.log"
    echo "--- $label: $result ($wall s, CPU $cpu s)"
  } >"$job.out"
  echo "$p $f 0 $label" >"$job.res"
}

# The jobs, in the manifest's order: "kind<TAB>label<TAB>command".
jobs_list=()
missing=()
while read -r name mode ranks; do
  case "$name" in ''|'#'*) continue ;; esac
  # TESTS="test_comm test_devices ..." runs only those (a machine lent for minutes, say).
  if [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $name "* ]]; then continue; fi
  if [ "$mode" = "script" ]; then
    jobs_list+=("script"$'\t'"$name"$'\t'"$ranks")
    continue
  fi
  bin=build/tests/$name
  if [ ! -x "$bin" ]; then
    missing+=("$name"); continue
  fi
  if [ "$mode" = "plain" ]; then
    jobs_list+=("gtest"$'\t'"$name"$'\t'"$bin")
  else
    for n in $ranks; do
      jobs_list+=("gtest"$'\t'"$name (mpiexec -n $n)"$'\t'"timeout 300 mpiexec -n $n $bin")
    done
  fi
done < tests/manifest.txt

passed=0
failed=0
skipped=0
failures=()
for name in "${missing[@]}"; do
  echo "=== $name: missing binary build/tests/$name (did 'make tests' fail?)"
  failed=$((failed + 1)); failures+=("$name (not built)")
done

# Prints and counts every job that has ended and was not yet reported.
reported=0
report_ended() {
  local job
  for job in "$scratch"/job.*.res; do
    [ -e "$job" ] || continue
    local base=${job%.res} p f k label
    read -r p f k label <"$job"
    cat "$base.out"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + k))
    [ "$f" -ne 0 ] && failures+=("$label")
    rm -f "$job" "$base.out" "$base.log"
    reported=$((reported + 1))
  done
}

next=0
running=0
for entry in "${jobs_list[@]}"; do
  IFS=$'\t' read -r kind label command <<<"$entry"
  while [ "$running" -ge "$lanes" ]; do
    wait -n
    running=$((running - 1))
    report_ended
  done
  job=$(printf '%s/job.%04d' "$scratch" "$next")
  next=$((next + 1))
  # (word splitting of $command is intended: a manifest line's command has no quoted words)
  if [ "$kind" = script ]; then
    run_script "$job" "$label" $command &
  else
    run_gtest "$job" "$label" $command &
  fi
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n
  running=$((running - 1))
  report_ended
done
report_ended
# A job whose lane died without a result (a kill from outside) counts as failed.
if [ "$reported" -lt "${#jobs_list[@]}" ]; then
  failed=$((failed + ${#jobs_list[@]} - reported)); failures+=("$(( ${#jobs_list[@]} - reported )) jobs without a result")
fi

if [ ${#failures[@]} -gt 0 ]; then
  echo "failed: ${failures[*]}"
fi
children_cpu cpu_after
echo "$passed passed, $failed failed, $skipped skipped ($SECONDS s, CPU $(awk -v b="$cpu_after" 'BEGIN { printf "%.0f", b }') s, $lanes lanes)"
[ "$failed" -eq 0 ]
