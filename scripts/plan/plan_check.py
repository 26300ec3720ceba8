#!/usr/bin/env python3
"""plan_check.py OUT PRESET PLAN: the table of `make plan-check` (scripts/plan/plan_check.sh runs the chapters
and the calibrations and lists them in OUT/rows.tsv). For every row, the planner's prediction of the
same configuration (PLAN --one on the emulated cluster) beside the run's records: memory per rank by
category, exact (a mixture of experts' activations, 11's and 12's, set by the routing, within the
planner's bound), the communication buffers within the bound, and at 2 ranks the step within 20%: a
timed row runs in ROUNDS rounds or more, a calibration on each side of each, and each round is predicted
with the two calibrations around it (their mean rates on a core of their own, times the share of a core
the round's ranks got during its steps, scripts/plan/cpu_share.py) and set against its own mean step;
the row's error is the mean of its rounds' predictions against the mean of their steps. The products
at the rate of their class of rows (--product-rates) and, under CP, the ring's attention at the rate
of 10's kernel (--attention-rate), the prediction with one rate beside it ("before"). Exit 1 when memory is not exact; the times are printed, with the machine's load beside them.
plan_check.py --agree OUT FIRST LAST: exit 0 when some round settled, its two calibrations (two
neighbours in FIRST..LAST) agreeing on a core of their own (plan_check.sh asks after each timed row
whether to run it again).
plan_check.py --more OUT PRESET PLAN NAME RANKS CHAPTER GBPS LATENCY MODEL FIRST ROUNDS FLAGS: exit 0 when
the row's ROUNDS rounds (after calibration FIRST) leave its verdict in doubt, its error within DOUBT
standard errors of 20% (plan_check.sh then runs another round, up to MAX_ROUNDS)."""
import json
import os
import subprocess
import sys


def records(path):
    rows = []
    for line in open(path):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def median_step(path):
    # A calibration's measured step of median time (its own matmul_ms with it): a minimum would depend on
    # how many steps a run has.
    steps = sorted((r for r in records(path) if r.get("type") == "step" and r.get("step", 0) > 0),
                   key=lambda r: r["step_ms"])
    return steps[(len(steps) - 1) // 2]


def mean_step(path):
    """A round's measured steps (step 0, the warm-up, left out), their mean: step_ms and matmul_ms. The
    mean, not the median, is what the round's share predicts: the share is the ranks' time run over
    their time wanted, summed over the steps, and each step wants its work over its own share, so the
    share over the steps prices the mean step (docs/theory.md, section 20); the median step is the
    one step that ran at its own share."""
    steps = [r for r in records(path) if r.get("type") == "step" and r.get("step", 0) > 0]
    return {key: mean([r[key] for r in steps]) for key in ("step_ms", "matmul_ms")}


def predict(plan, model, ranks, gbps, latency, flags, peak, elementwise, sync_us=0.0):
    cmd = [plan, "--one", "--model", model, "--cluster", "emulated", "--gpus", str(ranks), "--batch", "8",
           "--inter-gbps", gbps, "--inter-latency-us", latency, "--efficiency", "1", "--peak-flops", repr(peak),
           "--elementwise-rate", repr(elementwise), "--sync-us", repr(sync_us)]
    cmd += flags.split()
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l[len("plan-json "):]) for l in text.splitlines() if l.startswith("plan-json ")]


# What each kind of calibration ran, as the planner is told it: model and flags.
CALIBRATIONS = {"01": (None, ""), "10": (None, "--attention ring"), "11": ("moe-small", "--ep 1")}


def share_record(path):
    """scripts/plan/cpu_share.py's record of a run: the share of a core its ranks got while they wanted
    one, per step (step_share; step_ran_ms and step_waited_ms, the ranks' main threads summed)."""
    for line in open(path):
        if line.startswith("share-json "):
            record = json.loads(line[len("share-json "):])
            if record["share"] is None:
                sys.exit("plan_check: %s: scripts/plan/cpu_share.py found no rank of the run to measure (are the ranks "
                         "the leaves of mpiexec's process tree?)" % path)
            return record
    sys.exit("plan_check: %s has no share-json line" % path)


