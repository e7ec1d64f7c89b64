#!/usr/bin/env bash
# Runs every fuzz target (tests/fuzz/fuzz_*.c) under libFuzzer with ASan and UBSan for a
# bounded time each, starting from its seeds (corpus/<target>/; the recipe and cluster targets:
# the test recipes and cluster files, see tests/fuzz/CMakeLists.txt). Fails on any crash,
# leak, UB or timeout, and says where the input that caused it was saved. Configures its own
# clang build (build-fuzz/, TR_FUZZ=ON; installs clang with apt-get when it is missing) and
# exits 77 (skipped) only when clang with libFuzzer cannot be had.
# Usage: tests/fuzz/run.sh [SECONDS_PER_TARGET [TARGET...]]   (default 10 s, every target)
#   TR_FUZZ_BUILD=DIR  the build folder (default build-fuzz)
# A longer run of one target by hand: tests/fuzz/run.sh 600 json
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
secs=${1:-10}
shift $(($# > 0 ? 1 : 0))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(json shard safetensors manifest tokenizer cluster recipe)
fi
build=${TR_FUZZ_BUILD:-build-fuzz}
start=$(date +%s)

# clang whose libFuzzer links: the plain name, else a versioned one
find_clang() {
    local c
    for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
        command -v "$c" >/dev/null 2>&1 || continue
        if printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' |
            "$c" -x c - -fsanitize=fuzzer,address,undefined -o /dev/null >/dev/null 2>&1; then
            command -v "$c"
            return 0
        fi
    done
    return 1
}
cc=$(find_clang)
if [ -z "$cc" ]; then
    echo "fuzz: no clang with libFuzzer; installing clang with apt-get"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    { $sudo apt-get update && $sudo apt-get install -y clang; } >/dev/null 2>&1
    cc=$(find_clang)
fi
if [ -z "$cc" ]; then
    echo "fuzz: skipped: no clang with libFuzzer and it could not be installed"
    exit 77
fi

# Warnings are gcc's job (the plain and ASan builds use -Werror); clang's differ (its
# -Wformat-nonliteral also flags vsnprintf wrappers), so this build does not stop on them.
echo "fuzz: building the targets with $cc in $build/"
mkdir -p "$build"
blog=$build/fuzz-build.log
if ! CC=$cc cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTR_FUZZ=ON \
    -DTR_CUDA=OFF -DTR_CUDA_EMU=OFF >"$blog" 2>&1 ||
    ! cmake --build "$build" -j "$(nproc)" --target fuzz_all >>"$blog" 2>&1; then
    tail -40 "$blog"
    echo "fuzz: FAILED to build the fuzz targets (log: $blog)"
    exit 1
fi
built=$(date +%s)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# one target: its verdict line (and where a failing input was saved); exit status 1 on failure
fuzz_one() {
    local t=$1 bin=$build/tests/fuzz/fuzz_$1 seeds=tests/fuzz/corpus/$1
    # new inputs go to a work corpus in the build, not into the source tree
    local work=$build/fuzz/$t/corpus art=$build/fuzz/$t/artifacts log=$build/fuzz/$t/log
    mkdir -p "$work" "$art"
    rm -f "$art"/*
    # the seeds: corpus/<target>/ where there is one, and the files the build lists for the
    # target (tests/fuzz/CMakeLists.txt: the test recipes and cluster files where they live)
    local dirs=("$work") more=() list=$build/tests/fuzz/seeds_$t.txt
    [ -d "$seeds" ] && dirs+=("$seeds")
    [ -s "$list" ] && more=(-seed_inputs=@"$list")
    "$bin" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$art/" "${more[@]}" "${dirs[@]}" >"$log" 2>&1
    local rc=$? runs cov
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    if [ $rc -ne 0 ] || [ -n "$(ls -A "$art")" ]; then
        grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | head -5
        for f in "$art"/*; do
            [ -e "$f" ] || continue
            echo "fuzz: FAIL $t: the input is saved at $f"
            echo "  replay it: $bin $f   (full log: $log)"
            echo "  once fixed, commit it as a regression input: mkdir -p $seeds; cp $f $seeds/regress-NAME"
        done
        [ -n "$(ls -A "$art")" ] || echo "fuzz: FAIL $t: exit $rc (log: $log)"
        return 1
    fi
    echo "fuzz: ok $t: ${runs:-?} inputs in ${secs} s, ${cov:-cov ?}"
}
# as many targets at once as there are cores (each fuzzer is one process on one core); each
# one's lines are printed when it ends, in the targets' order
failed=0
lanes=$(nproc)
mkdir -p "$build/fuzz"
for ((i = 0; i < ${#targets[@]}; i += lanes)); do
    for t in "${targets[@]:i:lanes}"; do
        fuzz_one "$t" >"$build/fuzz/$t.out" 2>&1 &
    done
    for t in "${targets[@]:i:lanes}"; do
        wait -n || failed=1
    done
    for t in "${targets[@]:i:lanes}"; do cat "$build/fuzz/$t.out"; done
done
end=$(date +%s)
echo "fuzz: build $((built - start)) s, fuzzing $((end - built)) s"
exit $failed
