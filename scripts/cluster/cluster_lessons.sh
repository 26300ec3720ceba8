#!/usr/bin/env bash
# cluster_lessons.sh: two lessons measured on the cluster's shaped link (make cluster-lessons;
# docs/cluster.md). Needs the cluster up with 2 nodes (scripts/cluster/cluster.sh up 2 GBPS).
#  1. Placement, Megatron's rule: at 2 nodes x 2 ranks, 07 (TP 2 x DP 2) and 09 (TP 2 x PP 2) with
#     the tensor-parallel pairs inside a node (hostfile order, -ppn 2: ranks 0,1 on node0) and across
#     the nodes (-ppn 1: ranks alternate node0, node1). Average step time and each group's exposed time.
#  2. The link model against the link: chapter 00's --communicator all-reduce (the Communicator 03 uses) and
#     08's point-to-point activations at 2 nodes x 1 rank on the shaped link, against the same runs
#     on one host with --link-gbps GBPS (the model, latency 0), and against the formula.
#  Beside each measurement, chapter 09's planner's prediction of the same configuration
#  (plan --one --cluster namespaces --inter-gbps GBPS), its CPU rates calibrated by one run of 01 on one
#  host at the same number of ranks (scripts/plan/plan_calibrate.py). Without 09_3d_parallel/plan the
#  measurements are printed alone.
#   PRESET=small STEPS=8 BATCH=8 scripts/cluster/cluster_lessons.sh   (results in results/cluster/lessons/)
set -euo pipefail
cd "$(dirname "$0")/../.."
preset=${PRESET:-small}
steps=${STEPS:-8}
batch=${BATCH:-8}  # every run's global batch, the calibration's and the planner's too
out=${OUT_DIR:-results/cluster/lessons}
mkdir -p "$out"
state=${CLUSTER_STATE:-build/cluster}
[ -f "$state/env" ] || { echo "the cluster is not up: scripts/cluster/cluster.sh up 2 GBPS"; exit 1; }
gbps=$(sed -n 's/^CLUSTER_GBPS=//p' "$state/env")
plan=09_3d_parallel/plan
have_plan=0
if [ -x "$plan" ]; then have_plan=1; else echo "(09_3d_parallel/plan is not built: measurements only; make 09_3d_parallel/plan)"; fi
# The planner's rates for RANKS ranks sharing this machine's cores: one run of 01 on one host, no link
# (the cluster's nodes share the same cores, so a rank computes as fast there as here).
calibrate() {  # ranks -> "peak elementwise", or nothing (and no predictions) if the run fails
  local ranks=$1 cal="$out/calibration_${preset}_$1"
  [ "$have_plan" = 1 ] || return 0
  if timeout 600 mpiexec -n "$ranks" ./01_vanilla_dp/train --preset "$preset" --batch "$batch" --steps "$((steps > 8 ? steps : 8))" \
      --device cpu --quiet --json "$cal.jsonl" </dev/null >"$cal.log" 2>&1; then
    python3 scripts/plan/plan_calibrate.py "$cal.jsonl" "$plan" "$preset" "$ranks" "$batch" 2>"$cal.why" || true
    sed 's/^/   /' "$cal.why" >&2
  else
    echo "   (calibration on $ranks ranks failed, no predictions: $cal.log)" >&2
  fi
}
# plan --one on the namespaces cluster with the calibrated rates and the flags given (the links among
# them); prints the plan-json fields asked for (a+b: their sum), in ms, or "-" for each when there is
# no planner or calibration.
predict() {  # "peak elementwise" "plan flags" field...
  local rates=$1 flags=$2 peak elementwise; shift 2
  if [ -z "$rates" ]; then for _ in "$@"; do printf -- '- '; done; echo; return; fi
  read -r peak elementwise <<<"$rates"
  "$plan" --one --model "$model" --cluster namespaces --efficiency 1 --peak-flops "$peak" \
    --elementwise-rate "$elementwise" $flags | python3 -c 'import json,sys
r=[json.loads(l[10:]) for l in sys.stdin if l.startswith("plan-json ")][0]
print(" ".join("%.1f" % (sum(r[k] for k in f.split("+")) * 1e3) for f in sys.argv[1:]))' "$@" || {
    for _ in "$@"; do printf -- '? '; done; echo; }
}
# The namespaces preset's shared-memory link ("GBPS US"), to hand it to the group that stays inside a
# node when the tensor-parallel pairs are placed across the nodes.
shm_link() {
  "$plan" --one --model "$preset" --cluster namespaces --gpus 2 --batch "$batch" |
    sed -n 's/.*links per GPU \([0-9.e+]*\) Gb\/s \([0-9.e+]*\) us in a node.*/\1 \2/p'
}
model=$preset

