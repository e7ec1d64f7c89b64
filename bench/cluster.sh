#!/usr/bin/env bash
# Layouts across hosts, measured beside the planner: on a cluster in a box of 2 hosts x 2
# ranks (tests/cluster/cluster.sh; shared memory inside a host, TCP between them) whose links
# are shaped to 1 Gbit/s and then to 100 Mbit/s, bench/tp_gpt.lua at 4 blocks of width 256
# (4096 tokens a step) runs as dp 4 (gradients across the hosts), dp 2 x tp 2 with tp inside
# the hosts (mpirun's by-slot placement: ranks 0, 1 on the first host; the mesh puts tp
# innermost), dp 2 x tp 2 with tp ACROSS the hosts (--map-by node: ranks 0, 2 on the first
# host), tp 2 x pp 2 with the pipeline across the hosts (tp inside), and parallel "auto" (no
# layout flags, by-slot placement): the planner's own choice, marked `*`. For each: the
# ranks' hosts (from the run's per-rank table), the measured step (the median of
# metrics.jsonl's step_s after two steps of warm-up), the planner's prediction
# (predicted_step_s, the run's "plan vs run" line), the least of the ranks' measured sgemm
# rates (one of the planner's inputs, measured at each start), measured / predicted, tokens/s (median) and the
# step against the fastest layout; under each table the slowest layout measured and predicted,
# the planner's choice against the fastest, the prediction furthest off, and each
# prediction's parts (compute, bubble, tp, pp, dp, optimizer) with what the run resolved. Above each
# table: the links the planner measured (`trainer plan --json` run on the cluster) against the
# shaped rate. One run of each layout per rate, 1 thread per rank (4 ranks share this
# machine's cores: the compute is the same in every layout, the network is what differs); on
# a shared 2-core machine one layout's runs differ by up to about 25%, so smaller differences
# are noise. Figures, not pass/fail.
# Usage: bench/cluster.sh [steps]     (as root; needs build/trainer built with MPI, mpirun,
#                                      iproute2; about 6 minutes with the default 6 steps)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps="${1:-6}"
T=${TRAINER:-build/trainer}
[[ $steps =~ ^[0-9]+$ ]] && [ "$steps" -ge 3 ] || { echo "bench: steps '$steps': a whole number, 3 or more (2 are warm-up)"; exit 2; }
[ -x "$T" ] || { echo "bench: no trainer at $T (build it, or set TRAINER)"; exit 1; }
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
began=$(date +%s)
tmp=$(mktemp -d)
. tests/cluster/lib.sh # cluster_begin: up, and down (with $tmp) at the exit; rank_hosts
cluster_begin bcl --hosts 2 --slots 2 --rate 1gbit || exit 1
# bench/tp_gpt.lua sized for the network to matter: 4 blocks of width 256 (MLP 1024), T 128,
# 4096 tokens a step, so that both the gradients (3.3M parameters, 13 MB) and the
# tensor-parallel activations (tokens x width per collective) are megabytes a step
recipe=bench/tp_gpt.lua
knobs=(--set width=256 --set heads=4 --set layers=4 --set batch_tokens=4096)

med() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
median() { # metrics.jsonl key: the median after the first two (warm-up) steps
    grep -o "\"$2\": [0-9.e+-]*" "$1" | tail -n +3 | awk '{print $2}' | med
}
run() { # name map [flags...]: 4 ranks on the cluster, placed by mpirun's --map-by map
    local name=$1 map=$2
    shift 2
    "$CL" run "$cname" -- env OMP_NUM_THREADS=1 timeout 600 mpirun -np 4 --map-by "$map" \
        "$T" run "$recipe" "${knobs[@]}" --set steps="$steps" --out "$tmp/$name" --overwrite --timeout 120 "$@" \
        >"$tmp/$name.log" 2>&1
}
hosts_of() { # name: the host of each rank in rank order, by its short name (n0 n0 n1 n1)
    rank_hosts "$tmp/$1.log" | sort -n | awk -v p="$cname-" '{sub(p, "", $2); printf "%s ", $2}'
}
layout_of() { # name: the layout the run resolved (the log's "plan:" line, up to the recompute)
    sed -n 's/^plan: \(dp [0-9]* x tp [0-9]*\( x pp [0-9]*\)\{0,1\}\).*/\1/p' "$tmp/$1.log" | head -1
}
links() { # rate: the links the planner measures, as trainer plan --json reports them
    "$CL" run "$cname" -- mpirun -np 4 "$T" plan "$recipe" "${knobs[@]}" --json 2>/dev/null | python3 -c '
import json, sys
r = sys.argv[1]
shaped = float(r[:-4]) * {"m": 1e6, "g": 1e9}[r[-4]] / 8
try:
    l = json.load(sys.stdin)["cluster"]["links"]
except Exception as e:
    print("planner'"'"'s links: trainer plan --json gave none (%s)" % e); sys.exit()
i, x = l["intra"], l["inter"]
p2p = x.get("p2p_bw", 0)
print("planner'"'"'s links: between hosts %.1f MB/s one way (shaped to %.1f MB/s: %.2fx), all-reduce"
      " bus bandwidth %.1f MB/s (%s, what collectives are priced with), latency %.0f us; inside a"
      " host %.0f MB/s (%s)" % (p2p / 1e6, shaped / 1e6, p2p / shaped, x["bw"] / 1e6, x["origin"],
      x["latency"] * 1e6, i["bw"] / 1e6, i["origin"]))' "$1"
}

where() { # name dp tp pp: where its tp groups, pp stages and dp replicas sit (world rank (d * pp + p) * tp + t)
    hosts_of "$1" | awk -v D="$2" -v T="$3" -v P="$4" '{
        for (d = 0; d < D; d++) for (p = 0; p < P; p++) for (t = 0; t < T; t++) {
            h = $((d * P + p) * T + t + 1)
            if (h != $((d * P + p) * T + 1)) tpx = 1
            if (h != $(d * P * T + t + 1)) ppx = 1
            if (h != $(p * T + t + 1)) dpx = 1
        }
        if (T > 1) w = tpx ? ", tp ACROSS hosts" : ", tp inside hosts"
        if (P > 1) w = w (ppx ? ", pp across hosts" : ", pp inside hosts")
        if (D > 1) w = w (dpx ? ", dp across hosts" : ", dp inside hosts")
        print w }'
}
peak_of() { # name: the least of the ranks' measured sgemm GFLOP/s (one of the planner's inputs)
    sed -n 's/^  rank [0-9].* peak \([0-9.]*\) GFLOP\/s.*/\1/p' "$tmp/$1.log" | sort -g | head -1
}
parts_of() { # name: the prediction's parts, from the log's "plan: predicted" line
    sed -n 's/^plan: predicted [0-9.e+-]* s per step (\([^)]*\)).*/\1/p' "$tmp/$1.log"
}
table() { # rate: the rows of its runs (also in $tmp/rows.RATE: name|label|step|predicted), a summary
    local rate=$1 l name map label flags n m s p pvr best placed
    best=$(for l in "${layouts[@]}"; do median "$tmp/$rate.${l%%|*}/metrics.jsonl" step_s 2>/dev/null; done | sort -g | head -1)
    printf "%-36s %-12s %7s %8s %9s %9s %8s %7s %8s\n" "layout" "rank hosts" "peak GF" "step s" "predicted" "meas/pred" "log" "tok/s" "vs best"
    : >"$tmp/rows.$rate"
    : >"$tmp/parts.$rate"
    for l in "${layouts[@]}"; do
        IFS='|' read -r name map label flags <<<"$l"
        n=$rate.$name m=$tmp/$rate.$name/metrics.jsonl
        if [ "$name" != auto ]; then label="  $label"; else
            label="* auto: $(layout_of "$n")"
            # shellcheck disable=SC2046 # dp, tp and pp: three words
            placed=$(where "$n" $(layout_of "$n" | awk '{print $2, $5, ($8 ? $8 : 1)}'))
        fi
        if ! [ -s "$m" ]; then printf "%-36s failed (log: the last line above)\n" "$label"; continue; fi
        s=$(median "$m" step_s)
        p=$(grep -o '"predicted_step_s": [0-9.e+-]*' "$m" | head -1 | awk '{print $2}')
        pvr=$(sed -n 's/^plan vs run: step [^(]* measured (\([^)]*\));.*/\1/p' "$tmp/$n.log")
        printf "%-36s %-12s %7s %8.3f %9.3f %8.2fx %8s %7.0f %7.2fx\n" "$label" \
            "$(hosts_of "$n")" "$(peak_of "$n")" "$s" "${p:-0}" \
            "$(awk -v a="$s" -v b="${p:-0}" 'BEGIN {print (b > 0) ? a / b : 0}')" \
            "${pvr:--}" "$(median "$m" tokens_per_s)" "$(awk -v a="$s" -v b="$best" 'BEGIN {print a / b}')"
        label=${label#??}
        [ "$name" = auto ] && label="${label#auto: } (${placed#, })"
        echo "$name|$label|$s|${p:-0}" >>"$tmp/rows.$rate"
        printf "  %s: %s; %s\n" "$label" "$(parts_of "$n")" "$(sed -n 's/^plan: dp [0-9 xtp]*, \(.*\) (chosen .*/\1/p' "$tmp/$n.log")" >>"$tmp/parts.$rate"
    done
    awk -F'|' '{n++; name[n] = $1; lab[n] = $2; s[n] = $3; p[n] = $4}
        END {
            if (!n) exit
            w = 1; b = 1; pw = 0
            for (i = 1; i <= n; i++) {
                if (s[i] > s[w]) w = i
                if (s[i] < s[b]) b = i
                if (name[i] != "auto" && (pw == 0 || p[i] > p[pw])) pw = i
                if (p[i] > 0 && (m == 0 || r(i) > r(m))) m = i
            }
            printf "slowest measured: %s, %.2fx the fastest; fastest: %s\n", lab[w], s[w] / s[b], lab[b]
            if (pw) printf "slowest predicted of the four fixed layouts: %s (%.3f s)\n", lab[pw], p[pw]
            for (i = 1; i <= n; i++) if (name[i] == "auto")
                printf "the planner chose %s: %.2fx the fastest measured\n", lab[i], s[i] / s[b]
            printf "prediction furthest off: %s, measured %.2fx its prediction (%.3f s against %.3f s)\n",
                lab[m], s[m] / p[m], s[m], p[m]
        }
        function r(i) { return s[i] > p[i] ? s[i] / p[i] : p[i] / s[i] }' "$tmp/rows.$rate"
    echo "the planner's predictions in parts (s), and what it resolved for each layout:"
    cat "$tmp/parts.$rate"
}

# name, mpirun's placement, what the row says, the layout flags
layouts=(
    "dp4|slot|dp 4|--dp 4"
    "tpin|slot|dp 2 x tp 2, tp inside hosts|--dp 2 --tp 2"
    "tpx|node|dp 2 x tp 2, tp ACROSS hosts|--dp 2 --tp 2"
    "pp|slot|tp 2 x pp 2, pp across hosts|--tp 2 --pp 2"
    "auto|slot|auto|"
)
for rate in 1gbit 100mbit; do
    for h in n0 n1; do
        "$CL" shape "$cname" "$cname-$h" "$rate" >/dev/null || { echo "bench: cannot shape $cname-$h to $rate"; exit 1; }
    done
    echo
    echo "== links between the hosts at $rate ($recipe ${knobs[*]}: 2 hosts x 2 ranks, $steps steps, 4096 tokens a step)"
    links "$rate"
    for l in "${layouts[@]}"; do
        IFS='|' read -r name map label flags <<<"$l"
        # shellcheck disable=SC2086 # the flags are words
        run "$rate.$name" "$map" $flags ||
            echo "bench: $label at $rate failed: $(grep -v '^ \|^$' "$tmp/$rate.$name.log" | tail -1)"
    done
    table "$rate"
done
echo
echo "rank hosts: the host of ranks 0..3; step s: the median of step_s after 2 warm-up steps;"
echo "predicted: the planner's predicted_step_s for the layout the run used; log: the run's own"
echo "\"plan vs run\" (its mean step against the prediction); * the planner's choice (by-slot ranks);"
echo "peak GF: the least of the ranks' measured sgemm GFLOP/s at the run's start, one of the"
echo "planner's inputs (with the measured memory bandwidth; both move with this machine's load)."
echo "One run per layout: on a shared 2-core machine differences under about 25% are noise."
echo "bench/cluster.sh took $(($(date +%s) - began)) s"
