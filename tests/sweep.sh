#!/usr/bin/env bash
# `trainer sweep` and `trainer report --compare EXP` on tests/sweep/tiny.lua:
#  1. a grid of 2 learning rates x 2 depths x 2 seeds, each point evaluated on a task of 5
#     multiple-choice examples (--eval-task): every point's folder complete, the points'
#     values as given, the verdicts ("baseline", "differs in lr only", "differs in lr,
#     layers", "same experiment, another seed"), and the table's means and standard
#     deviations (losses, acc, acc_norm) equal to ones computed here from the runs'
#     metrics.jsonl and eval.json (Python's statistics module); --csv carries the same;
#     `trainer sweep EXP --out NEW`, run from another folder, reruns it from the experiment
#     folder alone: the table (CSV) byte for byte the same;
#  2. a sweep of 2 learning rates x 2 seeds stopped by SIGTERM during its third point, then
#     `trainer sweep EXP`: it finishes, the points that were done are not run again (their
#     records untouched), and every point's losses and final parameters are bitwise those of
#     the uninterrupted sweep;
#  3. a point that fails (tp 2 on one process) is recorded with its reason, the other point
#     still runs, the exit status is 1, and a second sweep runs only the failed point again;
#     a point whose evaluation fails is failed, and after the fix only the evaluation runs;
#  4. a layout per point through a launcher (mpirun -np 2, --grid --zero=0,1; skipped
#     without mpirun), the sweep made with --list and its points run with --point: both
#     train on 2 ranks and equal each other within float32 reordering (tests/lib.sh's cmp_run);
#  5. bad input: an unknown knob, a bad value, --resume, an experiment folder holding another
#     sweep, a recipe changed since the sweep, --point out of range: one line, exit 2, and
#     nothing run (a bad sweep { } block: tests/recipes_bad/bad_sweep_*.lua);
#  6. the recipe's own sweep { } gives the axes and seeds; --grid replaces it.
# usage: tests/sweep.sh path/to/trainer   (from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
fail=0
R=tests/sweep/tiny.lua
grid=(--grid lr=3e-3,1e-2 --grid layers=1,2 --seeds 2 --peak-gflops 100)
task=tests/sweep/choices.jsonl # 5 multiple-choice examples in the simple format

