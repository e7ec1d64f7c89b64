#!/usr/bin/env bash
# Two builds of trainer side by side, for a change that must not change behaviour (a refactor):
# the same runs with binary A and binary B, alternated rep by rep so that the machine's drift
# falls on both, on the bench recipes in the layouts the code paths differ by (one process;
# dp 2 at ZeRO 0-3; pp 2 with 1F1B; tp 2 with sequence parallelism). For each: the median
# tokens/s of A and of B over the steps after two of warm-up and over the reps, the ratio B/A,
# the spread of A's own reps (the noise the ratio is to be read against), and whether the two
# runs' losses are the same to the last printed digit (they should be: the same arithmetic).
# Usage: bench/ab.sh A B [steps] [reps]    e.g. bench/ab.sh /work/old/build/trainer build/trainer
# (AB_ONLY=REGEX runs only the cases whose label matches, e.g. AB_ONLY='tp 2')
# (needs both built with MPI, and mpirun; about 10 minutes on 2 cores at the defaults 8 3)
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "${1:?usage: bench/ab.sh A B [steps] [reps]}")
B=$(realpath "${2:?usage: bench/ab.sh A B [steps] [reps]}")
steps="${3:-8}"
reps="${4:-3}"
for t in "$A" "$B"; do [ -x "$t" ] || { echo "bench: no trainer at $t"; exit 1; }; done
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# label | np | threads | recipe and flags
cases=(
    "1 process, dp_gpt|1|2|bench/dp_gpt.lua"
    "dp 2, ZeRO-0|2|1|bench/dp_gpt.lua --dp 2 --zero 0"
    "dp 2, ZeRO-1|2|1|bench/dp_gpt.lua --dp 2 --zero 1"
    "dp 2, ZeRO-2|2|1|bench/dp_gpt.lua --dp 2 --zero 2"
    "dp 2, ZeRO-3|2|1|bench/dp_gpt.lua --dp 2 --zero 3"
    "pp 2, 1f1b, pp_gpt|2|1|bench/pp_gpt.lua --pp 2 --schedule 1f1b --microbatches 4"
    "tp 2, sp, tp_gpt|2|1|bench/tp_gpt.lua --tp 2 --sequence-parallel"
)
run() { # binary out np threads recipe flags...
    local t=$1 out=$2 np=$3 th=$4
    shift 4
    rm -rf "$out"   # a fresh folder: builds from before --overwrite refuse an old one
    local cmd=("$t" run "$@" --set steps="$steps" --out "$out" --peak-gflops 1)
    if [ "$np" -eq 1 ]; then OMP_NUM_THREADS=$th "${cmd[@]}" >"$out.log" 2>&1
    else OMP_NUM_THREADS=$th mpirun -np "$np" "${cmd[@]}" >"$out.log" 2>&1; fi ||
        { echo "bench: $t failed on: $*"; tail -3 "$out.log"; exit 1; }
}
printf "%-22s %10s %10s %8s %10s %12s\n" "run" "A tok/s" "B tok/s" "B/A" "A spread" "same losses"
for c in "${cases[@]}"; do
    IFS='|' read -r label np th args <<<"$c"
    [[ -z "${AB_ONLY:-}" || "$label" =~ ${AB_ONLY} ]] || continue
    read -r -a argv <<<"$args"
    for r in $(seq "$reps"); do
        run "$A" "$tmp/a$r" "$np" "$th" "${argv[@]}"
        run "$B" "$tmp/b$r" "$np" "$th" "${argv[@]}"
    done
    python3 - "$tmp" "$reps" "$label" <<'PY'
import json, statistics, sys
tmp, reps, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def steps(path):
    return [s for s in map(json.loads, open(path)) if "step" in s]
def tps(side):
    per_rep = [statistics.median(s["tokens_per_s"] for s in steps("%s/%s%d/metrics.jsonl" % (tmp, side, r))[2:])
               for r in range(1, reps + 1)]
    return statistics.median(per_rep), (max(per_rep) - min(per_rep)) / statistics.median(per_rep)
a, spread = tps("a")
b, _ = tps("b")
same = all([s["loss"] for s in steps("%s/a%d/metrics.jsonl" % (tmp, r))] ==
           [s["loss"] for s in steps("%s/b%d/metrics.jsonl" % (tmp, r))] for r in range(1, reps + 1))
print("%-22s %10.0f %10.0f %7.3fx %9.1f%% %12s" % (label, a, b, b / a, 100 * spread, "yes" if same else "NO"))
PY
done
echo "A: $A"
echo "B: $B"
echo "A spread: (fastest - slowest) / median of A's reps; a ratio B/A inside it is noise"
