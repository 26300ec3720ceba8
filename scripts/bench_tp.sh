#!/usr/bin/env bash
# bench_tp.sh: `make bench-tp`. Tensor parallelism (07) next to data parallelism (03) on the same
# global batch and rank count, one run after the other, and prints one table: where tensor
# parallelism's time goes, what its link costs, what sequence parallelism and overlap change.
# Settings: RANKS=2, PRESET=deep, STEPS=30, LINK (the data-parallel link, as make compare's) and
# TP_LINK (a node's faster link for the tensor-parallel group).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-2}
preset=${PRESET:-deep}
steps=${STEPS:-30}
link=${LINK:-"--link-gbps 2 --link-latency-us 100"}
tp_link=${TP_LINK:-"--tp-link-gbps 20 --tp-link-latency-us 10"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common="--preset $preset --steps $steps --quiet"
echo "bench-tp: $ranks ranks, $common, link: $link; fast tensor-parallel link: $tp_link"
runs=(
  "03 data parallel|03_bucket_dp|$link"
  "07 TP, DP's link|07_tensor_parallel|$link"
  "07 TP|07_tensor_parallel|$link $tp_link"
  "07 TP, no overlap|07_tensor_parallel|$link $tp_link --no-tp-overlap"
  "07 TP + SP|07_tensor_parallel|$link $tp_link --sequence-parallel"
)
i=0
for run in "${runs[@]}"; do
  IFS='|' read -r label chapter flags <<<"$run"
  # shellcheck disable=SC2086
  mpiexec -n "$ranks" "./$chapter/train" $common $flags --json "$out/$i.jsonl" </dev/null >"$out/$i.log" 2>&1 \
    || { echo "failed: $label"; tail -n 5 "$out/$i.log"; exit 1; }
  echo "$label" >"$out/$i.label"
  i=$((i + 1))
done
python3 - "$out" "$i" <<'PY'
import json, sys
folder, count = sys.argv[1], int(sys.argv[2])
rows = []
for i in range(count):
    records = {}
    with open("%s/%d.jsonl" % (folder, i)) as f:
        for line in f:
            r = json.loads(line)
            records.setdefault(r["type"], r)
    label = open("%s/%d.label" % (folder, i)).read().strip()
    rows.append((label, records["summary"], records["theory"], records["run"]))
base = rows[0][1]["step_ms"]
print("%-20s %8s %8s %17s %9s %11s %11s" % ("run", "step ms", "vs 03", "exposed/total ms", "MB sent", "model state",
                                            "activations"))
for label, s, t, run in rows:
    print("%-20s %8.1f %7.2fx %8.1f / %6.1f %9.2f %8.1f MB %8.1f MB" % (
        label, s["step_ms"], s["step_ms"] / base, s["exposed_comm_ms"], s["comm_ms"], s["comm_bytes_per_step"] / 1e6,
        t["measured_model_state_bytes"] / 1e6, t["measured_activations_bytes"] / 1e6))
print("(vs 03: step time as a multiple of 03's; MB sent: per rank and step, every group)")
PY