# 1. the grid, uninterrupted
"$T" sweep "$R" --out "$tmp/a" "${grid[@]}" --eval-task "$task" >"$tmp/a.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "a 2 x 2 x 2 sweep finished" || { bad "the sweep exited $rc"; tail -5 "$tmp/a.log"; }
n=0
for d in "$tmp"/a/points/*/; do
    name=$(basename "$d")
    if [ -s "$d/provenance.json" ] && [ -s "$d/recipe.lua" ] &&
        tail -1 "$d/metrics.jsonl" | grep -q '"step": 24,' &&
        grep -q '"state": "done"' "$tmp/a/status/$name.json" && [ -s "$tmp/a/logs/$name.log" ] &&
        grep -q '"name": "choices", "format": "simple", "n": 5' "$d/eval.json"; then
        n=$((n + 1))
    else
        bad "point $name is not complete"
    fi
done
[ "$n" -eq 8 ] && ok "8 point folders, each with its metrics to step 24, provenance, recipe, log, status, eval.json" ||
    bad "$n complete points of 8"
grep -q "lr = 1e-2\|lr = 0.01" "$tmp/a/points/lr-1e-2_layers-2_seed-12/recipe.lua" 2>/dev/null &&
    grep -q "seed = 12" "$tmp/a/points/lr-1e-2_layers-2_seed-12/recipe.lua" &&
    grep -q '"seeds": {"train": 12}' "$tmp/a/points/lr-1e-2_layers-2_seed-12/provenance.json" &&
    ok "point lr-1e-2_layers-2_seed-12 ran with lr 1e-2 and seed 12 (the recipe's 11, then 12)" ||
    bad "point lr-1e-2_layers-2_seed-12 did not run with its values"

"$T" report --compare "$tmp/a" --json >"$tmp/a.json" 2>"$tmp/a.err" || bad "report --compare --json failed: $(cat "$tmp/a.err")"
"$T" report --compare "$tmp/a" --csv >"$tmp/a.csv" 2>"$tmp/a.err" || bad "report --compare --csv failed: $(cat "$tmp/a.err")"
"$T" report "$tmp/a" >"$tmp/a.txt" 2>"$tmp/a.err" && [ -s "$tmp/a/report.html" ] &&
    ok "report EXP: the table and EXP/report.html" || bad "report EXP failed: $(cat "$tmp/a.err")"
out=$(python3 - "$tmp/a" <<'EOF'
import csv, json, math, statistics, sys
exp = sys.argv[1]
rep = json.load(open(sys.argv[1] + "/../a.json"))
def metrics(name):
    rows = [json.loads(l) for l in open(f"{exp}/points/{name}/metrics.jsonl")]
    by = {}
    for r in rows: by[r["step"]] = r  # the last record of a step wins, as the report reads it
    steps = sorted(by)
    val = [by[s]["val_loss"] for s in steps if "val_loss" in by[s]]
    ev = json.load(open(f"{exp}/points/{name}/eval.json"))["tasks"][0]
    return {"final_val_loss": val[-1], "best_val_loss": min(val), "final_loss": by[steps[-1]]["loss"],
            "acc": ev["acc"], "acc_norm": ev["acc_norm"]}
sweep = json.load(open(exp + "/sweep.json"))
want = {}
for p in sweep["points"]:
    v = p["values"]
    want.setdefault((v["lr"], v["layers"]), []).append(metrics(p["name"]))
errs, checked = [], 0
verdicts = {("3e-3", "1"): "baseline", ("3e-3", "2"): "differs in layers only",
            ("1e-2", "1"): "differs in lr only", ("1e-2", "2"): "differs in lr, layers"}
csv_rows = {(r["lr"], r["layers"]): r for r in csv.DictReader(open(exp + "/../a.csv"))}
for s in rep["settings"]:
    key = (s["values"]["lr"], s["values"]["layers"])
    if s["verdict"] != verdicts[key]: errs.append(f"{key}: verdict {s['verdict']!r}")
    if s["seeds_verdict"] != "same experiment, another seed": errs.append(f"{key}: seeds {s['seeds_verdict']!r}")
    for fig in ("final_val_loss", "best_val_loss", "final_loss", "acc", "acc_norm"):
        xs = [m[fig] for m in want[key]]
        mean, sd = statistics.fmean(xs), statistics.stdev(xs)
        got = s[fig] if fig in s else s["tasks"]["choices"][fig]
        col = fig if fig in s else "choices_" + fig
        # two double sums of the same two decimals: equal to a few ulps (an sd of two equal
        # accuracies is 0 both ways)
        for what, a, b in (("mean", got["mean"], mean), ("sd", got["sd"], sd),
                           ("min", got["min"], min(xs)), ("max", got["max"], max(xs)),
                           ("csv mean", float(csv_rows[key][col + "_mean"]), mean),
                           ("csv sd", float(csv_rows[key][col + "_sd"]), sd)):
            checked += 1
            if not math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15): errs.append(f"{key} {fig} {what}: {a} vs {b}")
        if got["n"] != 2: errs.append(f"{key} {fig}: n {got['n']}")
print(("FAIL " + "; ".join(errs)) if errs else f"ok {checked} figures of 4 settings, verdicts and seeds")
EOF
)
case "$out" in
ok*) ok "the table equals the runs' metrics computed independently: ${out#ok }" ;;
*) bad "the table: $out" ;;
esac
grep -q "^lr=1e-2, layers=2 .*differs in lr, layers" "$tmp/a.txt" && ok "the text table: $(grep '^lr=1e-2, layers=2' "$tmp/a.txt" | tr -s ' ')" ||
    bad "the text table lacks its last setting: $(head -5 "$tmp/a.txt")"

# 1b. a second person reruns it from the experiment folder alone, anew, from elsewhere
(cd / && "$T" sweep "$tmp/a" --out "$tmp/a2" >"$tmp/a2.log" 2>&1) || bad "the rerun failed: $(tail -2 "$tmp/a2.log")"
"$T" report --compare "$tmp/a2" --csv >"$tmp/a2.csv" 2>&1
cmp -s "$tmp/a.csv" "$tmp/a2.csv" && [ "$(grep -c 'done in' "$tmp/a2.log")" -eq 8 ] &&
    ok "sweep EXP --out NEW (from /): all 8 points run again, the table byte for byte the same" ||
    bad "the rerun's table differs: $(diff "$tmp/a.csv" "$tmp/a2.csv" | head -3)"

# 2. stopped during its third point, then continued
grid2=(--grid lr=3e-3,1e-2 --seeds 2 --peak-gflops 100 --set steps=200 --set ckpt=20)
"$T" sweep "$R" --out "$tmp/b" "${grid2[@]}" >"$tmp/b.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [ -s "$tmp/b/points/lr-1e-2_seed-11/metrics.jsonl" ] && break
    sleep 0.1
done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] && grep -q "stopped by SIGTERM during point lr-1e-2_seed-11" "$tmp/b.log" &&
    ok "SIGTERM stopped the sweep during point 3 (exit 143)" || { bad "the stopped sweep exited $rc"; tail -3 "$tmp/b.log"; }
md5() { cat "$tmp/b/points/$1/attempts.jsonl" "$tmp/b/points/$1/metrics.jsonl" | md5sum; }
before=$(for p in lr-3e-3_seed-11 lr-3e-3_seed-12; do md5 $p; done)
"$T" sweep "$tmp/b" >"$tmp/b2.log" 2>&1 || bad "the continued sweep failed: $(tail -2 "$tmp/b2.log")"
after=$(for p in lr-3e-3_seed-11 lr-3e-3_seed-12; do md5 $p; done)
[ "$(grep -c 'done earlier' "$tmp/b2.log")" -eq 2 ] && [ "$before" = "$after" ] &&
    grep -q "point 3/4 lr-1e-2_seed-11: resuming" "$tmp/b2.log" &&
    ok "continued: 2 points done earlier (records untouched), point 3 resumed, the last ran" ||
    bad "the continued sweep: $(grep -c 'done earlier' "$tmp/b2.log") done earlier; $(grep 'point 3/4' "$tmp/b2.log")"
"$T" sweep "$R" --out "$tmp/c" "${grid2[@]}" >"$tmp/c.log" 2>&1 || bad "the uninterrupted reference sweep failed"
same=0
for d in "$tmp"/c/points/*/; do
    name=$(basename "$d")
    cmp -s <(losses "$d/metrics.jsonl") <(losses "$tmp/b/points/$name/metrics.jsonl") &&
        cmp -s "$d/checkpoints/$(cat "$d/checkpoints/latest")/rank_00000.safetensors" \
            "$tmp/b/points/$name/checkpoints/$(cat "$tmp/b/points/$name/checkpoints/latest")/rank_00000.safetensors" &&
        same=$((same + 1)) || bad "point $name differs from the uninterrupted sweep"
