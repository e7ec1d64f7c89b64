#!/usr/bin/env bash
# OpenBLAS's kernels as the trainer runs them (model/cpu/blas_core.c): on a CPU with AVX2 and
# FMA, never one of the kernel sets older than AVX2 that OpenBLAS falls back to for a CPU model
# it does not know (Debian 12's 0.3.21 took an AVX-512 Xeon of model 207 for a "Prescott", SSE3);
# not in one process, not in each rank under mpirun, and the run's provenance names the kernels
# run; a user's OPENBLAS_CORETYPE is kept as given (one load, no second start).
# OPENBLAS_VERBOSE=2 makes OpenBLAS print "Core: NAME" as each load picks its kernels.
set -u
. "$(dirname "$0")/lib.sh"
T=$1
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
if has avx512f avx512bw avx512dq avx512vl; then
    want=SkylakeX
elif has avx2 fma; then
    want=Haswell
else
    echo "skipped: this CPU has neither AVX-512 nor AVX2 with FMA, so no kernels to name"
    exit 77
fi
old="Unknown|Katmai|Coppermine|Northwood|Prescott|Core2|Penryn|Dunnington|Nehalem|Sandybridge|Atom|Nano"
cores() { grep -o '^Core: [A-Za-z0-9]*' | awk '{print $2}' | xargs; }

first=$(env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 "$T" --version 2>&1 | cores)
[ -n "$first" ] || { echo "skipped: this BLAS prints no 'Core:' line (not OpenBLAS's DYNAMIC_ARCH build)"; exit 77; }
last=${first##* }
if [[ $last =~ ^($old)$ ]]; then
    bad "one process runs OpenBLAS's $last kernels on a CPU with $want's features (loads: $first)"
else
    ok "one process runs OpenBLAS's $last kernels (loads: $first; the CPU runs $want's)"
fi

# each rank of an MPI job: its last load's kernels
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    ranks=$(env -u OPENBLAS_CORETYPE mpirun -np 2 -x OPENBLAS_VERBOSE=2 sh -c \
        '"$0" --version 2>&1 | grep -o "^Core: [A-Za-z0-9]*" | tail -1' "$T" | awk '{print $2}' | xargs)
    if [ "$(wc -w <<<"$ranks")" -eq 2 ] && ! grep -qE "(^| )($old)( |$)" <<<"$ranks"; then
        ok "2 ranks under mpirun run OpenBLAS's $ranks kernels"
    else
        bad "2 ranks under mpirun run OpenBLAS's '$ranks' kernels"
    fi
fi

# the run's provenance names them (OpenBLAS's configuration line)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if env -u OPENBLAS_CORETYPE "$T" run tests/recipes_good/pp_gpt.lua --steps 2 --eval-every 0 \
    --out "$tmp/run" >"$tmp/run.log" 2>&1; then
    blas=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["libraries"]["blas"])' "$tmp/run/provenance.json")
    if grep -qiw "$last" <<<"$blas"; then
        ok "the run's provenance names the kernels: $blas"
    else
        bad "the run's provenance does not name $last: $blas"
    fi
else
    bad "the run failed: $(tail -2 "$tmp/run.log")"
fi

# a user's choice is kept: one load, their kernels
mine=$(OPENBLAS_CORETYPE=Prescott OPENBLAS_VERBOSE=2 "$T" --version 2>&1 | cores)
if [ "$mine" = Prescott ]; then
    ok "OPENBLAS_CORETYPE=Prescott is kept: one load, its kernels"
else
    bad "OPENBLAS_CORETYPE=Prescott not kept: the loads picked $mine"
fi

[ "$fail" -eq 0 ] && echo "blas_kernels: all passed" || echo "blas_kernels: FAILED"
exit "$fail"
