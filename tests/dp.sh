#!/usr/bin/env bash
# Data parallelism with real MPI processes (mpirun --oversubscribe on this machine): on 2 and 4
# ranks, at ZeRO 0, 1, 2 and 3, and with gradient accumulation, the loss and gradient norm of
# every step and the final parameters equal the single-process run with the same global batch
# (within the limits a reordering of float32 sums stays within on any CPU: tests/lib.sh; so
# does the single process in micro-batches of 1, 2 and 4);
# per rank, ZeRO-1 keeps 1/N of the optimizer state, ZeRO-2 1/N of the gradient and ZeRO-3 1/N
# of the parameters (as allocated, measured); checkpoints saved in one layout resume in
# another; ZeRO-1 and 2 bring the updated parameters back during the next forward, each bucket
# waited for by the op that reads it; a rank that dies makes the job end within the timeout
# with a line naming a rank; the benchmarks' blocking baselines compute the same.
# TR_TEST_QUICK=1 (the sanitizer build in CI): fewer resumes.
set -u
. "$(dirname "$0")/lib.sh"
T="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
mpi_env
R=tests/recipes_good/dp_tiny.lua

run() { # name np zero micro [more --set ...]
    local name=$1 np=$2 zero=$3 micro=$4
    shift 4
    local cmd=("$T" run "$R" --set zero="$zero" --set micro="$micro" --out "$tmp/$name" --peak-gflops 10 "$@")
    if [ "$np" -eq 1 ]; then
        TR_DUMP_PARAMS="$tmp/$name.params" "${cmd[@]}" >"$tmp/$name.log" 2>&1
    else
        TR_DUMP_PARAMS="$tmp/$name.params" timeout 300 mpirun -np "$np" "${cmd[@]}" >"$tmp/$name.log" 2>&1
    fi || { echo "FAIL $name exited $?"; tail -5 "$tmp/$name.log"; fail=1; return 1; }
}

run single 1 0 0 || exit 1
# the same global batch of 8 sequences in micro-batches of 1, 2 and 4 (8, 4 and 2 accumulation
# steps: the per-rank shapes of the runs below) sums the same gradients in other orders
for m in 1 2 4; do
    run "single_m$m" 1 0 "$m" || continue
    if e=$(cmp_run "$tmp/single_m$m" "$tmp/single"); then
        echo "ok   one process in micro-batches of $m equals micro-batches of 8: $e"
    else
        echo "FAIL one process in micro-batches of $m differs from micro-batches of 8: $e"; fail=1
    fi
done
# --zero on the command line overrides the recipe's parallel.zero (it was once ignored by run)
if run zero_flag 2 0 0 --zero 2; then
    grep -q "data parallel, ZeRO-2" "$tmp/zero_flag.log" && echo "ok   run --zero 2 overrides the recipe's zero = 0" ||
        { echo "FAIL run --zero 2 was not applied"; grep -i zero "$tmp/zero_flag.log" | head -3; fail=1; }
fi
for cfg in "2 0 0" "2 1 0" "4 0 0" "4 1 0" "2 0 2" "2 1 1" "2 2 0" "4 2 0" "2 2 1" "1 3 0" "2 3 0" "4 3 0" "2 3 1"; do
    set -- $cfg
    name="np$1_zero$2_micro$3"
    run "$name" "$1" "$2" "$3" --set bucket=16 || continue
    if [ "$2" -eq 3 ] && [ "$1" -gt 1 ] && ! grep -q "ZeRO-3: [1-9][0-9]* bucket all-gathers" "$tmp/$name.log"; then
        echo "FAIL $name: no ZeRO-3 parameter gathers reported"; fail=1
    fi
    # ZeRO-1, 2: the parameters other ranks updated come back during the next forward, each
    # bucket waited for by the op that reads it (not all at once after the update)
    if [ "$1" -gt 1 ] && { [ "$2" -eq 1 ] || [ "$2" -eq 2 ]; }; then
        line=$(grep "^ZeRO-$2: " "$tmp/$name.log")
        if [[ "$line" =~ bringing\ back\ ([0-9]+)\ buckets,\ ([0-9]+)\ of\ them\ waited\ for\ by\ the\ forward ]] &&
            [ "${BASH_REMATCH[1]}" -gt 0 ] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ]; then
            echo "ok   $name: every refreshed bucket waited for by the forward op that reads it (${BASH_REMATCH[2]})"
        else
            echo "FAIL $name: the parameter refresh did not overlap the forward: ${line:-no ZeRO-$2 line}"; fail=1
        fi
    fi
    if e=$(cmp_run "$tmp/$name" "$tmp/single"); then
        echo "ok   $name: equal to one process: $e"
    else
        echo "FAIL $name: differs from one process: $e"; fail=1
    fi
    [ "$1" -eq 1 ] || grep -q '"comm_hidden"' "$tmp/$name/metrics.jsonl" || { echo "FAIL $name: no comm_hidden metric"; fail=1; }
