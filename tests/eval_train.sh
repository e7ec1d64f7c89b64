#!/usr/bin/env bash
# eval { } during training: a recipe's multiple-choice tasks scored every N steps through the
# run's own layout, into metrics.jsonl. On 1 process and on 2 ranks as dp 2 at ZeRO-3, tp 2
# and pp 2 (skipped without mpirun), the figures of the last step equal `trainer eval`'s on
# that run's own last checkpoint (the same weights, scored on one process with the
# checkpoint loader): acc and acc_norm exactly (unless two choices are closer than the
# tolerance below), the mean log-likelihood of the answers within it. A sweep of the recipe
# tables those figures (report --compare EXP). eval { } leaves the losses bitwise as they
# were, and a run killed after step 12 and resumed ends with the same losses and task
# figures, bitwise, on 1 process and dp 2 at ZeRO-3. A missing task file is one line naming
# the recipe's eval { }.
# usage: tests/eval_train.sh path/to/trainer   (from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
fail=0
task=$PWD/tests/sweep/choices.jsonl
sed "s#\.\./\.\./data#$PWD/data#" tests/sweep/tiny.lua >"$tmp/r.lua"
echo "eval { tasks = { \"$task\" }, every = 8 }" >>"$tmp/r.lua"

# check NAME: the run's last task figures against trainer eval on its last checkpoint
check() {
    local name=$1 e
    "$T" eval "$tmp/$name" --task "$task" --shards none --json --details "$tmp/$name.det" \
        >"$tmp/$name.eval" 2>"$tmp/$name.err" || { bad "$name: trainer eval: $(cat "$tmp/$name.err")"; return; }
    if e=$(python3 - "$tmp/$name/metrics.jsonl" "$tmp/$name.eval" "$tmp/$name.det" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows if "tasks" in r]
assert steps == [8, 16, 24], f"tasks at steps {steps}"
run = [r for r in rows if "tasks" in r][-1]["tasks"]["choices"]
ev = json.load(open(sys.argv[2]))["tasks"][0]
det = [json.loads(l) for l in open(sys.argv[3])]
ans = sum(d["loglik"][d["answer"]] for d in det) / len(det)
# The run's forward is a micro-batch of B x T (this choice in its first row), eval's one row of
# its own length: BLAS may block the products differently, and across tp or pp ranks the sums
# are reordered, so a log-probability moves by float32 rounding of logits of size ~10 (1e-6
# each) over <= 30 tokens: 1e-4 bounds a choice's log-likelihood with room to spare.
tol = 1e-4
near = min(sorted(d["loglik"])[-1] - sorted(d["loglik"])[-2] for d in det if len(d["loglik"]) > 1)
assert abs(run["answer_loglik"] - ans) <= tol, (run["answer_loglik"], ans)
assert run["n"] == ev["n"] == 5
if near > 2 * tol:
    assert run["acc"] == ev["acc"] and run["acc_norm"] == ev["acc_norm"], (run, ev)
print(f"acc {run['acc']} acc_norm {run['acc_norm']} = eval's; answers' mean log-likelihood "
      f"{run['answer_loglik']:.6f} vs {ans:.6f} ({abs(run['answer_loglik'] - ans):.1e})"
      + ("" if near > 2 * tol else f"; acc not compared: two choices {near:.1e} apart"))
EOF
    ); then
        ok "$name: tasks at steps 8, 16, 24; the last: $e"
    else
        bad "$name: $e"
    fi
}

"$T" run "$tmp/r.lua" --out "$tmp/one" --peak-gflops 100 >"$tmp/one.log" 2>&1 ||
    { bad "1 process: the run failed"; tail -3 "$tmp/one.log"; }
grep -q "| choices acc " "$tmp/one.log" && ok "the progress line shows the task's accuracy" ||
    bad "no task accuracy in the progress line"
check one

