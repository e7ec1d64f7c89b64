#!/usr/bin/env bash
# `trainer eval`: on a short run's checkpoint (byte-level GPT and Llama shapes, then GPT-2 BPE), the validation loss
# equals the one `trainer run` logged on the same windows and a Python reference computed from
# `trainer sample --logits-out` on shards written here; the multiple-choice log-likelihoods,
# acc and acc_norm on fixtures in both formats equal tests/eval_ref.py's (the same logits,
# log-softmax in float64); bad input fails with one line.
set -u
T="$1"
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $*"; }
no() { echo "FAIL $*"; fail=1; }

# ---- fixtures: 4 HellaSwag lines (the published fields, ctx_a/ctx_b only, a string label, a
# blank line; the first is longer than seq_len 64 bytes, so its context is cut) and 4 simple
cat >"$tmp/hellaswag_mini.jsonl" <<'EOF'
{"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles.", "ctx_b": "then", "ctx": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles. then", "split": "val", "split_type": "indomain", "label": 3, "endings": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift, while two men supporting the head of the person wearing winter clothes snow as the we girls sled.", ", the man puts on a christmas coat, knitted with netting.", ", the man continues removing the snow on his car."], "source_id": "activitynet~v_-1IBHYS3L-Y"}
{"ctx_a": "KING HENRY:", "ctx_b": "what say", "label": "1", "endings": ["you to the crown?", "the lords of England?", "zzqx vvb", "my lord"]}
{"ctx": "ROMEO: I", "label": 0, "endings": ["will go.", "q", "xxxxxxx", "am the king of all the world and more"]}

{"ctx": "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\nYou", "label": 2, "endings": ["are", "zq", "are all resolved rather to die than to famish?", "k"]}
EOF
cat >"$tmp/simple_mini.jsonl" <<'EOF'
{"context": "To be, or not to be: that is the ", "choices": ["question", "banana", "qqq"], "answer": 0}
{"context": "KING RICHARD III:\nNow is the winter of our", "choices": [" discontent", " xylophone"], "answer": 0}
{"context": "Good morrow, my ", "choices": ["lord", "zzz", "lady", "Lord"], "answer": 2}
{"context": "The café", "choices": [" é", " naïve", " ok"], "answer": 1}
EOF
tasks=(--task "$tmp/hellaswag_mini.jsonl" --task "$tmp/simple_mini.jsonl")

# run NAME RECIPE SEQ ARGS...: a few steps, evaluated at the end on eval_tokens = 16 windows
run() {
    local name="$1" recipe="$2" seq="$3"
    shift 3
    "$T" run "$recipe" --set layers=1 --set width=32 --set heads=2 --set seq="$seq" \
        --set batch_tokens=$((4 * seq)) --set eval_tokens=$((16 * seq)) --set checkpoint_every=6 \
        --steps 6 --eval-every 6 --sample-tokens 0 --peak-gflops 100 --out "$tmp/$name" "$@" \
        >"$tmp/$name.log" 2>&1 || { no "training $name exited $?"; cat "$tmp/$name.log"; exit 1; }
}

# check NAME TOKENIZER SEQ: eval's scores against the reference and run's val_loss
check() {
    local name="$1" tk="$2" seq="$3" logged got
    if "$T" eval "$tmp/$name" "${tasks[@]}" --json --details "$tmp/$name.details" \
        --max-examples 16 >"$tmp/$name.json" 2>"$tmp/err"; then
        ok "$name: $(cut -c1-150 "$tmp/$name.json")..."
    else
        no "$name: trainer eval exited $?: $(cat "$tmp/err")"
        return
    fi
    if e=$(python3 "$here/eval_ref.py" "$T" "$tmp/$name" "$tk" "$seq" "$tmp/$name.json" \
        "$tmp/$name.details" "$tmp/hellaswag_mini.jsonl" "$tmp/simple_mini.jsonl" 2>&1); then
        ok "$name: the reference agrees: $e"
    else
        no "$name: the reference disagrees:"; echo "$e" | sed 's/^/    /'
    fi
    # run's val_loss (6 decimals) is the mean over the same first 16 windows, in order; its
    # float32 means per micro-batch differ from eval's double sum by ~1e-6 relative
    logged=$(grep -o '"val_loss": [0-9.]*' "$tmp/$name/metrics.jsonl" | tail -1 | cut -d' ' -f2)
    got=$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))["val"]; print(v["loss"], v["tokens"])' "$tmp/$name.json")
    if python3 -c 'import sys; a=float(sys.argv[1]); b,n=map(float,sys.argv[2].split()); sys.exit(not(abs(a-b) <= 2e-5 and n == 16*int(sys.argv[3])))' \
        "$logged" "$got" "$seq"; then
        ok "$name: val loss $got (tokens) = run's val_loss $logged"
    else
        no "$name: val loss and tokens $got, run logged $logged"
    fi
}

run byte recipes/shakespeare_char.lua 64
check byte byte 64
# a Llama-shaped model (RMSNorm, rotary positions, grouped-query attention, SwiGLU)
run llama recipes/llama_tiny.lua 64 --set hidden=64
check llama byte 64