# Averages over the measured steps (step 0 is warm-up) of the step and of each group's exposed time,
# the way the planner splits a step: TP's collectives, DP's gradients, a rank's waits for the
# pipeline's messages (bubble included: a rank waiting for the previous stage cannot tell the two
# apart), the tied embedding's all-reduce.
groups() {  # jsonl -> "step tp dp pp embedding" (ms)
  python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; st=[x for x in r if x.get("type")=="step" and x["step"]>0]
keys=["step_ms","tp_exposed_comm_ms","dp_exposed_comm_ms","pipeline_waits_ms","embedding_exposed_comm_ms"]
print(" ".join("%.1f" % (sum(x.get(k, 0) for x in st) / len(st)) for k in keys))' "$1"
}

echo "== 1. placement at 2 nodes x 2 ranks, link $gbps Gbit/s, preset $preset, $steps steps; each cell: measured / planned ms"
rates4=$(calibrate 4)
shm=""
[ -z "$rates4" ] || shm=$(shm_link)
cell() { printf '%7s / %-7s' "$1" "$2"; }
printf '%-29s %-17s %-17s %-17s %-17s %-17s %s\n' run "TP pairs" "  step" "  TP exposed" "  DP exposed" \
  "  PP waits" "  embedding"
for entry in "07_tensor_parallel|--tp 2|--tp 2" "09_3d_parallel|--tp 2 --pp 2|--tp 2 --pp 2 --micro-batches 4"; do
  IFS='|' read -r chapter flags plan_flags <<<"$entry"
  for ppn in 2 1; do
    where=$([ "$ppn" = 2 ] && echo "inside a node" || echo "across the nodes")
    name="${chapter}_ppn$ppn"
    timeout 600 scripts/cluster/cluster.sh mpiexec -n 4 -ppn "$ppn" "./$chapter/train" --preset "$preset" --batch "$batch" --steps "$steps" \
      --device cpu $flags --json "$out/$name.jsonl" >"$out/$name.log" 2>&1 || { echo "$name FAILED"; cat "$out/$name.log"; exit 1; }
    read -r step tp dp pp emb < <(groups "$out/$name.jsonl")
    # The planner's grid puts TP inside a node and the other group across; with the pairs across the
    # nodes the links are swapped: TP gets the shaped rate (--intra-gbps), the other group shared memory.
    links="--inter-gbps $gbps"
    if [ "$ppn" = 1 ] && [ -n "$shm" ]; then
      read -r shm_gbps shm_us <<<"$shm"
      links="--intra-gbps $gbps --intra-latency-us 50 --inter-gbps $shm_gbps --inter-latency-us $shm_us"
    fi
    read -r p_step p_tp p_dp p_pp p_emb < <(predict "$rates4" "--gpus 4 --batch $batch $plan_flags $links" \
      step_s tp_s dp_s bubble_s+pp_s embedding_s)
    printf '%-29s %-17s %s %s %s %s %s\n' "$chapter $flags" "$where" "$(cell "$step" "$p_step")" "$(cell "$tp" "$p_tp")" \
      "$(cell "$dp" "$p_dp")" "$(cell "$pp" "$p_pp")" "$(cell "$emb" "$p_emb")"
  done
