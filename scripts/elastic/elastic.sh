#!/usr/bin/env bash
# scripts/elastic/elastic.sh: a training run that survives a lost rank (`make elastic`, docs/checkpoint.md).
#
#   scripts/elastic/elastic.sh [--grids "4:FLAGS;2:FLAGS;1:FLAGS"] [--retries 3] [--spares 0] [--dir DIR]
#                              [--cluster] CHAPTER TRAIN_FLAGS...
#
# Runs `mpiexec -n N ./CHAPTER/train TRAIN_FLAGS --save DIR/ckpt/ --resume DIR/ckpt/` on the first grid
# (N ranks with its own flags, e.g. "4:--tp 2"). Every rank writes its slices of a sharded checkpoint
# (--save-every in TRAIN_FLAGS says how often). When a rank dies, MPICH ends the whole job; the launcher
# then finds which rank was lost (each rank runs under a small wrapper that records how its trainer
# ended) and restarts from the last complete checkpoint (the folder's checkpoint.meta, written last):
# on the same grid while a spare rank replaces the lost one (--spares), else on the next grid of the
# list that fits the ranks still available. The trainer's own checks are the rules a grid must meet
# (they refuse a grid within seconds, before any work); a refused grid is skipped for the next one.
# Because a checkpoint loads on any grid and the data order depends only on the step, the restarted
# run continues the uninterrupted run's losses. Every restart is logged (DIR/elastic.log and stdout):
# the rank lost, the step reached, the grid before and after, the steps redone. Stops after --retries
# restarts. The exit status is the last attempt's.
# --cluster runs across the nodes of scripts/cluster/cluster.sh's cluster (docs/cluster.md): each rank
# records its node too, and a node that lost a rank (a node lost: all of its ranks) leaves the hostfile
# of the next attempts (DIR/hosts, handed to cluster.sh as CLUSTER_HOSTFILE), whose grid must fit the
# slots of the nodes left.
set -u
cd "$(dirname "$0")/../.." || exit 1

grids="" retries=3 spares=0 dir="" cluster=0
while [ $# -gt 0 ]; do
  case "$1" in
    --grids) grids="$2"; shift 2 ;;
    --retries) retries="$2"; shift 2 ;;
    --spares) spares="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --cluster) cluster=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -lt 1 ] || [ ! -x "$1/train" ]; then
  echo "error: elastic.sh needs a chapter whose trainer is built (e.g. 04_zero1; run make first)" >&2
  exit 2
fi
chapter="$1"; shift
[ -n "$grids" ] || grids="4:;2:;1:"
[ -n "$dir" ] || dir="$(mktemp -d "${TMPDIR:-/tmp}/elastic.XXXXXX")"
mkdir -p "$dir" || exit 2
ckpt="$dir/ckpt/" log="$dir/elastic.log"
IFS=';' read -r -a grid_list <<< "$grids"

say() { echo "elastic: $*" | tee -a "$log"; }
launch=(mpiexec) hosts=""
if [ "$cluster" = 1 ]; then
  # The nodes still alive, with their slots: the cluster's hostfile, less every node that lost a rank.
  hosts="$dir/hosts"
  cp "${CLUSTER_STATE:-build/cluster}/hostfile" "$hosts" 2>/dev/null \
    || { echo "error: elastic.sh --cluster needs a cluster up (scripts/cluster/cluster.sh up)" >&2; exit 2; }
  launch=(env CLUSTER_HOSTFILE="$hosts" scripts/cluster/cluster.sh mpiexec)
