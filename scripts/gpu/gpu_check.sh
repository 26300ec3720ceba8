#!/usr/bin/env bash
# gpu_check.sh: everything that needs a GPU, once, in one command, on a machine with one NVIDIA GPU.
# It never stops at a failure: each case is recorded (pass, FAIL or its reason) and the next one runs.
#   1. the GPU tests: test_cuda_ops, test_flash_attention, test_devices (they skip without a GPU);
#   2. every chapter on the GPU (--device cuda) in fp32 and bf16 at 1, 2 and 4 ranks, the ranks
#      sharing the one GPU through the host-staged communicator, next to the same chapter on the CPU:
#      fp32 losses must match the CPU's within 1e-4 (tests/test_devices.cpp says why that bound and
#      not 1e-5: cuBLAS sums in another order), bf16 losses must track fp32's within 2e-2;
#   3. speed on GPT-2 124M (--preset gpt2, T = 1024, bf16): ours at B = 8, 16, 32, flash attention
#      at B = 16, PyTorch eager beside ours (scripts/pytorch/compare_pytorch.sh), and, where LLMC_BENCH names
#      karpathy/llm.c's benchmark script, llm.c at the same batch sizes;
#   4. the whole test suite (tests/run_tests.sh), if time is left.
# Usage: scripts/gpu/gpu_check.sh [OUT_DIR]      (default results/gpu_check)
# Environment: GPU_BUNDLE=dir or dir.tar.gz: programs and MPI runtime packed by scripts/gpu/gpu_bundle.sh (for a GPU
#              machine without a compiler or MPICH); BUDGET_S=480 seconds for all of it (stage 4
#              gets what is left); STAGES="tests chapters speed suite" (the default: all four);
#              LLMC_BENCH=path/to/llmc-gpu-bench.sh; STEPS=10; CHAPTERS="01_vanilla_dp ..."
# Output: OUT_DIR/summary.txt (the tables, printed last), cases.tsv, and one log per case.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results/gpu_check}
budget=${BUDGET_S:-480}
steps=${STEPS:-10}
mkdir -p "$out"
cases=$out/cases.tsv
printf 'stage\tcase\tresult\tseconds\tdetail\n' >"$cases"
started=$SECONDS
left() { echo $((budget - (SECONDS - started))); }
stages=" ${STAGES:-tests chapters speed suite} "
wants() { [[ $stages == *" $1 "* ]]; }