done
[ $same -eq 4 ] && ok "all 4 points' losses and final weights bitwise those of the uninterrupted sweep" ||
    bad "$same of 4 points bitwise equal"

# 3. a point that fails
"$T" sweep "$R" --out "$tmp/f" --grid --tp=2,1 --peak-gflops 100 >"$tmp/f.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q '"state": "failed"' "$tmp/f/status/tp-2.json" &&
    grep -q '"state": "done"' "$tmp/f/status/tp-1.json" &&
    grep -q "FAILED      tp-2: exit status 1: trainer run: dp 1 x tp 2 = 2 processes, but 1 started" "$tmp/f.log" &&
    ok "a failing point is recorded, the other done, exit 1: $(grep 'FAILED' "$tmp/f.log" | tr -s ' ' | cut -c1-160)" ||
    { bad "the failing point (exit $rc)"; tail -4 "$tmp/f.log"; }
"$T" report --compare "$tmp/f" --json | grep -q '"state": "failed", "why": "exit status 1: trainer run: dp 1 x tp 2' &&
    ok "report --compare names the failed point and why" || bad "report --compare lacks the failure"
"$T" sweep "$tmp/f" >"$tmp/f2.log" 2>&1
[ $? -eq 1 ] && grep -q "point 2/2 tp-1: done earlier" "$tmp/f2.log" && grep -q "point 1/2 tp-2: running" "$tmp/f2.log" &&
    ok "sweeping it again runs only the failed point" || bad "the second sweep: $(head -3 "$tmp/f2.log")"

