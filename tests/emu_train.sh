#!/usr/bin/env bash
# The trainer itself on the CUDA emulator (tests/cudaemu/): `--device cuda` end to end, the
# paths test_cuda_train does not reach (device selection, the training loop's use of the
# backend, checkpoints written from and read back into device memory, sampling with the
# device's KV-cache decoding), on the GPT-2- and Llama-shaped recipes of tests/checkpoint/:
#  1. fp32 on the device: every loss within 1e-4 relative of the CPU's;
#  2. bf16: within 2e-2 of the CPU's, and killed after a save then resumed, every later loss
#     and the final checkpoint bitwise those of an uninterrupted bf16 run;
#  3. a checkpoint written by the fp32 device run resumed on the CPU: the later losses within
#     1e-4 of the device run's;
#  4. greedy sampling from that checkpoint gives the same text on the device as on the CPU;
#  5. a device without a known peak rate reports no MFU (it printed "MFU inf%" before);
#  6. the tensor-core attention inside training (and cuDNN's, with its workspace in the plan
#     and allocated at the start, TR_CUDA_ATTENTION cudnn and auto), and recompute (below);
#  7. no device allocation once training has started, and every device byte predicted;
#  8. a bad TR_CUDA_ATTENTION is refused;
#  9. the planner's memory prediction is what the device arena holds (fp32 runs).
# usage: tests/emu_train.sh path/to/trainer_emu   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"


flavour() { # gpt | llama: checks 1 to 4 on tests/checkpoint/$1.lua
    local flavour=$1 t=$tmp/$1
    mkdir -p "$t"
    R=tests/checkpoint/$flavour.lua
    run() { "$T" run "$R" --set steps=12 --set every=4 --set keep=3 --eval-every 0 \
                --peak-gflops 100 "$@"; }
    run --device cpu --out "$t/$flavour-cpu" >"$t/cpu.log" 2>&1 ||
        { bad "$flavour: cpu run failed"; cat "$t/cpu.log"; return; }
    losses "$t/$flavour-cpu/metrics.jsonl" >"$t/cpu.l"

    # 1. fp32 on the device
    F=$tmp/$flavour-f32
    run --device cuda --precision fp32 --out "$F" >"$t/f32.log" 2>&1 ||
        { bad "$flavour: cuda fp32 run failed"; cat "$t/f32.log"; return; }
    grep -q "CUDA emulator" "$t/f32.log" && ok "$flavour: ran on the emulated device" ||
        { bad "$flavour: the log does not name the emulated device"; head -20 "$t/f32.log"; }
    losses "$F/metrics.jsonl" >"$t/f32.l"
    r=$(compare "$t/f32.l" "$t/cpu.l" 1e-4) && ok "$flavour: cuda fp32 vs cpu: $r (tol 1e-4)" ||
        bad "$flavour: cuda fp32 vs cpu: $r (tol 1e-4)"
    # the planner's memory prediction is the device arena's accounting
    python3 -c 'import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r]
sys.exit(0 if rows and all(r["memory_bytes"] == r["predicted_memory_bytes"] for r in rows) else 1)' \
        "$F/metrics.jsonl" && ok "$flavour: cuda fp32: device memory as predicted ($(grep -o '"memory_bytes": [0-9]*' "$F/metrics.jsonl" | tail -1))" ||
        bad "$flavour: cuda fp32: the device's memory is not the predicted"

    # 2. bf16, and an exact resume on the device
    A=$tmp/$flavour-bf-a
    run --device cuda --precision bf16 --out "$A" >"$t/a.log" 2>&1 ||
        { bad "$flavour: cuda bf16 run failed"; cat "$t/a.log"; return; }
    losses "$A/metrics.jsonl" >"$t/a.l"
    r=$(compare "$t/a.l" "$t/cpu.l" 2e-2) && ok "$flavour: cuda bf16 vs cpu: $r (tol 2e-2)" ||
        bad "$flavour: cuda bf16 vs cpu: $r (tol 2e-2)"
    B=$tmp/$flavour-bf-b
    TR_FAULT_KILL_AFTER_STEP=8 run --device cuda --precision bf16 --out "$B" >"$t/b.log" 2>&1
    [ "$(cat "$B/checkpoints/latest" 2>/dev/null)" = step_00000008 ] ||
        bad "$flavour: the bf16 run was not killed after the save of step 8"
    run --device cuda --precision bf16 --out "$B" --resume >"$t/b2.log" 2>&1 ||
        { bad "$flavour: bf16 resume failed"; cat "$t/b2.log"; }
    if diff "$t/a.l" <(losses "$B/metrics.jsonl") >/dev/null; then
        ok "$flavour: bf16 resumed from step 8: steps 9..12 bitwise those of the uninterrupted run"
    else
        bad "$flavour: bf16 losses differ after resume"
    fi
    cmp -s "$A/checkpoints/step_00000012/rank_00000.safetensors" \
        "$B/checkpoints/step_00000012/rank_00000.safetensors" &&
        ok "$flavour: bf16 final parameters and AdamW state bitwise equal" ||
        bad "$flavour: bf16 final checkpoints differ"

    # 3. the device's step-8 checkpoint resumed on the CPU
    X=$tmp/$flavour-x
    cp -r "$F" "$X"
    rm -rf "$X/checkpoints/step_00000012"
    echo step_00000008 >"$X/checkpoints/latest"
    run --device cpu --out "$X" --resume >"$t/x.log" 2>&1 ||
        { bad "$flavour: cpu resume of the device checkpoint failed"; cat "$t/x.log"; }
    losses "$X/metrics.jsonl" | awk '$1 > 8' >"$t/x.l"
    r=$(compare "$t/x.l" "$t/f32.l" 1e-4) &&
        ok "$flavour: device checkpoint resumed on the cpu: $r (tol 1e-4)" ||
        bad "$flavour: device checkpoint resumed on the cpu: $r (tol 1e-4)"

    # 4. greedy sampling: device KV-cache decoding against the CPU's
    "$T" sample "$F" --tokens 24 --temperature 0 --device cuda >"$t/s_gpu" 2>"$t/s_gpu.err" ||
        { bad "$flavour: sample on the device failed"; cat "$t/s_gpu.err"; }
    "$T" sample "$F" --tokens 24 --temperature 0 --device cpu >"$t/s_cpu" 2>"$t/s_cpu.err"
    [ -s "$t/s_gpu" ] && cmp -s "$t/s_gpu" "$t/s_cpu" &&
        ok "$flavour: greedy sample on the device = on the cpu ($(wc -c <"$t/s_gpu") bytes)" ||
        bad "$flavour: greedy samples differ: '$(head -c 80 "$t/s_gpu")' vs '$(head -c 80 "$t/s_cpu")'"
}

