#!/usr/bin/env bash
# The GPU check's and benchmark's time settings: a value that is not a whole number of seconds
# ends the script at once with one line naming it and exit 2 (bash's arithmetic would read
# "abc" as 0 and skip every step). Runs anywhere: the scripts stop before building anything.
set -u
cd "$(dirname "$0")/../.." || exit 1
fails=0
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
expect() { # NAME VALUE SCRIPT
    local out rc
    out=$(env "$1=$2" OUT="$tmp" BENCH_RUNS="$tmp/runs" bash "$3" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
        printf '%s' "$out" | grep -q "$1='$2' is not a whole number of seconds"; then
        echo "ok: $3 with $1='$2': $out"
    else
        echo "FAIL: $3 with $1='$2': exit $rc, said: $out"
        fails=$((fails + 1))
    fi
}
for v in abc 12x -5 1.5; do
    expect TR_CHECK_SECONDS "$v" tests/gpu/check.sh
    expect BENCH_SECONDS "$v" bench/gpu.sh
done
[ $fails -eq 0 ] && echo "gpu_bad_settings: all passed" || exit 1
