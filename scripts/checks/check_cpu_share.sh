#!/usr/bin/env bash
# check_cpu_share.sh (a test, tests/manifest.txt): scripts/plan/cpu_share.py, the share of a core that
# make plan-check scales its calibrations' rates by. Two spinning "ranks" pinned to one core can get
# at most half of it each, whatever else the machine runs, so their share must come out at most about
# 1/2 (the bound holds on a busy machine too: other jobs on that core only lower it); a run that
# writes four step records to its temporary, as the trainers do (common/base/metrics.h), gets a share
# for each of its four steps; and plan_check.py's agreement of two calibrations reads their steps at
# those shares (made-up records: 100 and 200 ms steps at shares 0.5 and 0.25 are the same 50 ms on a
# core of their own, 100 ms at 0.5 against 400 ms at 0.25 are not); its rule for more rounds (a row's
# error within two standard errors of 20%) and its rates by class of rows and of the attention kernel
# are the formulas' on made-up records (docs/theory.md, section 20).
set -u
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

spin="timeout 2 bash -c 'while :; do :; done'"
python3 scripts/plan/cpu_share.py --ranks 2 "$dir/pinned.share" \
  taskset -c 0 bash -c "$spin & $spin; wait" || fail "cpu_share.py around two spinners failed"
python3 - "$dir/pinned.share" <<'PY' || exit 1
import json, sys
r = json.loads(open(sys.argv[1]).read().split(" ", 1)[1])
print("two spinners on one core: share %.3f (ranks found %d)" % (r["share"] or 0, r["ranks_found"]))
if r["ranks_found"] != 2 or r["share"] is None or not 0 < r["share"] <= 0.6:
    sys.exit("FAIL: two spinners on one core got a share of %s, not at most 1/2" % r["share"])
PY

# Four steps, each written as the trainers write theirs: to PATH.tmp.<host>.<pid>, renamed at the end.
writer='import os, time
path = os.environ["RUN"]; tmp = "%s.tmp.%s.%d" % (path, os.uname()[1], os.getpid())
with open(tmp, "w") as f:
    for k in range(4):
        end = time.monotonic() + 0.25
        while time.monotonic() < end: pass
        f.write("{\"type\":\"step\",\"step\":%d}\n" % k); f.flush()
os.rename(tmp, path)'
echo '{"type":"step","step":0}' >"$dir/run.jsonl"  # an earlier run's file, left where this one will go
RUN="$dir/run.jsonl" python3 scripts/plan/cpu_share.py --ranks 1 --steps-of "$dir/run.jsonl" "$dir/steps.share" \
  bash -c "python3 -c '$writer'; true" || fail "cpu_share.py around the writer failed"
python3 - "$dir/steps.share" <<'PY' || exit 1
import json, sys
r = json.loads(open(sys.argv[1]).read().split(" ", 1)[1])
print("four steps: shares %s" % r["step_share"])
if len(r["step_share"]) != 4 or None in r["step_share"]:
    sys.exit("FAIL: a run of four steps got the shares %s" % r["step_share"])
PY

python3 -B - "$dir" <<'PY' || exit 1  # -B: no __pycache__ left beside plan_check.py
import json, os, sys
sys.path.insert(0, "scripts/plan")
import plan_check
out = sys.argv[1]
def calibration(index, step_ms, share):
    with open("%s/calibration%d.jsonl" % (out, index), "w") as f:
        for k in range(4):
            f.write(json.dumps({"type": "step", "step": k, "step_ms": step_ms, "matmul_ms": step_ms / 2}) + "\n")
    with open("%s/calibration%d.share" % (out, index), "w") as f:
        f.write("share-json " + json.dumps({"share": share, "step_share": [share] * 4}) + "\n")
calibration(0, 100.0, 0.5)
calibration(1, 200.0, 0.25)
calibration(2, 400.0, 0.25)
if plan_check.own_core_step_ms(out, 1) != 50.0:
    sys.exit("FAIL: 200 ms at a share of 0.25 is %s ms on a core of its own, not 50" % plan_check.own_core_step_ms(out, 1))
if not plan_check.calibrations_agree(out, 0, 1) or plan_check.calibrations_agree(out, 1, 2):
    sys.exit("FAIL: 50 and 50 ms on a core of their own must agree, 50 and 100 must not")
print("calibrations on a core of their own: 50 and 50 ms agree, 50 and 100 do not")
# A row's rounds: some round settled when any two neighbouring calibrations agree (plan_check.sh's
# --agree), and the row's error is its settled rounds' mean prediction against their mean step.
import subprocess
agree = lambda first, last: subprocess.run([sys.executable, "-B", "scripts/plan/plan_check.py", "--agree", out,
                                            str(first), str(last)]).returncode == 0
if not agree(0, 2) or agree(1, 2):
    sys.exit("FAIL: rounds between calibrations 0..2 (50, 50, 100 ms) have one settled, between 1..2 none")
