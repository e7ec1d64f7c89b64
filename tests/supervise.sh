#!/usr/bin/env bash
# trainer supervise (trainer/ops/supervise.c) with real MPI processes:
#  1. random SIGKILL trials: a 4-rank run of tests/recipes_good/dp_tiny.lua (24 steps, a
#     checkpoint every 4) under `trainer supervise`; from outside the trainer, one of its rank
#     processes (found with pgrep -f on the trial's own output folder) is killed with SIGKILL:
#     in its setup, at a random step, before the first checkpoint, or while a checkpoint is
#     being written (the trials rotate through these). Every run must finish, its final
#     parameters (TR_DUMP_PARAMS) bitwise those of an uninterrupted run; the goodput of each
#     trial and of all is printed. As many trials as fit in about 30 s (at least 4;
#     TRIAL_BUDGET=S changes it), or --trials N.
#  2. a host that fails twice is dropped: two hosts on one machine (see fake_host below), a
#     rank of the second killed in two attempts at different steps; the third attempt runs on
#     the first host's 2 ranks, and its losses are those of a 2-rank run resumed from the same
#     checkpoint (within 1e-5).
#  3. a deterministic crash (a rank killed after the same step in every attempt) stops after
#     two identical failures with the summary, not --restarts relaunches.
#  4. mistakes in the supervisor's flags or command: one line, exit 2.
#  5. which host died, from the "stopped" lines alone (a made-up attempt of 4 ranks on hosts A
#     A B B that exits 9): the one host none of whose ranks wrote one, where every other host
#     has a rank that did, even when a rank elsewhere died too (of its lost connections).
#
# Two hosts on one machine. Open MPI only starts ranks here, so the host a rank "runs on" is
# made up: mpirun gets no host file and the real -np, and each rank is started through the
# wrapper fake_host (written below), whose own `--hostfile FILE` argument is the host file the
# supervisor edits: the wrapper gives rank $OMPI_COMM_WORLD_RANK the host that Open MPI's
# by-slot mapping would give it in FILE, as TR_HOSTNAME (which the run's records use for the
# host name). So the supervisor finds, replaces and prunes a real --hostfile argument in the
# command and lowers -np, exactly as it would for mpirun's own, and mpirun runs on this machine.
# The wrapper's FAULTS="ATTEMPT:HOST:STEP ..." kills the first rank of HOST after STEP in that
# attempt (counted from OUT/attempts.jsonl's start lines), through the trainer's fault hooks.
#
# usage: tests/supervise.sh path/to/trainer [--trials N]   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
trials=0
[ "${2:-}" = --trials ] && trials=${3:?--trials needs a number}
command -v mpirun >/dev/null || { echo "SKIP no mpirun (apt-get install openmpi-bin)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
R=tests/recipes_good/dp_tiny.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

cat >"$tmp/fake_host" <<'EOF'
#!/usr/bin/env bash
# fake_host --hostfile FILE COMMAND...: COMMAND as if on the host of this rank in FILE
# (also --hostfile=FILE)
case "$1" in
--hostfile) file=$2; shift 2 ;;
--hostfile=*) file=${1#--hostfile=}; shift ;;
*) echo "fake_host: --hostfile FILE first" >&2; exit 2 ;;
esac
rank=${OMPI_COMM_WORLD_RANK:?not started by mpirun}
host() { # the host of rank $1 under by-slot mapping
    awk -v r="$1" '{ sub(/#.*/, "") } NF { n = 1
        for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) n = substr($i, 7) + 0
        for (k = 0; k < n; k++) if (seen++ == r) { print $1; exit } }' "$file"
}
export TR_HOSTNAME=$(host "$rank")
attempt=$(( $(grep -c '"event": "start"' "$FAULT_OUT/attempts.jsonl" 2>/dev/null || true) + 1 ))
for f in ${FAULTS:-}; do
    IFS=: read -r a h s <<<"$f"
    first=0
    while [ "$(host "$first")" != "$h" ] && [ "$first" -lt 4096 ]; do first=$((first + 1)); done
    if [ "$a" = "$attempt" ] && [ "$first" = "$rank" ]; then
        export TR_FAULT_KILL_AFTER_STEP=$s TR_FAULT_KILL_RANK=$rank
    fi
done
exec "$@"
EOF
chmod +x "$tmp/fake_host"