if command -v mpirun >/dev/null; then
    for lay in "dp2_zero3:--dp 2 --zero 3 --micro-batch 4" "tp2:--tp 2" "pp2:--pp 2 --microbatches 2 --set layers=2"; do
        name=${lay%%:*}
        flags=${lay#*:}
        timeout 300 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$T" run "$tmp/r.lua" \
            --out "$tmp/$name" --peak-gflops 100 $flags >"$tmp/$name.log" 2>&1 ||
            { bad "$name: the run failed"; tail -3 "$tmp/$name.log"; continue; }
        check "$name"
    done
else
    echo "skip the layouts: no mpirun"
fi

# eval { } observes and does not steer: the losses equal a run without it, bitwise; and a run
# killed after step 12 (its checkpoint), past the scoring at step 8, resumes to the same
# losses and the same task figures at steps 16 and 24, bitwise (1 process, dp 2 at ZeRO-3)
same_as() { # A B: losses and task figures of every step, bitwise
    python3 - "$1" "$2" <<'EOF'
import json, sys
def rows(p):
    by = {}
    for l in open(p):
        r = json.loads(l)
        if "step" in r: by[r["step"]] = (r["loss"], r.get("val_loss"), json.dumps(r.get("tasks"), sort_keys=True))
    return by
a, b = rows(sys.argv[1]), rows(sys.argv[2])
sys.exit(0 if a == b and len(a) == 24 else 1)
EOF
}
sed '$d' "$tmp/r.lua" >"$tmp/plain.lua"
"$T" run "$tmp/plain.lua" --out "$tmp/plain" --peak-gflops 100 >/dev/null 2>&1 || bad "the run without eval { } failed"
python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "step" in l]' "$tmp/plain/metrics.jsonl" >"$tmp/plain.losses"
python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "step" in l]' "$tmp/one/metrics.jsonl" >"$tmp/one.losses"
cmp -s "$tmp/plain.losses" "$tmp/one.losses" && ok "eval { } leaves the training bitwise as it was (24 losses)" ||
    bad "eval { } changed the losses"
(TR_FAULT_KILL_AFTER_STEP=12 "$T" run "$tmp/r.lua" --out "$tmp/k1" --peak-gflops 100 >/dev/null 2>&1; true) 2>/dev/null
"$T" run "$tmp/r.lua" --out "$tmp/k1" --resume --peak-gflops 100 >"$tmp/k1.log" 2>&1 || bad "resume: $(tail -1 "$tmp/k1.log")"
grep -q "resuming from .*step_00000012 (step 12" "$tmp/k1.log" && same_as "$tmp/k1/metrics.jsonl" "$tmp/one/metrics.jsonl" &&
    ok "1 process: killed after step 12 and resumed: losses and task figures bitwise the uninterrupted run's" ||
    bad "1 process: the resumed run differs"
if command -v mpirun >/dev/null; then
    lay=(--dp 2 --zero 3 --micro-batch 4)
    (TR_FAULT_KILL_AFTER_STEP=12 timeout 300 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \
        -x TR_FAULT_KILL_AFTER_STEP "$T" run "$tmp/r.lua" --out "$tmp/k2" --peak-gflops 100 "${lay[@]}" \
        >/dev/null 2>&1; true) 2>/dev/null
    timeout 300 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$T" run "$tmp/r.lua" --out "$tmp/k2" \
        --resume --peak-gflops 100 "${lay[@]}" >"$tmp/k2.log" 2>&1 || bad "dp 2: resume: $(grep -m1 trainer "$tmp/k2.log")"
    grep -q "resuming from .*step_00000012 (step 12" "$tmp/k2.log" &&
        same_as "$tmp/k2/metrics.jsonl" "$tmp/dp2_zero3/metrics.jsonl" &&
        ok "dp 2 ZeRO-3: killed after step 12 and resumed: losses and task figures bitwise" ||
        bad "dp 2 ZeRO-3: the resumed run differs"
fi

# a sweep of such a recipe: report --compare EXP tables eval { }'s last figures of each point
"$T" sweep "$tmp/r.lua" --out "$tmp/exp" --seeds 2 --peak-gflops 100 >"$tmp/exp.log" 2>&1 ||
    bad "the sweep failed: $(tail -1 "$tmp/exp.log")"
"$T" report --compare "$tmp/exp" --json >"$tmp/exp.json" 2>&1
if e=$(python3 - "$tmp/exp" <<'EOF'
import json, statistics, sys
exp = sys.argv[1]
rep = json.load(open(exp + "/../exp.json"))
last = []
for p in json.load(open(exp + "/sweep.json"))["points"]:
    rows = [json.loads(l) for l in open(f"{exp}/points/{p['name']}/metrics.jsonl")]
    last.append([r for r in rows if "tasks" in r][-1]["tasks"]["choices"])
got = rep["settings"][0]["tasks"]["choices"]
for k in ("acc", "acc_norm"):
    want = statistics.fmean(t[k] for t in last)
    assert abs(got[k]["mean"] - want) <= 1e-15, (k, got[k], want)
print(f"acc_norm {got['acc_norm']['mean']} = the mean of the points' last eval {{ }} figures")
EOF
); then ok "report --compare EXP: $e"; else bad "report --compare EXP: $e"; fi

sed "s#$task#$tmp/missing.jsonl#" "$tmp/r.lua" >"$tmp/bad.lua"
"$T" run "$tmp/bad.lua" --out "$tmp/bad" --peak-gflops 100 >"$tmp/bad.out" 2>"$tmp/bad.err"
rc=$?
[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/bad.err")" -eq 1 ] && grep -q "bad.lua:23: eval: cannot read task" "$tmp/bad.err" &&
    ok "a missing task file: $(cat "$tmp/bad.err")" || bad "a missing task file (exit $rc): $(cat "$tmp/bad.err")"
exit $fail
