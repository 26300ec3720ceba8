#!/usr/bin/env bash
# gpu_bundle.sh: packs what scripts/gpu/gpu_check.sh runs into one folder, for a GPU machine that has the
# NVIDIA driver and CUDA libraries but neither a compiler for this project nor MPICH: the programs of
# one build (the chapters, chapter 00's benchmark, the planner, the tests, the CUDA lesson) laid out as in the repository, and
# the MPI runtime they link (MPICH's libraries, the libraries those need, and its launcher).
#
# Usage: scripts/gpu/gpu_bundle.sh BUILD_DIR OUT_DIR
#   BUILD_DIR  the build folder the programs came from (make BUILD=... tests), e.g. build/gpu
#   OUT_DIR    emptied, then filled with tree/ (programs at their repository paths), lib/ and bin/;
#              OUT_DIR.tar.gz holds the same
# On the GPU machine: GPU_BUNDLE=OUT_DIR (or OUT_DIR.tar.gz) scripts/gpu/gpu_check.sh copies tree/ into the
# checkout and puts lib/ and bin/ first on the library and command paths.
#
# Build for the GPU machine's processor and GPU, not this one's: -march=native would use whatever
# this CPU has (another vendor's extensions included), so name a level every x86-64 server of the
# last decade has:
#   make BUILD=build/gpu ARCH=-march=x86-64-v3 CUDA_ARCH="-gencode arch=compute_90,code=sm_90" tests
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { echo "usage: scripts/gpu/gpu_bundle.sh BUILD_DIR OUT_DIR"; exit 1; }
build=$1 out=$2
[ -d "$build/tests" ] || { echo "gpu_bundle.sh: $build/tests not found: build first (see the top of this file)"; exit 1; }
rm -rf "$out"
mkdir -p "$out/tree/build/tests" "$out/lib" "$out/bin"

# Programs. They carry no debug information worth the bytes (the CUDA code inside stays whole).
programs=()
for program in [0-9][0-9]_*/train 00_collectives/collectives 09_3d_parallel/plan lessons/matmul/matmul_lesson; do
  [ -x "$program" ] || continue
  mkdir -p "$out/tree/$(dirname "$program")"
  cp "$program" "$out/tree/$program"
  programs+=("$out/tree/$program")
done
for program in "$build"/tests/test_*; do
  case "$program" in *.o|*.d) continue ;; esac
  cp "$program" "$out/tree/build/tests/"
  programs+=("$out/tree/build/tests/$(basename "$program")")
done
if [ -x "$build/kernel_variants" ]; then
  cp "$build/kernel_variants" "$out/tree/build/"
  programs+=("$out/tree/build/kernel_variants")
fi
if [ -x "$build/fp8_products" ]; then
  cp "$build/fp8_products" "$out/tree/build/"
  programs+=("$out/tree/build/fp8_products")
fi
if [ -x "$build/pipeline_ideal" ]; then
  cp "$build/pipeline_ideal" "$out/tree/build/"
  programs+=("$out/tree/build/pipeline_ideal")
fi
strip --strip-unneeded "${programs[@]}"

# The MPI runtime: every library the programs and the launcher load that is neither the C and C++
# runtime (the GPU machine has its own, as new or newer) nor CUDA's (the GPU machine's own must
# match its driver).
launcher=$(readlink -f "$(command -v mpiexec)")
proxy=$(dirname "$launcher")/hydra_pmi_proxy
cp "$launcher" "$out/bin/mpiexec"
cp "$proxy" "$out/bin/"
is_system_lib() {
  case "$(basename "$1")" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda*|libcublas*|libnccl*|libnvidia*) return 0 ;;
  esac
  return 1
}
pending=("${programs[0]}" "$out/bin/mpiexec" "$out/bin/hydra_pmi_proxy")
declare -A copied=()
while [ ${#pending[@]} -gt 0 ]; do
  file=${pending[0]}; pending=("${pending[@]:1}")
  while read -r lib; do
    [ -n "$lib" ] && [ -f "$lib" ] || continue
    is_system_lib "$lib" && continue
    name=$(basename "$lib")
    [ -n "${copied[$name]:-}" ] && continue
    copied[$name]=1
    cp -L "$lib" "$out/lib/$name"
    strip --strip-unneeded "$out/lib/$name" 2>/dev/null || true
    pending+=("$out/lib/$name")
  done < <(ldd "$file" 2>/dev/null | awk '$2 == "=>" { print $3 }')
done
# UCX (MPICH's transport here) loads its transports as modules from a folder beside libucs.
ucx_modules=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libucs.so.0 / { print $NF; exit }')")")/ucx
if [ -d "$ucx_modules" ]; then
  mkdir -p "$out/lib/ucx"
  cp -L "$ucx_modules"/*.so.0 "$out/lib/ucx/" 2>/dev/null || true
fi
# One compressed file as well, a quarter of the bytes, for a machine the bundle must be copied to.
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "gpu_bundle.sh: $out (and $out.tar.gz, $(du -h "$out.tar.gz" | cut -f1)) holds ${#programs[@]} programs and ${#copied[@]} libraries ($(du -sh "$out" | cut -f1))"
