#!/usr/bin/env bash
# Device communication: bus bandwidth of all-reduce, reduce-scatter and all-gather through
# comm.h against NCCL called directly (BUILD/comm_bench, bench/comm_bench.c: nccl-tests'
# definitions of algbw and busbw), and the share of a data-parallel GPU run's gradient
# communication hidden behind the backward (GPT-2 124M, the trainer's own figure: the log's
# "data parallel: ... hidden" line and metrics.jsonl's comm_hidden).
#   no GPU   one line saying nothing can be measured here; exit 0
#   1 GPU    bus bandwidth is 0 on one rank, and two ranks cannot use NCCL on one GPU: so
#            per-call times of comm.h and NCCL on a communicator of one (TR_COMM_DEVICE=nccl),
#            the staged transport's host round trip with 2 ranks sharing the GPU, and the hidden
#            share of a dp=2 run whose 2 ranks share the GPU (staged transport, not NCCL)
#   N GPUs   mpirun -np N comm_bench, 1 MB to 1 GB in bf16 and fp32 (comm.h over NCCL against
#            NCCL), and the hidden share of a dp=N run over NCCL
#
# Usage: bench/comm.sh [BUILD] (default build-gpu; builds nothing: BUILD/comm_bench and
# BUILD/trainer must exist). Logs go to $OUT when it is set, else BUILD/bench/; the summary
# lines go to stdout and to comm_results.txt there. Every step is bounded by a timeout, and all
# of them by COMM_SECONDS (default 900) in all: a step that would start with under 20 s left
# is skipped.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD="${1:-build-gpu}"

# ---- how many GPUs (CUDA_VISIBLE_DEVICES narrows what nvidia-smi lists) --------------------
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
    GPUS=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$GPUS" -gt 0 ]; then
        visible=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
        [ "$visible" -lt "$GPUS" ] && GPUS=$visible
    fi
fi
if [ "$GPUS" -eq 0 ]; then
    echo "comm: no GPU here (nvidia-smi -L lists none): no device communication can be measured"
    exit 0
fi

DEADLINE=$(($(date +%s) + ${COMM_SECONDS:-900}))
# lim S: S seconds, or what is left before the deadline if less
lim() {
    local left=$((DEADLINE - $(date +%s)))
    [ $left -lt 0 ] && left=0
    echo $(($1 < left ? $1 : left))
}
LOGS="${OUT:-$BUILD/bench}"
RUNS="${BENCH_RUNS:-$BUILD/bench-runs}"
mkdir -p "$LOGS" "$RUNS"
RESULTS="$LOGS/comm_results.txt"
: >"$RESULTS"
say() { echo "comm: $*" | tee -a "$RESULTS"; }
BENCH="$BUILD/comm_bench"
TRAINER="$BUILD/trainer"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI without ssh on the machine: its launcher for one host
command -v ssh >/dev/null 2>&1 || command -v rsh >/dev/null 2>&1 || export OMPI_MCA_plm="${OMPI_MCA_plm:-isolated}"
MPIRUN=$(command -v mpirun || true)
# no core binding and a few OpenMP threads per rank: the GPUs do the work
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
MPI=("$MPIRUN" --bind-to none)
say "$GPUS GPU(s): $(timeout 30 nvidia-smi -L 2>/dev/null | head -1)${MPIRUN:+; mpirun $MPIRUN}"

# bench NAME TIMEOUT [env VAR=VALUE...] [mpirun -np N] -- comm_bench args: its table to
# comm_NAME.log, its summary lines to RESULTS
bench() {
    local name=$1 limit
    limit=$(lim "$2")
    shift 2
    local log="$LOGS/comm_$name.log"
    if [ ! -x "$BENCH" ]; then
        say "$name: skipped: no $BENCH (built only with the CUDA backend and NCCL)"
        return
    fi
    if [ "$limit" -lt 20 ]; then
        say "$name: skipped (no time left)"
        return
    fi
    echo "comm: $name: $*" >"$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    grep '^summary:' "$log" | sed "s/^summary:/comm: $name:/" | tee -a "$RESULTS"
    case $rc in
    0) ;;
    124) say "$name: TIMED OUT after $limit s (see comm_$name.log)" ;;
    77) say "$name: skipped: $(grep -m1 'no CUDA device' "$log")" ;;
    *) say "$name: FAILED (exit $rc, see comm_$name.log)"; tail -5 "$log" ;;
    esac
}

