#!/usr/bin/env bash
# Data pipeline figures: GPT-2 BPE throughput of `trainer tokenize` (MB/s on one core and on
# every core) against OpenAI's tiktoken on one core (built from the same data/gpt2/ files,
# no download), on the shipped text and on a larger generated multilingual corpus; and the
# share of step time the training loop waits for data at the core recipe's throughput.
# Needs: build/trainer (./setup.sh) and tiktoken (pip install tiktoken) for the comparison.
# Usage: bench/data.sh [MB of generated corpus, default 40]
set -euo pipefail
cd "$(dirname "$0")/.."
T=build/trainer
MB="${1:-40}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)

python3 - "$tmp/big.txt" "$MB" <<'PY'
import random, sys
rng = random.Random(0)
shakes = open("data/corpora/tinyshakespeare.txt", encoding="utf-8").read().split("\n")
words = ["Привет", "мир", "こんにちは", "世界", "café", "naïve", "Ελληνικά", "مرحبا", "😀", "👍🏽",
         "x = f(y) + 42;", "don't", "it's", "   ", "\t", "3.14159", "2024-05-20", "http://a.b/c?d=1"]
out, size, target = [], 0, int(sys.argv[2]) << 20
while size < target:
    if rng.random() < 0.8:
        line = rng.choice(shakes)
    else:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 15)))
    out.append(line)
    size += len(line.encode("utf-8")) + 1
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(out))
PY

rate() { # rate FILE THREADS -> MB/s of trainer tokenize (best of 3)
    local best=0 r
    for _ in 1 2 3; do
        r=$("$T" tokenize "$1" --out "$tmp/out" --val-fraction 0 --threads "$2" 2>/dev/null |
            sed -n 's/.*(\([0-9.]*\) MB\/s.*/\1/p')
        best=$(awk -v a="$best" -v b="$r" 'BEGIN { print (b > a ? b : a) }')
    done
    echo "$best"
}
tik() { # tik FILE -> MB/s of tiktoken encode_ordinary on one thread (best of 3)
    python3 - "$1" <<'PY' 2>/dev/null || echo "n/a"
import sys, time
sys.path.insert(0, "bench")
import tiktoken_gpt2
enc = tiktoken_gpt2.gpt2_encoding()
text = open(sys.argv[1], encoding="utf-8").read()
size = len(text.encode("utf-8")) / 1e6
best = 0
for _ in range(3):
    t0 = time.perf_counter()
    enc.encode_ordinary(text)
    best = max(best, size / (time.perf_counter() - t0))
print("%.1f" % best)
PY
}

echo "GPT-2 BPE tokenizer throughput (MB/s; trainer includes reading and writing shards)"
printf "%-34s %10s %10s %10s %12s %14s\n" corpus "trainer/1" "trainer/$cores" tiktoken/1 "ratio 1-core" "scaling x$cores"
for f in data/corpora/tinyshakespeare.txt "$tmp/big.txt"; do
    name=$(basename "$f")
    [ "$f" = "$tmp/big.txt" ] && name="generated multilingual ${MB} MB"
    r1=$(rate "$f" 1)
    rn=$(rate "$f" "$cores")
    tk=$(tik "$f")
    ratio=$(awk -v a="$r1" -v b="$tk" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "n/a" }')
    scale=$(awk -v a="$r1" -v b="$rn" 'BEGIN { printf "%.2f", b / a }')
    printf "%-34s %10s %10s %10s %12s %14s\n" "$name" "$r1" "$rn" "$tk" "$ratio" "$scale"
done

echo
echo "Loader: share of training time spent waiting for the next micro-batch"
for r in recipes/shakespeare_char.lua recipes/shakespeare_bpe.lua; do
    line=$("$T" run "$r" --steps 40 --eval-every 0 --sample-tokens 0 --out "$tmp/run" --overwrite 2>&1 |
        grep "^done:")
    printf "%-34s %s\n" "$(basename "$r")" "$(echo "$line" | sed 's/^done: //')"
done
