#!/usr/bin/env bash
# The one GPU check: build for Hopper (sm_90a) in build-gpu/, run every GPU test (the ctest
# label gpu, each binary once, and the kernels and training again on cuDNN's attention; test_comm_device also on a NCCL communicator of one, under
# mpirun with 2 ranks sharing a GPU (staged transport) and with one rank per GPU when there are
# several (NCCL)), train dp=2, tp=2 and pp=2 in fp32 on the GPU against the CPU (as
# tests/emu_parallel.sh does on the emulator), run the GPU benchmarks (bench/gpu.sh,
# bench/comm.sh), and print a short table last: tests passed / failed / skipped, the parallel
# runs, tokens/s and MFU, communication figures. Logs go to build-gpu/logs/; when $OUT is set
# (the device tool brings back at most 8 files from it) they also go there as one gpu-logs.tgz,
# beside table.txt. Every step has a timeout, and every step after the build also stops
# TR_CHECK_SECONDS (default 450) after the start, so that the whole check stays under 8 minutes
# on one H200; a step that would start with under 10 s left is skipped and said so.
#
# The GPU machine's image may lack Lua, OpenBLAS, libyaml, pkg-config and Open MPI and cannot
# reach a package registry: run tests/gpu/fetch_debs.sh beforehand on a machine that can, carry
# .deps/ along, and this script unpacks the .deb files into private prefixes under build-gpu/
# (dpkg -x, nothing is installed; Open MPI relocated by OPAL_PREFIX) and builds against them.
# NCCL: the CUDA toolkit's or the system's, else the one PyTorch's wheels bring. Without a GPU
# it still builds, reports the tests as skipped and prints the table.
set -uo pipefail
case "${TR_CHECK_SECONDS:-450}" in
'' | *[!0-9]*) echo "check: TR_CHECK_SECONDS='$TR_CHECK_SECONDS' is not a whole number of seconds" >&2 && exit 2 ;;
esac
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BUILD="$ROOT/build-gpu"
ARCH="${TR_CUDA_ARCH:-90a}"
# a build folder configured for other architectures starts over
[ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=$ARCH\$" "$BUILD/CMakeCache.txt" &&
    rm -rf "$BUILD"
LOGS="$BUILD/logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
T0=$(date +%s)
DEADLINE=$((T0 + ${TR_CHECK_SECONDS:-450}))
say() { echo "check: $*" | tee -a "$LOGS/check.log"; }
: >"$LOGS/check.log"
# lim S: the seconds a step may take: S, or what is left before the deadline if less
lim() {
    local left=$((DEADLINE - $(date +%s)))
    [ $left -lt 0 ] && left=0
    echo $(($1 < left ? $1 : left))
}

# ---- GPU present? ------------------------------------------------------------------------
GPU="none"
NGPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$LOGS/nvidia-smi.txt" 2>&1; then
    GPU=$(head -1 "$LOGS/nvidia-smi.txt")
    NGPU=$(grep -c '^GPU ' "$LOGS/nvidia-smi.txt")
    nvidia-smi >>"$LOGS/nvidia-smi.txt" 2>&1
fi
say "GPU: $GPU ($NGPU in all)"

# ---- dependencies: system packages, else the carried .deb files --------------------------
have_deps() {
    command -v pkg-config >/dev/null 2>&1 && pkg-config --exists lua5.4 libsodium &&
        { [ -e /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ] ||
          [ -e /usr/include/openblas/cblas.h ] || [ -e /usr/include/cblas.h ]; }
}
CMAKE_DEPS=()
rm -rf "$ROOT/.deps/root" # where earlier versions unpacked: it must not travel with .deps/
DEPS="$BUILD/deps"
if have_deps && [ -z "${TR_USE_DEPS:-}" ]; then  # TR_USE_DEPS=1: use .deps/ even so (to test it)
    say "dependencies: system packages"
elif ls "$ROOT"/.deps/*.deb >/dev/null 2>&1; then
    PREFIX="$DEPS/root"
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for f in "$ROOT"/.deps/*.deb; do dpkg -x "$f" "$PREFIX" || say "cannot unpack $f"; done
    LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
    export PATH="$PREFIX/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$LIBDIR:$LIBDIR/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
    # Debian's multiarch headers (lua5.4-deb-multiarch.h, included by luaconf.h): a compiler
    # outside Debian does not look there
    export CPATH="$PREFIX/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
    export PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig"
    # pkg-config may be a symlink to pkgconf inside the prefix; either name works
    command -v pkg-config >/dev/null 2>&1 || ln -sf "$PREFIX/usr/bin/pkgconf" "$PREFIX/usr/bin/pkg-config"
    CMAKE_DEPS=(-DTR_DEPS_PREFIX="$PREFIX" -DPKG_CONFIG_EXECUTABLE="$(command -v pkg-config)")
    say "dependencies: unpacked $(ls "$ROOT"/.deps/*.deb | wc -l) .deb files into $PREFIX"
else
    say "dependencies: missing, and no .deps/*.deb to unpack (run tests/gpu/fetch_debs.sh and carry .deps)"
fi

# ---- Open MPI: the system's, else the carried .deb files in a prefix of their own ----------
if command -v mpirun >/dev/null 2>&1 && [ -z "${TR_USE_DEPS:-}" ]; then
    say "Open MPI: system ($(command -v mpirun))"
elif ls "$ROOT"/.deps/mpi/*.deb >/dev/null 2>&1; then
    MPREFIX="$DEPS/mpi"
    rm -rf "$MPREFIX"
    mkdir -p "$MPREFIX"
    for f in "$ROOT"/.deps/mpi/*.deb; do dpkg -x "$f" "$MPREFIX" || say "cannot unpack $f"; done
    MLIB="$MPREFIX/usr/lib/x86_64-linux-gnu"
    # the links Debian's alternatives would make (dpkg -x runs no maintainer script)
    for t in mpirun mpiexec mpicc; do ln -sf "$t.openmpi" "$MPREFIX/usr/bin/$t"; done
    for f in "$MPREFIX"/usr/lib/libpsm1/libpsm_infinipath.so.1.*; do
        [ -e "$f" ] && ln -sf "$f" "$MLIB/libpsm_infinipath.so.1" # libfabric needs it
    done
    # Open MPI and PMIx look for their plugins, wrapper data and help files under the prefix
    # they were built for (/usr) unless told
    export OPAL_PREFIX="$MPREFIX/usr" PMIX_MCA_mca_base_component_path="$MLIB/pmix2/lib/pmix"
    export PATH="$MPREFIX/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$MLIB:$MLIB/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    CMAKE_DEPS+=(-DMPI_C_COMPILER="$MPREFIX/usr/bin/mpicc")
    say "Open MPI: unpacked $(ls "$ROOT"/.deps/mpi/*.deb | wc -l) .deb files into $MPREFIX (OPAL_PREFIX)"
else
    say "Open MPI: none (no mpirun, and no .deps/mpi/*.deb: run tests/gpu/fetch_debs.sh and carry .deps): the multi-rank checks are skipped"
fi
MPIRUN=$(command -v mpirun || true)
if [ -n "$MPIRUN" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    # no ssh on the image: Open MPI's launcher for one host then; no single-copy (CMA) transfers
    # between ranks, which need ptrace rights a VM may refuse (the staged transport slows)
    command -v ssh >/dev/null 2>&1 || command -v rsh >/dev/null 2>&1 || export OMPI_MCA_plm=isolated
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
fi

# ---- NCCL and cuDNN: the toolkit's or the system's (CMake finds those), else the ones
# PyTorch's wheels bring (python3's nvidia.nccl, nvidia.cudnn) ----------------------------
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_DIR=$(dirname "$(dirname "$NVCC")")
# from_wheel LABEL MODULE HEADER LIB VAR: VAR_INCLUDE and VAR_LIB for CMake from the wheel's
# nvidia.MODULE when HEADER is neither beside the toolkit nor under /usr/include
from_wheel() {
    local label=$1 mod=$2 header=$3 lib=$4 var=$5 f d so
    for f in "$CUDA_DIR"/include/"$header" "$CUDA_DIR"/targets/*/include/"$header" \
        /usr/include/"$header" /usr/include/x86_64-linux-gnu/"${header%.h}"*.h; do
        [ -e "$f" ] && return
    done
    d=$(python3 -c "import nvidia.$mod as m; print(list(m.__path__)[0])" 2>/dev/null)
    so=$([ -n "$d" ] && ls "$d"/lib/"$lib".so* 2>/dev/null | head -1)
    if [ -n "$d" ] && [ -e "$d/include/$header" ] && [ -n "$so" ]; then
        CMAKE_DEPS+=(-D"$var"_INCLUDE="$d/include" -D"$var"_LIB="$so")
        export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        say "$label: the Python package's, $so"
    else
        say "$label: none found (no $header by the toolkit or in /usr/include, no nvidia.$mod package)"
    fi
}
from_wheel NCCL nccl nccl.h libnccl TR_NCCL
from_wheel cuDNN cudnn cudnn_graph.h libcudnn TR_CUDNN

