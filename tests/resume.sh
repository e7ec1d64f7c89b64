#!/usr/bin/env bash
# Checkpoints end to end, on the GPT-2- and Llama-shaped test recipes (tests/checkpoint/):
#  1. kill right after a save, --resume: every later loss and the final parameters (and AdamW
#     state) are bitwise those of an uninterrupted run;
#  2. a process that dies in the middle of a save (TR_FAULT_SAVE_BYTES) leaves the previous
#     checkpoint as `latest`, and --resume continues from it, again bitwise;
#  3. a flipped byte and a truncated file are detected, named, and skipped;
#  4. a recipe that changed in a way that matters is refused with the difference named; a
#     harmless change is allowed and logged; retention keeps the newest K;
#  5. --resume without layout flags keeps the layout the run folder's attempt resolved (here a
#     --micro-batch the planner would not choose) instead of planning again: still bitwise;
#  6. on another number of processes it is planned anew, and the plan's line says why.
# usage: tests/resume.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

for flavour in gpt llama; do
    R=tests/checkpoint/$flavour.lua
    run() { "$T" run "$R" --peak-gflops 100 "$@"; }
    A=$tmp/$flavour-a
    run --out "$A" >"$tmp/a.log" 2>&1 || { bad "$flavour: uninterrupted run failed"; cat "$tmp/a.log"; continue; }
    [ "$(cat "$A/checkpoints/latest")" = step_00000024 ] && ok "$flavour: latest is step_00000024" ||
        bad "$flavour: latest is '$(cat "$A/checkpoints/latest")'"
    n=$(ls -d "$A"/checkpoints/step_* | wc -l)
    [ "$n" -eq 2 ] && ok "$flavour: keep_checkpoints = 2 kept 2 of 3" || bad "$flavour: $n checkpoints kept"

    # 1. killed right after the save of step 8
    B=$tmp/$flavour-b
    TR_FAULT_KILL_AFTER_STEP=8 run --out "$B" >"$tmp/b.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ "$(cat "$B/checkpoints/latest")" = step_00000008 ] &&
        ok "$flavour: killed after the save of step 8 (exit $rc)" || bad "$flavour: kill did not happen (exit $rc)"
    run --out "$B" --resume >"$tmp/b2.log" 2>&1 || { bad "$flavour: resume failed"; cat "$tmp/b2.log"; }
    grep -q "resuming from .*step_00000008 (step 8;" "$tmp/b2.log" && ok "$flavour: resumed from step 8" ||
        { bad "$flavour: did not say where it resumed"; cat "$tmp/b2.log"; }
    if diff <(losses "$A/metrics.jsonl") <(losses "$B/metrics.jsonl") >"$tmp/diff"; then
        ok "$flavour: the losses of steps 9..24 are bitwise those of the uninterrupted run"
    else
        bad "$flavour: losses differ after resume"; head "$tmp/diff"
    fi
    cmp -s "$A/checkpoints/step_00000024/rank_00000.safetensors" \
        "$B/checkpoints/step_00000024/rank_00000.safetensors" &&
        ok "$flavour: final parameters and AdamW state are bitwise equal" ||
        bad "$flavour: final checkpoints differ"

    # 2. killed in the middle of the save of step 16
    C=$tmp/$flavour-c
    one=$(( $(stat -c %s "$A/checkpoints/step_00000016/rank_00000.safetensors") +
            $(stat -c %s "$A/checkpoints/step_00000016/manifest.yaml") ))
    TR_FAULT_SAVE_BYTES=$(( one + one / 2 )) run --out "$C" >"$tmp/c.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && grep -q "TR_FAULT_SAVE_BYTES" "$tmp/c.log" && ok "$flavour: died in the middle of the save of step 16" ||
        bad "$flavour: fault injection did not fire (exit $rc)"
    [ "$(cat "$C/checkpoints/latest")" = step_00000008 ] && [ ! -e "$C/checkpoints/step_00000016" ] &&
        ok "$flavour: latest is still step_00000008, no step_00000016" ||
        { bad "$flavour: after a crash mid-save:"; ls -a "$C/checkpoints"; }
    run --out "$C" --resume >"$tmp/c2.log" 2>&1 || { bad "$flavour: resume after a crash failed"; cat "$tmp/c2.log"; }
    grep -q "step_00000008 (step 8;" "$tmp/c2.log" && diff -q <(losses "$A/metrics.jsonl") <(losses "$C/metrics.jsonl") >/dev/null &&
        cmp -s "$A/checkpoints/step_00000024/rank_00000.safetensors" "$C/checkpoints/step_00000024/rank_00000.safetensors" &&
        ok "$flavour: resumed from step 8 after the crash, bitwise equal to the uninterrupted run" ||
        bad "$flavour: resume after a crash mid-save is not exact"
    steps=$(grep -o '"step": [0-9]*' "$C/metrics.jsonl" | awk '{print $2}')
    [ "$(echo "$steps" | wc -l)" -eq 24 ] && [ "$(echo "$steps" | sort -un | wc -l)" -eq 24 ] &&
        grep -q "metrics.jsonl: dropped [0-9]* record(s) of steps after 8" "$tmp/c2.log" &&
        ok "$flavour: metrics.jsonl has one record per step after the resume" ||
        bad "$flavour: metrics.jsonl after the resume: $(echo $steps)"
    ls -a "$C/checkpoints" | grep -q '^\.tmp' && bad "$flavour: a temporary folder was left behind" ||
        ok "$flavour: the crashed save's temporary folder was cleaned up"