# 3b. an evaluation that fails fails its point; once the task file is fixed, only the
# evaluation runs again (the training is not repeated)
printf '{"context": "a", "choices": ["b"], "answer": 3}\n' >"$tmp/bad_task.jsonl"
"$T" sweep "$R" --out "$tmp/e" --set steps=4 --peak-gflops 100 --eval-task "$tmp/bad_task.jsonl" >"$tmp/e.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q '"state": "failed", "why": "eval: exit status 1: .*bad_task.jsonl:1: .*", "trained": true' "$tmp/e/status/run.json" &&
    ok "a failed evaluation fails its point: $(grep -o '"why": "[^"]*"' "$tmp/e/status/run.json" | cut -c1-140)" ||
    { bad "the failed evaluation (exit $rc)"; cat "$tmp/e/status/run.json"; tail -3 "$tmp/e.log"; }
cp "$task" "$tmp/bad_task.jsonl"
"$T" sweep "$tmp/e" >"$tmp/e2.log" 2>&1
[ $? -eq 0 ] && grep -q "evaluating on 1 task" "$tmp/e2.log" && ! grep -q "running\|resuming" "$tmp/e2.log" &&
    [ -s "$tmp/e/points/run/eval.json" ] && [ "$(grep -c '"step"' "$tmp/e/points/run/metrics.jsonl")" -eq 4 ] &&
    ok "fixed, the sweep runs only the evaluation" || { bad "after the fix: $(cat "$tmp/e2.log")"; }

# 4. a layout per point through a launcher: the sweep made with --list, its points run one by
# one with --point (each dumping its final parameters for cmp_run)
if command -v mpirun >/dev/null; then
    "$T" sweep "$R" --out "$tmp/m" --grid --zero=0,1 --dp 2 --micro-batch 4 --set steps=8 \
        --peak-gflops 100 --launcher "mpirun -np 2 -x OMP_NUM_THREADS=1" --list >"$tmp/m.log" 2>&1
    [ $? -eq 1 ] && grep -q "2 points: 0 done, 0 failed, 2 unfinished" "$tmp/m.log" &&
        ok "--list with a recipe makes the sweep and runs nothing" || bad "--list: $(tail -1 "$tmp/m.log")"
    for k in 0 1; do
        TR_DUMP_PARAMS="$tmp/m/points/zero-$k.params" "$T" sweep "$tmp/m" --point $k >>"$tmp/m.log" 2>&1 ||
            { bad "point $k under mpirun failed"; tail -3 "$tmp/m.log"; }
    done
    grep -q "2 processes (mpi)" "$tmp/m/logs/zero-1.log" && e=$(cmp_run "$tmp/m/points/zero-1" "$tmp/m/points/zero-0") &&
        ok "mpirun -np 2 per point, ZeRO 0 and 1: equal within float32 reordering: $e" ||
        bad "the mpirun points: $(grep -m1 'processes' "$tmp/m/logs/zero-1.log") ${e:-}"
else
    echo "skip 4: no mpirun"
fi

# 5. bad input
refused() { # what expected-text args...
    local what=$1 want=$2
    shift 2
    "$T" sweep "$@" >"$tmp/x.out" 2>"$tmp/x.err"
    local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/x.err")" -eq 1 ] && grep -q -- "$want" "$tmp/x.err" &&
        [ ! -s "$tmp/x.out" ]; then
        ok "$what: $(cat "$tmp/x.err" | cut -c1-150)"
    else
        bad "$what: exit $rc, $(cat "$tmp/x.err" "$tmp/x.out" | head -3)"
    fi
}
refused "an unknown knob" "point lyrs-1: .*unknown knob" "$R" --out "$tmp/x1" --grid lyrs=1,2
[ -e "$tmp/x1" ] && bad "a refused sweep made its folder" || ok "a refused sweep made no folder"
refused "a bad value" "'x' is not a number" "$R" --out "$tmp/x2" --grid layers=1,x
refused "--resume" "--resume: the sweep decides" "$R" --out "$tmp/x3" --resume
refused "another sweep in EXP" "holds another sweep" "$R" --out "$tmp/a" --grid lr=1e-3
refused "flags with an experiment folder" "is an experiment folder" "$tmp/a" --grid lr=1e-3
refused "an experiment rerun into another experiment's folder" "holds another sweep" "$tmp/a" --out "$tmp/f"
refused "--point out of range" "--point 8: the sweep has 8 points" "$tmp/a" --point 8
refused "an empty grid value" "an empty value" "$R" --out "$tmp/x4" --grid lr=1e-3,
refused "a value over 128 bytes" "a value of 200 bytes (at most 128)" "$R" --out "$tmp/x5" --grid "lr=$(printf '1%.0s' $(seq 200))"
cp -r "$tmp/f" "$tmp/damaged" && echo '{"sweep": 1, "recipe": 5}' >"$tmp/damaged/sweep.json"
refused "a damaged sweep.json" "damaged/sweep.json: not a sweep this trainer wrote" "$tmp/damaged"
"$T" report "$tmp/damaged" >/dev/null 2>"$tmp/x.err"
[ $? -eq 1 ] && [ "$(wc -l <"$tmp/x.err")" -eq 1 ] && grep -q "sweep.json: not a sweep this trainer wrote" "$tmp/x.err" &&
    ok "report on a damaged sweep.json: $(cat "$tmp/x.err")" || bad "report on a damaged sweep.json: $(cat "$tmp/x.err")"