# ---- build ---------------------------------------------------------------------------------
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
BUILD_OK=0
COMM_BENCH="not built"
if cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTR_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${CMAKE_DEPS[@]}" >"$LOGS/configure.log" 2>&1 &&
    cmake --build "$BUILD" -j "$(nproc)" --target trainer test_cuda_kernels test_cuda_train \
        test_comm_device >"$LOGS/build.log" 2>&1; then
    BUILD_OK=1
    say "build: ok ($(( $(date +%s) - T0 )) s); $(grep -o 'MPI: [A-Z]*' "$LOGS/configure.log" | head -1)"
    # comm_bench exists where CMake found NCCL (with the CUDA backend)
    if grep -Eq '^TR_NCCL_LIB:[A-Z]+=.*nccl' "$BUILD/CMakeCache.txt" &&
        ! grep -Eq '^TR_NCCL_(LIB|INCLUDE):[A-Z]+=.*NOTFOUND' "$BUILD/CMakeCache.txt"; then
        if cmake --build "$BUILD" -j "$(nproc)" --target comm_bench >>"$LOGS/build.log" 2>&1; then
            COMM_BENCH="built"
        else
            COMM_BENCH="FAILED to build (see build.log)"
        fi
    else
        COMM_BENCH="not built: CMake found no NCCL"
    fi
    say "comm_bench: $COMM_BENCH"
