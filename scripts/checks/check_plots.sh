#!/usr/bin/env bash
# check_plots.sh (a test, tests/manifest.txt): the plots say what the runs' records say. It trains 08
# (zb-h1, small preset, 2 stages) and 01 on one and two ranks (tiny), 3 steps each, then checks:
#   timeline    08's header counts communication as the table does (the drawn step's comm_ms and
#               exposed_comm_ms, the run's means beside them, the pipeline's sends and receives apart),
#               08's passes get the forward, backward and weights' colours, and only the passes, not
#               the layers inside them, get a label;
#   schedules   build/pipeline_ideal, fed the one run's pass times, gives every schedule's ideal step
#               in the theory's order (afab = 1f1b, interleaved and zb-h1 shorter), and
#               plot_pipeline.py draws the ideal from that file and refuses one of another schedule;
#   loss        the coinciding runs are said to coincide, and a run whose losses were changed is named
#               as the one that differs, with the largest difference.
set -u
cd "$(dirname "$0")/../.."
export PYTHONDONTWRITEBYTECODE=1  # the checks import the plotting scripts: no __pycache__ left in scripts/
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
[ -x build/pipeline_ideal ] || { echo "FAILED: build/pipeline_ideal is missing (make tests builds it)"; exit 1; }
train() {  # name ranks chapter flags...
  local name=$1 n=$2 chapter=$3
  shift 3
  mpiexec -n "$n" "./$chapter/train" --quiet --device cpu --steps 3 --link-gbps 1 --link-latency-us 20 "$@" \
    --json "$dir/$name.jsonl" --trace "$dir/$name.trace.json" </dev/null >"$dir/$name.log" 2>&1 \
    || { echo "FAILED: $name"; cat "$dir/$name.log"; exit 1; }
}
train 08_pipeline_n2 2 08_pipeline --preset small --schedule zb-h1
train 01_vanilla_dp_n2 2 01_vanilla_dp --preset tiny
train 01_vanilla_dp_n1 1 01_vanilla_dp --preset tiny
python3 scripts/compare/plot_timeline.py --out "$dir/timeline.png" "$dir/01_vanilla_dp_n2.trace.json" \
  "$dir/08_pipeline_n2.trace.json" >"$dir/timeline.txt" 2>&1 || { echo "FAILED: plot_timeline.py"; cat "$dir/timeline.txt"; exit 1; }
measured=$(python3 -c '
import json, sys
stages = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "pipeline_stage"]
print("/".join("%.6g" % sum(r[k] for r in stages) for k in ("forward_ms", "backward_ms", "weight_ms")))' \
  "$dir/08_pipeline_n2.jsonl")
for schedule in afab 1f1b interleaved zb-h1; do
  build/pipeline_ideal --preset small --pp 2 --micro-batches 4 --schedule "$schedule" --measured "$measured" \
    --measured-by zb-h1 >"$dir/ideal_$schedule.jsonl" || { echo "FAILED: pipeline_ideal --schedule $schedule"; exit 1; }
done
cp "$dir/ideal_zb-h1.jsonl" "$dir/08_pipeline_n2.ideal.jsonl"
python3 scripts/bench/plot_pipeline.py --out "$dir/pipeline.png" "$dir/08_pipeline_n2" >"$dir/pipeline.txt" 2>&1 \
  || { echo "FAILED: plot_pipeline.py"; cat "$dir/pipeline.txt"; exit 1; }
cp "$dir/ideal_1f1b.jsonl" "$dir/08_pipeline_n2.ideal.jsonl"
if python3 scripts/bench/plot_pipeline.py --out "$dir/wrong.png" "$dir/08_pipeline_n2" >"$dir/wrong.txt" 2>&1 \
  || ! grep -q "simulates 1f1b p 2 m 4 v 1, but its run is zb-h1" "$dir/wrong.txt"; then
  echo "FAILED: plot_pipeline.py drew an ideal of another schedule:"; cat "$dir/wrong.txt"; exit 1
fi
python3 - "$dir" <<'EOF'
import json
import os
import re
import sys

folder = sys.argv[1]
# Run from the repository root: make compare's modules, and the planner's heat map (imported below).
sys.path[:0] = ["scripts/compare", "scripts/plan"]
import compare  # noqa: E402
import compare_plots  # noqa: E402
import plot_timeline  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def records(name):
    return [json.loads(line) for line in open(os.path.join(folder, name + ".jsonl"))]