if [ -n "${GPU_BUNDLE:-}" ]; then
  case "$GPU_BUNDLE" in
    *.tar.gz) mkdir -p /tmp/gpu_bundle && tar -C /tmp/gpu_bundle -xzf "$GPU_BUNDLE" \
                && bundle=$(ls -d /tmp/gpu_bundle/*/ | head -n 1) ;;
    *) bundle=$(cd "$GPU_BUNDLE" && pwd) ;;
  esac
  cp -a "$bundle/tree/." .
  export PATH=$bundle/bin:$PATH
  export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# CUDA's libraries where this machine keeps them, for any the programs do not find by their rpath
# (a Python environment's nvidia-* packages hold cuBLAS and NCCL on some machines).
missing=$(ldd ./01_vanilla_dp/train 2>&1 | awk '/not found/ { print $1 }')
for lib in $missing; do
  found=$(find /usr/local /usr/lib /opt -name "$lib" 2>/dev/null | head -n 1)
  [ -n "$found" ] && export LD_LIBRARY_PATH=$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done

{
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  echo "missing before the search: ${missing:-none}; after: $(ldd ./01_vanilla_dp/train 2>&1 | awk '/not found/ { print $1 }' | tr '\n' ' ')"
} | tee "$out/machine.txt"

# MPI first: two ranks on the CPU. Where UCX's default transports fail (some virtual machines refuse
# cross-process memory access), its plain shared-memory and TCP transports are tried.
mpi_ok() { timeout 60 mpiexec -n 2 ./01_vanilla_dp/train --quiet --device cpu --steps 1 >"$out/mpi_sanity.log" 2>&1; }
if ! mpi_ok; then
  export UCX_TLS=self,sm,tcp UCX_POSIX_USE_PROC_LINK=n
  mpi_ok || export UCX_TLS=self,tcp
  mpi_ok; echo "MPI needed UCX_TLS=$UCX_TLS: $(tail -n 3 "$out/mpi_sanity.log" | tr '\n' ' ')" | tee -a "$out/machine.txt"
fi

record() {  # stage case result seconds detail
  printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$cases"
  printf '%-8s %-44s %-6s %5ss %s\n' "$@"
}

# Where llm.c's benchmark is asked for, its build (CPU only, a minute or two) runs beside stages 1-2.
llmc_bin=""
if wants speed && [ -n "${LLMC_BENCH:-}" ] && [ -f "$LLMC_BENCH" ]; then
  mkdir -p "$out/llmc_build"
  (LLMC_BUILD_ONLY=1 LLMC_WORK_DIR=/tmp/llmc_work timeout 300 bash "$LLMC_BENCH" >"$out/llmc_build.log" 2>&1) &
  llmc_build_pid=$!
fi

# 1. The GPU tests.
wants tests && for test in test_cuda_ops test_flash_attention test_devices; do
  t0=$SECONDS
  timeout 200 "build/tests/$test" >"$out/$test.log" 2>&1
  rc=$?
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$out/$test.log" | cut -c1-40 | tr '\n' ' ')
  failed=$(grep '^\[  FAILED  \] [A-Z]' "$out/$test.log" | sed 's/^\[  FAILED  \] //' | tr '\n' ' ')
  record tests "$test" "$([ $rc -eq 0 ] && echo pass || echo FAIL)" $((SECONDS - t0)) "rc $rc; $summary${failed:+; failed: $failed}"
done

# 2. Every chapter: the CPU reference runs go in the background (the CPU is otherwise idle), the
#    GPU runs one after another.
chapter_flags() {  # chapter ranks
  case "$1/$2" in
    08_pipeline/4) echo "--preset tall" ;;  # four stages need four blocks; tiny has two
    09_3d_parallel/4) echo "--tp 2 --pp 2" ;;
    09_3d_parallel/2) echo "--tp 2" ;;
  esac
}
chapters=${CHAPTERS:-$(ls -d [0-9][0-9]_*/ | tr -d /)}
wants chapters || chapters=""
(
  for chapter in $chapters; do
    for n in 1 2 4; do
      timeout 120 mpiexec -n $n "./$chapter/train" --quiet --device cpu --steps "$steps" $(chapter_flags "$chapter" $n) \
        --json "$out/${chapter}_n${n}_cpu.jsonl" >"$out/${chapter}_n${n}_cpu.log" 2>&1
    done
  done
) &
cpu_pid=$!
for chapter in $chapters; do
  for n in 1 2 4; do
    for dtype in fp32 bf16; do
      t0=$SECONDS
      name=${chapter}_n${n}_${dtype}
      timeout 120 mpiexec -n $n "./$chapter/train" --quiet --device cuda --dtype $dtype --steps "$steps" \
        $(chapter_flags "$chapter" $n) --json "$out/$name.jsonl" >"$out/$name.log" 2>&1
      rc=$?
      record chapter "$name" "$([ $rc -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) "rc $rc $(grep -m1 -i 'error' "$out/$name.log" | cut -c1-160)"
    done
  done
done
wait $cpu_pid
python3 - "$out" "$chapters" >"$out/chapters.txt" <<'PY'
import json, os, sys
out, chapters = sys.argv[1], sys.argv[2].split()
def losses(path):
    if not os.path.exists(path): return None
    values = []
    for line in open(path):
        try: record = json.loads(line)
        except ValueError: continue
        if "loss" in record and "step" in record: values.append(record["loss"])
    return values or None
def rel(a, b):
    if a is None or b is None or len(a) != len(b): return None
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
print(f"{'chapter':<20} {'ranks':>5}  {'fp32 vs CPU':>12}  {'bf16 vs fp32':>12}  {'final loss cpu / fp32 / bf16':<30} verdict")
bad = 0
for chapter in chapters:
    for n in (1, 2, 4):
        cpu, fp32, bf16 = (losses(f"{out}/{chapter}_n{n}_{k}.jsonl") for k in ("cpu", "fp32", "bf16"))
        d32, d16 = rel(fp32, cpu), rel(bf16, fp32)
        ok = d32 is not None and d32 <= 1e-4 and d16 is not None and d16 <= 2e-2
        bad += not ok
        fmt = lambda d: "missing" if d is None else f"{d:.2e}"
        finals = " / ".join("-" if v is None else f"{v[-1]:.4f}" for v in (cpu, fp32, bf16))
        print(f"{chapter:<20} {n:>5}  {fmt(d32):>12}  {fmt(d16):>12}  {finals:<30} {'ok' if ok else 'FAIL'}")