done

# the vocabulary padded as on a GPU (rows of the tied embedding past 256, up to 384): buckets,
# pieces and gathers include the padding rows; still the single process's losses and weights
for z in 2 3; do
    name="np2_zero${z}_padvocab"
    TR_PAD_VOCAB=384 run "$name" 2 "$z" 0 --set bucket=16 || continue
    if e=$(cmp_run "$tmp/$name" "$tmp/single"); then
        echo "ok   $name: equal to one process: $e"
    else
        echo "FAIL $name: $e"; fail=1
    fi
done

# the benchmarks' blocking baselines (TR_DP_SYNC_REDUCE, TR_DP_SYNC_REFRESH: each reduction
# completed as it starts, the refresh right after the update) compute the same: ZeRO-0's
# all-reduces and ZeRO-2's reduce-scatters, with accumulation (a reduction every micro-step)
for cfg in "0 0" "1 1" "2 1"; do
    set -- $cfg
    name="np2_zero$1_micro$2_sync"
    TR_DP_SYNC_REDUCE=1 TR_DP_SYNC_REFRESH=1 run "$name" 2 "$1" "$2" --set bucket=16 || continue
    if e=$(cmp_run "$tmp/$name" "$tmp/single"); then
        echo "ok   $name: every reduction and refresh blocking, equal to one process: $e"
    else
        echo "FAIL $name: $e"; fail=1
    fi
done

# ZeRO-3 under full and selective recompute (the repeated forwards gather again), and sampling
# at the end (every rank takes part: the same tokens as one process)
run single_sample 1 0 0 --set sample=40 || exit 1
for rc in full selective; do
    name="np2_zero3_$rc"
    run "$name" 2 3 0 --set bucket=16 --set recompute=$rc --set sample=40 || continue
    e=$(cmp_run "$tmp/$name" "$tmp/single")
    if [ $? -eq 0 ] && cmp -s "$tmp/$name/sample.txt" "$tmp/single_sample/sample.txt"; then
        echo "ok   $name: the 40-token sample and the run equal one process: $e"
    else
        echo "FAIL $name: $e, or the sample differs"; fail=1
    fi
done
# the repeated forward of full recompute keeps its buckets for the backward that follows it:
# no more gathers than without recompute
gathers() { grep -o "ZeRO-3: [0-9]* bucket all-gathers" "$tmp/$1.log" | awk '{print $2}'; }
g0=$(gathers np2_zero3_micro0) gf=$(gathers np2_zero3_full)
if [ -n "$g0" ] && [ -n "$gf" ] && [ "$gf" -le "$g0" ]; then
    echo "ok   ZeRO-3 with full recompute: $gf bucket gathers, as many as without recompute ($g0)"
else
    echo "FAIL ZeRO-3 with full recompute gathers ${gf:-?} buckets against ${g0:-?} without"; fail=1
fi

# ZeRO-1 keeps 1/N of the optimizer state per rank (what each process allocated)
# a measured figure of a run's memory.json (read as JSON: "predicted" repeats the keys)
mem() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$tmp/$1/memory.json" "$2"; }
opt() { mem "$1" optimizer; }
for np in 2 4; do
    o0=$(opt "np${np}_zero0_micro0") o1=$(opt "np${np}_zero1_micro0")
    if [ -n "$o0" ] && [ -n "$o1" ] && [ $((o1 * np)) -ge "$o0" ] && [ $((o1 * np)) -le $((o0 + 64 * np * 8)) ]; then
        echo "ok   ZeRO-1 on $np ranks: optimizer state $o1 bytes per rank, 1/$np of ZeRO-0's $o0 (up to padding)"
    else
        echo "FAIL ZeRO-1 on $np ranks: optimizer bytes $o1 vs ZeRO-0 $o0"; fail=1
    fi
