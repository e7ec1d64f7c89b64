#!/usr/bin/env bash
# Hosts of different speed: a pipeline cut by each stage's speed against the even cut (mode pp),
# or data parallelism with each replica's micro-batches by its speed against an even split
# (mode dp: dp 2, micro-batches of 2 sequences, 8 a step; even is dp_shares = { 4, 4 }), on a
# cluster in a box (tests/cluster/cluster.sh) of 2 hosts x 1 rank, one on core 0 alone and one
# on core 1 beside a busy loop pinned there (a noisy neighbour: about half a core). Each run's
# start-up probes see the second host slower, topology makes it a group of its own, and the
# planner cuts bench/pp_gpt.lua's blocks by the two speeds (parallel { pp = 2 }, the rest
# planned); the even cut is the same layout with stages = { 0, E } given, E the cut a uniform
# cluster gets. The two run in turn, `reps` times each; a run's figure is its median step after
# two of warm-up. Prints, for each: the groups the run detected, its cut, its predicted and
# measured step, and each host's sgemm rate and noise as the split read them; then the ratio
# of the two measured medians. Figures, not pass/fail: the neighbour's share of core 1 and the
# machine's other load move them.
#
# Usage: bench/mixed.sh [steps] [reps] [pp|dp]   (defaults 8 3 pp; root, iproute2, mpirun,
#   taskset; about 3 minutes)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps="${1:-8}"
reps="${2:-3}"
mode="${3:-pp}"
[ "$mode" = pp ] || [ "$mode" = dp ] || { echo "bench: mode '$mode': pp or dp"; exit 2; }
. bench/box_lib.sh
box_args "$steps" "$reps"
box_machine 2 mpirun taskset ip python3
CL=$PWD/tests/cluster/cluster.sh
name=bmx$$
tmp=$(mktemp -d)
busy=
cleanup() {
    [ -n "$busy" ] && kill "$busy" 2>/dev/null
    "$CL" down "$name" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
"$CL" up "$name" --hosts 2 --slots 1 --rate 1gbit >"$tmp/up.log" 2>&1 ||
    { echo "bench: cluster.sh up failed: $(tail -2 "$tmp/up.log")"; exit 1; }
"$CL" cores "$name" "$name-n0" 0 >/dev/null && "$CL" cores "$name" "$name-n1" 1 >/dev/null || exit 1
taskset -c 1 sh -c 'while :; do :; done' &
busy=$!

R=bench/pp_gpt.lua
even=$("$T" plan $R --gpus 2 --gpu H100-80GB --pp 2 --schedule 1f1b --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["plan"]["stages"][1])') ||
    { echo "bench: the even cut"; exit 1; }
if [ "$mode" = pp ]; then
    { cat $R; echo 'parallel { pp = 2, schedule = "1f1b" }'; } >"bench/.mixed_speed.lua"
    { cat $R; echo "parallel { pp = 2, schedule = \"1f1b\", stages = { 0, $even } }"; } >"bench/.mixed_even.lua"
else
    { cat $R; echo 'parallel { dp = 2, zero = 0 }'; } >"bench/.mixed_speed.lua"
    { cat $R; echo 'parallel { dp = 2, zero = 0, dp_shares = { 4, 4 } }'; } >"bench/.mixed_even.lua"
fi
trap 'rm -f bench/.mixed_speed.lua bench/.mixed_even.lua; cleanup' EXIT

run() { # KIND REP
    local out=$tmp/$1.$2
    "$CL" run "$name" -- mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 -x TR_SPEED_GROUPS=1 \
        "$T" run "bench/.mixed_$1.lua" --steps "$steps" --set train.micro_batch=$micro --out "$out" >"$out.log" 2>&1 ||
        { echo "bench: the $1 run failed: $(tail -2 "$out.log")"; return 1; }
}
micro=auto
[ "$mode" = dp ] && micro=2
for rep in $(seq 1 "$reps"); do run speed "$rep" && run even "$rep" || exit 1; done

python3 - "$tmp" "$reps" "$even" "$mode" <<'PY'
import glob, json, re, statistics, sys
tmp, reps, even, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
key = "stages" if mode == "pp" else "dp_shares"
print("2 hosts x 1 rank: host n0 on core 0, host n1 on core 1 beside a busy loop; "
      "bench/pp_gpt.lua, %s" % ("pp 2, 1f1b" if mode == "pp" else "dp 2, micro-batches of 2"))
print("%-6s %-3s %-44s %-8s %10s %10s  %s" % ("cut", "rep", "groups detected", "stages",
                                              "predicted", "measured", "sgemm by node"))
med = {}
for kind in ("speed", "even"):
    got = []
    for rep in range(1, reps + 1):
        out = "%s/%s.%d" % (tmp, kind, rep)
        log = open(out + ".log").read()
        m = re.search(r"detected: [^;\n]*?\)", log)
        g = re.search(r"sgemm by node ([^;\n]*)", log)
        rec = open(out + "/recipe.lua").read()
        st = re.search(key + r" = \{([^}]*)\}", rec)
        rows = [json.loads(l) for l in open(out + "/metrics.jsonl")][2:]
        s = statistics.median(r["step_s"] for r in rows)
        p = statistics.median(r["predicted_step_s"] for r in rows)
        got.append(s)
        print("%-6s %-3d %-44s %-8s %9.4fs %9.4fs  %s" % (
            kind, rep, m.group(0)[10:54] if m else "?",
            st.group(1).replace(" ", "") if st else "even", p, s, g.group(1) if g else "?"))
    med[kind] = statistics.median(got)
print("median measured step: by speed %.4f s, even (%s) %.4f s: %.2fx" %
      (med["speed"], "stages 0,%s" % even if mode == "pp" else "4/4", med["even"],
       med["even"] / med["speed"]))
PY
