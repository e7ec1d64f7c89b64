#!/usr/bin/env bash
# The ledger (trainer/report/ledger.c) with real MPI processes: per rank, its parts sum to the
# rank's
# wall time (within 1%) and the windows to the totals; a clean run names no straggler; a rank
# slowed from some step on (TR_FAULT_SLOW_RANK) is named within a few steps, once, and charged
# the others' waiting; a run whose rank is killed and then resumed has two attempts in
# attempts.jsonl, the killed rank the only one not stopped by the launcher, and the steps done
# again, and `trainer report` charges the downtime to the killed rank's host. A pipeline run
# charges its bubble.
set -u
T="$1"
command -v mpirun >/dev/null || { echo "SKIP no mpirun (apt-get install openmpi-bin)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
R=tests/recipes_good/dp_tiny.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# check.py OUT MODE [ARGS]: the ledger's files against what the run must show
cat >"$tmp/check.py" <<'EOF'
import json, sys
out, mode = sys.argv[1], sys.argv[2]
def lines(name):
    with open(f"{out}/{name}") as f:
        return [json.loads(l) for l in f if l.strip()]
led, att = lines("ledger.jsonl"), lines("attempts.jsonl")
bad = []
def need(ok, what):
    if not ok: bad.append(what)
totals = [l for l in led if l["kind"] == "total"]
wins = [l for l in led if l["kind"] == "window"]
strag = [l for l in led if l["kind"] == "straggler"]
if mode in ("clean", "slow", "pipe"):
    need(len(totals) == 1, f"one total line, got {len(totals)}")
    t = totals[0]
    n = len(t["wall_s"])
    for r in range(n):
        s = sum(t["parts"][p][r] for p in t["parts"])
        need(abs(s - t["wall_s"][r]) <= 0.01 * t["wall_s"][r],
             f"rank {r}: parts sum to {s:.4f} s, wall {t['wall_s'][r]:.4f} s")
        need(all(t["parts"][p][r] >= 0 for p in t["parts"]), f"rank {r}: a negative part")
        # the windows hold every part of the steps: theirs plus setup and end are the totals
        for p in ("compute_s", "comm_s", "wait_s", "eval_s", "ckpt_s"):
            w = sum(x["parts"][p][r] for x in wins)
            need(w <= t["parts"][p][r] + 1e-5, f"rank {r}: windows' {p} {w} > total")
        need(t["parts"]["eval_s"][r] > 0, f"rank {r}: evaluations took no time")
        need(t["parts"]["compute_s"][r] > 0, f"rank {r}: no compute")
    elapsed = float(sys.argv[3])
    need(max(t["wall_s"]) <= elapsed + 0.05, f"wall {max(t['wall_s'])} > the launcher's {elapsed}")
    covered = [s for x in wins for s in range(x["steps"][0], x["steps"][1] + 1)]
    need(covered == list(range(1, len(covered) + 1)) and len(covered) == int(sys.argv[4]),
         f"windows cover steps {covered[:3]}..{covered[-3:]}")
if mode == "clean":
    need(not strag, f"a straggler named in a clean run: {strag}")
if mode == "pipe":
    need(all(b > 0 for b in t["parts"]["bubble_s"]), f"no bubble charged: {t['parts']['bubble_s']}")
if mode == "slow":
    rank, ms, frm = (int(v) for v in sys.argv[5].split(":"))
    need(len(strag) == 1 and strag[0]["rank"] == rank,
         f"straggler lines {[(x['rank'], x['step']) for x in strag]}, want rank {rank} once")
    if strag:
        need(frm <= strag[0]["step"] <= frm + 7, f"named at step {strag[0]['step']}, slowed from {frm}")
    won = t["waited_on_s"]
    slowed = int(sys.argv[4]) - frm + 1
    need(max(range(n), key=lambda r: won[r]) == rank, f"waited_on_s {won}: rank {rank} is not the most")
    need(won[rank] >= 0.5 * ms / 1000 * slowed, f"the others waited {won[rank]:.3f} s for rank {rank}")
if mode == "killed":
    rank, kill, start = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    starts = [a for a in att if a["event"] == "start"]
    need([a["attempt"] for a in starts] == [1, 2], f"attempts {[a['attempt'] for a in starts]}")
    stopped = sorted(a["rank"] for a in att if a["event"] == "stopped" and a["attempt"] == 1)
    n = starts[0]["ranks"]
    need(stopped == [r for r in range(n) if r != rank],
         f"attempt 1: stopped ranks {stopped}; rank {rank} was killed")
    need(all(a["last_step"] == kill for a in att if a["event"] == "stopped"), "stopped after another step")
    need(not [a for a in att if a["event"] == "end" and a["attempt"] == 1], "attempt 1 has an end line")
    need(starts[1]["start_step"] == start, f"attempt 2 starts at {starts[1]['start_step']}")
    ends = [a for a in att if a["event"] == "end"]
    need(len(ends) == 1 and ends[0]["attempt"] == 2 and ends[0]["status"] == 0, f"ends {ends}")
    redone = [x for x in wins if x["attempt"] == 1 and x["steps"][1] > start]
    need(len(redone) == kill - start, f"{len(redone)} steps of attempt 1 after its checkpoint")
    met = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    need([m["attempt"] for m in met] == [1] * start + [2] * (len(met) - start),
         "metrics.jsonl: each step once, by the attempt that kept it")
print("; ".join(bad) if bad else "ok")
sys.exit(1 if bad else 0)
EOF

check() { # name check.py args...
    local name=$1
    shift
    if msg=$(python3 "$tmp/check.py" "$@" 2>&1); then
        echo "ok   $name"
    else
        echo "FAIL $name: $msg"
        fail=1
    fi
}

run() { # name np env... -- trainer args...: the elapsed seconds in $tmp/name.elapsed
    local name=$1 np=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local t0 t1
    t0=$(date +%s.%N)
    env "${envs[@]}" timeout 300 mpirun -np "$np" "$T" run "$@" --out "$tmp/$name" >"$tmp/$name.log" 2>&1
    local rc=$?
    t1=$(date +%s.%N)
    python3 -c "print($t1 - $t0)" >"$tmp/$name.elapsed"
    return $rc
}

# a clean run on 2 ranks: the parts add up, nobody is named
if run clean 2 X=1 -- "$R" --set steps=30 --set ckpt=10; then
    check "clean 2-rank run: parts sum to the wall time, windows cover the steps, no straggler" \
        "$tmp/clean" clean "$(cat "$tmp/clean.elapsed")" 30
    if grep -q "^straggler:" "$tmp/clean.log"; then echo "FAIL a straggler named in a clean run"; fail=1; fi
else
    echo "FAIL clean run exited $?"; tail -5 "$tmp/clean.log"; fail=1
fi

# rank 2 of 4 made 150 ms slower from step 8: named within a few steps, charged the waiting
if run slow 4 TR_FAULT_SLOW_RANK=2:150:8 -- "$R" --set steps=24; then
    check "a rank slowed from step 8 is named within a few steps, once, and charged the waiting" \
        "$tmp/slow" slow "$(cat "$tmp/slow.elapsed")" 24 2:150:8
    line=$(grep -a "^straggler:" "$tmp/slow.log" | head -1)
    case "$line" in
    "straggler: rank 2 on "*) echo "ok   its line: ${line:0:110}..." ;;
    *) echo "FAIL the log names no straggler rank 2: '$line'"; fail=1 ;;
    esac