done

# 3. damage: keep 3, flip a byte in the newest, truncate the next: resume takes the third
R=tests/checkpoint/gpt.lua
D=$tmp/damage
"$T" run "$R" --set keep=3 --out "$D" --peak-gflops 100 >"$tmp/d.log" 2>&1 || bad "damage: run failed"
f24=$D/checkpoints/step_00000024/rank_00000.safetensors
size=$(stat -c %s "$f24")
printf '\x55' | dd of="$f24" bs=1 seek=$(( size - 1000 )) conv=notrunc status=none
f16=$D/checkpoints/step_00000016/rank_00000.safetensors
truncate -s $(( $(stat -c %s "$f16") - 4096 )) "$f16"
"$T" run "$R" --set keep=3 --out "$D" --resume --steps 32 --peak-gflops 100 >"$tmp/d2.log" 2>&1 ||
    { bad "damage: resume failed"; cat "$tmp/d2.log"; }
grep -q "skipping checkpoint .*step_00000024: .*rank_00000.safetensors: tensor .* fails its checksum" "$tmp/d2.log" &&
    ok "damage: the flipped byte is detected and named" || { bad "damage: flipped byte not reported"; head -5 "$tmp/d2.log"; }
grep -q "skipping checkpoint .*step_00000016: .*rank_00000.safetensors: .*truncated" "$tmp/d2.log" &&
    ok "damage: the truncated file is detected and named" || { bad "damage: truncation not reported"; head -5 "$tmp/d2.log"; }
grep -q "resuming from .*step_00000008" "$tmp/d2.log" && ok "damage: resumed from the newest good one (step 8)" ||
    bad "damage: did not fall back to step 8"
grep -q "allowed recipe changes: train.steps (24 -> 32)" "$tmp/d2.log" && ok "a harmless change (steps) is allowed and logged" ||
    bad "the steps change was not logged"

# 4. a change that matters is refused, naming it
cp "$tmp/gpt-a/recipe.lua" "$tmp/gpt-a.recipe"
"$T" run "$R" --set width=64 --out "$tmp/gpt-a" --resume --steps 32 --peak-gflops 100 >"$tmp/e.log" 2>&1
rc=$?
cmp -s "$tmp/gpt-a/recipe.lua" "$tmp/gpt-a.recipe" && ok "a refused resume leaves OUT/recipe.lua as it was" ||
    bad "a refused resume rewrote OUT/recipe.lua"
[ $rc -ne 0 ] && grep -q "model.dim (32 -> 64)" "$tmp/e.log" && [ "$(wc -l <"$tmp/e.log")" -eq 1 ] &&
    ok "a model change is refused in one line: $(cat "$tmp/e.log")" || { bad "model change not refused (exit $rc)"; cat "$tmp/e.log"; }
