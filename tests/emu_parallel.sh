#!/usr/bin/env bash
# The parallel layouts on the device, on the CUDA emulator: real MPI processes, each with an
# emulated GPU of its own, their collectives through comm.h's device transport over NCCL
# emulated on MPI (tests/cudaemu/emu_nccl.cc), or staged through host memory. What must come
# out is what the CPU computes (tests/dp.sh and tests/tp.sh hold the CPU to one process):
#  1. dp=2, ZeRO-0, 1, 2 (two micro-batches a step: the pieces accumulate) and 3, fp32 on the
#     device: every loss within 1e-4 relative of the CPU's dp=2 run (the emulated kernels
#     round differently from BLAS);
#  2. bf16 dp=2 against the bf16 device run in one process: within 2e-2 (bf16 gradients are
#     summed in bf16 by the collective); bf16 ZeRO-1 against ZeRO-0: the losses and the final
#     fp32 parameters bitwise; bf16 ZeRO-3 against that ZeRO-0 run: within 2e-2;
#     killed after its step-3 save and resumed, steps 4..6 and the final checkpoint bitwise
#     those of the uninterrupted ZeRO-3 run;
#  3. the staged transport (TR_COMM_DEVICE=staged) gives what NCCL gives, bitwise (with two
#     ranks a sum has one order);
#  4. tp=2 (and sequence parallelism) fp32 on the device against the CPU's tp=2: within 1e-4;
#  5. a rank far slower than --timeout: the others end the job naming it (the device
#     watchdog alone: tests/gpu/test_comm_device --stuck-rank under tests/mpi/dead_rank.sh);
#  6. pp=2 (zb-h1; sends and receives over NCCL, one channel each way per chunk boundary),
#     and pp=2 x tp=2 on 4 ranks (with and without sequence parallelism: the latter's sends
#     carry 1/tp slices, all-gathered on arrival), fp32 on the device against the CPU's pp=2:
#     within 1e-4;
#     interleaved pp=2 x 2 virtual stages (a small 4-block model, 2 steps) against the CPU;
#     pp=4 (the small model, 1 step) runs. Each of these pipelines makes, on every pp group,
#     one NCCL communicator of two ranks per channel, 2 (pp x virtual stages - 1) of them, every
#     rank its own in one NCCL group, and no communicator of the whole pp group (it runs no
#     device collective): the emulated NCCL's log of what each process created
#     (TR_EMU_NCCL_LOG) says so.
#  7. every one of those device runs allocates what its layout predicted, byte for byte, and
#     nothing after its first step;
#  8. private gradients on the device (fp32; the buckets masked in host memory): dp=2 on two
#     hosts (TR_HOSTNAME a and b), ZeRO-0 and ZeRO-2, against the CPU's dp=2: within 1e-4;
#     bf16 gradients are refused in one line.
# usage: tests/emu_parallel.sh path/to/trainer_emu   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null; then
    echo "skip: no mpirun"
    exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
