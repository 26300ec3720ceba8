#!/usr/bin/env bash
# make plan: chapter 09's planner three ways. (1) The best configurations for one model on one
# cluster (arguments are passed to 09_3d_parallel/plan; default: Megatron-LM's 145.6B run);
# (2) Megatron-LM's Table 1 against the planner's predictions; (3) the heat map of the best
# configuration per model size and node count, results/plan_heatmap.csv and .png.
set -euo pipefail
cd "$(dirname "$0")/../.."
plan=09_3d_parallel/plan
mkdir -p results
if [ $# -eq 0 ]; then set -- --model megatron-146b --cluster dgx-a100 --gpus 1536 --batch 2304; fi
echo "== $plan $*"
"$plan" "$@" || true   # exits 1 when nothing fits, which is an answer too
echo
echo "== $plan --megatron docs/data/megatron_table1.csv"
"$plan" --megatron docs/data/megatron_table1.csv || echo "(some rows outside 15%: see above)"
echo
echo "== $plan --heatmap results/plan_heatmap.csv"
start=$(date +%s)
"$plan" --heatmap results/plan_heatmap.csv
echo "(heat map searched in $(( $(date +%s) - start )) s)"
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 scripts/plan/plot_plan_heatmap.py results/plan_heatmap.csv results/plan_heatmap.png
else
  echo "matplotlib missing: run 'make deps' for results/plan_heatmap.png"
fi
