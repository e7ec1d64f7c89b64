#!/usr/bin/env bash
# A run folder belongs to one run (on tests/checkpoint/gpt.lua, 24 steps, checkpoints 16, 24):
#  1. a new run into a folder that holds a run is refused in one line and changes no byte;
#  2. --overwrite replaces it: no old checkpoint or record is left, a user's file stays;
#  3. --resume with another recipe is refused, with and without checkpoints, changing nothing;
#  4. export, sample and --resume follow checkpoints/latest (made to name the older step);
#  5. a second run on a folder in use is refused in one line, the first finishes normally;
#  6. --resume repairs a metrics.jsonl and attempts.jsonl whose last record a kill cut short,
#     and every record reads back (losses, report);
#  7. under mpirun (skipped without it): a 2-rank run holds the folder's lock on rank 0; a
#     second 2-rank run on it is refused on every rank in one line, exits non-zero at once
#     (no hang) and the first finishes; once that run is SIGKILLed its lock is gone (the
#     kernel drops a dead process's flock) and --resume goes on from its checkpoint.
# usage: tests/run_folder.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
R=tests/checkpoint/gpt.lua
L=tests/checkpoint/llama.lua
run() { "$T" run "$@" --peak-gflops 100; }
# every file's bytes under a folder but the lock, as one line per file
sums() { (cd "$1" && find . -type f ! -name .lock | sort | xargs md5sum); }
one_line() { [ "$(wc -l <"$1")" -eq 1 ]; }

A=$tmp/a
run "$R" --out "$A" >"$tmp/a.log" 2>&1 || { bad "first run failed"; cat "$tmp/a.log"; exit 1; }
sums "$A" >"$tmp/a.sums"

# 1. rerun without --resume
run "$R" --out "$A" --steps 5 >"$tmp/1.out" 2>"$tmp/1.err"
rc=$?
if [ $rc -ne 0 ] && one_line "$tmp/1.err" && grep -q "holds a run of .*gpt.lua (24 steps, checkpoints up to step 24).*--resume.*--overwrite.*--out" "$tmp/1.err"; then
    ok "a rerun into a run folder is refused in one line (exit $rc)"
else
    bad "a rerun into a run folder was not refused in one line (exit $rc)"; cat "$tmp/1.err"
fi
sums "$A" | diff "$tmp/a.sums" - >/dev/null && ok "and no byte of the folder changed" ||
    bad "the refused rerun changed the folder"

# 2. --overwrite
O=$tmp/o
cp -r "$A" "$O" && echo mine >"$O/notes.txt"
run "$R" --out "$O" --steps 5 --overwrite >"$tmp/2.log" 2>&1 || { bad "--overwrite failed"; cat "$tmp/2.log"; }
left=$(cd "$O/checkpoints" && ls -d step_* | tr '\n' ' ')
[ "$left" = "step_00000005 " ] && [ "$(cat "$O/checkpoints/latest")" = step_00000005 ] &&
    ok "--overwrite left no old checkpoint ($left)" || bad "--overwrite left checkpoints: $left"
n=$(grep -c '"step"' "$O/metrics.jsonl")
a=$(grep -c '"event": "start"' "$O/attempts.jsonl")
[ "$n" -eq 5 ] && [ "$a" -eq 1 ] && [ "$(cat "$O/notes.txt")" = mine ] &&
    ok "its records are the new run's alone (5 steps, 1 attempt) and a user's file stayed" ||
    bad "after --overwrite: $n step records, $a attempts, notes '$(cat "$O/notes.txt" 2>&1)'"

# 3. --resume with another recipe, with and without checkpoints
run "$L" --out "$A" --resume >"$tmp/3.out" 2>"$tmp/3.err"
rc=$?
[ $rc -ne 0 ] && one_line "$tmp/3.err" && sums "$A" | diff "$tmp/a.sums" - >/dev/null &&
    ok "--resume with another recipe is refused (checkpoints): $(cut -c1-90 "$tmp/3.err")..." ||
    { bad "--resume with another recipe was not refused (exit $rc)"; cat "$tmp/3.err"; }
N=$tmp/n
run "$R" --out "$N" --steps 6 --set every=0 >"$tmp/n.log" 2>&1 || { bad "run without checkpoints failed"; cat "$tmp/n.log"; }
sums "$N" >"$tmp/n.sums"
run "$L" --out "$N" --resume >"$tmp/3b.out" 2>"$tmp/3b.err"
rc=$?
[ $rc -ne 0 ] && one_line "$tmp/3b.err" && grep -q "recipe.lua" "$tmp/3b.err" &&
    sums "$N" | diff "$tmp/n.sums" - >/dev/null &&
    ok "--resume with another recipe is refused (no checkpoint): $(cut -c1-90 "$tmp/3b.err")..." ||
    { bad "--resume with another recipe and no checkpoint was not refused (exit $rc)"; cat "$tmp/3b.err"; }

# 4. latest names the older of two complete checkpoints
Z=$tmp/z
cp -r "$A" "$Z" && echo step_00000016 >"$Z/checkpoints/latest"
"$T" export "$Z" --format hf --out "$tmp/hf" >"$tmp/4.log" 2>&1
grep -q "step 16 of" "$tmp/4.log" && ok "export follows latest (step 16)" ||
    { bad "export did not follow latest"; cat "$tmp/4.log"; }
"$T" sample "$Z" --tokens 8 --temperature 0 >/dev/null 2>"$tmp/s.err"
grep -q "from .*step_00000016 (step 16)" "$tmp/s.err" && ok "sample follows latest" ||
    { bad "sample did not follow latest"; cat "$tmp/s.err"; }
