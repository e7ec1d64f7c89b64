#!/usr/bin/env bash
# Launch under Slurm: a private single-node Slurm cluster (munged, slurmctld, slurmd with their
# own slurm.conf, key, sockets, ports, state and spool in a temporary folder) is started on
# this machine, the trainer runs as 2 MPI ranks under `srun --mpi=pmix` (direct launch, no
# mpirun), and it equals the single-process run (losses, grad norms, final parameters, within
# tests/lib.sh's limits for a reordering of float32 sums). The daemons are
# always stopped and the folder removed, whatever happens.
# Needs the Debian packages slurmd slurmctld slurm-client munge (and libpmix-dev, which Slurm's
# mpi/pmix plugin loads and libopenmpi-dev already brings); skipped (77) without them.
# Then a `trainer sweep --launcher slurm` job array against the same sweep run locally.
set -u
. "$(dirname "$0")/lib.sh"
T="$1"
for c in srun sinfo squeue scancel slurmctld slurmd munged munge; do
    command -v "$c" >/dev/null ||
        { echo "SKIP no $c (apt-get install slurmd slurmctld slurm-client munge)"; exit 77; }
done
T=$(realpath "$T")
R=tests/recipes_good/dp_tiny.lua
export OMP_NUM_THREADS=1
# a Slurm job around this test must not leak into the private cluster's commands
for v in $(env | grep -o '^SLURM_[A-Za-z0-9_]*'); do unset "$v"; done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/trslurm.XXXXXX")
chmod 755 "$tmp" # munged wants its socket's folder searchable
fail=0
pids=()
child=""
# a long command in the background, waited for: a signal to this shell is acted on at once
bgwait() { "$@" & child=$!; wait "$child"; local rc=$?; child=""; return $rc; }

