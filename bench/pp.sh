#!/usr/bin/env bash
# Pipeline parallelism on this machine: pp = 2 and 4 (MPI ranks of one thread each) with every
# schedule at M = 4 and 8 micro-batches, against one process with two threads on the same
# model (bench/pp_gpt.lua: 8 equal blocks) and global batch, in one run. For each: the
# measured bubble (each stage's idle share of the schedule's span: 1 - its compute / the span,
# the median over the steps after two of warm-up, and the mean over the stages) beside the
# schedule's theoretical bubble (tr_pp_bubble: unit forward, backward twice, free transfers),
# the peak activation memory of a stage (the largest over the stages, as allocated: one set
# of activations per micro-batch in flight) and tokens/s against one process.
# pp 4 on 2 cores runs 4 ranks on 2 cores: ranks computing at the same time share a core, so
# its compute stretches and its bubble reads low; its figures are shown, but only pp 2 fits
# the machine. Each layout runs `reps` times, interleaved; figures are medians.
# Usage: bench/pp.sh [steps] [reps]      (needs build/trainer built with MPI, and mpirun)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-10}"
reps="${2:-1}"
T=${TRAINER:-build/trainer}
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { # name np threads [flags...]
    local name=$1 np=$2 th=$3
    shift 3
    local cmd=("$T" run bench/pp_gpt.lua --set steps="$steps" --out "$tmp/$name" --overwrite --peak-gflops 1 "$@")
    if [ "$np" -eq 1 ]; then OMP_NUM_THREADS=$th "${cmd[@]}" >"$tmp/$name.log" 2>&1
    else OMP_NUM_THREADS=$th mpirun -np "$np" "${cmd[@]}" >"$tmp/$name.log" 2>&1; fi
}
figures() { # names...: "tok/s idle theory act" medians over the repetitions
    python3 - "$tmp" "$@" <<'PY'
import json, re, statistics, sys
tmp, names = sys.argv[1], sys.argv[2:]
tps, idle, act, theory = [], [], [], None
for n in names:
    steps = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (tmp, n))]
    steps = [s for s in steps if "step" in s][2:]
    tps.append(statistics.median(s["tokens_per_s"] for s in steps))
    if "pipeline_idle" in steps[0]:
        per_rank = [statistics.median(s["pipeline_idle"][k] for s in steps)
                    for k in range(len(steps[0]["pipeline_idle"]))]
        idle.append(statistics.mean(per_rank))
        ranks = json.load(open("%s/%s/ranks.json" % (tmp, n)))
        act.append(max(r["memory_bytes"][3] for r in ranks))
        m = re.search(r"\(theory ([0-9.]+)%\)", open("%s/%s.log" % (tmp, n)).read())
        theory = float(m.group(1)) if m else float("nan")
med = lambda v: statistics.median(v) if v else float("nan")
print("%.0f %.1f %.1f %.2f" % (med(tps), 100 * med(idle), theory if theory is not None else float("nan"),
                                med(act) / 2**20))
PY
}
echo "== bench/pp_gpt.lua: 8 blocks of width 256, T 64, 1024 tokens per step; $steps steps x $reps"
printf "%-30s %9s %9s %9s %9s %12s\n" "layout" "tok/s" "vs 1 proc" "bubble" "theory" "act MiB/rank"
configs=()
for P in 2 4; do
    for M in 4 8; do
        for s in gpipe 1f1b interleaved zb-h1 zb-v; do
            v=""
            [ "$s" = interleaved ] && v=" --virtual-stages 2" # zb-v: 2, its V, by default
            configs+=("pp${P}_M${M}_$s:$P:--pp $P --microbatches $M --schedule $s$v")
        done
    done
done
for rep in $(seq "$reps"); do
    run "single.$rep" 1 2
    for cfg in "${configs[@]}"; do
        IFS=: read -r name P flags <<<"$cfg"
        run "$name.$rep" "$P" 1 $flags || echo "  ($name failed: $(tail -1 "$tmp/$name.$rep.log"))"
    done
done
names() { for rep in $(seq "$reps"); do echo "$1.$rep"; done; }
read -r base _ <<<"$(figures $(names single))"
printf "%-30s %9.0f %9s %9s %9s %12s\n" "1 process, 2 threads" "$base" "1.00x" "-" "-" "-"
for cfg in "${configs[@]}"; do
    IFS=: read -r name P flags <<<"$cfg"
    read -r tps idle theory act <<<"$(figures $(names "$name"))"
    printf "%-30s %9.0f %8.2fx %8.1f%% %8.1f%% %12.2f\n" "$name" "$tps" \
        "$(awk -v a="$tps" -v b="$base" 'BEGIN {print a / b}')" "$idle" "$theory" "$act"
done