# ---- 4. bad flags and commands: one line, exit 2 ----------------------------------------
bad_case() { # what expected-text args...
    local what=$1 want=$2
    shift 2
    "$T" supervise "$@" >"$tmp/bad.out" 2>"$tmp/bad.err"
    local rc=$? lines
    lines=$(wc -l <"$tmp/bad.err")
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$want" "$tmp/bad.err" && [ ! -s "$tmp/bad.out" ]; then
        ok "$what: $(cat "$tmp/bad.err")"
    else
        bad "$what: exit $rc, $lines line(s): $(cat "$tmp/bad.err")"
    fi
}
bad_case "no --" "the command goes after '--'" mpirun -np 2 "$T" run "$R"
bad_case "nothing after --" "no command after '--'" --restarts 3 --
bad_case "no trainer run in the command" "runs no \`trainer run\`" -- mpirun -np 2 hostname
bad_case "a missing host file" "--hostfile '$tmp/nope'" --hostfile "$tmp/nope" -- \
    mpirun -np 2 --hostfile "$tmp/nope" "$T" run "$R"
printf 'hostA slots=2\nhostB slots=two\n' >"$tmp/badhosts"
bad_case "a bad host file line" "badhosts:2: 'slots=two'" --hostfile "$tmp/badhosts" -- \
    mpirun -np 2 --hostfile "$tmp/badhosts" "$T" run "$R"
printf 'hostA slots=2\n' >"$tmp/hosts1"
bad_case "a host file the command does not use" "no --hostfile, -hostfile or --machinefile" \
    --hostfile "$tmp/hosts1" -- mpirun -np 2 "$T" run "$R"
bad_case "a bad --restarts" "--restarts needs a non-negative integer" --restarts -1 -- "$T" run "$R"
bad_case "a bad --backoff=" "--backoff needs seconds from 0 to 86400, got 'x'" --backoff=x -- "$T" run "$R"
bad_case "a bad --grace" "--grace needs seconds from 0 to 86400, got 'x'" --grace x -- "$T" run "$R"
bad_case "a bad --grace=" "--grace needs seconds from 0 to 86400, got '-1'" --grace=-1 -- "$T" run "$R"
# a host line without slots= is as many slots as that host has cores to Open MPI, which the
# supervisor cannot count: refused, not taken as 1
printf 'hostA slots=2\nhostB\n' >"$tmp/noslots"
bad_case "a host without slots=" "noslots:2: host hostB has no slots=N" --hostfile="$tmp/noslots" -- \
    mpirun -np 2 --hostfile "$tmp/noslots" "$T" run "$R"
# the launcher's count in its = form (srun's --ntasks=N style) is read, and must be a count
bad_case "a bad --np=" "the command's --np 'x' is not a number of processes" --hostfile "$tmp/hosts1" -- \
    mpirun --np=x --machinefile="$tmp/hosts1" "$T" run "$R"
bad_case "a bad -n" "the command's -n '0' is not a number of processes" --hostfile "$tmp/hosts1" -- \
    mpirun -n 0 -hostfile "$tmp/hosts1" "$T" run "$R"
bad_case "a bad flag of the run" "unknown option '--bogus'" -- "$T" run "$R" --bogus

# a command that exits 0 without training is no success (it reported one): exit 1, one line
"$T" supervise --restarts 0 -- sh -c 'exit 0' "$T" run "$R" --out "$tmp/idle" >"$tmp/idle.log" 2>"$tmp/idle.err"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/idle.err")" -eq 1 ] &&
    grep -q "the command exited 0, but no \`trainer run\` started in $tmp/idle" "$tmp/idle.err" &&
    ok "a command that exits 0 without training: exit 1, $(cat "$tmp/idle.err")" ||
    bad "a command that exits 0 without training: exit $rc: $(cat "$tmp/idle.err")"