print(f"{bad} of {3 * len(chapters)} chapter cases off (fp32 vs CPU <= 1e-4, bf16 vs fp32 <= 2e-2)")
PY
cat "$out/chapters.txt"

# 3. Speed on GPT-2 124M.
speed_row() {  # label, flags...
  local label=$1; shift
  local t0=$SECONDS
  timeout 120 ./01_vanilla_dp/train --preset gpt2 --device cuda --dtype bf16 --steps 20 "$@" \
    --json "$out/speed_$label.jsonl" >"$out/speed_$label.log" 2>&1
  local rc=$?
  local line; line=$(python3 - "$out/speed_$label.jsonl" <<'PY'
import json, statistics, sys
import os
if not os.path.exists(sys.argv[1]): sys.exit(0)
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in records if r.get("type") == "step" and r["step"] >= 3]
def med(key):
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")
mfu = [r["mfu"] for r in records if "mfu" in r]
print(f"{med('step_ms'):.1f} ms/step {med('tokens_per_s')/1e3:.1f}k tok/s MFU {100 * mfu[-1] if mfu else float('nan'):.1f}%")
PY
)
  record speed "$label" "$([ $rc -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) "rc $rc; $line"
}
if wants speed; then
for batch in 8 16 32; do speed_row "ours_B$batch" --batch $batch; done
speed_row ours_B16_flash --batch 16 --attention flash
t0=$SECONDS
timeout 150 scripts/pytorch/compare_pytorch.sh --preset gpt2 --device cuda --dtype bf16 --batch 16 --steps 20 >"$out/pytorch.log" 2>&1
record speed pytorch_B16 "$([ $? -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) "$(tail -n 4 "$out/pytorch.log" | tr '\n' ' ' | cut -c1-300)"
if [ -n "${llmc_build_pid:-}" ]; then
  wait "$llmc_build_pid"
  llmc_bin=$(grep -o '/[^ ]*train_gpt2cu' "$out/llmc_build.log" | tail -n 1)
  if [ -n "$llmc_bin" ] && [ -x "$llmc_bin" ]; then
    t0=$SECONDS
    LLMC_BIN=$llmc_bin LLMC_STEPS=20 timeout 200 bash "$LLMC_BENCH" 8 16 32 >"$out/llmc.log" 2>&1
    record speed llmc "$([ $? -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) "see llmc.log"
  else
    record speed llmc FAIL 0 "build: $(tail -n 2 "$out/llmc_build.log" | tr '\n' ' ')"
  fi
fi

fi

# 4. The whole suite with what is left of the budget.
remaining=$(left)
if ! wants suite; then
  :
elif [ "$remaining" -gt 60 ]; then
  t0=$SECONDS
  timeout "$remaining" tests/run_tests.sh >"$out/suite.log" 2>&1
  record suite run_tests "$(tail -n 1 "$out/suite.log" | grep -q ' 0 failed' && echo pass || echo FAIL)" $((SECONDS - t0)) "$(tail -n 1 "$out/suite.log")"
else
  record suite run_tests skipped 0 "${remaining}s left of BUDGET_S=$budget"
fi

{
  cat "$out/machine.txt"
  echo
  column -t -s $'\t' "$cases" 2>/dev/null || cat "$cases"
  echo
  cat "$out/chapters.txt"
  [ -f "$out/llmc.log" ] && { echo; tail -n 12 "$out/llmc.log"; }
  [ -f "$out/pytorch.log" ] && { echo; tail -n 6 "$out/pytorch.log"; }
  grep -E '^--- |failed$' "$out/suite.log" 2>/dev/null | grep -v ' 0 failed' | tail -n 20
} >"$out/summary.txt"
echo "=================================================="
cat "$out/summary.txt"
