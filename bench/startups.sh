#!/usr/bin/env bash
# How far one start-up's probes move the planner's price: `trainer run` of a recipe, n times
# back to back, each from scratch (TR_PLAN_MEMORY=off), each run's own predicted step (what
# `plan vs run` shows a user) beside the step it then measured, and the largest micro-batch its
# model probe timed (trainer/run/plan.c: probe_model; the sizes stop once one would take over
# 0.1 s at the sgemm rate the same start-up measured, so a smaller one says that start-up
# found the machine slow from its first probe on), and the second look's rate over the first at
# that size (probe: look_again; above 1, the second look set the level).
#
# Printed: one row per start-up (predicted, measured, their ratio, the probe's largest
# micro-batch, the second look over the first, the probes' noise that the tie follows), then
# the medians and ranges of the predicted and the measured steps, and the start-ups priced more
# than 25% off their own measured step. The measured step is the reference: each run's median step (trainer's own
# `plan vs run`), on the same machine a few seconds later.
#
# Usage: [TRAINER=binary] bench/startups.sh [n] [ranks] [recipe] [steps]
#   (defaults 12 1 recipes/shakespeare_char.lua 20: about 15 s a start-up on 2 cores; ranks
#    above 1 run under mpirun --oversubscribe)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
n="${1:-12}"
ranks="${2:-1}"
recipe="${3:-recipes/shakespeare_char.lua}"
steps="${4:-20}"
T=$(realpath "${TRAINER:-build/trainer}")
[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || { echo "bench: n '$n': 2 start-ups or more"; exit 2; }
[[ $ranks =~ ^[0-9]+$ ]] && [ "$ranks" -ge 1 ] || { echo "bench: ranks '$ranks': 1 or more"; exit 2; }
[[ $steps =~ ^[0-9]+$ ]] && [ "$steps" -ge 5 ] || { echo "bench: steps '$steps': 5 or more"; exit 2; }
[ -f "$recipe" ] || { echo "bench: recipe '$recipe': no such file"; exit 2; }
[ -x "$T" ] || { echo "bench: trainer '$T': not an executable (build it, or set TRAINER)"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TR_PLAN_MEMORY=off OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_rmaps_base_oversubscribe=1
launch=()
[ "$ranks" -gt 1 ] && launch=(mpirun -np "$ranks" -x OMP_NUM_THREADS=1)

echo "start-ups of $recipe on $ranks rank(s), $steps steps each, $(date -u +%Y-%m-%dT%H:%MZ)"
for i in $(seq 1 "$n"); do
    "${launch[@]}" "$T" run "$recipe" --steps "$steps" --eval-every 0 --out "$tmp/run" --overwrite \
        </dev/null >"$tmp/run.log" 2>&1 || { echo "bench: start-up $i failed:"; tail -3 "$tmp/run.log"; exit 1; }
    python3 - "$tmp/run/plan.json" "$tmp/run.log" >>"$tmp/rows" <<'PY' || exit 1
import json, re, sys
d = json.load(open(sys.argv[1]))
m = re.search(r"plan vs run: step ([0-9.e+-]+) s predicted, ([0-9.e+-]+) s measured",
              open(sys.argv[2], errors="replace").read())
if not m:
    sys.exit("bench: no 'plan vs run' line in the run's output")
eff = d.get("model_eff") or {}
print(json.dumps({"pred": float(m.group(1)), "meas": float(m.group(2)),
                  "probe": max((int(k) for k in eff), default=0),
                  "look": d.get("model_look", 0),
                  "noise": d.get("tie", {}).get("noise", 0)}))
PY
done
python3 - "$tmp/rows" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%-9s %10s %10s %10s %8s %7s %7s" % ("start-up", "predicted", "measured", "pred/meas",
                                            "probe mb", "look 2", "noise"))
for i, r in enumerate(rows, 1):
    print("%-9d %9.4fs %9.4fs %10.2f %8d %6.2fx %6.1f%%" % (i, r["pred"], r["meas"],
          r["pred"] / r["meas"], r["probe"], r["look"], 100 * r["noise"]))
def span(k):
    v = [r[k] for r in rows]
    return "median %.4f s, %.4f-%.4f s (largest / smallest %.2fx)" % (st.median(v), min(v), max(v),
                                                                     max(v) / min(v))
print("predicted: " + span("pred"))
print("measured:  " + span("meas"))
ratio = [r["pred"] / r["meas"] for r in rows]
off = [i + 1 for i, x in enumerate(ratio) if abs(x - 1) > 0.25]
top = max(r["probe"] for r in rows)
small = [i + 1 for i, r in enumerate(rows) if r["probe"] < top]
print("predicted / measured: median %.2f, %.2f-%.2f; beyond 25%%: %d of %d (start-ups %s)"
      % (st.median(ratio), min(ratio), max(ratio), len(off), len(rows),
         ", ".join(map(str, off)) or "none"))
print("model probe stopped below micro-batch %d: start-ups %s" % (top, ", ".join(map(str, small)) or "none"))
looks = [r["look"] for r in rows if r["look"] > 0]
if looks:
    print("second look over the first: median %.2fx, %.2f-%.2fx; faster by over 10%%: start-ups %s"
          % (st.median(looks), min(looks), max(looks),
             ", ".join(str(i + 1) for i, r in enumerate(rows) if r["look"] > 1.1) or "none"))
PY
