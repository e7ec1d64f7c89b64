#!/usr/bin/env bash
# End to end: a short run of the default recipe, shrunk, must learn (final training loss and
# validation loss under 2.45, from ln(256) = 5.55 at the start), write a metrics line
# per step, save a resolved recipe that loads again, and print a sample.
set -u
T="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
"$T" run recipes/shakespeare_char.lua --set layers=2 --set width=64 --set heads=4 --set seq=64 \
    --set steps=200 --set lr=3e-3 --out "$tmp/run" --peak-gflops 100 >"$tmp/log" 2>&1 ||
    { echo "FAIL run exited $?"; cat "$tmp/log"; exit 1; }
tail -n 12 "$tmp/log"
m="$tmp/run/metrics.jsonl"
steps=$(wc -l <"$m")
[ "$steps" -eq 200 ] && echo "ok   metrics.jsonl has 200 lines" || { echo "FAIL metrics has $steps lines"; fail=1; }
last=$(tail -n 1 "$m")
loss=$(echo "$last" | sed 's/.*"loss": \([0-9.]*\).*/\1/')
val=$(echo "$last" | sed -n 's/.*"val_loss": \([0-9.]*\).*/\1/p')
for key in step loss lr tokens_per_s mfu val_loss; do
    echo "$last" | grep -q "\"$key\"" || { echo "FAIL last metrics line lacks $key"; fail=1; }
done
awk -v l="$loss" -v v="$val" 'BEGIN { exit !(l < 2.45 && v != "" && v < 2.45) }' &&
    echo "ok   final loss $loss and val_loss $val are under 2.45" ||
    { echo "FAIL final loss $loss / val_loss $val not under 2.45"; fail=1; }
"$T" show "$tmp/run/recipe.lua" >/dev/null 2>&1 && echo "ok   the saved recipe.lua loads again" ||
    { echo "FAIL saved recipe does not load"; "$T" show "$tmp/run/recipe.lua"; fail=1; }
grep -q "layers = 2" "$tmp/run/recipe.lua" && echo "ok   the saved recipe records the knob override" ||
    { echo "FAIL knob override missing from recipe.lua"; fail=1; }
[ -s "$tmp/run/sample.txt" ] && echo "ok   sample.txt written" || { echo "FAIL no sample"; fail=1; }
# activation recomputation changes memory, not the numbers: identical losses, bitwise (one
# run without recompute, against which each level is compared)
rc_run() { # src out
    "$T" run "$1" --set layers=2 --set width=64 --set seq=64 --steps 5 --eval-every 0 \
        --sample-tokens 0 --peak-gflops 100 --out "$2" >/dev/null 2>&1 ||
        { echo "FAIL recompute run $2"; fail=1; }
}
rc_run recipes/shakespeare_char.lua "$tmp/rc_none"
for level in selective full; do
    r="tests/.e2e_recompute_$level.lua" # one folder down, like recipes/: the corpus path resolves
    sed "s/sample_tokens = 400,/sample_tokens = 400, recompute = \"$level\",/" \
        recipes/shakespeare_char.lua >"$r"
    rc_run "$r" "$tmp/rc_$level"
    rm -f "$r"
    if cmp -s <(grep -o '"loss": [0-9.]*' "$tmp/rc_none/metrics.jsonl") \
        <(grep -o '"loss": [0-9.]*' "$tmp/rc_$level/metrics.jsonl"); then
        echo "ok   recompute = \"$level\": the same losses as without"
    else
        echo "FAIL recompute = \"$level\" changed the losses"; fail=1
    fi
done
[ $fail -eq 0 ] && echo "train_e2e: all passed" || echo "train_e2e: FAILED"
exit $fail
