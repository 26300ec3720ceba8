#!/usr/bin/env bash
# compare.sh: the main job (make compare). Trains every chapter that exists on one rank and on two,
# on settings where each chapter's effect is real, then prints one table side by side and writes
# plots (scripts/compare.py), a timeline of one step per chapter (scripts/plot_timeline.py) and, where
# chapter 08 ran, its pipeline diagram, measured next to ideal (scripts/plot_pipeline.py).
# Results land in results/: one JSON-lines file, log and trace per run, the table (compare.txt), PNGs.
#
# The defaults, and why:
#   PRESET=deep   12 blocks: ZeRO-3 holds only a few gathered at a time, so its memory saving is real.
#   LINK="--link-gbps 2 --link-latency-us 100"   an emulated link on which the gradient's all-reduce
#                 takes about as long as backward (and each collective pays a latency), so that
#                 overlap, buckets and prefetch change the step time. LINK=none switches it off.
#   TP_LINK="--tp-link-gbps 20 --tp-link-latency-us 10"   07's tensor-parallel group gets a node's
#                 faster link (ten times the bandwidth of LINK's): tensor parallelism exchanges
#                 activations inside every layer, so it runs where the links are fastest. TP_LINK=none:
#                 07 uses LINK too.
#   RANKS="1 2"   two ranks, one per core of a small machine; STEPS=30; EXTRA="..." adds flags to every run.
# 07 runs with --tp-overlap, twice at each rank count above one: tensor parallelism (TP 2, the rest
# data-parallel), then with sequence parallelism too (results/07_tensor_parallel_sp_nN.*).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-"1 2"}
steps=${STEPS:-30}
preset=${PRESET:-deep}
link=${LINK:-"--link-gbps 2 --link-latency-us 100"}
[ "$link" = none ] && link=""
tp_link=${TP_LINK:-"--tp-link-gbps 20 --tp-link-latency-us 10"}
{ [ "$tp_link" = none ] || [ -z "$link" ]; } && tp_link=""
extra=${EXTRA:-}
settings="--preset $preset --steps $steps $link $extra"
echo "make compare: every chapter on ${ranks// / and } rank(s) with: $settings"
[ -n "$tp_link" ] && echo "  and for 07's tensor-parallel group: $tp_link"
echo "  (PRESET=, STEPS=, RANKS=, LINK=none or LINK=\"--link-gbps G --link-latency-us L\", TP_LINK=, EXTRA= change it)"
mkdir -p results
rm -f results/*.jsonl results/*.trace.json results/*.log
for chapter in $(ls -d [0-9][0-9]_*/ | tr -d /); do
  [ -x "$chapter/train" ] || continue
  for n in $ranks; do
    variants="plain"
    [ "$chapter" = 07_tensor_parallel ] && [ "$n" -gt 1 ] && variants="plain sp"
    for variant in $variants; do
      flags=""
      run="${chapter}_n${n}"
      [ "$chapter" = 07_tensor_parallel ] && flags="--tp-overlap $tp_link"
      if [ "$variant" = sp ]; then flags="$flags --sequence-parallel"; run="${chapter}_sp_n${n}"; fi
      echo "training $chapter on $n rank(s) $flags"
      # shellcheck disable=SC2086
      mpiexec -n "$n" "./$chapter/train" $settings $flags --json "results/$run.jsonl" \
        --trace "results/$run.trace.json" </dev/null >"results/$run.log" 2>&1 \
        || { echo "  failed: see results/$run.log"; tail -n 5 "results/$run.log"; exit 1; }
      grep -E "^(average over|no measured steps)" "results/$run.log" | sed 's/^/  /'
    done
  done
done
python3 scripts/compare.py results | tee results/compare.txt
# One step of every chapter's run at the largest rank count, one above the other: where
# communication sits in time.
largest=$(echo "$ranks" | tr ' ' '\n' | sort -n | tail -n 1)
traces=$(ls results/*_n"$largest".trace.json 2>/dev/null | sort || true)
if [ -n "$traces" ] && [ "$largest" -gt 1 ]; then
  # shellcheck disable=SC2086
  python3 scripts/plot_timeline.py --out results/timeline.png $traces
fi
# Chapter 08's run at the largest rank count, as the classic pipeline diagram: measured and ideal.
pipeline=results/08_pipeline_n"$largest"
rm -f results/pipeline.png
if [ "$largest" -gt 1 ] && [ -f "$pipeline.trace.json" ] && [ -f "$pipeline.jsonl" ]; then
  python3 scripts/plot_pipeline.py --out results/pipeline.png "$pipeline"
fi
