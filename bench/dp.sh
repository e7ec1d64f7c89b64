#!/usr/bin/env bash
# Data parallelism on this machine: 2 MPI ranks (1 thread each) against 1 process (2 threads)
# on the same global batch, at each ZeRO stage; prints step time, tokens/s and the fraction
# of the gradient communication hidden behind the backward. On 2 cores the absolute numbers
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
run() { # name np threads zero
    local name=$1 np=$2 th=$3 zero=$4
    local cmd=("$T" run bench/dp_gpt.lua --set zero="$zero" --set steps="$steps" --out "$tmp/$name" --peak-gflops 1)
    if [ "$np" -eq 1 ]; then OMP_NUM_THREADS=$th "${cmd[@]}" >"$tmp/$name.log" 2>&1
    else OMP_NUM_THREADS=$th mpirun -np "$np" "${cmd[@]}" >"$tmp/$name.log" 2>&1; fi
}
printf "%-28s %10s %10s %12s %14s\n" "layout" "tok/s" "step (ms)" "vs 1 proc" "comm hidden"
run single 1 2 0
base=$(median "$tmp/single/metrics.jsonl" tokens_per_s)
printf "%-28s %10.0f %10.1f %12s %14s\n" "1 process, 2 threads" "$base" "$(awk -v t="$base" 'BEGIN{print 8192/t*1000}')" "1.00x" "-"
for zero in 0 1 2 3; do
    run "z$zero" 2 1 "$zero"
    tps=$(median "$tmp/z$zero/metrics.jsonl" tokens_per_s)
    hid=$(grep -o '"comm_hidden": [0-9.]*' "$tmp/z$zero/metrics.jsonl" | tail -1 | awk '{print $2}')
    printf "%-28s %10.0f %10.1f %11.2fx %13.0f%%\n" "2 ranks x 1 thread, ZeRO-$zero" "$tps" \
        "$(awk -v t="$tps" 'BEGIN{print 8192/t*1000}')" "$(awk -v a="$tps" -v b="$base" 'BEGIN{print a/b}')" \
        "$(awk -v h="$hid" 'BEGIN{print 100*h}')"
done
for zero in 0 1 2 3; do grep -h "data parallel:\|ZeRO-" "$tmp/z$zero.log" | grep -v "^[0-9] processes" | sed "s/^/  ZeRO-$zero: /"; done
echo "comm hidden: 1 - (time waited for gradients after the backward) / (first all-reduce start .. last completion), over the run"
