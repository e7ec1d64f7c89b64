#!/usr/bin/env bash
# The NaN and spike guard (train { guard = { ... } }, trainer/run/guard.c), on copies of
# tests/recipes_good/dp_tiny.lua with a constant learning rate after the warm-up (so that a run's
# first steps do not depend on its number of steps) and spikes judged from step 6:
#  1. an injected non-finite gradient (TR_FAULT_NAN_STEP), an injected gradient spike
#     (TR_FAULT_SPIKE_STEP) and an injected loss spike (TR_FAULT_LOSS_SPIKE_STEP: the step's
#     targets moved half the vocabulary away) are skipped and said, metrics.jsonl marks them,
#     and the parameters (and AdamW state) after the skipped step are bitwise those before it;
#  2. three bad steps in a row roll back to the checkpoint before them and skip their batches:
#     the run equals one that skipped the updates of every step from the checkpoint to the last
#     bad one (the same state, the same data after them), bitwise; metrics.jsonl has one record
#     per step, the ledger a rollback line, the loader is 4 steps of batches further;
#  3. with no checkpoint, and with guard = false, a bad step stops the run with one line;
#  4. the same on 2 ranks (ZeRO-2; skipped when there is no mpirun);
#  5. clean runs skip nothing: the test recipes at their own lengths with the default guard,
#     and 150 steps of a stable run with spikes judged from the first step;
#  6. a malformed fault variable is one line;
#  7. a recipe (or an older checkpoint's) that sets z_norm, which norm_ratio replaced, loads and
#     is told in one line that z_norm is no longer used.
# usage: tests/guard.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

# the test recipe (data path made absolute), and variants of its guard
recipe() { # NAME GUARD [sed expression]
    sed -e "s#\"../../data/#\"$PWD/data/#" -e 's/decay = "cosine"/decay = "constant"/' \
        -e "s/checkpoint_every = k.ckpt }/checkpoint_every = k.ckpt, guard = $2 }/" \
        ${3:+-e "$3"} tests/recipes_good/dp_tiny.lua >"$tmp/$1.lua"
}
recipe g '{ window = 10, warmup = 5 }'
recipe g5 '{ window = 10, warmup = 5, max_bad = 5 }'
recipe off 'false'
# a run that stays stable for 150 steps (at 3e-3 this model's loss blows up near step 30: the
# guard rightly skips those steps) at the default thresholds, spikes judged from the first
recipe stable '{ warmup = 0 }' 's/lr = 3e-3/lr = 1e-3/; s/decay = "constant"/decay = "cosine"/'
run() { "$T" run "$tmp/$1.lua" --peak-gflops 100 --out "$tmp/$2" "${@:3}" >"$tmp/$2.log" 2>&1; }

# "step skipped" of metrics.jsonl's records that carry "skipped"
skipped() {
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if "skipped" in m:
        print(m["step"], m["skipped"], m["grad_norm"])' "$1"
}

# the tensors' bytes (parameters, AdamW moments) of a rank file of a checkpoint, without the
# header (whose metadata names the step)
tensors() {
    python3 -c '
import struct, sys
d = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", d[:8])[0]
sys.stdout.buffer.write(d[8 + n:])' "$1"
}

# the loader position of a checkpoint: micro-batches served (the first 8 bytes of its hex)
batches() {
    python3 -c '
import re, struct, sys
h = re.search(r"hex: \"([0-9a-f]{16})", open(sys.argv[1]).read()).group(1)
print(struct.unpack("<q", bytes.fromhex(h))[0])' "$1"
}

# ---- 1. a skipped step changes nothing -----------------------------------------------------
TR_DUMP_PARAMS=$tmp/before.params run g before --steps 6 || bad "6 clean steps failed"
TR_FAULT_NAN_STEP=7 TR_DUMP_PARAMS=$tmp/nan.params run g nan --steps 7 --set ckpt=1 ||
    { bad "a run with a NaN at step 7 failed"; cat "$tmp/nan.log"; }
