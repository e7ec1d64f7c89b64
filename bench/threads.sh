#!/usr/bin/env bash
# Threads a process on the CPU where OMP_NUM_THREADS is not set: the trainer's share of the
# node's cores (parallel/comm/cores.c's tr_node_threads) against OpenMP's own default, a
# thread per core the process may run on (what every run took before; OMP_NUM_THREADS=that
# count reproduces it with the same binary), on the same layouts, alternated rep by rep. For
# each: the median step of each (the run's own `plan vs run` figure) over the reps, the ratio
# default/share, and each's planned step against it (the planner's probes run on the same
# threads as the steps). Layouts: one process (the same threads either way: a control), and
# mpirun -np 4 data-parallel, pipelined and both (Open MPI binds jobs of more than 2 ranks to
# the socket, so the default gave each rank every core; it binds a job of 2 to a core each,
# whose default of 1 thread is the share, so no such case is run).
# Usage: bench/threads.sh [steps] [reps]   (about 4 minutes on 2 cores at the defaults 6 3)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-6}"
reps="${2:-3}"
T=$(realpath build/trainer)
[ -x "$T" ] || { echo "bench: no trainer at $T (./setup.sh)"; exit 1; }
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export TR_PLAN_MEMORY=off # each run plans from its own probes
unset OMP_NUM_THREADS
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shape=(bench/tp_gpt.lua --set width=256 --set heads=4 --set layers=4 --set batch_tokens=4096)
# label | np | flags
cases=(
    "1 process|1|"
    "4 ranks, dp 4|4|--dp 4"
    "4 ranks, pp 4|4|--pp 4"
    "4 ranks, dp 2 x pp 2|4|--dp 2 --pp 2"
)
run() { # out np threads(or "") flags...: "predicted measured" of the run's plan vs run line
    local out=$1 np=$2 th=$3
    shift 3
    local env=(env) cmd=("$T" run "${shape[@]}" --set steps="$steps" --out "$out" --overwrite "$@")
    [ -n "$th" ] && env+=("OMP_NUM_THREADS=$th")
    if [ "$np" -eq 1 ]; then "${env[@]}" "${cmd[@]}" >"$out.log" 2>&1
    else "${env[@]}" mpirun -np "$np" "${cmd[@]}" >"$out.log" 2>&1; fi ||
        { echo "bench: failed: ${cmd[*]}"; tail -3 "$out.log"; exit 1; }
    sed -n 's/^plan vs run: step \([0-9.e+-]*\) s predicted, \([0-9.e+-]*\) s measured.*/\1 \2/p' \
        "$out.log"
}
echo "bench/tp_gpt.lua at width 256, 4 blocks, 4096-token steps; $steps steps a run, $reps reps," \
    "$cores cores; step: the median of the reps' measured steps (s)"
printf "%-22s %12s %12s %9s %14s %14s\n" "layout" "share step" "default step" "default/" \
    "share planned" "default planned"
for c in "${cases[@]}"; do
    IFS='|' read -r label np flags <<<"$c"
    : >"$tmp/share" && : >"$tmp/default"
    for ((r = 0; r < reps; r++)); do
        # shellcheck disable=SC2086
        run "$tmp/s" "$np" "" $flags >>"$tmp/share"
        # shellcheck disable=SC2086
        run "$tmp/d" "$np" "$cores" $flags >>"$tmp/default"
    done
    python3 - "$label" "$tmp/share" "$tmp/default" <<'PY'
import statistics, sys
label, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
def rows(f):
    return [tuple(map(float, l.split())) for l in open(f) if l.strip()]
sa, sb = rows(a), rows(b)
ma = statistics.median(m for _, m in sa)
mb = statistics.median(m for _, m in sb)
pa = statistics.median(p for p, _ in sa)
pb = statistics.median(p for p, _ in sb)
print("%-22s %11.4fs %11.4fs %8.2fx %8.4fs %+4.0f%% %8.4fs %+4.0f%%" %
      (label, ma, mb, mb / ma, pa, 100 * (pa / ma - 1), pb, 100 * (pb / mb - 1)))
PY
done
echo "share: OMP_NUM_THREADS unset (the trainer's share); default: OMP_NUM_THREADS=$cores" \
    "(OpenMP's default where a process may run on every core); planned: the median of the" \
    "runs' own predictions, and its error against the measured step"
