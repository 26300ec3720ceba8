#!/usr/bin/env bash
# bench.sh: `make bench`. Two parts:
#  1. One-rank, one-thread training throughput of ours (chapter 01) next to PyTorch eager running the
#     same model (scripts/pytorch/pytorch_gpt2.py) at the tiny, small and deep presets. The runs alternate,
#     round after round (ours tiny, torch tiny, ours small, torch small, ...), so that load from other
#     processes falls on both alike; each figure is the median step over all rounds' measured steps
#     (step 0 of every run is warm-up), with the 10th-90th percentile of the per-step tokens/s.
#     On a busy machine a step's wall time mostly measures how long the process waited for a core, so
#     the table also gives tokens per CPU-second, from the CPU time per step, free of start-up and of
#     waiting for a core. Ours: every run's CPU time (user + system, of the process and its children)
#     less that of a one-step run of the same preset in the same round, over the steps between.
#     PyTorch: the process's CPU time around each step (time.process_time, all its threads), which
#     the script records (differences of whole runs would carry the import of torch, whose CPU time
#     varies by seconds from run to run).
#  2. The CPU matmul next to OpenBLAS single-threaded sgemm on the model's GEMM shapes (OpenBLAS appears
#     only here, never in the framework).
# Environment: ROUNDS=3 STEPS=12 PRESETS="tiny small deep"; TORCH_PYTHON, an interpreter that has torch
# (default: python3 if it has torch, else the virtual environment TORCH_VENV, made on first use with
# 'pip install torch': a download of several GB, once); BENCH_TORCH=0 skips PyTorch; BENCH_MATMUL=0
# skips part 2; OURS_BEFORE=path/to/train (chapter 01 built from another commit) adds that binary to
# every round, timed as ours is, and its CPU time per step beside ours: a change measured against its
# start in one run, with PyTorch's time in the same rounds. PyTorch runs with one thread (torch.set_num_threads(1), OMP_NUM_THREADS=1); ours is
# single-threaded. Results land in results/bench/ (BENCH_OUT=... elsewhere): every run's JSON lines and
# table.txt. The one-step runs, timed for their CPU only, write their records to /dev/null.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3}
steps=${STEPS:-12}
presets=${PRESETS:-"tiny small deep"}
out=${BENCH_OUT:-results/bench}
mkdir -p "$out"
rm -f "$out"/*.jsonl

ours=./01_vanilla_dp/train
[ -x "$ours" ] || { echo "bench.sh: $ours not found: build it with 'make 01_vanilla_dp'"; exit 1; }
before=${OURS_BEFORE:-}
[ -z "$before" ] || [ -x "$before" ] || { echo "bench.sh: OURS_BEFORE=$before is not an executable"; exit 1; }

# PyTorch, found or installed on demand into a virtual environment outside the repository.
torch_python=""
if [ "${BENCH_TORCH:-1}" != 0 ]; then
  venv=${TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gpt2-bench-torch-venv}
  for candidate in "${TORCH_PYTHON:-}" python3 "$venv/bin/python"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import torch' >/dev/null 2>&1; then
      torch_python=$candidate
      break
    fi
  done
  if [ -z "$torch_python" ]; then
    echo "== installing PyTorch for the comparison into $venv (pip install torch: several GB, once;"
    echo "   BENCH_TORCH=0 skips the comparison, TORCH_PYTHON=... names an interpreter that has torch)"
    { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet torch numpy; } \
      || { echo "bench.sh: installing PyTorch failed (see above); rerun with BENCH_TORCH=0 to skip it"; exit 1; }
    torch_python=$venv/bin/python
  fi
fi

# cpu_seconds LOG CMD...: runs CMD (stdin from /dev/null, output to LOG) and prints the CPU seconds it
# and its descendants used (RUSAGE_CHILDREN: mpiexec waits for its proxy, the proxy for the rank).
cpu_seconds() {
  python3 -c 'import resource, subprocess, sys
with open(sys.argv[1], "w") as log:
    status = subprocess.run(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT).returncode
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{usage.ru_utime + usage.ru_stime:.4f}")
sys.exit(status)' "$@"
}
# run_one FRAMEWORK PRESET ROUND STEPS [JSON]: one run; appends its CPU seconds to cpu_times.txt.
run_one() {
  local framework=$1 preset=$2 round=$3 n=$4 json=${5:-/dev/null} log="$out/$1_$2.log" seconds
  if [ "$framework" = ours ] || [ "$framework" = before ]; then
    local binary=$ours
    [ "$framework" = ours ] || binary=$before
    seconds=$(OMP_NUM_THREADS=1 cpu_seconds "$log" mpiexec -n 1 "$binary" --preset "$preset" --steps "$n" --json "$json") \
      || { echo "bench.sh: $framework failed at $preset: see $log"; tail -n 5 "$log"; exit 1; }
  else
    seconds=$(OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 cpu_seconds "$log" "$torch_python" scripts/pytorch/pytorch_gpt2.py \
      --preset "$preset" --steps "$n" --device cpu --threads 1 --quiet --json "$json") \
      || { echo "bench.sh: PyTorch failed at $preset: see $log"; tail -n 5 "$log"; exit 1; }
  fi
  echo "$framework $preset $round $n $seconds" >>"$out/cpu_times.txt"
}
rm -f "$out/cpu_times.txt"

read -r load_before _ < /proc/loadavg
echo "== one rank, one thread: ours (chapter 01) vs PyTorch eager, $rounds alternating rounds of $steps steps"
echo "   load average before: $load_before on $(nproc) cores"
for round in $(seq 1 "$rounds"); do
  for preset in $presets; do
    echo "   round $round/$rounds: $preset"
    run_one ours "$preset" "$round" "$steps" "$out/ours_${preset}_$round.jsonl"
    run_one ours "$preset" "$round" 1
    if [ -n "$before" ]; then
      run_one before "$preset" "$round" "$steps"
      run_one before "$preset" "$round" 1
    fi
    if [ -n "$torch_python" ]; then
      run_one torch "$preset" "$round" "$steps" "$out/torch_${preset}_$round.jsonl"
    fi
  done
done
read -r load_after _ < /proc/loadavg

python3 - "$out" "$load_before" "$load_after" "$(nproc)" $presets <<'EOF' | tee "$out/table.txt"
import glob, json, statistics, sys

out, load_before, load_after, cores, presets = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]

def runs(framework, preset):
    """(run record, [measured step records]) over all rounds; step 0 of each run is warm-up."""
    run, steps = None, []
    for path in sorted(glob.glob(f"{out}/{framework}_{preset}_*.jsonl")):
        with open(path) as f:
            records = [json.loads(line) for line in f]
        run = run or next(r for r in records if r["type"] == "run")
        steps += [r for r in records if r["type"] == "step" and r["step"] > 0]
    return run, steps

def cpu_ms_per_step(framework, preset):
    """Median over rounds of (CPU of the long run - CPU of the one-step run) / (steps - 1), in ms: ours."""
    runs = {}
    with open(f"{out}/cpu_times.txt") as f:
        for line in f:
            fw, p, rnd, n, seconds = line.split()
            if fw == framework and p == preset:
                runs.setdefault(rnd, {})[int(n)] = float(seconds)
    per_step = [(r[n] - r[1]) * 1e3 / (n - 1) for r in runs.values() for n in r if n > 1 and 1 in r]
    return statistics.median(per_step) if per_step else None

def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]

def count(x):
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"

if max(load_before, load_after) > cores:
    print(f"WARNING: the machine was busy (load average {load_before:.1f} before, {load_after:.1f} after, "
          f"on {cores} cores): wall-clock figures mostly measure the wait for a core; read the CPU-time table")
header = (f"{'preset':<7} {'model':<24} {'ours tok/s':>11} {'(p10-p90)':>13} {'torch tok/s':>12} {'(p10-p90)':>13} "
          f"{'ours/torch':>10}")
rows, cpu_rows = [], []
for preset in presets:
    run, ours = runs("ours", preset)
    torch_run, torch = runs("torch", preset)
    tokens = run["batch"] * run["T"]
    model = f"L={run['L']} C={run['C']} T={run['T']} B={run['batch']}"
    ours_rate = tokens / (statistics.median(s["step_ms"] for s in ours) / 1e3)
    ours_rates = [s["tokens_per_s"] for s in ours]
    row = (f"{preset:<7} {model:<24} {count(ours_rate):>11} "
           f"{count(percentile(ours_rates, 0.1)) + '-' + count(percentile(ours_rates, 0.9)):>13}")
    if torch:
        torch_rate = tokens / (statistics.median(s["step_ms"] for s in torch) / 1e3)
        torch_rates = [s["tokens_per_s"] for s in torch]
        row += (f" {count(torch_rate):>12} "
                f"{count(percentile(torch_rates, 0.1)) + '-' + count(percentile(torch_rates, 0.9)):>13} "
                f"{ours_rate / torch_rate:>9.2f}x")
    else:
        row += f" {'(skipped)':>12}"
    rows.append(row)
    ours_cpu = cpu_ms_per_step("ours", preset)
    torch_cpu = statistics.median(s["step_cpu_ms"] for s in torch) if torch else None
    cpu_row = f"{preset:<7} {count(tokens / (ours_cpu / 1e3)):>12} {ours_cpu:>12.1f}"
    if torch_cpu:
        cpu_row += f" {count(tokens / (torch_cpu / 1e3)):>13} {torch_cpu:>12.1f} {torch_cpu / ours_cpu:>9.2f}x"
    before_cpu = cpu_ms_per_step("before", preset)
    if before_cpu and not torch_cpu:
        cpu_row += " " * 39  # under PyTorch's three columns
    if before_cpu:
        cpu_row += f" {before_cpu:>14.1f} {ours_cpu / before_cpu:>12.3f}x"
    cpu_rows.append(cpu_row)
print("wall clock: tokens/s = batch x T / median step time over all rounds (p10-p90 of the steps' tokens/s)")
print(header)
print("\n".join(rows))
print("CPU time: tokens per CPU-second = batch x T / median CPU time per step (the load-independent figure)")
print(f"{'preset':<7} {'ours tok/cpu-s':>12} {'ours ms/step':>12} {'torch tok/cpu-s':>13} {'torch ms/step':>12} "
      f"{'ours/torch':>10}" + (f" {'before ms/step':>14} {'ours/before':>13}" if cpu_ms_per_step("before", presets[0]) else ""))
print("\n".join(cpu_rows))
if torch_run:
    print(f"PyTorch {torch_run['torch']} eager, fp32, {torch_run['threads']} thread, attention "
          f"{torch_run['attention']}, AdamW {torch_run['adamw']}; ours: chapter 01, 1 rank, fp32")
EOF

if [ "${BENCH_MATMUL:-1}" != 0 ]; then
  echo
  echo "== CPU matmul vs OpenBLAS (single thread)"
  OPENBLAS_NUM_THREADS=1 ./build/matmul_bench
fi
