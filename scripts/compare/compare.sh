#!/usr/bin/env bash
# compare.sh: the main job (make compare). Trains every chapter that exists on one rank and on two,
# on settings where each chapter's effect is real, then prints one table side by side and writes
# plots (scripts/compare/compare.py), a timeline of one step per chapter (scripts/compare/plot_timeline.py) and, where
# chapter 08 ran, its pipeline diagram, measured next to ideal (scripts/bench/plot_pipeline.py).
# Results land in results/: one JSON-lines file, log and trace per run, the table (compare.txt), PNGs.
# Chapter 11 trains a mixture of experts (MOE_PRESET=moe-tiny), with EP = the rank count, also on one
# rank (its own baseline), and twice more for results/experts.png (the load per expert, without and
# with the balancing loss; scripts/compare/plot_experts.py).
#
# The defaults, and why:
#   PRESET=deep   12 blocks: ZeRO-3 holds only a few gathered at a time, so its memory saving is real.
#   LINK="--link-gbps 0.75 --link-latency-us 50"   an emulated link on which the gradient's all-reduce
#                 (104 ms for deep's 9.7 MB) takes longer than 01's forward and backward together on a
#                 quiet machine, and each collective pays a latency (02's 148 a step 15 ms, 03's 8 one),
#                 so that overlap, buckets and prefetch change the step time, and still do when other
#                 work slows the computation down (the link is a wait, not work for the cores). A
#                 slower link (0.5 Gbit/s, 100 us, the default until the kernels got faster) no longer
#                 lets backward hide enough of it for 02 to show its overlap on a quiet machine; a
#                 faster one hides too little of the step under load (docs/benchmarks.md). LINK=none
#                 switches it off.
#   TP_LINK="--tp-link-gbps 20 --tp-link-latency-us 10"   07's tensor-parallel group gets a node's
#                 faster link (about twenty-five times the bandwidth of LINK's): tensor parallelism exchanges
#                 activations inside every layer, so it runs where the links are fastest. TP_LINK=none:
#                 07 uses LINK too.
#   RANKS="1 2"   two ranks, one per core of a small machine; at one rank only 01 runs (ONE_RANK=all: every
#                 chapter), the baseline of the speed-up: every chapter computes the same on one rank.
#   ROUNDS=4 STEPS=10   each run is made ROUNDS times, STEPS steps each (step 0 of each is warm-up), the
#                 chapters alternating (01, 02, ..., 08, then 01 again), so that a load that comes and goes
#                 falls on every chapter alike; the table reports each chapter's median step over all its
#                 rounds, with the spread. EXTRA="..." adds flags to every run.
# 07 runs with --tp-overlap, twice at each rank count above one: tensor parallelism (TP 2, the rest
# data-parallel), then with sequence parallelism too (results/07_tensor_parallel_sp_nN.*). 10 runs its
# default ring (CP 2 on an even rank count, zig-zag) on the same link as the gradients; then, at the
# largest rank count, scripts/bench/cp_balance.sh draws its balance on a long context (CP_BALANCE=0 skips).
# 09's own grid, TP 2 x PP 2, needs 4 ranks: a short section of its own after the rounds
# (results/four_ranks/, one round of STEPS4=6 steps, the same model, batch and links): 01 (the
# baseline), 07 as TP 2 x DP 2, 08 as PP 2 x DP 2 and 09 as TP 2 x PP 2. FOUR=none skips it.
# The machine's load is read before the runs, before each and after them (results/load.txt): the
# table warns when other work competed for the cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${RANKS:-"1 2"}
rounds=${ROUNDS:-4}
steps=${STEPS:-10}
one_rank=${ONE_RANK:-01}
preset=${PRESET:-deep}
link=${LINK:-"--link-gbps 0.75 --link-latency-us 50"}
[ "$link" = none ] && link=""
tp_link=${TP_LINK:-"--tp-link-gbps 20 --tp-link-latency-us 10"}
{ [ "$tp_link" = none ] || [ -z "$link" ]; } && tp_link=""
extra=${EXTRA:-}
moe_preset=${MOE_PRESET:-moe-tiny}
settings="--preset $preset --steps $steps $link $extra"
echo "make compare: every chapter on ${ranks// / and } rank(s), $rounds rounds of $steps steps, with: $settings"
[ -n "$tp_link" ] && echo "  and for 07's tensor-parallel group: $tp_link"
echo "  (PRESET=, STEPS=, ROUNDS=, RANKS=, ONE_RANK=all, LINK=none or LINK=\"--link-gbps G --link-latency-us L\","
echo "   TP_LINK=, EXTRA= change it)"
[ -x 13_mixed_precision/train ] && \
  echo "  13_mixed_precision is not a row: at its default (--precision fp32) it trains as 03; its recipes are make precision's table"
