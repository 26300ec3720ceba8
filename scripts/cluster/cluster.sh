#!/usr/bin/env bash
# cluster.sh: a small cluster on one machine, for running the chapters with `mpiexec -f hostfile` over a
# real (shaped) network instead of one host's shared memory. docs/cluster.md tells the whole story.
#
#   scripts/cluster/cluster.sh up [N] [GBPS]  N nodes (2..4, default 2), each link shaped to GBPS Gbit/s
#                                             (default 1)
#   scripts/cluster/cluster.sh status         what exists: nodes, addresses, link rates, processes
#   scripts/cluster/cluster.sh mpiexec ARGS   mpiexec from node0 with the hostfile and the launcher, e.g.
#     scripts/cluster/cluster.sh mpiexec -n 4 ./03_bucket_dp/train --steps 5
#   scripts/cluster/cluster.sh exec NODE CMD  runs CMD inside a node (NODE: node0, node1, ...)
#   scripts/cluster/cluster.sh down [--force] removes everything `up` made and ends every process inside it;
#                                             a cluster another checkout made only with --force
#
# A node is a network namespace (its own interfaces, addresses, routes) whose processes also get a UTS
# namespace (their own hostname, nodeI), so MPI sees N hosts. The nodes hang on one bridge, which lives in
# a namespace of its own (the "switch"): nothing is added to the host's own network, and the addresses,
# 198.18.0.0/15 (reserved for network benchmarks, RFC 2544), exist only inside these namespaces, so no
# packet can leave them. Each node's cable is a veth pair shaped by tbf at GBPS in both directions.
# Names and addresses resolve through /etc/netns/<namespace>/hosts, which `ip netns exec` puts over
# /etc/hosts inside the namespace only. Hydra starts its proxy on a node through cluster_ssh.sh (beside
# this file, given as the ssh launcher's executable), which enters the node instead of calling ssh.
# The namespaces' names are the machine's, not the checkout's: the switch's bridge carries the path of
# the checkout that made the cluster (its alias, gone with the namespace), so that `down` from another
# checkout refuses instead of ending someone else's runs.
# Environment: CLUSTER_PREFIX (default gptc: namespaces gptc-node0.., gptc-sw), SLOTS (ranks per host in
# the hostfile, default 2), CLUSTER_STATE (hostfile and environment, default build/cluster),
# CLUSTER_HOSTFILE (a hostfile for `mpiexec` other than up's, e.g. the nodes an elastic run has left).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
prefix=${CLUSTER_PREFIX:-gptc}
state=${CLUSTER_STATE:-$repo/build/cluster}
sw=$prefix-sw
max_nodes=4

die() { echo "cluster.sh: $*" >&2; exit 1; }

node_ns() { echo "$prefix-node$1"; }
node_ip() { echo "198.18.0.$(($1 + 1))"; }

# The checkout that made the cluster up now (the bridge's alias), or "" when there is none or no mark.
cluster_owner() { ip -n "$sw" link show br0 2>/dev/null | sed -n 's/^ *alias //p'; }

# Every namespace of ours that exists now (the switch and the nodes), whatever N was.
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-(sw|node[0-9]+)\$" || true; }

# Can this machine build a cluster? Says in one sentence what is missing, and exits.
require_features() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth links and tc): run it as root, e.g. with sudo."
  local tool
  for tool in ip tc unshare; do
    command -v "$tool" >/dev/null || die "needs '$tool' (iproute2, util-linux), which is not installed."
  done
  command -v mpiexec >/dev/null || die "needs MPICH's mpiexec (make deps installs it)."
}

# Tears down everything of ours: processes inside the namespaces first (so none outlives its network),
# then the namespaces (removing a namespace removes its veth ends and the bridge), then the files.
# Safe to call at any point of a half-built cluster, and twice.
teardown() {
  local ns pids tries
  for ns in $(our_namespaces); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
  done
  for tries in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(for ns in $(our_namespaces); do ip netns pids "$ns" 2>/dev/null || true; done)
    [ -z "$pids" ] && break
    [ "$tries" -ge 5 ] && kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  for ns in $(our_namespaces); do ip netns delete "$ns" 2>/dev/null || true; done
  rm -rf /etc/netns/"$prefix"-sw /etc/netns/"$prefix"-node[0-9]*
  rmdir /etc/netns 2>/dev/null || true  # only if empty: `up` may have made it, another user may use it
  rm -rf "$state"
}

