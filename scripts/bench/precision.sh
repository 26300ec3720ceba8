#!/usr/bin/env bash
# precision.sh: `make precision`. Chapter 13 under every recipe, the same model, data and seed, one rank
# each, two runs at a time; then the table (scripts/bench/precision_table.py) and the plots,
# docs/images/precision.png: the loss curves, fp16's loss scale and delayed fp8's scales over the steps.
#   results/precision/<recipe>.{jsonl,log}   one run each
# Two recipes fail on purpose, beside the recipe that fixes each: fp16 without its loss scale
# (--loss-scale 1) and fp8 without scales, gradients in E4M3 (--fp8-scaling none --fp8-grad e4m3).
# DeepSeek's accumulation (--fp8-accumulate promote128) is left out: its emulation adds the products one
# by one, about 20 times slower; try it on a chapter 13 run of its own.
# Settings: STEPS=100, PRESET=tiny, BATCH=8, JOBS=2 (runs at a time), EXTRA= more flags for every run.
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${STEPS:-100}
preset=${PRESET:-tiny}
batch=${BATCH:-8}
jobs=${JOBS:-2}
extra=${EXTRA:-}
out=results/precision
[ -x 13_mixed_precision/train ] || { echo "13_mixed_precision/train is missing: run make 13_mixed_precision"; exit 1; }
mkdir -p "$out" docs/images
rm -f "$out"/*.jsonl "$out"/*.log
# name | flags. fp16's window is short (10 clean steps) so that the scale climbs to fp16's ceiling and
# meets it within the run: the skipped steps and the halvings show.
recipes="fp32|--precision fp32
bf16|--precision bf16
fp16|--precision fp16 --loss-scale-window 10
fp16_no_loss_scale|--precision fp16 --loss-scale 1
fp8_current|--precision fp8 --fp8-scaling current
fp8_delayed|--precision fp8 --fp8-scaling delayed
fp8_row|--precision fp8 --fp8-scaling row
fp8_blocks|--precision fp8 --fp8-scaling blocks
fp8_e4m3_grads_current|--precision fp8 --fp8-scaling current --fp8-grad e4m3
fp8_e4m3_grads_no_scaling|--precision fp8 --fp8-scaling none --fp8-grad e4m3"
echo "precision: 13_mixed_precision, --preset $preset --batch $batch --steps $steps $extra, $(echo "$recipes" | wc -l) recipes, $jobs at a time"
echo "  (STEPS=, PRESET=, BATCH=, JOBS=, EXTRA= change it)"
run_one() {
  local name=${1%%|*} flags=${1#*|}
  # shellcheck disable=SC2086
  if ./13_mixed_precision/train --device cpu --preset "$preset" --batch "$batch" --steps "$steps" $flags $extra \
       --json "$out/$name.jsonl" </dev/null >"$out/$name.log" 2>&1; then
    echo "  done: $name"
  else
    echo "  $name ended with status $? (see $out/$name.log)"  # a diverged run is a result too
  fi
}
export -f run_one
export out preset batch steps extra
echo "$recipes" | xargs -d '\n' -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}
python3 scripts/bench/precision_table.py "$out" docs/images/precision.png