# ---- --shards: a shard written here (3 windows of 64 + 1 byte tokens: the text of a play),
# its loss from sample's logits in plain Python
mkdir -p "$tmp/shards"
if r=$(python3 - "$T" "$tmp/byte" "$tmp/shards/val_000000.bin" "$tmp/shards.json" <<'PY'
import array, json, math, os, struct, subprocess, sys
T, ckpt, shard, out = sys.argv[1:]
text = open("data/corpora/tinyshakespeare.txt", "rb").read()[5000:5000 + 3 * 64 + 1]
hdr = [20240520, 1, len(text)] + [0] * 253
open(shard, "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(text), *text))
subprocess.run([T, "eval", ckpt, "--shards", os.path.dirname(shard), "--json"],
               stdout=open(out, "w"), check=True)
total = 0.0
for w in range(3):
    win = text[64 * w:64 * w + 65]
    subprocess.run([T, "sample", ckpt, "--prompt", win[:64], "--logits-out", out + ".bin"],
                   capture_output=True, check=True)
    f = array.array("f", open(out + ".bin", "rb").read())
    for t in range(64):
        row = f[t * 256:(t + 1) * 256]
        m = max(row)
        total += m + math.log(math.fsum(math.exp(x - m) for x in row)) - row[win[t + 1]]
ref = total / (3 * 64)
v = json.load(open(out))["val"]
# per-token losses from the same float32 logits; float32 log-sum-exp: ~1e-6 relative
assert v["tokens"] == 192 and abs(v["loss"] - ref) <= 1e-5 * ref, (v, ref)
print(f"loss {v['loss']:.6f} = reference {ref:.6f} over 3 windows")
PY
); then
    ok "--shards DIR (its val_*.bin): $r"
else
    no "--shards: $r"
fi

# ---- the table, and --max-examples on a task
if "$T" eval "$tmp/byte" "${tasks[@]}" --max-examples 2 >"$tmp/table" 2>"$tmp/err" &&
    grep -q "^validation loss [0-9.]*  perplexity" "$tmp/table" &&
    grep -Eq "^hellaswag_mini +hellaswag +2 " "$tmp/table" &&
    grep -Eq "^simple_mini +simple +2 " "$tmp/table"; then
    ok "the table: $(tr '\n' '|' <"$tmp/table")"
else
    no "the table:"; cat "$tmp/table" "$tmp/err"
fi

# ---- GPT-2 BPE: the same checks through the gpt2 tokenizer (seq 128: every fixture fits)
run bpe recipes/shakespeare_bpe.lua 128
check bpe gpt2 128

# ---- bad input: one line on stderr naming the problem, exit 1 (2: the command line)
bad() { # code pattern [eval args...]
    local code="$1" pat="$2"
    shift 2
    "$T" eval "$@" >/dev/null 2>"$tmp/err"
    local rc=$? lines
    lines=$(wc -l <"$tmp/err")
    if [ $rc -ne "$code" ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pat" "$tmp/err"; then
        no "trainer eval ${*##*/}: exit $rc, stderr:"; sed 's/^/    /' "$tmp/err"
    else
        ok "exit $rc: $(cat "$tmp/err")"
    fi
}
j() { printf '%s\n' "$@" >"$tmp/t.jsonl"; }
good='{"context": "a", "choices": ["b", "c"], "answer": 1}'
bad 1 "cannot read task '$tmp/missing.jsonl': No such file" "$tmp/byte" --task "$tmp/missing.jsonl"
j "$good" '{"context": "a", "choices": ["b", "c"], "answer": 1'
bad 1 "t.jsonl:2: not JSON" "$tmp/byte" --task "$tmp/t.jsonl"
j "$good" "" '{"context": "a", "choices": ["b", "c"], "answer": 2}'
bad 1 "t.jsonl:3: the answer 2 is out of range: the choices are 0 to 1" "$tmp/byte" --task "$tmp/t.jsonl"
j '{"ctx": "a", "endings": ["b"], "label": -1}'
bad 1 "t.jsonl:1: the answer -1 is out of range" "$tmp/byte" --task "$tmp/t.jsonl"
j '{"ctx": "a", "endings": ["b", "c"]}'
bad 1 't.jsonl:1: no field "label"' "$tmp/byte" --task "$tmp/t.jsonl"
j '{"context": "a", "choices": "b", "answer": 0}'
bad 1 't.jsonl:1: "choices" is a string, not an array' "$tmp/byte" --task "$tmp/t.jsonl"
j '{"context": "a", "choices": [], "answer": 0}'
bad 1 't.jsonl:1: "choices" is empty' "$tmp/byte" --task "$tmp/t.jsonl"
j '{"context": 5, "choices": ["b"], "answer": 0}'
bad 1 't.jsonl:1: "context" is a number, not a string' "$tmp/byte" --task "$tmp/t.jsonl"
j '{"ctx": "a", "endings": ["b"], "label": "first"}'
bad 1 't.jsonl:1: "label" must be an integer' "$tmp/byte" --task "$tmp/t.jsonl"
j '{"question": "a"}'
bad 1 't.jsonl:1: neither "endings" (HellaSwag) nor "choices"' "$tmp/byte" --task "$tmp/t.jsonl"
j '[1, 2]'
bad 1 't.jsonl:1: a line must be a JSON object' "$tmp/byte" --task "$tmp/t.jsonl"
j '{"context": "", "choices": ["b"], "answer": 0}'
bad 1 't.jsonl:1: the context is empty' "$tmp/byte" --task "$tmp/t.jsonl" --shards none
: >"$tmp/t.jsonl"
bad 1 "t.jsonl: no examples" "$tmp/byte" --task "$tmp/t.jsonl"
bad 1 "not a checkpoint" "$tmp/nothing" --task "$tmp/simple_mini.jsonl"
bad 1 "matches no file" "$tmp/byte" --shards "$tmp/nowhere"
bad 2 "no checkpoint given"
bad 2 "unknown option '--tasks'" "$tmp/byte" --tasks x
bad 2 "--max-examples needs a number" "$tmp/byte" --max-examples 0
[ $fail -eq 0 ] && echo "eval: all passed" || echo "eval: FAILED"
exit $fail
