#!/usr/bin/env bash
# The data pipeline from the command line: `trainer tokenize` writes shards a recipe trains
# on, and every kind of bad data input gives one line on stderr naming the file, and a
# non-zero exit: a glob that matches nothing, a shard with a wrong magic, a truncated shard,
# an empty shard, a token outside the model's vocabulary, a vocabulary file that does not parse.
set -u
T="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

expect() { # expect PATTERN -- ARGS: non-zero exit and exactly one stderr line matching PATTERN
    local pat="$1"
    shift 2
    "$T" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? lines
    lines=$(wc -l <"$tmp/err")
    if [ $rc -eq 0 ] || ! grep -q -- "$pat" "$tmp/err" || [ "$lines" -ne 1 ]; then
        echo "FAIL trainer $*: exit $rc, stderr ($lines lines):"
        sed 's/^/    /' "$tmp/err"
        fail=1
    else
        echo "ok   $(cat "$tmp/err")"
    fi
}

# tokenize a corpus (a folder with a text file and a JSONL file) and train on its shards
mkdir -p "$tmp/corpus"
head -c 300000 data/corpora/tinyshakespeare.txt >"$tmp/corpus/a.txt"
printf '{"text": "Hello there.\\nGeneral Kenobi!"}\n' >"$tmp/corpus/b.jsonl"
if "$T" tokenize "$tmp/corpus" --out "$tmp/shards" --val-fraction 0.1 --shard-tokens 40000 \
    >"$tmp/out" 2>"$tmp/err" && ls "$tmp/shards"/train_000001.bin "$tmp/shards"/val_000000.bin >/dev/null; then
    echo "ok   tokenize: $(cat "$tmp/out")"
else
    echo "FAIL tokenize"; cat "$tmp/out" "$tmp/err"; fail=1
fi
ls "$tmp/shards" | grep -q tmp && { echo "FAIL temporary files left"; fail=1; }
recipe() { # recipe FILE DATA-LINE: the shakespeare_bpe recipe, tiny, on other data
    sed -e "s#^data .*#$2#" -e 's/width = 128/width = 32/' -e 's/layers = 4/layers = 1/' \
        recipes/shakespeare_bpe.lua >"$1"
}
recipe "$tmp/r.lua" "data { shards = \"$tmp/shards/train_*.bin\", val_shards = \"$tmp/shards/val_*.bin\", tokenizer = \"gpt2\" }"
if "$T" run "$tmp/r.lua" --steps 2 --set seq=32 --set batch_tokens=256 --out "$tmp/run" \
    --sample-tokens 8 --eval-every 1 >"$tmp/out" 2>&1 && grep -q "val_loss" "$tmp/run/metrics.jsonl"; then
    echo "ok   a recipe trains on the shards and evaluates on the validation shards"
else
    echo "FAIL run on shards"; cat "$tmp/out"; fail=1
fi
recipe "$tmp/mix.lua" "data { mix = { { shards = \"$tmp/shards/train_000000.bin\", weight = 3 }, { shards = \"$tmp/shards/train_00000[1-9].bin\", weight = 1 } }, tokenizer = \"gpt2\" }"
"$T" run "$tmp/mix.lua" --steps 2 --set seq=32 --set batch_tokens=256 --out "$tmp/run2" \
    --sample-tokens 0 >"$tmp/out" 2>&1 && echo "ok   a mix of two sets of shards trains" ||
    { echo "FAIL mix run"; cat "$tmp/out"; fail=1; }

run_on() { # run_on GLOB: a tiny run on the given shards
    recipe "$tmp/b.lua" "data { shards = \"$1\", tokenizer = \"gpt2\" }"
    expect "$2" -- run "$tmp/b.lua" --steps 2 --set seq=32 --set batch_tokens=256 --out "$tmp/run3" --overwrite
}
run_on "$tmp/none_*.bin" "none_\*.bin' matches no file"
head -c 2048 /dev/zero >"$tmp/zero.bin"
run_on "$tmp/zero.bin" "zero.bin: byte 0: bad magic 0"
head -c 5000 "$tmp/shards/train_000000.bin" >"$tmp/trunc.bin"
run_on "$tmp/trunc.bin" "trunc.bin: byte 8: the header says 40000 tokens .* (truncated)"
: >"$tmp/empty.bin"
run_on "$tmp/empty.bin" "empty.bin: empty file"
# a uint32 shard of ids 60000.. : outside the 50304-token model
python3 - "$tmp/big.bin" <<'PY' 2>/dev/null || printf '' >/dev/null
import struct, sys
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240801, 7, 4000, *([0] * 253)))
    f.write(struct.pack("<4000I", *range(60000, 64000)))
