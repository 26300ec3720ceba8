#!/usr/bin/env bash
# cluster_lessons.sh: two lessons measured on the cluster's shaped link (make cluster-lessons;
# docs/cluster.md). Needs the cluster up with 2 nodes (scripts/cluster.sh up 2 GBPS).
#  1. Placement, Megatron's rule: at 2 nodes x 2 ranks, 07 (TP 2 x DP 2) and 09 (TP 2 x PP 2) with
#     the tensor-parallel pairs inside a node (hostfile order, -ppn 2: ranks 0,1 on node0) and across
#     the nodes (-ppn 1: ranks alternate node0, node1). Average step time and exposed communication.
#  2. The link model against the link: build/comm_bench's all-reduce (the Communicator 03 uses) and
#     08's point-to-point activations at 2 nodes x 1 rank on the shaped link, against the same runs
#     on one host with --link-gbps GBPS (the model, latency 0), and against the formula.
#   PRESET=small STEPS=8 scripts/cluster_lessons.sh   (results in results/cluster/lessons/)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${PRESET:-small}
steps=${STEPS:-8}
out=${OUT_DIR:-results/cluster/lessons}
mkdir -p "$out"
state=${CLUSTER_STATE:-build/cluster}
[ -f "$state/env" ] || { echo "the cluster is not up: scripts/cluster.sh up 2 GBPS"; exit 1; }
gbps=$(sed -n 's/^CLUSTER_GBPS=//p' "$state/env")
summary() {  # jsonl: "step ms, exposed comm ms, comm ms" of the summary record
  python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; s=[x for x in r if x.get("type")=="summary"][-1]
print("%.1f %.1f %.1f" % (s["step_ms"], s["exposed_comm_ms"], s["comm_ms"]))' "$1"
}

echo "== 1. placement at 2 nodes x 2 ranks, link $gbps Gbit/s, preset $preset, $steps steps"
printf '%-34s %-22s %10s %14s %10s\n' run "TP pairs" "step ms" "exposed ms" "comm ms"
for entry in "07_tensor_parallel|--tp 2" "09_3d_parallel|--tp 2 --pp 2"; do
  chapter=${entry%%|*}; flags=${entry#*|}
  for ppn in 2 1; do
    where=$([ "$ppn" = 2 ] && echo "inside a node" || echo "across the nodes")
    name="${chapter}_ppn$ppn"
    timeout 600 scripts/cluster.sh mpiexec -n 4 -ppn "$ppn" "./$chapter/train" --preset "$preset" --steps "$steps" \
      --device cpu $flags --json "$out/$name.jsonl" >"$out/$name.log" 2>&1 || { echo "$name FAILED"; cat "$out/$name.log"; exit 1; }
    read -r step exposed comm < <(summary "$out/$name.jsonl")
    printf '%-34s %-22s %10s %14s %10s\n' "$chapter $flags" "$where" "$step" "$exposed" "$comm"
  done
done

echo "== 2a. all-reduce (comm_bench, ours), 2 ranks: shaped $gbps Gbit/s link vs --link-gbps $gbps model on one host"
timeout 600 scripts/cluster.sh mpiexec -n 2 -ppn 1 build/comm_bench --min-bytes 16384 --max-bytes 16777216 \
  --json "$out/allreduce_link.jsonl" >"$out/allreduce_link.log" 2>&1
timeout 600 mpiexec -n 2 build/comm_bench --min-bytes 16384 --max-bytes 16777216 --link-gbps "$gbps" \
  --json "$out/allreduce_model.jsonl" >"$out/allreduce_model.log" 2>&1
python3 - "$out/allreduce_link.jsonl" "$out/allreduce_model.jsonl" "$gbps" <<'EOF'
import json, sys
def rows(p):
    r = [json.loads(l) for l in open(p) if l.strip()]
    return {x["bytes"]: x for x in r if x.get("collective") == "all_reduce" and x.get("bytes")}
link, model, gbps = rows(sys.argv[1]), rows(sys.argv[2]), float(sys.argv[3])
key = "time_us"  # ours: the Communicator's all-reduce
print("%10s %12s %12s %12s %9s" % ("bytes", "link us", "model us", "formula us", "error"))
for b in sorted(link):
    t, m = link[b][key], model[b][key]
    f = 2 * (2 - 1) / 2 * b * 8 / (gbps * 1e9) * 1e6   # ring all-reduce, N = 2: 2(N-1)/N x bytes at the rate
    print("%10d %12.0f %12.0f %12.0f %+8.0f%%" % (b, t, m, f, (m - t) / t * 100))
EOF

echo "== 2b. 08's point-to-point (--pp 2, 2 ranks): shaped link vs model, per step"
printf '%-8s %14s %12s %12s %12s %9s\n' preset "bytes/step" "link ms" "model ms" "formula ms" error
for p in tiny small; do
  timeout 600 scripts/cluster.sh mpiexec -n 2 -ppn 1 ./08_pipeline/train --pp 2 --preset "$p" --steps "$steps" --device cpu \
    --json "$out/08_${p}_link.jsonl" >"$out/08_${p}_link.log" 2>&1
  timeout 600 mpiexec -n 2 ./08_pipeline/train --pp 2 --preset "$p" --steps "$steps" --device cpu --link-gbps "$gbps" \
    --json "$out/08_${p}_model.jsonl" >"$out/08_${p}_model.log" 2>&1
  python3 - "$out/08_${p}_link.jsonl" "$out/08_${p}_model.jsonl" "$gbps" "$p" <<'EOF'
import json, sys
def last(p):
    r = [json.loads(l) for l in open(p) if l.strip()]
    return [x for x in r if x.get("type") == "summary"][-1], [x for x in r if x.get("type") == "step"][-1]
(sl, stl), (sm, stm) = last(sys.argv[1]), last(sys.argv[2])
gbps = float(sys.argv[3])
b = stl["comm_bytes"]   # bytes this rank sent a step (activations forward, gradients back)
f = b * 8 / (gbps * 1e9) * 1e3
print("%-8s %14d %12.1f %12.1f %12.1f %+8.0f%%" % (sys.argv[4], b, sl["comm_ms"], sm["comm_ms"], f,
      (sm["comm_ms"] - sl["comm_ms"]) / sl["comm_ms"] * 100))
EOF
done
