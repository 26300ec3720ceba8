#!/usr/bin/env bash
# ensure_deps.sh: installs what a fresh Debian/Ubuntu machine lacks to build and run the project,
# saying what it installs: MPICH (mpicxx, mpiexec), GoogleTest, and matplotlib for the plots.
# With --bench, also OpenBLAS (used only by the matmul benchmark, never by the framework).
# The CUDA toolkit and NCCL are optional: the Makefile adds the CUDA build where nvcc exists.
set -euo pipefail

apt_packages=()
command -v mpicxx >/dev/null 2>&1 || apt_packages+=(mpich libmpich-dev)
[ -f /usr/include/gtest/gtest.h ] || apt_packages+=(libgtest-dev)
if [ "${1:-}" = "--bench" ]; then
  [ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || ls /usr/include/*/cblas.h >/dev/null 2>&1 \
    || apt_packages+=(libopenblas-dev)
fi
command -v python3 >/dev/null 2>&1 || apt_packages+=(python3 python3-pip)

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
