#!/usr/bin/env bash
# The kernels a matrix product brings on the CUDA backend, counted on the emulator: the
# planner prices a GPU's fixed cost per product as that count times one launch's published
# cost (parallel/plan_private.h, PL_GPU_KERNELS_PER_PRODUCT), and this holds the count to the
# code. For each recipe of tests/checkpoint/ (GPT-2- and Llama-shaped) at width 256 (4 heads
# of 64), one bf16 training step of one micro-batch with 1 block and with 2: the second
# block's kernels (the emulator's launches and its cuBLASLt products and cuDNN graphs,
# TR_EMU_STATS) over that block's products as the cost model counts them (model/cost.c:
# attention 4, the MLP 2, each 3 times: the forward and the backward's two). Each must be
# within 10% of the figure `trainer plan` shows for a GPU.
# usage: tests/emu_kernels.sh path/to/trainer_emu   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

# kernels of one step: R LAYERS -> prints launches + library calls
kernels() {
    local log=$tmp/$(basename "$1" .lua)-$2.log
    TR_EMU_STATS=1 "$T" run "$1" --set layers="$2" --set width=256 --set seq=32 \
        --set every=0 --set steps=1 --set out="$tmp/run" --set batch_tokens=32 --micro-batch 1 \
        --device cuda --precision bf16 --eval-every 0 --overwrite >"$log" 2>&1 || {
        echo "run failed: $(tail -1 "$log")" >&2
        return 1
    }
    sed -n 's/^cuda emulator stats: \([0-9]*\) launches,.* \([0-9]*\) library calls.*/\1 \2/p' \
        "$log" | awk '{ print $1 + $2 }'
}

each=$("$T" plan tests/checkpoint/gpt.lua --cluster recipes/clusters/h100x8.yaml 2>&1 |
    sed -n 's/.* \([0-9.]*\) kernels each (counted.*/\1/p')
if [ -z "$each" ]; then
    bad "trainer plan on a GPU does not show its kernels per matrix product"
else
    ok "the planner's figure: $each kernels per matrix product"
    for r in gpt llama; do
        one=$(kernels tests/checkpoint/$r.lua 1) && two=$(kernels tests/checkpoint/$r.lua 2) || {
            bad "$r: an emulated run failed"
            continue
        }
        line=$(awk -v a="$one" -v b="$two" -v e="$each" 'BEGIN {
            k = (b - a) / 18; d = k / e - 1; if (d < 0) d = -d
            printf "%s %d kernels for 18 products: %.2f each, %+.0f%% of %s", (d <= 0.10 ? "ok" : "bad"),
                b - a, k, 100 * (k / e - 1), e }')
        case $line in
        ok*) ok "$r: a block's ${line#ok }" ;;
        *) bad "$r: a block's ${line#bad } (more than 10%: count them again)" ;;
        esac
    done
fi
exit $fail
