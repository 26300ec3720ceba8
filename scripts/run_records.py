"""run_records.py: reads one run's JSON-lines file (--json, or build/pipeline_ideal's) for the plot and table
scripts (compare.py, plot_pipeline.py, plot_cp_balance.py, plot_experts.py). Defines
  read_run(path, kinds, lists)  {"steps": [step records], kind: the last record of each kind in `kinds`,
                                 kind: [every record] for each kind in `lists`}
A line that is not JSON ends the script with the file and line named (a file cut by a crash keeps its
whole records: the trainers write each record at once)."""
import json
import sys


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
