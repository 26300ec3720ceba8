"""compare_timing.py: the timing side of `make compare` (scripts/compare/compare.py imports it). Defines
  attach_rounds()   every round of a run (results/rounds/RUN.rK.jsonl, .trace.json; scripts/compare/compare.sh
                    alternates the chapters round by round): its measured step times, and the step time
                    its own trace predicts on the link model (modelled_step_ms below)
  step_stats()      median and spread (10th-90th percentile; min-max under 10 steps) of a list of times
  modelled_steps()  the model of docs/theory.md ("The modelled step"): each rank's step replayed with
                    its own measured host time between communication events, every collective held on
                    its link for the time the communicator's link model gives (the trace's link_ms),
                    one op at a time per link, and complete when its last rank has posted it
  read_load()       the machine's load around the runs (results/load.txt), and busy_note() saying so
  losses_agree()    every run's loss curve against 01 at one rank's
"""
import glob
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
from run_records import COMM, COMPUTE, TENSOR, WAIT, step_spans  # noqa: E402


def percentile(values, q):
    """Linear interpolation between order statistics, as numpy's default."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def step_stats(values):
    """{"median", "low", "high", "n", "spread"}: low-high is the 10th-90th percentile, or min-max
    when there are fewer than 10 values (a percentile of so few would be one of them anyway)."""
    if not values:
        return None
    if len(values) >= 10:
        low, high, spread = percentile(values, 0.1), percentile(values, 0.9), "p10-p90"
    else:
        low, high, spread = min(values), max(values), "min-max"
    return {"median": percentile(values, 0.5), "low": low, "high": high, "n": len(values), "spread": spread}


# ---------------------------------------------------------------------------------------------------
# The modelled step: a replay of the trace on the link model.

def load_trace(path):
    """{rank: [span]}, a span a dict: name, tid, start, end (ms), args."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ranks = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        start = e["ts"] / 1e3
        ranks[e["pid"]].append({"name": e["name"], "tid": e.get("tid", COMPUTE), "start": start,
                                "end": start + e["dur"] / 1e3, "args": e.get("args", {})})
    return ranks


def step_windows(spans):
    return {n: (s["start"], s["end"]) for n, s in step_spans(spans).items()}


def group_of(span):
    """The communicator: "world", or the group the detail names ("123 B, dp")."""
    parts = span["args"].get("detail", "").split(", ")
    return parts[1] if len(parts) > 1 else "world"


def host_events(spans, start, end):
    """One rank's step as the host lived it: ("issue", key, time, link_ms, lane) and ("wait", key,
    from, to), in time order. A key names a collective the same way on every rank: its group and its
    place in the group's issue order within the step."""
    ops = sorted((s for s in spans if s["tid"] in (COMM, TENSOR) and "issued_ms" in s["args"]
                  and start <= s["args"]["issued_ms"] <= end), key=lambda s: s["args"]["issued_ms"])
    counters = defaultdict(int)
    events, by_issue = [], []
    for s in ops:
        group = group_of(s)
        # A receive is not held by the link (the sender's hold covers the message): a lane of its own.
        lane = (group, "recv" if s["name"] == "recv" else "send")
        key = (group, counters[group])
        counters[group] += 1
        issued = s["args"]["issued_ms"]
        events.append(("issue", key, issued, s["args"].get("link_ms", 0.0), lane))
        by_issue.append((issued, key))
    matched = set()
    for w in (s for s in spans if s["tid"] == WAIT and start <= s["start"] <= end and "issued_ms" in s["args"]):
        issued = w["args"]["issued_ms"]
        # The op waited for: the one issued at that moment (to the trace's microsecond), first come.
        candidates = [(abs(t - issued), key) for t, key in by_issue if key not in matched and abs(t - issued) < 2e-3]
        if not candidates:
            continue  # issued before this step began: left out of the model
        key = min(candidates)[1]
        matched.add(key)
        events.append(("wait", key, w["start"], w["end"]))
    events.sort(key=lambda e: (e[2], 0 if e[0] == "issue" else 1))
    return events


