#!/usr/bin/env bash
# `trainer sample`: a short run saves a checkpoint; sampling from it is deterministic for a
# seed, differs across seeds, continues the prompt, and bad input fails with one line.
set -u
T="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# checkpoint_every is train { }'s field, set from the command line (no knob of that name)
"$T" run recipes/shakespeare_char.lua --set layers=2 --set width=64 --set seq=64 --steps 40 \
    --set checkpoint_every=30 --eval-every 0 --sample-tokens 0 --peak-gflops 100 --out "$tmp/run" >"$tmp/log" 2>&1 ||
    { echo "FAIL training exited $?"; cat "$tmp/log"; exit 1; }
ls "$tmp/run/checkpoints" | grep -q step_00000040 && echo "ok   the run saved its final checkpoint" ||
    { echo "FAIL no checkpoint"; fail=1; }
ls "$tmp/run/checkpoints" | grep -q step_00000030 && echo "ok   --set checkpoint_every=30 saved step 30" ||
    { echo "FAIL --set checkpoint_every=30 saved no step 30"; fail=1; }
# a small checkpoint's size in readable units, never "0.00 GB"
if grep -q "^checkpoints: 2 saved in .* ([0-9.]* [KM]iB each" "$tmp/log"; then
    echo "ok   $(grep -o "^checkpoints: 2 saved in .* each" "$tmp/log" | sed 's/ in .* (/ (/')"
else
    echo "FAIL checkpoint size: $(grep "^checkpoints:" "$tmp/log")"; fail=1
fi
# a run that saves none says so at the start and the end, and export and sample say why
"$T" run recipes/shakespeare_char.lua --set layers=1 --set width=32 --set seq=16 --set batch_tokens=64 \
    --steps 2 --set checkpoint_every=0 --eval-every 0 --sample-tokens 0 --peak-gflops 100 \
    --out "$tmp/none" >"$tmp/log0" 2>&1 || { echo "FAIL training without checkpoints exited $?"; fail=1; }
if awk '/^checkpoints: none.*checkpoint_every/ { n++; if (!stepped) start = 1; if (done) end = 1 }
         /^step / { stepped = 1 } /^done:/ { done = 1 }
         END { exit !(n == 2 && start && end) }' "$tmp/log0"; then
    echo "ok   a run without checkpoints says so at its start and its end"
else
    echo "FAIL a run without checkpoints did not say so twice:"; sed 's/^/    /' "$tmp/log0"; fail=1
fi
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

# --logits K: a line per prompt position, its top K; --logits-out: all of them, (N, V) float32
s lg "$tmp/run" --prompt "KING:" --logits 3
s lo "$tmp/run" --prompt "KING:" --logits-out "$tmp/logits.bin"
if e=$(python3 - "$tmp/lg" "$tmp/lo" "$tmp/logits.bin" <<'PY'
import json, re, struct, sys
lines = open(sys.argv[1]).read().splitlines()
out = open(sys.argv[2]).read()
raw = open(sys.argv[3], "rb").read()
rows = [struct.unpack("<256f", raw[k * 1024:(k + 1) * 1024]) for k in range(len(raw) // 1024)]
ids = [int(i) for i in out.split("prompt ids:")[1].split()]
assert ids == list(b"KING:"), ids
assert "5 positions x 256 ids" in out and len(raw) == 5 * 256 * 4, (out, len(raw))
assert len(lines) == 5, lines
for t, line in enumerate(lines):
    m = re.match(r'(\d+) (\d+) ("(?:[^"\\]|\\.)*")  (.*)$', line)
    assert m and int(m.group(1)) == t and int(m.group(2)) == ids[t], line
    assert json.loads(m.group(3)) == chr(ids[t]), line
    top = [re.match(r'(\d+) ("(?:[^"\\]|\\.)*") (\S+)$', x) for x in m.group(4).split(" | ")]
    assert len(top) == 3 and all(top), line
    best = sorted(range(256), key=lambda v: -rows[t][v])[:3]
    assert [int(x.group(1)) for x in top] == best, (line, best)
    assert all(abs(float(x.group(3)) - rows[t][int(x.group(1))]) <= 1e-5 * max(1, abs(rows[t][best[0]])) for x in top)
print(lines[-1])
PY
); then
    echo "ok   --logits 3 and --logits-out agree: $e"
else
    echo "FAIL --logits / --logits-out:"; sed 's/^/    /' "$tmp/lg" "$tmp/lo" "$tmp/err"; fail=1
fi

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
nockpt="$tmp/none has no checkpoint: the recipe saves none (checkpoint_every 0); rerun with --set checkpoint_every=N"
bad 1 "^trainer sample: $nockpt" "$tmp/none"
"$T" export "$tmp/none" --format hf --out "$tmp/none-hf" >/dev/null 2>"$tmp/err"
if [ $? -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "^trainer export: $nockpt" "$tmp/err"; then
    echo "ok   $(cat "$tmp/err")"
else
    echo "FAIL trainer export of a run without checkpoints:"; sed 's/^/    /' "$tmp/err"; fail=1
fi
bad 2 "no checkpoint given"
bad 2 "--temperature needs a number" "$tmp/run" --temperature hot
bad 2 "unknown option '--topk'" "$tmp/run" --topk 3
[ $fail -eq 0 ] && echo "sample: all passed" || echo "sample: FAILED"
exit $fail
