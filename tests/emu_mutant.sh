#!/usr/bin/env bash
# A mutant of the device code on the CUDA emulator (tests/cudaemu/): the wait at one site
# (TR_WAIT in model/mutant.h, named by TR_EMU_MUTANT) is left out, and the emulator's
# adversarial scheduler (deferred stream work in a seeded random order, NCCL results that
# appear only at completion) must catch it. A short training run (tests/checkpoint/gpt.lua,
# one block, 2 steps) goes once as written and once with the mutant, with the same seed; the
# mutant is caught when
#  - the emulator names a hazard (a write to an NCCL operation's buffer while it was in flight), or
#  - the run ends with an error of the trainer's own (a non-finite loss), or
#  - its losses, gradient norms or final parameters (TR_DUMP_PARAMS) differ from the clean run's
#    at all: on the emulator a correct program's numbers do not depend on the order of streams
#    (also when the run crashes afterwards: reported with the exit status).
# It must also have been reached (the emulator says it skipped a wait). A crash without a named
# hazard is not a clean catch. Up to 3 scheduler seeds are tried.
# A site that no training run reaches in a way that matters is tried on a test program
# instead, run from tests/, which must pass as written and with the mutant end in a named
# hazard or a failed check: NP "kernels", tests/gpu/test_cuda_kernels.c (cuda.ms_tables: the
# optimizer's tables never change within a run; the kernel tests change them between calls);
# NP "comm", tests/gpu/test_comm_device.c on 2 ranks, staged (comm.staged_h2d: a training
# run's next staged operation copies to the host first, which waits for the copy anyway; the
# test's receives one after another do not).
# usage: tests/emu_mutant.sh path/to/trainer_emu SITE NP [VAR=value...] [trainer flags...]
#        tests/emu_mutant.sh path/to/test_cuda_kernels_emu SITE kernels
#        tests/emu_mutant.sh path/to/test_comm_device_emu SITE comm
# (from the repo root; VAR=value: the environment of both runs)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
site=$2 np=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
if [ "$np" != kernels ] && { [ "$np" = comm ] || [ "$np" -gt 1 ]; } && ! command -v mpirun >/dev/null; then
    echo "skip: no mpirun"
    exit 77
fi
if [ "$np" = kernels ] || [ "$np" = comm ]; then
    prog=("$T") what="the kernel tests"
    [ "$np" = comm ] && prog=(env TR_COMM_DEVICE=staged mpirun -np 2 "$T") what="the staged comm test"
    for seed in 1 2 3; do
        (cd tests && TR_EMU_SEED=$seed timeout 600 "${prog[@]}") >"$tmp/clean.log" 2>&1 ||
            { echo "FAIL $site: $what fail without the mutant (seed $seed):"; grep -a "^FAIL" "$tmp/clean.log" | head -3; tail -2 "$tmp/clean.log"; exit 1; }
        (cd tests && TR_EMU_SEED=$seed TR_EMU_MUTANT="$site" timeout 600 "${prog[@]}") >"$tmp/mutant.log" 2>&1
        rc=$?
        grep -q "cuda emulator: mutant $site: skipping its wait" "$tmp/mutant.log" ||
            { echo "FAIL $site: the mutant was never reached by $what"; exit 1; }
        how=$(grep -a -m1 -o "cuda emulator: hazard:.*\|^FAIL .*" "$tmp/mutant.log")
        if [ -n "$how" ]; then
            echo "ok   $site caught by $what (seed $seed, exit $rc): $how"
            exit 0
        fi
        echo "     $site: seed $seed: not caught by $what (exit $rc)"
    done
    echo "FAIL $site: NOT caught with seeds 1-3"
    exit 1
fi
R=tests/checkpoint/gpt.lua
run() { # name [env...]: one run; its exit status
    local name=$1
    shift
    local launch=("$T")
    [ "$np" -gt 1 ] && launch=(mpirun -np "$np" "$T")
    env "${envs[@]}" "$@" TR_DUMP_PARAMS="$tmp/$name.params" timeout 300 "${launch[@]}" run "$R" \
        --set steps=2 --set every=0 --set layers=1 --set width=16 --set seq=16 --eval-every 0 \
        --peak-gflops 100 --device cuda --out "$tmp/$name" "${flags[@]}" >"$tmp/$name.log" 2>&1
}
numbers() { # the losses and gradient norms of a run, exactly
    python3 -c 'import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    if "step" in m: print(m["step"], repr(m["loss"]), repr(m.get("grad_norm")))' "$1/metrics.jsonl" 2>/dev/null
}
envs=()
while [ $# -gt 0 ] && [[ "$1" =~ ^[A-Z_][A-Z0-9_]*= ]]; do
    envs+=("$1")
    shift
done
flags=("$@")
for seed in 1 2 3; do
    if ! run clean$seed TR_EMU_SEED=$seed; then
        echo "FAIL $site: the run without the mutant failed (seed $seed):"
        tail -5 "$tmp/clean$seed.log"
        exit 1
    fi
    run mutant$seed TR_EMU_SEED=$seed TR_EMU_MUTANT="$site"
    rc=$? log=$tmp/mutant$seed.log
    if ! grep -q "cuda emulator: mutant $site: skipping its wait" "$log"; then
        echo "FAIL $site: the mutant was never reached (no wait skipped at that site)"
        exit 1
    fi
    if grep -q "cuda emulator: hazard:" "$log"; then
        echo "ok   $site caught (seed $seed): $(grep -m1 "cuda emulator: hazard:" "$log")"
        exit 0
    fi
    a=$(numbers "$tmp/clean$seed") b=$(numbers "$tmp/mutant$seed")
    if [ "$a" != "$b" ]; then
        first=$(diff <(echo "$a") <(echo "$b") | grep '^>' | head -1 | cut -c3-)
        was=$(diff <(echo "$a") <(echo "$b") | grep '^<' | head -1 | cut -c3-)
        how="wrong numbers: step loss grad_norm: ${first:-missing} (clean: ${was:-missing})"
        [ $rc -ne 0 ] && how="$how, and then the run failed (exit $rc)"
        echo "ok   $site caught (seed $seed): $how"
        exit 0
    fi
    if [ $rc -ne 0 ] && [ $rc -lt 124 ]; then
        echo "ok   $site caught (seed $seed): the run failed (exit $rc): $(grep -m1 -i "error\|not finite\|nan" "$log" || tail -1 "$log")"
        exit 0
    fi
    if [ $rc -ne 0 ]; then
        echo "FAIL $site: the mutant crashed (exit $rc) without a named hazard (seed $seed):"
        tail -5 "$log"
        exit 1
    fi
    if ! cmp -s "$tmp/clean$seed.params" "$tmp/mutant$seed.params"; then
        echo "ok   $site caught (seed $seed): the final parameters differ from the clean run's"
        exit 0
    fi
    echo "     $site: seed $seed: not caught (same numbers, no hazard)"
done
echo "FAIL $site: NOT caught with seeds 1-3"
exit 1