done
if [ -n "$rates4" ]; then
  echo "(planned: 09_3d_parallel/plan --one --cluster namespaces --inter-gbps $gbps, CPU rates from the 4-rank"
  echo " calibration above; PP waits planned = its bubble + what the messages add. Across the nodes the planner is"
  echo " given swapped links: TP on the shaped one (--intra-gbps $gbps --intra-latency-us 50), DP or PP on shared"
  echo " memory (--inter-gbps ${shm% *}), since its grid always puts TP inside a node.)"
fi

echo "== 2a. all-reduce (00_collectives --communicator, ours), 2 ranks: shaped $gbps Gbit/s link vs --link-gbps $gbps model on one host"
timeout 600 scripts/cluster/cluster.sh mpiexec -n 2 -ppn 1 ./00_collectives/collectives --communicator --min-bytes 16384 --max-bytes 16777216 \
  --json "$out/allreduce_link.jsonl" >"$out/allreduce_link.log" 2>&1
timeout 600 mpiexec -n 2 ./00_collectives/collectives --communicator --min-bytes 16384 --max-bytes 16777216 --link-gbps "$gbps" \
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
echo "(the planner has no prediction of one all-reduce: its DP term times the gradients with this formula (the"
echo " communicator's modelled_ms), plus 2(N-1) x the namespaces preset's 50 us latency)"

echo "== 2b. 08's point-to-point (--pp 2, 2 ranks): shaped link vs model, per step"
printf '%-8s %14s %12s %12s %12s %9s | %8s %9s %9s\n' preset "bytes/step" "link ms" "model ms" "formula ms" error "plan PP" "link step" "plan step"
for p in tiny small; do
  timeout 600 scripts/cluster/cluster.sh mpiexec -n 2 -ppn 1 ./08_pipeline/train --pp 2 --preset "$p" --batch "$batch" --steps "$steps" \
    --device cpu --json "$out/08_${p}_link.jsonl" >"$out/08_${p}_link.log" 2>&1
  timeout 600 mpiexec -n 2 ./08_pipeline/train --pp 2 --preset "$p" --batch "$batch" --steps "$steps" --device cpu --link-gbps "$gbps" \
    --json "$out/08_${p}_model.jsonl" >"$out/08_${p}_model.log" 2>&1
  # The 2-rank calibration is 01 with this preset: the planner's rates depend on the model's shapes.
  rates2=$(preset=$p; calibrate 2)
  planned=$(model=$p; predict "$rates2" "--gpus 2 --batch $batch --gpus-per-node 1 --pp 2 --micro-batches 4 --inter-gbps $gbps" pp_s step_s)
  python3 - "$out/08_${p}_link.jsonl" "$out/08_${p}_model.jsonl" "$gbps" "$p" "$planned" <<'EOF'
import json, sys
def last(p):
    r = [json.loads(l) for l in open(p) if l.strip()]
    return [x for x in r if x.get("type") == "summary"][-1], [x for x in r if x.get("type") == "step"][-1]
(sl, stl), (sm, stm) = last(sys.argv[1]), last(sys.argv[2])
gbps = float(sys.argv[3])
b = stl["comm_bytes"]   # bytes this rank sent a step (activations forward, gradients back)
f = b * 8 / (gbps * 1e9) * 1e3
planned = (sys.argv[5].split() + ["-", "-"])[:2]
print("%-8s %14d %12.1f %12.1f %12.1f %+8.0f%% | %8s %9.1f %9s" % (sys.argv[4], b, sl["comm_ms"], sm["comm_ms"], f,
      (sm["comm_ms"] - sl["comm_ms"]) / sl["comm_ms"] * 100, planned[0], sl["step_ms"], planned[1]))
EOF
done
if [ "$have_plan" = 1 ]; then
  echo "(plan PP: what the planner says the stages' messages add to the step, 08's simulator on the shaped link"
  echo " at 2 nodes x 1 rank (--gpus-per-node 1); link step: the measured step on the shaped link, plan step its"
  echo " prediction. Rates from a 2-rank calibration of each preset. Like the measured comm ms, PP counts only the"
  echo " time the messages are waited for.)"
fi
