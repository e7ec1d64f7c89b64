#!/usr/bin/env bash
# Where each schedule's bubble goes, on this machine: pp 2 x M 4 and pp 4 x M 8 (MPI ranks of one
# thread each) of bench/pp_gpt.lua with every schedule, each run traced (`--trace`) for its
# steps after the first, and the trace read by bench/pp_bubble.py. Side by side, idle shares of
# the step (means over the stages, medians over the steps):
#   theory     the schedule run with a forward of one unit and a backward of two, transfers free
#   durations  the same order with each action as long as it measured, transfers free
#   measured   what the executor measured (1 - compute / span per stage)
# and the two parts of measured - theory: the actions' real lengths (durations - theory: a
# backward that is not twice a forward, a weight part that is not half the backward, a stage
# with the head slower than the others) and transfers with the executor's own work (measured -
# durations), then the mean forward, backward (or input part) and weight part in ms and each
# stage's compute per step. pp 4 runs 4 ranks on 2 cores: ranks computing at once share a core.
# Usage: bench/pp_bubble.sh [steps]    (build/trainer with MPI, and mpirun)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-8}"
T=${TRAINER:-build/trainer}
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== bench/pp_gpt.lua: 8 blocks of width 256, T 64, 1024 tokens per step; $steps steps, traced after the first"
printf "%-22s %7s %9s %8s %8s %9s  %-26s %s\n" layout theory durations measured lengths transfers \
    "F / B or Bi / W ms" "stage compute ms"
for P in 2 4; do
    M=$((P * 2))
    for s in gpipe 1f1b interleaved zb-h1 zb-v; do
        v=1
        [ "$s" = interleaved ] || [ "$s" = zb-v ] && v=2
        name="pp${P}_M${M}_$s"
        mpirun -np "$P" "$T" run bench/pp_gpt.lua --set steps="$steps" --out "$tmp/$name" \
            --overwrite --peak-gflops 1 --pp "$P" --microbatches "$M" --schedule "$s" \
            --virtual-stages "$v" --trace $((steps - 1)) >"$tmp/$name.log" 2>&1 ||
            { echo "$name failed: $(tail -1 "$tmp/$name.log")"; continue; }
        python3 - "$name" "$tmp/$name/trace.json" <<'PY'
import json, subprocess, sys
a = json.loads(subprocess.check_output([sys.executable, "bench/pp_bubble.py", sys.argv[2], "--json"]))
ms = a["action_ms"]
acts = " / ".join("%.1f" % ms[k] for k in ("F", "B", "Bi", "W") if k in ms)
print("%-22s %6.1f%% %8.1f%% %7.1f%% %+7.1f %+8.1f   %-26s %s" % (
    sys.argv[1], 100 * a["theory"], 100 * a["durations"], 100 * a["measured"],
    100 * (a["durations"] - a["theory"]), 100 * (a["measured"] - a["durations"]), acts,
    " ".join("%.0f" % v for v in a["stage_compute_ms"])))
PY
    done
done
echo "(lengths and transfers: points of the step; theory + lengths + transfers = measured)"
