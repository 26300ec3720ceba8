#!/usr/bin/env bash
# check_compare.sh (a test, tests/manifest.txt): make compare's table (scripts/compare/compare.py) reads the
# runs' JSON lines right. It trains 01 and 03 for 3 steps on 1 and 2 ranks, and 02 for one step (all
# warm-up, nothing measured), on the tiny preset with an emulated link, then checks each row of the
# table against the records it was made from: the speed-up against 01 at the same rank count (1.00x
# for 01 itself), exposed within total communication (medians over the same steps as the step time),
# model state and activations in columns of their own, and the one-step run said to have no measured steps instead of shown as zeros. 03 on 2 ranks
# runs in two rounds (results/rounds/, as make compare alternates them): its median and spread are
# over both rounds' steps. The busy-machine warning follows the load file; the losses line names the
# largest difference from 01 x1. The step-time model (compare_timing.py) is checked against the
# closed forms of docs/theory.md, section 11, on made-up traces; the step line has its fields, and a
# chapter without tensor parallelism has no tensor-parallel track in its trace. The 4-rank section
# (results/four_ranks/: 01 and 09 as TP 2 x PP 2, 3 steps) comes after the table, its rows against 01
# x4, without moving the table's own 'what changed' off its largest rank count, 2.
set -u
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
train() {  # chapter ranks steps [output name]
  out=${4:-$1_n$2}
  mpiexec -n "$2" "./$1/train" --quiet --device cpu --preset tiny --steps "$3" --link-gbps 1 --link-latency-us 20 \
    --json "$dir/$out.jsonl" --trace "$dir/$out.trace.json" </dev/null >"$dir/$out.log" 2>&1 \
    || { echo "FAILED: $1 on $2 ranks"; cat "$dir/$out.log"; exit 1; }
}
mkdir -p "$dir/rounds"
for n in 1 2; do
  train 01_vanilla_dp "$n" 3
  [ "$n" = 1 ] && train 03_bucket_dp 1 3
done
train 03_bucket_dp 2 3 rounds/03_bucket_dp_n2.r1
train 03_bucket_dp 2 3 rounds/03_bucket_dp_n2.r2
for ext in jsonl trace.json; do cp "$dir/rounds/03_bucket_dp_n2.r2.$ext" "$dir/03_bucket_dp_n2.$ext"; done
train 02_overlap_dp 2 1
mkdir -p "$dir/four_ranks"
train 01_vanilla_dp 4 3 four_ranks/01_vanilla_dp_n4
mpiexec -n 4 ./09_3d_parallel/train --quiet --device cpu --preset tiny --steps 3 --link-gbps 1 --link-latency-us 20 \
  --tp 2 --pp 2 --json "$dir/four_ranks/09_3d_parallel_n4.jsonl" </dev/null >"$dir/09_n4.log" 2>&1 \
  || { echo "FAILED: 09 on 4 ranks"; cat "$dir/09_n4.log"; exit 1; }
# The step line, as a user reads it (one rank, not --quiet).
mpiexec -n 1 ./01_vanilla_dp/train --device cpu --preset tiny --steps 2 </dev/null >"$dir/step_line.log" 2>&1
grep -Eq '^step 1/2 \| loss [0-9.]+ \| lr [0-9.]+e-[1-9][0-9]* \| grad norm [0-9.]+ \| [0-9.]+ ms \| [0-9.]+k? tok/s \| exposed comm [0-9.]+ ms \| mem [0-9.]+ [KMG]?B$' \
  "$dir/step_line.log" || { echo "FAILED: no step line of the documented form in:"; cat "$dir/step_line.log"; exit 1; }