fi
# The ranks the nodes still alive can hold (no limit without --cluster).
capacity() { if [ -n "$hosts" ]; then awk -F: '{ n += ($2 == "" ? 1 : $2) } END { print n + 0 }' "$hosts"; else echo 1000000; fi; }
nodes() { [ -n "$hosts" ] && echo "; nodes $(cut -d: -f1 "$hosts" | tr '\n' ' ' | sed 's/ $//')"; }
# The step a complete checkpoint in the folder resumes at ("" when none is complete).
checkpoint_step() { [ -f "$ckpt/checkpoint.meta" ] && awk '$1 == "run" { print $2; exit }' "$ckpt/checkpoint.meta"; }
# The last step an attempt's JSON lines recorded (-1 when none): a run killed mid-way leaves them in its
# writer's temporary (PATH.tmp.<host>.<pid>), renamed into place only at a run's end.
last_step() {
  local s
  s="$(cat "$1" "$1".tmp.* 2>/dev/null | grep -o '"type":"step","step":[0-9]*' | tail -1 | grep -o '[0-9]*$')"
  echo "${s:--1}"
}

# Each rank's trainer runs under this wrapper, which records how it ended and where: a rank killed by a
# signal leaves its exit status (128 + the signal) and its host in DIR/attempt<k>.rank<r>.exit. Its
# own process id and host (DIR/attempt<k>.rank<r>.pid) let the launcher end a rank that MPI left
# waiting, and name every rank of a lost node (hydra may end the wrapper of a node's other ranks
# before it records anything).
wrapper="$dir/rank_wrapper.sh"
cat > "$wrapper" <<'EOF'
#!/usr/bin/env bash
echo "$$ $(hostname)" > "$ELASTIC_EXITS.rank${PMI_RANK:-0}.pid"
"$@"
status=$?
echo "$status $(hostname)" > "$ELASTIC_EXITS.rank${PMI_RANK:-0}.exit"
exit "$status"
EOF
chmod +x "$wrapper"

# Whether a rank of the attempt with these files ($1: DIR/attempt<k>) was killed by a signal.
rank_lost() {
  local f code host
  for f in "$1".rank*.exit; do
    [ -f "$f" ] && read -r code host < "$f" && [ "$code" -gt 128 ] && return 0
  done
  return 1
}

# Waits for the job ($1: mpiexec's process id) of an attempt ($2: DIR/attempt<k>). On one host MPICH
# ends every rank once one dies; across nodes a lost node can take hydra's link to its proxy with it,
# and the ranks left then wait for their dead peers for ever. So once a rank is lost and the job has
# not ended 2 s later, the launcher ends it: the trainers still running (listed in DIR/attempt<k>.ended,
# since they were not lost), then mpiexec.
wait_for_job() {
  local job=$1 files=$2 since="" p child wrapper_pid
  while kill -0 "$job" 2>/dev/null; do
    [ -z "$since" ] && rank_lost "$files" && since=$SECONDS
    if [ -n "$since" ] && [ $((SECONDS - since)) -ge 2 ]; then
      for p in "$files".rank*.pid; do
        [ -f "${p%.pid}.exit" ] && continue
        read -r wrapper_pid _ < "$p"
        child="$(ps -o pid= --ppid "$wrapper_pid" 2>/dev/null | tr -d ' ')"
        [ -n "$child" ] || continue
        r="${p##*.rank}"; echo "${r%.pid}" >> "$files.ended"
        kill -KILL "$child" 2>/dev/null
      done
      sleep 0.5
      kill -KILL "$job" 2>/dev/null
      break
    fi
    sleep 0.2
  done
  wait "$job"
}

