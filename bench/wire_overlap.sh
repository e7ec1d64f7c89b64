#!/usr/bin/env bash
# How much of the data-parallel communication between hosts hides behind compute on the CPU
# backend, measured, against what the planner prices. On a cluster in a box
# (tests/cluster/cluster.sh) of 2 hosts x 1 rank, each host on a core of its own, links
# shaped to each RATE: bench/pp_gpt.lua at dp 2 in one micro-batch of 32 sequences a rank
# (batch_tokens 4096), so that what may hide is large beside the runs' noise: a backward of
# about 0.5 s here beside the gradient's 12.8 MB each way between the hosts (about 1 s at
# 100 Mbit/s), the refresh's as much behind a forward of 0.25 s; at ZeRO-0, 1 and 2, each run
# as the trainer runs it, again with nothing beside the compute (TR_DP_SYNC_REDUCE=1: each
# gradient bucket's reduction completes as it starts; TR_DP_SYNC_REFRESH=1: ZeRO-1/2's
# refresh right after the update) and, at ZeRO-1 and 2, with the refresh alone blocking; in
# turn, `reps` times each. A run's figure is its median step after two of warm-up. What hid,
# measured: the reductions', the all-blocking runs' median less the refresh-blocking ones'
# (at ZeRO-0 less the overlapped ones'); the refresh's, the refresh-blocking runs' less the
# overlapped ones'. What hid, priced: the plan's data-parallel communication less its
# exposed part (plan.json's dp_comm_s - dp_s, the median over the overlapped runs' own plans:
# each run probes the links at its start; the reductions' alone, as the refresh is priced
# exposed). Prints them, the ratio of what the reductions hid to that price, the compute a
# step and the measured against the predicted step. Figures, not pass/fail: the machine's
# other load moves them.
#
# Usage: bench/wire_overlap.sh [steps] [reps] [rate...]   (defaults 8 3 100mbit 1gbit; root,
#   iproute2, mpirun; about 27 minutes for the defaults, 18 with reps 2)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps="${1:-8}"
reps="${2:-3}"
shift 2 2>/dev/null || shift $#
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(100mbit 1gbit)
. bench/box_lib.sh
box_args "$steps" "$reps"
box_machine 2 mpirun ip python3
CL=$PWD/tests/cluster/cluster.sh
name=bwo$$
tmp=$(mktemp -d)
cleanup() {
    "$CL" down "$name" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

run() { # rate zero sync pass; sync 0: as the trainer runs, 1: nothing beside, 2: the refresh blocking
    local out="$tmp/$1-z$2-s$3-$4"
    "$CL" run "$name" -- mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
        -x TR_DP_SYNC_REDUCE=$(($3 == 1)) -x TR_DP_SYNC_REFRESH=$(($3 > 0)) \
        "$T" run bench/pp_gpt.lua --set batch_tokens=4096 --dp 2 --tp 1 --pp 1 --zero "$2" --micro-batch 32 \
        --steps "$steps" --out "$out" >"$out.log" 2>&1 ||
        echo "bench: $1 ZeRO-$2 sync $3 pass $4 failed: $(tail -1 "$out.log")"
}

echo "== 2 hosts x 1 rank (a core each), bench/pp_gpt.lua at dp 2, one micro-batch of 32 a rank; $steps steps a run, $reps runs each, the median step after 2"
for rate in "${rates[@]}"; do
    "$CL" up "$name" --hosts 2 --slots 1 --rate "$rate" >"$tmp/up.log" 2>&1 ||
        { echo "bench: cluster.sh up failed: $(tail -2 "$tmp/up.log")"; exit 1; }
    "$CL" cores "$name" "$name-n0" 0 >/dev/null && "$CL" cores "$name" "$name-n1" 1 >/dev/null || exit 1
    for pass in $(seq 1 "$reps"); do
        for zero in 0 1 2; do # in turn, the order reversed from pass to pass
            modes="0 1"; [ $zero -gt 0 ] && modes="0 1 2"
            [ $((pass % 2)) = 0 ] && modes=$(echo $modes | rev)
            for m in $modes; do run "$rate" $zero "$m" "$pass"; done
        done
    done
    "$CL" down "$name" >/dev/null 2>&1
    python3 - "$tmp" "$rate" "$reps" <<'EOF'
import json, os, statistics, sys
tmp, rate, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def runs(zero, sync):
    out = []
    for p in range(1, reps + 1):
        d = "%s/%s-z%d-s%d-%d" % (tmp, rate, zero, sync, p)
        try:
            steps = [json.loads(l) for l in open(d + "/metrics.jsonl")][2:]
            plan = json.load(open(d + "/plan.json"))["plan"]["predicted"]
        except (OSError, ValueError, KeyError):
            continue
        if steps:
            out.append((statistics.median(s["step_s"] for s in steps),
                        statistics.median(max(s["rank_compute_s"]) for s in steps), plan))
    return out
print("-- links at %s" % rate)
print("%-7s %9s %9s %9s %11s %9s %9s %9s %9s %9s" % ("", "overlap", "blocking", "refresh b", "reductions",
      "refresh", "priced", "hid/priced", "compute", "meas/pred"))
med = statistics.median
for zero in (0, 1, 2):
    a, b, c = runs(zero, 0), runs(zero, 1), runs(zero, 2) if zero else []
    if not a or not b or (zero and not c):
        print("ZeRO-%d  (no runs)" % zero)
        continue
    ta, tb = med(r[0] for r in a), med(r[0] for r in b)
    tc = med(r[0] for r in c) if zero else ta
    priced = med(r[2]["dp_comm_s"] - r[2]["dp_s"] for r in a)
    pred, comp = med(r[2]["step_s"] for r in a), med(r[1] for r in a)
    ratio = "%.2f" % ((tb - tc) / priced) if priced > 1e-3 else "-"  # the refresh is priced exposed
    print("ZeRO-%d  %8.3fs %8.3fs %9s %10.3fs %9s %8.3fs %9s %8.3fs %9.2f" % (
        zero, ta, tb, "%.3fs" % tc if zero else "-", tb - tc, "%.3fs" % (tc - ta) if zero else "-",
        priced, ratio, comp, ta / pred))
print("(overlap, blocking, refresh b: median step of the runs as the trainer runs them, with nothing "
      "beside the compute, and with the refresh alone blocking; reductions: what the gradients' "
      "reductions hid (blocking - refresh b); refresh: what the refresh hid (refresh b - overlap); "
      "priced: the plan's dp_comm_s - dp_s (the reductions': the refresh is priced exposed); "
      "hid/priced: reductions / priced; compute: the "
      "slowest rank's compute a step; meas/pred: the overlapped runs' step against their plans')")
EOF
done