else
    echo "FAIL slow run exited $?"; tail -5 "$tmp/slow.log"; fail=1
fi

# rank 1 of 4 killed after step 12 (checkpoints every 5), then --resume: two attempts
run killed 4 TR_FAULT_KILL_AFTER_STEP=12 TR_FAULT_KILL_RANK=1 -- "$R" --set steps=20 --set ckpt=5
if [ ! -s "$tmp/killed/attempts.jsonl" ]; then
    echo "FAIL the killed run left no attempts.jsonl"; tail -5 "$tmp/killed.log"; fail=1
elif run killed 4 X=1 -- "$R" --set steps=20 --set ckpt=5 --resume; then
    check "killed rank 1 and resumed: two attempts, rank 1 the one not stopped, 2 steps done again" \
        "$tmp/killed" killed 1 12 10
    # the report charges the downtime between the attempts to rank 1's host
    if "$T" report "$tmp/killed" --json --out "$tmp/killed.json" 2>"$tmp/report.err" &&
        msg=$(python3 - "$tmp/killed" "$tmp/killed.json" <<'EOF'
import json, sys
att = [json.loads(l) for l in open(sys.argv[1] + "/attempts.jsonl")]
host = [a for a in att if a["event"] == "start"][0]["hosts"][1]
down = json.load(open(sys.argv[2]))["downtime"]
ok = len(down) == 1 and down[0]["rank"] == 1 and down[0]["host"] == host and \
    down[0]["steps_redone"] == 2 and down[0]["downtime_s"] > 0
print(down)
sys.exit(0 if ok else 1)
EOF
        ); then
        echo "ok   the report charges the downtime to rank 1's host, 2 steps redone"
    else
        echo "FAIL the report's downtime: $msg $(cat "$tmp/report.err")"; fail=1
    fi
else
    echo "FAIL the resumed run exited $?"; tail -5 "$tmp/killed.log"; fail=1
fi

# a pipeline of 2 stages: the bubble is charged
if run pipe 2 X=1 -- tests/recipes_good/pp_gpt.lua --pp 2 --set steps=10; then
    check "pipeline of 2 stages: the bubble is charged, the parts add up" \
        "$tmp/pipe" pipe "$(cat "$tmp/pipe.elapsed")" 10
else
    echo "FAIL pipeline run exited $?"; tail -5 "$tmp/pipe.log"; fail=1
fi
exit $fail
