#!/usr/bin/env bash
# matmul_ab.sh: the CPU matrix products of the working tree against those of another commit, one layer's
# 15 products at small's shapes (ROWS=1024) or deep's (ROWS=512), in one program (matmul_ab.cpp): the
# two builds called alternately, by the thread's CPU time, warm or cold (COLD=1). Both sides are compiled
# with loops and functions aligned to 64 bytes: otherwise where the linker happens to place a loop moves
# a product by up to 8% between two builds of the same source, and that would be read as the change.
# Usage: scripts/bench/matmul_ab.sh REV   (e.g. main, or a commit); ROWS=1024 CALLS=31 COLD=0 RUNS=3.
# Builds in build/matmul_ab/. Prints one table per run; read the changes that hold in every run.
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:?usage: scripts/bench/matmul_ab.sh REV (the commit to compare the working tree with)}
rows=${ROWS:-1024}
calls=${CALLS:-31}
runs=${RUNS:-3}
mode=warm
[ "${COLD:-0}" = 0 ] || mode=cold
out=build/matmul_ab
mkdir -p "$out"
git show "$rev:common/ops/matmul_cpu.cpp" >"$out/before.cpp" \
  || { echo "matmul_ab.sh: no common/ops/matmul_cpu.cpp at $rev"; exit 1; }
# The other commit's functions become before_*, and its anonymous namespace a named one, so that both
# builds link into one program.
sed -i -e 's/^void sgemm_cpu\(_bias\|_sum_a\|_epilogue\)\?(/void before_sgemm_cpu\1(/' \
  -e 's/^namespace {/namespace before {/' -e 's|^}  // namespace$|}  // namespace before\nusing namespace before;|' \
  "$out/before.cpp"
flags="-O3 ${ARCH:--march=native} -fno-math-errno -fno-trapping-math -std=c++17 -falign-loops=64 -falign-functions=64 -Icommon"
${CXX:-g++} $flags -c "$out/before.cpp" -o "$out/before.o"
${CXX:-g++} $flags -c common/ops/matmul_cpu.cpp -o "$out/after.o"
${CXX:-g++} $flags -Wall -Wextra scripts/bench/matmul_ab.cpp "$out/before.o" "$out/after.o" -o "$out/matmul_ab"
echo "== one layer's products, $rev (before) against the working tree (after), ROWS=$rows, $mode, $calls calls each"
echo "   load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq "$runs"); do
  echo "-- run $run/$runs"
  "$out/matmul_ab" "$rows" "$calls" "$mode"
done