else
    say "build: FAILED (see configure.log / build.log)"
    tail -30 "$LOGS/build.log" "$LOGS/configure.log" 2>/dev/null
fi

# ---- GPU tests -----------------------------------------------------------------------------
TESTS="not run"
TESTLIST=""
LAST=""
npass=0 nfail=0 nskip=0
# run_test NAME SECONDS [VAR=VALUE...] BINARY|mpirun ... : one run of a test binary from tests/
# (as ctest runs it; exit 77 = skipped), its output in NAME.log
run_test() {
    local name=$1 limit=$2 rc st
    shift 2
    if [ "$limit" -lt 10 ]; then
        rc=skip st="skipped (no time left)"
    else
        (cd "$ROOT/tests" && timeout "$limit" env "$@") >"$LOGS/$name.log" 2>&1
        rc=$?
        case $rc in 0) st=ok ;; 77) st=skipped ;; 124) st="FAILED (timed out)" ;; *) st="FAILED (exit $rc)" ;; esac
    fi
    echo "$name: exit $rc" >>"$LOGS/check.log"
    case $st in ok) npass=$((npass + 1)) ;; skip*) nskip=$((nskip + 1)) ;; *) nfail=$((nfail + 1)) ;; esac
    TESTLIST="$TESTLIST${TESTLIST:+, }$name $st"
    LAST=$st
}
# skip_test NAME WHY
skip_test() {
    nskip=$((nskip + 1))
    TESTLIST="$TESTLIST${TESTLIST:+, }$1 skipped ($2)"
    echo "$1: skipped ($2)" >>"$LOGS/check.log"
}
# want NAME TRANSPORT: a passing multi-rank run must have used that device transport
want() {
    if [ "$LAST" = ok ] && ! grep -q "transport $2 " "$LOGS/$1.log"; then
        npass=$((npass - 1)) nfail=$((nfail + 1))
        TESTLIST="${TESTLIST% ok} FAILED (transport not $2)"
    fi
}
if [ $BUILD_OK = 1 ]; then
    T="$BUILD/tests"
    # the label "gpu" tests: up to 300 s each, and at least 60 whatever the deadline (the
    # check is for them)
    for t in test_cuda_kernels test_cuda_train test_comm_device; do
        l=$(lim 300)
        run_test "$t" $((l < 60 ? 60 : l)) "$T/$t"
    done
    # cuDNN's fused attention (a build with cuDNN): the op against the CPU, then training with
    # it against ours, as test_cudnn_attention_emu and test_cuda_train_emu_cudnn do emulated
    if grep -q "^TR_CUDNN_LIB:FILEPATH=/" "$BUILD/CMakeCache.txt" 2>/dev/null; then
        run_test test_cudnn_attention "$(lim 120)" TR_TEST_CUDNN=1 "$T/test_cuda_kernels"
        run_test test_cuda_train_cudnn "$(lim 180)" TR_TEST_CUDNN=1 "$T/test_cuda_train"
    else
        for t in test_cudnn_attention test_cuda_train_cudnn; do skip_test "$t" "built without cuDNN"; done
    fi
    if [ "$GPU" = none ]; then
        for t in nccl1 np2_shared npN; do skip_test "test_comm_device_$t" "no GPU"; done
    else
        # a NCCL communicator of one
        run_test test_comm_device_nccl1 "$(lim 120)" TR_COMM_DEVICE=nccl "$T/test_comm_device"
        if [ -z "$MPIRUN" ]; then
            for t in np2_shared npN; do skip_test "test_comm_device_$t" "no mpirun"; done
        else
            # two ranks on one GPU: NCCL refuses that, comm.h stages through the host
            run_test test_comm_device_np2_shared "$(lim 120)" CUDA_VISIBLE_DEVICES=0 \
                "$MPIRUN" --bind-to none -np 2 "$T/test_comm_device"
            want test_comm_device_np2_shared staged
            if [ "$NGPU" -ge 2 ]; then
                run_test "test_comm_device_np$NGPU" "$(lim 120)" "$MPIRUN" --bind-to none \
                    -np "$NGPU" "$T/test_comm_device"
                want "test_comm_device_np$NGPU" nccl
            else
                skip_test test_comm_device_npN "1 GPU"
            fi
        fi
    fi
    ok=$(cat "$LOGS"/test_*.log 2>/dev/null | grep -c "^ok ")
    bad=$(cat "$LOGS"/test_*.log 2>/dev/null | grep -c "^FAIL")
    TESTS="passed $npass, failed $nfail, skipped $nskip; checks ok $ok, FAIL $bad"
    say "tests: $TESTS ($(( $(date +%s) - T0 )) s)"
    grep -h "^FAIL\|^SKIP" "$LOGS"/test_*.log | head -20