# 6. the tensor-core attention (the default for bf16 at head size 64) inside training: a GPT
#    with 2 heads of 64, on the default kernels and on the CUDA-core ones (TR_CUDA_ATTENTION=
#    simple): both within bf16 tolerance of the CPU, and not bitwise equal to each other (so
#    the two runs did take different kernels)
sed -e 's/heads = 4/heads = 2/' -e "s|\"\\.\\./\\.\\./data/|\"$PWD/data/|" tests/checkpoint/gpt.lua >"$tmp/hd64.lua"
attention() { # check 6
    hd64() { "$T" run "$tmp/hd64.lua" --set steps=6 --set width=128 --set every=0 --eval-every 0 \
                 --peak-gflops 100 "$@"; }
    hd64 --device cpu --out "$tmp/hd64-cpu" >"$tmp/h.log" 2>&1 || { bad "hd64 cpu run failed"; cat "$tmp/h.log"; }
    hd64 --device cuda --out "$tmp/hd64-tc" >"$tmp/h.log" 2>&1 || { bad "hd64 tc run failed"; cat "$tmp/h.log"; }
    TR_CUDA_ATTENTION=simple hd64 --device cuda --out "$tmp/hd64-simple" >"$tmp/h.log" 2>&1 ||
        { bad "hd64 simple run failed"; cat "$tmp/h.log"; }
    for k in cpu tc simple; do losses "$tmp/hd64-$k/metrics.jsonl" >"$tmp/hd64-$k.l"; done
    r=$(compare "$tmp/hd64-tc.l" "$tmp/hd64-cpu.l" 2e-2) && ok "hd 64, tensor-core attention vs cpu: $r (tol 2e-2)" ||
        bad "hd 64, tensor-core attention vs cpu: $r (tol 2e-2)"
    r=$(compare "$tmp/hd64-simple.l" "$tmp/hd64-cpu.l" 2e-2) && ok "hd 64, CUDA-core attention vs cpu: $r (tol 2e-2)" ||
        bad "hd 64, CUDA-core attention vs cpu: $r (tol 2e-2)"
    cmp -s "$tmp/hd64-tc.l" "$tmp/hd64-simple.l" && bad "hd 64: the tc and simple runs are bitwise equal (same kernels?)" ||
        ok "hd 64: the two attention kernels gave different bits, as they should"
    #    and on cuDNN's attention (the emulated cuDNN, tests/cudaemu/emu_cudnn.cc) where this
    #    build has it: TR_CUDA_ATTENTION=cudnn within bf16 tolerance of ours
    #    (cudnn and auto: cuDNN's plans' workspace in the plan, allocated at the start)
    if TR_EMU_STATS=1 TR_CUDA_ATTENTION=cudnn hd64 --device cuda --out "$tmp/hd64-cudnn" >"$tmp/h.log" 2>&1; then
        losses "$tmp/hd64-cudnn/metrics.jsonl" >"$tmp/hd64-cudnn.l"
        r=$(compare "$tmp/hd64-cudnn.l" "$tmp/hd64-tc.l" 2e-2) && ok "hd 64, cuDNN attention vs ours: $r (tol 2e-2)" ||
            bad "hd 64, cuDNN attention vs ours: $r (tol 2e-2)"
        memory_exact "$tmp/h.log" "hd 64, cuDNN attention"
        TR_EMU_STATS=1 TR_CUDA_ATTENTION=auto hd64 --device cuda --out "$tmp/hd64-auto" >"$tmp/h.log" 2>&1 ||
            { bad "hd64 auto run failed"; cat "$tmp/h.log"; }
        memory_exact "$tmp/h.log" "hd 64, attention auto"
    elif grep -q "no cuDNN" "$tmp/h.log"; then
        echo "     (no cuDNN in this build: cuDNN attention not checked)"
    else
        bad "hd64 cudnn run failed"; cat "$tmp/h.log"
    fi

    #    Recompute must not change the device's losses by a bit: "full" in bf16 (its repeated
    #    forwards run the same kernels on the same inputs), "selective" in fp32 (in bf16 it gives
    #    different bits by design: without recompute the GELU runs in the product's epilogue on
    #    the fp32 accumulator, while selective recompute keeps the product and the GELU apart so
    #    that the backward's recomputed activation equals the forward's)
    hd64 --device cuda --precision fp32 --out "$tmp/hd64-f32" >"$tmp/h.log" 2>&1 ||
        { bad "hd64 fp32 run failed"; cat "$tmp/h.log"; }
    losses "$tmp/hd64-f32/metrics.jsonl" >"$tmp/hd64-f32.l"
    for rc in full:bf16:tc selective:fp32:f32; do
        IFS=: read -r level prec base <<<"$rc"
        sed "s/^train { /train { recompute = \"$level\", /" "$tmp/hd64.lua" >"$tmp/hd64_$level.lua"
        grep -q "recompute = \"$level\"" "$tmp/hd64_$level.lua" || bad "could not set recompute in the recipe"
        "$T" run "$tmp/hd64_$level.lua" --set steps=6 --set width=128 --set every=0 --eval-every 0 \
            --peak-gflops 100 --device cuda --precision "$prec" --out "$tmp/hd64-$level" >"$tmp/h.log" 2>&1 ||
            { bad "hd64 recompute=$level run failed"; cat "$tmp/h.log"; }
        losses "$tmp/hd64-$level/metrics.jsonl" >"$tmp/hd64-$level.l"
        [ -s "$tmp/hd64-$level.l" ] && cmp -s "$tmp/hd64-$level.l" "$tmp/hd64-$base.l" &&
            ok "hd 64, $prec, recompute = \"$level\" on the device: losses bitwise those without recompute" ||
            bad "hd 64, $prec, recompute = \"$level\" on the device: losses differ from those without recompute"
    done
}

