#!/usr/bin/env bash
# The guard's state across kills (trainer/run/guard.c, issue 26): the window of accepted losses and
# gradient norms, the bad-step streak and the last rollback's target are in every checkpoint,
# so a run killed (SIGKILL) several times and resumed with --resume ends bitwise as the
# uninterrupted run: the same final parameters (TR_DUMP_PARAMS), the same losses, gradient
# norms and "skipped" markers in metrics.jsonl, the same guard state in the last checkpoint.
#  1. on 1 process, 2 ranks with ZeRO-2 (dp 2) and a 2-stage pipeline (pp 2), each killed by
#     hand (TR_FAULT_KILL_AFTER_STEP) and resumed;
#  2. the same kills on 2 ranks under `trainer supervise`, which relaunches with --resume;
#  3. a checkpoint without the guard section (an older trainer's) still resumes, the guard's
#     warm-up restarting with one line; a changed window does the same.
#
# The run: a copy of tests/recipes_good/dp_tiny.lua, 24 steps, constant rate after its warm-up,
# a checkpoint every 4 steps, guard window 8 and warm-up 4 (spikes judged from step 5, once 4
# steps are accepted). Injected faults: gradient spikes at steps 9 and 21, non-finite gradients
# at 15, 16, 17 (a streak: the checkpoint of step 16 holds 2 bad steps; step 17 is the third
# and rolls back to step 12, skipping the batches of 13-17). The attempts:
#   1  killed after step 8, right after its save (the spike at 9 comes after the kill)
#   2  resumed from 8: the spike at 9, killed after 11 (mid-window, between the spike and the
#      next save)
#   3  resumed from 8, killed after 16 (during the streak, right after the save that holds it)
#   4  resumed from 16 (2 bad steps): 17 rolls back to 12; killed after 19 (after the rollback,
#      before the next save)
#   5  resumed from 16 (saved after the rollback, rolled_to 12): the spike at 21, to the end.
# A fault fires the first time a process trains its step, so each attempt is given the faults
# the uninterrupted run has not yet met at the checkpoint it resumes from (after the rollback:
# none of 15-17). A run without the guard's state in its checkpoints fails here: attempt 2
# would not judge the spike at 9 (an empty window), attempt 4 would not roll back.
# usage: tests/guard_resume.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

recipe() { # NAME GUARD
    sed -e "s#\"../../data/#\"$PWD/data/#" -e 's/decay = "cosine"/decay = "constant"/' \
        -e "s/checkpoint_every = k.ckpt }/checkpoint_every = k.ckpt, guard = $2 }/" \
        tests/recipes_good/dp_tiny.lua >"$tmp/$1.lua"
}
recipe g '{ window = 8, warmup = 4 }'
recipe g6 '{ window = 6, warmup = 4 }'
args=(--set ckpt=4 --set steps=24 --peak-gflops 100)

# the attempts: "kill spikes nans" (kill -: none)
plan=("8 9,21 15,16,17" "11 9,21 15,16,17" "16 9,21 15,16,17" "19 21 17" "- 21 -")
resumed_from=(- 8 8 16 16)

# "step loss grad_norm skipped" of every step of a metrics.jsonl (the last record of a step
# wins: resumed and rolled-back runs repeat steps), the numbers as written
records() {
    python3 - "$1" <<'PY'
import json, sys
seen = {}
for line in open(sys.argv[1]):
    m = json.loads(line, parse_float=str)
    if "step" in m:
        seen[m["step"]] = "%s %s %s" % (m["loss"], m["grad_norm"], m.get("skipped", "-"))
for s in sorted(seen):
    print(s, seen[s])
PY
}
# the guard section of a manifest
guard_state() { sed -n '/^guard:/,/^[a-z]/p' "$1"; }

