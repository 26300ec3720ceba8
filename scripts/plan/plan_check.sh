#!/usr/bin/env bash
# plan_check.sh: `make plan-check`. Chapter 09's planner (09_3d_parallel/plan --one) against runs of the
# chapters (03-12) on this machine: for each configuration below, the chapter trains a few steps (--json)
# and the planner predicts the same configuration on the "emulated" cluster (CPU ranks, fp32, the same
# emulated link). Printed side by side (scripts/plan/plan_check.py reads the records):
#   memory per rank (rank 0), by category: parameters, gradients, optimizer state, activations must be
#   exact (both include the padding of the flat buffers); communication buffers are an upper bound.
#   A mixture of experts' activations (11, 12) are set by the routing, which no forecast knows: there
#   they too are the bound that the chapter itself forecasts (its capacity, or every token at this
#   rank's experts). Under Ulysses (10's --ulysses) the bytes its all-to-alls sent (rank 0, a step)
#   must be exact too.
#   step time, at 2 ranks: the prediction within 20% of the measured step (the mean of a round's steps). The
#   planner's compute speed comes from calibration runs on 2 ranks without a link, each the row's own
#   kernels with its new dimension at 1: 01_vanilla_dp for 03-09's rows, 10 at --cp 1 (its blockwise
#   ring kernel, a ring of one) for the CP rows, 11 at --ep 1 (its experts, routed on one rank) for the
#   EP rows and 12's MoE rows. 11's calibration also records its router's choices: from them
#   plan_check.py counts the rows the slowest EP rank of a chapter-11 row runs (capped at its capacity),
#   the planner's --expert-load. A calibration gives two rates: the matrix products' FLOPs over the time
#   the run spent in them (its step records' matmul_ms), with efficiency 1; and the activation bytes
#   of a step over the rest of the step (layernorms, GELU, attention, the loss, the optimizer), the
#   planner's --elementwise-rate. The products' rate is also split by class of rows (the step records'
#   matmul_ms_rows<N>, matmul_flops_rows<N>), and each of a row's products is priced at its class's
#   (--product-rates: an expert at --ep 2 runs twice the rows of --ep 1, faster a FLOP); 10's calibration
#   also gives its attention kernel's rate (its ring record), at which the ring's attention hides the
#   ring's hops (--attention-rate). Beside each calibration build/sync_probe (scripts/plan/sync_probe.cpp)
#   times blocking all-reduces of one float on the same 2 ranks for half a second: their mean is what one
#   synchronization costs under the load of that moment (a few microseconds on idle cores, a
#   scheduler's time slice when more processes than cores want them), the planner's --sync-us, which
#   it adds once for each blocking collective and message of the row. The calibrations alternate with
#   the timed rows' rounds, as `make compare` alternates its chapters: a timed row runs ROUNDS times,
#   a calibration before its first round (unless the one just run is of its kind) and one after each
#   (calibration, round, calibration, round, ..., calibration), and each round is predicted with the
#   mean of the two calibrations on its sides, so that both see the machine the round saw; the row's
#   error is its settled rounds' mean prediction against their mean step. Rounds, not one long run: on
#   these virtual cores what a CPU second computes moves from one tenth of a second to the next (our
#   products by up to 1.8 times, a cache-sized loop between two speeds, one half the other), out of
#   sight of the guest's counters (`make core-speed` shows it); only more time, in independent rounds,
#   averages that out. The load average (1 minute) at each row's start and end is printed beside it.
#   Each calibration and each round runs under scripts/plan/cpu_share.py, which measures, step by step, the share of a core the ranks' main threads got while they wanted one
#   (the kernel's run and run-queue wait times of those threads): a calibration's rates are brought to a
#   core of their own (each step's times times its share, then the mean), and a round is
#   predicted at those rates times the share its own steps got, since the other jobs' bursts are
#   shorter than a row. The share counts how fast the machine let the ranks compute, never how long
#   they took (docs/planner.md, plan-check).
#   Communication is the emulated link's alpha-beta model; the bubble is 08's simulator.
# Settings: PRESET=small, STEPS=8 a round (step 0 is warm-up), CAL_STEPS=12 per calibration, RUNS="name
# name ..." to run only some rows, ROUNDS=3 rounds a timed row (1: one run between two calibrations, as
# the check was before; the fastest step on each side was tried first, then ONE calibration at the start:
# both came out too fast or fell outside when the load moved).
# MAX_ROUNDS=6: a timed row whose error lies within two standard errors of 20% after its rounds (their
# spread over the square root of their number: the verdict in doubt) runs more rounds, up to this many.
# TRIES=3: a round is settled when the calibrations on its two sides, each brought to a core of its own,
# lie within AGREE (0.3: 30%) of each other; the row's error leaves the others out, and a row none of whose
# rounds settled runs again (its rounds between the last calibration and new ones), TRIES in all; a row
# that never settles is marked "the load changed during every try" and counted in the summary.
# The machine's cores are shared: timings are noisy; memory is not.
set -euo pipefail
cd "$(dirname "$0")/../.."
preset=${PRESET:-small}
steps=${STEPS:-8}
cal_steps=${CAL_STEPS:-12}
rounds=${ROUNDS:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS=$rounds: give a whole number of rounds, 1 or more"; exit 2; }
max_rounds=${MAX_ROUNDS:-6}
[[ "$max_rounds" =~ ^[1-9][0-9]*$ ]] || { echo "MAX_ROUNDS=$max_rounds: give a whole number of rounds, 1 or more"; exit 2; }
max_tries=${TRIES:-3}
[[ "$max_tries" =~ ^[1-9][0-9]*$ ]] || { echo "TRIES=$max_tries: give a whole number of tries, 1 or more"; exit 2; }
[[ "${AGREE:-0.3}" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] ||
  { echo "AGREE=$AGREE: give how far apart calibrations may lie as a fraction, 0 or more (0.3: 30%)"; exit 2; }
out=results/plan_check
mkdir -p "$out"
plan=09_3d_parallel/plan
sync_probe=${BUILD:-build}/sync_probe
share_probe=scripts/plan/cpu_share.py
[ -x "$sync_probe" ] || { echo "$sync_probe is not built: make $sync_probe (make plan-check builds it)"; exit 2; }

# Two emulated links (bench-tp's "in a node" and "across nodes").
fast="5 5"
slow="0.5 50"
# name | ranks | chapter | the chapter's flags | the planner's flags | link ("fast" or "slow") | timed (1: check time)
# [| preset, when not PRESET [| calibration: 01 (the default), 10 or 11]]. Every row trains --batch 8. Extend by adding a row; a chapter that is not
# built is skipped.
runs=(
  "dp2|2|03_bucket_dp||--zero 0|slow|1"
  "dp2-fast|2|03_bucket_dp||--zero 0|fast|1"
  "zero1|2|04_zero1||--zero 1|slow|1"
  "zero2|2|05_zero2|--grad-accum 2|--zero 2 --micro-batches 2|slow|1"
  "zero3|2|06_zero3||--zero 3|fast|1"
  "tp2|2|07_tensor_parallel|--tp 2|--tp 2|fast|1"
  "tp2-sp|2|07_tensor_parallel|--tp 2 --sequence-parallel|--tp 2 --sequence-parallel|fast|1"
  "pp2-1f1b|2|08_pipeline|--pp 2 --micro-batches 4 --schedule 1f1b|--pp 2 --micro-batches 4 --schedule 1f1b|fast|1"
  "pp2-interleaved|2|08_pipeline|--pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2|--pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2|fast|1"
  "pp2-zbh1|2|08_pipeline|--pp 2 --micro-batches 4 --schedule zb-h1|--pp 2 --micro-batches 4 --schedule zb-h1|slow|1"
  "pp2-zbv|2|08_pipeline|--pp 2 --micro-batches 4 --schedule zb-v|--pp 2 --micro-batches 4 --schedule zb-v|fast|0"
  "pp2-dualpipev|2|08_pipeline|--pp 2 --micro-batches 4 --schedule dualpipev|--pp 2 --micro-batches 4 --schedule dualpipev|fast|0"
  "zero3-4|4|06_zero3||--zero 3|fast|0"
  "dp2xtp2|4|07_tensor_parallel|--tp 2 --zero1|--tp 2 --zero 1|fast|0"
  "dp2xpp2|4|08_pipeline|--pp 2 --micro-batches 2 --zero1|--pp 2 --micro-batches 2 --zero 1|fast|0"
  "pp4-afab|4|08_pipeline|--pp 4 --micro-batches 4 --schedule afab|--pp 4 --micro-batches 4 --schedule afab|fast|0"
  "zero2-8|8|05_zero2||--zero 2|fast|0"
  "dp4xtp2|8|07_tensor_parallel|--tp 2 --sequence-parallel|--tp 2 --sequence-parallel|fast|0"
  "dp2xpp4|8|08_pipeline|--pp 4 --micro-batches 4 --schedule 1f1b|--pp 4 --micro-batches 4 --schedule 1f1b|fast|0"
  "dp2-recompute-full|2|03_bucket_dp|--recompute full|--recompute full|fast|1"
  "tp2-selective|2|07_tensor_parallel|--tp 2 --recompute selective|--tp 2 --recompute selective|fast|1"
  "dp2xpp2-full|4|08_pipeline|--pp 2 --micro-batches 2 --recompute full|--pp 2 --micro-batches 2 --recompute full|fast|0"
  "tp2x4-sp-full|8|07_tensor_parallel|--tp 2 --sequence-parallel --recompute full|--tp 2 --sequence-parallel --recompute full|fast|0"
  "tp2xpp2-selective|4|09_3d_parallel|--tp 2 --pp 2 --micro-batches 2 --recompute selective|--tp 2 --pp 2 --micro-batches 2 --recompute selective|fast|0"
  "dp2xtp2xpp2|8|09_3d_parallel|--tp 2 --pp 2 --micro-batches 2 --sequence-parallel|--tp 2 --pp 2 --micro-batches 2 --sequence-parallel|fast|0"
  "3d-pp2|2|09_3d_parallel|--tp 1 --pp 2 --micro-batches 4|--pp 2 --micro-batches 4|fast|1"
  "3d-dp2xpp2-zbh1-sel|4|09_3d_parallel|--tp 1 --pp 2 --micro-batches 2 --schedule zb-h1 --recompute selective|--pp 2 --micro-batches 2 --schedule zb-h1 --recompute selective|slow|0"
  "3d-int-zero1|8|09_3d_parallel|--tp 2 --pp 2 --micro-batches 4 --schedule interleaved --zero1|--tp 2 --pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2 --zero 1|fast|0"
  # Chapter 10: DP x CP, the ring (zigzag).
  "cp2|2|10_context_parallel|--cp 2|--cp 2|fast|1||10"
  "cp2-slow|2|10_context_parallel|--cp 2|--cp 2|slow|1||10"
  "dp2xcp2|4|10_context_parallel|--cp 2|--cp 2|fast|0"
  "cp4|4|10_context_parallel|--cp 4|--cp 4|fast|0"
  "dp2xcp4|8|10_context_parallel|--cp 4|--cp 4|fast|0"
  # Chapter 10's Ulysses (the sixth dimension): alone on 2 ranks, and inside a ring of 2 (USP) on 4;
  # its all-to-alls' bytes are checked too, exactly.
  "ulysses2|2|10_context_parallel|--cp 1 --ulysses 2|--ulysses 2|fast|1||10"
  "cp2xulysses2|4|10_context_parallel|--cp 2 --ulysses 2|--cp 2 --ulysses 2|fast|0"
  # Chapter 11: DP x EP on the mixture of experts of small's shape (8 experts, top-2).
  "ep2|2|11_expert_parallel|--ep 2|--ep 2|fast|1|moe-small|11"
  "ep2-capacity|2|11_expert_parallel|--ep 2 --capacity-factor 1|--ep 2 --capacity-factor 1|slow|1|moe-small|11"
  "dp2xep2|4|11_expert_parallel|--ep 2|--ep 2|fast|0|moe-small"
  "ep4|4|11_expert_parallel|--ep 4|--ep 4|fast|0|moe-small"
  "ep8|8|11_expert_parallel|--ep 8 --capacity-factor 1.25|--ep 8 --capacity-factor 1.25|fast|0|moe-small"
  # Chapter 12: the composed grid (DP x CP x TP x PP x EP). Its own at 2 ranks: a mixture of experts in
  # a pipeline or under TP (08 and 07 refuse experts, 11 splits nothing else); at 4 and 8 ranks the
  # compositions, dense and MoE. --micro-batches always (12's default is 2 x --pp, even at --pp 1).
  "5d-moe-pp2|2|12_5d_parallel|--pp 2 --micro-batches 4|--pp 2 --micro-batches 4|fast|1|moe-small|11"
  "5d-moe-tp2-sp|2|12_5d_parallel|--tp 2 --sequence-parallel --micro-batches 1|--tp 2 --sequence-parallel|fast|1|moe-small|11"
  "5d-tp2xcp2|4|12_5d_parallel|--tp 2 --cp 2 --micro-batches 1|--tp 2 --cp 2|fast|0"
  "5d-cp2xpp2|4|12_5d_parallel|--cp 2 --pp 2 --micro-batches 4|--cp 2 --pp 2 --micro-batches 4|fast|0"
  "5d-moe-tp2xpp2-ep2|4|12_5d_parallel|--tp 2 --pp 2 --ep 2 --sequence-parallel --micro-batches 4|--tp 2 --pp 2 --ep 2 --sequence-parallel --micro-batches 4|fast|0|moe-tiny"
  "5d-moe-cp2tp2pp2-ep4|8|12_5d_parallel|--cp 2 --tp 2 --pp 2 --ep 4 --sequence-parallel --micro-batches 4|--cp 2 --tp 2 --pp 2 --ep 4 --sequence-parallel --micro-batches 4|fast|0|moe-tiny"
)

mpirun_flags=()
if mpiexec --help 2>&1 | grep -q -- --oversubscribe; then mpirun_flags+=(--oversubscribe); fi

load() { cut -d' ' -f1 /proc/loadavg; }

# A calibration of kind $1: on 2 ranks without a link, the same batch as every row, so that each rank
# computes what a 2-rank row computes, under the same sharing of the cores, and communicates for free.
#   01: 01_vanilla_dp, PRESET;  10: 10_context_parallel --cp 1, PRESET;  11: 11_expert_parallel --ep 1, moe-small.
calibrations=0
last=""  # the kind of the calibration just run, "" once anything else has run since
calibrate() {
  local kind=$1 cal="$out/calibration$calibrations" cmd
  case "$kind" in
    01) cmd=(./01_vanilla_dp/train --preset "$preset") ;;
    10) cmd=(./10_context_parallel/train --preset "$preset" --cp 1) ;;
    11) cmd=(./11_expert_parallel/train --preset moe-small --ep 1) ;;
  esac
  python3 "$share_probe" --ranks 2 --steps-of "$cal.jsonl" "$cal.share" \
    mpiexec "${mpirun_flags[@]}" -n 2 "${cmd[@]}" --batch 8 --steps "$cal_steps" --quiet --json "$cal.jsonl" \
    </dev/null >"$cal.log" 2>&1 || { echo "calibration failed: ${cmd[*]}"; tail -n 5 "$cal.log"; exit 1; }
  # Beside it, what one synchronization between the 2 ranks costs now (the planner's --sync-us).
  timeout 60 mpiexec "${mpirun_flags[@]}" -n 2 "$sync_probe" --ms 500 </dev/null >"$cal.sync" 2>&1 ||
    { echo "sync probe failed: $sync_probe"; tail -n 5 "$cal.sync"; exit 1; }
  printf 'calibration\t%s\t%s\t%s\n' "$calibrations" "$(load)" "$kind" >>"$out/rows.tsv"
  calibrations=$((calibrations + 1))
  last=$kind
}