index=0 restarts=0 attempt=0
while :; do
  grid="${grid_list[$index]}"
  ranks="${grid%%:*}" flags="${grid#*:}"
  resume=""
  from="$(checkpoint_step)"
  [ -n "$from" ] && resume="--resume $ckpt"
  jsonl="$dir/attempt$attempt.jsonl"
  say "attempt $attempt: $ranks ranks of $chapter ${flags:-(its default grid)}${resume:+, resuming at step $from}$(nodes)"
  ELASTIC_EXITS="$dir/attempt$attempt" "${launch[@]}" -n "$ranks" "$wrapper" "./$chapter/train" "$@" $flags \
    --save "$ckpt" --json "$jsonl" $resume >> "$dir/attempt$attempt.out" 2>&1 &
  wait_for_job $! "$dir/attempt$attempt"
  status=$?
  if [ "$status" -eq 0 ]; then
    say "attempt $attempt finished the run (log: $dir/attempt$attempt.out)"
    tail -n 3 "$dir/attempt$attempt.out"
    exit 0
  fi
  # Which rank was lost: the one whose trainer a signal ended (the others MPICH ended after it).
  lost="" lost_nodes=""
  for f in "$dir"/attempt"$attempt".rank*.exit; do
    [ -f "$f" ] || continue
    read -r code host < "$f"
    r="${f##*.rank}"; r="${r%.exit}"
    grep -qx "$r" "$dir/attempt$attempt.ended" 2>/dev/null && continue  # ended by the launcher, not lost
    if [ "$code" -gt 128 ]; then
      lost="${lost:+$lost }$r"
      case " $lost_nodes " in *" $host "*) ;; *) lost_nodes="${lost_nodes:+$lost_nodes }$host" ;; esac
    fi
  done
  [ -n "$hosts" ] || lost_nodes=""  # one host: no node to name
  if [ -n "$lost_nodes" ]; then  # a node lost: all of its ranks
    lost=""
    for f in "$dir"/attempt"$attempt".rank*.pid; do
      read -r _ host < "$f"
      r="${f##*.rank}"
      case " $lost_nodes " in *" $host "*) lost="${lost:+$lost }${r%.pid}" ;; esac
    done
  fi
  nodes_before="$(nodes)"
  if [ -n "$hosts" ] && [ -n "$lost_nodes" ]; then
    for host in $lost_nodes; do grep -v "^$host\(:\|\$\)" "$hosts" > "$hosts.next"; mv "$hosts.next" "$hosts"; done
  fi
  reached="$(last_step "$jsonl")"
  if [ -z "$lost" ] && grep -q "error:" "$dir/attempt$attempt.out" && [ "$reached" -lt 0 ]; then
    # Refused before its work (a grid the chapter's rules reject): the next grid, no rank lost.
    say "grid $ranks:${flags} refused: $(grep -m1 "error:" "$dir/attempt$attempt.out")"
    index=$((index + 1)); attempt=$((attempt + 1))
    [ "$index" -lt "${#grid_list[@]}" ] || { say "no grid left to try"; exit "$status"; }
    continue
  fi
  restarts=$((restarts + 1))
  if [ "$restarts" -gt "$retries" ]; then
    say "attempt $attempt failed (exit $status) and the retry limit ($retries) is reached"
    exit "$status"
  fi
  # A spare replaces the lost rank: the same grid. Else the next grid with fewer ranks (that the nodes
  # left can hold).
  before="$ranks:${flags}"
  if [ "$spares" -gt 0 ] && [ "$ranks" -le "$(capacity)" ]; then
    spares=$((spares - 1))
  else
    next=$((index + 1))
    while [ "$next" -lt "${#grid_list[@]}" ] && { [ "${grid_list[$next]%%:*}" -ge "$ranks" ] ||
      [ "${grid_list[$next]%%:*}" -gt "$(capacity)" ]; }; do next=$((next + 1)); done
    [ "$next" -lt "${#grid_list[@]}" ] || { say "rank(s) ${lost:-?} lost and no smaller grid is left"; exit "$status"; }
    index=$next
  fi
  after="${grid_list[$index]}"
  now="$(checkpoint_step)"
  redone=$(( reached + 1 - ${now:-0} ))
  [ "$redone" -ge 0 ] || redone=0
  say "restart $restarts: lost rank(s) ${lost:-unknown}${lost_nodes:+ (node $lost_nodes)} (mpiexec exit $status) after step $reached;" \
      "grid $before -> $after${nodes_before:+$nodes_before ->$(nodes | sed 's/^; nodes//')};" \
      "resuming at step ${now:-0} from the last complete checkpoint: $redone steps redone"
  attempt=$((attempt + 1))
done