# run NAME "LAUNCHER" FLAGS...: the uninterrupted run (OUT $tmp/NAME.ref), then the attempts
# (OUT $tmp/NAME), each under LAUNCHER (words; "" for one process), with the layout's FLAGS
run() {
    local name=$1 launch=$2 i kill spikes nans rc
    shift 2
    TR_FAULT_SPIKE_STEP=9,21 TR_FAULT_NAN_STEP=15,16,17 TR_DUMP_PARAMS=$tmp/$name.ref.params \
        $launch "$T" run "$tmp/g.lua" "${args[@]}" "$@" --out "$tmp/$name.ref" >"$tmp/$name.ref.log" 2>&1 ||
        { bad "$name: the uninterrupted run failed"; tail -3 "$tmp/$name.ref.log"; return 1; }
    for i in 0 1 2 3 4; do
        read -r kill spikes nans <<<"${plan[$i]}"
        [ "$kill" = - ] && kill=
        [ "$nans" = - ] && nans=
        # (in a subshell that prints its status, so that bash's "Killed" goes to /dev/null)
        rc=$( (TR_FAULT_KILL_AFTER_STEP=$kill TR_FAULT_SPIKE_STEP=$spikes TR_FAULT_NAN_STEP=$nans \
            TR_DUMP_PARAMS=$tmp/$name.params $launch "$T" run "$tmp/g.lua" "${args[@]}" "$@" \
            --out "$tmp/$name" $([ "$i" -gt 0 ] && echo --resume) >"$tmp/$name.$i.log" 2>&1
            echo $?) 2>/dev/null)
        if [ -n "$kill" ] && [ $rc -eq 0 ]; then bad "$name: attempt $((i + 1)) was not killed"; return 1; fi
        if [ -z "$kill" ] && [ $rc -ne 0 ]; then
            bad "$name: the last attempt failed"; tail -3 "$tmp/$name.$i.log"; return 1
        fi
        if [ "$i" -gt 0 ] && ! grep -q "resuming from .*step_0*${resumed_from[$i]} " "$tmp/$name.$i.log"; then
            bad "$name: attempt $((i + 1)) did not resume from step ${resumed_from[$i]}"
            grep resuming "$tmp/$name.$i.log"; return 1
        fi
    done
    same "$name" "$tmp/$name.ref" "$tmp/$name"
}

# same NAME REF RUN: the reference met the faults as planned; RUN ends bitwise as REF
same() {
    local name=$1 a=$2 b=$3
    grep -q "^guard: step 9: gradient norm .*: update skipped" "$a.log" &&
        grep -q "^guard: 3 bad steps in a row (15-17): rolled back to step 12 " "$a.log" &&
        grep -q "^guard: step 21: gradient norm .*: update skipped" "$a.log" ||
        { bad "$name: the uninterrupted run did not skip 9, roll back at 17 and skip 21"; return 1; }
    if ! diff <(records "$a/metrics.jsonl") <(records "$b/metrics.jsonl") >"$tmp/$name.diff"; then
        bad "$name: metrics.jsonl differs from the uninterrupted run's:"; head -4 "$tmp/$name.diff"
    elif ! cmp -s "$a.params" "$b.params"; then
        bad "$name: the final parameters differ from the uninterrupted run's"
    elif ! diff <(guard_state "$a/checkpoints/step_00000024/manifest.yaml") \
        <(guard_state "$b/checkpoints/step_00000024/manifest.yaml") >/dev/null; then
        bad "$name: the last checkpoint's guard state differs from the uninterrupted run's"
    else
        ok "$name: 4 kills, each resumed: parameters, losses, grad norms, skipped steps and guard state bitwise the uninterrupted run's"
    fi
}

# ---- 1. by hand: 1 process, 2 ranks ZeRO-2, a 2-stage pipeline ------------------------------
timed() { local t0=$SECONDS; "$@"; echo "     ($1 $2: $((SECONDS - t0)) s)"; }
# every layout pinned: the planner's choice (micro-batches, schedule) depends on the machine's
# load, and another micro-batch sums the same gradients in another order
timed run one "" --set micro=4
if command -v mpirun >/dev/null; then
    timed run zero2 "timeout 300 mpirun -np 2" --dp 2 --zero 2 --set micro=4
    timed run pp2 "timeout 300 mpirun -np 2" --dp 1 --pp 2 --schedule 1f1b --microbatches 4 \
        --set micro=2
else
    echo "skip 2 ranks: no mpirun"
fi