fi

# ---- multi-rank training on the GPU against the CPU --------------------------------------
# tests/emu_parallel.sh's checks 1, 4 and 6 on the real device: dp=2 (ZeRO 0, 1, 2), tp=2 and
# pp=2 in fp32 (no TF32) on the GPU, every loss within 1e-4 relative of the CPU's run of the
# same layout; and the ledger of the dp=2 run has NVML's power, SM clock and temperature. On one
# GPU the two ranks share it (comm.h's staged transport); on several, one each (NCCL).
PAR=()
PARDIR="$BUILD/par-runs"
par_run() { # name flags...: 6 steps of tests/checkpoint/gpt.lua on 2 ranks; losses in name.l
    local name=$1 t
    shift
    t=$(lim 120)
    [ "$t" -lt 15 ] && return 2
    rm -rf "${PARDIR:?}/$name"
    (cd "$ROOT" && timeout "$t" "$MPIRUN" --bind-to none -np 2 "$BUILD/trainer" run \
        tests/checkpoint/gpt.lua --set steps=6 --set every=0 --eval-every 0 --peak-gflops 100 \
        --timeout 60 --out "$PARDIR/$name" "$@") >"$LOGS/par_$name.log" 2>&1 || return 1
    sed -n 's/^{"step": *\([0-9]*\), *"loss": *\([-0-9.eE+]*\).*/\1 \2/p' \
        "$PARDIR/$name/metrics.jsonl" >"$PARDIR/$name.l"
    [ -s "$PARDIR/$name.l" ]
}
par_check() { # label device-run cpu-run flags: both runs, then every step's loss compared
    local label=$1 dev=$2 cpu=$3 r
    shift 3
    par_run "$cpu" --device cpu "$@"
    r=$?
    [ $r = 0 ] && { par_run "$dev" --device cuda --precision fp32 "$@"; r=$((r + $? * 10)); }
    if [ $r = 2 ] || [ $r = 20 ]; then
        PAR+=("$label: skipped (no time left)")
    elif [ $r = 1 ]; then
        PAR+=("$label: FAILED: the CPU run (par_$cpu.log)")
    elif [ $r != 0 ]; then
        PAR+=("$label: FAILED: the GPU run (par_$dev.log)")
    elif r=$(awk 'NR == FNR { c[$1] = $2; next } ($1 in c) {
                 n++; d = $2 - c[$1]; d = d < 0 ? -d : d; m = c[$1] < 0 ? -c[$1] : c[$1]
                 r = m > 0 ? d / m : d; if (r > w) w = r }
             END { if (!n) { print "no steps in common"; exit 1 }
                   printf "%d steps, worst rel diff %.2e", n, w; exit !(w <= 1e-4) }' \
             "$PARDIR/$cpu.l" "$PARDIR/$dev.l"); then
        PAR+=("$label: ok, $r (tol 1e-4)")
    else
        PAR+=("$label: FAILED, $r (tol 1e-4)")
    fi
}
if [ $BUILD_OK = 1 ] && [ "$GPU" != none ] && [ -n "$MPIRUN" ]; then
    mkdir -p "$PARDIR"
    how=$([ "$NGPU" -ge 2 ] && echo "2 GPUs, NCCL" || echo "2 ranks share the GPU, staged")
    par_check "dp=2 fp32 GPU vs CPU ($how)" dev-dp cpu-dp --dp 2 --zero 0
    # ZeRO-1 and 2: the updated parameters come back during the next forward (dp_params.c)
    par_check "dp=2 ZeRO-1 fp32 GPU vs CPU ($how)" dev-z1 cpu-z1 --dp 2 --zero 1
    par_check "dp=2 ZeRO-2 fp32 GPU vs CPU, micro-batch 4 ($how)" dev-z2 cpu-z2 --dp 2 --zero 2 \
        --micro-batch 4
    par_check "tp=2 fp32 GPU vs CPU ($how)" dev-tp cpu-tp --tp 2
    # on 2 GPUs the pipeline's sends and receives go device to device over NCCL channels
    par_check "pp=2 fp32 GPU vs CPU ($how)" dev-pp cpu-pp --pp 2
    # the ledger's NVML figures of the GPU run's last window (null: NVML did not answer)
    tele=$(grep -o '"\(power_w\|sm_clock_mhz\|temp_c\)": \[[^]]*\]' "$PARDIR/dev-dp/ledger.jsonl" \
        2>/dev/null | tail -n 3 | tr '\n' ' ')
    case "$tele" in
    *null* | "") PAR+=("ledger NVML figures: FAILED: '${tele:-no ledger.jsonl}'") ;;
    *) PAR+=("ledger NVML figures: ok, $tele") ;;
    esac
    for l in "${PAR[@]}"; do say "parallel: $l"; done
    say "parallel: done ($(( $(date +%s) - T0 )) s)"
