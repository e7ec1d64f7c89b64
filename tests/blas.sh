#!/usr/bin/env bash
# The BLAS's threads: a run that loads OpenBLAS's pthreads build (a thread pool of its own,
# which spins against our OpenMP one) says so in one line naming the library file and the fix,
# and provenance.json records "blas_threads": "pthreads"; the build the trainer links (the
# OpenMP one) says nothing and records "openmp". The pthreads build is Debian's
# libopenblas0-pthread, unpacked into a temporary folder (never installed: it would become the
# system's default libopenblas.so.0); skipped (77) when it cannot be downloaded.
# usage: tests/blas.sh path/to/trainer   (run from the repository root)
set -u
. "$(dirname "$0")/lib.sh"
T="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
R=tests/recipes_good/dp_tiny.lua

threads() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["libraries"]["blas_threads"])' "$1"; }

"$T" run "$R" --steps 2 --out "$tmp/omp" >"$tmp/omp.log" 2>"$tmp/omp.err" || { bad "run exited $?: $(tail -1 "$tmp/omp.err")"; exit 1; }
if [ ! -s "$tmp/omp.err" ] && [ "$(threads "$tmp/omp/provenance.json")" = openmp ]; then
    ok "the linked OpenBLAS runs on our OpenMP threads: no warning, provenance says openmp"
else
    bad "linked OpenBLAS: stderr '$(head -c 300 "$tmp/omp.err")', provenance '$(threads "$tmp/omp/provenance.json")'"
fi

(cd "$tmp" && apt-get download libopenblas0-pthread >/dev/null 2>&1) &&
    dpkg -x "$tmp"/libopenblas0-pthread_*.deb "$tmp/root" 2>/dev/null ||
    { echo "SKIP cannot download libopenblas0-pthread"; exit 77; }
lib=$(dirname "$(find "$tmp/root" -name libopenblas.so.0 | head -1)")
LD_LIBRARY_PATH="$lib" OMP_NUM_THREADS=2 "$T" run "$R" --steps 2 --out "$tmp/pth" >"$tmp/pth.log" 2>"$tmp/pth.err" ||
    { bad "run on the pthreads build exited $?: $(tail -1 "$tmp/pth.err")"; exit 1; }
if [ "$(wc -l <"$tmp/pth.err")" -eq 1 ] &&
    grep -q "^trainer run: warning: $lib/libopenblas.so.0 is OpenBLAS's pthreads build: .*apt-get install libopenblas-openmp-dev" "$tmp/pth.err" &&
    [ "$(threads "$tmp/pth/provenance.json")" = pthreads ]; then
    ok "the pthreads build is named in one line: $(cut -c1-160 "$tmp/pth.err")..."
else
    bad "pthreads build: stderr '$(cat "$tmp/pth.err")', provenance '$(threads "$tmp/pth/provenance.json")'"
fi
[ $fail -eq 0 ] && echo "blas: all passed" || echo "blas: FAILED"
exit $fail