def replay(events, start, end, completion):
    """One rank's modelled step length, and when each of its collectives leaves its link (posted).
    `completion`: key -> when the collective completes (its last rank's post), from the previous pass."""
    t, last = 0.0, start  # modelled time since the step began; the measured time reached
    lane_free, posted = defaultdict(float), {}
    for e in events:
        t += max(0.0, e[2] - last)  # the host's own work in between, as measured
        if e[0] == "issue":
            _, key, when, link_ms, lane = e
            posted[key] = max(t, lane_free[lane]) + link_ms
            lane_free[lane] = posted[key]
            last = when
        else:
            _, key, _, until = e
            t = max(t, completion.get(key, posted.get(key, t)))
            last = max(last, until)
    return t + max(0.0, end - last), posted


def modelled_steps(trace_path, first_step=1):
    """{step: modelled ms} for the measured steps (>= first_step) present on every rank."""
    ranks = load_trace(trace_path)
    windows = {r: step_windows(spans) for r, spans in ranks.items()}
    steps = set.intersection(*(set(w) for w in windows.values())) if windows else set()
    out = {}
    for step in sorted(n for n in steps if n >= first_step):
        events = {r: host_events(ranks[r], *windows[r][step]) for r in ranks}
        completion, lengths = {}, {}
        for _ in range(50):  # each pass can only delay completions: a fixed point within a few
            posts = defaultdict(float)
            for r in ranks:
                lengths[r], posted = replay(events[r], *windows[r][step], completion)
                for key, p in posted.items():
                    posts[key] = max(posts[key], p)
            if dict(posts) == completion:
                break
            completion = dict(posts)
        out[step] = max(lengths.values())
    return out


def beyond_the_link(trace_path, first_step=1):
    """Per measured step on rank 0: how much longer its collectives were busy than the link held them
    (MPI's own transfer and reduction after the hold, or a late peer): what the model leaves out."""
    ranks = load_trace(trace_path)
    spans = ranks.get(0, [])
    out = []
    for step, (start, end) in sorted(step_windows(spans).items()):
        if step < first_step:
            continue
        out.append(sum(max(0.0, (s["end"] - s["start"]) - s["args"].get("link_ms", 0.0)) for s in spans
                       if s["tid"] in (COMM, TENSOR) and start <= s["args"].get("issued_ms", -1) <= end))
    return out


# ---------------------------------------------------------------------------------------------------
# Rounds, load, losses.

def attach_rounds(runs, folder):
    """Adds run["timing"]: measured (the step times of every round, step 0 of each left out),
    modelled (the same steps' modelled times), and their step_stats; exposed_ms and comm_ms, the
    medians of the same steps' exposed and total communication (a summary's are one round's means).
    Without rounds (a run made by hand), the run's own file stands for one round."""
    for run in runs:
        rounds = sorted(glob.glob(os.path.join(folder, "rounds", run["name"] + ".r*.jsonl")))
        paths = rounds or [os.path.join(folder, run["name"] + ".jsonl")]
        measured, modelled, beyond, exposed, comm = [], [], [], [], []
        for path in paths:
            steps, pipeline_ms = {}, None
            with open(path) as f:
                for line in f:
                    record = json.loads(line)
                    if record.get("type") == "step" and record["step"] > 0:
                        steps[record["step"]] = record
                    elif record.get("type") == "pipeline" and "simulated_step_ms" in record:
                        pipeline_ms = record["simulated_step_ms"]
            measured += [steps[n]["step_ms"] for n in sorted(steps)]
            exposed += [steps[n]["exposed_comm_ms"] for n in sorted(steps)]
            comm += [steps[n]["comm_ms"] for n in sorted(steps)]
            trace = path[: -len(".jsonl")] + ".trace.json"
            if run["run"].get("pp", 1) > 1:
                # 08: its own simulation of the schedule from its measured passes (docs/theory.md, 10).
                if pipeline_ms is not None:
                    modelled.append(pipeline_ms)
            elif os.path.exists(trace):
                modelled += list(modelled_steps(trace).values())
                beyond += beyond_the_link(trace)
        run["timing"] = {"measured": measured, "modelled": modelled, "rounds": len(paths),
                         "measured_stats": step_stats(measured), "modelled_stats": step_stats(modelled),
                         "exposed_ms": percentile(exposed, 0.5), "comm_ms": percentile(comm, 0.5),
                         "beyond_link_ms": percentile(beyond, 0.5) if beyond else float("nan")}
    return runs


def median_ms(run):
    t = run.get("timing", {}).get("measured_stats")
    return t["median"] if t else run["summary"]["step_ms"]


