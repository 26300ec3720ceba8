#!/usr/bin/env python3
"""cluster_compare.py: is a run across the cluster's nodes the same run as on one host?

Reads two --json files of the same chapter and settings (scripts/cluster/cluster.sh's nodes, and one host) and
compares, step by step, the loss and the communication counters: bytes sent and received, collectives,
calls and the largest share of each kind of op. The counters must be equal: the same ops move the same
bytes whatever carries them. The losses must agree to --rtol (default 0: bit-identical); the sums of
an all-reduce may run in another order across hosts (MPICH picks its algorithm by the job's layout), so
a test that allows that passes a small tolerance. Prints one line, exits 1 on a difference.

    scripts/cluster/cluster_compare.py cluster.jsonl one_host.jsonl [--rtol 1e-6]
"""
import argparse
import json
import sys

COUNTERS = ("comm_bytes", "comm_received_bytes", "collectives")


def steps(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    run = next((r for r in records if r.get("type") == "run"), {})
    return run, [r for r in records if r.get("type") == "step"]


def counters(step):
    return {k: v for k, v in step.items()
            if k in COUNTERS or k.startswith("calls_") or k.startswith("max_sent_share_")
            or k.startswith("max_received_share_")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cluster")
    ap.add_argument("one_host")
    ap.add_argument("--rtol", type=float, default=0.0)
    a = ap.parse_args()
    run_a, sa = steps(a.cluster)
    run_b, sb = steps(a.one_host)
    if not sa or len(sa) != len(sb):
        print(f"DIFFERENT: {len(sa)} steps in {a.cluster}, {len(sb)} in {a.one_host}")
        return 1
    worst = 0.0
    for x, y in zip(sa, sb):
        diff = abs(x["loss"] - y["loss"])
        worst = max(worst, diff)
        if diff > a.rtol * abs(y["loss"]):
            print(f"DIFFERENT: step {x['step']} loss {x['loss']!r} vs {y['loss']!r}")
            return 1
        if counters(x) != counters(y):
            bad = {k: (x.get(k), y.get(k)) for k in set(counters(x)) | set(counters(y)) if x.get(k) != y.get(k)}
            print(f"DIFFERENT: step {x['step']} counters {bad}")
            return 1
    nodes = f"{run_a.get('nodes', '?')} nodes vs {run_b.get('nodes', '?')}"
    loss = "bit-identical" if worst == 0 else f"largest difference {worst:.2e}"
    print(f"same: {len(sa)} steps ({nodes}), losses {loss} (last {sa[-1]['loss']:.6f}), "
          f"counters equal ({sa[-1].get('comm_bytes', 0)} B, {sa[-1].get('collectives', 0)} collectives a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