else
    why=""
    [ $BUILD_OK = 1 ] || why="$why, no build"
    [ "$GPU" != none ] || why="$why, no GPU"
    [ -n "$MPIRUN" ] || why="$why, no mpirun"
    PAR=("dp=2, tp=2 and pp=2 on the GPU vs the CPU: skipped (${why#, })")
fi

# ---- benchmark -----------------------------------------------------------------------------
BENCH="$LOGS/bench_results.txt"
: >"$BENCH"
if [ $BUILD_OK = 1 ] && [ "$GPU" != none ]; then
    OUT="$LOGS" BENCH_RUNS="$BUILD/bench-runs" BENCH_SECONDS="$(lim 300)" \
        "$ROOT/bench/gpu.sh" "$BUILD/trainer" >"$LOGS/bench_stdout.log" 2>&1
    say "bench: done ($(( $(date +%s) - T0 )) s)"
else
    printf '%-17s %12s %8s %s\n' gpt2_124m n/a n/a skipped gpt2_124m_simple n/a n/a skipped gpt2_xl n/a n/a skipped >"$BENCH"
    say "bench: skipped (no GPU or no build)"
fi

# ---- communication benchmark ---------------------------------------------------------------
# bench/comm.sh: bus bandwidth through comm.h against NCCL, or on one GPU what can be measured
# there, and the hidden share of a data-parallel run (after bench/gpu.sh: its BPE shards)
COMM="$LOGS/comm_stdout.log"
: >"$COMM"
if [ $BUILD_OK = 1 ]; then
    t=$(lim 240)
    if [ "$t" -ge 30 ] || [ "$GPU" = none ]; then
        OUT="$LOGS" BENCH_RUNS="$BUILD/bench-runs" COMM_SECONDS="$t" "$ROOT/bench/comm.sh" "$BUILD" \
            >"$COMM" 2>&1
        say "comm bench: done ($(( $(date +%s) - T0 )) s)"
    else
        echo "comm: skipped (no time left)" >"$COMM"
    fi
