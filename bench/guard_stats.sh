#!/usr/bin/env bash
# What the NaN and spike guard (trainer/run/guard.c) judges, measured: runs the shipped recipes at
# their own settings and at the widths and learning rates users pick, and runs made to diverge
# (a too-high lr, injected NaN, gradient and loss spikes, corrupted data), all with
# train { guard = false } so that every step's loss and gradient norm land in metrics.jsonl
# whatever the guard would have said; then bench/guard_rules.py replays candidate rules over
# the series (a rule's verdict on a series it never fires on is the guard's verdict on that
# run). Prints figures, not pass/fail. Two runs at a time, one thread each.
# usage: bench/guard_stats.sh path/to/trainer [OUTDIR] [SET]   (from the repository root)
#   SET: healthy, divergent or all (default); OUTDIR default /tmp/guard_stats
set -u
T=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
out=${2:-/tmp/guard_stats}
which=${3:-all}
mkdir -p "$out"
export OMP_NUM_THREADS=1

# a copy of recipes/R.lua with the guard off and the data path absolute
copy() { # RECIPE NAME -> path of the copy (one per run: two run at once)
    local r=$1 c="$out/$2.lua"
    local x=() # a test recipe: a constant rate after the warm-up, as tests/guard.sh runs it
    case $r in */*) x=(-e 's/decay = "cosine"/decay = "constant"/') ;; *) r=recipes/$r.lua ;; esac
    sed -e "s#\"\\.\\./\\.\\./data/#\"$PWD/data/#" -e "s#\"\\.\\./data/#\"$PWD/data/#" \
        -e 's/seed = 1337,/seed = 1337, guard = false,/' \
        -e 's/checkpoint_every = k.ckpt }/checkpoint_every = k.ckpt, guard = false }/' "${x[@]}" \
        "$r" >"$c"
    grep -q "guard = false" "$c" || { echo "guard_stats: could not turn the guard off in $r" >&2; exit 2; }
    echo "$c"
}

# one run: NAME RECIPE [ENV=V...] -- [trainer flags]; skips a run already recorded
one() {
    local name=$1 r=$2 envs=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    [ -s "$out/$name/metrics.jsonl" ] && [ -f "$out/$name.done" ] && return 0
    rm -rf "${out:?}/$name"
    echo "${envs[*]}" >"$out/$name.env" # the faults, for bench/guard_rules.py
    local t0=$SECONDS
    env "${envs[@]}" "$T" run "$(copy "$r" "$name")" --out "$out/$name" --overwrite --eval-every 0 --sample-tokens 0 \
        --peak-gflops 100 "$@" >"$out/$name.log" 2>&1
    echo "$? $((SECONDS - t0))s" >"$out/$name.done"
    echo "$name: exit $(cat "$out/$name.done")"
}

# runs two at a time
jobs_=()
go() {
    [ -f "$out/$1.done" ] && [ -s "$out/$1/metrics.jsonl" ] && return 0
    one "$@" & jobs_+=($!); [ ${#jobs_[@]} -ge 2 ] && { wait "${jobs_[0]}"; jobs_=("${jobs_[@]:1}"); }; }

if [ "$which" != divergent ]; then
    # llama_tiny: the issue's run, its width and lr neighbours
    go ll_w64 llama_tiny -- --set layers=2 --set width=64 --set batch_tokens=1024 --set steps=300
    go ll_w64_lr05 llama_tiny -- --set layers=2 --set width=64 --set batch_tokens=1024 --set steps=300 --set lr=1e-3
    go ll_w64_lr3 llama_tiny -- --set layers=2 --set width=64 --set batch_tokens=1024 --set steps=300 --set lr=6e-3
    go ll_w128 llama_tiny -- --set layers=2 --set width=128 --set hidden=352 --set batch_tokens=2048 --set steps=400
    go ll_w128_lr2 llama_tiny -- --set layers=2 --set width=128 --set hidden=352 --set batch_tokens=2048 --set steps=400 --set lr=4e-3
    go ll_w32 llama_tiny -- --set layers=2 --set width=32 --set heads=4 --set hidden=96 --set batch_tokens=1024 --set steps=400
    # shakespeare_char: smaller widths, lr x0.5 and x3    go sc_w64 shakespeare_char -- --set layers=2 --set width=64 --set batch_tokens=1024 --set steps=400
    go sc_w64_lr05 shakespeare_char -- --set layers=2 --set width=64 --set batch_tokens=1024 --set steps=400 --set lr=1e-3
    go sc_w64_lr3 shakespeare_char -- --set layers=2 --set width=64 --set batch_tokens=1024 --set steps=400 --set lr=6e-3
    go sc_w128 shakespeare_char -- --set layers=2 --set width=128 --set batch_tokens=2048 --set steps=300
    go sc_w128_lr2 shakespeare_char -- --set layers=2 --set width=128 --set batch_tokens=2048 --set steps=300 --set lr=4e-3
    # shakespeare_bpe: the 50k-way head is most of the cost; small widths and batches
    go bpe_w64 shakespeare_bpe -- --set layers=2 --set width=64 --set seq=64 --set batch_tokens=1024 --set steps=160
    go bpe_w64_lr2 shakespeare_bpe -- --set layers=2 --set width=64 --set seq=64 --set batch_tokens=1024 --set steps=160 --set lr=6e-3
    # gpt2_124m: its width 768 and vocabulary are fixed (~4 s a step of 256 tokens here): 2
    # blocks, the warm-up shortened so that the rate reaches its peak; too short for the
    # guard's warm-up, so read with bench/guard_rules.py --warmup 0
    go g2_l2 gpt2_124m -- --set layers=2 --set seq=64 --set batch_tokens=256 --set warmup=10 --set steps=60
fi
if [ "$which" != divergent ]; then
    # the two byte-level recipes' own shapes (width 256 and 192, 4 blocks): 10-14 s a step of
    # 4096 tokens on one thread here, so 1024-token batches and 130 steps
    go ll_default llama_tiny -- --set batch_tokens=1024 --set steps=130
    go sc_default shakespeare_char -- --set batch_tokens=1024 --set steps=130
fi
if [ "$which" != healthy ]; then
    d="--set layers=2 --set width=64 --set batch_tokens=1024"
    # a too-high rate: llama_tiny at x15 and shakespeare_char at x10 and x25
    go dv_ll_lr30 llama_tiny -- $d --set steps=300 --set lr=3e-2
    go dv_sc_lr20 shakespeare_char -- $d --set steps=300 --set lr=2e-2
    go dv_sc_lr50 shakespeare_char -- $d --set steps=300 --set lr=5e-2
    # ... the rate of a real blow-up: x50 (llama_tiny, shakespeare_char at width 64)
    go dv_ll_lr100 llama_tiny -- $d --set steps=300 --set lr=0.1
    go dv_sc_lr100 shakespeare_char -- $d --set steps=300 --set lr=0.1
    # the tests' tiny GPT (256-token batches) at a constant 3e-3: loss 3.3 -> 8 at step 29
    go dv_tiny_lr3e3 tests/recipes_good/dp_tiny.lua -- --steps 150 --set ckpt=0
    # injected faults, each at a step early (during the guard's warm-up) and after it
    go dv_nan llama_tiny TR_FAULT_NAN_STEP=150 -- $d --set steps=160
    go dv_spike llama_tiny TR_FAULT_SPIKE_STEP=150,220 -- $d --set steps=230
    go dv_lspike llama_tiny TR_FAULT_LOSS_SPIKE_STEP=150,220 -- $d --set steps=230
    go dv_lspike_sc shakespeare_char TR_FAULT_LOSS_SPIKE_STEP=120,250 -- $d --set steps=260
    go dv_spike_sc shakespeare_char TR_FAULT_SPIKE_STEP=120,250 -- $d --set steps=260
fi
wait
echo "recorded in $out; now: python3 bench/guard_rules.py $out"
