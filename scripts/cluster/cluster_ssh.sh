#!/usr/bin/env bash
# cluster_ssh.sh: stands in for ssh when MPICH's hydra starts its proxy on a node of scripts/cluster/cluster.sh's
# cluster (mpiexec -launcher ssh -launcher-exec scripts/cluster/cluster_ssh.sh). Hydra calls it as it would call
# ssh: options, then the host, then the command as words for a shell (`-x node1 "/usr/bin/hydra_pmi_proxy"
# --control-port node0:45405 ...`). Instead of logging in, it enters that node's namespaces and runs the
# command there with sh, as sshd would run it with the user's shell.
set -euo pipefail
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done  # ssh's options (hydra passes -x: no X11)
[ $# -ge 2 ] || { echo "cluster_ssh.sh: usage: cluster_ssh.sh [ssh options] HOST COMMAND..." >&2; exit 255; }
host=$1; shift
exec "$(dirname "$0")/cluster.sh" exec "$host" sh -c "$*"