# LOG NAME: every device byte of the run whose log (TR_EMU_STATS=1) is LOG is in the plan: its
# line "device memory: predicted X, allocated X" with equal byte counts, which are what the
# emulator's cudaMalloc gave (a cudaMalloc after step 1 would have failed the run:
# tests/cudaemu/emu_device.cc)
memory_exact() {
    local pb ab eb
    read -r pb ab <<<"$(sed -n 's/^device memory: predicted .*(\([0-9]*\) and \([0-9]*\) bytes.*/\1 \2/p' "$1")"
    eb=$(sed -n 's/^cuda emulator stats: .* cudaMalloc (\([0-9]*\) bytes).*/\1/p' "$1")
    if [ -n "$pb" ] && [ "$pb" = "$ab" ] && [ "$ab" = "$eb" ]; then
        ok "$2: device memory predicted $pb bytes, allocated $ab, the emulator's cudaMalloc $eb"
    else
        bad "$2: device memory predicted '$pb' bytes, allocated '$ab', the emulator's cudaMalloc '$eb'"
        grep "memory" "$1"
    fi
}

allocations() { # checks 7, 5 and 8
    # 7. the device memory is allocated before training: runs of 2 and 5 steps make the same
    #    cudaMalloc calls (the emulator counts them, TR_EMU_STATS); the per-step launches,
    #    synchronizations and copies are printed for whoever tunes the step on a GPU
    stats() { # steps -> the emulator's counts, one per line: launches mallocs syncs h2d d2h
        # (no --peak-gflops: the 2-step run is also check 5's run without a peak)
        TR_EMU_STATS=1 "$T" run tests/checkpoint/gpt.lua --set steps="$1" --set every=0 --eval-every 0 \
            --device cuda --out "$tmp/stats$1" >"$tmp/stats$1.log" 2>&1
        sed -n 's/^cuda emulator stats: \([0-9]*\) launches, \([0-9]*\) cudaMalloc.* \([0-9]*\) synchronizations, \([0-9]*\) host-to-device.*copies (.*, \([0-9]*\) device-to-host.*/\1 \2 \3 \4 \5/p' \
            "$tmp/stats$1.log"
    }
    read -r l2 m2 s2 h2 d2 <<<"$(stats 2)"
    read -r l5 m5 s5 h5 d5 <<<"$(stats 5)"
    if [ -n "$m2" ] && [ "$m2" = "$m5" ]; then
        ok "no device allocation during training: $m2 cudaMalloc calls for 2 steps and for 5"
        echo "     per step: $(((l5 - l2) / 3)) kernel launches, $(((s5 - s2) / 3)) synchronizations," \
             "$(((h5 - h2) / 3)) host-to-device and $(((d5 - d2) / 3)) device-to-host copies"
    else
        bad "cudaMalloc calls: '$m2' for 2 steps, '$m5' for 5 (the device memory must be sized before training)"
    fi
    #    and every device byte is in the plan
    memory_exact "$tmp/stats5.log" "gpt.lua"
    local ab
    ab=$(sed -n 's/^device memory: predicted .*(\([0-9]*\) and \([0-9]*\) bytes.*/\2/p' "$tmp/stats5.log")
    #    and the device's own count (cudaMemGetInfo, which tests/gpu/check.sh compares with the
    #    plan's figure and the runtime's reserve on a GPU): on the emulated device, which has no
    #    context or library buffers, exactly what was allocated
    local ub
    ub=$(sed -n 's/^device memory: in use on rank 0.s device .*(cudaMemGetInfo: \([0-9]*\) bytes).*/\1/p' "$tmp/stats5.log")
    [ -n "$ub" ] && [ "$ub" = "$ab" ] &&
        ok "device memory in use (cudaMemGetInfo): $ub bytes, what was allocated" ||
        { bad "device memory in use (cudaMemGetInfo): '$ub', allocated '$ab'"; grep "in use" "$tmp/stats5.log"; }
    # 5. a GPU missing from the peak table (the emulator is one): no MFU, rather than "inf" (the
    #    2-step run of 7, which gives no --peak-gflops)
    if [ -s "$tmp/stats2/metrics.jsonl" ] && grep -q "peak unknown for this device: no MFU" "$tmp/stats2.log" &&
        grep -q "MFU n/a" "$tmp/stats2.log" &&
        python3 -c 'import json,sys; assert all(json.loads(l).get("mfu", None) is None for l in open(sys.argv[1]))' \
            "$tmp/stats2/metrics.jsonl"; then
        ok "unknown device peak: the log says so, MFU n/a, metrics.jsonl has \"mfu\": null"
    else
        bad "unknown device peak:"; grep -i mfu "$tmp/stats2.log" | head -3; head -2 "$tmp/stats2/metrics.jsonl"
    fi
    # 8. a misspelt kernel choice is refused in one line, not silently ignored
    TR_CUDA_ATTENTION=simpel "$T" run "$tmp/hd64.lua" --set steps=1 --set width=128 --set every=0 \
        --eval-every 0 --peak-gflops 100 --device cuda --out "$tmp/bogus" >/dev/null 2>"$tmp/bogus.err"
    rc=$?
    [ $rc -ne 0 ] && [ "$(grep -c . "$tmp/bogus.err")" -eq 1 ] &&
        grep -qx "trainer run: TR_CUDA_ATTENTION must be tc, simple, cudnn or auto, got 'simpel'" "$tmp/bogus.err" &&
        ok "TR_CUDA_ATTENTION=simpel: exit $rc, $(cat "$tmp/bogus.err")" ||
        { bad "TR_CUDA_ATTENTION=simpel: exit $rc, stderr:"; cat "$tmp/bogus.err"; }
}

# Two lanes on two cores (the emulator runs a process's kernels on one thread); each lane's
# lines are printed once it is done, and a FAIL in either fails the test.
{ flavour gpt; attention; } >"$tmp/lane1" 2>&1 &
{ flavour llama; allocations; } >"$tmp/lane2" 2>&1 &
wait
cat "$tmp/lane1" "$tmp/lane2"
grep -q '^FAIL' "$tmp/lane1" "$tmp/lane2" && fail=1
[ $fail -eq 0 ] && echo PASS || echo FAIL
exit $fail
