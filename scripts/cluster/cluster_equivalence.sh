#!/usr/bin/env bash
# cluster_equivalence.sh: every chapter across the cluster's nodes against the same run on one host
# (make cluster-check; docs/cluster.md). Each training chapter runs 3 steps at 2 nodes x 1 rank and at
# 2 nodes x 2 ranks with `mpiexec -f hostfile` (link model off: the link is the shaped veth), then
# with plain `mpiexec -n` on the host, and scripts/cluster/cluster_compare.py checks that the losses and the
# communication counters are equal. Chapter 00 (a benchmark, no loss) must run across the nodes.
# The chapters are the folders NN_name with a train.cpp, so a new one is never left out; the counters a
# step must also be the ones docs/cluster.md's table gives (a row that disagrees is a difference).
# Needs the cluster up (scripts/cluster/cluster.sh up); prints one line a run and ends with "N same, M differ".
#   STEPS=3 SHAPES="2x1 2x2" RTOL=0 CHAPTERS="08_pipeline 12_5d_parallel" scripts/cluster/cluster_equivalence.sh
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
    12_5d_parallel) [ "$2" = 4 ] && echo "--preset moe-tiny --pp 2 --ep 2 --zero1" || echo "--cp 2 --zero1" ;;
    *) echo "" ;;
  esac
}

# docs/cluster.md's "bytes, collectives" for a chapter at PPN ranks a node (1: the table's third column,
# 2: its fourth), as "482304 1"; empty when the table has no such row.
documented() {
  awk -F'|' -v chapter="$1" -v col=$(($2 == 1 ? 4 : 5)) '$2 ~ "^ *" chapter " *$" { print $col }' docs/cluster.md |
    head -n 1 | { grep -oE '[0-9]+' || true; } | head -n 2 | tr '\n' ' ' | sed 's/ $//'
}

chapters=${CHAPTERS:-$(ls -d [0-9][0-9]_*/train.cpp | cut -d/ -f1)}

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
  for chapter in $chapters; do
    flags=$(flags_for "$chapter" "$n")
    run="--steps $steps --device cpu $flags"
    if ! timeout 300 scripts/cluster/cluster.sh mpiexec -n "$n" -ppn "$ppn" "./$chapter/train" $run \
         --json "$out/${chapter}_$shape.jsonl" >"$out/${chapter}_$shape.log" 2>&1; then
      echo "$chapter $shape: FAILED across the nodes ($out/${chapter}_$shape.log)"; differ=$((differ + 1)); continue
    fi
    timeout 300 mpiexec -n "$n" "./$chapter/train" $run --json "$out/${chapter}_host$n.jsonl" \
      >"$out/${chapter}_host$n.log" 2>&1 || { echo "$chapter x$n: FAILED on one host"; differ=$((differ + 1)); continue; }
    if line=$(scripts/cluster/cluster_compare.py --rtol "$rtol" "$out/${chapter}_$shape.jsonl" "$out/${chapter}_host$n.jsonl"); then
      counted=$(sed -n 's/.*counters equal (\([0-9]*\) B, \([0-9]*\) collectives a step).*/\1 \2/p' <<<"$line")
      doc=$(documented "$chapter" "$ppn")
      if [ "$doc" = "$counted" ]; then
        same=$((same + 1))
      else
        line+="; but docs/cluster.md's table says '${doc:-no row}' (bytes, collectives) where the run counted '$counted'"
        differ=$((differ + 1))
      fi
    else
      differ=$((differ + 1))
    fi
    echo "$chapter $shape ($n ranks${flags:+, $flags}): $line"
  done
done
echo "$same same, $differ differ"
[ "$differ" = 0 ]
