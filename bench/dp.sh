#!/usr/bin/env bash
# Data parallelism on this machine: 2 MPI ranks (1 thread each) against 1 process (2 threads)
# on the same global batch, at each ZeRO stage; prints step time, tokens/s and the fraction
# of the gradient communication hidden behind the backward; at ZeRO-1 and 2 also the runs whose
# parameter refresh completes right after the update (TR_DP_SYNC_REFRESH=1, the blocking
# baseline) beside those where it overlaps the next forward. On 2 cores the absolute numbers
# are small: the ratios are what matter.
# Usage: bench/dp.sh [steps]        (needs build/trainer built with MPI, and mpirun)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-12}"
T=${TRAINER:-build/trainer}
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { # file key: median after the first two (warm-up) steps
    grep -o "\"$2\": [0-9.e+-]*" "$1" | tail -n +3 | awk '{print $2}' | sort -g |
        awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'
}
run() { # name np threads zero [sync]
    local name=$1 np=$2 th=$3 zero=$4 sync=${5:-0}
    local cmd=("$T" run bench/dp_gpt.lua --set zero="$zero" --set steps="$steps" --out "$tmp/$name" --overwrite --peak-gflops 1)
    if [ "$np" -eq 1 ]; then OMP_NUM_THREADS=$th "${cmd[@]}" >"$tmp/$name.log" 2>&1
    else OMP_NUM_THREADS=$th TR_DP_SYNC_REFRESH=$sync mpirun -x TR_DP_SYNC_REFRESH -np "$np" "${cmd[@]}" >"$tmp/$name.log" 2>&1; fi
}
row() { # label name
    local tps hid
    tps=$(median "$tmp/$2/metrics.jsonl" tokens_per_s)
    hid=$(grep -o '"comm_hidden": [0-9.]*' "$tmp/$2/metrics.jsonl" | tail -1 | awk '{print $2}')
    printf "%-44s %10.0f %10.1f %11.2fx %13.0f%%\n" "$1" "$tps" \
        "$(awk -v t="$tps" 'BEGIN{print 8192/t*1000}')" "$(awk -v a="$tps" -v b="$base" 'BEGIN{print a/b}')" \
        "$(awk -v h="$hid" 'BEGIN{print 100*h}')"
}
printf "%-44s %10s %10s %12s %14s\n" "layout" "tok/s" "step (ms)" "vs 1 proc" "comm hidden"
run single 1 2 0
base=$(median "$tmp/single/metrics.jsonl" tokens_per_s)
printf "%-44s %10.0f %10.1f %12s %14s\n" "1 process, 2 threads" "$base" "$(awk -v t="$base" 'BEGIN{print 8192/t*1000}')" "1.00x" "-"
for zero in 0 1 2 3; do
    run "z$zero" 2 1 "$zero"
    row "2 ranks x 1 thread, ZeRO-$zero" "z$zero"
    if [ "$zero" = 1 ] || [ "$zero" = 2 ]; then
        run "z${zero}s" 2 1 "$zero" 1
        row "2 ranks x 1 thread, ZeRO-$zero, blocking refresh" "z${zero}s"
    fi
done
for name in z0 z1 z1s z2 z2s z3; do grep -h "data parallel:\|^ZeRO-" "$tmp/$name.log" | sed "s/^/  $name: /"; done
echo "comm hidden: 1 - (time waited for gradients after the backward) / (first all-reduce start .. last completion), over the run"
