#!/usr/bin/env python3
"""cpu_share.py --ranks N [--steps-of RUN.jsonl] OUT CMD ARGS...: run CMD and measure, step by step, the
share of a core its ranks got while they wanted one, for `make plan-check` (scripts/plan/plan_check.sh
runs each calibration and each row under it; docs/planner.md says why this and not the load average).
The kernel keeps, for every thread, the time it ran and the time it sat runnable in a run queue waiting
for a core (/proc/PID/task/TID/schedstat); over the ranks' main threads the share is ran / (ran + waited).
On idle cores it is 1; with R runnable processes on N cores, about N / R. It counts no time a rank
spent waiting for its peer or sleeping out the emulated link (then it is not runnable), so it says how
fast the machine let the ranks compute, not how long they took: a calibration's rates divided by its
share are the rates of a rank on a core of its own, and a row is predicted at those rates times its
share. Every 20 ms it reads each rank's counters, and, with --steps-of, how many step records the run
has written (each is written as its step ends), so each step gets its own share. A step's share weighs
each 20 ms by the time some rank wanted a core in it (the longest any rank wanted), not by the ranks'
wanted times summed: while one rank idles (a pipeline's bubble, a peer with fewer experts' rows) the
other computes alone, on the step's path, and gets more of a core, since one process fewer competes;
summed, those stretches would weigh half as much as those where both compute (docs/theory.md, section
20, "The share along the step's path"). Both are kept: step_share, and step_ran_ms and
step_waited_ms summed over the ranks. Also the machine's whole run queue (procs_running), for the
record. Writes one line, `share-json {...}`, to OUT; exits with CMD's status."""
import glob
import json
import os
import subprocess
import sys
import time

PERIOD_S = 0.02


def runnable():
    # /proc/loadavg's "running/total" is the count /proc/stat calls procs_running, without the cost of
    # generating /proc/stat's long interrupt lines at every sample.
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


class StepCounter:
    """How many step records CMD's --json file holds so far: the trainers write each record as its step
    ends, to PATH.tmp.<host>.<pid> until the run closes it (common/base/metrics.h), so a sample taken
    while k are written falls in step k."""

    def __init__(self, path):
        self.path, self.name, self.size, self.count = path, None, -1, 0

    def __call__(self):
        if not self.path:
            return 0
        for retry in (False, True):
            # The temporary, once found, until it is renamed into place; never a file left at PATH by an
            # earlier run while this one writes its temporary.
            if self.name is None or self.name == self.path or retry:
                self.name = (glob.glob(glob.escape(self.path) + ".tmp.*") or [self.path])[0]
            # The run may rename its temporary into place between any two calls: then look again.
            try:
                size = os.path.getsize(self.name)
                if size != self.size:
                    with open(self.name, "rb") as f:
                        self.count = f.read().count(b'"type":"step"')
                    self.size = size
            except OSError:
                continue
            break
        return self.count


class Ranks:
    """The ranks CMD started (the leaves of its process tree, once there are N of them) and the time
    their main threads have run and waited for a core so far (ns, summed)."""

    def __init__(self, root, ranks):
        self.root, self.ranks, self.pids, self.looks = root, ranks, [], 0

    def find(self):
        parent = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/stat" % entry) as f:
                        parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        tree, grew = {self.root}, True
        while grew:
            grew = False
            for pid, ppid in parent.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        leaves = [pid for pid in tree if pid != self.root and not any(parent.get(q) == pid for q in tree)]
        if len(leaves) == self.ranks:
            self.pids = leaves

    def times(self):
        """Each rank's main thread's (ran, waited) so far, ns; () before the ranks are found."""
        if not self.pids:
            self.looks += 1
            if self.looks % 10 == 1:  # a look at every process is dearer than a sample
                self.find()
        counters = []
        for pid in self.pids:
            try:
                # The main thread, which computes. A rank's communication thread wakes for every message
                # and queues for a core each time for a few microseconds of work: its waits would count
                # against a share that its compute never felt.
                with open("/proc/%d/task/%d/schedstat" % (pid, pid)) as f:
                    fields = f.read().split()
                counters.append((int(fields[0]), int(fields[1])))
            except (OSError, IndexError, ValueError):
                return ()  # a rank that just ended: this sample is not whole
        return tuple(counters)


def step_shares(samples, steps):
    """Per step k < steps, from the samples (k, each rank's counters) in order: the ranks' ran and waited
    time summed (ms), and the share along the step's path. Each interval between two samples falls in
    the step of its later sample; its share is the ranks' ran over their wanted (ran + waited) time in
    it, weighed by the longest any one rank wanted: the time the step's path wanted a core."""
    ran, waited = [0.0] * steps, [0.0] * steps
    path_ran, path_wanted = [0.0] * steps, [0.0] * steps
    for (_, before), (k, after) in zip(samples, samples[1:]):
        if k >= steps or len(before) != len(after) or not after:
            continue
        r = [b[0] - a[0] for a, b in zip(before, after)]
        q = [b[0] + b[1] - a[0] - a[1] for a, b in zip(before, after)]
        if sum(q) <= 0:
            continue
        ran[k] += sum(r) / 1e6
        waited[k] += (sum(q) - sum(r)) / 1e6
        path_ran[k] += max(q) * sum(r) / sum(q) / 1e6
        path_wanted[k] += max(q) / 1e6
    return ran, waited, path_ran, path_wanted


def main():
    args = sys.argv[1:]
    watch, ranks = None, 0
    while len(args) >= 2 and args[0] in ("--steps-of", "--ranks"):
        if args[0] == "--steps-of":
            watch = args[1]
        else:
            ranks = int(args[1])
        args = args[2:]
    if ranks < 1 or len(args) < 2:
        sys.exit("usage: cpu_share.py --ranks N [--steps-of RUN.jsonl] OUT CMD ARGS...")
    out, cmd = args[0], args[1:]
    steps = StepCounter(watch)
    start = time.monotonic()
    child = subprocess.Popen(cmd)
    own = Ranks(child.pid, ranks)
    samples, queue = [], []  # (k, each rank's counters) while k step records are written
    while child.poll() is None:
        queue.append(max(0, runnable() - 1))  # this sampler is running while it reads
        now = own.times()
        k = steps()
        if now:
            samples.append((k, now))
        time.sleep(PERIOD_S)
    wall = time.monotonic() - start
    written = steps() if watch else 1  # without step records, the whole run is one step
    ran, waited, path_ran, path_wanted = step_shares(samples, written)
    share = lambda r, w: r / w if w > 0 else None
    record = {"share": share(sum(path_ran), sum(path_wanted)),
              "step_share": [share(r, w) for r, w in zip(path_ran, path_wanted)],
              "step_path_ran_ms": path_ran, "step_path_wanted_ms": path_wanted,
              "step_ran_ms": ran, "step_waited_ms": waited, "ranks_found": len(own.pids),
              "runnable_mean": sum(queue) / len(queue) if queue else 0.0, "samples": len(queue), "wall_s": wall,
              "probe_cpu_s": os.times().user + os.times().system}  # what the sampling itself cost
    with open(out, "w") as f:
        f.write("share-json %s\n" % json.dumps(record))
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main())
