#!/usr/bin/env bash
# gpu_check.sh: everything that needs a GPU, once, in one command, on a machine with one NVIDIA GPU.
# It never stops at a failure: each case is recorded (pass, FAIL or its reason) and the next one runs.
# The stages run in this order, the newest code first within each, so that a budget that runs out
# still leaves the cases that have never run on a GPU measured:
#   1. the GPU tests: test_cuda_ring_attention, test_cuda_moe_rows, test_cuda_ops, test_flash_attention,
#      test_devices (they skip without a GPU);
#   1b. precision (chapter 13's formats on the GPU, never run on one yet): the CUDA conversions
#      against the host's codes (test_float_formats), cuBLASLt's bf16, fp16 and fp8 products against
#      the CPU emulation (test_matmul_emulation, CublasLt.*), then build/fp8_products: tokens/s of a
#      step's products in fp8 against bf16 at GPT-2 124M's width and at 4096, beside torchtitan's
#      published Float8 gain (docs/mixed_precision.md, "On a GPU"); about a minute;
#   1c. the recipes' layers on cuBLASLt: the device path against the CPU emulation, chapters 13 and 01
#      for 5 steps per recipe, and tokens/s of the fp8 recipe against bf16's on GPT-2 124M and
#      gpt2-wide, beside torchtitan's Float8 gain; about two minutes;
#   2. kernels: version 1 against version 2 of each kernel that has both (build/kernel_variants:
#      the classifier, AdamW), each checked, then timed, the winner named; the matmul lesson's
#      versions, each validated against its CPU reference, then timed against cuBLAS
#      (lessons/matmul/matmul_lesson); the attention variants are timed in the model in stage 4;
#   3. the chapters on the GPU (--device cuda), the ranks sharing the one GPU through the host-staged
#      communicator, each next to the same case on the CPU: fp32 losses must match the CPU's within
#      1e-4 (tests/test_devices.cpp says why that bound and not 1e-5: cuBLAS sums in another order),
#      bf16 losses must track fp32's within 2e-2. First what has never run on a GPU: chapter 00's
#      collectives (--device cuda, and --collectives ours under chapter 01), 10's ring (--cp 2, 4;
#      fp32 only), 11's experts (fp32 only), 12 (--cp, --tp, a MoE preset with --ep), 08's V schedules
#      (zb-v, dualpipev); then 01-09 at 1, 2 and 4 ranks;
#   4. speed on GPT-2 124M (--preset gpt2, T = 1024, bf16): ours at B = 16, 32, 64 with materialized
#      and with flash attention (the faster named per B), PyTorch eager beside ours
#      (scripts/pytorch/compare_pytorch.sh), and, where LLMC_BENCH names karpathy/llm.c's benchmark
#      script, llm.c at the same batch sizes; MFU by both formulas, ours (6N + 12LCT, N without the
#      position embeddings) and llm.c's (6N + 6LCT, N every parameter);
#   5. the whole test suite (tests/run_tests.sh), if time is left.
# Usage: scripts/gpu/gpu_check.sh [OUT_DIR]      (default results/gpu_check)
# Environment: GPU_BUNDLE=dir or dir.tar.gz: programs and MPI runtime packed by scripts/gpu/gpu_bundle.sh (for a GPU
#              machine without a compiler or MPICH); BUDGET_S=480 seconds for all of it (a chapter
#              case starts only with 20 s left, stage 5 gets what is left); STAGES="tests kernels
#              chapters speed suite" (the default: all five; "precision" runs with "tests"); LLMC_BENCH=path/to/llmc-gpu-bench.sh;
#              STEPS=10; CHAPTERS="01_vanilla_dp ..." (stage 3's 1/2/4-rank sweep; default 01-09);
#              SPEED_BATCHES="16 32 64"
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
stages=" ${STAGES:-tests kernels chapters speed suite} "
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
wants tests && for test in test_cuda_ring_attention test_cuda_moe_rows test_cuda_ops test_flash_attention test_devices; do
  t0=$SECONDS
  timeout 200 "build/tests/$test" >"$out/$test.log" 2>&1
  rc=$?
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$out/$test.log" | cut -c1-40 | tr '\n' ' ')
  failed=$(grep '^\[  FAILED  \] [A-Z]' "$out/$test.log" | sed 's/^\[  FAILED  \] //' | tr '\n' ' ')
  record tests "$test" "$([ $rc -eq 0 ] && echo pass || echo FAIL)" $((SECONDS - t0)) "rc $rc; $summary${failed:+; failed: $failed}"
done

