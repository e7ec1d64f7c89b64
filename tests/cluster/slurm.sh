#!/usr/bin/env bash
# Slurm across hosts: a cluster in a box of 2 hosts x 2 slots with Slurm (slurmctld on its
# head, one slurmd per host: tests/cluster/cluster.sh up --slurm); `srun -N 2 -n 4
# --mpi=pmix` starts dp 2 x tp 2 of the tiny GPT of tests/pp.sh directly (no mpirun), 2
# ranks on each host; the run detects 2 nodes, keeps each tp pair on one host and equals the
# single process under tests/lib.sh's rule. Skipped (77) without Slurm's packages, as
# tests/slurm.sh. About 10 s.
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../slurm_lib.sh" # slurm_logs
T=$(realpath "$1")
for c in srun slurmctld slurmd munged munge; do
    command -v "$c" >/dev/null ||
        { echo "SKIP no $c (apt-get install slurmd slurmctld slurm-client munge)"; exit 77; }
done
R=tests/recipes_good/pp_gpt.lua
export OMP_NUM_THREADS=1
# a Slurm job around this test must not leak into the cluster's commands
for v in $(env | grep -o '^SLURM_[A-Za-z0-9_]*'); do unset "$v"; done
tmp=$(mktemp -d)
cluster_begin ts --hosts 2 --slots 2 --rate 200mbit --slurm

TR_DUMP_PARAMS="$tmp/one.params" timeout 300 "$T" run "$R" --out "$tmp/one" --peak-gflops 10 \
    >"$tmp/one.log" 2>&1 || { bad "the single process exited $?"; tail -5 "$tmp/one.log"; exit 1; }

name=srun_dp2_tp2
TR_DUMP_PARAMS="$tmp/$name.params" timeout 300 "$CL" run "$cname" -- srun -N 2 -n 4 --mpi=pmix \
    --kill-on-bad-exit=1 "$T" run "$R" --dp 2 --tp 2 --out "$tmp/$name" --peak-gflops 10 \
    >"$tmp/$name.log" 2>&1
rc=$?
hosts=$(rank_hosts "$tmp/$name.log" | sort -n | awk '{printf "%s ", $2}')
set -- $hosts
if [ $rc -ne 0 ]; then
    bad "$name: srun exited $rc"; tail -15 "$tmp/$name.log"; slurm_logs "$cdir/slurm"
elif ! grep -q "4 processes (mpi)" "$tmp/$name.log" || ! grep -q "detected: 2 nodes" "$tmp/$name.log"; then
    bad "$name: not one 4-process MPI job on 2 nodes: $(grep -m1 '^plan:' "$tmp/$name.log")"
elif [ $# -ne 4 ] || [ "$1" != "$2" ] || [ "$3" != "$4" ] || [ "$1" = "$3" ]; then
    bad "$name: the tp pairs are not each on one host: hosts by rank: $hosts"
else
    ok "$name: srun --mpi=pmix ran 4 ranks on 2 hosts, tp pairs inside them: $hosts"
    if e=$(cmp_run "$tmp/$name" "$tmp/one"); then
        ok "$name: equal to one process: $e"
    else
        bad "$name: differs from one process: $e"
    fi
fi

[ "$fail" -eq 0 ] && echo "cluster_slurm: all passed" || echo "cluster_slurm: FAILED"
exit "$fail"
