#!/usr/bin/env bash
# `trainer run --trace N` (parallel/trace.h) with real MPI processes: a pipeline of 2 stages x 4
# micro-batches with each schedule (zb-v's chunks in its V), and 2 data-parallel ranks, each traced for 2 steps after
# the first. The trace is Chrome's trace format, rank 0 writes it for every rank, and it is the
# run's: in each traced step each rank ran exactly its schedule's actions (every micro-batch's
# forward and backward, or input and weight parts, of each chunk it holds, each action once
# over the ranks), a rank's compute spans never overlap, and bench/pp_bubble.py, which runs the
# traced actions again in their order with a forward of one unit and a backward of two, gets
# the schedule's own bubble that the run printed (tr_pp_bubble): the order and dependencies
# the trace records are the schedule's. The data-parallel run's trace has each rank's forward
# and backward, gradient reduction, update and step; pp_bubble.py refuses it in one line.
# A bad --trace is one line and exit 2. No timing is checked. About 20 s.
set -u
. "$(dirname "$0")/lib.sh"
layout_setup "$1" tests/recipes_good/pp
fail=0

check_trace() { # name P V schedule
    python3 - "$tmp/$1" "$2" "$3" "$4" <<'PY'
import json, re, subprocess, sys
out, P, V, sched = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
M = 4
d = json.load(open(out + "/trace.json"))
ev = [e for e in d["traceEvents"] if e["ph"] == "X"]
steps = sorted({e["args"]["step"] for e in ev})
assert steps == [1, 2], "traced steps %s, not [1, 2]" % steps
assert d["otherData"]["ranks"] == P
split = sched in ("zb-h1", "zb-v")
rank_of = lambda c: c % P if sched != "zb-v" else (c if c < P else 2 * P - 1 - c)
for s in steps:
    seen = {}
    for r in range(P):
        mine = sorted((e for e in ev if e["tid"] == r and e["args"]["step"] == s),
                      key=lambda e: e["ts"])
        acts = [e for e in mine if e["cat"] == "compute" and e["name"] in ("F", "B", "Bi", "W")]
        want = {"F": M * V, "Bi": M * V, "W": M * V} if split else {"F": M * V, "B": M * V}
        got = {k: sum(e["name"] == k for e in acts) for k in want}
        assert got == want and len(acts) == sum(want.values()), \
            "rank %d step %d: actions %s, not %s" % (r, s, got, want)
        for a, b in zip(acts, acts[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, "rank %d: overlapping %s, %s" % (r, a, b)
        for e in acts:
            k = (e["name"], e["args"]["mb"], e["args"]["chunk"])
            assert k not in seen, "%s twice in step %d" % (k, s)
            seen[k] = r
        assert any(e["name"] == "step end" for e in mine), "rank %d: no step end" % r
        assert any(e["name"] == "update" for e in mine) and any(e["name"] == "step" for e in mine)
    chunks = {c for (_, _, c) in seen}
    assert chunks == set(range(P * V)), "chunks %s" % chunks
    for (n, mb, c), r in seen.items():
        assert r == rank_of(c), "chunk %d ran on rank %d" % (c, r)
a = json.loads(subprocess.check_output([sys.executable, "bench/pp_bubble.py", out + "/trace.json",
                                        "--json"]))
log = open(out + ".log").read()
theory = float(re.search(r"\(theory ([0-9.]+)%\)", log).group(1))
assert abs(100 * a["theory"] - theory) < 0.051, \
    "pp_bubble's theory %.2f%%, the run's %.1f%%" % (100 * a["theory"], theory)
print("%d spans; theory %.1f%% as the run printed; measured %.1f%%" % (len(ev), theory,
                                                                       100 * a["measured"]))
PY
}

for cfg in "gpipe 1" "1f1b 1" "interleaved 2" "zb-h1 1" "zb-v 2"; do
    read -r s v <<<"$cfg"
    name="pp2_$s"
    layout_run "$name" 2 gpt --steps 4 --pp 2 --microbatches 4 --schedule "$s" \
        --virtual-stages "$v" --trace 2 || continue
    grep -q "^trace: $tmp/$name/trace.json" "$tmp/$name.log" || bad "$name: no trace line"
    if e=$(check_trace "$name" 2 "$v" "$s" 2>&1); then ok "$name: $e"; else bad "$name: $e"; fi
done

layout_run dp2 2 gpt --steps 4 --dp 2 --trace 2 &&
    python3 - "$tmp/dp2/trace.json" <<'PY' && ok "dp 2: each rank's model, grads, update and step spans" || bad "dp 2's trace"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
for r in (0, 1):
    for s in (1, 2):
        names = [e["name"] for e in ev if e["tid"] == r and e["args"]["step"] == s]
        assert names.count("model") >= 1, (r, s, names)
        for n in ("grads", "update", "step"):
            assert names.count(n) == 1, (r, s, names)
PY
e=$(python3 bench/pp_bubble.py "$tmp/dp2/trace.json" 2>&1)
rc=$?
[ $rc -ne 0 ] && [ "$(echo "$e" | wc -l)" -eq 1 ] && ok "pp_bubble.py refuses a trace without a pipeline: $e" ||
    bad "pp_bubble.py on dp 2 (exit $rc): $e"

for arg in 0 x -1; do
    e=$("$T" run tests/recipes_good/pp_gpt.lua --trace "$arg" --out "$tmp/bad" 2>&1)
    rc=$?
    [ $rc -eq 2 ] && [ "$(echo "$e" | wc -l)" -eq 1 ] && ok "--trace $arg: $e" ||
        bad "--trace $arg (exit $rc): $e"
done
exit $fail