cp "$R" "$tmp/changed.lua" && sed -i "s#\.\./\.\./data#$PWD/data#" "$tmp/changed.lua"
"$T" sweep "$tmp/changed.lua" --out "$tmp/ch" --set steps=2 --peak-gflops 100 >/dev/null 2>&1 || bad "a one-point sweep failed"
echo "-- a change" >>"$tmp/changed.lua"
refused "a recipe changed since the sweep" "changed since the sweep" "$tmp/ch"

# 6. the recipe's own sweep { } gives the axes (in the order of their names) and the seeds;
# the command line's --grid replaces it
sed "s#\.\./\.\./data#$PWD/data#" "$R" >"$tmp/own.lua"
echo 'sweep { grid = { lr = { 3e-3, 1e-2 }, layers = { 2 } }, seeds = 2 }' >>"$tmp/own.lua"
"$T" sweep "$tmp/own.lua" --out "$tmp/own" --list >"$tmp/own.log" 2>&1
[ "$(grep -c ' unfinished  layers-2_lr-0.0[01]*3*_seed-1[12]$' "$tmp/own.log")" -eq 4 ] &&
    grep -q "  1  unfinished  layers-2_lr-0.003_seed-12" "$tmp/own.log" &&
    ok "the recipe's sweep { }: 4 points, axes by name, 3e-3 written 0.003" || bad "the recipe's sweep: $(cat "$tmp/own.log")"
"$T" sweep "$tmp/own.lua" --out "$tmp/own2" --grid steps=2 --list >"$tmp/own2.log" 2>&1
grep -q "replace the recipe's sweep { } (line 23)" "$tmp/own2.log" && grep -q "1 point: 0 done" "$tmp/own2.log" &&
    ok "--grid replaces the recipe's sweep { }, and says so" || bad "--grid with sweep { }: $(cat "$tmp/own2.log")"

exit $fail