PY
[ -s "$tmp/big.bin" ] && run_on "$tmp/big.bin" "big.bin: byte [0-9]*: token id 6[0-9]* is outside the model's vocabulary (50304)"
printf '{"a": 0,\n "b" 1}' >"$tmp/enc.json"
expect "enc.json: byte 14: expected ':'" -- tokenize "$tmp/corpus" --out "$tmp/x" --encoder "$tmp/enc.json"
expect "no_such_dir: cannot read" -- tokenize "$tmp/no_such_dir" --out "$tmp/x"
expect "unknown option '--bogus'" -- tokenize "$tmp/corpus" --out "$tmp/x" --bogus 1
: >"$tmp/a_file" # --out on a file: said at once, as `trainer run --out` says it
expect "'$tmp/a_file' exists and is not a folder" -- tokenize "$tmp/corpus" --out "$tmp/a_file"

# a FIFO is refused, not waited on: as a shard, and as a recipe's text
mkfifo "$tmp/fifo.bin" "$tmp/fifo.txt"
run_on "$tmp/fifo.bin" "fifo.bin: not a regular file"
sed -e "s#^data .*#data { text = \"$tmp/fifo.txt\" }#" -e 's/width = 128/width = 32/' \
    -e 's/layers = 4/layers = 1/' recipes/shakespeare_bpe.lua >"$tmp/fifo.lua"
expect "fifo.txt' is not a regular file" -- run "$tmp/fifo.lua" --steps 2 --set seq=32 --set batch_tokens=256 --out "$tmp/run4"
# the validation cut inside the last document, which has no place to cut after it (one long
# JSONL line): the cut moves back to that document's start instead of failing after the pass;
# one document with no place to cut at all fails before the pass, naming the value that works
mkdir -p "$tmp/straddle"
head -c 300000 data/corpora/tinyshakespeare.txt >"$tmp/straddle/a.txt"
python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()[300000:330000]}))' \
    data/corpora/tinyshakespeare.txt >"$tmp/straddle/b.jsonl"
if "$T" tokenize "$tmp/straddle" --out "$tmp/straddle_out" --val-fraction 0.02 >"$tmp/out" 2>"$tmp/err" &&
    [ -s "$tmp/straddle_out/val_000000.bin" ] && grep -q "(the last 9\.[0-9]*% of the input)" "$tmp/out"; then
    echo "ok   the last document straddles the 2% cut: $(grep -o '[0-9]* validation tokens.*input)' "$tmp/out")"
else
    echo "FAIL tokenize --val-fraction 0.02 with the last document straddling the cut:"
    sed 's/^/    /' "$tmp/out" "$tmp/err"; fail=1
fi
printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' >"$tmp/one.txt"
expect "one.txt: cannot split off a validation set: the input is one document with no place to cut it .*use --val-fraction 0" -- \
    tokenize "$tmp/one.txt" --out "$tmp/one_out" --val-fraction 0.02
grep -q "^tokenize:" "$tmp/err" && { echo "FAIL the refusal came after a pass"; fail=1; }

# texts whose validation cut falls inside the byte after a chunk boundary (100010 bytes with
# 2 threads did) once made the chunking loop forever, growing memory: every size must finish
cut_ok=1
vlim=4000000 # KiB of address space: a regression fails here instead of exhausting the machine
grep -qa __asan_init "$T" && vlim=unlimited # AddressSanitizer reserves terabytes up front
for n in $(seq 100000 100020); do
    head -c "$n" data/corpora/tinyshakespeare.txt >"$tmp/cut.txt"
    if ! (ulimit -v $vlim; timeout 60 "$T" tokenize "$tmp/cut.txt" --out "$tmp/cut_$n") >"$tmp/out" 2>&1; then
        echo "FAIL tokenize of the first $n bytes:"; sed 's/^/    /' "$tmp/out"; cut_ok=0; fail=1
    fi
done
[ $cut_ok = 1 ] && echo "ok   tokenize finishes for every size from 100000 to 100020 bytes"

[ $fail -eq 0 ] && echo "data_cli: all passed" || echo "data_cli: FAILED"
exit $fail
