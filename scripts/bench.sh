#!/usr/bin/env bash
# bench.sh: `make bench`. Prints one-rank training throughput of the tiny preset, then the CPU matmul
# next to OpenBLAS single-threaded sgemm on the model's GEMM shapes (OpenBLAS appears only here).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== one-rank training throughput (tiny preset, 30 steps, step 0 excluded)"
mpiexec -n 1 ./01_vanilla_dp/train --steps 30 </dev/null | grep "^average over"
echo
echo "== CPU matmul vs OpenBLAS (single thread)"
OPENBLAS_NUM_THREADS=1 ./build/matmul_bench