R=tests/checkpoint/gpt.lua
run() { # np out flags...: a short run of R on np ranks
    local np=$1 out=$2
    shift 2
    timeout 600 mpirun -np "$np" "$T" run "$R" --set steps=6 --set every="${EVERY:-0}" --eval-every 0 \
        --peak-gflops 100 --out "$tmp/$out" "$@" >"$tmp/$out.log" 2>&1 ||
        { bad "$out: the run failed (exit $?)"; tail -5 "$tmp/$out.log"; return 1; }
    losses "$tmp/$out/metrics.jsonl" >"$tmp/$out.l"
}
# label log np groups P V alone: the communicators the emulated NCCL logged for a run on np
# ranks with `groups` pp groups of P stages x V virtual stages: per rank one NCCL group of
# channels, 2 (P V - 1) channels of two ranks per pp group in all, and `alone` communicators
# made outside groups (those of the groups that run device collectives: tp)
channels() {
    local want=$(($4 * 2 * 2 * ($5 * $6 - 1))) got
    got=$(awk -v np="$3" -v want="$want" -v alone="$7" '
        /grouped=1/ { split($2, w, "="); split($4, k, "="); groups[w[2]]++; sum += k[2] }
        /grouped=0/ { split($4, k, "="); lone += k[2] }
        END {
            ranks = 0; once = 1
            for (r in groups) { ranks++; if (groups[r] != 1) once = 0 }
            printf "%d ranks made their channels in one group each, %d channel ends (want %d), %d alone (want %d)", ranks, sum, want, lone + 0, alone
            exit !(ranks == np && once && sum == want && lone + 0 == alone)
        }' "$2" 2>&1) && ok "$1: $got" || bad "$1: ${got:-no log}"
}
same() { # label a b tol
    local r
    r=$(compare "$tmp/$2.l" "$tmp/$3.l" "$4") && ok "$1: $r (tol $4)" || bad "$1: $r (tol $4)"
}

# 1. data parallelism, fp32
run 2 cpu-dp --dp 2 --device cpu
for z in 0 1 2 3; do
    micro=() # ZeRO-2: two micro-batches per rank and step, summed into its pieces
    [ $z -eq 2 ] && micro=(--micro-batch 4)
    if run 2 dev-z$z --dp 2 --zero $z --device cuda --precision fp32 "${micro[@]}"; then
        grep -q "CUDA emulator" "$tmp/dev-z$z.log" || bad "dev-z$z: the log does not name the emulated device"
        same "dp=2 ZeRO-$z fp32 on the device vs the cpu${micro:+ (micro-batch 4)}" dev-z$z cpu-dp 1e-4
    fi
done

# 8. private gradients on the device, dp=2 on hosts a and b
run_hosts() { # out flags...: R on two ranks whose hosts are a and b
    local out=$1 a
    shift
    a=("$T" run "$R" --set steps=6 --set every=0 --eval-every 0 --peak-gflops 100 --out "$tmp/$out" "$@")
    timeout 600 mpirun -np 1 -x TR_HOSTNAME=a "${a[@]}" : -np 1 -x TR_HOSTNAME=b "${a[@]}" \
        >"$tmp/$out.log" 2>&1 || { bad "$out: the run failed (exit $?)"; tail -3 "$tmp/$out.log"; return 1; }
    losses "$tmp/$out/metrics.jsonl" >"$tmp/$out.l"
}
for z in 0 2; do
    run_hosts dev-priv-z$z --dp 2 --zero $z --device cuda --precision fp32 --private-gradients &&
        grep -q "masked between 2 hosts" "$tmp/dev-priv-z$z.log" &&
        same "private gradients, dp=2 ZeRO-$z fp32 on the device (2 hosts) vs the cpu" dev-priv-z$z cpu-dp 1e-4
done
a=("$T" run "$R" --set steps=1 --dp 2 --device cuda --precision bf16 --private-gradients --out "$tmp/refused-priv-bf16")
if timeout 600 mpirun -np 1 -x TR_HOSTNAME=a "${a[@]}" : -np 1 -x TR_HOSTNAME=b "${a[@]}" >"$tmp/refused-priv-bf16.log" 2>&1; then
    bad "private gradients with bf16 gradients on the device were not refused"
else
    line=$(grep -a "private gradients: masked sums need fp32 gradients, and this run's are bf16" "$tmp/refused-priv-bf16.log" | head -1)
    [ -n "$line" ] && ok "private gradients, bf16 on the device: refused in one line: $line" ||
        bad "private gradients, bf16: $(grep -a "private" "$tmp/refused-priv-bf16.log" | head -2)"
fi

# 2. bf16
run 1 dev-bf1 --device cuda --precision bf16 &&
    TR_DUMP_PARAMS=$tmp/dev-bf2.params run 2 dev-bf2 --dp 2 --device cuda --precision bf16 &&
    same "dp=2 bf16 on the device vs one device process" dev-bf2 dev-bf1 2e-2
# ZeRO-1 in bf16: the same all-reduced gradients and AdamW as ZeRO-0, so the same fp32 master
# weights to the bit, each part read from the rank that updates it (another rank's master
# copy of a part it does not update is stale); its refreshed bf16 weights give the same losses
if TR_DUMP_PARAMS=$tmp/dev-bf-z1.params run 2 dev-bf-z1 --dp 2 --zero 1 --device cuda --precision bf16; then
    cmp -s "$tmp/dev-bf-z1.params" "$tmp/dev-bf2.params" && diff -q "$tmp/dev-bf-z1.l" "$tmp/dev-bf2.l" >/dev/null &&
        ok "dp=2 ZeRO-1 bf16 on the device: losses and final fp32 parameters bitwise those of ZeRO-0" ||
        bad "dp=2 ZeRO-1 bf16 on the device: losses or final parameters differ from ZeRO-0's"
fi
# ZeRO-3 in bf16 (checkpoints every 3 steps), and an exact resume of it
if EVERY=3 run 2 dev-bf-z3 --dp 2 --zero 3 --device cuda --precision bf16; then
    same "dp=2 ZeRO-3 bf16 on the device vs ZeRO-0" dev-bf-z3 dev-bf2 2e-2
    B=$tmp/dev-bf-z3-resumed
    TR_FAULT_KILL_AFTER_STEP=3 timeout 600 mpirun -np 2 "$T" run "$R" --set steps=6 --set every=3 \
        --eval-every 0 --peak-gflops 100 --out "$B" --dp 2 --zero 3 --device cuda \
        --precision bf16 >"$tmp/dev-bf-z3-killed.log" 2>&1 # killed
    if [ "$(cat "$B/checkpoints/latest" 2>/dev/null)" != step_00000003 ]; then
        bad "ZeRO-3 bf16: the run was not killed after the save of step 3"
    elif EVERY=3 run 2 dev-bf-z3-resumed --dp 2 --zero 3 --device cuda --precision bf16 --resume &&
        grep -q "resuming from .*step_00000003" "$tmp/dev-bf-z3-resumed.log"; then
        ck=checkpoints/step_00000006
        if diff -q "$tmp/dev-bf-z3.l" "$tmp/dev-bf-z3-resumed.l" >/dev/null &&
            cmp -s "$tmp/dev-bf-z3/$ck/rank_00000.safetensors" "$B/$ck/rank_00000.safetensors" &&
            cmp -s "$tmp/dev-bf-z3/$ck/rank_00001.safetensors" "$B/$ck/rank_00001.safetensors"; then
            ok "ZeRO-3 bf16 resumed from step 3 on the device: steps 4..6 and both ranks' final shards bitwise those of the uninterrupted run"
        else
            bad "ZeRO-3 bf16 resumed on the device differs from the uninterrupted run:"
            paste "$tmp/dev-bf-z3.l" "$tmp/dev-bf-z3-resumed.l" | tail -3
        fi
    else
        bad "ZeRO-3 bf16: the resume on the device failed"
    fi
fi

# 3. the staged transport
TR_COMM_DEVICE=staged run 2 dev-staged --dp 2 --device cuda --precision bf16 &&
    if diff -q "$tmp/dev-staged.l" "$tmp/dev-bf2.l" >/dev/null; then
        ok "dp=2 bf16 staged through host memory: the losses of NCCL, bitwise"
    else
        bad "staged and NCCL differ:"; paste "$tmp/dev-staged.l" "$tmp/dev-bf2.l" | head -3
    fi

# 4. tensor parallelism (and sequence parallelism, on by default with tp), fp32
run 2 cpu-tp --tp 2 --device cpu &&
    run 2 dev-tp --tp 2 --device cuda --precision fp32 &&
    same "tp=2 fp32 on the device vs the cpu" dev-tp cpu-tp 1e-4
run 2 dev-tp-nosp --tp 2 --no-sequence-parallel --device cuda --precision fp32 &&
    same "tp=2 without sequence parallelism on the device vs the cpu" dev-tp-nosp cpu-tp 1e-4

# 6. pipelines: the default schedule (zb-h1), and with tensor parallelism inside each stage
run 2 cpu-pp --pp 2 --device cpu &&
    TR_EMU_NCCL_LOG=$tmp/dev-pp.nccl run 2 dev-pp --pp 2 --device cuda --precision fp32 &&
    channels "pp=2 communicators" "$tmp/dev-pp.nccl" 2 1 2 1 0 &&
    same "pp=2 fp32 on the device vs the cpu" dev-pp cpu-pp 1e-4 &&
    { grep -q "^device collectives: pp nccl$" "$tmp/dev-pp.log" &&
        ok "pp=2 on the device: its sends and receives over NCCL" ||
        bad "pp=2 on the device: $(grep "^device collectives" "$tmp/dev-pp.log")"; }
small=(--set layers=4 --set width=16 --set steps=2 --pp 2 --schedule interleaved --virtual-stages 2)
run 2 cpu-pp-int --device cpu "${small[@]}" &&
    TR_EMU_NCCL_LOG=$tmp/dev-pp-int.nccl run 2 dev-pp-int --device cuda --precision fp32 "${small[@]}" &&
    channels "pp=2 x 2 virtual stages communicators" "$tmp/dev-pp-int.nccl" 2 1 2 2 0 &&
    same "pp=2 interleaved x 2 fp32 on the device vs the cpu" dev-pp-int cpu-pp-int 1e-4
TR_EMU_NCCL_LOG=$tmp/dev-pp4.nccl run 4 dev-pp4 --device cuda --precision fp32 \
    --set layers=4 --set width=16 --set steps=1 --pp 4 &&
    channels "pp=4 communicators" "$tmp/dev-pp4.nccl" 4 1 4 1 0
TR_EMU_NCCL_LOG=$tmp/dev-pp-tp.nccl run 4 dev-pp-tp --pp 2 --tp 2 --sequence-parallel --device cuda --precision fp32 &&
    channels "pp=2 x tp=2 communicators (the tp groups' own made alone)" "$tmp/dev-pp-tp.nccl" 4 2 2 1 4 &&
    same "pp=2 x tp=2 fp32 on the device vs the cpu's pp=2" dev-pp-tp cpu-pp 1e-4
# without sequence parallelism each tp rank sends its 1/tp slice over NCCL and the next stage
# all-gathers the slices in place on the device (scatter-gather)
run 4 dev-pp-tp-sg --pp 2 --tp 2 --no-sequence-parallel --device cuda --precision fp32 &&
    same "pp=2 x tp=2 without sequence parallelism (sliced sends) on the device vs the cpu's pp=2" \
        dev-pp-tp-sg cpu-pp 1e-4

# 7. every device byte in the plan: each device run above said after its first step
#    "device memory: predicted X, allocated X", equal on every rank (parallel/dp.c sizes
#    ZeRO's bucket buffers at the start; the emulator fails any cudaMalloc after step 1)
for log in "$tmp"/dev-*.log; do
    name=$(basename "$log" .log)
    line=$(grep -m1 "^device memory: predicted" "$log")
    if [ -n "$line" ] && [ -z "${line##*equal on every rank*}" ]; then
        ok "$name: $line"
    else
        bad "$name: ${line:-no device memory line}"
        grep -m3 "device memory\|cuda emulator" "$log"
    fi
done

# 5. a rank far slower than --timeout is named
start=$(date +%s)
TR_FAULT_SLOW_RANK=1:6000 timeout 120 mpirun -np 2 "$T" run "$R" --set steps=4 --set every=0 \
    --eval-every 0 --peak-gflops 100 --dp 2 --device cuda --timeout 2 --out "$tmp/slow" \
    >"$tmp/slow.log" 2>&1
rc=$? took=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "did not complete within 2 s: rank 1 (host [^)]*) did not answer" "$tmp/slow.log"; then
    ok "a rank far slower than --timeout on the device is named in ${took}s: $(grep -m1 'did not answer' "$tmp/slow.log")"
else
    bad "slow rank on the device: exit $rc after ${took}s"; grep -v '^\s*$' "$tmp/slow.log" | tail -6
fi

[ $fail -eq 0 ] && echo PASS || echo FAIL
exit $fail