# Timeline: 08's header against its records.
headers = open(os.path.join(folder, "timeline.txt")).read()
m = re.search(r"08_pipeline \(rank 0\)\s+step (\d+): [\d.]+ ms\s+\|\s+communication ([\d.]+) ms \(run's mean ([\d.]+)\), "
              r"exposed ([\d.]+) ms \(([\d.]+)\)\s+\|\s+pipeline p2p apart: in flight ([\d.]+) ms, waited ([\d.]+) ms",
              headers)
check(m is not None, "08's timeline header is not in the table's terms: " + headers)
if m:
    run = records("08_pipeline_n2")
    step = next(r for r in run if r["type"] == "step" and r["step"] == int(m.group(1)))
    summary = next(r for r in run if r["type"] == "summary")
    want = ["%.1f" % x for x in (step["comm_ms"], summary["comm_ms"], step["exposed_comm_ms"],
                                 summary["exposed_comm_ms"], step["pp_comm_ms"], step["pipeline_waits_ms"])]
    check(list(m.groups()[1:]) == want, "08's header says %s, the records %s" % (list(m.groups()[1:]), want))
m = re.search(r"01_vanilla_dp \(rank 0\)\s+step (\d+): [\d.]+ ms\s+\|\s+communication ([\d.]+) ms", headers)
check(m is not None and "pipeline" not in headers.splitlines()[0], "01's header: " + headers)

# Timeline: 08's passes in the phases' colours, labelled; the layers inside them not.
spans = plot_timeline.load_spans(os.path.join(folder, "08_pipeline_n2.trace.json"), 0)
step = plot_timeline.step_spans(spans)[1]
depth = plot_timeline.nesting(spans, step["start"], step["end"])
passes = [s for s in spans if plot_timeline.PASS.fullmatch(s["name"]) and step["start"] <= s["start"] < step["end"]]
kinds = {s["name"][0] for s in passes}
check(kinds == {"F", "B", "W"}, "08 (zb-h1) step 1 has passes %s, not F, B and W" % sorted(kinds))
want = {"F": plot_timeline.PHASE_COLORS["forward"], "B": plot_timeline.PHASE_COLORS["backward"],
        "W": plot_timeline.WEIGHT_COLOR}
for s in passes:
    check(plot_timeline.color_of(s) == want[s["name"][0]], "%s drawn in %s" % (s["name"], plot_timeline.color_of(s)))
    check(depth[id(s)] == 0, "%s is drawn as nested in another span" % s["name"])
layers = [s for s in spans if s["tid"] == plot_timeline.COMPUTE and re.match(r"(forward|backward) ", s["name"])
          and step["start"] <= s["start"] < step["end"]]
check(layers and all(depth[id(s)] > 0 for s in layers), "08's layer spans are not nested inside its passes")

# Schedules: the ideal steps from one set of pass times, in the theory's order.
ideal = {}
for schedule in ("afab", "1f1b", "interleaved", "zb-h1"):
    ideal[schedule] = next(r for r in map(json.loads, open(os.path.join(folder, "ideal_%s.jsonl" % schedule)))
                           if r["type"] == "pipeline")["simulated_step_ms"]
check(abs(ideal["afab"] - ideal["1f1b"]) <= 1e-6 * ideal["1f1b"], "ideal afab %(afab)g != 1f1b %(1f1b)g" % ideal)
check(ideal["zb-h1"] < ideal["1f1b"], "ideal zb-h1 %(zb-h1)g not shorter than 1f1b %(1f1b)g" % ideal)
check(ideal["interleaved"] < ideal["1f1b"], "ideal interleaved %(interleaved)g not shorter than 1f1b %(1f1b)g" % ideal)
drawn = open(os.path.join(folder, "pipeline.txt")).read()
check("ideal %.1f ms (zb-h1's pass times" % ideal["zb-h1"] in drawn, "plot_pipeline.py's ideal is not the file's: " + drawn)