# ---- 2. under trainer supervise (2 ranks, ZeRO-2) ------------------------------------------
# The wrapper gives each attempt its faults: the attempt is counted from the supervisor's
# relaunch lines in attempts.jsonl, written before it relaunches.
cat >"$tmp/attempt" <<'EOF2'
#!/usr/bin/env bash
# attempt COMMAND...: COMMAND with the faults of this attempt (line N of $PLAN_FILE)
n=$(grep -c '"action": "relaunch"' "$SV_OUT/attempts.jsonl" 2>/dev/null)
read -r kill spikes nans <<<"$(sed -n "$((${n:-0} + 1))p" "$PLAN_FILE")"
[ "$kill" = - ] && kill=
[ "$nans" = - ] && nans=
export TR_FAULT_KILL_AFTER_STEP=$kill TR_FAULT_SPIKE_STEP=$spikes TR_FAULT_NAN_STEP=$nans
exec "$@"
EOF2
chmod +x "$tmp/attempt"
printf '%s\n' "${plan[@]}" >"$tmp/plan"
if command -v mpirun >/dev/null && [ -f "$tmp/zero2.ref.params" ]; then
    t0=$SECONDS
    SV_OUT=$tmp/sv PLAN_FILE=$tmp/plan TR_DUMP_PARAMS=$tmp/sv.params timeout 300 "$T" supervise \
        --backoff 0 --restarts 6 -- mpirun -np 2 "$tmp/attempt" "$T" run "$tmp/g.lua" "${args[@]}" \
        --dp 2 --zero 2 --set micro=4 --out "$tmp/sv" >"$tmp/sv.log" 2>&1
    rc=$?
    starts=$(grep -c '"event": "start"' "$tmp/sv/attempts.jsonl" 2>/dev/null)
    if [ $rc -eq 0 ] && [ "$starts" = 5 ]; then
        same supervise "$tmp/zero2.ref" "$tmp/sv"
    else
        bad "supervise: exit $rc, $starts attempts (5 expected)"; grep -a "^supervise" "$tmp/sv.log" | tail -3
    fi
    echo "     (supervise: $((SECONDS - t0)) s)"
fi

# ---- 3. a checkpoint without the guard's state; another window ------------------------------
# The checkpoint of step 20 of the one-process run, its guard section taken out (the manifest
# as an older trainer wrote it: its checksum line recomputed), resumed.
old=$tmp/old
mkdir -p "$old/checkpoints"
cp -r "$tmp/one.ref/checkpoints/step_00000020" "$old/checkpoints/"
echo step_00000020 >"$old/checkpoints/latest"
python3 - "$old/checkpoints/step_00000020/manifest.yaml" <<'PY'
import re, sys

def crc32c(data):  # CRC-32C, reflected polynomial 0x82F63B78 (trainer/checkpoint/checkpoint.h)
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF

p = sys.argv[1]
text = open(p, "rb").read()
body = text[:text.rindex(b"# crc32c: ")]
stripped = re.sub(rb"^guard:\n(  .*\n)+", b"", body, flags=re.M)
assert stripped != body, "no guard section"
open(p, "wb").write(stripped + b"# crc32c: %08x\n" % crc32c(stripped))
PY
"$T" run "$tmp/g.lua" "${args[@]}" --set micro=4 --out "$old" --resume >"$tmp/old.log" 2>&1 ||
    { bad "an old checkpoint: the resume failed"; tail -3 "$tmp/old.log"; }
want="guard: $old/checkpoints/step_00000020 holds no guard state (an older trainer's, or the guard was off): the guard starts its warm-up again (spikes are judged again once its window holds 4 accepted steps)"
[ "$(grep -c "^guard: .*warm-up" "$tmp/old.log")" = 1 ] && grep -qxF "$want" "$tmp/old.log" &&
    grep -q "^done: 24 steps" "$tmp/old.log" &&
    ok "a checkpoint without the guard section resumes, one line: ${want#guard: $old/checkpoints/}" ||
    { bad "an old checkpoint: no warm-up line"; grep "^guard\|resum" "$tmp/old.log"; }
grep -q "warm-up" "$tmp"/one.[1-4].log && bad "a checkpoint with the guard's state printed the warm-up line" ||
    ok "checkpoints with the guard's state resume without the warm-up line"
rm -rf "$old"
mkdir -p "$old/checkpoints"
cp -r "$tmp/one.ref/checkpoints/step_00000020" "$old/checkpoints/"
echo step_00000020 >"$old/checkpoints/latest"
"$T" run "$tmp/g6.lua" "${args[@]}" --set micro=4 --out "$old" --resume >"$tmp/g6.log" 2>&1 &&
    grep -qx "guard: .*step_00000020 holds a guard window of 8 steps, the recipe asks for 6: the guard starts its warm-up again (spikes are judged again once its window holds 3 accepted steps)" "$tmp/g6.log" &&
    ok "another window (8 -> 6): resumed, the warm-up again, one line" ||
    { bad "another window"; grep "^guard\|resum" "$tmp/g6.log"; tail -2 "$tmp/g6.log"; }
exit $fail
