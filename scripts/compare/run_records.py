"""run_records.py: reads what a run writes, for the plot and table scripts: compare.py, compare_timing.py,
plot_timeline.py and plot_experts.py beside it, and scripts/bench/'s plot_pipeline.py, plot_cp_balance.py
and plot_collectives.py (which put this folder on sys.path). Defines
  read_run(path, kinds, lists)  one JSON-lines file (--json, or build/pipeline_ideal's): {"steps": [step
                                 records], kind: the last record of each kind in `kinds`, kind: [every
                                 record] for each kind in `lists`}
  COMPUTE, COMM, WAIT, TENSOR    the trace's tracks (tids; Track in common/comm/trace.h)
  step_spans(spans)             {step number: its "step N" span on the compute track} of a trace's spans
A line that is not JSON ends the script with the file and line named (a file cut by a crash keeps its
whole records: the trainers write each record at once)."""
import json
import re
import sys

COMPUTE, COMM, WAIT, TENSOR = 0, 1, 2, 3


def read_run(path, kinds=("run", "summary"), lists=()):
    run = {"steps": []}
    for kind in lists:
        run[kind] = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError as e:
                sys.exit("%s, line %d: not JSON (%s)" % (path, number, e))
            kind = record.get("type")
            if kind == "step":
                run["steps"].append(record)
            elif kind in lists:
                run[kind].append(record)
            elif kind in kinds:
                run[kind] = record
    return run


def step_spans(spans):
    """Spans are dicts with name, start, end and (where a reader keeps several tracks) tid."""
    steps = {}
    for s in spans:
        m = re.fullmatch(r"step (\d+)", s["name"])
        if m and s.get("tid", COMPUTE) == COMPUTE:
            steps[int(m.group(1))] = s
    return steps
