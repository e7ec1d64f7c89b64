#!/usr/bin/env bash
# CPU training throughput: trainer against plain PyTorch (Debian's python3-torch, same model,
# same shapes, 2 threads, the same OpenBLAS kernels), side by side in one run. Prints
# tokens/s, GFLOP/s, the ratio, and the fraction of the machine's sgemm peak each reaches.
# Usage: bench/cpu.sh [steps]     (needs build/trainer and /usr/bin/python3 with torch)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-12}"
threads=2
export OMP_NUM_THREADS=$threads
T=build/trainer
[ -x "$T" ] || { echo "bench: build first (./setup.sh)"; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || {
    echo "bench: needs Debian's python3-torch: apt-get install python3-torch"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cores=()

# median tokens/s and GFLOP/s of a run's steps, skipping the first two (warm-up)
median() { # file key
    grep -o "\"$2\": [0-9.e+-]*" "$1" | tail -n +3 | awk '{print $2}' | sort -g |
        awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'
}

row() { # name recipe torch-args trainer-args...
    local name="$1" recipe="$2" targs="$3"
    shift 3
    $T run "$recipe" "$@" --steps "$steps" --eval-every 0 --sample-tokens 0 \
        --out "$tmp/$name" --overwrite >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
    local ours gf peak theirs
    ours=$(median "$tmp/$name/metrics.jsonl" tokens_per_s)
    gf=$(median "$tmp/$name/metrics.jsonl" gflops)
    peak=$(grep -o "peak [0-9.]* GFLOP/s" "$tmp/$name.log" | awk '{print $2}')
    # PyTorch (Debian's links OpenBLAS too) on the kernels our run had: OpenBLAS's own choice,
    # or those the trainer named where that choice fell short (model/cpu/blas_core.c)
    core=$(/usr/bin/python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["libraries"]["blas"].split(" MAX_THREADS")[0].split()[-1])' \
        "$tmp/$name/provenance.json")
    theirs=$(OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$core}" /usr/bin/python3 bench/torch_cpu.py \
        $targs --steps "$steps" --warmup 2 --threads $threads |
        grep -o '"tokens_per_s": [0-9.]*' | awk '{print $2}')
    cores+=("$core")
    awk -v n="$name" -v o="$ours" -v g="$gf" -v t="$theirs" -v p="$peak" 'BEGIN {
        tg = g * t / o
        printf "%-22s %10.0f %10.0f %8.2fx %9.1f %9.1f %8.1f%% %8.1f%%\n",
               n, o, t, o / t, g, tg, 100 * g / p, 100 * tg / p }'
}

printf "%-22s %10s %10s %9s %9s %9s %9s %9s\n" "shape" "trainer" "pytorch" "ratio" \
    "GFLOP/s" "pt GFLOP/s" "of peak" "pt peak"
printf "%-22s %10s %10s\n" "" "tok/s" "tok/s"
row "default (4x192, T128)" recipes/shakespeare_char.lua \
    "--flavour gpt --vocab 256 --dim 192 --layers 4 --heads 4 --hidden 768 --seq 128 --batch 32"
row "gpt2-124M (T256, B4)" recipes/gpt2_124m.lua \
    "--flavour gpt --vocab 50257 --dim 768 --layers 12 --heads 12 --hidden 3072 --seq 256 --batch 4" \
    --set seq=256 --set batch_tokens=1024 --set checkpoint_every=0
echo "peak = the best sgemm rate measured by trainer at start-up ($(grep -o 'peak [0-9.]* GFLOP/s' "$tmp"/*.log | head -1 | cut -d: -f2));"
echo "OpenBLAS's kernels, trainer's and PyTorch's alike: ${cores[*]} (OPENBLAS_CORETYPE names others);"
echo "FLOPs: matrix products, attention causal half, training = 3x forward (same count for both)."
