#!/usr/bin/env bash
# Faults that cross a network, on a cluster in a box (tests/cluster/cluster.sh): 2 hosts x 2
# slots, a 4-rank run of tests/recipes_good/tp_gpt.lua (layout planned, 50 steps, a checkpoint
# every 10, --timeout 5) under `trainer supervise --grace 5 --hostfile`:
#  1. attempt 1: the link of host n1 is cut (ip link set down) after step 12. The ranks left
#     give up within --timeout with a line naming the ranks and their host (n1's ranks blame
#     n0's in the shared folder too: the supervisor takes the side that could still tell it
#     over the network, and names those ranks in the cause's told_by); mpirun, which
#     cannot reach n1's daemon, would hang (it did for 200+ s): the supervisor ends its
#     process group --grace after the first rank announced its abort. Liveness bound: the
#     job's end within timeout + grace + 15 s of the cut. The link is mended and the
#     supervisor relaunches.
#  2. attempt 2: every process of n1 is killed (the host dies) after step 32 (from 10): the job ends,
#     the ranks the launcher stopped say so, and the supervisor names n1's rank. n1 has failed
#     twice: it is dropped, -np 4 -> 2.
#  3. attempt 3 runs on n0 alone, from the last checkpoint, to the last step, on a layout the
#     planner chose again for 2 processes (tp_gpt.lua leaves dp and tp to it: dp 2 x tp 2,
#     tp inside each host, became dp 2 x tp 1 here): its losses are those of a 2-rank run
#     of that layout resumed from the same checkpoint (within 1e-5).
# A rank's host is its namespace's host name. Needs root, iproute2 and Open MPI (else exits
# 77, skipped). About 1-2 minutes.
#
# usage: tests/cluster/faults.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
here=$(cd "$(dirname "$0")" && pwd)
C=$here/cluster.sh
command -v mpirun >/dev/null || { echo "SKIP no mpirun"; exit 77; }
[ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null ||
    { echo "SKIP needs root, ip and tc (network namespaces)"; exit 77; }
. "$here/../lib.sh"
R=tests/recipes_good/tp_gpt.lua
name=cf$$
name=${name:0:12}
tmp=$(mktemp -d)
cleanup() {
    "$C" down "$name" >/dev/null 2>&1
    [ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail=0
# every checkpoint kept (6: steps 10-50): attempt 3 resumes from the newest complete one, 30 or,
# when n1 died while step 30's was being saved, 20, and the reference run below starts from it
TIMEOUT=5 GRACE=5 STEPS=50

"$C" up "$name" --hosts 2 --slots 2 --rate 1gbit >"$tmp/up.log" 2>&1 ||
    { echo "FAIL cluster up: $(tail -1 "$tmp/up.log")"; exit 1; }
D=$("$C" dir "$name")
n1=$name-n1
out=$tmp/run

# the last step in OUT/metrics.jsonl of attempt $1 (0: none yet)
step_of() {
    grep -a "\"attempt\": $1," "$out/metrics.jsonl" 2>/dev/null | grep -o '^{"step": [0-9]*' |
        tail -1 | grep -o '[0-9]*$' || echo 0
}
# wait (at most $1 s) until the command that follows succeeds
wait_for() {
    local t=0 most=$(($1 * 5))
    shift
    until "$@"; do
        sleep 0.2
        t=$((t + 1))
        [ $t -le $most ] || return 1
    done
}
# attempt $1 has finished step $2
reached() { [ "$(step_of "$1")" -ge "$2" ]; }
# the supervisor's log has $1 lines "attempt N ended"
ended() { [ "$(grep -c "^supervise: attempt [0-9]* ended" "$tmp/sv.log")" -ge "$1" ]; }
# once attempt $1 has finished step $2 (within $3 s), `cluster.sh $4` on n1 ($5 says what that
# did): the job must end within $bound s of it
fault_at() {
    wait_for "$3" reached "$1" "$2" || { bad "attempt $1 did not reach step $2"; return; }
    local t0
    t0=$(date +%s)
    "$C" "$4" "$name" "$n1" >/dev/null
    if wait_for $bound ended "$1"; then
        ok "$5 after step $(step_of "$1"): the job ended $(($(date +%s) - t0)) s later (bound $bound s)"
    else
        bad "$5: the job has not ended $bound s later"
    fi
}

# rank 0 is made 100 ms slower each step (TR_FAULT_SLOW_RANK): a step of this tiny model takes
# tens of ms, and the faults must land mid-run
export TR_FAULT_SLOW_RANK=0:100 OMP_NUM_THREADS=1
"$C" run "$name" -- "$T" supervise --grace $GRACE --backoff 1 --hostfile "$D/hostfile" -- \
    mpirun -np 4 --hostfile "$D/hostfile" -x OMP_NUM_THREADS -x TR_FAULT_SLOW_RANK "$T" run "$R" \
    --set ckpt=10 --set keep_checkpoints=6 --steps $STEPS --timeout $TIMEOUT --peak-gflops 10 \
    --out "$out" >"$tmp/sv.log" 2>&1 &
sv=$!

# ---- 1. a link cut mid-run -----------------------------------------------------------------
bound=$((TIMEOUT + GRACE + 15))
fault_at 1 12 90 cut "the link of $n1 cut"
"$C" mend "$name" "$n1" >/dev/null 2>&1
line=$(grep -a -m1 "^trainer: rank [01]: .*did not complete within $TIMEOUT s: ranks 2, 3 (host $n1) did not answer" "$tmp/sv.log")
[ -n "$line" ] && ok "the ranks left name the host: $line" ||
    bad "no rank named host $n1: $(grep -a '^trainer: rank' "$tmp/sv.log" | head -2)"
grep -q "^supervise: a rank gave up on the job .* ending its process group (--grace $GRACE)" "$tmp/sv.log" &&
    ok "the supervisor ended the launcher that could not end the job" ||
    echo "note: the launcher ended the job by itself"

# ---- 2. the host dies ------------------------------------------------------------------------
fault_at 2 32 120 kill "$n1 killed"

# ---- 3. the host dropped, the run finished on the host left ---------------------------------
t=0
while kill -0 $sv 2>/dev/null && [ $t -lt 600 ]; do sleep 0.2; t=$((t + 1)); done
kill -0 $sv 2>/dev/null && { bad "the supervisor has not finished 120 s after the host's death"; kill $sv; }
wait $sv
rc=$?
python3 - "$out" "$n1" "$name-n0" >"$tmp/check" 2>&1 <<'PY'
import json, sys
out, n1, n0 = sys.argv[1:]
att = [json.loads(l) for l in open(out + "/attempts.jsonl")]
starts = [a for a in att if a["event"] == "start"]
sup = [a for a in att if a["event"] == "supervisor" and a["action"] != "done"]
bad = []
if [(a["ranks"], sorted(set(a["hosts"]))) for a in starts] != [(4, [n0, n1])] * 2 + [(2, [n0])]:
    bad.append("attempts' ranks and hosts: %s" % [(a["ranks"], a["hosts"]) for a in starts])
if [(a["cause"]["host"], a["action"]) for a in sup] != [(n1, "relaunch"), (n1, "drop host " + n1)]:
    bad.append("supervisor lines: %s" % sup)
told = sup[0]["cause"].get("told_by", []) if sup else []
if not told or any(starts[0]["hosts"][r] != n0 for r in told):
    bad.append("attempt 1's cause was not told to the supervisor by ranks of %s alone: %s" % (n0, told))
lay = [a.get("layout", {}) for a in starts]
if len(lay) == 3 and lay[2].get("dp", 0) * lay[2].get("tp", 0) * lay[2].get("pp", 0) != 2:
    bad.append("attempt 3's layout is not one of 2 processes: %s" % lay[2])
if bad:
    print("; ".join(bad))
else:  # the resume step, the layouts before and after the drop, and the flags of the latter
    d = lambda l: "dp %d x tp %d x pp %d" % (l["dp"], l["tp"], l["pp"])
    print(starts[2]["start_step"], d(lay[0]), "->", d(lay[2]), "|",
          "--dp %d --tp %d --pp %d" % (lay[2]["dp"], lay[2]["tp"], lay[2]["pp"]))
sys.exit(1 if bad else 0)
PY
checked=$?
if [ $rc -eq 0 ] && [ $checked -eq 0 ]; then
    read -r resumed layouts <"$tmp/check"
    flags=${layouts#*| }
    ok "$n1 failed twice: dropped, -np 4 -> 2, attempt 3 on $name-n0 from step $resumed," \
        "planned again: ${layouts% |*}"
    mkdir -p "$tmp/ref/checkpoints"
    ck=$(printf 'step_%08d' "$resumed")
    cp -r "$out/checkpoints/$ck" "$tmp/ref/checkpoints/"
    echo "$ck" >"$tmp/ref/checkpoints/latest"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 300 \
        mpirun -np 2 --oversubscribe "$T" run "$R" --set ckpt=10 --steps $STEPS --peak-gflops 10 \
        $flags --out "$tmp/ref" --resume >"$tmp/ref.log" 2>&1 || { bad "the reference run failed"; tail -3 "$tmp/ref.log"; }
    losses "$out/metrics.jsonl" | awk -v r="$resumed" '$1 > r' >"$tmp/run.losses"
    losses "$tmp/ref/metrics.jsonl" >"$tmp/ref.losses"
    if [ -s "$tmp/ref.losses" ] && e=$(compare "$tmp/run.losses" "$tmp/ref.losses" 1e-5); then
        ok "steps $((resumed + 1))-$STEPS on the host left continue as a 2-rank run ($flags) from step $resumed does: $e"
    else
        bad "the losses after the drop differ from the 2-rank run's: ${e:-no steps}"
    fi
else
    bad "supervise: exit $rc: $(cat "$tmp/check")"
fi
grep -a "^supervise" "$tmp/sv.log" | cut -c1-300 | sed 's/^/    /'
[ $fail = 0 ] && echo "PASS cluster_faults" || echo "FAIL cluster_faults"
exit $fail