else
    echo "comm: skipped (no build)" >"$COMM"
fi

# ---- Nsight Compute on our own kernels, while time remains --------------------------------
# One bf16 step of a 2-block GPT-2 124M shape: each kernel's duration, and the memory tables
# (sectors per request, shared-memory bank conflicts) that bench/emu_memory.sh estimates on
# the CPU emulator, to set the two side by side. cuBLASLt's kernels are left out. Optional:
# ncu may be missing or unable to read the counters (H200.md: it can on Firecracker).
NCU="skipped"
left=$(lim 450)
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ $BUILD_OK = 1 ] && [ "$GPU" != none ] && [ -n "$NCU_BIN" ] && [ "$left" -gt 60 ]; then
    lim=$(( left < 150 ? left : 150 ))
    timeout "$lim" "$NCU_BIN" --clock-control none --target-processes all \
        -k 'regex:attn_|adamw|norm|xent|gelu|swiglu|rope|add_k|embedding|positions|colsum|sumsq' \
        --launch-count 40 --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
        "$BUILD/trainer" run recipes/gpt2_124m.lua --device cuda --set layers=2 --set seq=1024 \
        --set batch_tokens=4096 --micro-batch 4 --steps 1 --eval-every 0 --sample-tokens 0 \
        --set checkpoint_every=0 --out "$BUILD/ncu-run" >"$LOGS/ncu.log" 2>&1
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
    echo "$TESTLIST" | fold -s -w 78 | sed 's/^/           /'
    for l in "${PAR[@]}"; do echo "parallel   $l"; done
    # device memory: the runs' own count against the plan, then the device's (cudaMemGetInfo:
    # the CUDA context and the libraries' and NCCL's buffers too) against the plan with the
    # runtime's reserve (trainer/run/train.c), from bench/gpu.sh's runs: one process each
    for f in "$LOGS"/bench_gpt2_124m.log "$LOGS"/bench_gpt2_xl.log; do
        [ -f "$f" ] || continue
        echo "memory     $(basename "$f" .log | sed 's/^bench_//'): $(grep -m1 '^device memory: predicted' "$f" | sed 's/^device memory: //')"
        echo "           $(grep -m1 '^device memory: in use' "$f" | sed 's/^device memory: //')"
    done
    echo "ncu        $NCU"
    printf '%-17s %12s %8s %s\n' model tokens/s mfu status
    cat "$BENCH"
    # the communication lines but fp32's (in comm_stdout.log and comm_*.log)
    grep '^comm:' "$COMM" | grep -v ' f32 ' | sed 's/^comm: /comm       /'
    echo "logs       $LOGS"
    echo "========================================================================="
} | tee "$LOGS/table.txt"
# what the device tool brings back: the table and every log in one archive
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    cp "$LOGS/table.txt" "$OUT/" 2>/dev/null
    tar czf "$OUT/gpu-logs.tgz" -C "$BUILD" logs 2>/dev/null || echo "check: could not archive $LOGS"
fi
