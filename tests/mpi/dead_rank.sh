#!/usr/bin/env bash
# A rank that dies (mode "die": SIGKILL mid-run) or hangs (mode "stuck": sleeps instead of
# joining) while the others are in an all_reduce must end the whole job: within the deadline
# plus a margin, with a non-zero status and a line on stderr that names a rank. Open MPI's
# mpirun kills the job itself when a rank dies, before any deadline; mode "die-unmanaged" runs
# it with --enable-recovery (it then leaves the survivors alone, as a launcher that does not
# clean up would), so the survivor's own deadline must end the job. Mode "stuck-recv" (a
# device test only: tests/gpu/test_comm_device.c) is "stuck" with rank 0 waiting in a
# receive on a channel whose sender sleeps instead.
# Usage: dead_rank.sh die|stuck|stuck-recv|die-unmanaged MPIEXEC TEST_COMM
set -u
mode="$1" mpiexec="$2" prog="$3"
deadline=5 margin=10 np=2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s.%N)
# The outer timeout only keeps a broken build from hanging ctest.
flags="" kind="$mode"
[ "$mode" = die-unmanaged ] && flags="--enable-recovery" kind=die
timeout -s KILL $((deadline + 60)) "$mpiexec" $flags -np $np --oversubscribe "$prog" \
    "--$kind-rank" 1 --timeout $deadline >"$tmp/out" 2>"$tmp/err"
rc=$?
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
fail=0
echo "--- stderr of the job (exit $rc after $elapsed s):"
grep -v '^\s*$' "$tmp/err" | grep -v -- '^---' | head -n 20
echo "---"
# (mpirun --enable-recovery exits 0 even after MPI_Abort: its status is not ours to test.)
if [ "$mode" != die-unmanaged ]; then
    [ "$rc" -ne 0 ] && echo "ok   the job exited non-zero ($rc)" || { echo "FAIL exit status 0"; fail=1; }
fi
awk -v e="$elapsed" -v l=$((deadline + margin)) 'BEGIN { exit !(e < l) }' &&
    echo "ok   it ended in $elapsed s (deadline $deadline s + $margin s)" ||
    { echo "FAIL it took $elapsed s"; fail=1; }
grep -v '^test_comm:' "$tmp/err" | grep -Eq 'rank [0-9]+' && echo "ok   stderr names a rank" ||
    { echo "FAIL no line names a rank"; fail=1; }
if [ "$mode" = stuck ] || [ "$mode" = stuck-recv ]; then
    # the census names the rank that did not answer: the one sleeping outside communication
    op="all_reduce of 1024 floats"
    [ "$mode" = stuck-recv ] && op="recv of 1024 floats from rank 1 (tag 3)"
    want="trainer: rank 0: $op on group world (size 2) did not complete within $deadline s: rank 1 did not answer (busy outside communication, stuck or dead; the others are waiting); aborting"
    n=$(grep -cF "$want" "$tmp/err")
    [ "$n" -eq 1 ] && echo "ok   rank 0 printed the deadline line once" ||
        { echo "FAIL expected once: $want (got $n)"; fail=1; }
    n=$(grep -c '^trainer: ' "$tmp/err")
    [ "$n" -eq 1 ] && echo "ok   exactly one trainer: line" || { echo "FAIL $n trainer: lines"; fail=1; }
fi
if [ "$mode" = die-unmanaged ]; then
    grep -Eq '^trainer: rank 0: all_reduce of 1024 floats on group world \(size 2\) (did not complete within|failed:)' \
        "$tmp/err" && echo "ok   the survivor ended the job with its own line" ||
        { echo "FAIL no deadline or error line from rank 0"; fail=1; }
fi
grep -q "returned though a peer is gone" "$tmp/err" &&
    { echo "FAIL an all_reduce returned without its peer"; fail=1; }
exit $fail