mkdir -p results/rounds
rm -f results/*.jsonl results/*.trace.json results/*.log results/rounds/* results/load.txt
rm -rf results/four_ranks

# The runs of one round, in order: "chapter ranks variant".
plan=()
for n in $ranks; do
  for chapter in $(ls -d [0-9][0-9]_*/ | tr -d /); do
    [ -x "$chapter/train" ] || continue
    # 12 composes dimensions: at 2 ranks it would be one of the chapters before it (07, 08 or 10);
    # it runs in the 4-rank section below, as TP 2 x CP 2.
    [ "$chapter" = 12_5d_parallel ] && continue
    # 13 at its default (--precision fp32) is 03; its lesson is make precision's table.
    [ "$chapter" = 13_mixed_precision ] && continue
    # 11 trains a model of its own (a mixture of experts): its one-rank run is its own baseline.
    [ "$n" -eq 1 ] && [ "$one_rank" != all ] && [ "${chapter:0:2}" != "$one_rank" ] && [ "$chapter" != 11_expert_parallel ] \
      && continue
    plan+=("$chapter $n plain")
    [ "$chapter" = 07_tensor_parallel ] && [ "$n" -gt 1 ] && plan+=("$chapter $n sp")
  done
done
total=$(( ${#plan[@]} * rounds ))
echo "cores $(nproc)" >results/load.txt
echo "before $(cat /proc/loadavg)" >>results/load.txt

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
declare -A spent runs_of  # per run name: milliseconds so far, and how many
done_runs=0; spent_all=0
for round in $(seq 1 "$rounds"); do
  for entry in "${plan[@]}"; do
    read -r chapter n variant <<<"$entry"
    flags=""
    run="${chapter}_n${n}"
    [ "$chapter" = 07_tensor_parallel ] && flags="--tp-overlap $tp_link"
    # 09 at 2 ranks is a grid of TP 2 (TP x PP needs 4): 07's run, with selective recomputation.
    [ "$chapter" = 09_3d_parallel ] && flags="--tp-overlap $tp_link --recompute selective"
    if [ "$variant" = sp ]; then flags="$flags --sequence-parallel"; run="${chapter}_sp_n${n}"; fi
    run_settings=$settings
    # 11: the MoE preset, its experts spread over every rank (EP = the rank count).
    [ "$chapter" = 11_expert_parallel ] && run_settings="--preset $moe_preset --steps $steps $link $extra" \
      && flags="--ep $n"
    # How long is left: each run still to come takes what it took in earlier rounds (in the first
    # round, what a run took on average so far).
    eta="?:??"
    if [ "$done_runs" -gt 0 ]; then
      left_ms=0
      for ((i = done_runs; i < total; i++)); do
        read -r c m v <<<"${plan[i % ${#plan[@]}]}"
        name="${c}_n${m}"; [ "$v" = sp ] && name="${c}_sp_n${m}"
        if [ -n "${runs_of[$name]:-}" ]; then left_ms=$(( left_ms + spent[$name] / runs_of[$name] ))
        else left_ms=$(( left_ms + spent_all / done_runs )); fi
      done
      eta=$(printf "%d:%02d" $(( left_ms / 60000 )) $(( left_ms / 1000 % 60 )))
    fi
    printf "[%d/%d] %s x%s%s, round %d/%d ... ETA %s" $((done_runs + 1)) "$total" "$chapter" "$n" \
      "$([ "$variant" = sp ] && echo " +SP")" "$round" "$rounds" "$eta"
    echo "between $(cat /proc/loadavg)" >>results/load.txt
    out="results/rounds/$run.r$round"
    started=$(now_ms)
    # shellcheck disable=SC2086
    mpiexec -n "$n" "./$chapter/train" $run_settings $flags --json "$out.jsonl" --trace "$out.trace.json" \
      </dev/null >"$out.log" 2>&1 \
      || { echo; echo "  failed: see $out.log"; tail -n 5 "$out.log"; exit 1; }
    took=$(( $(now_ms) - started ))
    spent[$run]=$(( ${spent[$run]:-0} + took )); runs_of[$run]=$(( ${runs_of[$run]:-0} + 1 ))
    spent_all=$(( spent_all + took )); done_runs=$((done_runs + 1))
    echo " | $(sed -n 's/^average over \([0-9]*\) measured steps: \([0-9.]* ms\/step\).*/\2/p' "$out.log")"
    if [ "$round" -eq "$rounds" ]; then  # the last round's files stand for the run (plots, timeline)
      for ext in jsonl trace.json log; do cp "$out.$ext" "results/$run.$ext"; done
    fi
  done
done
# 09 on its own grid, and at 4 ranks what it composes: 07's TP and 08's PP, each with DP over the rest;
# and 12, composing 10's CP ring with TP on the same 4 ranks (TP 2 x CP 2).
if [ "${FOUR:-}" != none ] && [ -x 09_3d_parallel/train ]; then
  mkdir -p results/four_ranks
  steps4=${STEPS4:-6}
  section_started=$(now_ms)
  for entry in "01_vanilla_dp|" "07_tensor_parallel|--tp 2 --tp-overlap $tp_link" \
               "08_pipeline|--pp 2" "09_3d_parallel|--tp 2 --pp 2 --tp-overlap $tp_link" \
               "12_5d_parallel|--tp 2 --cp 2 --tp-overlap $tp_link"; do
    IFS='|' read -r chapter flags <<<"$entry"
    [ -x "$chapter/train" ] || continue
    printf "[4 ranks] %s %s ..." "$chapter" "$flags"
    out="results/four_ranks/${chapter}_n4"
    # shellcheck disable=SC2086
    mpiexec -n 4 "./$chapter/train" --preset "$preset" --steps "$steps4" $link $extra $flags --json "$out.jsonl" \
      --trace "$out.trace.json" </dev/null >"$out.log" 2>&1 \
      || { echo; echo "  failed: see $out.log"; tail -n 5 "$out.log"; exit 1; }
    echo " | $(sed -n 's/^average over \([0-9]*\) measured steps: \([0-9.]* ms\/step\).*/\2/p' "$out.log")"
  done
  echo "[4 ranks] the section took $(( ($(now_ms) - section_started) / 1000 )) s"
fi
echo "after $(cat /proc/loadavg)" >>results/load.txt
python3 scripts/compare/compare.py results | tee results/compare.txt
# One step of every chapter's run at the largest rank count, one above the other: where
# communication sits in time.
largest=$(echo "$ranks" | tr ' ' '\n' | sort -n | tail -n 1)
traces=$(ls results/*_n"$largest".trace.json 2>/dev/null | sort || true)
if [ -n "$traces" ] && [ "$largest" -gt 1 ]; then
  # shellcheck disable=SC2086
  python3 scripts/compare/plot_timeline.py --out results/timeline.png $traces
fi
# Chapter 11's experts: the load of each expert over the steps, without the balancing loss and with it,
# at the largest rank count (EP = the rank count), on the same data and start.
rm -rf results/experts.png results/experts
if [ -x 11_expert_parallel/train ]; then
  mkdir -p results/experts
  expert_steps=${EXPERT_STEPS:-40}
  for aux in 0 0.1; do
    echo "11_expert_parallel x$largest, --aux-loss-coef $aux, $expert_steps steps (for results/experts.png)"
    # shellcheck disable=SC2086
    mpiexec -n "$largest" ./11_expert_parallel/train --preset "$moe_preset" --ep "$largest" --steps "$expert_steps" \
      --aux-loss-coef "$aux" --quiet $extra --json "results/experts/aux$aux.jsonl" </dev/null \
      >"results/experts/aux$aux.log" 2>&1 || { echo "  failed: see results/experts/aux$aux.log"; exit 1; }
  done
  python3 scripts/compare/plot_experts.py --out results/experts.png results/experts/aux0.jsonl results/experts/aux0.1.jsonl
fi
# Chapter 08's run at the largest rank count, as the classic pipeline diagram: measured and ideal.
pipeline=results/08_pipeline_n"$largest"
rm -f results/pipeline.png
if [ "$largest" -gt 1 ] && [ -f "$pipeline.trace.json" ] && [ -f "$pipeline.jsonl" ]; then
  python3 scripts/bench/plot_pipeline.py --out results/pipeline.png "$pipeline"
fi
# Chapter 10's ring at the largest rank count, contiguous against zig-zag, on a long context
# (results/cp_balance.png; CP_BALANCE=0 skips it).
rm -f results/cp_balance.png
if [ "$largest" -gt 1 ] && [ -x 10_context_parallel/train ] && [ "${CP_BALANCE:-1}" != 0 ]; then
  CPS="$largest" scripts/bench/cp_balance.sh
fi
# Chapter 00's collectives, built from send and receive, at 4 ranks over shared memory and over the
# same link as the chapters' gradients, 4 B to 1 MB: which algorithm wins at which size, and how far
# the alpha-beta model is (results/collectives.png; COLLECTIVES=0 skips it, make collectives is the
# whole benchmark).
rm -f results/collectives.png
if [ -x 00_collectives/collectives ] && [ "${COLLECTIVES:-1}" != 0 ]; then
  echo
  COLL_RANKS=4 COLL_MAX=1048576 COLL_BUDGET_MB=8 COLL_BRIEF=1 COLL_LINK="$link" \
    scripts/bench/collectives.sh
fi
