#!/usr/bin/env python3
"""Replays candidate rules of the NaN and spike guard (trainer/run/guard.c) over the loss and
gradient-norm series bench/guard_stats.sh recorded with the guard off. For each healthy run:
each rule's largest statistic after the guard's warm-up and its margin (threshold / largest);
for each divergent run: the first step each rule skips and what the run did there. A run is
divergent when its name starts with dv_ or its .env names a fault. Figures, not pass/fail.
usage: bench/guard_rules.py OUTDIR [--warmup N] [--window N]"""
import argparse
import glob
import json
import math
import os
import re
import statistics as st

SIGMA_FLOOR = 0.01  # the z-scores' deviation is at least this share of the centre


def mean_sd(ring):
    m = sum(ring) / len(ring)
    return m, math.sqrt(sum((v - m) ** 2 for v in ring) / len(ring))


def med_mad(ring):
    m = st.median(ring)
    return m, 1.4826 * st.median(abs(v - m) for v in ring)  # MAD scaled to a normal's sd


def z_mean(ring, v):  # the old rule's z-score
    m, sd = mean_sd(ring)
    return (v - m) / max(sd, SIGMA_FLOOR * abs(m))


def z_med(ring, v):  # robust: median and MAD
    m, sd = med_mad(ring)
    return (v - m) / max(sd, SIGMA_FLOOR * abs(m))


def ratio_med(ring, v):
    return v / st.median(ring)


# a rule: name -> (statistics of a step given the rings: {name: (value, threshold)})
RULES = {
    "old: z(loss)>6 | z(norm)>6 (mean, sd)": lambda L, N, l, n: {
        "z_loss": (z_mean(L, l), 6), "z_norm": (z_mean(N, n), 6)},
    "robust z(loss)>6 | z(norm)>6 (median, MAD)": lambda L, N, l, n: {
        "z_loss": (z_med(L, l), 6), "z_norm": (z_med(N, n), 6)},
    "loss>1.1x median | norm>10x median": lambda L, N, l, n: {
        "loss_ratio": (ratio_med(L, l), 1.1), "norm_ratio": (ratio_med(N, n), 10)},
    "robust z(loss)>6 | norm>10x median": lambda L, N, l, n: {
        "z_loss": (z_med(L, l), 6), "norm_ratio": (ratio_med(N, n), 10)},
    "chosen (the defaults): robust z(loss)>8 | norm>20x median": lambda L, N, l, n: {
        "z_loss": (z_med(L, l), 8), "norm_ratio": (ratio_med(N, n), 20)},
}


def load(d):
    steps = []
    for line in open(os.path.join(d, "metrics.jsonl")):
        m = json.loads(line)
        l, n = m["loss"], m["grad_norm"]
        steps.append((m["step"], float("nan") if l is None else l,
                      float("nan") if n is None else n))
    return steps


def replay(steps, rule, window, warmup):
    """Per judged step: the statistics; and the steps skipped [(step, why)] (by the rule or
    not finite). The ring holds the accepted steps only, as in the guard."""
    L, N, stats, skipped = [], [], [], []
    for s, l, n in steps:
        if not (math.isfinite(l) and math.isfinite(n)):
            skipped.append((s, "nan"))
            continue
        skip = False
        if s > warmup and len(L) >= max(window // 2, 2):
            v = rule(L, N, l, n)
            stats.append((s, v))
            hit = [k for k, (x, t) in v.items() if x > t]
            if hit:
                skipped.append((s, "+".join(hit)))
                skip = True
        if not skip:
            L.append(l), N.append(n)
            del L[:-window], N[:-window]
    return stats, skipped


def stopped(d):
    """The step at which a run with the guard off stopped on a non-finite loss or norm."""
    log = d + ".log"
    if not os.path.exists(log):
        return None
    m = re.search(r": step (\d+): loss is \S+ and gradient norm \S+: training diverged",
                  open(log).read())
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--window", type=int, default=50)
    a = ap.parse_args()
    runs = sorted(d for d in glob.glob(os.path.join(a.out, "*")) if
                  os.path.isfile(os.path.join(d, "metrics.jsonl")))
    env = {d: (open(d + ".env").read().strip() if os.path.exists(d + ".env") else "")
           for d in runs}
    div = [d for d in runs if os.path.basename(d).startswith("dv_") or "FAULT" in env[d]]
    healthy = [d for d in runs if d not in div]
    print(f"window {a.window}, judged from step {a.warmup + 1}")
    for name, rule in RULES.items():
        print(f"\n## {name}")
        print("| run | steps | largest statistic (step) | threshold | margin |")
        print("|---|---|---|---|---|")
        worst = {}
        for d in healthy:
            steps = load(d)
            stats, skipped = replay(steps, rule, a.window, a.warmup)
            first = skipped[0] if skipped else None
            cells, thr, mg = [], [], []
            for k in (stats[0][1] if stats else {}):
                s, (x, t) = max(((s, v[k]) for s, v in stats), key=lambda p: p[1][0])
                cells.append(f"{k} {x:.3g} (step {s})")
                thr.append(f"{k} {t}")
                mg.append(f"{t / x:.2f}x" if x > 0 else "-")
                worst[k] = max(worst.get(k, (-1e9, t, "")), (x, t, os.path.basename(d)))
            thr, mg = ", ".join(thr), ", ".join(mg)
            flag = f" **skips step {first[0]} ({first[1]})**" if first else ""
            print(f"| {os.path.basename(d)} | {len(steps)} | {'; '.join(cells)}{flag} | {thr} | {mg} |")
        for k, (x, t, d) in worst.items():
            print(f"worst healthy {k}: {x:.3g} in {d}, threshold {t}: margin {t / x:.2f}x")
        print("\n| divergent run | faults | steps skipped (by) | loss, norm at the first "
              "| median loss, norm before it |")
        print("|---|---|---|---|---|")
        for d in div:
            steps = load(d)
            _, skipped = replay(steps, rule, a.window, a.warmup)
            nan = stopped(d)
            if nan:
                skipped.append((nan, "not finite"))
            where = "- | -"
            if skipped and skipped[0][0] <= len(steps):
                i = [s for s, _, _ in steps].index(skipped[0][0])
                prev = steps[max(0, i - a.window):i]
                where = (f"{steps[i][1]:.4g}, {steps[i][2]:.4g} | "
                         f"{st.median(p[1] for p in prev):.4g}, {st.median(p[2] for p in prev):.4g}")
            sk = ", ".join("%d (%s)" % k for k in skipped[:6]) + (" ..." if len(skipped) > 6 else "")
            print(f"| {os.path.basename(d)} | {env[d] or '-'} | {sk or '**none**'} | {where} |")


if __name__ == "__main__":
    main()