# every process that still has a file open (or its working directory) under $tmp: ours only
ours() {
    local p
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
        if ls -l "/proc/$p/fd" 2>/dev/null | grep -q -- "-> $tmp/" ||
            [[ "$(readlink "/proc/$p/cwd" 2>/dev/null)" == "$tmp"* ]]; then echo "$p"; fi
    done
}
teardown() {
    [ -n "$child" ] && kill "$child" 2>/dev/null # timeout passes it on to srun, which ends the step
    if [ -n "${SLURM_CONF:-}" ] && [ ${#pids[@]} -gt 1 ]; then
        jobs_left=$(timeout 5 squeue -h -o %i 2>/dev/null)
        if [ -n "$jobs_left" ]; then
            timeout 5 scancel $jobs_left 2>/dev/null
            for _ in $(seq 20); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
        fi
    fi
    local p pp alive
    # let the job steps' slurmstepd finish before their slurmd goes (10 s at most)
    for _ in $(seq 20); do
        alive=""
        for p in $(ours); do # neither a daemon nor a daemon's helper (slurmscriptd)
            pp=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null)
            [[ " ${pids[*]} " == *" $p "* || " ${pids[*]} " == *" $pp "* ]] || alive=1
        done
        [ -z "$alive" ] && break
        sleep 0.5
    done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for _ in $(seq 20); do
        alive=""
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break
        sleep 0.5
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    # what the daemons left behind (a slurmstepd, a rank): killed by pid
    for p in $(ours); do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap teardown EXIT
trap 'exit 1' INT TERM HUP

# two free TCP ports for slurmctld and slurmd, picked at random (runs in a row do not collide)
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 30000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
}
cport=$(free_port)
dport=$(free_port)
while [ "$dport" = "$cport" ]; do dport=$(free_port); done

H=$(hostname -s)
ncpu=$(nproc)
[ "$ncpu" -lt 2 ] && ncpu=2
. "$(dirname "$0")/slurm_lib.sh"
slurm_files "$tmp" trtest "$H" 127.0.0.1 "$cport" "$dport" "$H 127.0.0.1 $ncpu" ||
    { echo "FAIL cannot write the Slurm configuration in $tmp"; exit 1; }
export SLURM_CONF="$tmp/slurm.conf"

# the daemons in the foreground, as children of this shell: their pids are known for the teardown
slurm_munged "$tmp" || { pids+=("$slurm_pid"); echo "FAIL munged did not start"; slurm_logs "$tmp"; exit 1; }
pids+=("$slurm_pid")
slurmctld -D -i </dev/null >>"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$H" </dev/null >>"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
slurm_wait_idle 1 || {
    echo "FAIL the Slurm node did not become idle within 30 s (state '$(timeout 5 sinfo -h -n "$H" -o %t 2>/dev/null)')"
    slurm_logs "$tmp"; exit 1
}
echo "ok   private Slurm cluster up: node $H idle (slurmctld port $cport, slurmd port $dport)"

TR_DUMP_PARAMS="$tmp/single.params" bgwait timeout 300 "$T" run "$R" --out "$tmp/single" --peak-gflops 10 >"$tmp/single.log" 2>&1 ||
    { echo "FAIL single process exited $?"; tail -5 "$tmp/single.log"; exit 1; }

name=srun_np2_zero1
TR_DUMP_PARAMS="$tmp/$name.params" bgwait timeout 300 srun -n 2 -N 1 --mpi=pmix --kill-on-bad-exit=1 \
    "$T" run "$R" --set zero=1 --set bucket=16 --out "$tmp/$name" --peak-gflops 10 >"$tmp/$name.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL $name: srun exited $rc"; tail -15 "$tmp/$name.log"; slurm_logs "$tmp"; fail=1
elif ! grep -q "2 processes (mpi)" "$tmp/$name.log"; then
    echo "FAIL $name: the ranks did not form one 2-process MPI job"; head -8 "$tmp/$name.log"; fail=1
elif e=$(cmp_run "$tmp/$name" "$tmp/single"); then
    echo "ok   $name: srun --mpi=pmix ran 2 MPI ranks, equal to the single process: $e"
else
    echo "FAIL $name: differs from the single process: $e"; fail=1
fi

# a sweep as a Slurm job array: each task runs one point (`trainer sweep EXP --point K`); the
# points equal those of the same sweep run here, one after another, bitwise
S=tests/sweep/tiny.lua
sweep=(--grid lr=3e-3,1e-2 --seeds 2 --set steps=8 --peak-gflops 10)
bgwait timeout 300 "$T" sweep "$S" --out "$tmp/sweep-local" "${sweep[@]}" >"$tmp/sweep-local.log" 2>&1 ||
    { echo "FAIL the local sweep exited $?"; tail -3 "$tmp/sweep-local.log"; fail=1; }
bgwait timeout 300 "$T" sweep "$S" --out "$tmp/sweep-slurm" "${sweep[@]}" --launcher slurm --wait \
    --sbatch --time=5 >"$tmp/sweep-slurm.log" 2>&1
rc=$?
same=0
for d in "$tmp"/sweep-local/points/*/; do
    name=$(basename "$d")
    cmp -s <(losses "$d/metrics.jsonl") <(losses "$tmp/sweep-slurm/points/$name/metrics.jsonl") &&
        same=$((same + 1))
done
if [ $rc -eq 0 ] && [ $same -eq 4 ] && grep -q "4 points: 4 done" "$tmp/sweep-slurm.log" &&
    [ "$(ls "$tmp"/sweep-slurm/logs/slurm-*_*.out 2>/dev/null | wc -l)" -eq 4 ]; then
    echo "ok   sweep --launcher slurm: a job array of 4 tasks, every point bitwise the local sweep's"
else
    echo "FAIL sweep --launcher slurm (exit $rc, $same of 4 points equal)"; tail -8 "$tmp/sweep-slurm.log"
    cat "$tmp"/sweep-slurm/logs/slurm-*.out 2>/dev/null | tail -5; slurm_logs "$tmp"; fail=1
fi

[ $fail -eq 0 ] && echo "slurm: all passed" || echo "slurm: FAILED"
exit $fail