# A loaded machine: the warning must appear (a quiet load file must not warn: checked below).
printf 'cores 2\nbefore 3.50 1.00 0.50 4/100 1\nbetween 3.60 1.00 0.50 3/100 1\nafter 5.40 2.00 1.00 1/100 1\n' >"$dir/load.txt"
python3 scripts/compare/compare.py "$dir" >"$dir/table.txt" 2>&1 || { echo "FAILED: compare.py"; cat "$dir/table.txt"; exit 1; }
printf 'cores 2\nbefore 0.20 1.00 0.50 1/100 1\nbetween 0.30 1.00 0.50 1/100 1\nafter 2.10 2.00 1.00 1/100 1\n' >"$dir/load.txt"
python3 scripts/compare/compare.py "$dir" >"$dir/quiet.txt" 2>&1 || { echo "FAILED: compare.py"; cat "$dir/quiet.txt"; exit 1; }
python3 - "$dir" <<'EOF'
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, "scripts/compare")  # compare.py and compare_timing.py, run from the repository root
import compare  # noqa: E402
import compare_timing as timing  # noqa: E402

folder = sys.argv[1]
table = open(os.path.join(folder, "table.txt")).read()
quiet = open(os.path.join(folder, "quiet.txt")).read()
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


check(table.startswith("WARNING: machine busy") and "on 2 cores" in table.splitlines()[0],
      "no busy-machine warning above the table for a load of 3.5 on 2 cores")
check("machine busy" not in quiet, "a warning on a quiet machine: " + quiet.splitlines()[0])
check(re.search(r"^losses: all \d+ runs equal 01 x1's at every step", table, re.M) is not None,
      "no losses line saying every run equals 01 x1")
for path in glob.glob(os.path.join(folder, "01_vanilla_dp_n*.trace.json")):
    check("tensor-parallel" not in open(path).read(), "%s has a tensor-parallel track without tensor parallelism" % path)

# The step-time model against docs/theory.md's closed forms, on made-up two-rank traces: spans are
# (tid, name, start, end, args); each rank's step is [0, 20].


def trace(ranks):
    events = []
    for pid, spans in enumerate(ranks):
        events.append({"ph": "X", "pid": pid, "tid": 0, "name": "step 1", "ts": 0, "dur": 20e3})
        for tid, name, start, end, args in spans:
            events.append({"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": start * 1e3,
                           "dur": (end - start) * 1e3, "args": args})
    path = os.path.join(folder, "made_up.trace.json")
    json.dump({"traceEvents": events}, open(path, "w"))
    return timing.modelled_steps(path)[1]


def op(issued, hold, end, group=""):
    return (1, "all_reduce", end - 1, end, {"detail": "100 B" + group, "issued_ms": issued, "link_ms": hold})


def wait(issued, start, end):
    return (2, "wait all_reduce", start, end, {"issued_ms": issued})


# 01: backward ends at 10, the all-reduce (hold 5) is waited at once, the optimizer takes the last
# 2 ms of host time (measured: waited 8 ms, 10..18): F + B + AR + U = 10 + 5 + 2 = 17.
one = [op(10, 5, 18), wait(10, 10, 18)]
check(abs(trace([one, one]) - 17) < 1e-6, "01's closed form: modelled %.3f, not 17" % trace([one, one]))
# 02: two all-reduces (hold 4) issued at 3 and 6 under backward (ends at 10): the link is busy 3..7,
# 7..11; the host waits for both at 10 and then works 9 ms more (measured: 11..20):
# max(F + B, c_last) + U = 11 + 9 = 20.
two = [op(3, 4, 7), op(6, 4, 11), wait(3, 10, 10), wait(6, 10, 11)]
check(abs(trace([two, two]) - 20) < 1e-6, "02's closed form: modelled %.3f, not 20" % trace([two, two]))
# A collective completes at its last rank's post: rank 1 issues the first at 8 instead of 3 (its
# own second at 9): they complete at 12 and 16, and rank 0 resumes at 16 with its 9 ms to go: 25.
late = [op(8, 4, 12), op(9, 4, 16), wait(8, 10, 12), wait(9, 12, 16)]
check(abs(trace([two, late]) - 25) < 1e-6, "a late rank: modelled %.3f, not 25" % trace([two, late]))
# An op with no wait in the step costs the host nothing: 20.
check(abs(trace([[op(3, 30, 19)], [op(3, 30, 19)]]) - 20) < 1e-6, "an op never waited for delays the step")


records = {}
for path in glob.glob(os.path.join(folder, "*.jsonl")):
    run = {"steps": [], "path": path}
    for line in open(path):
        r = json.loads(line)
        if r["type"] == "step":
            run["steps"].append(r)
        elif r["type"] in ("run", "summary", "theory"):
            run[r["type"]] = r
    records["%s x%d" % (run["run"]["chapter"], run["run"]["ranks"])] = run