run "$R" --out "$Z" --resume >"$tmp/4r.log" 2>&1
grep -q "resuming from .*step_00000016 (step 16;" "$tmp/4r.log" && ok "--resume follows latest" ||
    { bad "--resume did not follow latest"; grep -i resum "$tmp/4r.log"; }
rm -rf "$Z/checkpoints/latest" && "$T" export "$Z" --format hf --out "$tmp/hf2" >"$tmp/4m.log" 2>&1
grep -q "latest is missing" "$tmp/4m.log" && grep -q "step 24 of" "$tmp/4m.log" &&
    ok "without latest: the newest complete one, said" || { bad "without latest"; cat "$tmp/4m.log"; }

# 5. two runs on one folder at once
C=$tmp/c
TR_FAULT_SLOW_RANK=0:150 "$T" run "$R" --out "$C" --peak-gflops 100 >"$tmp/c1.log" 2>&1 &
first=$!
for _ in $(seq 100); do [ -s "$C/metrics.jsonl" ] && break; sleep 0.1; done
run "$R" --out "$C" --overwrite >"$tmp/c2.out" 2>"$tmp/c2.err"
rc=$?
one_line "$tmp/c2.err" && [ $rc -ne 0 ] && grep -q "is in use by pid $first on host .*another trainer run" "$tmp/c2.err" &&
    ok "a second run on a folder in use is refused: $(cat "$tmp/c2.err")" ||
    { bad "a second run on a folder in use was not refused as expected (exit $rc)"; cat "$tmp/c2.err"; }
wait $first && [ "$(losses "$C/metrics.jsonl" | wc -l)" -eq 24 ] && ok "the first finished normally" ||
    { bad "the first run did not finish normally"; tail -3 "$tmp/c1.log"; }

# 6. a record cut short by a kill, then --resume
K=$tmp/k
TR_FAULT_KILL_AFTER_STEP=8 run "$R" --out "$K" >"$tmp/k.log" 2>&1
printf '{"step": 9, "loss": 3.1' >>"$K/metrics.jsonl"
printf '{"event": "stopp' >>"$K/attempts.jsonl"
run "$R" --out "$K" --resume >"$tmp/k2.log" 2>&1 || { bad "resume after a cut record failed"; tail -3 "$tmp/k2.log"; }
grep -q "metrics.jsonl: dropped its last .* bytes" "$tmp/k2.log" && grep -q "attempts.jsonl: dropped" "$tmp/k2.log" &&
    ok "the cut records were dropped, and said" || { bad "the cut records were not said"; cat "$tmp/k2.log"; }
python3 -c '
import json, sys
for f in sys.argv[1:]:
    for line in open(f): json.loads(line)' "$K/metrics.jsonl" "$K/attempts.jsonl" "$K/ledger.jsonl" 2>"$tmp/json.err" &&
    diff <(losses "$A/metrics.jsonl") <(losses "$K/metrics.jsonl") >/dev/null &&
    "$T" report "$K" --out "$tmp/k.html" >/dev/null 2>&1 &&
    ok "every record reads back: the losses are the uninterrupted run's, the report is written" ||
    { bad "the records do not read back"; tail -2 "$tmp/json.err"; }

# 7. the lock under mpirun
if ! command -v mpirun >/dev/null; then
    echo "SKIP 7: no mpirun"
    exit $fail
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
M=$tmp/m
TR_FAULT_SLOW_RANK=0:150 timeout 300 mpirun -np 2 "$T" run "$R" --out "$M" --peak-gflops 100 \
    >"$tmp/m1.log" 2>&1 &
first=$!
for _ in $(seq 300); do [ -s "$M/metrics.jsonl" ] && break; sleep 0.1; done
timeout 60 mpirun -np 2 "$T" run "$R" --out "$M" --overwrite --peak-gflops 100 >"$tmp/m2.out" 2>"$tmp/m2.err"
rc=$?
# mpirun adds its own lines about the failed job; the trainer's refusal is one line
n=$(grep -c "trainer run: .*is in use by pid [0-9]* on host .*another trainer run" "$tmp/m2.err")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] &&
    ok "under mpirun a second 2-rank run is refused in one line (exit $rc)" ||
    { bad "under mpirun the second run was not refused as expected (exit $rc, $n refusal lines)"; cat "$tmp/m2.err"; }
wait $first && [ "$(losses "$M/metrics.jsonl" | wc -l)" -eq 24 ] && ok "and the first 2-rank run finished" ||
    { bad "the first 2-rank run did not finish"; tail -3 "$tmp/m1.log"; }
# a dead run's lock: SIGKILL a run right after its checkpoint at step 16, then --resume
TR_FAULT_KILL_AFTER_STEP=16 timeout 300 mpirun -np 2 "$T" run "$R" --out "$M" --overwrite \
    --peak-gflops 100 >"$tmp/m3.log" 2>&1
timeout 300 mpirun -np 2 "$T" run "$R" --out "$M" --resume --peak-gflops 100 >"$tmp/m4.log" 2>&1 &&
    grep -q "resuming from .*step_00000016" "$tmp/m4.log" &&
    [ "$(losses "$M/metrics.jsonl" | wc -l)" -eq 24 ] &&
    ok "a killed run leaves no lock: --resume went on from step 16" ||
    { bad "--resume after a killed 2-rank run failed"; tail -3 "$tmp/m4.log"; }
exit $fail