def exposed_ms(run):
    """Exposed communication per step: the median over the steps median_ms() is over."""
    t = run.get("timing", {})
    return t["exposed_ms"] if t.get("exposed_ms", float("nan")) == t.get("exposed_ms") else run["summary"]["exposed_comm_ms"]


def comm_ms(run):
    """Communication in flight per step, over the same steps."""
    t = run.get("timing", {})
    return t["comm_ms"] if t.get("comm_ms", float("nan")) == t.get("comm_ms") else run["summary"]["comm_ms"]


def modelled_ms(run):
    t = run.get("timing", {}).get("modelled_stats")
    return t["median"] if t else float("nan")


def tokens_per_s(run, step_ms=None):
    """Tokens per second at the median step (or at `step_ms`)."""
    r = run["run"]
    return r["batch"] * r["T"] / ((step_ms if step_ms is not None else median_ms(run)) / 1e3)


def read_load(folder):
    """{"cores", "before", "after", "others", "samples"} from results/load.txt (compare.sh writes a
    line of /proc/loadavg before the runs, before each run and after them), or None."""
    path = os.path.join(folder, "load.txt")
    if not os.path.exists(path):
        return None
    cores, lines = None, []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "cores":
                cores = int(parts[1])
            elif len(parts) >= 5:
                lines.append((parts[0], float(parts[1]), int(parts[4].split("/")[0])))
    if not lines or not cores:
        return None
    # Between runs none of ours is running: the runnable processes then (less the one reading the
    # file) are the others' work, as it comes and goes.
    between = [running - 1 for label, _, running in lines if label != "after"]
    return {"cores": cores, "before": lines[0][1], "after": lines[-1][1],
            "others": sum(between) / len(between), "samples": len(between)}


def busy_note(load, ranks):
    """A warning when other work competed for the cores, else None. Busy: the one-minute load after the
    runs, less this job's ranks, is more than half a core; or on average a whole other process was
    runnable between runs; or the ranks alone outnumber the cores. The load before the runs is printed
    but not judged: its one-minute average still holds the build that make compare has just run."""
    if not load:
        return None
    others = max(load["after"] - ranks, load["others"])
    if load["after"] - ranks <= 0.5 and load["others"] < 1 and ranks <= load["cores"]:
        return None
    return ("machine busy: load %.1f before the runs, %.1f after (this job's %d ranks included), %.1f other "
            "processes runnable between runs, on %d cores: about %.1f runnable per core while %d ranks ran" % (
                load["before"], load["after"], ranks, load["others"], load["cores"],
                (ranks + others) / load["cores"], ranks))


def busy_title(load, ranks):
    """A few words for a plot's title."""
    if not busy_note(load, ranks):
        return ""
    return " [busy machine: load %.1f on %d cores]" % (max(load["before"], load["after"]), load["cores"])


def losses_agree(runs, tolerance=1e-5, baseline_ranks=1):
    """(largest relative difference of any run's loss at any step from 01 at `baseline_ranks` ranks'
    (one, unless a section has no such run), its run's label, how many runs were compared, whether
    within `tolerance`), or None without such a baseline. A chapter with a model of its own (11's
    mixture of experts) compares with its own run on one rank. Only runs of the same steps compare
    (the learning rate's schedule depends on them)."""
    base01 = next((r for r in runs if r["run"]["chapter"].startswith("01") and r["run"]["ranks"] == baseline_ranks),
                  None)
    if not base01:
        return None
    worst, where, count = 0.0, "", 0
    for run in runs:
        # A chapter with a model of its own (11's mixture of experts) against its own run on one rank.
        base = base01
        if run["run"].get("preset") != base01["run"].get("preset"):
            base = next((r for r in runs if r["run"]["chapter"] == run["run"]["chapter"] and r["run"]["ranks"] == 1
                         and r["run"].get("preset") == run["run"].get("preset")), None)
        if base is None or run is base or run["run"]["steps"] != base["run"]["steps"]:
            continue
        ref = {s["step"]: s["loss"] for s in base["steps"]}
        count += 1
        for s in run["steps"]:
            if s["step"] in ref and ref[s["step"]] != 0:
                d = abs(s["loss"] - ref[s["step"]]) / abs(ref[s["step"]])
                if d > worst:
                    worst, where = d, "%s x%d step %d" % (run["run"]["chapter"], run["run"]["ranks"], s["step"])
    return worst, where, count, worst <= tolerance
