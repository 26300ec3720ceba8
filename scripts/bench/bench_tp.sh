#!/usr/bin/env bash
# bench_tp.sh: `make bench-tp`. Tensor parallelism (07) next to data parallelism (03) at the same
# rank count and global batch, on three links, one run after the other; prints one table. It shows
# where tensor parallelism's time goes (its collectives sit inside forward and backward), what a
# slow link does to it, and what sequence parallelism and --tp-overlap change.
#   links: none (shared memory), "in a node" (--link-gbps 5 --link-latency-us 5) and "across
#          nodes" (--link-gbps 0.5 --link-latency-us 50), each for every group;
#   runs:  03 (DP), 07 at TP 2, TP 2 + --tp-overlap, TP 2 + SP, TP 2 + SP + --tp-overlap (with more ranks than 2, the rest
#          of 07's ranks are data-parallel).
# Settings: RANKS=2, PRESET=small, STEPS=20. Columns: step time; the exposed communication of the
# tensor-parallel group and of the data-parallel one (03's is all data-parallel); activations and
# peak memory per rank, measured. Averages leave out step 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${RANKS:-2}
preset=${PRESET:-small}
steps=${STEPS:-20}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bench-tp: $ranks ranks, --preset $preset --steps $steps (RANKS=, PRESET=, STEPS= change it)"
links=("no link|" "in a node|--link-gbps 5 --link-latency-us 5" "across nodes|--link-gbps 0.5 --link-latency-us 50")
runs=("03 DP|03_bucket_dp|" "07 TP 2|07_tensor_parallel|--tp 2" "07 TP 2 + overlap|07_tensor_parallel|--tp 2 --tp-overlap"
      "07 TP 2 + SP|07_tensor_parallel|--tp 2 --sequence-parallel"
      "07 TP 2 + SP + overlap|07_tensor_parallel|--tp 2 --sequence-parallel --tp-overlap")
i=0
for link in "${links[@]}"; do
  IFS='|' read -r link_name link_flags <<<"$link"
  for run in "${runs[@]}"; do
    IFS='|' read -r label chapter flags <<<"$run"
    # shellcheck disable=SC2086
    mpiexec -n "$ranks" "./$chapter/train" --preset "$preset" --steps "$steps" --quiet $link_flags $flags \
      --json "$out/$i.jsonl" </dev/null >"$out/$i.log" 2>&1 \
      || { echo "failed: $label, $link_name"; tail -n 5 "$out/$i.log"; exit 1; }
    printf '%s\t%s\n' "$link_name" "$label" >"$out/$i.label"
    i=$((i + 1))
  done
done
python3 - "$out" "$i" <<'PY'
import json, sys
folder, count = sys.argv[1], int(sys.argv[2])
print("%-13s %-23s %8s %7s %12s %12s %12s %10s" % ("link", "run", "step ms", "vs DP", "exposed TP", "exposed DP",
                                                    "activations", "peak mem"))
base = None
for i in range(count):
    link, label = open("%s/%d.label" % (folder, i)).read().rstrip("\n").split("\t")
    steps, theory = [], {}
    with open("%s/%d.jsonl" % (folder, i)) as f:
        for line in f:
            r = json.loads(line)
            if r["type"] == "step" and r["step"] >= 1:
                steps.append(r)
            elif r["type"] == "theory":
                theory = r
    mean = lambda key: sum(s.get(key, 0.0) for s in steps) / len(steps)
    step_ms = mean("step_ms")
    if label.startswith("03"):
        base, tp, dp = step_ms, 0.0, mean("exposed_comm_ms")
    else:
        tp, dp = mean("tp_exposed_comm_ms"), mean("dp_exposed_comm_ms")
    print("%-13s %-23s %8.1f %6.2fx %9.1f ms %9.1f ms %9.1f MB %7.1f MB" % (
        link, label, step_ms, step_ms / base, tp, dp, theory["measured_activations_bytes"] / 1e6,
        max(s["mem_total"] for s in steps) / 1e6))
print("(vs DP: step time as a multiple of 03's on the same link; memory per rank)")
PY
