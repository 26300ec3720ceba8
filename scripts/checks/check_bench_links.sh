#!/usr/bin/env bash
# check_bench_links.sh (a test, tests/manifest.txt): `make bench` links the matmul benchmark against
# OpenBLAS. Where OpenBLAS is installed, the benchmark must build and link; where it is not, the
# dependency step must plan to install it, even when another BLAS's cblas.h is present (the reference
# BLAS ships one, without the OpenBLAS library the benchmark links).
set -u
cd "$(dirname "$0")/../.."
if pkg-config --exists openblas 2>/dev/null; then
  make --no-print-directory -s build/matmul_bench >/dev/null 2>&1 || { echo "FAILED: build/matmul_bench does not build"; exit 1; }
  echo "OpenBLAS found: build/matmul_bench builds and links"
else
  plan=$(scripts/setup/ensure_deps.sh --bench --dry-run)
  case "$plan" in
    *libopenblas-dev*) echo "OpenBLAS missing: make bench will install it ($plan)" ;;
    *) echo "FAILED: OpenBLAS is missing but make bench would not install it ($plan)"; exit 1 ;;
  esac
fi
