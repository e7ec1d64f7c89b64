#!/usr/bin/env bash
# Uneven data-parallel shares (parallel { dp_shares = { ... } }: micro-batches of each dp replica
# per step, for devices of different speeds): on 2 MPI ranks, shares 3/1 and 1/3 of a step's 4
# micro-batches of 2 sequences equal the single process in micro-batches of 2 (losses, gradient
# norms and final parameters, within tests/lib.sh's limits for a reordering of float32 sums),
# at ZeRO 0 and 1; a run killed after step 10 and resumed equals the uninterrupted one bitwise
# (the loader's position is a step's start between steps); the resolved recipe keeps the
# shares; shares that do not fit are one line and exit 2 (a count other than dp, a sum that
# does not divide the step's sequences, ZeRO-2, a micro-batch that disagrees). The planner, for
# one H100 and one A100, gives the H100's replica 3 of 4 micro-batches (by their matrix rates)
# and prices that below the even split. About 40 s.
set -u
. "$(dirname "$0")/lib.sh"
T="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
mpi_env
R=tests/recipes_good/dp_tiny.lua

run() { # name np [--set ...]: $tmp/name, final parameters in $tmp/name.params
    local name=$1 np=$2
    shift 2
    TR_DUMP_PARAMS="$tmp/$name.params" timeout 300 mpirun -np "$np" "$T" run "$R" \
        --out "$tmp/$name" --peak-gflops 10 "$@" >"$tmp/$name.log" 2>&1 ||
        { bad "$name exited $?: $(grep -v '^ \|^$' "$tmp/$name.log" | tail -2 | tr '\n' ' ')"; return 1; }
}

run one 1 --set micro=2 || exit 1
for cfg in "3,1 0" "1,3 0" "3,1 1"; do
    read -r s z <<<"$cfg"
    name="shares_${s/,/_}_zero$z"
    run "$name" 2 --set shares="$s" --set zero="$z" || continue
    grep -q "micro-batches ${s/,//} by dp replica" "$tmp/$name.log" ||
        bad "$name: the layout line does not name the shares: $(grep -m1 'dp 2 x' "$tmp/$name.log")"
    if e=$(cmp_run "$tmp/$name" "$tmp/one"); then ok "$name: equal to one process: $e"
    else bad "$name: differs from one process: $e"; fi
done
grep -q "dp_shares = { 3, 1 }" "$tmp/shares_3_1_zero0/recipe.lua" &&
    ok "recipe.lua keeps dp_shares = { 3, 1 }" || bad "recipe.lua lost the shares: $(grep parallel "$tmp/shares_3_1_zero0/recipe.lua")"

# killed after step 10 (its checkpoint), resumed to 20: the uninterrupted run, bitwise
exact() { # metrics.jsonl A B: every step's loss and norm, all 17 digits, the same
    python3 - "$1" "$2" <<'PY'
import json, sys
def steps(f):
    out = {}
    for l in open(f):
        m = json.loads(l)
        if "step" in m:
            out[m["step"]] = (repr(m["loss"]), repr(m["grad_norm"]))
    return out
a, b = steps(sys.argv[1]), steps(sys.argv[2])
sys.exit(0 if len(a) == 20 and a == b else 1)
PY
}
run whole 2 --set shares=3,1 --set ckpt=10 &&
    (TR_FAULT_KILL_AFTER_STEP=10 timeout 300 mpirun -np 2 "$T" run "$R" --out "$tmp/part" \
        --peak-gflops 10 --set shares=3,1 --set ckpt=10 >"$tmp/part.log" 2>&1; true) 2>/dev/null
if [ -f "$tmp/part/checkpoints/step_00000010/manifest.yaml" ] &&
    TR_DUMP_PARAMS="$tmp/resumed.params" timeout 300 mpirun -np 2 "$T" run "$R" --out "$tmp/part" \
        --peak-gflops 10 --set shares=3,1 --set ckpt=10 --resume >"$tmp/resumed.log" 2>&1 &&
    grep -q "resuming from .*step_00000010" "$tmp/resumed.log" &&
    exact "$tmp/whole/metrics.jsonl" "$tmp/part/metrics.jsonl" &&
    cmp -s "$tmp/whole.params" "$tmp/resumed.params"; then
    ok "killed after step 10 and resumed with shares 3/1: every loss, norm and final parameter is the uninterrupted run's"
else
    bad "resume with shares: no checkpoint, no resume, or the losses or parameters differ"
fi

refused() { # what expected --set ...: trainer show resolves the layout of dp 2
    local what=$1 want=$2
    shift 2
    local e rc
    e=$("$T" show "$R" --dp 2 "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 0 ] && [ "$(echo "$e" | wc -l)" -eq 1 ] && [[ "$e" == *"$want"* ]]; then
        ok "$what: $e"
    else
        bad "$what (exit $rc): $e"
    fi
}
refused "three shares for dp 2" "gives 3 shares, one per data-parallel replica, but dp is 2" --set shares=2,1,1
refused "shares of 5 micro-batches" "sum to 5 micro-batches, which do not divide the 8 sequences" --set shares=3,2
refused "uneven shares at ZeRO-2" "uneven dp_shares run with ZeRO 0 or 1" --set shares=3,1 --set zero=2
refused "a micro-batch against the shares" "micro_batch 4 disagrees with parallel: dp_shares" --set shares=3,1 --set micro=4

# the planner: one H100 and one A100 joined by a fast link
cat >"$tmp/mixed.yaml" <<'EOF'
groups:
  - name: fast
    device: H100-80GB
    nodes: 1
    per_node: 1
  - name: slow
    device: A100-80GB
    nodes: 1
    per_node: 1
links:
  - between: [fast, slow]
    bandwidth_gb_s: 50
    latency_ms: 0.01
EOF
cp recipes/gpt2_124m.lua "$tmp/even.lua" && echo 'parallel { dp_shares = { 2, 2 } }' >>"$tmp/even.lua"
plan() { "$T" plan "$1" --cluster "$tmp/mixed.yaml" --dp 2 --json >"$2"; }
plan recipes/gpt2_124m.lua "$tmp/plan.json" && plan "$tmp/even.lua" "$tmp/even.json" &&
    python3 - "$tmp/plan.json" "$tmp/even.json" <<'PY' && ok "the planner gives the H100 3 of 4 micro-batches, priced below the even split" || bad "the planner's shares"
import json, sys
p, e = (json.load(open(f))["plan"] for f in sys.argv[1:3])
print("     chosen: dp_shares %s, %.4f s a step; even %s: %.4f s" % (
    p["dp_shares"], p["predicted"]["step_s"], e["dp_shares"], e["predicted"]["step_s"]))
assert p["dp_shares"] == [3, 1] and e["dp_shares"] == [2, 2]
# at rates about 3:1, 3/1 takes 3 units of the H100's time and the even split 2 of the
# A100's, 6: the compute halves (less the parts each replica's rate does not scale)
assert p["predicted"]["compute_s"] < 0.7 * e["predicted"]["compute_s"]
PY
exit $fail