# 1b. Precision: the formats' kernels and cuBLASLt's products against the host's, then fp8's
#     products against bf16's, timed (scripts/bench/fp8_products.cpp).
if wants tests || wants precision; then
  for filtered in "test_float_formats FloatFormatsCuda.*" "test_matmul_emulation CublasLt.*"; do
    read -r test filter <<<"$filtered"
    t0=$SECONDS
    timeout 120 "build/tests/$test" --gtest_filter="$filter" >"$out/${test}_gpu.log" 2>&1
    rc=$?
    summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$out/${test}_gpu.log" | cut -c1-40 | tr '\n' ' ')
    verdict=$([ $rc -ne 0 ] && echo FAIL || { grep -q '^\[  SKIPPED \]' "$out/${test}_gpu.log" && echo skipped || echo pass; })
    record precision "$test $filter" "$verdict" $((SECONDS - t0)) \
      "rc $rc; $summary$(grep -m1 'fp8 skipped' "$out/${test}_gpu.log")"
  done
  if [ -x build/fp8_products ]; then
    t0=$SECONDS
    timeout 180 ./build/fp8_products --batch 8 --repeats 20 >"$out/fp8_products.log" 2>&1
    rc=$?
    record precision fp8_products "$([ $rc -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) \
      "rc $rc; $(grep -E 'x   1.28x|nothing to time' "$out/fp8_products.log" | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
  fi
fi

# 1c. Recipes on the GPU: the layers' products through cuBLASLt (common/training/precision_recipe_cuda.cpp).
#     The device path against the CPU emulation product by product (test_matmul_emulation OnGpu.*;
#     test_devices' OnGpu.Precision* ran in stage 1), chapters 13 and 01 for 5 steps per recipe, then
#     tokens/s of fp8 against bf16 (both recipes: fp32 master weights and activations, the products
#     cast on the device) on GPT-2 124M and gpt2-wide, beside torchtitan's published Float8 gain.
#     About 2 minutes.
recipe_tokens() {  # jsonl: "ms/step tok/s", the medians of steps 2 on
  python3 - "$1" <<'PY'
import json, os, statistics, sys
if not os.path.exists(sys.argv[1]): sys.exit(0)
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("type") == "step" and r.get("step", 0) >= 2]
if rows: print(f"{statistics.median(r['step_ms'] for r in rows):.1f} {statistics.median(r['tokens_per_s'] for r in rows):.0f}")
PY
}
if wants tests || wants precision; then
  t0=$SECONDS
  timeout 120 build/tests/test_matmul_emulation --gtest_filter='OnGpu.*' >"$out/recipe_layers_gpu.log" 2>&1
  rc=$?
  record precision "test_matmul_emulation OnGpu.*" "$([ $rc -eq 0 ] && echo pass || echo FAIL)" $((SECONDS - t0)) \
    "rc $rc; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$out/recipe_layers_gpu.log" | cut -c1-40 | tr '\n' ' ')"
  for chapter in 13_mixed_precision 01_vanilla_dp; do
    for recipe in "bf16" "fp16" "fp8 --fp8-scaling delayed" "fp8 --fp8-scaling current"; do
      label=recipe_${chapter%%_*}_$(echo "$recipe" | sed 's/ --fp8-scaling /_/')
      t0=$SECONDS
      timeout 60 "./$chapter/train" --device cuda --steps 5 --precision $recipe --json "$out/$label.jsonl" \
        >"$out/$label.log" 2>&1
      rc=$?
      record precision "$label" "$([ $rc -eq 0 ] && echo pass || echo FAIL)" $((SECONDS - t0)) \
        "rc $rc; $(grep '^step' "$out/$label.log" | tail -n 1 | cut -d'|' -f1-2)$(grep -m1 -E 'error|refused|needs' "$out/$label.log" | cut -c1-160)"
    done
  done
  {
    printf '%-10s %-26s %9s %9s %8s\n' preset "--precision" "ms/step" "tok/s" "vs bf16"
    for preset in gpt2 gpt2-wide; do
      base=""
      for recipe in "bf16" "fp8 --fp8-scaling delayed" "fp8 --fp8-scaling current"; do
        label=recipe_speed_${preset}_$(echo "$recipe" | sed 's/ --fp8-scaling /_/')
        timeout 120 ./13_mixed_precision/train --preset "$preset" --device cuda --steps 8 --precision $recipe \
          --json "$out/$label.jsonl" >"$out/$label.log" 2>&1
        read -r ms tok <<<"$(recipe_tokens "$out/$label.jsonl")"
        [ "$recipe" = bf16 ] && base=${tok:-}
        ratio=$([ -n "${tok:-}" ] && [ -n "$base" ] && python3 -c "print(f'{$tok / $base:.2f}x')" || echo -)
        printf '%-10s %-26s %9s %9s %8s\n' "$preset" "$recipe" "${ms:--}" "${tok:--}" "$ratio"
      done
      # For scale: 01's own bf16 mixed precision (bf16 activations, no casts), not a recipe.
      label=recipe_speed_${preset}_dtype_bf16
      timeout 120 ./01_vanilla_dp/train --preset "$preset" --device cuda --steps 8 --dtype bf16 \
        --json "$out/$label.jsonl" >"$out/$label.log" 2>&1
      read -r ms tok <<<"$(recipe_tokens "$out/$label.jsonl")"
      ratio=$([ -n "${tok:-}" ] && [ -n "$base" ] && python3 -c "print(f'{$tok / $base:.2f}x')" || echo -)
      printf '%-10s %-26s %9s %9s %8s\n' "$preset" "(01 --dtype bf16)" "${ms:--}" "${tok:--}" "$ratio"
    done
    echo "torchtitan's Float8 (Llama 3 8B, 8 H100, FSDP 8, torch.compile): 8,532 against 6,667 tokens/s per GPU, 1.28x"
    echo "(benchmarks/llama3_h100_202412_torchtitan.md). Ours: B = 8 x 1024 tokens on one GPU; the products' casts,"
    echo "amaxes and fp32 epilogues are separate kernels, and every other op runs in fp32 (the recipe's master copy)."
  } >"$out/recipes_speed.txt" 2>&1
  record precision recipes_speed ran 0 "$(grep -E '^gpt2' "$out/recipes_speed.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