def run_share(r):
    """The share of a core a run's ranks got while they wanted one during its measured steps (step 0,
    the warm-up, left out), from its share_record: the time they ran over the time they ran or waited
    for a core."""
    ran, waited = sum(r["step_ran_ms"][1:]), sum(r["step_waited_ms"][1:])
    return ran / (ran + waited) if ran + waited > 0 else 1.0


# A class of rows whose products took less than this fraction of a calibration's time in the products is
# too little to time: its products take the nearest class's rate (planner_cpu_rates.h).
MIN_CLASS_SHARE = 0.05


def product_classes(path, step_share):
    """A calibration's products by class of rows (the step records' matmul_ms_rows<N> and
    matmul_flops_rows<N>, ops.h: rows in [N, 2N)), over its measured steps, each step's time brought to
    a core of its own: {N: (FLOPs, ms)}."""
    classes = {}
    for r in records(path):
        if r.get("type") != "step" or not 0 < r.get("step", 0) < len(step_share) or step_share[r["step"]] is None:
            continue
        for key, value in r.items():
            if key.startswith("matmul_flops_rows"):
                rows = int(key[len("matmul_flops_rows"):])
                flops, ms = classes.get(rows, (0.0, 0.0))
                classes[rows] = (flops + value, ms + r["matmul_ms_rows%d" % rows] * step_share[r["step"]])
    return classes


def class_rates(classes, products_rate):
    """The products' rate of each class of rows, on a core of its own: the calibration's rate over all its
    products (products_rate) times how much faster a FLOP the class ran than all of them together,
    both from the same steps' records; only the classes that held MIN_CLASS_SHARE of the time. With one
    class, its rate is products_rate."""
    flops = sum(f for f, _ in classes.values())
    ms = sum(t for _, t in classes.values())
    if flops <= 0 or ms <= 0:
        return {}
    return {rows: products_rate * (f / t) / (flops / ms) for rows, (f, t) in classes.items()
            if t >= MIN_CLASS_SHARE * ms and f > 0}


def attention_rate(path):
    """Chapter 10's blockwise attention kernel's FLOP/s on a core of its own, from the ring record of a
    calibration at --cp 1 (rank 0's attention FLOPs, 4 hs a pair and head forward and 10 backward, over
    the CPU time its thread spent in the kernel: CPU time is time on a core). None without one."""
    for r in records(path):
        if r.get("type") == "ring" and r.get("rank0_compute_cpu_ms", 0) > 0 and r.get("rank0_flops", 0) > 0:
            return r["rank0_flops"] / (r["rank0_compute_cpu_ms"] / 1e3)
    return None


def rates(out, plan, preset, index, kind):
    """The two rates of calibration `index`: the planner's own prediction of the 2-rank run with one rate
    at 1 a second and the other free gives its matrix-product FLOPs and its activation bytes; the
    measured steps, each split into its time in the matrix products and the rest, give the rates. Each
    step's two times are first brought to a core of its own (times the share of a core its ranks got
    while they wanted one during that step, cpu_share.py), then the mean of each is taken (a row is set
    against its mean step, mean_step): the rates of one rank on a core of its own, what a row's share
    scales back down. Also the rates as measured (the median step as it ran), for the comparison, and
    the calibration's share."""
    path = "%s/calibration%d.jsonl" % (out, index)
    cal = median_step(path)
    share = share_record("%s/calibration%d.share" % (out, index))
    own_core_products, own_core_rest = [], []
    for r in records(path):
        if r.get("type") == "step" and r.get("step", 0) > 0 and r["step"] < len(share["step_share"]):
            s = share["step_share"][r["step"]]
            if s is not None:
                own_core_products.append(r["matmul_ms"] * s)
                own_core_rest.append((r["step_ms"] - r["matmul_ms"]) * s)
    model, flags = CALIBRATIONS[kind]
    model = model or preset
    flops = predict(plan, model, 2, "0", "0", flags, 1.0, 1e30)[0]["compute_s"]
    act_bytes = predict(plan, model, 2, "0", "0", flags, 1e30, 1.0)[0]["compute_s"]
    measured = (flops / (cal["matmul_ms"] / 1e3), act_bytes / ((cal["step_ms"] - cal["matmul_ms"]) / 1e3))
    own_core = (flops / (mean(own_core_products) / 1e3), act_bytes / (mean(own_core_rest) / 1e3))
    by_rows = class_rates(product_classes(path, share["step_share"]), own_core[0])
    return (own_core, measured, cal["step_ms"], run_share(share), by_rows,
            attention_rate(path))