# ---- 5. which host died, from the "stopped" lines ------------------------------------------
cat >"$tmp/fake_attempt" <<'EOF'
#!/bin/sh
# fake_attempt OUT trainer run R --out OUT: the start of an attempt of ranks on hosts A A B B,
# a "stopped" line from each rank in $STOPPED, exit 9
out=$1
n=$(($(cat "$out/attempts.jsonl" 2>/dev/null | grep -c '"start"') + 1))
now=$(date +%s.%N)
printf '{"event": "start", "attempt": %d, "t": %s, "start_step": 0, "steps": 10, "ranks": 4, "hosts": ["A", "A", "B", "B"]}\n' "$n" "$now" >>"$out/attempts.jsonl"
for r in $STOPPED; do
    h=A
    [ "$r" -ge 2 ] && h=B
    printf '{"event": "stopped", "attempt": %d, "rank": %d, "host": "%s", "last_step": 3, "t": %s, "signal": "SIGTERM"}\n' "$n" "$r" "$h" "$now" >>"$out/attempts.jsonl"
done
exit 9
EOF
chmod +x "$tmp/fake_attempt"
for c in "0 1|rank 2 on B failed" "1|rank 2 on B failed" "0 1 2|rank 3 on B failed" "1 2|which rank failed is not known"; do
    st=${c%%|*} want=${c#*|}
    rm -rf "$tmp/fk" && mkdir -p "$tmp/fk"
    got=$(STOPPED=$st "$T" supervise --restarts 0 --backoff 0 -- "$tmp/fake_attempt" "$tmp/fk" \
        trainer run "$R" --out "$tmp/fk" 2>&1 | grep -a "^supervise: attempt 1 ended")
    case $got in
    *"$want"*) ok "ranks $st stopped (hosts A A B B): $want" ;;
    *) bad "ranks $st stopped (hosts A A B B): want '$want', got '$got'" ;;
    esac
done

# ---- 3. a deterministic crash stops after two identical failures -------------------------
out=$tmp/det
TR_FAULT_KILL_AFTER_STEP=7 TR_FAULT_KILL_RANK=1 timeout 300 "$T" supervise --restarts 5 --backoff 0 -- \
    mpirun -np 2 "$T" run "$R" --set ckpt=5 --peak-gflops 10 --out "$out" >"$tmp/det.log" 2>&1
rc=$?
starts=$(grep -c '"event": "start"' "$out/attempts.jsonl" 2>/dev/null)
summary=$(grep -a "^supervise: gave up" "$tmp/det.log")
if [ $rc -eq 1 ] && [ "$starts" = 2 ] && [[ "$summary" == *"two attempts in a row failed the same way"* ]] &&
    [[ "$summary" == *"after step 7 of 20, rank 1 on "* ]] &&
    [ "$(grep -o '"action": "[a-z ]*"' "$out/attempts.jsonl" | tr '\n' ' ')" = '"action": "relaunch" "action": "give up" ' ]; then
    ok "a crash after step 7 in every attempt: stopped after 2 attempts (of 5 relaunches allowed)"
    echo "     ${summary:0:400}"
else
    bad "deterministic crash: exit $rc, $starts attempts, summary '$summary'"
    tail -5 "$tmp/det.log"
fi

# a run killed right after its last step's checkpoint (a kill "in setup" landed there once,
# on a fast machine): the training is complete; no relaunch, which would find nothing to do
out=$tmp/last
TR_FAULT_KILL_AFTER_STEP=20 TR_FAULT_KILL_RANK=1 timeout 300 "$T" supervise --backoff 0 -- \
    mpirun -np 2 "$T" run "$R" --set ckpt=5 --peak-gflops 10 --out "$out" >"$tmp/last.log" 2>&1