"$T" run "$R" --out "$tmp/none" --resume >"$tmp/f.log" 2>&1 && bad "--resume without checkpoints succeeded" ||
    ok "--resume without checkpoints fails: $(tail -n 1 "$tmp/f.log")"

# 5. the data behind the same path changed since the save (same size, other text): refused
head -c 200000 data/corpora/tinyshakespeare.txt >"$tmp/corpus.txt"
sed "s#^data .*#data { text = \"$tmp/corpus.txt\", tokenizer = \"byte\", val_fraction = 0.1 }#" \
    tests/checkpoint/gpt.lua >"$tmp/data.lua"
"$T" run "$tmp/data.lua" --set steps=8 --out "$tmp/data-run" >"$tmp/g.log" 2>&1 || { bad "data: run failed"; cat "$tmp/g.log"; }
{ tail -c +2 "$tmp/corpus.txt"; printf x; } >"$tmp/shifted.txt" && mv "$tmp/shifted.txt" "$tmp/corpus.txt"
"$T" run "$tmp/data.lua" --set steps=16 --out "$tmp/data-run" --resume >/dev/null 2>"$tmp/g2.log"
rc=$?
[ $rc -ne 0 ] && grep -q "the data differ from those the checkpoint was saved on" "$tmp/g2.log" &&
    [ "$(wc -l <"$tmp/g2.log")" -eq 1 ] && ok "changed data under the same path is refused: $(cat "$tmp/g2.log")" ||
    { bad "changed data not refused (exit $rc)"; cat "$tmp/g2.log"; }
# 5. the layout of the attempt being continued, not a new plan (which measures the machine and
# can choose otherwise under another load)
R=tests/checkpoint/gpt.lua
"$T" run "$R" --peak-gflops 100 --micro-batch 2 --out "$tmp/m-a" >"$tmp/m-a.log" 2>&1
(TR_FAULT_KILL_AFTER_STEP=8 "$T" run "$R" --peak-gflops 100 --micro-batch 2 --out "$tmp/m-b" >"$tmp/m-b.log" 2>&1; true) 2>/dev/null
"$T" run "$R" --peak-gflops 100 --out "$tmp/m-b" --resume >"$tmp/m-b2.log" 2>&1 || bad "resume without flags failed: $(tail -1 "$tmp/m-b2.log")"
if grep -q "^plan: the layout of .*m-b/recipe.lua, which --resume continues (not planned again)" "$tmp/m-b2.log" &&
    grep -q "micro_batch = 2," "$tmp/m-b/recipe.lua" &&
    cmp -s <(losses "$tmp/m-a/metrics.jsonl") <(losses "$tmp/m-b/metrics.jsonl"); then
    ok "--resume without flags keeps the attempt's micro-batch of 2: $(grep '^plan: the layout' "$tmp/m-b2.log" | sed "s#$tmp/##"), losses bitwise"
else
    bad "--resume without flags did not keep the layout: $(grep -i 'resume\|^plan' "$tmp/m-b2.log" | head -3)"
fi
# 6. on another number of processes the layout is planned anew, and the log says why
if command -v mpirun >/dev/null; then
    timeout 300 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$T" run "$R" --peak-gflops 100 \
        --out "$tmp/m-b" --resume --steps 32 >"$tmp/m-b3.log" 2>&1 ||
        bad "resume on 2 processes failed: $(tail -1 "$tmp/m-b3.log")"
    grep -q "^plan: .*; planned anew: the run it resumes had dp 1 x tp 1 x pp 1 on 1 process, this one has 2)" \
        "$tmp/m-b3.log" && ok "--resume on 2 processes plans anew and says why: $(grep '^plan: ' "$tmp/m-b3.log" | head -1 | sed 's/.*; planned anew/planned anew/')" ||
        bad "--resume on 2 processes did not say it planned anew: $(grep '^plan' "$tmp/m-b3.log" | head -2)"
else
    echo "skip --resume on another number of processes: no mpirun"
fi
exit $fail
