#!/usr/bin/env bash
# What the ledger (trainer/report/ledger.c) costs: tokens/s with it against TR_LEDGER=off (no files,
# no straggler watch; the per-step gather of the ranks' figures stays, as metrics.jsonl needs
# it), runs alternated on/off so that the machine's drift hits both. Prints for each layout
# the median step time of each (over the steps after the first, all repeats), their ratio,
# the share of the run the ledger's 'log' part took, and ledger.jsonl's size per step.
# usage: bench/ledger.sh [path/to/trainer] [repeats]
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-build/trainer}
REPS=${2:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
dir=$(mktemp -d "${TMPDIR:-/tmp}/bench_ledger.XXXXXX")
trap 'rm -rf "$dir"' EXIT

one() { # label np ledger(on|off) args...: appends the step times to $dir/label.steps
    local label=$1 np=$2 mode=$3
    shift 3
    local launch=()
    [ "$np" -gt 1 ] && launch=(mpirun -np "$np")
    rm -rf "$dir/run"
    TR_LEDGER=$mode "${launch[@]}" "$T" run "$@" --out "$dir/run" >"$dir/log" 2>&1 ||
        { tail -5 "$dir/log"; exit 1; }
    python3 - "$dir/run" "$mode" >>"$dir/$label.$mode" <<'EOF'
import json, os, sys
out, mode = sys.argv[1], sys.argv[2]
steps = [json.loads(l)["step_s"] for l in open(f"{out}/metrics.jsonl")][1:]
extra = ""
if mode == "on":
    led = [json.loads(l) for l in open(f"{out}/ledger.jsonl")]
    t = [l for l in led if l["kind"] == "total"][0]
    share = max(t["parts"]["log_s"][r] / t["wall_s"][r] for r in range(len(t["wall_s"])))
    extra = f" {share} {os.path.getsize(f'{out}/ledger.jsonl') / (len(steps) + 1)}"
print(" ".join(str(s) for s in steps) + " |" + extra)
EOF
}

report() { # label
    python3 - "$dir/$1.off" "$dir/$1.on" "$1" <<'EOF'
import statistics, sys
def read(p):
    steps, extra = [], []
    for line in open(p):
        a, b = line.split("|")
        steps += [float(x) for x in a.split()]
        extra.append([float(x) for x in b.split()])
    return statistics.median(steps), extra
off, _ = read(sys.argv[1])
on, ex = read(sys.argv[2])
share = max(e[0] for e in ex)
size = statistics.median(e[1] for e in ex)
print(f"{sys.argv[3]:<34} {1e3 * off:9.2f} ms {1e3 * on:9.2f} ms {on / off:7.3f}x "
      f"{100 * share:9.2f}% {size:8.0f} B")
EOF
}

printf "%-34s %12s %12s %8s %10s %10s\n" layout "step (off)" "step (on)" "on/off" "log part" "file/step"
cases=("shakespeare_char,1 process|1|recipes/shakespeare_char.lua --steps 12 --eval-every 0"
       "dp_tiny,2 ranks|2|tests/recipes_good/dp_tiny.lua --set steps=60"
       "dp_tiny,4 ranks (oversubscribed)|4|tests/recipes_good/dp_tiny.lua --set steps=60")
for c in "${cases[@]}"; do
    IFS='|' read -r label np args <<<"$c"
    key=$(echo "$label" | tr -c 'a-z0-9' _)
    for _ in $(seq "$REPS"); do
        # shellcheck disable=SC2086
        one "$key" "$np" off $args
        # shellcheck disable=SC2086
        one "$key" "$np" on $args
    done
    report "$key" | sed "s/^$key/$label/;s/^\([^ ]*\),/\1, /"
done