# What is left of ours: namespaces, our processes, /etc/netns folders. Empty output = nothing.
leftovers() {
  local ns
  our_namespaces | sed 's/^/namespace /'
  for ns in $(our_namespaces); do ip netns pids "$ns" 2>/dev/null | sed "s/^/process in $ns: /"; done
  ls -d /etc/netns/"$prefix"-* 2>/dev/null | sed 's/^/folder /' || true
}

up() {
  local n=${1:-${NODES:-2}} gbps=${2:-${GBPS:-1}} slots=${SLOTS:-2}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le $max_nodes ] \
    || die "N must be 2 to $max_nodes nodes, not '$n'."
  [[ "$gbps" =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v g="$gbps" 'BEGIN { exit !(g > 0 && g <= 100) }' \
    || die "GBPS must be a rate in Gbit/s above 0 and at most 100, not '$gbps'."
  require_features
  [ -z "$(our_namespaces)" ] || die "a cluster ($prefix-*) made by $(cluster_owner | grep . || echo an unknown checkout) is already up: 'scripts/cluster/cluster.sh down' first (from that checkout), or set CLUSTER_PREFIX for another."
  local start; start=$(date +%s.%N)
  # From here on any failure or interrupt removes what was made so far.
  trap 'status=$?; trap - EXIT INT TERM; teardown; exit $status' EXIT
  trap 'exit 130' INT TERM
  ip netns add "$sw" 2>/dev/null || die "cannot create a network namespace ('ip netns add' failed): the kernel or this container does not allow them."
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge 2>/dev/null || die "cannot create a bridge: the kernel lacks bridge support."
  ip -n "$sw" link set br0 alias "$repo" 2>/dev/null || die "cannot mark the cluster with this checkout's path ($repo): is it over 255 characters?"
  ip -n "$sw" link set br0 up
  # tbf's rate in kbit/s, and a bucket of 1 ms at that rate but at least 64 KiB: veth hands tbf TCP
  # segments of up to 64 KiB at once (segmentation offload), and a bucket smaller than a segment would
  # make tbf split or drop it. `latency` bounds the queue: 50 ms of data waits, more is dropped.
  local kbit burst
  kbit=$(awk -v g="$gbps" 'BEGIN { printf "%d", g * 1000000 }')
  burst=$(awk -v k="$kbit" 'BEGIN { b = k * 1000 / 8 / 1000; if (b < 65536) b = 65536; printf "%d", b }')
  mkdir -p "$state"
  local i ns hosts="127.0.0.1 localhost"$'\n'
  for ((i = 0; i < n; i++)); do hosts+="$(node_ip $i) node$i"$'\n'; done
  for ((i = 0; i < n; i++)); do
    ns=$(node_ns $i)
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns" 2>/dev/null \
      || die "cannot create a veth pair: the kernel lacks veth support."
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$ns" addr add "$(node_ip $i)/24" dev eth0
    ip -n "$ns" link set eth0 up
    tc -n "$ns" qdisc add dev eth0 root tbf rate "${kbit}kbit" burst "$burst" latency 50ms 2>/dev/null \
      || die "cannot shape a link with tc's tbf: the kernel lacks sch_tbf."
    tc -n "$sw" qdisc add dev "p$i" root tbf rate "${kbit}kbit" burst "$burst" latency 50ms
    # Inside the namespace only: the nodes' names, and no DNS server (nothing outside may be asked).
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts" >"/etc/netns/$ns/hosts"
    printf '# no name server inside the cluster: names come from hosts\n' >"/etc/netns/$ns/resolv.conf"
  done
  unshare --uts true 2>/dev/null || die "cannot create a UTS namespace (a hostname per node): the kernel does not allow it."
  for ((i = 0; i < n; i++)); do echo "node$i:$slots"; done >"$state/hostfile"
  # The MPI settings that make runs across the nodes reliable (docs/cluster.md, "A reliable MPI"):
  # UCX over TCP only, on the node's cable (else UCX finds the nodes share a machine and uses shared
  # memory, bypassing the link), and the chapters leave without MPI_Finalize, which hangs over TCP.
  cat >"$state/env" <<EOF
# Written by scripts/cluster/cluster.sh up: the cluster's shape and the MPI settings its runs use.
CLUSTER_NODES=$n
CLUSTER_GBPS=$gbps
CLUSTER_SLOTS=$slots
UCX_TLS=${UCX_TLS:-tcp,self}
UCX_NET_DEVICES=${UCX_NET_DEVICES:-eth0}
GPT_SKIP_MPI_FINALIZE=1
EOF
  trap - EXIT INT TERM
  printf 'cluster up: %d nodes (%s), links shaped to %s Gbit/s, hostfile %s (%d slots each), in %.2f s\n' \
    "$n" "$(for ((i = 0; i < n; i++)); do printf 'node%d=%s ' $i "$(node_ip $i)"; done | sed 's/ $//')" \
    "$gbps" "${state#$repo/}/hostfile" "$slots" "$(awk -v now="$(date +%s.%N)" -v start="$start" 'BEGIN { print now - start }')"
}

# Runs a command inside node I: its network namespace (and /etc/hosts) and a UTS namespace of its own
# named nodeI. Processes the command starts (hydra's proxy, the ranks) stay inside both.
node_exec() {
  local node=$1; shift
  [[ "$node" =~ ^node([0-9]+)$ ]] || die "no such node '$node' (node0, node1, ...)."
  local ns; ns=$(node_ns "${BASH_REMATCH[1]}")
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "$node does not exist: is the cluster up? (scripts/cluster/cluster.sh up)"
  exec ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
}

run_mpiexec() {
  [ -f "$state/env" ] || die "the cluster is not up: 'scripts/cluster/cluster.sh up' first."
  set -a; . "$state/env"; set +a
  node_exec node0 mpiexec -f "${CLUSTER_HOSTFILE:-$state/hostfile}" -launcher ssh -launcher-exec "$repo/scripts/cluster/cluster_ssh.sh" "$@"
}

status() {
  local ns found=0
  for ns in $(our_namespaces); do
    found=1
    case "$ns" in
      *-sw) echo "$ns: switch, bridge br0 with $(ip -n "$ns" -o link show master br0 2>/dev/null | wc -l) ports" ;;
      *) echo "$ns: $(ip -n "$ns" -o -4 addr show dev eth0 2>/dev/null | awk '{print $4}'), link $(tc -n "$ns" qdisc show dev eth0 2>/dev/null | grep -o 'rate [^ ]*'), $(ip netns pids "$ns" | wc -l) processes" ;;
    esac
  done
  [ "$found" = 1 ] || { echo "no cluster ($prefix-*) is up"; return 0; }
  local owner mine=""
  owner=$(cluster_owner)
  [ "$owner" = "$repo" ] && mine=" (this checkout)"
  [ -n "$owner" ] || owner="an unknown checkout (no mark on the switch's bridge)"
  echo "made by $owner$mine"
  if [ -f "$state/hostfile" ]; then
    echo "hostfile $state/hostfile: $(tr '\n' ' ' <"$state/hostfile")"
  else
    echo "no hostfile at $state/hostfile: this checkout's 'mpiexec' cannot use the cluster (CLUSTER_STATE names the folder of the checkout that made it)"
  fi
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down)
    start=$(date +%s.%N)
    case "${2:-}" in
      "" | --force) ;;
      *) die "usage: cluster.sh down [--force], not 'down ${*:2}'." ;;
    esac
    [ "$(id -u)" = 0 ] || die "needs root to remove network namespaces: run it as root, e.g. with sudo."
    if [ -n "$(our_namespaces)" ] && [ "${2:-}" != --force ]; then
      owner=$(cluster_owner)
      [ -n "$owner" ] || owner="an unknown checkout (no mark on its switch)"
      [ "$owner" = "$repo" ] || die "the cluster ($prefix-*) was made by $owner, not this checkout ($repo): take it down from there, or pass 'down --force' to end its runs anyway."
    fi
    teardown
    left=$(leftovers)
    [ -z "$left" ] || die "could not remove: $left"
    printf 'cluster down: nothing left, in %.2f s\n' "$(awk -v now="$(date +%s.%N)" -v start="$start" 'BEGIN { print now - start }')" ;;
  status) status ;;
  leftovers) leftovers ;;
  exec) shift; [ $# -ge 2 ] || die "usage: cluster.sh exec NODE COMMAND..."; node_exec "$@" ;;
  mpiexec) shift; run_mpiexec "$@" ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
