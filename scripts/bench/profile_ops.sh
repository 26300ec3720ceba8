#!/usr/bin/env bash
# profile_ops.sh: `make profile`. Where one training step's CPU time goes, per op, at one rank and one
# thread: chapter 01 runs under `perf record` (a sample of the program counter every 0.25 ms of CPU
# time), and each sample is booked to the op whose code it was in, by function name:
#   matmul       sgemm_* (its packing is inlined there), its micro-kernels, matmul_*, the biases
#   attention    attention_* and their row helpers, and the exp of the softmax (exp_shifted and max_of
#                serve the attention's softmax and the cross-entropy's; at these presets the
#                attention's T x T scores are 8-16x the logits, so they are booked here)
#   layernorm, GELU, softmax + cross-entropy, AdamW, residual, embedding: their cpu:: functions
#   zeroing and copies   memset, memcpy, fill_zero, copy_tensor, add_inplace, scale_inplace
#   grad norm    sum_of_squares
#   start-up     the parameter initialisation and everything in the kernel (page faults of the
#                first touch of each buffer: no step allocates, so these are the start's)
# A category's ms per step is its samples x 0.25 ms / the steps run (start-up is not divided).
# Environment: PRESETS="small deep", STEPS=12, BENCH_OUT=results/profile. Needs perf (linux-perf).
set -euo pipefail
cd "$(dirname "$0")/../.."
presets=${PRESETS:-"small deep"}
steps=${STEPS:-12}
out=${BENCH_OUT:-results/profile}
command -v perf >/dev/null || { echo "profile_ops.sh: perf not found: install it (apt-get install linux-perf)"; exit 1; }
ours=./01_vanilla_dp/train
[ -x "$ours" ] || { echo "profile_ops.sh: $ours not found: build it with 'make 01_vanilla_dp'"; exit 1; }
mkdir -p "$out"
for preset in $presets; do
  OMP_NUM_THREADS=1 perf record -F 4000 -o "$out/perf_$preset.data" -q "$ours" --preset "$preset" --steps "$steps" \
    --quiet --json "$out/steps_$preset.jsonl" >"$out/run_$preset.log" 2>&1 \
    || { echo "profile_ops.sh: perf record failed at $preset (see $out/run_$preset.log; perf_event_paranoid?)"; exit 1; }
  perf report -i "$out/perf_$preset.data" --no-children --sort symbol --stdio -g none --percent-limit 0 -F sample,sym \
    2>/dev/null | grep -E '^ +[0-9]' >"$out/symbols_$preset.txt"
done
python3 - "$out" "$steps" $presets <<'EOF' | tee "$out/table.txt"
import json, re, statistics, sys

out, steps, presets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
# (category, pattern on the symbol), first match wins.
rules = [
    ("matmul", r"sgemm_|micro_kernel|pack_|merge_tile|matmul_|add_bias|bias_backward"),
    ("attention", r"attention_|accumulate_weighted_rows|scaled_dots|exp_shifted|max_of"),
    ("layernorm", r"layernorm_"),
    ("GELU", r"gelu_"),
    ("softmax + cross-entropy", r"softmax_crossentropy|crossentropy_shard"),
    ("AdamW", r"adamw"),
    ("residual", r"residual_"),
    ("embedding", r"embedding_|position_|encoder_"),
    ("zeroing and copies", r"memset|memcpy|memmove|fill_zero|copy_tensor|add_inplace|scale_inplace"),
    ("grad norm", r"sum_of_squares|mean_of"),
    ("start-up", r"\[k\]|init_weights|__cos|__sin|__ieee754_log|_dl_|do_lookup"),
]
order = [name for name, _ in rules] + ["other"]
tables = {}
for preset in presets:
    samples = dict.fromkeys(order, 0)
    with open(f"{out}/symbols_{preset}.txt") as f:
        for line in f:
            count, symbol = line.split(None, 1)
            name = next((n for n, p in rules if re.search(p, symbol)), "other")
            samples[name] += int(count)
    with open(f"{out}/steps_{preset}.jsonl") as f:
        records = [json.loads(line) for line in f]
    step_ms = statistics.median(r["step_ms"] for r in records if r["type"] == "step" and r["step"] > 0)
    tables[preset] = (samples, step_ms)
print(f"CPU time per step by op: chapter 01, 1 rank, 1 thread, {steps} steps, perf at 4 kHz "
      f"(ms = samples x 0.25 ms / {steps} steps)")
print(f"{'op':<24}" + "".join(f" {p + ' ms':>10} {'%':>6}" for p in presets))
for name in order:
    cells = ""
    for preset in presets:
        samples, _ = tables[preset]
        in_steps = sum(v for k, v in samples.items() if k != "start-up")
        if name == "start-up":
            cells += f" {samples[name] * 0.25:>8.0f}ms {'':>6}"
        else:
            cells += f" {samples[name] * 0.25 / steps:>10.2f} {100 * samples[name] / in_steps:>5.1f}%"
    print(f"{name:<24}{cells}")
print(f"{'total per step':<24}" + "".join(
    f" {sum(v for k, v in s.items() if k != 'start-up') * 0.25 / steps:>10.2f} {'':>6}" for s, _ in tables.values()))
print(f"{'median step (wall)':<24}" + "".join(f" {ms:>10.2f} {'':>6}" for _, ms in tables.values()))
EOF