done

# ZeRO-2 keeps 1/N of the gradient (the reduced pieces) plus bucket buffers bounded by the
# bucket size, not the model's (what each process allocated; 8 blocks to make that visible):
# the ring's buffers, sized at the start for the largest bucket (parallel/dp.c: plan_buffers),
# are the same for a model of twice the blocks
gr() { mem "$1" "$2"; }
for np in 2 4; do
    run "mem_z0_np$np" "$np" 0 0 --set layers=8 --set steps=3 &&
        run "mem_z2_np$np" "$np" 2 0 --set layers=8 --set steps=3 --set bucket=16 &&
        run "mem_z2_np${np}_16" "$np" 2 0 --set layers=16 --set steps=3 --set bucket=16 || continue
    g0=$(gr "mem_z0_np$np" grads) g2=$(gr "mem_z2_np$np" grads) b2=$(gr "mem_z2_np$np" grad_buffers)
    b16=$(gr "mem_z2_np${np}_16" grad_buffers)
    kept=$((g2 - b2))
    if [ $((kept * np)) -ge "$g0" ] && [ $((kept * np)) -le $((g0 + 4096 * np)) ] && [ "$b2" -gt 0 ] && [ "$b16" = "$b2" ]; then
        echo "ok   ZeRO-2 on $np ranks: gradient pieces $kept bytes per rank = 1/$np of ZeRO-0's $g0 (up to padding), bucket buffers $b2 (sized at the start; with 16 blocks $b16)"
    else
        echo "FAIL ZeRO-2 on $np ranks: pieces $kept, buffers $b2 (with 16 blocks $b16), ZeRO-0 gradients $g0"; fail=1
    fi
done

# ZeRO-3 keeps 1/N of the parameters (master and working copy: one array in fp32) plus the
# gathered buckets of about two ops at a time, bounded by the bucket size, not the model's
for np in 2 4; do
    run "mem_z3_np$np" "$np" 3 0 --set layers=8 --set steps=3 --set bucket=16 || continue
    p0=$(gr "mem_z0_np$np" params) p3=$(gr "mem_z3_np$np" params) b3=$(gr "mem_z3_np$np" param_buffers)
    kept=$((p3 - b3))
    if [ $((kept * np)) -ge "$p0" ] && [ $((kept * np)) -le $((p0 + 4096 * np)) ] && [ "$b3" -gt 0 ] && [ $((b3 * 2)) -lt "$p0" ]; then
        echo "ok   ZeRO-3 on $np ranks: parameter pieces $kept bytes per rank = 1/$np of ZeRO-0's $p0 (up to padding), gathered buckets $b3 (sized at the start)"
    else
        echo "FAIL ZeRO-3 on $np ranks: pieces $kept, gathered $b3, ZeRO-0 parameters $p0"; fail=1
    fi
done

