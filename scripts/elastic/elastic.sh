#!/usr/bin/env bash
# scripts/elastic/elastic.sh: a training run that survives a lost rank (`make elastic`, docs/checkpoint.md).
#
#   scripts/elastic/elastic.sh [--grids "4:FLAGS;2:FLAGS;1:FLAGS"] [--retries 3] [--spares 0] [--dir DIR]
#                              CHAPTER TRAIN_FLAGS...
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
set -u
cd "$(dirname "$0")/../.." || exit 1

grids="" retries=3 spares=0 dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --grids) grids="$2"; shift 2 ;;
    --retries) retries="$2"; shift 2 ;;
    --spares) spares="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
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
# The step a complete checkpoint in the folder resumes at ("" when none is complete).
checkpoint_step() { [ -f "$ckpt/checkpoint.meta" ] && awk '$1 == "run" { print $2; exit }' "$ckpt/checkpoint.meta"; }
# The last step an attempt's JSON lines recorded (-1 when none): a run killed mid-way leaves them in its
# writer's temporary (PATH.tmp.<host>.<pid>), renamed into place only at a run's end.
last_step() {
  local s
  s="$(cat "$1" "$1".tmp.* 2>/dev/null | grep -o '"type":"step","step":[0-9]*' | tail -1 | grep -o '[0-9]*$')"
  echo "${s:--1}"
}

# Each rank's trainer runs under this wrapper, which records how it ended: a rank killed by a signal
# leaves its exit status (128 + the signal) in DIR/attempt<k>.rank<r>.exit.
wrapper="$dir/rank_wrapper.sh"
cat > "$wrapper" <<'EOF'
#!/usr/bin/env bash
"$@"
status=$?
echo "$status" > "$ELASTIC_EXITS.rank${PMI_RANK:-0}.exit"
exit "$status"
EOF
chmod +x "$wrapper"

index=0 restarts=0 attempt=0
while :; do
  grid="${grid_list[$index]}"
  ranks="${grid%%:*}" flags="${grid#*:}"
  resume=""
  from="$(checkpoint_step)"
  [ -n "$from" ] && resume="--resume $ckpt"
  jsonl="$dir/attempt$attempt.jsonl"
  say "attempt $attempt: $ranks ranks of $chapter ${flags:-(its default grid)}${resume:+, resuming at step $from}"
  ELASTIC_EXITS="$dir/attempt$attempt" mpiexec -n "$ranks" "$wrapper" "./$chapter/train" "$@" $flags \
    --save "$ckpt" --json "$jsonl" $resume >> "$dir/attempt$attempt.out" 2>&1
  status=$?
  if [ "$status" -eq 0 ]; then
    say "attempt $attempt finished the run (log: $dir/attempt$attempt.out)"
    tail -n 3 "$dir/attempt$attempt.out"
    exit 0
  fi
  # Which rank was lost: the one whose trainer a signal ended (the others MPICH ended after it).
  lost=""
  for f in "$dir"/attempt"$attempt".rank*.exit; do
    [ -f "$f" ] || continue
    code="$(cat "$f")"
    if [ "$code" -gt 128 ]; then r="${f##*.rank}"; lost="${lost:+$lost }${r%.exit}"; fi
  done
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
  # A spare replaces the lost rank: the same grid. Else the next grid with fewer ranks.
  before="$ranks:${flags}"
  if [ "$spares" -gt 0 ]; then
    spares=$((spares - 1))
  else
    next=$((index + 1))
    while [ "$next" -lt "${#grid_list[@]}" ] && [ "${grid_list[$next]%%:*}" -ge "$ranks" ]; do next=$((next + 1)); done
    [ "$next" -lt "${#grid_list[@]}" ] || { say "rank(s) ${lost:-?} lost and no smaller grid is left"; exit "$status"; }
    index=$next
  fi
  after="${grid_list[$index]}"
  now="$(checkpoint_step)"
  redone=$(( reached + 1 - ${now:-0} ))
  [ "$redone" -ge 0 ] || redone=0
  say "restart $restarts: lost rank ${lost:-unknown} (mpiexec exit $status) after step $reached; grid $before -> $after;" \
      "resuming at step ${now:-0} from the last complete checkpoint: $redone steps redone"
  attempt=$((attempt + 1))
done
