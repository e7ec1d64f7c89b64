#!/usr/bin/env bash
# The NaN and spike guard's default rule (trainer/run/guard.c; the defaults measured by
# bench/guard_stats.sh) on the shipped recipes, shrunk to fit two CPU cores:
#  1. healthy runs skip nothing: llama_tiny (the run of issue 26 that skipped steps 115, 133
#     and 134) at its rate and x3, shakespeare_char at its rate and x0.5 (shakespeare_bpe and
#     gpt2_124m take seconds a step even shrunk: bench/guard_stats.sh measures them);
#  2. runs made to diverge are caught at the step: an injected gradient spike, loss spike and
#     NaN in one run (each skipped, nothing else); and a too-high rate: the shipped recipes do
#     not blow up even at 50x their rate (Adam, clipping), the tests' tiny GPT at a constant
#     3e-3 does at step 29 (loss 3.4 -> 8), before the default warm-up of 100 steps, so it is
#     judged from the first step (warmup = 0).
# Two runs at a time, one thread each.
# usage: tests/guard_healthy.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

# NAME RECIPE [ENV=V...] -- [flags]: recipes/RECIPE.lua (its data path made absolute, its guard
# the default), or a path to a test recipe, in the background, output in $tmp/NAME
run() {
    local name=$1 r=$2 envs=()
    shift 2
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local x=(-e "s#\"\\.\\./data/#\"$PWD/data/#") # a shipped recipe: its default guard
    case $r in
    */*) # a test recipe: a constant rate after the warm-up, spikes judged from the first step
        x=(-e "s#\"\\.\\./\\.\\./data/#\"$PWD/data/#" -e 's/decay = "cosine"/decay = "constant"/'
            -e 's/checkpoint_every = k.ckpt }/checkpoint_every = k.ckpt, guard = { warmup = 0 } }/') ;;
    *) r=recipes/$r.lua ;;
    esac
    sed "${x[@]}" "$r" >"$tmp/$name.lua"
    env "${envs[@]}" "$T" run "$tmp/$name.lua" --out "$tmp/$name" --eval-every 0 \
        --sample-tokens 0 --peak-gflops 100 "$@" >"$tmp/$name.log" 2>&1 &
}

# "step why" of metrics.jsonl's skipped records
skipped() {
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if "skipped" in m:
        print(m["step"], m["skipped"])' "$1" 2>/dev/null
}

clean() { # NAME STEPS: finished, no guard line, no skipped record
    grep -q "^done: $2 steps" "$tmp/$1.log" && ! grep -q "^guard" "$tmp/$1.log" &&
        [ -z "$(skipped "$tmp/$1/metrics.jsonl")" ] && ok "healthy: $1 ($2 steps) skips nothing" ||
        { bad "healthy: $1: $(grep -m3 "^guard\|error\|diverged" "$tmp/$1.log")"; tail -3 "$tmp/$1.log"; }
}

small="--set layers=2 --set width=64 --set batch_tokens=1024"

# ---- 1. healthy runs skip nothing -----------------------------------------------------------
run ll llama_tiny -- $small --set steps=300
run ll_lr3 llama_tiny -- $small --set steps=300 --set lr=6e-3
wait
clean ll 300
clean ll_lr3 300
run sc shakespeare_char -- $small --set steps=250
run sc_lr05 shakespeare_char -- $small --set steps=250 --set lr=1e-3
wait
clean sc 250
clean sc_lr05 250

# ---- 2. divergence is caught ----------------------------------------------------------------
run faults llama_tiny TR_FAULT_SPIKE_STEP=110 TR_FAULT_LOSS_SPIKE_STEP=120 TR_FAULT_NAN_STEP=130 \
    -- $small --set steps=135
run hot tests/recipes_good/dp_tiny.lua -- --steps 40
wait
[ "$(skipped "$tmp/faults/metrics.jsonl" | tr '\n' ' ')" = "110 spike 120 spike 130 nan " ] &&
    grep -q "^guard: step 110: gradient norm [0-9.e+]* is [0-9.]* times the median of the last 50 steps" "$tmp/faults.log" &&
    grep -q "^guard: step 120: loss [0-9.e+]* is [0-9.]* sigma above" "$tmp/faults.log" &&
    grep -q "^guard: step 130: .*not finite: update skipped" "$tmp/faults.log" &&
    ok "injected gradient spike (110), loss spike (120) and NaN (130) skipped, nothing else" ||
    { bad "faults: skipped $(skipped "$tmp/faults/metrics.jsonl" | tr '\n' ' ')"; grep "^guard" "$tmp/faults.log"; }

skipped "$tmp/hot/metrics.jsonl" | head -1 | grep -q "^29 spike$" &&
    grep -q "^guard: step 29: loss [0-9.]* is [0-9.]* sigma above" "$tmp/hot.log" &&
    ok "too-high rate (tests' tiny GPT at 3e-3): the blow-up at step 29 caught" ||
    { bad "too-high rate: skipped $(skipped "$tmp/hot/metrics.jsonl" | tr '\n' ' ')"; grep "^guard" "$tmp/hot.log"; }

exit $fail
