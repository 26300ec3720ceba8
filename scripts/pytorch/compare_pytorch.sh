#!/usr/bin/env bash
# compare_pytorch.sh: our chapter 01 on one rank next to PyTorch eager (scripts/pytorch/pytorch_gpt2.py) for the
# same preset, batch, steps, device and dtype, in one invocation; prints a table (framework, tokens/s,
# step ms) and the ratio ours/PyTorch. Both average tokens/s over steps 1.. (step 0 is warm-up).
# Usage: scripts/pytorch/compare_pytorch.sh [--preset P] [--batch B] [--steps S] [--device cpu|cuda]
#                                   [--dtype fp32|bf16] [any other flag of ours, passed through]
# bf16 is mixed precision on both sides: ours keeps bf16 parameters, gradients and activations with
# fp32 master weights and AdamW state; PyTorch runs the standard autocast recipe (scripts/pytorch/pytorch_gpt2.py).
# Environment: PYTHON=python3 (an interpreter that has torch), TORCH_EXTRA="--attention manual" (flags
# for the PyTorch script only), TORCH_THREADS=1 (PyTorch's CPU threads: one rank of ours uses one core;
# 0 = PyTorch's default). Results land in results/pytorch/: both JSON-lines files, logs, table.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
torch_extra=${TORCH_EXTRA:-}
torch_threads=${TORCH_THREADS:-1}
preset=tiny steps=20 batch="" device=cpu dtype=fp32
ours_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --preset|--steps|--batch|--device|--dtype)
      [ $# -ge 2 ] || { echo "compare_pytorch.sh: $1 needs a value"; exit 1; }
      case "$1" in
        --preset) preset=$2 ;; --steps) steps=$2 ;; --batch) batch=$2 ;; --device) device=$2 ;; --dtype) dtype=$2 ;;
      esac
      shift 2 ;;
    *) ours_extra+=("$1"); shift ;;
  esac
done
case "$device" in cpu|cuda) ;; *) echo "compare_pytorch.sh: --device cpu or cuda (both runs must use the same one)"; exit 1 ;; esac
case "$dtype" in fp32|bf16) ;; *) echo "compare_pytorch.sh: --dtype fp32 or bf16"; exit 1 ;; esac

if ! "$python" -c 'import torch' >/dev/null 2>&1; then
  echo "compare_pytorch.sh: PyTorch is not installed for $python: pip install torch, or set PYTHON to an"
  echo "  interpreter that has it (python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch;"
  echo "  PYTHON=/tmp/torchvenv/bin/python scripts/pytorch/compare_pytorch.sh ...)"
  exit 2
fi
ours=./01_vanilla_dp/train
[ -x "$ours" ] || { echo "compare_pytorch.sh: $ours not found: build it with 'make 01_vanilla_dp'"; exit 1; }
# Same device and dtype on both sides.
[ "$dtype" = bf16 ] && [ "$device" = cpu ] && { echo "compare_pytorch.sh: --dtype bf16 needs --device cuda"; exit 1; }
ours_extra+=(--device "$device" --dtype "$dtype")
common=(--preset "$preset" --steps "$steps")
[ -n "$batch" ] && common+=(--batch "$batch")
torch_flags=(--device "$device" --dtype "$dtype")
[ "$device" = cpu ] && torch_flags+=(--threads "$torch_threads")

out=results/pytorch
mkdir -p "$out"
rm -f "$out"/*.jsonl
echo "ours: mpiexec -n 1 $ours ${common[*]} ${ours_extra[*]}"
mpiexec -n 1 "$ours" "${common[@]}" "${ours_extra[@]}" --json "$out/ours.jsonl" </dev/null >"$out/ours.log" 2>&1 \
  || { echo "  failed: see $out/ours.log"; tail -n 5 "$out/ours.log"; exit 1; }
tail -n 2 "$out/ours.log" | sed 's/^/  /'

echo "pytorch: $python scripts/pytorch/pytorch_gpt2.py ${common[*]} ${torch_flags[*]} $torch_extra"
status=0
# shellcheck disable=SC2086
"$python" scripts/pytorch/pytorch_gpt2.py "${common[@]}" "${torch_flags[@]}" $torch_extra --json "$out/pytorch.jsonl" \
  </dev/null >"$out/pytorch.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  echo "  failed: see $out/pytorch.log"
  tail -n 5 "$out/pytorch.log"
  exit "$status"
fi
tail -n 2 "$out/pytorch.log" | head -n 1 | sed 's/^/  /'

python3 - "$out/ours.jsonl" "$out/pytorch.jsonl" "$device" "$dtype" <<'EOF' | tee "$out/table.txt"
import json, sys

def records(path):
    with open(path) as f:
        return {r["type"]: r for r in map(json.loads, f) if r.get("type") in ("run", "summary")}

def count(x):
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"

ours, torch_run = records(sys.argv[1]), records(sys.argv[2])
device, dtype = sys.argv[3], sys.argv[4]
r = ours["run"]
print(f"\npreset {r['preset']} (L={r['L']} C={r['C']} NH={r['NH']} T={r['T']} V={r['V']}) | global batch "
      f"{r['batch']} x {r['T']} tokens | {device} | {dtype} | {ours['summary']['measured_steps']} measured steps")
rows = [(f"ours ({r['chapter']}, 1 rank)", ours["summary"]),
        (f"pytorch {torch_run['run']['torch']} eager", torch_run["summary"])]
print(f"{'framework':<34} {'tokens/s':>10} {'step ms':>9}")
for name, s in rows:
    print(f"{name:<34} {count(s['tokens_per_s']):>10} {s['step_ms']:>9.1f}")
mfu = torch_run["summary"].get("mfu")
if mfu is not None:
    print(f"  pytorch MFU {100 * mfu:.1f}% ({torch_run['summary']['peak_note']})")
if ours["summary"].get("mfu") is not None:
    print(f"  ours MFU {100 * ours['summary']['mfu']:.1f}% ({ours['summary']['peak_source']})")
ratio = ours["summary"]["tokens_per_s"] / torch_run["summary"]["tokens_per_s"]
# tokens/s is the mean of per-step rates; the ratio of mean step times tells how much noise moved it.
by_time = torch_run["summary"]["step_ms"] / ours["summary"]["step_ms"]
print(f"ours / pytorch: {ratio:.2f}x tokens/s ({by_time:.2f}x by mean step time)")
EOF
