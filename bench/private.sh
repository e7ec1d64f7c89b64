#!/usr/bin/env bash
# Private gradients against plain sums, on a cluster in a box (tests/cluster/cluster.sh) of 2
# hosts x 1 rank, links shaped to RATE: bench/dp_gpt.lua at dp 2 (ZeRO 0), plain and with
# --private-gradients, in turn, `reps` times each. For each run: its median step after two of
# warm-up, its share of the step spent masking (the fixed point, the masks and the unmasking:
# the run's "private gradients: masking took" line, the ledger's mask_s; the blocking sum of
# the buckets' largest magnitudes is communication, not in it), and the bytes that
# crossed host n1's link (both ways, the switch port's counters, start-up probes included:
# the same in both); then the ratio of the medians and the bytes' difference per step.
# Figures, not pass/fail: ratios within one run of this script (the machine is shared).
#
# Usage: bench/private.sh [steps] [reps] [rate]   (defaults 12 3 1gbit; root, iproute2,
#   mpirun; about 3 minutes)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps="${1:-12}"
reps="${2:-3}"
rate="${3:-1gbit}"
. bench/box_lib.sh
box_args "$steps" "$reps"
box_machine 1 mpirun ip python3
CL=$PWD/tests/cluster/cluster.sh
name=bp$$
name=${name:0:12}
tmp=$(mktemp -d)
trap '"$CL" down "$name" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
"$CL" up "$name" --hosts 2 --slots 1 --rate "$rate" >"$tmp/up.log" 2>&1 ||
    { echo "bench: cluster up: $(tail -1 "$tmp/up.log")"; exit 1; }
D=$("$CL" dir "$name")
R=$PWD/bench/dp_gpt.lua

# the bytes through n1's switch port, both ways
port_bytes() {
    ip -n "trc-$name-sw" -s -j link show n1 |
        python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["stats64"]; print(s["rx"]["bytes"] + s["tx"]["bytes"])'
}

# run KIND I [flags]: prints "median_step mask_share bytes"
run() {
    local kind=$1 i=$2 b0 b1 out=$tmp/$1_$2
    shift 2
    b0=$(port_bytes)
    "$CL" run "$name" -- mpirun -np 2 --hostfile "$D/hostfile" -x OMP_NUM_THREADS=1 "$T" run "$R" \
        --set steps="$steps" --peak-gflops 10 --out "$out" "$@" >"$out.log" 2>&1 ||
        { echo "bench: $kind run $i failed: $(grep -a trainer "$out.log" | tail -1)" >&2; return 1; }
    b1=$(port_bytes)
    python3 - "$out/metrics.jsonl" "$out.log" $((b1 - b0)) <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
med = statistics.median(r["step_s"] for r in rows[2:])
m = re.search(r"masking took ([0-9.e+-]+) s", open(sys.argv[2], errors="replace").read())
share = float(m.group(1)) / sum(r["step_s"] for r in rows) if m else 0.0
print("%.4f %.4f %s" % (med, share, sys.argv[3]))
PY
}

echo "== bench/dp_gpt.lua at dp 2 on 2 hosts x 1 rank, links $rate; $steps steps, $reps runs each"
printf "%-8s %4s %10s %8s %12s\n" kind run "step s" masking "bytes"
for i in $(seq 1 "$reps"); do
    for kind in plain masked; do
        flags=()
        [ $kind = masked ] && flags=(--private-gradients)
        r=$(run $kind "$i" "${flags[@]}") || continue
        echo "$kind $r" >>"$tmp/all"
        read -r s m b <<<"$r"
        printf "%-8s %4d %10.4f %7.1f%% %12d\n" "$kind" "$i" "$s" "$(python3 -c "print(100*$m)")" "$b"
    done
done
python3 - "$tmp/all" "$steps" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
steps = int(sys.argv[2])
fig = {k: [(float(s), float(m), int(b)) for kk, s, m, b in rows if kk == k] for k in ("plain", "masked")}
if not fig["plain"] or not fig["masked"]:
    sys.exit("bench: a kind has no runs")
sp = statistics.median(s for s, _, _ in fig["plain"])
sm = statistics.median(s for s, _, _ in fig["masked"])
bp = statistics.median(b for _, _, b in fig["plain"])
bm = statistics.median(b for _, _, b in fig["masked"])
print("step: masked %.4f s against plain %.4f s: %.2fx (goal 1.2x or less)" % (sm, sp, sm / sp))
print("bytes on n1's link: masked %d against plain %d: %+.0f bytes a step (%+.2f%%)"
      % (bm, bp, (bm - bp) / steps, 100.0 * (bm - bp) / bp))
PY