fi

# 2. Kernels: version 1 against version 2 of each kernel that has both (the classifier, AdamW),
#    checked then timed, the winner named (scripts/bench/kernel_variants.cpp); then each version of
#    the matmul lesson checked against its CPU reference and timed.
if wants kernels && [ -x build/kernel_variants ]; then
  t0=$SECONDS
  timeout 120 ./build/kernel_variants >"$out/kernel_variants.log" 2>&1
  rc=$?
  record kernels kernel_variants "$([ $rc -eq 0 ] && echo pass || echo FAIL)" $((SECONDS - t0)) \
    "rc $rc; $(grep -v '^{' "$out/kernel_variants.log" | tail -n 2 | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
fi
if wants kernels && [ -x lessons/matmul/matmul_lesson ]; then
  t0=$SECONDS
  timeout 90 ./lessons/matmul/matmul_lesson >"$out/matmul_lesson.log" 2>&1
  rc=$?
  record kernels matmul_lesson "$([ $rc -eq 0 ] && echo pass || echo FAIL)" $((SECONDS - t0)) \
    "rc $rc; $(grep -i 'tflop' "$out/matmul_lesson.log" | tail -n 5 | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
fi

# 3. The chapters. A case: tag, program, ranks, dtypes (fp32 always; bf16 where the code takes it),
#    flags. Its name is program_n<ranks>[_tag]; the CPU reference runs the same flags with --device cpu.
#    The CPU runs go in the background (the CPU is otherwise idle), the GPU runs one after another.
chapter_flags() {  # chapter ranks: the flags of the 1/2/4-rank sweep
  case "$1/$2" in
    08_pipeline/4) echo "--preset tall" ;;  # four stages need four blocks; tiny has two
    09_3d_parallel/4) echo "--tp 2 --pp 2" ;;
    09_3d_parallel/2) echo "--tp 2" ;;
  esac
}
case_list() {
  # Never run on a GPU before: the ring (fp32 only), the experts (fp32 only), chapter 12, the V
  # schedules, our collectives on CUDA buffers under a chapter.
  echo "- 10_context_parallel 1 fp32,bf16"
  echo "- 10_context_parallel 2 fp32 --cp 2"
  echo "- 10_context_parallel 4 fp32 --cp 4"
  echo "- 11_expert_parallel 1 fp32"
  echo "- 11_expert_parallel 2 fp32 --ep 2 --capacity-factor 1.0"
  echo "- 11_expert_parallel 4 fp32"
  echo "- 12_5d_parallel 1 fp32,bf16"
  echo "- 12_5d_parallel 2 fp32 --cp 2"
  echo "- 12_5d_parallel 4 fp32 --cp 2 --tp 2"
  echo "moe 12_5d_parallel 2 fp32 --preset moe-tiny --ep 2"
  echo "zbv 08_pipeline 2 fp32,bf16 --preset tall --schedule zb-v"
  echo "dualpipev 08_pipeline 2 fp32,bf16 --preset tall --schedule dualpipev"
  echo "ours 01_vanilla_dp 2 fp32,bf16 --collectives ours"
  echo "ours 03_bucket_dp 2 fp32,bf16 --collectives ours"
  for chapter in ${CHAPTERS:-01_vanilla_dp 02_overlap_dp 03_bucket_dp 04_zero1 05_zero2 06_zero3 07_tensor_parallel 08_pipeline 09_3d_parallel}; do
    for n in 1 2 4; do echo "- $chapter $n fp32,bf16 $(chapter_flags "$chapter" $n)"; done
  done
}
case_name() { [ "$1" = "-" ] && echo "${2}_n$3" || echo "${2}_n${3}_$1"; }
: >"$out/chapter_cases.txt"
if wants chapters; then
  case_list | while read -r tag chapter n dtypes flags; do
    echo "$(case_name "$tag" "$chapter" "$n") $dtypes" >>"$out/chapter_cases.txt"
  done
  (
    case_list | while read -r tag chapter n dtypes flags; do
      name=$(case_name "$tag" "$chapter" "$n")
      timeout 120 mpiexec -n "$n" "./$chapter/train" --quiet --device cpu --steps "$steps" $flags \
        --json "$out/${name}_cpu.jsonl" </dev/null >"$out/${name}_cpu.log" 2>&1
    done
  ) &
  cpu_pid=$!
  # (mpiexec forwards its standard input to rank 0: every one in these loops reads /dev/null, or it
  # would swallow the list of cases.)
  # Chapter 00: the collectives benchmark on CUDA buffers (NCCL at one rank; host-staged or NCCL at
  # more), its correctness checks included, small sizes.
  for n in 1 2 4; do
    t0=$SECONDS
    timeout 90 mpiexec -n $n ./00_collectives/collectives --device cuda --max-bytes 4194304 \
      --json "$out/00_collectives_n$n.jsonl" >"$out/00_collectives_n$n.log" 2>&1
    rc=$?
    record chapter "00_collectives_n$n" "$([ $rc -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) \
      "rc $rc $(grep -m1 -i 'error\|mismatch' "$out/00_collectives_n$n.log" | cut -c1-160)"
  done
  case_list | while read -r tag chapter n dtypes flags; do
    name=$(case_name "$tag" "$chapter" "$n")
    for dtype in ${dtypes//,/ }; do
      if [ "$(left)" -lt 20 ]; then
        record chapter "${name}_$dtype" skipped 0 "$(left)s left of BUDGET_S=$budget"
        continue
      fi
      t0=$SECONDS
      timeout 120 mpiexec -n "$n" "./$chapter/train" --quiet --device cuda --dtype $dtype --steps "$steps" $flags \
        --json "$out/${name}_$dtype.jsonl" </dev/null >"$out/${name}_$dtype.log" 2>&1
      rc=$?
      record chapter "${name}_$dtype" "$([ $rc -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) \
        "rc $rc $(grep -m1 -i 'error' "$out/${name}_$dtype.log" | cut -c1-160)"
    done
  done
  wait $cpu_pid
fi
python3 - "$out" >"$out/chapters.txt" <<'PY'
import json, os, sys
out = sys.argv[1]
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
cases = [line.split() for line in open(f"{out}/chapter_cases.txt") if line.strip()]
print(f"{'case':<32} {'fp32 vs CPU':>12}  {'bf16 vs fp32':>12}  {'final loss cpu / fp32 / bf16':<30} verdict")
bad = 0
for name, dtypes in cases:
    cpu, fp32, bf16 = (losses(f"{out}/{name}_{k}.jsonl") for k in ("cpu", "fp32", "bf16"))
    with_bf16 = "bf16" in dtypes.split(",")
    d32, d16 = rel(fp32, cpu), rel(bf16, fp32)
    ok = d32 is not None and d32 <= 1e-4 and (not with_bf16 or (d16 is not None and d16 <= 2e-2))
    bad += not ok
    fmt = lambda d: "missing" if d is None else f"{d:.2e}"
    finals = " / ".join("-" if v is None else f"{v[-1]:.4f}" for v in (cpu, fp32, bf16))
    print(f"{name:<32} {fmt(d32):>12}  {fmt(d16) if with_bf16 else 'fp32 only':>12}  {finals:<30} {'ok' if ok else 'FAIL'}")
print(f"{bad} of {len(cases)} chapter cases off (fp32 vs CPU <= 1e-4, bf16 vs fp32 <= 2e-2)")
PY
cat "$out/chapters.txt"

# 4. Speed on GPT-2 124M. MFU by both formulas: ours, 6N + 12LCT with N the parameters without the
#    position embeddings (the run's flops_per_token), and llm.c's, 6N + 6LCT with N every parameter
#    (the run's params), both against the run's peak (device.cpp's data-sheet figure). L C T are the
#    gpt2 preset's: 12, 768, 1024.
speed_row() {  # label, flags...
  local label=$1; shift
  local t0=$SECONDS
  timeout 150 ./01_vanilla_dp/train --preset gpt2 --device cuda --dtype bf16 --steps 20 "$@" \
    --json "$out/speed_$label.jsonl" >"$out/speed_$label.log" 2>&1
  local rc=$?
  local line; line=$(python3 - "$out/speed_$label.jsonl" <<'PY'
import json, os, statistics, sys
if not os.path.exists(sys.argv[1]): sys.exit(0)
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in records if r.get("type") == "step" and r["step"] >= 3]
def med(key):
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")
summary = next((r for r in records if r.get("type") == "summary"), {})
theory = next((r for r in records if r.get("type") == "theory"), {})
tok = med("tokens_per_s")
peak = summary.get("peak_flops", 0)
L, C, T = 12, 768, 1024
ours = 100 * tok * summary.get("flops_per_token", float("nan")) / peak if peak else float("nan")
llmc = 100 * tok * (6 * theory.get("params", float("nan")) + 6 * L * C * T) / peak if peak else float("nan")
print(f"{med('step_ms'):.1f} ms/step {tok/1e3:.1f}k tok/s MFU {ours:.1f}% (6N+12LCT) {llmc:.1f}% (llm.c 6N+6LCT)")
PY
)
  record speed "$label" "$([ $rc -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) "rc $rc; $line"
}
if wants speed; then
batches=${SPEED_BATCHES:-16 32 64}
for batch in $batches; do
  speed_row "ours_B${batch}_materialized" --batch $batch --attention materialized
  speed_row "ours_B${batch}_flash" --batch $batch --attention flash