header = next((l for l in table.splitlines() if l.startswith("run ")), "")
check("vs 01" in header, "no 'vs 01' column in: " + header)
check("exposed/total" in header, "no 'exposed/total' column in: " + header)
check("model state" in header and "activations" in header, "model state and activations not apart in: " + header)

# run, tok/s, vs 01, step ms (median), spread low-high, modelled, exposed / total, collectives, MB sent,
# model state MB, per Ψ, transient MB, activations MB, final loss: the row format of compare.py's print_table.
row = re.compile(r"^(\S+ x\d+)\s+([\d.]+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)-([\d.]+)\*?\s+(\S+)\s+([\d.]+) / +([\d.]+)\s+"
                 r"([\d.]+)\s+([\d.]+)\s+([\d.]+) MB\s+([\d.]+)Ψ\s+([\d.]+) MB\s+([\d.]+) MB\s+([\d.]+)$")
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
    tok, speedup, step_ms, low, high, modelled, exposed, total, _, _, state, per_psi, _, activations, loss = rows[label]
    # Every measured step of every round: the rounds' files where there are rounds, else the run's own.
    name = os.path.basename(run["path"])[: -len(".jsonl")]
    paths = sorted(glob.glob(os.path.join(folder, "rounds", name + ".r*.jsonl"))) or [run["path"]]
    steps = [json.loads(l)["step_ms"] for p in paths for l in open(p)
             if json.loads(l)["type"] == "step" and json.loads(l)["step"] > 0]
    if name.startswith("03_bucket_dp_n2"):
        check(len(paths) == 2 and len(steps) == 4, "03 x2: %d rounds, %d steps, not 2 and 4" % (len(paths), len(steps)))
    check(step_ms == "%.1f" % statistics.median(steps),
          "%s: median step %s, the rounds' records say %.1f" % (label, step_ms, statistics.median(steps)))
    check((low, high) == ("%.1f" % min(steps), "%.1f" % max(steps)),
          "%s: spread %s-%s, the records' min-max is %.1f-%.1f" % (label, low, high, min(steps), max(steps)))
    model = statistics.median([v for p in paths for v in timing.modelled_steps(p[: -len(".jsonl")] + ".trace.json").values()])
    check(modelled == "%.1f" % model, "%s: modelled %s, the traces replay to %.1f" % (label, modelled, model))
    if run["run"]["ranks"] == 1:  # nothing to communicate: the model is the measured step, step by step
        check(modelled == step_ms, "%s: one rank, modelled %s differs from measured %s" % (label, modelled, step_ms))
    else:
        check(float(modelled) > 0, "%s: modelled %s" % (label, modelled))
    check(per_psi == "%.1f" % (run["theory"]["measured_model_state_bytes"] / run["run"]["params"]),
          "%s: model state per parameter %sΨ" % (label, per_psi))

    def tokens(r):
        p = r["path"]
        name = os.path.basename(p)[: -len(".jsonl")]
        ps = sorted(glob.glob(os.path.join(folder, "rounds", name + ".r*.jsonl"))) or [p]
        ms = statistics.median([json.loads(l)["step_ms"] for q in ps for l in open(q)
                                if json.loads(l)["type"] == "step" and json.loads(l)["step"] > 0])
        return r["run"]["batch"] * r["run"]["T"] / (ms / 1e3)

    base = records["01_vanilla_dp x%d" % run["run"]["ranks"]]
    check(tok == "%.0f" % tokens(run), "%s: tok/s %s, the median step gives %.0f" % (label, tok, tokens(run)))
    check(speedup == "%.2fx" % (tokens(run) / tokens(base)),
          "%s: vs 01 is %s, the records say %.4f" % (label, speedup, tokens(run) / tokens(base)))
    if label.startswith("01_"):
        check(speedup == "1.00x", "%s: vs 01 is %s, not 1.00x" % (label, speedup))
    check(float(exposed) <= float(total), "%s: exposed %s > total %s" % (label, exposed, total))
    # From the same steps as the step column: every round's, not the last round's summary.
    step_records = [json.loads(l) for p in paths for l in open(p)
                    if json.loads(l)["type"] == "step" and json.loads(l)["step"] > 0]
    median_exposed = statistics.median(r["exposed_comm_ms"] for r in step_records)
    median_total = statistics.median(r["comm_ms"] for r in step_records)
    check((exposed, total) == ("%.1f" % median_exposed, "%.1f" % median_total),
          "%s: exposed/total %s / %s, the medians of the step column's steps are %.1f / %.1f" % (
              label, exposed, total, median_exposed, median_total))
    plotted = compare.communication_bars(timing.attach_rounds([{"name": name, "run": run["run"],
                                                                "summary": s}], folder))
    # Equal up to summation order: rounding both to 6 places failed whenever a median of two steps fell
    # on a half-millionth (37.4359275), one side's last bit rounding up and the other's down.
    check(all(abs(v[0] - want) <= 1e-9 * max(1.0, abs(want)) for v, want in
              zip(plotted, (median_total, median_exposed, statistics.median(steps)))) and len(plotted) == 3,
          "%s: communication.png draws total, exposed, step %s, not the table's steps' medians" % (label, plotted))
    if run["run"]["ranks"] > 1:
        check(float(total) > 0, "%s: no communication on %d ranks" % (label, run["run"]["ranks"]))
    check(state == mb(run["theory"]["measured_model_state_bytes"]),
          "%s: model state %s MB, the theory record says %s" % (label, state, mb(run["theory"]["measured_model_state_bytes"])))
    peak = max(step["mem_activations"] for step in run["steps"])
    check(activations == mb(peak), "%s: activations %s MB, the step records' peak is %s" % (label, activations, mb(peak)))
    check(loss == "%.3f" % s["final_loss"], "%s: loss differs from the summary" % label)

