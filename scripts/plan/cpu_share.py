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
share. Every 20 ms it reads the counters, and, with --steps-of, how many step records the run has
written (each is written as its step ends), so each step gets its own share. Also the machine's whole
run queue (procs_running), for the record. Writes one line, `share-json {...}`, to OUT;
exits with CMD's status."""
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
        if not self.pids:
            self.looks += 1
            if self.looks % 10 == 1:  # a look at every process is dearer than a sample
                self.find()
        ran = waited = 0
        for pid in self.pids:
            try:
                # The main thread, which computes. A rank's communication thread wakes for every message
                # and queues for a core each time for a few microseconds of work: its waits would count
                # against a share that its compute never felt.
                with open("/proc/%d/task/%d/schedstat" % (pid, pid)) as f:
                    fields = f.read().split()
                ran += int(fields[0])
                waited += int(fields[1])
            except (OSError, IndexError, ValueError):
                pass  # a rank that just ended
        return ran, waited


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
    # Per step k (the samples while k step records are written): the ranks' counters where it began,
    # and where the last sample inside it saw them.
    begin, last, queue = {}, {}, []
    while child.poll() is None:
        queue.append(max(0, runnable() - 1))  # this sampler is running while it reads
        now = own.times()
        k = steps()
        if now != (0, 0):
            begin.setdefault(k, last.get(k - 1, now))
            last[k] = now
        time.sleep(PERIOD_S)
    wall = time.monotonic() - start
    written = steps()
    step_share, step_ran_ms, step_waited_ms = [], [], []
    for k in range(written):
        ran = waited = 0
        if k in begin and k in last:
            ran, waited = last[k][0] - begin[k][0], last[k][1] - begin[k][1]
        step_share.append(ran / (ran + waited) if ran + waited > 0 else None)
        step_ran_ms.append(ran / 1e6)
        step_waited_ms.append(waited / 1e6)
    total = [0, 0]
    if last:
        first, end = begin[min(begin)], last[max(last)]
        total = [end[0] - first[0], end[1] - first[1]]
    record = {"share": total[0] / sum(total) if sum(total) > 0 else None, "step_share": step_share,
              "step_ran_ms": step_ran_ms, "step_waited_ms": step_waited_ms, "ranks_found": len(own.pids),
              "runnable_mean": sum(queue) / len(queue) if queue else 0.0, "samples": len(queue), "wall_s": wall,
              "probe_cpu_s": os.times().user + os.times().system}  # what the sampling itself cost
    with open(out, "w") as f:
        f.write("share-json %s\n" % json.dumps(record))
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main())