# cross-layout resume: 2 ranks at ZeRO-1 (and at ZeRO-2), 4 ranks at ZeRO-3, save at step 10
# and are killed, then the run goes on in another layout; steps 11-20 and the final
# parameters equal the uninterrupted process. TR_TEST_QUICK=1 (the sanitizer build in CI): half
# of each save's resumes, every resumed layout at least once.
quick=${TR_TEST_QUICK:-0} j=0
for src in "2 1" "2 2" "4 3"; do
    j=$((j + 1))
    set -- $src
    snp=$1 saved=$2
    mkdir -p "$tmp/base$saved"
    TR_FAULT_KILL_AFTER_STEP=10 timeout 300 mpirun -np "$snp" "$T" run "$R" --set zero=$saved --set ckpt=10 \
        --set bucket=16 --out "$tmp/base$saved/run" --peak-gflops 10 >"$tmp/base$saved.log" 2>&1
    [ -d "$tmp/base$saved/run/checkpoints/step_00000010" ] ||
        { echo "FAIL no ZeRO-$saved checkpoint at step 10"; tail -5 "$tmp/base$saved.log"; fail=1; continue; }
    # every rank wrote its own shard: one file per rank, none holding much more than 1/N
    ck="$tmp/base$saved/run/checkpoints/step_00000010"
    nf=$(ls "$ck"/rank_*.safetensors | wc -l)
    total=$(cat "$ck"/rank_*.safetensors | wc -c) biggest=$(wc -c "$ck"/rank_*.safetensors | grep -v total | sort -n | tail -1 | awk '{print $1}')
    if [ "$nf" -eq "$snp" ] && [ $((biggest * snp)) -le $((total * 5 / 4)) ] && ! ls "$ck" | grep -q part; then
        echo "ok   ZeRO-$saved on $snp ranks: $nf checkpoint shards, the largest $biggest of $total bytes"
    else
        echo "FAIL ZeRO-$saved on $snp ranks: $nf shard files, largest $biggest of $total bytes"; ls -la "$ck"; fail=1
    fi
    k=0
    for cfg in "1 0" "4 1" "2 0" "4 2" "2 1" "2 3"; do
        k=$((k + 1))
        [ "$quick" = 1 ] && [ $(((j + k) % 2)) -ne 0 ] && continue
        set -- $cfg
        name="resume${saved}_np$1_zero$2"
        cp -r "$tmp/base$saved/run" "$tmp/$name"
        cmd=("$T" run "$R" --set zero="$2" --set ckpt=10 --set bucket=16 --out "$tmp/$name" --resume --peak-gflops 10)
        if [ "$1" -eq 1 ]; then TR_DUMP_PARAMS="$tmp/$name.params" "${cmd[@]}" >"$tmp/$name.log" 2>&1
        else TR_DUMP_PARAMS="$tmp/$name.params" timeout 300 mpirun -np "$1" "${cmd[@]}" >"$tmp/$name.log" 2>&1; fi ||
            { echo "FAIL $name exited $?"; tail -5 "$tmp/$name.log"; fail=1; continue; }
        if e=$(cmp_run "$tmp/$name" "$tmp/single"); then
            echo "ok   saved on $snp ranks at ZeRO-$saved, resumed on $1 at ZeRO-$2: equal to one process: $e"
        else
            echo "FAIL saved at ZeRO-$saved, resumed on $1 ranks at ZeRO-$2: $e"; fail=1
        fi
    done
done

# a damaged shard: 2 ranks at ZeRO-2 save at steps 5 and 10 and are killed; a byte of rank 1's
# step-10 file is flipped; resuming on 2 ranks, the rank(s) reading that block find it, all go
# back to step 5, and the run still ends like the uninterrupted process
mkdir -p "$tmp/dmg"
TR_FAULT_KILL_AFTER_STEP=10 timeout 300 mpirun -np 2 "$T" run "$R" --set zero=2 --set ckpt=5 --set bucket=16 \
    --out "$tmp/dmg/run" --peak-gflops 10 >"$tmp/dmg.log" 2>&1
f="$tmp/dmg/run/checkpoints/step_00000010/rank_00001.safetensors"
if [ -f "$f" ] && [ -d "$tmp/dmg/run/checkpoints/step_00000005" ]; then
    python3 - "$f" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read()); b[-100] ^= 0x10; open(p, 'wb').write(b)
PY
    TR_DUMP_PARAMS="$tmp/dmg/run.params" timeout 300 mpirun -np 2 "$T" run "$R" --set zero=2 --set ckpt=5 --set bucket=16 \
        --out "$tmp/dmg/run" --resume --peak-gflops 10 >"$tmp/dmg2.log" 2>&1
    rc=$? e=""
    if [ $rc -eq 0 ] && grep -q "skipping checkpoint .*step_00000010: damaged (found by [12] rank(s))" "$tmp/dmg2.log" &&
        grep -q "rank [01]: checkpoint .*step_00000010: .*rank_00001.safetensors: tensor .* fails its checksum" "$tmp/dmg2.log" &&
        grep -q "resuming from .*step_00000005" "$tmp/dmg2.log" &&
        e=$(cmp_run "$tmp/dmg/run" "$tmp/single"); then
        echo "ok   a damaged shard sends every rank back to step 5: $(grep -m1 'fails its checksum' "$tmp/dmg2.log" | cut -c1-150); the run equals one process: $e"
    else
        echo "FAIL damaged shard: exit $rc ${e:-}"; tail -8 "$tmp/dmg2.log"; fail=1
    fi
else
    echo "FAIL no checkpoints at steps 5 and 10 for the damaged-shard test"; tail -5 "$tmp/dmg.log"; fail=1
