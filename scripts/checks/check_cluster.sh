#!/usr/bin/env bash
# check_cluster.sh (a test, tests/manifest.txt): scripts/cluster/cluster.sh's cluster works and leaves nothing
# behind. It brings up 2 nodes, trains chapter 01 for 2 steps at 2 nodes x 1 rank with
# `mpiexec -f hostfile`, and checks that the header counts 2 nodes and that the losses and the
# communication counters equal those of the same run on one host (scripts/cluster/cluster_compare.py). It
# runs scripts/elastic/elastic.sh --cluster across the nodes, loses node1 (kills its rank) once a
# checkpoint is complete, and checks that the launcher logs the restart and finishes on node0 alone with
# the losses of the uninterrupted run. Then it
# starts a long run across the nodes, kills mpiexec with SIGKILL while the ranks train, and checks that
# `down` removes every namespace, process and file anyway; on the way, that another checkout's `status`
# and `down` see the cluster as not theirs (down refuses). A few seconds in all.
# Where the machine cannot build the cluster (no root, no network namespaces: a container, a user's
# laptop), it prints why and exits 0: the line counts as passed, as a GPU test skips without a GPU.
# Its cluster has its own names (namespaces gptt<pid>-*) and folder: it never touches one a user has up.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CLUSTER_PREFIX=gptt$$ CLUSTER_STATE  # its own names: two test runs at once do not meet
CLUSTER_STATE=$(mktemp -d "${TMPDIR:-/tmp}/check_cluster.XXXXXX")
work=$(mktemp -d "${TMPDIR:-/tmp}/check_cluster_runs.XXXXXX")
cleanup() { scripts/cluster/cluster.sh down >/dev/null 2>&1 || true; rm -rf "$work" "$CLUSTER_STATE"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! reason=$(SLOTS=1 scripts/cluster/cluster.sh up 2 1 2>&1); then
  echo "skipped: cannot build a cluster here: ${reason#cluster.sh: }"
  exit 0
fi
echo "$reason"
fail() { echo "FAILED: $*"; exit 1; }

# 1. Two nodes x 1 rank, against the same run on one host.
timeout 120 scripts/cluster/cluster.sh mpiexec -n 2 ./01_vanilla_dp/train --steps 2 --device cpu --json "$work/nodes.jsonl" \
  >"$work/nodes.log" 2>&1 || { cat "$work/nodes.log"; fail "01 across 2 nodes"; }
grep -q '^01_vanilla_dp | 2 ranks on 2 nodes' "$work/nodes.log" || { cat "$work/nodes.log"; fail "the header does not count 2 nodes"; }
timeout 120 mpiexec -n 2 ./01_vanilla_dp/train --steps 2 --device cpu --json "$work/host.jsonl" >"$work/host.log" 2>&1 \
  || { cat "$work/host.log"; fail "01 on one host"; }
scripts/cluster/cluster_compare.py "$work/nodes.jsonl" "$work/host.jsonl" || fail "the run across nodes differs from one host's"

# 1b. The elastic launcher loses a node: 2 nodes x 1 rank, node1's rank killed once a checkpoint is
# complete; the run goes on from it on node0's rank alone, with the uninterrupted run's losses.
flags="--preset tiny --steps 8 --quiet --device cpu"
timeout 60 mpiexec -n 1 ./04_zero1/train $flags --json "$work/uninterrupted.jsonl" >"$work/uninterrupted.log" 2>&1 \
  || { cat "$work/uninterrupted.log"; fail "04 uninterrupted"; }
# The emulated link's latency keeps the run going for a while after its first checkpoint.
timeout 120 scripts/elastic/elastic.sh --cluster --grids '2:;1:' --retries 1 --dir "$work/elastic" 04_zero1 $flags \
  --save-every 2 --link-latency-us 20000 >"$work/elastic.log" 2>&1 &
elastic=$!
for _ in $(seq 300); do [ -f "$work/elastic/ckpt/checkpoint.meta" ] && break; sleep 0.1; done  # 30 s at most
node1_ranks=$(ip netns pids "$CLUSTER_PREFIX-node1" 2>/dev/null | xargs -r ps -o pid=,comm= -p | awk '$2 == "train" { print $1 }' || true)
[ -n "$node1_ranks" ] && kill -KILL $node1_ranks
wait "$elastic" || { cat "$work/elastic.log"; fail "the elastic run did not finish after losing node1"; }
[ -n "$node1_ranks" ] || { cat "$work/elastic.log"; fail "no rank of node1 to kill (the run ended before its first checkpoint?)"; }
cat "$work/elastic.log"
grep -q "restart 1: lost rank(s) 1 (node node1) .* grid 2: -> 1:; nodes node0 node1 -> node0; resuming at step [0-9]* .* steps redone" \
  "$work/elastic.log" || fail "the restart is not logged as losing node1"
python3 - "$work/elastic/attempt1.jsonl" "$work/uninterrupted.jsonl" <<'PY' || fail "the resumed losses differ from the uninterrupted run's"
import json, sys
resumed, full = ({r["step"]: r["loss"] for r in map(json.loads, open(f)) if r.get("type") == "step"} for f in sys.argv[1:])
assert resumed and all(abs(resumed[s] - full[s]) <= 1e-5 * abs(full[s]) for s in resumed), (resumed, full)
print(f"resumed steps {min(resumed)}..{max(resumed)} on node0: the uninterrupted run's losses")
PY

# 2. Another checkout (a copy of the script elsewhere, the same names) sees the cluster as someone
# else's: its status says so and exits 0 without a hostfile, and its down refuses, naming this one.
other=$work/other_checkout
mkdir -p "$other/scripts/cluster"
cp scripts/cluster/cluster.sh "$other/scripts/cluster/"
seen=$(CLUSTER_STATE=$other/build/cluster "$other/scripts/cluster/cluster.sh" status 2>&1) \
  || fail "status from another checkout exited non-zero: $seen"
grep -qF "made by $PWD" <<<"$seen" || fail "status does not name the checkout that made the cluster: $seen"
grep -q "^no hostfile at $other/build/cluster/hostfile" <<<"$seen" || fail "status does not say the hostfile is missing: $seen"
if refused=$(CLUSTER_STATE=$other/build/cluster "$other/scripts/cluster/cluster.sh" down 2>&1); then
  fail "down from another checkout took this checkout's cluster down: $refused"
fi
grep -qF "was made by $PWD, not this checkout ($other)" <<<"$refused" || fail "down's refusal: $refused"
[ -n "$(scripts/cluster/cluster.sh leftovers)" ] || fail "the refused down removed something"

# 3. A run killed in the middle: mpiexec dies at once (SIGKILL, no clean-up of its own), the ranks
# live on in the nodes until `down` ends them.
scripts/cluster/cluster.sh mpiexec -n 2 ./01_vanilla_dp/train --steps 100000 --device cpu --quiet >"$work/killed.log" 2>&1 &
launcher=$!
for _ in $(seq 100); do  # until a rank trains on each node (10 s at most)
  ranks=$(for ns in "$CLUSTER_PREFIX-node0" "$CLUSTER_PREFIX-node1"; do ip netns pids "$ns" 2>/dev/null | xargs -r ps -o comm= -p | grep -c '^train$' || true; done | awk '{ n += $1 } END { print n + 0 }')
  [ "${ranks:-0}" -ge 2 ] && break
  sleep 0.1
done
[ "${ranks:-0}" -ge 2 ] || { cat "$work/killed.log"; fail "the long run did not start on both nodes"; }
kill -KILL "$launcher" 2>/dev/null || true
wait "$launcher" 2>/dev/null || true
down=$(scripts/cluster/cluster.sh down) || fail "down after a killed run: $down"
echo "$down"
left=$(scripts/cluster/cluster.sh leftovers; ip -o link show | grep -F "$CLUSTER_PREFIX" || true; pgrep -f "$CLUSTER_STATE" || true)
[ -z "$left" ] || fail "left behind after down: $left"
echo "passed: 2 nodes x 1 rank equal one host's run; the elastic run survived losing node1; another checkout's down refused; nothing left after a killed run and down"
