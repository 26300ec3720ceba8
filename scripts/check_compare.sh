#!/usr/bin/env bash
# check_compare.sh (a test, tests/manifest.txt): make compare's table (scripts/compare.py) reads the
# runs' JSON lines right. It trains 01 and 03 for 3 steps on 1 and 2 ranks, and 02 for one step (all
# warm-up, nothing measured), on the tiny preset with an emulated link, then checks each row of the
# table against the records it was made from: the speed-up against 01 at the same rank count (1.00x
# for 01 itself), exposed within total communication, model state and activations in columns of their
# own, and the one-step run said to have no measured steps instead of shown as zeros.
set -u
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
train() {  # chapter ranks steps
  mpiexec -n "$2" "./$1/train" --quiet --device cpu --preset tiny --steps "$3" --link-gbps 1 --link-latency-us 20 \
    --json "$dir/$1_n$2.jsonl" </dev/null >"$dir/$1_n$2.log" 2>&1 || { echo "FAILED: $1 on $2 ranks"; cat "$dir/$1_n$2.log"; exit 1; }
}
for n in 1 2; do
  train 01_vanilla_dp "$n" 3
  train 03_bucket_dp "$n" 3
done
train 02_overlap_dp 2 1
python3 scripts/compare.py "$dir" >"$dir/table.txt" 2>&1 || { echo "FAILED: compare.py"; cat "$dir/table.txt"; exit 1; }
python3 - "$dir" <<'EOF'
import glob
import json
import os
import re
import sys

folder = sys.argv[1]
table = open(os.path.join(folder, "table.txt")).read()
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


records = {}
for path in glob.glob(os.path.join(folder, "*.jsonl")):
    run = {"steps": []}
    for line in open(path):
        r = json.loads(line)
        if r["type"] == "step":
            run["steps"].append(r)
        elif r["type"] in ("run", "summary", "theory"):
            run[r["type"]] = r
    records["%s x%d" % (run["run"]["chapter"], run["run"]["ranks"])] = run

header = table.splitlines()[0]
check("vs 01" in header, "no 'vs 01' column in: " + header)
check("exposed/total" in header, "no 'exposed/total' column in: " + header)
check("model state" in header and "activations" in header, "model state and activations not apart in: " + header)

# run, tok/s, vs 01, step ms, exposed / total, collectives, MB sent, model state MB, transient MB,
# activations MB, final loss: the row format of compare.py's print_table.
row = re.compile(r"^(\S+ x\d+)\s+([\d.]+)\s+(\S+)\s+([\d.]+)\s+([\d.]+) / +([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                 r"([\d.]+) MB\s+([\d.]+) MB\s+([\d.]+) MB\s+([\d.]+)$")
rows = {}
for line in table.splitlines():
    m = row.match(line)
    if m:
        rows[m.group(1)] = m.groups()[1:]


def mb(x):
    return "%.1f" % (x / 1e6)


for label, run in sorted(records.items()):
    s = run["summary"]
    if s["measured_steps"] == 0:
        lines = [l for l in table.splitlines() if l.startswith(label + " ")]
        check(len(lines) == 1 and "no measured steps" in lines[0],
              "%s (one step) is not said to have no measured steps: %s" % (label, lines))
        check(label not in rows, "%s (one step) is shown as a row of numbers" % label)
        continue
    if label not in rows:
        check(False, "no row for %s" % label)
        continue
    tok, speedup, step_ms, exposed, total, _, _, state, _, activations, loss = rows[label]
    base = records["01_vanilla_dp x%d" % run["run"]["ranks"]]["summary"]
    check(speedup == "%.2fx" % (s["tokens_per_s"] / base["tokens_per_s"]),
          "%s: vs 01 is %s, the records say %.4f" % (label, speedup, s["tokens_per_s"] / base["tokens_per_s"]))
    if label.startswith("01_"):
        check(speedup == "1.00x", "%s: vs 01 is %s, not 1.00x" % (label, speedup))
    check(float(exposed) <= float(total), "%s: exposed %s > total %s" % (label, exposed, total))
    check((exposed, total) == ("%.1f" % s["exposed_comm_ms"], "%.1f" % s["comm_ms"]),
          "%s: exposed/total %s / %s, the records say %s / %s" % (label, exposed, total, s["exposed_comm_ms"],
                                                                  s["comm_ms"]))
    if run["run"]["ranks"] > 1:
        check(float(total) > 0, "%s: no communication on %d ranks" % (label, run["run"]["ranks"]))
    check(state == mb(run["theory"]["measured_model_state_bytes"]),
          "%s: model state %s MB, the theory record says %s" % (label, state, mb(run["theory"]["measured_model_state_bytes"])))
    peak = max(step["mem_activations"] for step in run["steps"])
    check(activations == mb(peak), "%s: activations %s MB, the step records' peak is %s" % (label, activations, mb(peak)))
    check(step_ms == "%.1f" % s["step_ms"] and loss == "%.3f" % s["final_loss"],
          "%s: step ms or loss differ from the summary" % label)

if failures:
    print(table)
    print("\n".join("FAILED: " + f for f in failures))
    sys.exit(1)
print("compare.py's table matches the records of %d runs (one with no measured steps)" % len(records))
EOF