def expert_load(out, index, flags):
    """Chapter 11's rows: the rows the slowest EP rank's experts run over the balanced share (the
    planner's --expert-load), from the routing calibration `index` (11 at --ep 1, the same model, seed
    and data) measured: per layer and expert the rows its router chose in a step (its routing records,
    step 0 left out), each expert capped at the row's capacity (f x the layer's rows / E), rank r of
    ep holding experts [r E/ep, (r+1) E/ep); per layer the rank with the most, summed over layers, over
    the layers' rows / ep. None when the calibration has no routing records."""
    words = flags.split()
    ep = int(words[words.index("--ep") + 1]) if "--ep" in words else 1
    factor = float(words[words.index("--capacity-factor") + 1]) if "--capacity-factor" in words else 0.0
    steps = [r for r in records("%s/calibration%d.jsonl" % (out, index)) if "routed_L0_E0" in r][1:]
    if not steps:
        return None
    E = sum(1 for k in steps[0] if k.startswith("routed_L0_E"))
    L = sum(1 for k in steps[0] if k.startswith("routed_L") and k.endswith("_E0"))
    slowest = balanced = 0.0
    for r in steps:
        for layer in range(L):
            counts = [r["routed_L%d_E%d" % (layer, e)] for e in range(E)]
            cap = factor * sum(counts) / E if factor > 0 else float("inf")
            ran = [min(c, cap) for c in counts]
            slowest += max(sum(ran[q * E // ep:(q + 1) * E // ep]) for q in range(ep))
            balanced += sum(counts) / ep
    return slowest / balanced


def sync_cost(out, index):
    """What one synchronization between the 2 ranks cost beside calibration `index` (build/sync_probe's
    mean over its blocking all-reduces, microseconds), and its median."""
    for line in open("%s/calibration%d.sync" % (out, index)):
        if line.startswith("sync-json "):
            probe = json.loads(line[len("sync-json "):])
            return probe["mean_us"], probe["median_us"]
    sys.exit("plan_check: %s/calibration%d.sync has no sync-json line" % (out, index))


# How far apart the calibrations around a row may lie, on a core of their own (AGREE=0.3: 30%).
AGREE = float(os.environ.get("AGREE", "0.30"))


def own_core_step_ms(out, index):
    """Calibration `index`'s median step brought to a core of its own (each step's time times the share
    of a core its ranks got during it)."""
    share = share_record("%s/calibration%d.share" % (out, index))["step_share"]
    steps = sorted(r["step_ms"] * share[r["step"]] for r in records("%s/calibration%d.jsonl" % (out, index))
                   if r.get("type") == "step" and 0 < r["step"] < len(share) and share[r["step"]] is not None)
    return steps[(len(steps) - 1) // 2]


def calibrations_agree(out, first, last):
    """Whether calibrations first..last (those around a row and between its rounds), each on a core of its
    own, lie within AGREE of each other: the slowest at most 1 + AGREE times the fastest."""
    times = [own_core_step_ms(out, i) for i in range(first, last + 1)]
    return max(times) <= (1 + AGREE) * min(times)


def mean(values):
    return sum(values) / len(values)


def row_error(rounds):
    """A timed row's step against its prediction over its rounds (predict_round's): the mean of the
    settled rounds' mean steps and the mean of their predictions (every round's, when none settled),
    so that each round weighs as the time it ran. Returns (error, measured ms, predicted ms, the rounds
    used)."""
    used = [d for d in rounds if d["settled"]] or rounds
    meas_ms, pred_ms = mean([d["meas_ms"] for d in used]), mean([d["pred_ms"] for d in used])
    return (pred_ms - meas_ms) / meas_ms, meas_ms, pred_ms, used


# What an untimed row is predicted with when no calibration ran (only untimed rows chosen): its memory,
# all it is checked on, does not depend on the rates.
NO_CALIBRATION = (1e10, 0.6e9, 0.0, "", "", 0.0, 0.0, (1e10, 0.6e9), 1.0, {}, None)


def predict_round(out, plan, cals, name, k, first, model, ranks, chapter, gbps, latency, flags):
    """Round k of a timed row against the calibrations on its two sides (first, first + 1): their mean rates
    on a core of their own times the share of a core the round's ranks got during its steps, their mean
    sync cost, routing and rates by rows. Returns the round's measured mean step, its prediction, its
    error, and the same round predicted as the check did before the rates by rows ("before") and before
    the share ("unshared"); settled: the two calibrations agree (AGREE)."""
    around = [cals[i] for i in (first, first + 1) if i in cals]
    share = run_share(share_record("%s/%s.round%d.share" % (out, name, k)))
    peak, elementwise = mean([c[0] for c in around]) * share, mean([c[1] for c in around]) * share
    measured_peak, measured_elementwise = mean([c[7][0] for c in around]), mean([c[7][1] for c in around])
    sync_us = mean([c[5] for c in around])
    if chapter.startswith("11"):  # the routing's load, from the calibrations around the round
        loads = [x for x in (expert_load(out, i, flags) for i in (first, first + 1) if i in cals) if x is not None]
        if loads:
            flags += " --expert-load %r" % mean(loads)
    # The products' rates by class of rows and the attention kernel's (the calibrations' mean on a core of
    # their own, times the round's share), what the planner prices each product and the ring's overlap at.
    by_rows = {}
    for c in around:
        for rows, rate in c[9].items():
            by_rows.setdefault(rows, []).append(rate)
    attention = [c[10] for c in around if c[10]]
    new_flags = flags
    if by_rows:
        new_flags += " --product-rates " + ",".join("%d:%r" % (rows, mean(rs) * share) for rows, rs in sorted(by_rows.items()))
    if attention and "--cp" in flags.split():
        new_flags += " --attention-rate %r" % (mean(attention) * share)
    p = predict(plan, model, int(ranks), gbps, latency, new_flags, peak, elementwise, sync_us)[0]  # stage 0: world rank 0's
    step = mean_step("%s/%s.round%d.jsonl" % (out, name, k))
    meas_ms, pred_ms = step["step_ms"], p["step_s"] * 1e3
    before = predict(plan, model, int(ranks), gbps, latency, flags, peak, elementwise, sync_us)[0]
    unshared_ms = predict(plan, model, int(ranks), gbps, latency, flags, measured_peak, measured_elementwise,
                          sync_us)[0]["step_s"] * 1e3
    # The round's own matrix products (its matmul_ms) against their FLOPs at the calibrated rates: where the
    # two part as far as the step does, the miss is the compute's, not the synchronizations'.
    flops = predict(plan, model, int(ranks), "0", "0", flags, 1.0, 1e30)[0]["compute_s"]
    product_ms = predict(plan, model, int(ranks), "0", "0", new_flags, peak, 1e30)[0]["compute_s"] * 1e3
    return {"p": p, "before": before, "meas_ms": meas_ms, "pred_ms": pred_ms, "err": (pred_ms - meas_ms) / meas_ms,
            "before_ms": before["step_s"] * 1e3, "unshared_ms": unshared_ms,
            "share": share, "sync_us": sync_us, "products_ms": step["matmul_ms"], "product_ms": product_ms,
            "one_rate_product_ms": flops / peak * 1e3,
            "settled": len(around) < 2 or calibrations_agree(out, first, first + 1)}


def calibrations(out, plan, preset, lines, wanted=None):
    """The calibrations listed in rows.tsv (those in `wanted`, or all): index -> their rates, sync cost and
    share (the tuple predict_round reads)."""
    cals = {}
    for f in lines:
        if f[0] == "calibration" and (wanted is None or int(f[1]) in wanted):
            index = int(f[1])
            own_core, measured, ms, share, by_rows, attention = rates(out, plan, preset, index, f[3])
            sync_us, sync_median_us = sync_cost(out, index)
            cals[index] = (own_core[0], own_core[1], ms, f[2], f[3], sync_us, sync_median_us, measured, share, by_rows,
                           attention)
    return cals


# A timed row's verdict is in doubt while its error lies within DOUBT standard errors of the 20% bound: it
# runs more rounds then, up to MAX_ROUNDS (plan_check.sh), after its ROUNDS.
DOUBT = 2.0
BASE_ROUNDS = int(os.environ.get("ROUNDS", "3"))


def in_doubt(done):
    """Whether a timed row's rounds (predict_round's) leave its verdict in doubt: its error within DOUBT
    standard errors of 20%, the standard error being the spread of the used rounds' errors over the square
    root of their number (a row with one used round is in doubt)."""
    err, _, _, used = row_error(done)
    if len(used) < 2:
        return True
    errs = [d["err"] for d in used]
    spread = (sum((e - mean(errs)) ** 2 for e in errs) / (len(errs) - 1)) ** 0.5
    return abs(abs(err) - 0.20) < DOUBT * spread / len(errs) ** 0.5


def more(out, preset, plan, name, ranks, chapter, gbps, latency, model, first, rounds, flags):
    """plan_check.sh, after a timed row's rounds: exit 0 when another round is wanted (in_doubt)."""
    first, rounds = int(first), int(rounds)
    lines = [l.rstrip("\n").split("\t") for l in open(out + "/rows.tsv")]
    cals = calibrations(out, plan, preset, lines, range(first, first + rounds + 1))
    done = [predict_round(out, plan, cals, name, k, first + k - 1, model, ranks, chapter, gbps, latency, flags)
            for k in range(1, rounds + 1)]
    return 0 if in_doubt(done) else 1


def main(out, preset, plan):
    lines = [l.rstrip("\n").split("\t") for l in open(out + "/rows.tsv")]
    cals = calibrations(out, plan, preset, lines)
    names = {"01": "01_vanilla_dp", "10": "10 --cp 1", "11": "11 --ep 1, moe-small"}
    print("calibrations (2 ranks, no link, --preset %s --batch 8 unless said), in the order they ran:" % preset)
    for index in sorted(cals):
        peak, elementwise, ms, load, kind, sync_us, sync_median_us, measured, share, by_rows, attention = cals[index]
        print("  #%-2d %-21s %6.1f ms a step (median) -> %6.2f GFLOP/s in the products, %6.3f GB/s of activations; "
              "at a share of %.2f core: %6.2f GFLOP/s and %6.3f GB/s on a core of its own "
              "(products by rows: %s%s); sync cost measured now: %7.1f us (median %6.1f); load %s"
              % (index, names[kind], ms, measured[0] / 1e9, measured[1] / 1e9, share, peak / 1e9, elementwise / 1e9,
                 ", ".join("%d: %.2f" % (rows, rate / 1e9) for rows, rate in sorted(by_rows.items())),
                 "; attention %.2f GFLOP/s" % (attention / 1e9) if attention else "", sync_us, sync_median_us, load))
    print("(each round of a timed row is predicted with the mean rates on a core of their own and the mean sync cost "
          "of the calibrations just before and after it, the rates times the share of a core the round's ranks got while "
          "they wanted one during its steps; the sync cost, --sync-us, once for each blocking collective and message; "
          "the row's error: the mean of its settled rounds' predictions against the mean of their mean steps)\n")
    cats = [("params", "params_bytes", "measured_params_bytes"), ("grads", "grads_bytes", "measured_grads_bytes"),
            ("optim", "optim_bytes", "measured_optim_bytes"), ("activ", "activations_bytes", "measured_activations_bytes")]
    head = "%-20s %5s %-19s %-10s" % ("run", "ranks", "chapter", "link")
    head += "".join(" %19s" % ("%s meas/plan" % c[0]) for c in cats)
    head += " %17s | %-9s | %s" % ("buffers meas<=plan", "load", "step ms meas / plan (error), cal #")
    print(head)
    memory_ok = time_ok = memory_rows = time_rows = unshared_ok = unsettled = before_ok = rounds_ok = rounds_run = 0
    first_ok = more_rows = 0
    for f in lines:
        if f[0] == "calibration":
            continue
        if f[1] != "ran":
            print("%-20s %s: %s" % (f[0], f[1], f[2]))
            continue
        name, _, ranks, chapter, gbps, latency, timed, flags, model, cal, load_before, load_after = f[:12]
        rounds = int(f[12]) if len(f) > 12 else 1  # a timed row's rounds, each followed by a calibration
        tries, settled = (int(f[13]), f[14] == "1") if len(f) > 14 else (1, True)
        theory = [r for r in records("%s/%s.jsonl" % (out, name)) if r.get("type") == "theory"]
        if not theory:
            print("%-20s no theory record" % name)
            continue
        t = theory[0]
        if timed == "1":
            # Each round against the calibrations on its two sides; the row's error over its settled rounds.
            done = [predict_round(out, plan, cals, name, k, int(cal) + k - 1, model, ranks, chapter, gbps, latency,
                                  flags) for k in range(1, rounds + 1)]
            err, meas_ms, pred_ms, used = row_error(done)
            middle = min(used, key=lambda d: abs(d["err"] - err))  # the round nearest the row, for the details
            p = middle["p"]
        else:
            around = [cals[int(cal)]] if int(cal) in cals else [NO_CALIBRATION]
            p = predict(plan, model, int(ranks), gbps, latency, flags, around[0][0], around[0][1], around[0][5])[0]
        routed = model.startswith("moe")  # 11, 12: the activations are the routing's, the plan their bound
        cells, exact = [], True
        for cat, pk, mk in cats:
            meas, pred = t[mk], p[pk]
            bound = routed and cat == "activ"
            good = meas <= pred + 1 if bound else abs(meas - pred) < 1
            exact = exact and good
            cells.append("%9.0f%s%-9.0f" % (meas / 1e3, "<" if bound else "/", pred / 1e3) + ("" if good else "!"))
        buf_ok = t["measured_transient_bytes"] <= p["transient_bytes"] + 1
        # Ulysses' all-to-alls (10, 12): the bytes rank 0 sent in a step, measured against predicted.
        bytes_note = ""
        if "measured_ulysses_bytes" in t:
            sent, planned = t["measured_ulysses_bytes"], p.get("ulysses_bytes", 0)
            bytes_ok = abs(sent - planned) < 1
            exact = exact and bytes_ok
            bytes_note = " | Ulysses bytes %.0f/%.0f kB%s" % (sent / 1e3, planned / 1e3, "" if bytes_ok else "!")
        memory_rows += 1
        memory_ok += exact and buf_ok
        row = "%-20s %5s %-19s %-10s" % (name, ranks, chapter, "%sG/%sus" % (gbps, latency))
        row += "".join(" %19s" % c for c in cells)
        row += " %8.0f<=%-8.0f | %4s-%-4s" % (t["measured_transient_bytes"] / 1e3, p["transient_bytes"] / 1e3,
                                            load_before, load_after)
        row += bytes_note
        if timed == "1":
            time_rows += 1
            time_ok += abs(err) <= 0.20
            first_ok += abs(row_error(done[:BASE_ROUNDS])[0]) <= 0.20
            more_rows += len(done) > BASE_ROUNDS
            rounds_run += len(done)
            rounds_ok += sum(abs(d["err"]) <= 0.20 for d in done)
            before_err = mean([d["before_ms"] for d in used]) / meas_ms - 1
            before_ok += abs(before_err) <= 0.20
            unshared_err = mean([d["unshared_ms"] for d in used]) / meas_ms - 1
            unshared_ok += abs(unshared_err) <= 0.20
            unsettled += not settled
            before = middle["before"]
            row += (" | %7.1f / %7.1f (%+5.1f%%) before: %+5.1f%% share %.2f (without: %+5.1f%%) #%s-#%d compute %.1f TP %.1f "
                    "CP %.1f (before %.1f) PP %.1f DP %.1f EP %.1f bubble %.1f"
                    " | sync %.0f us: +%.1f | products %.0f / %.0f (before %.0f)" % (
                        meas_ms, pred_ms, 100 * err,
                        100 * before_err, middle["share"], 100 * unshared_err, cal, int(cal) + rounds,
                        p["compute_s"] * 1e3, p["tp_s"] * 1e3, p.get("cp_s", 0) * 1e3, before.get("cp_s", 0) * 1e3,
                        p["pp_s"] * 1e3, p["dp_s"] * 1e3, p.get("ep_s", 0) * 1e3, p["bubble_s"] * 1e3,
                        middle["sync_us"], p.get("sync_s", 0) * 1e3, middle["products_ms"], middle["product_ms"],
                        middle["one_rate_product_ms"]))
            if rounds > 1:
                row += " | rounds %s" % " ".join("%+.1f%%%s" % (100 * d["err"], "" if d["settled"] else "~")
                                                  for d in done)
            if tries > 1:
                row += " | %d tries%s" % (tries, "" if settled else ": the load changed during every try")
        print(row)
    print("(memory in kB, rank 0, by category: measured/planned, '!' where they differ; '<': a mixture of experts' activations "
          "(11, 12), set by the routing, against the planner's bound; buffers: the measured peak of the communication buffers "
          "and the planner's bound; load: the 1-minute load average at the row's start and end)")
    print("(Ulysses bytes: what rank 0's all-to-alls sent in a step, measured/planned, exact)")
    print("(sync: the mean cost of one synchronization measured beside the calibrations around the row, and what it "
          "adds to the step; products: ms in the matrix products, the row's own mean step / their FLOPs at the "
          "calibrated rate)")
    print("(share: the share of a core the row's ranks got while they wanted one during its steps, which scales the "
          "calibrations' rates on a core of its own; without: the error of the prediction from the calibrations' rates "
          "as they ran, with no share)")
    print("(rounds: each round's error, '~' where the calibrations on its two sides, each on a core of its own, lie "
          "more than %d%% apart: the machine changed under it as the share does not follow, and the row leaves it "
          "out; tries: a row none of whose rounds settled runs again, between the last calibration and a new one, "
          "TRIES in all, then it is marked)" % round(AGREE * 100))
    print("(before: the prediction with one rate for every product and the ring's attention at it, as the check was "
          "before the rates by rows and the attention's rate; CP: the ring's exposed time, now and before)")
    print("memory exact (and within the bounds) in %d of %d runs; step time within 20%% in %d of %d timed runs "
          "at 2 ranks (%d before, with one products' rate; %d without the share; %d with the first %d rounds alone, %d "
          "rows having run more; %d of %d rounds alone); the load changed during every try of %d of them" % (
              memory_ok, memory_rows, time_ok, time_rows, before_ok, unshared_ok, first_ok, BASE_ROUNDS, more_rows,
              rounds_ok, rounds_run, unsettled))
    return 0 if memory_ok == memory_rows else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--agree":  # plan_check.sh, after a row: exit 0 when a round settled
        first, last = int(sys.argv[3]), int(sys.argv[4])
        sys.exit(0 if any(calibrations_agree(sys.argv[2], i, i + 1) for i in range(first, last)) else 1)
    if len(sys.argv) == 14 and sys.argv[1] == "--more":  # plan_check.sh, after a timed row's rounds
        sys.exit(more(*sys.argv[2:]))
    if len(sys.argv) != 4:
        sys.exit("usage: plan_check.py OUT PRESET PLAN")
    sys.exit(main(*sys.argv[1:4]))