# Two settled rounds, 100 and 200 ms predicted 110 and 180, and one unsettled (left out): 145 against 150.
rounds = [{"meas_ms": 100.0, "pred_ms": 110.0, "settled": True}, {"meas_ms": 200.0, "pred_ms": 180.0, "settled": True},
          {"meas_ms": 100.0, "pred_ms": 300.0, "settled": False}]
err, meas, pred, used = plan_check.row_error(rounds)
if abs(err - (145.0 - 150.0) / 150.0) > 1e-12 or len(used) != 2:
    sys.exit("FAIL: the row's error over its settled rounds is %s, not 145 / 150 - 1" % err)
if abs(plan_check.row_error([dict(r, settled=False) for r in rounds])[0] - (590.0 / 3 - 400.0 / 3) / (400.0 / 3)) > 1e-12:
    sys.exit("FAIL: with no round settled, every round counts")
print("rounds: one of two settled between 50, 50 and 100 ms; a row's error over its settled rounds")
# A row's verdict is in doubt while its error lies within two standard errors (the rounds' spread over
# the square root of their number) of 20%: rounds at -5, -6, -4% are clearly in; -15, -25, -20% sit on
# the bound; +30, -10, +10% (+10% +- 11.5%) could be either; one used round says nothing of its spread.
made = lambda errs, settled=True: [{"meas_ms": 100.0, "pred_ms": 100.0 * (1 + e), "err": e, "settled": settled}
                                   for e in errs]
if plan_check.in_doubt(made([-0.05, -0.06, -0.04])) or not plan_check.in_doubt(made([-0.15, -0.25, -0.20])) or \
        not plan_check.in_doubt(made([0.30, -0.10, 0.10])) or not plan_check.in_doubt(made([-0.05])):
    sys.exit("FAIL: the rounds' verdicts in doubt are not those of 20% within two standard errors")
print("rounds in doubt: -15, -25, -20% and +30, -10, +10% run more; -5, -6, -4% do not")
# The products' rate by class of rows: a class's FLOPs over its time (each step's times its share),
# relative to all the products' together, times the calibration's rate. Two steps at shares 0.5 and
# 0.25: 256 rows, 3e9 FLOPs in 40 + 80 ms (20 + 20 ms on a core of their own); 512 rows, 2e9 in 40 + 40 ms
# (20 + 10 ms); 64 rows, 1e6 FLOPs in 1 ms a step (under 5% of the time: left out).
with open("%s/calibration3.jsonl" % out, "w") as f:
    for k, ms256, ms512 in ((1, 40.0, 40.0), (2, 80.0, 40.0)):
        f.write(json.dumps({"type": "step", "step": k, "step_ms": 200.0, "matmul_ms": ms256 + ms512 + 1,
                            "matmul_ms_rows256": ms256, "matmul_flops_rows256": 1.5e9,
                            "matmul_ms_rows512": ms512, "matmul_flops_rows512": 1e9,
                            "matmul_ms_rows64": 1.0, "matmul_flops_rows64": 5e5}) + "\n")
    f.write(json.dumps({"type": "ring", "rank0_flops": 2e8, "rank0_compute_cpu_ms": 50.0}) + "\n")
classes = plan_check.product_classes("%s/calibration3.jsonl" % out, [None, 0.5, 0.25])
rates = plan_check.class_rates(classes, 1e10)
all_products = (3e9 + 2e9 + 1e6) / (40 + 30 + 0.75)  # FLOPs a ms over every class, on a core of its own
want = {256: 1e10 * (3e9 / 40) / all_products, 512: 1e10 * (2e9 / 30) / all_products}
if sorted(rates) != [256, 512] or any(abs(rates[c] - want[c]) > 1e-6 * want[c] for c in want):
    sys.exit("FAIL: rates by rows %s, not %s" % (rates, want))
if abs(plan_check.attention_rate("%s/calibration3.jsonl" % out) - 4e9) > 1:
    sys.exit("FAIL: 2e8 attention FLOPs in 50 ms of CPU time is 4 GFLOP/s, not %s" % plan_check.attention_rate(
        "%s/calibration3.jsonl" % out))
print("products by rows: 256 rows at %.3g, 512 at %.3g FLOP/s (64's 1 ms left out); attention 4 GFLOP/s" %
      (rates[256], rates[512]))
PY
# The retry rule's settings are refused in one line, before any run, when they are not numbers.
for setting in "TRIES=0" "TRIES=two" "AGREE=abc" "AGREE=-1" "MAX_ROUNDS=0" "MAX_ROUNDS=six"; do
  said=$(env "$setting" scripts/plan/plan_check.sh 2>&1) && fail "plan_check.sh ran with $setting"
  [ "$(printf '%s\n' "$said" | wc -l)" = 1 ] && [[ "$said" == "${setting}:"* ]] ||
    fail "plan_check.sh with $setting said: $said"
done
echo "cpu_share.py and the calibrations' agreement: ok"