# hidden NP TRANSPORT_NOTE: a short dp=NP run of GPT-2 124M on the GPU(s), 16 x 1024 tokens per
# rank per step, one micro-batch (so the buckets reduce while the backward runs), ZeRO-0
hidden() {
    local np=$1 note=$2 dir="$RUNS/comm_dp$1" log="$LOGS/comm_dp$1.log"
    local limit
    limit=$(lim 300)
    if [ ! -x "$TRAINER" ]; then
        say "dp=$np hidden share: skipped: no $TRAINER"
        return
    fi
    if [ "$limit" -lt 20 ]; then
        say "dp=$np hidden share: skipped (no time left)"
        return
    fi
    rm -rf "$dir"
    local cmd=("${MPI[@]}" -np "$np" "$TRAINER" run recipes/gpt2_124m.lua --device cuda --dp "$np"
               --zero 0 --set seq=1024 --set "batch_tokens=$((np * 16 * 1024))" --micro-batch 16
               --steps 10 --eval-every 0 --sample-tokens 0 --set checkpoint_every=0 --timeout 120
               --out "$dir" --overwrite)
    echo "comm: ${cmd[*]}" >"$log"
    timeout "$limit" "${cmd[@]}" >>"$log" 2>&1
    local rc=$?
    local line frac
    line=$(grep -m1 '^data parallel:' "$log")
    frac=$(grep '"comm_hidden"' "$dir/metrics.jsonl" 2>/dev/null | tail -1 |
        sed -n 's/.*"comm_hidden": *\([-0-9.eE+]*\).*/\1/p')
    cp "$dir/metrics.jsonl" "$LOGS/metrics_comm_dp$np.jsonl" 2>/dev/null
    if [ $rc -eq 0 ] && [ -n "$frac" ]; then
        say "dp=$np hidden share ($note): comm_hidden $frac (metrics.jsonl, last step); log: ${line#data parallel: }"
    else
        say "dp=$np hidden share ($note): FAILED (exit $rc$([ $rc -eq 124 ] && echo ', timed out'), see comm_dp$np.log)"
        tail -5 "$log"
    fi
}

if [ "$GPUS" -eq 1 ]; then
    say "1 GPU: bus bandwidth is 0 on one rank by definition and NCCL refuses two ranks on one GPU: multi-GPU bus bandwidth cannot be measured here; measured instead: per-call times on a 1-rank NCCL communicator, the staged transport's host round trip, and a dp=2 run on the shared GPU"
    bench 1rank_nccl 120 env TR_COMM_DEVICE=nccl "$BENCH" --min 4K --max 1G
    if [ -n "$MPIRUN" ]; then
        hidden 2 "2 ranks sharing 1 GPU: staged transport through host memory, not NCCL"
        bench 2rank_staged 180 env TR_COMM_DEVICE=staged "${MPI[@]}" -np 2 "$BENCH" --max 256M \
            --iters 5 --warmup 2
    else
        say "2 ranks sharing the GPU: skipped: no mpirun"
    fi
else
    if [ -n "$MPIRUN" ]; then
        bench "${GPUS}rank_nccl" 300 "${MPI[@]}" -np "$GPUS" "$BENCH"
        hidden "$GPUS" "$GPUS GPUs over NCCL"
    else
        say "$GPUS GPUs but no mpirun: the multi-GPU figures cannot be measured; one rank instead"
        bench 1rank_nccl 120 env TR_COMM_DEVICE=nccl "$BENCH" --min 4K --max 1G
    fi
fi
exit 0