grep -q "^guard: step 7: loss [0-9.]* and gradient norm nan: not finite: update skipped$" \
    "$tmp/nan.log" && ok "NaN at step 7: said in one line" || { bad "NaN at step 7 not said"; cat "$tmp/nan.log"; }
[ "$(skipped "$tmp/nan/metrics.jsonl")" = "7 nan None" ] &&
    ok "metrics.jsonl: step 7 \"skipped\": \"nan\", grad_norm null" ||
    bad "metrics.jsonl's skipped records: $(skipped "$tmp/nan/metrics.jsonl")"
# every JSON file of the NaN run parses strictly (no NaN, Infinity or inf: null)
python3 - "$tmp/nan" <<'PY' && ok "NaN at step 7: every .json and .jsonl of the run is valid JSON" || bad "NaN at step 7: a JSON file is not valid JSON"
import glob, json, os, sys
def no_constant(c):
    raise ValueError("not JSON: " + c)
files = [f for f in glob.glob(os.path.join(sys.argv[1], "**", "*.json*"), recursive=True)
         if f.endswith((".json", ".jsonl"))]
for f in files:
    text = open(f).read()
    for line in text.splitlines() if f.endswith(".jsonl") else [text]:
        if line.strip():
            json.loads(line, parse_constant=no_constant)
sys.exit(0 if files else 1)
PY
cmp -s "$tmp/before.params" "$tmp/nan.params" &&
    ok "NaN at step 7: the parameters after it are bitwise those after step 6" ||
    bad "NaN at step 7 changed the parameters"
c=$tmp/nan/checkpoints
cmp -s <(tensors "$c/step_00000006/rank_00000.safetensors") <(tensors "$c/step_00000007/rank_00000.safetensors") &&
    grep -q "^adam_steps: 6$" "$c/step_00000007/manifest.yaml" &&
    ok "NaN at step 7: the AdamW moments and step count stay those of step 6" ||
    bad "NaN at step 7 changed the AdamW state"

TR_FAULT_SPIKE_STEP=7 TR_DUMP_PARAMS=$tmp/spike.params run g spike --steps 7 ||
    { bad "a run with a spike at step 7 failed"; cat "$tmp/spike.log"; }
grep -q "^guard: step 7: gradient norm [0-9.e+]* is [0-9.]* times the median of the last 6 steps (medians: loss [0-9.]*, gradient norm [0-9.]*): update skipped$" \
    "$tmp/spike.log" && ok "spike at step 7: said in one line" || { bad "spike not said"; cat "$tmp/spike.log"; }
skipped "$tmp/spike/metrics.jsonl" | grep -q "^7 spike [0-9]" && [ "$(skipped "$tmp/spike/metrics.jsonl" | wc -l)" -eq 1 ] &&
    ok "metrics.jsonl: step 7 \"skipped\": \"spike\"" || bad "metrics.jsonl: $(skipped "$tmp/spike/metrics.jsonl")"
cmp -s "$tmp/before.params" "$tmp/spike.params" &&
    ok "spike at step 7: the parameters after it are bitwise those after step 6" ||
    bad "the spike at step 7 changed the parameters"

# a loss spike shows once the loss has settled: step 18 (the first steps fall fast)
TR_FAULT_LOSS_SPIKE_STEP=18 TR_DUMP_PARAMS=$tmp/lspike.params run g lspike --steps 18 &&
    TR_DUMP_PARAMS=$tmp/before17.params run g before17 --steps 17 ||
    { bad "a run with a loss spike at step 18 failed"; cat "$tmp/lspike.log"; }
grep -q "^guard: step 18: loss [0-9.e+]* is [0-9.]* sigma above .*the median of the last 10 steps (medians: .*): update skipped$" \
    "$tmp/lspike.log" && ok "loss spike at step 18 (targets moved): said in one line" ||
    { bad "loss spike not said"; cat "$tmp/lspike.log"; }
skipped "$tmp/lspike/metrics.jsonl" | grep -q "^18 spike [0-9]" &&
    cmp -s "$tmp/before17.params" "$tmp/lspike.params" &&
    ok "loss spike at step 18: marked, and the parameters after it are those after step 17" ||
    bad "loss spike: $(skipped "$tmp/lspike/metrics.jsonl")"

