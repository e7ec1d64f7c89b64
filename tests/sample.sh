#!/usr/bin/env bash
# `trainer sample`: a short run saves a checkpoint; sampling from it is deterministic for a
# seed, differs across seeds, continues the prompt, and bad input fails with one line.
set -u
T="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
"$T" run recipes/shakespeare_char.lua --set layers=2 --set width=64 --set seq=64 --steps 40 \
    --eval-every 0 --sample-tokens 0 --peak-gflops 100 --out "$tmp/run" >"$tmp/log" 2>&1 ||
    { echo "FAIL training exited $?"; cat "$tmp/log"; exit 1; }
ls "$tmp/run/checkpoints" | grep -q step_00000040 && echo "ok   the run saved its final checkpoint" ||
    { echo "FAIL no checkpoint"; fail=1; }
s() { out="$1"; shift; "$T" sample "$@" >"$tmp/$out" 2>"$tmp/err"; }
s a "$tmp/run" --prompt "KING:" --tokens 60 --seed 5
s b "$tmp/run/checkpoints/step_00000040" --prompt "KING:" --tokens 60 --seed 5
s c "$tmp/run" --prompt "KING:" --tokens 60 --seed 6
s g1 "$tmp/run" --tokens 30 --temperature 0
s g2 "$tmp/run" --tokens 30 --temperature 0 --seed 99
[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b" && echo "ok   same seed, same text (run folder and step folder)" ||
    { echo "FAIL same seed gave different text"; fail=1; }
cmp -s "$tmp/a" "$tmp/c" && { echo "FAIL seeds 5 and 6 agree"; fail=1; } || echo "ok   another seed, another text"
[ "$(head -c 5 "$tmp/a")" = "KING:" ] && echo "ok   the output continues the prompt" || { echo "FAIL prompt missing"; fail=1; }
cmp -s "$tmp/g1" "$tmp/g2" && echo "ok   greedy sampling ignores the seed" || { echo "FAIL greedy differs"; fail=1; }
n=$(wc -c <"$tmp/a")
[ "$n" -eq 66 ] && echo "ok   byte model: 5 prompt bytes + 60 sampled + newline" || { echo "FAIL $n bytes"; fail=1; }

bad() { # code pattern args...
    local code="$1" pat="$2"
    shift 2
    "$T" sample "$@" >/dev/null 2>"$tmp/err"
    local rc=$? lines
    lines=$(wc -l <"$tmp/err")
    if [ $rc -ne "$code" ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pat" "$tmp/err"; then
        echo "FAIL trainer sample $*: exit $rc, stderr:"; sed 's/^/    /' "$tmp/err"; fail=1
    else
        echo "ok   trainer sample $*: $(cat "$tmp/err")"
    fi
}
bad 1 "not a checkpoint" "$tmp/nothing"
bad 2 "no checkpoint given"
bad 2 "--temperature needs a number" "$tmp/run" --temperature hot
bad 2 "unknown option '--topk'" "$tmp/run" --topk 3
[ $fail -eq 0 ] && echo "sample: all passed" || echo "sample: FAILED"
exit $fail