done
# The winner per batch: the attention with the shorter median step.
for batch in $batches; do
  m=$(grep -o '^[0-9.]* ms/step' <(grep "ours_B${batch}_materialized" "$cases" | cut -f5 | sed 's/^rc [0-9]*; //') | cut -d' ' -f1)
  f=$(grep -o '^[0-9.]* ms/step' <(grep "ours_B${batch}_flash" "$cases" | cut -f5 | sed 's/^rc [0-9]*; //') | cut -d' ' -f1)
  if [ -n "$m" ] && [ -n "$f" ]; then
    record speed "winner_B$batch" "$(python3 -c "print('flash' if $f < $m else 'materialized')")" 0 \
      "materialized $m ms, flash $f ms (T = 1024; no preset has T = 2048: that comparison is not run)"
  fi
done
t0=$SECONDS
timeout 150 scripts/pytorch/compare_pytorch.sh --preset gpt2 --device cuda --dtype bf16 --batch 16 --steps 20 >"$out/pytorch.log" 2>&1
record speed pytorch_B16 "$([ $? -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) "$(tail -n 4 "$out/pytorch.log" | tr '\n' ' ' | cut -c1-300)"
if [ -n "${llmc_build_pid:-}" ]; then
  wait "$llmc_build_pid"
  llmc_bin=$(grep -o '/[^ ]*train_gpt2cu' "$out/llmc_build.log" | tail -n 1)
  if [ -n "$llmc_bin" ] && [ -x "$llmc_bin" ]; then
    t0=$SECONDS
    # llm.c as its benchmark script builds it: bf16, no cuDNN, no MPI, its default recompute (-r 1).
    LLMC_BIN=$llmc_bin LLMC_STEPS=20 timeout 240 bash "$LLMC_BENCH" $batches >"$out/llmc.log" 2>&1
    record speed llmc "$([ $? -eq 0 ] && echo ran || echo FAIL)" $((SECONDS - t0)) "B = $batches, bf16, no cuDNN; see llmc.log"
  else
    record speed llmc FAIL 0 "build: $(tail -n 2 "$out/llmc_build.log" | tr '\n' ' ')"
  fi
fi

fi

# 5. The whole suite with what is left of the budget.
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
  [ -f "$out/kernel_variants.log" ] && { echo; cat "$out/kernel_variants.log"; }
  [ -f "$out/fp8_products.log" ] && { echo; grep -v '^{' "$out/fp8_products.log"; }
  [ -f "$out/recipes_speed.txt" ] && { echo; cat "$out/recipes_speed.txt"; }
  grep -E '^--- |failed$' "$out/suite.log" 2>/dev/null | grep -v ' 0 failed' | tail -n 20
} >"$out/summary.txt"
echo "=================================================="
cat "$out/summary.txt"
