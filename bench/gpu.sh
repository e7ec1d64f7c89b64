#!/usr/bin/env bash
# GPU training throughput: GPT-2 124M (recipes/gpt2_124m.lua) and GPT-2 XL's 1.56B shape
# (bench/gpt2_xl.lua) at sequence 1024 in bf16 on the CUDA backend. For each: tokens/s and MFU
# as the median over the steps after a warm-up, read from the run's metrics.jsonl. MFU is the
# trainer's own figure: matrix FLOPs (attention's causal half removed) over the device table's
# peak (H100/H200 SXM bf16: 989 TFLOP/s).
#
# Usage: bench/gpu.sh [TRAINER] (default build-gpu/trainer). Logs go to $OUT when it is set,
# else build-gpu/bench/; one line per model goes to stdout and to RESULTS (bench_results.txt):
#   name  tokens_per_s  mfu  status
set -uo pipefail
case "${BENCH_SECONDS:-900}" in
'' | *[!0-9]*) echo "bench/gpu.sh: BENCH_SECONDS='$BENCH_SECONDS' is not a whole number of seconds" >&2 && exit 2 ;;
esac
cd "$(dirname "$0")/.."
TRAINER="${1:-build-gpu/trainer}"
LOGS="${OUT:-build-gpu/bench}"
RUNS="${BENCH_RUNS:-build-gpu/bench-runs}"
mkdir -p "$LOGS" "$RUNS"
# BENCH_SECONDS (default 900): all runs together; each runs at most 300 s or what is left, and
# one that would start with under 20 s left is skipped
DEADLINE=$(($(date +%s) + ${BENCH_SECONDS:-900}))
RESULTS="$LOGS/bench_results.txt"
: >"$RESULTS"

median() { # stdin: numbers, one a line
    sort -g | awk '{a[NR] = $1} END {
        if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2];
        else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
field() { # $1: key, stdin: metrics.jsonl lines
    sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p"
}

# name recipe micro-batch batch_tokens steps warmup [extra trainer args...]
bench() {
    local name=$1 recipe=$2 micro=$3 tokens=$4 steps=$5 warm=$6
    shift 6
    local dir="$RUNS/$name" log="$LOGS/bench_$name.log"
    local left=$((DEADLINE - $(date +%s)))
    if [ $left -lt 20 ]; then
        printf '%-17s %12s %8s %s\n' "$name" n/a n/a "skipped (no time left)" | tee -a "$RESULTS"
        return
    fi
    rm -rf "$dir"
    echo "bench: $name: $TRAINER run $recipe --device cuda --micro-batch $micro" \
         "--set batch_tokens=$tokens --steps $steps $*" >&2
    timeout $((left < 300 ? left : 300)) "$TRAINER" run "$recipe" --device cuda --set seq=1024 \
        --set "batch_tokens=$tokens" --micro-batch "$micro" --steps "$steps" \
        --eval-every 0 --sample-tokens 0 --set checkpoint_every=0 --out "$dir" --overwrite "$@" \
        >"$log" 2>&1
    local rc=$?
    local status=ok
    [ $rc -ne 0 ] && status="failed(rc=$rc, see bench_$name.log)"
    local tps=n/a mfu=n/a
    if [ -s "$dir/metrics.jsonl" ]; then
        tps=$(awk -v w="$warm" 'NR > w' "$dir/metrics.jsonl" | field tokens_per_s | median)
        mfu=$(awk -v w="$warm" 'NR > w' "$dir/metrics.jsonl" | field mfu | median)
        cp "$dir/metrics.jsonl" "$LOGS/metrics_$name.jsonl" 2>/dev/null
    fi
    printf '%-17s %12s %8s %s\n' "$name" "$tps" "$mfu" "$status" | tee -a "$RESULTS"
}

if [ ! -x "$TRAINER" ]; then
    echo "bench: no trainer at $TRAINER (build it first)" >&2
    printf '%-17s %12s %8s %s\n' gpt2_124m n/a n/a "not built" gpt2_124m_simple n/a n/a "not built" gpt2_xl n/a n/a "not built" |
        tee -a "$RESULTS"
    exit 1
fi
# 124M: micro-batch 32 x 1024, two micro-batches per step (gradient accumulation runs too);
# then the same with the CUDA-core attention kernels (TR_CUDA_ATTENTION=simple), side by side
bench gpt2_124m recipes/gpt2_124m.lua 32 65536 14 4
TR_CUDA_ATTENTION=simple bench gpt2_124m_simple recipes/gpt2_124m.lua 32 65536 14 4
# 1.56B: micro-batch 8 x 1024, one micro-batch per step
bench gpt2_xl bench/gpt2_xl.lua 8 8192 10 3
