#!/usr/bin/env bash
# ensure_deps.sh: installs what a fresh Debian/Ubuntu machine lacks to build and run the project,
# saying what it installs: MPICH (mpicxx, mpiexec), GoogleTest, and matplotlib for the plots.
# With --bench, also OpenBLAS (used only by the matmul benchmark, never by the framework).
# With --dry-run, only prints the system packages it would install.
# The CUDA toolkit and NCCL are optional: the Makefile adds the CUDA build where nvcc exists.
set -euo pipefail
bench=no
dry_run=no
for arg in "$@"; do
  case "$arg" in
    --bench) bench=yes ;;
    --dry-run) dry_run=yes ;;
    *) echo "ensure_deps.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

apt_packages=()
command -v mpicxx >/dev/null 2>&1 || apt_packages+=(mpich libmpich-dev)
[ -f /usr/include/gtest/gtest.h ] || apt_packages+=(libgtest-dev)
if [ "$bench" = yes ]; then
  # OpenBLAS itself: a cblas.h alone may be the reference BLAS's, which has no libopenblas to link.
  pkg-config --exists openblas 2>/dev/null || apt_packages+=(libopenblas-dev pkg-config)
fi
command -v python3 >/dev/null 2>&1 || apt_packages+=(python3 python3-pip)

if [ "$dry_run" = yes ]; then
  echo "would install: ${apt_packages[*]:-nothing}"
  exit 0
fi

if [ ${#apt_packages[@]} -gt 0 ]; then
  echo "installing missing system packages: ${apt_packages[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  echo "installing missing Python package: matplotlib"
  python3 -m pip install -q matplotlib 2>/dev/null \
    || python3 -m pip install -q --user matplotlib 2>/dev/null \
    || { sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"; DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-matplotlib >/dev/null; }
fi