fi

# ranks that read different data at the same path refuse to start (rank 1 sees another file
# there through a private mount namespace; skipped where namespaces are not allowed)
sed 's|text = "[^"]*"|text = "corpus.txt"|' "$R" >"$tmp/diffdata.lua"
head -c 200000 data/corpora/tinyshakespeare.txt >"$tmp/corpus.txt"
head -c 200000 data/corpora/tinyshakespeare.txt | tr 'a-z' 'b-za' >"$tmp/alt.txt"
# a launcher under which rank 1 finds, at the path $3, what the others find at $2 (a private
# mount namespace): for the tests of ranks that disagree about files
rank1_sees() { # script source target
    cat >"$1" <<EOF
#!/bin/sh
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ]; then
    exec unshare -m --propagation private sh -c 'mount --bind "$2" "$3" && exec "\$0" "\$@"' "\$@"
fi
exec "\$@"
EOF
    chmod +x "$1"
}
rank1_sees "$tmp/wrap.sh" "$tmp/alt.txt" "$tmp/corpus.txt"
if unshare -m --propagation private sh -c "mount --bind '$tmp/alt.txt' '$tmp/corpus.txt'" 2>/dev/null; then
    timeout 120 mpirun -np 2 "$tmp/wrap.sh" "$T" run "$tmp/diffdata.lua" --out "$tmp/diffdata" --peak-gflops 10 >"$tmp/diffdata.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1: the data (sizes and sampled tokens) differs from rank 0's" "$tmp/diffdata.log" &&
        ! grep -q "^step" "$tmp/diffdata.log"; then
        echo "ok   ranks with different data refuse to start: $(grep -m1 'differs from rank 0' "$tmp/diffdata.log")"
    else
        echo "FAIL ranks with different data: exit $rc"; tail -5 "$tmp/diffdata.log"; fail=1
    fi
    # checkpoints need an output folder all ranks share: rank 1 sees another folder there
    mkdir -p "$tmp/unshared" "$tmp/elsewhere"
    rank1_sees "$tmp/wrap2.sh" "$tmp/elsewhere" "$tmp/unshared"
    timeout 120 mpirun -np 2 "$tmp/wrap2.sh" "$T" run "$R" --set ckpt=5 --out "$tmp/unshared" --peak-gflops 10 >"$tmp/unshared.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
        grep -q "^trainer run: rank 1: on .*, the output folder '$tmp/unshared' is not shared with rank 0" "$tmp/unshared.log" &&
        ! grep -q "^step" "$tmp/unshared.log"; then
        echo "ok   an output folder the ranks do not share is refused: $(grep -m1 'is not shared' "$tmp/unshared.log")"
    else
        echo "FAIL unshared output folder: exit $rc"; tail -5 "$tmp/unshared.log"; fail=1
    fi
    # an output folder rank 1 sees read-only: refused at start, not at the first save (rank 0
    # would wait out --timeout for rank 1's part of the checkpoint)
    mkdir -p "$tmp/rofolder"
    cat >"$tmp/wrap3.sh" <<EOF
#!/bin/sh
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ]; then
    exec unshare -m --propagation private sh -c 'mount --bind "$tmp/rofolder" "$tmp/rofolder" && mount -o remount,bind,ro "$tmp/rofolder" && exec "\$0" "\$@"' "\$@"
fi
exec "\$@"
EOF
    chmod +x "$tmp/wrap3.sh"
    timeout 120 mpirun -np 2 "$tmp/wrap3.sh" "$T" run "$R" --set ckpt=5 --out "$tmp/rofolder" --peak-gflops 10 >"$tmp/ro.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
        grep -q "^trainer run: rank 1: on .*, cannot write in the output folder '$tmp/rofolder': Read-only file system" "$tmp/ro.log" &&
        ! grep -q "^step" "$tmp/ro.log"; then
        echo "ok   an output folder one rank cannot write is refused at start: $(grep -m1 'cannot write' "$tmp/ro.log")"
    else
        echo "FAIL read-only output folder on rank 1: exit $rc"; tail -5 "$tmp/ro.log"; fail=1
    fi
else
    echo "skip different data per rank, unshared output: mount namespaces are not allowed here"
fi