# The 4-rank section: after the table and its reading, 09 x4 against 01 x4; the table's own reading
# stays at 2 ranks.
main, _, section = table.partition("\n09 on its own grid, at 4 ranks")
check(section != "", "no 4-rank section after the table")
check("What changed, at 2 ranks" in main, "the table's reading left 2 ranks: the 4-rank runs leaked into it")
four = {}
for line in section.splitlines():
    m = row.match(line)
    if m:
        four[m.group(1)] = m.groups()[1:]
check(sorted(four) == ["01_vanilla_dp x4", "09_3d_parallel x4"], "4-rank rows: %s" % sorted(four))
if "09_3d_parallel x4" in four and "01_vanilla_dp x4" in four:
    nine = {}
    for l in open(os.path.join(folder, "four_ranks", "09_3d_parallel_n4.jsonl")):
        r = json.loads(l)
        nine[r["type"]] = r
    check(four["01_vanilla_dp x4"][1] == "1.00x", "01 x4 is not the section's baseline: %s" % four["01_vanilla_dp x4"][1])
    x = float(four["09_3d_parallel x4"][0]) / float(four["01_vanilla_dp x4"][0])
    check(abs(float(four["09_3d_parallel x4"][1][:-1]) - x) < 0.011, "09 x4: vs 01 %s, tok/s say %.3f" % (
        four["09_3d_parallel x4"][1], x))
    check(four["09_3d_parallel x4"][10] == mb(nine["theory"]["measured_model_state_bytes"]),
          "09 x4: model state %s MB, its theory record says %s" % (four["09_3d_parallel x4"][10],
                                                                  mb(nine["theory"]["measured_model_state_bytes"])))
    check(re.search(r"^losses: all 1 runs equal 01 x4's at every step", section, re.M) is not None,
          "no losses line for the 4-rank section")
    check(re.search(r"^  09  TP 2 x PP 2: model state %s MB per rank \(01 DP 4: %s\)" % (
        re.escape(mb(nine["theory"]["measured_model_state_bytes"])), re.escape(four["01_vanilla_dp x4"][10])),
        section, re.M) is not None, "no reading of 09 x4 against 01 x4")

if failures:
    print(table)
    print("\n".join("FAILED: " + f for f in failures))
    sys.exit(1)
print("compare.py's table matches the records of %d runs (one with no measured steps)" % len(records))
EOF
