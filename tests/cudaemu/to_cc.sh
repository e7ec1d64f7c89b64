#!/bin/sh
# tests/cudaemu/to_cc.sh IN.cu OUT.cc: the CUDA source as C++ for the emulator (emu.h): a
# launch k<<<grid, block, smem, stream>>>(args) becomes EMU_LAUNCH(k, grid, block, smem,
# stream)(args), and `extern __shared__ [__align__(n)] T name[];` a pointer to the launch's
# dynamic shared memory. #line keeps compiler messages on the original file and line.
set -e
{
    printf '#line 1 "%s"\n' "$1"
    sed -E \
        -e 's/([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*<<</EMU_LAUNCH(\1, /g' \
        -e 's/>>>[[:space:]]*\(/)(/g' \
        -e 's/extern __shared__ (__align__\([0-9]+\) )?([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_]) ([A-Za-z_][A-Za-z0-9_]*)\[\];/\2 *\3 = (\2 *)emu_dyn_smem();/' \
        "$1"
} >"$2.tmp"
mv "$2.tmp" "$2"