# Loss: the 01 runs coincide; a copy of one with its losses moved is named as differing.
runs = [r for r in compare.load_runs(folder) if r["run"]["chapter"] == "01_vanilla_dp"]  # 08 ran another preset
same = compare_plots.plot_loss(runs, folder)
check(same is not None and same[0] == [], "01 x1 and x2 are said to differ: %s" % (same,))
moved = [dict(r) for r in runs if r["name"] == "01_vanilla_dp_n2"][0]
moved["run"] = dict(moved["run"], chapter="02_overlap_dp")
moved["steps"] = [dict(s, loss=s["loss"] * (1 + 1e-3 * s["step"])) for s in moved["steps"]]
differ, worst = compare_plots.plot_loss(runs + [moved], folder)
last = max(s["step"] for s in moved["steps"])
check(differ == ["02_overlap_dp x2"], "the moved run is not the one named as differing: %s" % differ)
check(worst[0] == "02_overlap_dp x2" and worst[1] == last, "largest difference at %s" % (worst,))
check(os.path.exists(os.path.join(folder, "loss.png")), "no loss.png")

# The timeline's legend tells 10's ring from 08's pipeline, and 11's all-to-alls from "scalars, other".
def span(name, detail):
    return {"name": name, "tid": plot_timeline.COMM, "detail": detail, "start": 0, "end": 1}


ring, pipe = span("send", "4096 B, cp"), span("send", "4096 B, pp")
check(plot_timeline.color_of(ring) != plot_timeline.color_of(pipe), "10's ring drawn in 08's pipeline colour")
for name in ("all_to_all", "all_to_all_v"):
    check(plot_timeline.color_of(span(name, "4096 B, ep")) != plot_timeline.OTHER_COLOR,
          "11's %s drawn as 'scalars, other'" % name)

# plan_heatmap.png: every abbreviation its cells use has a key, and the 1T model is not called 998B.
import plot_plan_heatmap  # noqa: E402
cell = {"tp": "8", "cp": "2", "pp": "16", "dp": "8", "ep": "8", "v": "4", "micro_batch": "1", "sp": "1"}
for schedule in ("1f1b", "interleaved", "zb-h1", "dualpipev"):
    for zero in ("0", "1", "2", "3"):
        for recompute in ("none", "selective", "full"):
            row = dict(cell, schedule=schedule, zero=zero, recompute=recompute)
            text = plot_plan_heatmap.label(row)
            for term in plot_plan_heatmap.abbreviations(row):
                check(term in plot_plan_heatmap.KEY_TERMS and term in plot_plan_heatmap.KEY,
                      "plan_heatmap.png's key does not explain %s (a cell reads %r)" % (term, text))
            # Every token of the cell, read apart from abbreviations(): which key explains it.
            tokens = text.replace("\n", " ").split()
            for i, token in enumerate(tokens):
                if token == "rc" or (i > 0 and tokens[i - 1] == "rc"):
                    key = "rc full, rc selective"
                elif re.fullmatch(r"[tcpde]\d+", token):
                    key = "t, c, p, d, e"
                elif re.fullmatch(r"B\d+", token):
                    key = "B8"
                elif re.fullmatch(r"Z\d", token):
                    key = "Z1, Z2, Z3"
                elif re.fullmatch(r"interleaved/\d+", token):
                    key = "interleaved/4"
                elif token in ("1f1b", "zb-h1", "dualpipev"):
                    key = "1f1b, zb-h1, dualpipev"
                else:
                    key = token
                check(key in plot_plan_heatmap.KEY_TERMS, "a cell's %r has no key (%r)" % (token, text))
check(plot_plan_heatmap.size_label(998e9) == "1T", "the 1T model is labelled %s" % plot_plan_heatmap.size_label(998e9))
check(plot_plan_heatmap.size_label(1.002e12) == "1T", "the 1T model is labelled %s" % plot_plan_heatmap.size_label(1.002e12))

# throughput.png: a run on a model of its own (11) gets a panel of its own, so that its tokens/s do not
# flatten the others'; loss.png says which runs it leaves out.
own = [dict(r, run=dict(r["run"], chapter="11_expert_parallel", preset="moe-tiny")) for r in runs[:1]]
check(len(compare.throughput_panels(runs + own)) == 2 and compare.throughput_panels(runs + own)[1] == own,
      "11's own-model run shares throughput.png's axis with 01's model")
compare_plots.plot_loss(runs + own, folder)
check("11_expert_parallel" in compare_plots.LAST_LOSS_TITLE, "loss.png leaves out 11's runs without saying so: "
      + compare_plots.LAST_LOSS_TITLE)

if failures:
    print("\n".join("FAILED: " + f for f in failures))
    sys.exit(1)
print("plots match the records: 08's timeline header, its passes' colours, the ideal schedules' order, the losses; "
      "the timeline's and heat map's keys; 11 apart in throughput.png and named in loss.png")
EOF