# ---- 2. three in a row roll back and skip the data ------------------------------------------
TR_FAULT_NAN_STEP=12,13,14 TR_FAULT_SPIKE_STEP=7 TR_DUMP_PARAMS=$tmp/roll.params run g roll --set ckpt=5 ||
    { bad "the rollback run failed"; cat "$tmp/roll.log"; }
grep -q "^guard: 3 bad steps in a row (12-14): rolled back to step 10 and skipped the 4 batches of steps 11-14$" \
    "$tmp/roll.log" && ok "3 bad steps in a row: rolled back to step 10, said in one line" ||
    { bad "no rollback line"; cat "$tmp/roll.log"; }
# the reference: steps 11-14 skipped (max_bad 5), trained 4 steps longer; a constant rate
TR_FAULT_NAN_STEP=11,12,13,14 TR_FAULT_SPIKE_STEP=7 TR_DUMP_PARAMS=$tmp/ref.params run g5 ref --steps 24 ||
    bad "the reference run failed"
cmp -s "$tmp/roll.params" "$tmp/ref.params" &&
    diff <(losses "$tmp/roll/metrics.jsonl" | awk '$1 > 10 { print $1 + 4, $2 }') \
        <(losses "$tmp/ref/metrics.jsonl" | awk '$1 > 14') >/dev/null &&
    ok "after the rollback: losses and final parameters bitwise those of a run that skipped steps 11-14" ||
    bad "the rolled-back run differs from the run that skipped steps 11-14"
steps=$(grep -o '"step": [0-9]*' "$tmp/roll/metrics.jsonl" | awk '{print $2}' | tr '\n' ' ')
[ "$steps" = "$(seq -s ' ' 1 20) " ] && [ "$(skipped "$tmp/roll/metrics.jsonl")" = "7 spike $(skipped "$tmp/roll/metrics.jsonl" | awk '/spike/ {print $3}')" ] &&
    grep -q "metrics.jsonl: dropped 3 record(s) of steps after 10" "$tmp/roll.log" &&
    ok "metrics.jsonl: one record per step, the rolled-back steps' dropped" || bad "metrics.jsonl's steps: $steps"
grep -q '"kind": "rollback", "attempt": 1, "step": 14, "to_step": 10' "$tmp/roll/ledger.jsonl" &&
    ok "ledger.jsonl: the rollback line" || bad "ledger.jsonl has no rollback line"
[ "$(batches "$tmp/roll/checkpoints/step_00000020/manifest.yaml")" = 24 ] &&
    ok "the loader skipped the 4 steps' batches (24 served by step 20)" ||
    bad "the loader served $(batches "$tmp/roll/checkpoints/step_00000020/manifest.yaml") batches by step 20"
python3 -c 'import json, math, sys; l = [json.loads(x)["loss"] for x in open(sys.argv[1])]; sys.exit(not all(v is not None and math.isfinite(v) for v in l))' \
    "$tmp/roll/metrics.jsonl" && grep -q "^done: 20 steps" "$tmp/roll.log" &&
    ok "the rolled-back run finished with finite losses" || bad "the rolled-back run did not finish cleanly"

# ---- 3. nowhere to roll back to; the guard off ----------------------------------------------
TR_FAULT_NAN_STEP=12,13,14 run g nockpt
[ $? -eq 1 ] && [ "$(grep -c "steps 12-14: 3 bad steps in a row (step 14: loss is [0-9.]* and gradient norm nan) and no checkpoints to roll back to (checkpoint_every 0): training diverged" "$tmp/nockpt.log")" -eq 1 ] &&
    ok "no checkpoint: the run stops with the divergence line naming steps 12-14" ||
    { bad "no checkpoint: no divergence line"; cat "$tmp/nockpt.log"; }
TR_FAULT_NAN_STEP=3,4,5 run g early --set ckpt=5
[ $? -eq 1 ] && grep -q "steps 3-5: 3 bad steps in a row (step 5: .*) and no checkpoint from before step 3 to roll back to" "$tmp/early.log" &&
    ok "no checkpoint before the bad steps: the run stops, said" || { bad "bad steps before any save"; cat "$tmp/early.log"; }