# Round $1 of the row being run: the calibration before it unless the last one run is of its kind, the
# row, and (a timed row) the calibration after it. Sets first_cal and before at the row's first round;
# returns 1, with failed set, when the row fails.
run_round() {
  local round=$1
  if [ "$timed" = 1 ] && [ "$last" != "$kind" ]; then calibrate "$kind"; fi
  if [ -z "$first_cal" ]; then first_cal=$((calibrations - 1)) before=$(load); fi
  if ! python3 "$share_probe" --ranks "$ranks" --steps-of "$log.round$round.jsonl" "$log.round$round.share" \
      timeout 600 mpiexec "${mpirun_flags[@]}" -n "$ranks" "./$chapter/train" --preset "$row_preset" --batch 8 \
      --steps "$steps" --quiet --link-gbps "$gbps" --link-latency-us "$latency" $chapter_flags \
      --json "$log.round$round.jsonl" </dev/null >"$log.log" 2>&1; then
    failed=$(tail -n 1 "$log.log")
    last=""
    return 1
  fi
  last=""
  if [ "$timed" = 1 ]; then calibrate "$kind"; fi
}

selected=" ${RUNS:-} "
rm -f "$out"/calibration*.jsonl "$out"/calibration*.sync "$out"/calibration*.share
: >"$out/rows.tsv"
echo "calibration runs on 2 ranks without a link, before and after each round of a timed row (ROUNDS=$rounds): 01_vanilla_dp, 10 --cp 1, 11 --ep 1 (scripts/plan/plan_check.sh)"
for row in "${runs[@]}"; do
  IFS='|' read -r name ranks chapter chapter_flags plan_flags link timed row_preset kind <<<"$row"
  row_preset=${row_preset:-$preset}
  kind=${kind:-01}
  if [ -n "${RUNS:-}" ] && [[ "$selected" != *" $name "* ]]; then continue; fi
  if [ ! -x "$chapter/train" ]; then
    printf '%s\tskipped\t%s is not built\n' "$name" "$chapter" >>"$out/rows.tsv"
    continue
  fi
  read -r gbps latency <<<"${!link}"
  log="$out/$name"
  row_rounds=1
  if [ "$timed" = 1 ]; then row_rounds=$rounds; fi
  tries=0
  settled=1
  while :; do
  tries=$((tries + 1))
  failed=""
  first_cal=""
  rm -f "$log".round*.jsonl "$log".round*.share
  for ((round = 1; round <= row_rounds; round++)); do
    run_round "$round" || break
  done
  # A round is settled when the calibrations on its two sides, brought to a core of their own, agree: if
  # not, the machine changed under it in a way the share did not follow (caches, memory bandwidth). A row
  # none of whose rounds settled runs again, between the last calibration and new ones, TRIES in all.
  if [ -n "$failed" ] || [ "$timed" != 1 ] ||
    python3 scripts/plan/plan_check.py --agree "$out" "$first_cal" $((calibrations - 1)); then
    settled=1
    break
  fi
  settled=0
  if [ "$tries" -ge "$max_tries" ]; then break; fi
  done
  # A row whose error lies within two standard errors of 20% (its rounds' spread) runs more rounds, up to
  # MAX_ROUNDS: time where the verdict is in doubt, not on the rows that are clearly in or out.
  while [ -z "$failed" ] && [ "$timed" = 1 ] && [ "$row_rounds" -lt "$max_rounds" ] &&
    python3 scripts/plan/plan_check.py --more "$out" "$preset" "$plan" "$name" "$ranks" "$chapter" "$gbps" "$latency" \
      "$row_preset" "$first_cal" "$row_rounds" "$plan_flags"; do
    row_rounds=$((row_rounds + 1))
    run_round "$row_rounds" || break
  done
  if [ -n "$failed" ]; then
    printf '%s\tfailed\t%s\n' "$name" "$failed" >>"$out/rows.tsv"
    continue
  fi
  cat "$log".round*.jsonl >"$log.jsonl"
  printf '%s\tran\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$ranks" "$chapter" "$gbps" "$latency" "$timed" \
    "$plan_flags" "$row_preset" "$first_cal" "$before" "$(load)" "$row_rounds" "$tries" "$settled" >>"$out/rows.tsv"
done

python3 scripts/plan/plan_check.py "$out" "$preset" "$plan"
