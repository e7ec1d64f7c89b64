#!/usr/bin/env bash
# Tensor parallelism on this machine: tp = 2 (two MPI ranks, one thread each) against one
# process with two threads, on the same model and global batch, in one run; with and without
# sequence parallelism, with and without the communication progress agent (TR_COMM_PROGRESS=1
# and 0; by default it runs only where it has a core to spare, not on 2 ranks of 2 cores), and
# tp 4 on 4 ranks sharing the 2 cores with and without it.
# Prints tokens/s side by side, the bytes each rank sends per step (counted from the calls,
# as a bandwidth-optimal ring moves them) against the Megatron-LM formula, the time the compute
# waited for tensor-parallel collectives per step, and the share of their time in flight (start
# to completion, as the progress agent sees it) that the compute did not wait for. The same
# layouts without the agent, where Open MPI moves a collective only while a rank waits for it,
# show what it changes: less waiting, but not the step's time. Two models: bench/tp_gpt.lua at width
# 768 and at 192 (small layers: communication weighs more), and at 192 in micro-batches of one
# sequence (8 a step: 8 times the collectives, each an eighth the size). On 2 cores absolute figures are
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
               --set heads="$heads" --out "$tmp/$name" --overwrite --peak-gflops 1 ${mb:+--micro-batch $mb} "$@")
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
for model in "768 12" "192 4" "192 4 1"; do
    set -- $model
    width=$1 heads=$2 mb=${3:-}
    echo "== bench/tp_gpt.lua at width $width ($heads heads, MLP $((4 * width)), 2 blocks, T 128, 1024 tokens per step${mb:+, micro-batches of $mb sequence(s)})"
    printf "%-34s %9s %9s %13s %13s %12s %8s\n" "layout" "tok/s" "vs 1 proc" "MB/step/rank" "formula" "waited/step" "hidden"
    configs=("single:" "tp2:--tp 2" "tp2agent:--tp 2" "tp2sp:--tp 2 --sequence-parallel"
             "tp2spagent:--tp 2 --sequence-parallel" "dp2:--dp 2" "dp2agent:--dp 2"
             "tp4:--tp 4" "tp4agent:--tp 4")
    for rep in $(seq "$reps"); do
        for cfg in "${configs[@]}"; do
            name=${cfg%%:*} flags=${cfg#*:}
            case $name in
            single) run single 1 2 ;;
            tp4agent) TR_COMM_PROGRESS=1 run "$name" 4 1 $flags ;;
            tp4) TR_COMM_PROGRESS=0 run "$name" 4 1 $flags ;;
            *agent) TR_COMM_PROGRESS=1 run "$name" 2 1 $flags ;;
            *) TR_COMM_PROGRESS=0 run "$name" 2 1 $flags ;;
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
        case $name in tp*agent) hid="$(hidden_of "$name")%" ;; esac
        [ -n "$w" ] && w="$w ms"
        f=-
        case $name in tp2 | tp2agent) f=$(formula 0 2 1024 "$width" 2) ;; tp2sp*) f=$(formula 1 2 1024 "$width" 2) ;;
        tp4*) f=$(formula 0 2 1024 "$width" 4) ;; esac
        case $name in
        dp2) label="dp 2 (1 thread each)" ;;
        dp2agent) label="dp 2, TR_COMM_PROGRESS=1" ;;
        tp2) label="tp 2 (1 thread each)" ;;
        tp2agent) label="tp 2, TR_COMM_PROGRESS=1" ;;
        tp2sp) label="tp 2, sequence parallel" ;;
        tp2spagent) label="tp 2, seq. parallel, agent" ;;
        tp4) label="tp 4 (4 ranks on 2 cores)" ;;
        tp4agent) label="tp 4, TR_COMM_PROGRESS=1" ;;
        esac
        printf "%-34s %9.0f %8.2fx %13s %13s %12s %8s\n" "$label" "$tps" \
            "$(awk -v a="$tps" -v b="$base" 'BEGIN{print a/b}')" "${mb:--}" "$f" "${w:--}" "${hid:--}"
    done
done
echo "MB/step/rank: what the tensor-parallel collectives called in a step make each rank send on a"
echo "ring (bytes from the calls, not read off the wire); waited/step: time the compute waited for"
echo "them; hidden: the share of their time in flight the compute did not wait for (with the"
echo "progress agent; medians over $reps runs of each layout). Rows without TR_COMM_PROGRESS=1 run"
echo "without the agent (TR_COMM_PROGRESS=0: what the default chooses on this machine's 2 cores)."
