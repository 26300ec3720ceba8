#!/usr/bin/env bash
# make plan: chapter 09's planner four ways. (1) The best configurations for one model on one
# cluster (arguments are passed to 09_3d_parallel/plan; default: Llama 3 405B at 131K on 16,384 H100s);
# (2) Megatron-LM's Table 1 against the planner's predictions; (3) the published multi-dimension runs
# (Megatron-Core on H100, Llama 3 405B, GPT-OSS 120B, torchtitan's CP scaling, DeepSeek-V3);
# (4) the heat map of the best configuration per model, node count and sequence length,
# results/plan_heatmap.csv and .png.
set -euo pipefail
cd "$(dirname "$0")/../.."
plan=09_3d_parallel/plan
mkdir -p results
if [ $# -eq 0 ]; then set -- --model llama3-405b --nodes 2048 --seq-len 131072 --tokens-per-batch 16777216; fi
echo "== $plan $*"
"$plan" "$@" || true   # exits 1 when nothing fits, which is an answer too
echo
echo "== $plan --megatron docs/data/megatron_table1.csv"
"$plan" --megatron docs/data/megatron_table1.csv || echo "(some rows outside 15%: see above)"
echo
echo "== $plan --published"
"$plan" --published || echo "(some checks do not hold: see above)"
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
