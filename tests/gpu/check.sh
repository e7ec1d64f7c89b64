#!/usr/bin/env bash
# The one GPU check: build for Hopper (sm_90a) in build-gpu/, run every GPU test (the ctest
# label gpu, each binary once), run the GPU benchmark (bench/gpu.sh), and print a short table
# last: tests passed / failed / skipped, tokens/s and MFU. Logs go to $OUT when it is set (the
# device tool brings them back), else build-gpu/logs/. Meant to finish in well under 8 minutes
# on one H200.
#
# The GPU machine's image may lack Lua, OpenBLAS, libyaml and pkg-config and cannot reach a
# package registry: run tests/gpu/fetch_debs.sh beforehand on a machine that can, carry .deps/
# along, and this script unpacks the .deb files into a private prefix (dpkg -x, nothing is
# installed) and builds against it. Without a GPU it still builds, reports the tests as skipped
# and prints the table.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD="$ROOT/build-gpu"
ARCH="${TR_CUDA_ARCH:-90a}"
# a build folder configured for other architectures starts over
[ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=$ARCH\$" "$BUILD/CMakeCache.txt" &&
    rm -rf "$BUILD"
LOGS="${OUT:-$BUILD/logs}"
mkdir -p "$LOGS"
T0=$(date +%s)
say() { echo "check: $*" | tee -a "$LOGS/check.log"; }
: >"$LOGS/check.log"

# ---- GPU present? ------------------------------------------------------------------------
GPU="none"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$LOGS/nvidia-smi.txt" 2>&1; then
    GPU=$(head -1 "$LOGS/nvidia-smi.txt")
    nvidia-smi >>"$LOGS/nvidia-smi.txt" 2>&1
fi
say "GPU: $GPU"

# ---- dependencies: system packages, else the carried .deb files --------------------------
have_deps() {
    command -v pkg-config >/dev/null 2>&1 && pkg-config --exists lua5.4 &&
        { [ -e /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ] ||
          [ -e /usr/include/openblas/cblas.h ] || [ -e /usr/include/cblas.h ]; }
}
CMAKE_DEPS=()
if have_deps && [ -z "${TR_USE_DEPS:-}" ]; then  # TR_USE_DEPS=1: use .deps/ even so (to test it)
    say "dependencies: system packages"
elif ls "$ROOT"/.deps/*.deb >/dev/null 2>&1; then
    PREFIX="$ROOT/.deps/root"
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for f in "$ROOT"/.deps/*.deb; do dpkg -x "$f" "$PREFIX" || say "cannot unpack $f"; done
    LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
    export PATH="$PREFIX/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$LIBDIR:$LIBDIR/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
    export PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig"
    # pkg-config may be a symlink to pkgconf inside the prefix; either name works
    command -v pkg-config >/dev/null 2>&1 || ln -sf "$PREFIX/usr/bin/pkgconf" "$PREFIX/usr/bin/pkg-config"
    CMAKE_DEPS=(-DTR_DEPS_PREFIX="$PREFIX" -DPKG_CONFIG_EXECUTABLE="$(command -v pkg-config)")
    say "dependencies: unpacked $(ls "$ROOT"/.deps/*.deb | wc -l) .deb files into $PREFIX"
else
    say "dependencies: missing, and no .deps/*.deb to unpack (run tests/gpu/fetch_debs.sh and carry .deps)"
fi

# ---- build ---------------------------------------------------------------------------------
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
BUILD_OK=0
if cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTR_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${CMAKE_DEPS[@]}" >"$LOGS/configure.log" 2>&1 &&
    cmake --build "$BUILD" -j "$(nproc)" --target trainer test_cuda_kernels test_cuda_train \
        >"$LOGS/build.log" 2>&1; then
    BUILD_OK=1
    say "build: ok ($(( $(date +%s) - T0 )) s)"
else
    say "build: FAILED (see configure.log / build.log)"
    tail -30 "$LOGS/build.log" "$LOGS/configure.log" 2>/dev/null
fi

# ---- GPU tests -----------------------------------------------------------------------------
TESTS="not run"
if [ $BUILD_OK = 1 ]; then
    # the label "gpu" tests, each run once, directly (as ctest would: from tests/, exit 77 = skip)
    npass=0 nfail=0 nskip=0
    for t in test_cuda_kernels test_cuda_train; do
        (cd "$ROOT/tests" && timeout 300 "$BUILD/tests/$t") >"$LOGS/$t.log" 2>&1
        rc=$?
        echo "$t: exit $rc" >>"$LOGS/check.log"
        case $rc in 0) npass=$((npass + 1)) ;; 77) nskip=$((nskip + 1)) ;; *) nfail=$((nfail + 1)) ;; esac
    done
    ok=$(cat "$LOGS"/test_cuda_*.log 2>/dev/null | grep -c "^ok ")
    bad=$(cat "$LOGS"/test_cuda_*.log 2>/dev/null | grep -c "^FAIL")
    TESTS="passed $npass, failed $nfail, skipped $nskip; checks ok $ok, FAIL $bad"
    say "tests: $TESTS ($(( $(date +%s) - T0 )) s)"
    grep -h "^FAIL\|^SKIP" "$LOGS"/test_cuda_*.log | head -20
fi

# ---- benchmark -----------------------------------------------------------------------------
BENCH="$LOGS/bench_results.txt"
: >"$BENCH"
if [ $BUILD_OK = 1 ] && [ "$GPU" != none ]; then
    OUT="$LOGS" BENCH_RUNS="$BUILD/bench-runs" "$ROOT/bench/gpu.sh" "$BUILD/trainer" \
        >"$LOGS/bench_stdout.log" 2>&1
    say "bench: done ($(( $(date +%s) - T0 )) s)"
else
    printf '%-17s %12s %8s %s\n' gpt2_124m n/a n/a skipped gpt2_124m_simple n/a n/a skipped gpt2_xl n/a n/a skipped >"$BENCH"
    say "bench: skipped (no GPU or no build)"
fi

# ---- Nsight Compute on our own kernels, while time remains --------------------------------
# One bf16 step of a 2-block GPT-2 124M shape: each kernel's duration, and the memory tables
# (sectors per request, shared-memory bank conflicts) that bench/emu_memory.sh estimates on
# the CPU emulator, to set the two side by side. cuBLASLt's kernels are left out. Optional:
# ncu may be missing or unable to read the counters (H200.md: it can on Firecracker).
NCU="skipped"
left=$(( 450 - ($(date +%s) - T0) ))
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ $BUILD_OK = 1 ] && [ "$GPU" != none ] && [ -n "$NCU_BIN" ] && [ $left -gt 60 ]; then
    lim=$(( left < 150 ? left : 150 ))
    timeout "$lim" "$NCU_BIN" --clock-control none --target-processes all \
        -k 'regex:attn_|adamw|norm|xent|gelu|swiglu|rope|add_k|embedding|positions|colsum|sumsq' \
        --launch-count 40 --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
        "$BUILD/trainer" run recipes/gpt2_124m.lua --device cuda --set layers=2 --set seq=1024 \
        --set batch_tokens=4096 --micro-batch 4 --steps 1 --eval-every 0 --sample-tokens 0 \
        --out "$BUILD/ncu-run" >"$LOGS/ncu.log" 2>&1
    rc=$?
    NCU="exit $rc, $(grep -c 'Context [0-9]*, Stream' "$LOGS/ncu.log") kernel reports in ncu.log"
    say "ncu: $NCU ($(( $(date +%s) - T0 )) s)"
fi

# ---- the table, last -----------------------------------------------------------------------
{
    echo
    echo "=============================== GPU check ==============================="
    echo "device     $GPU"
    echo "arch       sm_$ARCH   build $([ $BUILD_OK = 1 ] && echo ok || echo FAILED)   wall $(( $(date +%s) - T0 )) s"
    echo "gpu tests  $TESTS"
    echo "ncu        $NCU"
    printf '%-17s %12s %8s %s\n' model tokens/s mfu status
    cat "$BENCH"
    echo "logs       $LOGS"
    echo "========================================================================="
} | tee "$LOGS/table.txt"