# ranks launched differently (MPMD): a flag that differs, a bad recipe on one rank, --resume on
# one rank. Each ends every rank at once with one line of ours (mpirun adds its own banner),
# no MPI error dump or crash, and leaves OUT's files alone
mpmd() { # name expected-line -- args of rank 0 -- args of rank 1
    local name=$1 pat=$2
    shift 3
    local a=() b=()
    while [ "$1" != -- ]; do a+=("$1"); shift; done
    shift
    b=("$@")
    local start=$(date +%s)
    timeout 120 mpirun -np 1 "$T" run "${a[@]}" : -np 1 env ${MPMD_ENV1:-} "$T" run "${b[@]}" \
        >"$tmp/$name.log" 2>&1
    local rc=$? took=$(( $(date +%s) - start ))
    local ours
    # ours: the trainer's error lines ("trainer...", "rank N: ..."); mpirun's banner, rank 0's
    # progress and the sanitizers' exit summaries are not; nothing may look like a crash or an
    # MPI error dump
    ours=$(grep -E "^(trainer|rank [0-9])" "$tmp/$name.log")
    if [ $rc -ne 0 ] && [ $took -le 60 ] && [ "$(echo "$ours" | wc -l)" -eq 1 ] &&
        echo "$ours" | grep -q -- "$pat" &&
        ! grep -Eq "Segmentation|backtrace|MPI_ERR|NBC_Progress|free\(\)|ERROR: AddressSanitizer" "$tmp/$name.log"; then
        echo "ok   $name: $ours (${took}s)"
    else
        echo "FAIL $name: exit $rc after ${took}s:"; sed 's/^/    /' "$tmp/$name.log" | head -12; fail=1
    fi
}
q="--timeout 20 --peak-gflops 10 --steps 2"
mpmd zero_differs "^trainer run: rank 1: the resolved recipe or a flag differs from rank 0's: 'zero = 1' here, 'zero = 0' on rank 0;" -- \
    "$R" $q --zero 0 --out "$tmp/zd" -- "$R" $q --zero 1 --out "$tmp/zd"
echo 'model {' >"$tmp/bad.lua"
mpmd bad_recipe_on_one "^rank 1: .*bad.lua:2: unexpected symbol" -- \
    "$R" $q --out "$tmp/br" -- "$tmp/bad.lua" $q --out "$tmp/br"
mpmd bad_flag_on_one "^trainer run: rank 1: --timeout needs a positive number of seconds, got 'abc'" -- \
    "$R" $q --out "$tmp/bf" -- "$R" $q --out "$tmp/bf" --timeout abc
MPMD_ENV1=TR_FAULT_SLOW_RANK=x mpmd bad_fault_variable_on_one \
    "^trainer run: rank 1: TR_FAULT_SLOW_RANK must be RANK:MILLISECONDS\[:FROM_STEP\], got 'x'" -- \
    "$R" $q --out "$tmp/fv" -- "$R" $q --out "$tmp/fv"
# equivalent settings agree: --zero 0 on one rank, the recipe's default ZeRO-0 on the other
timeout 120 mpirun -np 1 "$T" run "$R" $q --zero 0 --out "$tmp/eq" : -np 1 "$T" run "$R" $q \
    --out "$tmp/eq" >"$tmp/eq.log" 2>&1 && echo "ok   --zero 0 and the recipe's ZeRO-0 agree" ||
    { echo "FAIL --zero 0 against the default was refused"; tail -3 "$tmp/eq.log"; fail=1; }
# the same mistake on every rank is said once
timeout 120 mpirun -np 2 "$T" run "$R" $q --bogus >"$tmp/bogus.log" 2>&1
n=$(awk '/^-+$/ { box = !box; next } !box' "$tmp/bogus.log" | grep -c "unknown option '--bogus'")
[ "$n" -eq 1 ] && echo "ok   a bad flag on every rank is said once" ||
    { echo "FAIL a bad flag on every rank is said $n times"; cat "$tmp/bogus.log"; fail=1; }
"$T" run "$R" --steps 2 --peak-gflops 10 --out "$tmp/keep" >/dev/null 2>&1
cp "$tmp/keep/metrics.jsonl" "$tmp/keep.metrics"
mpmd resume_on_one "^trainer run: rank 1: the resolved recipe or a flag differs" -- \
    "$R" $q --out "$tmp/keep" -- "$R" $q --out "$tmp/keep" --resume
