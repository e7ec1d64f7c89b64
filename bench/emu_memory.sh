#!/usr/bin/env bash
# How the CUDA kernels use memory, measured without a GPU: one bf16 training step of a GPT-2
# 124M-shaped model and of a Llama-shaped one (width 768, 12 heads of 64, 2 blocks, sequence
# 256) on the CUDA emulator with its memory-access profiler (tests/cudaemu/emu_prof.cc). For
# each kernel: its share of all global-memory sectors, and each kind of access against its
# ideal, side by side:
#   gld/gst eff   global loads/stores: the fewest 32-byte sectors that hold the bytes a warp
#                 asked for, over the sectors it touched (100% = coalesced)
#   conflict      shared loads/stores: wavefronts needed over the fewest possible (1.00 = no
#                 bank conflicts)
# then, per kernel, the source lines costing most over their ideal. These are access-pattern
# figures, not times: caches, latency and the tensor cores are not modelled, and no GPU ran.
# Takes about 5 minutes on 2 cores. Usage: bench/emu_memory.sh [BUILD_DIR] (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target trainer_emu_prof -j "$(nproc)" >/dev/null
T="$BUILD/tests/trainer_emu_prof"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY=passive
step() { # name recipe knobs...
    local name=$1 recipe=$2
    shift 2
    local args=()
    for k in "$@"; do args+=(--set "$k"); done
    TR_EMU_PROF="$tmp/$name.txt" "$T" run "$recipe" "${args[@]}" --device cuda --precision bf16 \
        --micro-batch 1 --steps 1 --eval-every 0 --sample-tokens 0 --out "$tmp/$name" --overwrite \
        >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
    echo "== $name: one bf16 training step, $* (micro-batch 1)"
    cat "$tmp/$name.txt"
    echo
}
step gpt2_124m_shape recipes/gpt2_124m.lua layers=2 seq=256 batch_tokens=256 checkpoint_every=0
step llama_shape recipes/llama_tiny.lua checkpoint_every=0 layers=2 width=768 heads=12 kv_heads=4 hidden=2048 \
    seq=256 batch_tokens=256