TR_FAULT_NAN_STEP=4 run off off
[ $? -eq 1 ] && grep -q "step 4: loss is [0-9.]* and gradient norm .*nan: training diverged" "$tmp/off.log" &&
    ! grep -q "^guard" "$tmp/off.log" && ok "guard = false: a NaN stops the run as before" ||
    { bad "guard = false"; cat "$tmp/off.log"; }

# ---- 4. two ranks --------------------------------------------------------------------------
if command -v mpirun >/dev/null; then
    mp() { timeout 300 mpirun -np 2 "$T" run "$tmp/$1.lua" --peak-gflops 100 --set zero=2 --out "$tmp/$2" "${@:3}" >"$tmp/$2.log" 2>&1; }
    TR_FAULT_NAN_STEP=12,13,14 TR_FAULT_SPIKE_STEP=7 TR_DUMP_PARAMS=$tmp/mroll.params mp g mroll --set ckpt=5 ||
        { bad "2 ranks: the rollback run failed"; cat "$tmp/mroll.log"; }
    TR_FAULT_NAN_STEP=11,12,13,14 TR_FAULT_SPIKE_STEP=7 TR_DUMP_PARAMS=$tmp/mref.params mp g5 mref --steps 24 ||
        bad "2 ranks: the reference run failed"
    [ "$(grep -c "^guard: step" "$tmp/mroll.log")" -eq 4 ] &&
        grep -q "^guard: 3 bad steps in a row (12-14): rolled back to step 10 and skipped the 4 batches of steps 11-14$" "$tmp/mroll.log" &&
        ok "2 ranks: the spike, the NaNs and the rollback said once each" || { bad "2 ranks: lines"; cat "$tmp/mroll.log"; }
    cmp -s "$tmp/mroll.params" "$tmp/mref.params" &&
        ok "2 ranks, ZeRO-2: final parameters bitwise those of the run that skipped steps 11-14" ||
        bad "2 ranks: the rolled-back run differs from the reference"
else
    echo "skip 2 ranks: no mpirun"
fi

# ---- 5. clean runs skip nothing ------------------------------------------------------------
clean() { # NAME: no guard line, no skipped record
    ! grep -q "guard" "$tmp/$1.log" && [ -z "$(skipped "$tmp/$1/metrics.jsonl")" ]
}
for r in dp_tiny tp_gpt pp_gpt tiny; do
    "$T" run "tests/recipes_good/$r.lua" --peak-gflops 100 --out "$tmp/clean_$r" >"$tmp/clean_$r.log" 2>&1 &&
        clean "clean_$r" && ok "clean: $r.lua skips nothing" || bad "clean: $r.lua: $(grep guard "$tmp/clean_$r.log")"
done
run stable stable --steps 150 && clean stable &&
    ok "clean: 150 steps judged from the first skip nothing" || bad "clean: 150 steps: $(grep guard "$tmp/stable.log")"

# ---- 6. a malformed fault variable ----------------------------------------------------------
TR_FAULT_NAN_STEP=7,x run g badenv
[ $? -ne 0 ] && [ "$(wc -l <"$tmp/badenv.log")" -eq 1 ] &&
    grep -q "TR_FAULT_NAN_STEP must be a list of steps S\[,S...\] (each >= 1, at most 16), got '7,x'" "$tmp/badenv.log" &&
    ok "TR_FAULT_NAN_STEP=7,x: one line" || { bad "a malformed TR_FAULT_NAN_STEP"; cat "$tmp/badenv.log"; }

# ---- 7. z_norm, replaced by norm_ratio ----------------------------------------------------------
recipe znorm '{ window = 10, z_norm = 6 }'
run znorm znorm --steps 2 && [ "$(grep -c 'z_norm is no longer used' "$tmp/znorm.log")" -eq 1 ] &&
    ok "z_norm is read and said to be unused: $(grep -o 'train: guard: z_norm.*' "$tmp/znorm.log")" ||
    { bad "a recipe with z_norm"; tail -3 "$tmp/znorm.log"; }

exit $fail