cmp -s "$tmp/keep/metrics.jsonl" "$tmp/keep.metrics" && echo "ok   resume_on_one left metrics.jsonl as it was" ||
    { echo "FAIL resume_on_one changed metrics.jsonl"; fail=1; }

# a rank whose checkpoint write never returns (a hung disk: TR_FAULT_SAVE_HANG) ends the job
# within about --timeout, naming it, instead of hanging every rank in its save
start=$(date +%s)
timeout 120 mpirun -np 1 "$T" run "$R" --set ckpt=5 --timeout 5 --peak-gflops 10 --out "$tmp/hung" : \
    -np 1 env TR_FAULT_SAVE_HANG=1 "$T" run "$R" --set ckpt=5 --timeout 5 --peak-gflops 10 \
    --out "$tmp/hung" >"$tmp/hung.log" 2>&1
rc=$? took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ] &&
    grep -q "rank 1: the checkpoint of step 5 is still being written after" "$tmp/hung.log"; then
    echo "ok   a hung checkpoint write ends the job in ${took}s: $(grep -m1 'still being written' "$tmp/hung.log")"
else
    echo "FAIL hung checkpoint write: exit $rc after ${took}s"; tail -5 "$tmp/hung.log"; fail=1
fi

# a rank far slower than --timeout: the ranks that time out name it (their census: it is the
# one not waiting on communication), not just "a rank died or is stuck"
start=$(date +%s)
TR_FAULT_SLOW_RANK=1:4000 timeout 120 mpirun -np 2 "$T" run "$R" --timeout 1 --peak-gflops 10 \
    --out "$tmp/laggard" >"$tmp/laggard.log" 2>&1
rc=$? took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $took -le 60 ] && grep -q "did not complete within 1 s: rank 1 (host [^)]*) did not answer" "$tmp/laggard.log" &&
    ! grep "did not complete" "$tmp/laggard.log" | grep -qv "rank 1 (host [^)]*) did not answer"; then
    echo "ok   a rank slower than --timeout is named: $(grep -m1 'did not answer' "$tmp/laggard.log")"
else
    echo "FAIL laggard not named: exit $rc after ${took}s"; grep -v '^\s*$' "$tmp/laggard.log" | tail -6; fail=1
fi

# a slow rank (30 ms more per step) is named as the one the others waited for, in the table
# and in ranks.json; every step's metrics hold each rank's compute time
TR_FAULT_SLOW_RANK=1:30 timeout 120 mpirun -np 2 "$T" run "$R" --out "$tmp/slow" --peak-gflops 10 >"$tmp/slow.log" 2>&1
if grep -q "^rank 1 computed longest" "$tmp/slow.log" && [ "$(grep -c '"rank":' "$tmp/slow/ranks.json")" -eq 2 ] &&
    [ "$(grep -c '"rank_compute_s": \[[0-9.]*, [0-9.]*\]' "$tmp/slow/metrics.jsonl")" -eq 20 ] &&
    /usr/bin/env python3 -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(not (r[1]['compute_s'] > r[0]['compute_s'] + 0.4 and r[0]['wait_s'] > 0.4))" "$tmp/slow/ranks.json"; then
    echo "ok   a slow rank is named: $(grep '^rank 1 computed longest' "$tmp/slow.log")"
else
    echo "FAIL slow rank not identified"; tail -6 "$tmp/slow.log"; fail=1
fi

# a rank killed mid-run: every other rank exits within the timeout, with a line naming a rank
start=$(date +%s)
TR_FAULT_KILL_AFTER_STEP=5 TR_FAULT_KILL_RANK=1 timeout 120 mpirun -np 2 "$T" run "$R" --timeout 10 \
    --out "$tmp/dead" --peak-gflops 10 >"$tmp/dead.log" 2>&1
rc=$? took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ] && grep -qi "rank" "$tmp/dead.log"; then
    echo "ok   a killed rank ends the job in ${took}s (exit $rc): $(grep -i rank "$tmp/dead.log" | grep -v '^\s*$' | head -1)"
else
    echo "FAIL killed rank: exit $rc after ${took}s"; tail -5 "$tmp/dead.log"; fail=1
fi
[ $fail -eq 0 ] && echo "dp: all passed" || echo "dp: FAILED"
exit $fail
