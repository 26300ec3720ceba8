#!/usr/bin/env bash
# cluster_equivalence.sh: every chapter across the cluster's nodes against the same run on one host
# (make cluster-check; docs/cluster.md). Each training chapter runs 3 steps at 2 nodes x 1 rank and at
# 2 nodes x 2 ranks with `mpiexec -f hostfile` (link model off: the link is the shaped veth), then
# with plain `mpiexec -n` on the host, and scripts/cluster/cluster_compare.py checks that the losses and the
# communication counters are equal. Chapter 00 (a benchmark, no loss) must run across the nodes.
# Needs the cluster up (scripts/cluster/cluster.sh up); prints one line a run and ends with "N same, M differ".
#   STEPS=3 SHAPES="2x1 2x2" RTOL=0 scripts/cluster/cluster_equivalence.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${STEPS:-3}
shapes=${SHAPES:-"2x1 2x2"}
rtol=${RTOL:-0}
out=${OUT_DIR:-results/cluster}
mkdir -p "$out"
[[ "$(scripts/cluster/cluster.sh status)" == *node1* ]] || { echo "the cluster is not up: scripts/cluster/cluster.sh up"; exit 1; }

flags_for() {  # chapter ranks: the chapter's own parallel flags at that rank count
  case "$1" in
    07_tensor_parallel) echo "--tp 2" ;;
    08_pipeline) echo "--pp 2" ;;
    09_3d_parallel) [ "$2" = 4 ] && echo "--tp 2 --pp 2" || echo "--tp 2" ;;
    10_context_parallel) echo "--cp 2" ;;
    11_expert_parallel) echo "--preset moe-tiny --ep $2" ;;
    *) echo "" ;;
  esac
}

same=0 differ=0
for shape in $shapes; do
  ppn=${shape#*x}
  n=$((2 * ppn))
  if timeout 120 scripts/cluster/cluster.sh mpiexec -n "$n" -ppn "$ppn" ./00_collectives/collectives --max-bytes 65536 \
       --budget-mb 1 >"$out/00_$shape.log" 2>&1; then
    echo "00_collectives $shape: runs across the nodes"; same=$((same + 1))
  else
    echo "00_collectives $shape: FAILED ($out/00_$shape.log)"; differ=$((differ + 1))
  fi
  for chapter in 01_vanilla_dp 02_overlap_dp 03_bucket_dp 04_zero1 05_zero2 06_zero3 07_tensor_parallel \
                 08_pipeline 09_3d_parallel 10_context_parallel 11_expert_parallel; do
    flags=$(flags_for "$chapter" "$n")
    run="--steps $steps --device cpu $flags"
    if ! timeout 300 scripts/cluster/cluster.sh mpiexec -n "$n" -ppn "$ppn" "./$chapter/train" $run \
         --json "$out/${chapter}_$shape.jsonl" >"$out/${chapter}_$shape.log" 2>&1; then
      echo "$chapter $shape: FAILED across the nodes ($out/${chapter}_$shape.log)"; differ=$((differ + 1)); continue
    fi
    timeout 300 mpiexec -n "$n" "./$chapter/train" $run --json "$out/${chapter}_host$n.jsonl" \
      >"$out/${chapter}_host$n.log" 2>&1 || { echo "$chapter x$n: FAILED on one host"; differ=$((differ + 1)); continue; }
    if line=$(scripts/cluster/cluster_compare.py --rtol "$rtol" "$out/${chapter}_$shape.jsonl" "$out/${chapter}_host$n.jsonl"); then
      same=$((same + 1))
    else
      differ=$((differ + 1))
    fi
    echo "$chapter $shape ($n ranks${flags:+, $flags}): $line"
  done
done
echo "$same same, $differ differ"
[ "$differ" = 0 ]
