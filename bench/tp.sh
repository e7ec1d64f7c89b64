#!/usr/bin/env bash
# Tensor parallelism on this machine: tp = 2 (two MPI ranks, one thread each) against one
# process with two threads, on the same model and global batch, in one run; with and without
# sequence parallelism, and without the communication progress agent (TR_COMM_PROGRESS=0).
# Prints tokens/s side by side, the bytes each rank sends per step (counted from the calls,
# as a bandwidth-optimal ring moves them) against the Megatron-LM formula, the time the compute
# waited for tensor-parallel collectives per step, and the share of their time in flight (start
# to completion, as the progress agent sees it) that the compute did not wait for. The same
# layouts without the agent (TR_COMM_PROGRESS=0), where Open MPI moves a collective only while
# a rank waits for it, show what it changes. Two models: bench/tp_gpt.lua at width
# 768 and at 192 (small layers: communication weighs more). On 2 cores absolute figures are
# noisy; the ratios are what matter.
# Each layout runs `reps` times, interleaved with the others, and every figure is the median
# over the runs (on a shared 2-core VM one run can be twice as slow as the next).
# Usage: bench/tp.sh [steps] [reps]      (needs build/trainer built with MPI, and mpirun)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-8}"
reps="${2:-3}"
T=${TRAINER:-build/trainer}
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
med() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
median() { # metrics.jsonl key: the median after the first two (warm-up) steps
    grep -o "\"$2\": [0-9.e+-]*" "$1" | tail -n +3 | awk '{print $2}' | med
}
hidden_of() { # name: the median over the repetitions of the hidden share (%)
    for i in $(seq "$reps"); do
        sed -n 's/^tensor parallel:.*, \([0-9]*\)% of their time in flight.*/\1/p' "$tmp/$1.$i.log"
    done | med
}
tps_of() { # name: the median over the repetitions of each run's median tokens/s
    for i in $(seq "$reps"); do median "$tmp/$1.$i/metrics.jsonl" tokens_per_s; done | med
}
waited_of() { # name: the median over the repetitions of the tensor-parallel wait per step (ms)
    for i in $(seq "$reps"); do
        sed -n 's/^tensor parallel:.*waited \([0-9.]*\) ms per step.*/\1/p' "$tmp/$1.$i.log"
    done | med
}
run() { # name np threads [flags...]: repetition $rep
    local name=$1.$rep np=$2 th=$3
    shift 3
    local cmd=("$T" run bench/tp_gpt.lua --set steps="$steps" --set width="$width"
               --set heads="$heads" --out "$tmp/$name" --overwrite --peak-gflops 1 "$@")
    if [ "$np" -eq 1 ]; then OMP_NUM_THREADS=$th "${cmd[@]}" >"$tmp/$name.log" 2>&1
    else OMP_NUM_THREADS=$th mpirun -np "$np" "${cmd[@]}" >"$tmp/$name.log" 2>&1; fi
}
# Bytes per step and rank by the formula: per block (attention + MLP) Megatron's 4 all-reduces
# of b*s*h activations (2 forward, 2 backward), plus the embedding's and the head's input
# gradient (2 more), each 2(p-1)/p of its bytes on a ring; with sequence parallelism the same
# as all-gathers + reduce-scatters of (p-1)/p each, plus one all-gather per split layer in the
# backward (its input again, for the weight gradient: 2 per block); plus the head's loss
# statistics (3 floats per token from each other rank).
formula() { # sp layers tokens width p
    awk -v sp="$1" -v L="$2" -v N="$3" -v h="$4" -v p="$5" 'BEGIN {
        S = N * h * 4; ring = (p - 1) / p
        b = (4 * L + 2) * 2 * ring * S + (sp ? 2 * L * ring * S : 0) + (p - 1) * 3 * N * 4
        printf "%.3f", b / 1e6 }'
}
for model in "768 12" "192 4"; do
    set -- $model
    width=$1 heads=$2
    echo "== bench/tp_gpt.lua at width $width ($heads heads, MLP $((4 * width)), 2 blocks, T 128, 1024 tokens per step)"
    printf "%-34s %9s %9s %13s %13s %12s %8s\n" "layout" "tok/s" "vs 1 proc" "MB/step/rank" "formula" "waited/step" "hidden"
    configs=("single:" "tp2noagent:--tp 2" "tp2:--tp 2" "tp2spnoagent:--tp 2 --sequence-parallel"
             "tp2sp:--tp 2 --sequence-parallel" "dp2:--dp 2")
    for rep in $(seq "$reps"); do
        for cfg in "${configs[@]}"; do
            name=${cfg%%:*} flags=${cfg#*:}
            case $name in
            single) run single 1 2 ;;
            *noagent) TR_COMM_PROGRESS=0 run "$name" 2 1 $flags ;;
            *) run "$name" 2 1 $flags ;;
            esac
        done
    done
    base=$(tps_of single)
    printf "%-34s %9.0f %9s %13s %13s %12s %8s\n" "1 process, 2 threads" "$base" "1.00x" "-" "-" "-" "-"
    for cfg in "${configs[@]:1}"; do
        name=${cfg%%:*}
        tps=$(tps_of "$name")
        mb=$(sed -n 's/^tensor parallel: .* and \([0-9.]*\) MB sent.*/\1/p' "$tmp/$name.1.log")
        w=$(waited_of "$name")
        hid=-
        case $name in *noagent | dp2) ;; *) hid="$(hidden_of "$name")%" ;; esac
        [ -n "$w" ] && w="$w ms"
        f=-
        case $name in tp2 | tp2noagent) f=$(formula 0 2 1024 "$width" 2) ;; tp2sp*) f=$(formula 1 2 1024 "$width" 2) ;; esac
        case $name in
        dp2) label="dp 2 (1 thread each)" ;;
        tp2) label="tp 2 (1 thread each)" ;;
        tp2noagent) label="tp 2, TR_COMM_PROGRESS=0" ;;
        tp2sp) label="tp 2, sequence parallel" ;;
        tp2spnoagent) label="tp 2, seq. parallel, no agent" ;;
        esac
        printf "%-34s %9.0f %8.2fx %13s %13s %12s %8s\n" "$label" "$tps" \
            "$(awk -v a="$tps" -v b="$base" 'BEGIN{print a/b}')" "${mb:--}" "$f" "${w:--}" "${hid:--}"
    done
done
echo "MB/step/rank: what the tensor-parallel collectives called in a step make each rank send on a"
echo "ring (bytes from the calls, not read off the wire); waited/step: time the compute waited for"
echo "them; hidden: the share of their time in flight the compute did not wait for (with the"
echo "progress agent; medians over $reps runs of each layout)."
