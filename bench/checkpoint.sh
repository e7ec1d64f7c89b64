#!/usr/bin/env bash
# Checkpoint performance on GPT-2 small's shape (124M parameters; a checkpoint holds the fp32
# parameters and AdamW's m and v: 1.5 GB), side by side with the references:
#   - the disk's sequential write speed (dd, 1.5 GB, fdatasync at the end);
#   - a synchronous save (TR_CKPT_SYNC=1: the loop copies, writes, fsyncs, then goes on).
# Prints the training stall one save causes (asynchronous vs synchronous: the goal is under 5%),
# the save throughput (GB/s, against dd) and the load throughput of --resume (read + verify;
# from the page cache unless it was dropped).
# usage: bench/checkpoint.sh [path/to/trainer]   (OMP_NUM_THREADS defaults to the cores)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-build/trainer}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
dir=$(mktemp -d "${TMPDIR:-/tmp}/bench_ckpt.XXXXXX")
trap 'rm -rf "$dir"' EXIT
R=bench/checkpoint_gpt2.lua
STEPS=6 EVERY=3 # two saves (steps 3 and 6), each with three training steps to hide behind

# --- the disk -------------------------------------------------------------------------------
t0=$(date +%s.%N)
dd if=/dev/zero of="$dir/dd.bin" bs=16M count=90 conv=fdatasync status=none
t1=$(date +%s.%N)
rm -f "$dir/dd.bin"
dd_gbs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", 16 * 1048576 * 90 / 1e9 / (b - a) }')

run() { # $1: label, rest: env; prints the "checkpoints:" line's numbers
    local label=$1; shift
    rm -rf "$dir/run"
    env "$@" "$T" run "$R" --set steps=$STEPS --set every=$EVERY --out "$dir/run" --overwrite \
        --peak-gflops 100 >"$dir/$label.log" 2>&1 || { cat "$dir/$label.log"; exit 1; }
}
# training time without checkpoints (checkpoint_every = 0)
rm -rf "$dir/run"
"$T" run "$R" --set steps=$STEPS --set every=0 --out "$dir/run" --overwrite --peak-gflops 100 >"$dir/none.log" 2>&1
run sync TR_CKPT_SYNC=1
run async X=1

field() { # $1 log, $2 regex with one group
    sed -n "s/$2/\1/p" "$1" | tail -n 1
}
train_s() { field "$1" '.*done: [0-9]* steps in [^,]*, \([0-9.KM]*\) tok\/s.*'; }
stall() { field "$1" '.*training waited \([0-9.]*\) s for them.*'; }
write_s() { field "$1" '.*written in \([0-9.]*\) s on average.*'; }
copy_s() { field "$1" '.*host copy \([0-9.]*\) s.*'; }
gb() { field "$1" '.*(\([0-9.]*\) GB each.*'; }
saves() { field "$1" '.*checkpoints: \([0-9]*\) saved.*'; }

n=$(saves "$dir/async.log")
sync_stall=$(awk -v s="$(stall "$dir/sync.log")" -v n="$n" 'BEGIN { printf "%.3f", s / n }')
async_stall=$(awk -v s="$(stall "$dir/async.log")" -v n="$n" 'BEGIN { printf "%.3f", s / n }')
size=$(gb "$dir/async.log")
save_gbs=$(awk -v g="$size" -v w="$(write_s "$dir/sync.log")" 'BEGIN { printf "%.3f", g / w }')

# --- load: --resume reads and verifies the newest checkpoint ---------------------------------
"$T" run "$R" --set steps=$((STEPS + 1)) --set every=$EVERY --out "$dir/run" --resume \
    --peak-gflops 100 >"$dir/resume.log" 2>&1 || { cat "$dir/resume.log"; exit 1; }
# trainer/run/train.c says "resuming from DIR (step N; checkpoint of X GB read and verified in Y s)"
load_line=$(grep -m1 '^resuming from ' "$dir/resume.log" || true)
load_size=$(field "$dir/resume.log" '.*checkpoint of \([0-9.]*\) GB read and verified.*')
load_s=$(field "$dir/resume.log" '.*read and verified in \([0-9.]*\) s).*')
# Y has two decimals: under 0.01 s (a tiny checkpoint) gives no throughput
load_gbs=$(awk -v g="$load_size" -v s="$load_s" 'BEGIN { if (g == "" || s == "" || s + 0 <= 0) exit 1; printf "%.3f", g / s }') ||
    { echo "bench/checkpoint.sh: no size and time in the --resume line: '${load_line}'" >&2; exit 1; }

printf '\nGPT-2 124M checkpoint (%s GB: parameters + AdamW m, v), %s threads, %d steps, a save every %d\n' \
    "$size" "$OMP_NUM_THREADS" "$STEPS" "$EVERY"
printf '%-44s %12s %12s %10s\n' "" "trainer" "reference" "ratio"
printf '%-44s %11ss %11ss %9.1f%%\n' "training stall per save (async vs sync save)" "$async_stall" "$sync_stall" \
    "$(awk -v a="$async_stall" -v b="$sync_stall" 'BEGIN { print 100 * a / b }')"
printf '%-44s %8s GB/s %8s GB/s %9.1f%%\n' "save throughput (synchronous save vs dd)" "$save_gbs" "$dd_gbs" \
    "$(awk -v a="$save_gbs" -v b="$dd_gbs" 'BEGIN { print 100 * a / b }')"
printf '%-44s %8s GB/s %8s GB/s %9.1f%%\n' "load throughput (--resume: read + verify)" "$load_gbs" "$dd_gbs" \
    "$(awk -v a="$load_gbs" -v b="$dd_gbs" 'BEGIN { print 100 * a / b }')"
printf '%-44s %10s %12s\n' "host copy per save (async / sync), s" "$(copy_s "$dir/async.log")" "$(copy_s "$dir/sync.log")"
printf '%-44s %10s %12s\n' "training tok/s (async saves / no saves)" "$(train_s "$dir/async.log")" "$(train_s "$dir/none.log")"