rc=$?
starts=$(grep -c '"event": "start"' "$out/attempts.jsonl" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$starts" = 1 ] &&
    grep -q "^supervise: the checkpoint of the run's last step (20) is saved: the training is complete" "$tmp/last.log"; then
    ok "a kill after the last step's checkpoint: finished, not relaunched"
else
    bad "a kill after the last step's checkpoint: exit $rc, $starts attempts"
    grep -a "^supervise\|^trainer" "$tmp/last.log" | tail -5
fi

# ---- 2. a host that fails twice is dropped -----------------------------------------------
out=$tmp/drop
printf 'hostA slots=2\nhostB slots=2\n' >"$tmp/hosts"
# (the supervisor's --hostfile and the command's in their = forms: both are read and edited)
FAULT_OUT=$out FAULTS="1:hostB:7 2:hostB:13" timeout 300 "$T" supervise --backoff 0 --hostfile="$tmp/hosts" -- \
    mpirun -np 4 "$tmp/fake_host" --hostfile="$tmp/hosts" "$T" run "$R" --set ckpt=5 --peak-gflops 10 \
    --out "$out" >"$tmp/drop.log" 2>&1
rc=$?
python3 - "$out" >"$tmp/drop.check" 2>&1 <<'PY'
import json, sys
out = sys.argv[1]
att = [json.loads(l) for l in open(out + "/attempts.jsonl")]
starts = [a for a in att if a["event"] == "start"]
sup = [a for a in att if a["event"] == "supervisor" and a["action"] != "done"]
bad = []
if [(a["ranks"], sorted(set(a["hosts"]))) for a in starts] != [(4, ["hostA", "hostB"])] * 2 + [(2, ["hostA"])]:
    bad.append("attempts' ranks and hosts: %s" % [(a["ranks"], a["hosts"]) for a in starts])
if [(a["cause"], a["last_step"], a["action"]) for a in sup] != [
        ({"rank": 2, "host": "hostB", "exit": sup[0]["cause"]["exit"]}, 7, "relaunch"),
        ({"rank": 2, "host": "hostB", "exit": sup[0]["cause"]["exit"]}, 13, "drop host hostB")]:
    bad.append("supervisor lines: %s" % sup)
if open(out + "/supervise.hostfile").read() != "hostA slots=2\n":
    bad.append("supervise.hostfile: %r" % open(out + "/supervise.hostfile").read())
print("; ".join(bad) if bad else starts[2]["start_step"])
sys.exit(1 if bad else 0)
PY
if [ $rc -eq 0 ] && resumed=$(cat "$tmp/drop.check") && [ "$resumed" = 10 ]; then
    ok "hostB failed after steps 7 and 13: dropped, -np 4 -> 2, attempt 3 on hostA from step 10"
    # the reference: 2 ranks resumed from the same checkpoint, uninterrupted
    mkdir -p "$tmp/ref/checkpoints"
    cp -r "$out/checkpoints/step_00000010" "$tmp/ref/checkpoints/"
    echo step_00000010 >"$tmp/ref/checkpoints/latest"
    timeout 300 mpirun -np 2 "$T" run "$R" --set ckpt=5 --peak-gflops 10 --out "$tmp/ref" --resume \
        >"$tmp/ref.log" 2>&1 || { bad "the reference run failed"; tail -3 "$tmp/ref.log"; }
    losses "$out/metrics.jsonl" | awk '$1 > 10' >"$tmp/drop.losses"
    losses "$tmp/ref/metrics.jsonl" >"$tmp/ref.losses"
    if [ "$(wc -l <"$tmp/ref.losses")" = 10 ] && e=$(compare "$tmp/drop.losses" "$tmp/ref.losses" 1e-5); then
        ok "steps 11-20 on the hosts left continue as a 2-rank run from step 10 does: $e"
    else
        bad "the losses after the drop differ from the 2-rank run's: ${e:-no steps}"
    fi
else
    bad "host drop: exit $rc: $(cat "$tmp/drop.check")"
    grep -a "^supervise" "$tmp/drop.log" | tail -5
fi

# ---- 1. random SIGKILL trials ------------------------------------------------------------
# Each trial: the supervisor on a fresh folder; a poller waits for the trial's moment (a
# random delay into its setup; N metrics records, N random or before the first checkpoint at
# step 4; a checkpoints/.tmp_step_* folder, of a random one of the saves: a save being
# written), then SIGKILLs a random one
# of the rank processes (pgrep -f on the folder; the supervisor and mpirun are not ranks).
cat >"$tmp/trials.py" <<'PY'
import os, random, re, signal, subprocess, sys, time
T, R, tmp, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
budget = float(os.environ.get("TRIAL_BUDGET", 30))
seed = int(os.environ.get("TRIAL_SEED", time.time()))
rng = random.Random(seed)
args = ["--set", "ckpt=4", "--set", "steps=24", "--peak-gflops", "10"]

def run_cmd(out):
    return ["mpirun", "-np", "4", T, "run", R] + args + ["--out", out]

ref = tmp + "/ref_params"
if subprocess.run(run_cmd(tmp + "/trial_ref"), env=dict(os.environ, TR_DUMP_PARAMS=ref),
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
    print("FAIL the uninterrupted run failed"); sys.exit(1)
want_params = open(ref, "rb").read()

def ranks(out, sup):
    pids = subprocess.run(["pgrep", "-f", out], capture_output=True, text=True).stdout.split()
    keep = []
    for p in pids:
        try:
            comm = open("/proc/%s/comm" % p).read().strip()
        except OSError:
            continue
        if comm == "trainer" and int(p) != sup:
            keep.append(int(p))
    return keep

def steps_done(out):
    try:
        return sum(1 for _ in open(out + "/metrics.jsonl"))
    except OSError:
        return 0

def saving(out):
    try:
        return any(n.startswith(".tmp_step") for n in os.listdir(out + "/checkpoints"))
    except OSError:
        return False

def trial(i):
    out = "%s/trial_%d" % (tmp, i)
    mode = ["early", "save", "step", "setup"][i % 4]
    # save: the save after step n + 4 (n + 4 = 4 is the first; later ones leave a checkpoint)
    n = {"early": rng.randint(1, 3), "step": rng.randint(1, 23), "save": 4 * rng.randint(0, 4)}.get(mode, 0)
    delay = rng.uniform(0.0, 1.5)
    log = open(out + ".log", "w")
    t0 = time.time()
    sup = subprocess.Popen([T, "supervise", "--backoff", "0", "--"] + run_cmd(out),
                           env=dict(os.environ, TR_DUMP_PARAMS=out + ".params"),
                           stdout=log, stderr=subprocess.STDOUT)
    where, pids, t_pids = "no kill (the run ended first)", [], 0.0
    while sup.poll() is None:
        now = time.time() - t0
        if now - t_pids > 0.05 and (not pids or not all(os.path.exists("/proc/%d" % p) for p in pids)):
            pids, t_pids = ranks(out, sup.pid), now  # found ahead: a save is over in milliseconds
        ready = now >= delay if mode == "setup" else steps_done(out) >= n and (mode != "save" or saving(out))
        if ready and pids:
            done, sv = steps_done(out), saving(out)
            first = os.path.exists(out + "/checkpoints/latest")
            os.kill(rng.choice(pids), signal.SIGKILL)
            where = ("during a save" if sv else "after step %d" % done if done else "in setup")
            where += "" if first else ", before the first checkpoint"
            break
        time.sleep(0.0005)
    try:
        rc = sup.wait(timeout=300)
    except subprocess.TimeoutExpired:
        sup.kill(); rc = -1
    log.close()
    text = open(out + ".log").read()
    g = re.search(r"goodput ([0-9.]+)%: ([0-9.]+) s of training kept in ([0-9.]+) s", text)
    try:
        same = open(out + ".params", "rb").read() == want_params
    except OSError:
        same = False
    okay = rc == 0 and same and g is not None
    print("%s trial %d (%s): killed %s; exit %d, %s; goodput %s" % (
        "ok  " if okay else "FAIL", i + 1, mode, where, rc,
        "parameters bitwise equal" if same else "PARAMETERS DIFFER OR MISSING",
        "%s%% (%s s kept of %s s)" % g.groups() if g else "not printed"), flush=True)
    return okay, where, (float(g.group(2)), float(g.group(3))) if g else (0.0, 0.0)

t_start, results = time.time(), []
while (len(results) < want) if want else (time.time() - t_start < budget or len(results) < 4):
    results.append(trial(len(results)))
kept, wall = sum(r[2][0] for r in results), sum(r[2][1] for r in results)
landed = [r[1] for r in results]
print("%d trials (seed %d): %d finished with the uninterrupted run's parameters; kills in "
      "setup %d, before the first checkpoint %d, during a save %d; overall goodput %.1f%% "
      "(%.1f s of training kept in %.1f s)" % (
      len(results), seed, sum(r[0] for r in results), sum("in setup" in w for w in landed),
      sum("before the first" in w for w in landed), sum("during a save" in w for w in landed),
      100 * kept / wall if wall else 0, kept, wall))
sys.exit(0 if all(r[0] for r in results) and any("during a save" in w for w in landed)
         and any("before the first" in w for w in landed) else 1)
PY
if python3 "$tmp/trials.py" "$T" "$R" "$tmp" "$trials"; then
    ok "random SIGKILL trials: every run finished with the uninterrupted run's parameters"
else
    bad "random SIGKILL trials (above)"
fi

exit $fail
