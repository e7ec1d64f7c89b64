#!/usr/bin/env bash
# `trainer report`: (a) the committed fixture run folder (tests/report/run_2ranks: two ranks,
# two attempts, rank 1 failing) gives the figures this script computes itself from the records,
# the cost split among them (it sums to C, the downtime goes to the failed rank's host), with
# and without a cluster file, and --compare says what differs; with `trainer supervise`'s record
# in attempts.jsonl, the downtime and its cause are the ones it recorded; (b) a damaged
# metrics.jsonl still gives a report naming the skipped lines; (c) bad inputs get one line and
# exit 1, and numbers out of bounds (a million ranks, step 2^31) are refused or read whole
# without a page that grows with them; (d) runs of 10 (real, 2 ranks), 100 (real) and 1,000
# steps (tests/report/synth_run.py: 8 ranks, 2 attempts) are reported and their pages, rendered
# by headless Chromium, checked by tests/report/page_check.py: every section, the series and
# numbers of --json each in human units, and, measured in the laid-out page, no raw exponent or
# long number, no overlapping or clipped text in a figure, legends in words, predictions under
# measurements. The screenshots are left in the build folder (report_{10,100,1000}steps.png).
set -u
. "$(dirname "$0")/lib.sh"
T="$1"
ART="${2:-$(dirname "$T")}" # where the screenshot goes
FX=tests/report/run_2ranks
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- (a) the fixture's figures, computed here from the records --------------------------------
expect_fixture() { # JSON [cluster.yaml prices: "p0 p1"]
    python3 - "$FX" "$1" "${2:-1 1}" <<'PY'
import json, math, sys
fx, got, prices = sys.argv[1], json.load(open(sys.argv[2])), [float(p) for p in sys.argv[3].split()]
rows = lambda f: [json.loads(l) for l in open(f"{fx}/{f}")]
met, led, att = rows("metrics.jsonl"), rows("ledger.jsonl"), rows("attempts.jsonl")
bad = []
def eq(what, a, b, tol=1e-9):
    if not (a == b or (isinstance(a, float) or isinstance(b, float)) and abs(a - b) <= tol * max(1, abs(b))):
        bad.append(f"{what}: report {a}, expected {b}")
steps = {m["step"]: m for m in met}
eq("steps", got["summary"]["steps"], max(steps))
eq("attempts", got["summary"]["attempts"], len({a["attempt"] for a in att}))
t_all = [a["t"] for a in att] + [w["t"][1] for w in led if "t" in w and isinstance(w["t"], list)]
start = min(a["t"] for a in att if a["event"] == "start")
last = max(a["t"] for a in att)
eq("wall_s", got["summary"]["wall_s"], last - start)
eq("tokens", got["summary"]["tokens"], sum(math.floor(m["tokens_per_s"] * m["step_s"] + 0.5) for m in steps.values()))  # a count
eq("best_val_loss", got["summary"]["best_val_loss"], min(m["val_loss"] for m in met if "val_loss" in m))
# per rank: each attempt's total when it has one, else its windows
with_total = {w["attempt"] for w in led if w["kind"] == "total"}
use = [w for w in led if (w["kind"] == "total") or (w["kind"] == "window" and w["attempt"] not in with_total)]
n = 2
parts = [{} for _ in range(n)]
flops, won = [0.0] * n, [0.0] * n
for w in use:
    for r in range(n):
        for k, v in w["parts"].items():
            parts[r][k] = parts[r].get(k, 0) + v[r]
        flops[r] += w["flops"][r]
        won[r] += w["waited_on_s"][r]
for r in range(n):
    for k, v in parts[r].items():
        eq(f"rank {r} {k}", got["ranks"][r]["parts"][k], v)
    eq(f"rank {r} flops", got["ranks"][r]["flops"], flops[r])
    eq(f"rank {r} waited_on_s", got["ranks"][r]["waited_on_s"], won[r])
# attempt 1 died: downtime = start of 2 - last time seen for 1 (any record), to rank 1's host
a1 = [a for a in att if a["attempt"] == 1]
seen1 = [a["t"] for a in a1] + [m["time"] for m in met if m.get("attempt") == 1] + \
        [w["t"][1] if isinstance(w["t"], list) else w["t"] for w in led if w["attempt"] == 1]
start2 = [a for a in att if a["attempt"] == 2 and a["event"] == "start"][0]
down = start2["t"] - max(seen1)
failed = [a for a in a1 if a["event"] == "failed"][0]
redone = failed["last_step"] - start2["start_step"]
d = got["downtime"][0]
eq("downtime_s", d["downtime_s"], down)
eq("steps redone", d["steps_redone"], redone)
eq("downtime charged to rank", d["rank"], failed["failed_rank"])
eq("downtime charged to host", d["host"], failed["failed_host"])
# the cost rule
P = sum(prices)
C = P * (last - start) / 3600
dcost = P * down / 3600
wcost = [won[r] / 3600 * (P - prices[r]) / (n - 1) for r in range(n)]
rest = C - dcost - sum(wcost)
cost = [wcost[r] + rest * flops[r] / sum(flops) + (dcost if r == failed["failed_rank"] else 0) for r in range(n)]
eq("C", got["cost"]["total"], C)
for r in range(n):
    eq(f"rank {r} cost", got["ranks"][r]["cost"], cost[r])
eq("costs sum to C", sum(r["cost"] for r in got["ranks"]), C)
eq("hosts sum to C", sum(h["cost"] for h in got["cost"]["hosts"]), C)
h1 = [h for h in got["cost"]["hosts"] if h["name"] == failed["failed_host"]][0]
eq("downtime on the failed host", h1["downtime_s"], down)
print("\n".join(bad) if bad else f"steps {max(steps)}, wall {last - start:.0f} s, downtime {down:.0f} s to {failed['failed_host']}, {redone} steps redone, C {C:.6g} = " + " + ".join(f"{c:.6g}" for c in cost))
sys.exit(1 if bad else 0)
PY
}

if "$T" report "$FX" --json --out "$tmp/fx.json" 2>"$tmp/fx.err" && e=$(expect_fixture "$tmp/fx.json"); then
    ok "fixture: $e"
else
    bad "fixture: $(cat "$tmp/fx.err") $e"
fi
cat >"$tmp/pool.yaml" <<'EOF'
groups:
  - name: fast
    device: H100-80GB
    nodes: 1
    per_node: 1
    provider: cloud-a
    price_per_hour: 3.0
  - name: slow
    device: A100-80GB
    nodes: 1
    per_node: 1
    provider: cloud-b
    price_per_hour: 1.5
EOF
if "$T" report "$FX" --json --cluster "$tmp/pool.yaml" --out "$tmp/fxc.json" 2>"$tmp/fxc.err" &&
    e=$(expect_fixture "$tmp/fxc.json" "3.0 1.5") &&
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['cost']['unit']=='USD' and [p['name'] for p in d['cost']['providers']]==['cloud-a','cloud-b'], d['cost']" "$tmp/fxc.json"; then
    ok "fixture with a cluster file (prices 3.0 and 1.5, two providers): $e"
else
    bad "fixture with a cluster file: $(cat "$tmp/fxc.err") $e"
fi
# --compare: with itself, bitwise comparable; with another layout, not, naming the field
cp -r "$FX" "$tmp/other"
sed -i 's/"dp": 2, "tp": 1, "pp": 1, "zero": 1, "micro_batch"/"dp": 1, "tp": 2, "pp": 1, "zero": 1, "micro_batch"/' "$tmp/other/provenance.json"
"$T" report "$FX" --json --compare "$FX" --out "$tmp/same.json" &&
    "$T" report "$FX" --json --compare "$tmp/other" --out "$tmp/diff.json"
if python3 - "$tmp/same.json" "$tmp/diff.json" <<'PY'; then
import json, sys
same, diff = (json.load(open(p))["compare"] for p in sys.argv[1:])
assert same["comparable"] and same["n_differences"] == 0, same
keys = sorted(d["key"] for d in diff["differences"])
assert not diff["comparable"] and keys == ["layout.dp", "layout.tp"], diff
PY
    ok "--compare: the same provenance is bitwise comparable; another layout is not (layout.dp, layout.tp)"
else
    bad "--compare did not find exactly layout.dp and layout.tp"
fi

# with `trainer supervise`'s lines (as supervise_records.c writes them): the downtime it measured
# (2.31 s, where the records alone give 1.5 s) and its cause, not the supervisor's own times
cp -r "$FX" "$tmp/sv"
python3 - "$tmp/sv/attempts.jsonl" <<'PY'
import json, sys
p = sys.argv[1]
rows = [json.loads(l) for l in open(p)]
sv = {"event": "supervisor", "attempt": 1, "t": 1700000098.5, "down_s": 2.31, "steps_redone": 4, "last_step": 14,
      "resume_step": 10, "cause": {"rank": 1, "host": "h1", "exit": "exit status 137"}, "action": "relaunch"}
done = {"event": "supervisor", "attempt": 2, "t": 1700000130.0, "action": "done", "wall_s": 130.0, "train_s": 20.0,
        "goodput": 0.15, "relaunches": 1, "steps_redone": 4, "down_s": 2.31}
open(p, "w").write("".join(json.dumps(r) + "\n" for r in rows[:2] + [sv] + rows[2:] + [done]))
PY
if "$T" report "$tmp/sv" --json --out "$tmp/sv.json" 2>"$tmp/sv.err" && "$T" report "$tmp/sv" >/dev/null 2>&1 &&
    e=$(python3 - "$tmp/sv.json" "$tmp/sv/report.html" <<'PY'
import json, re, sys
j, page = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
d, bad = j["downtime"][0], []
if d["downtime_s"] != 2.31: bad.append(f"downtime_s {d['downtime_s']}, supervise recorded 2.31")
if not d["cause"].startswith("exit status 137"): bad.append(f"cause '{d['cause']}', supervise recorded 'exit status 137'")
if (d["rank"], d["host"], d["steps_redone"], d["from"]) != (1, "h1", 4, "supervise"): bad.append(f"downtime {d}")
if j["summary"]["wall_s"] != 115: bad.append(f"wall_s {j['summary']['wall_s']}: the supervisor's lines are not the run's")
if not re.search(r'data-key="downtime.0.downtime_s" data-value="2.3100*1?"[^>]*>2.31 s<', page): bad.append("the page's downtime is not '2.31 s'")
if not re.search(r'data-key="downtime.0.cause">exit status 137', page): bad.append("the page does not give the cause")
print("; ".join(bad) if bad else f"downtime {d['downtime_s']} s, cause '{d['cause']}', from {d['from']}")
sys.exit(1 if bad else 0)
PY
    ); then
    ok "supervise's record: $e"
else
    bad "supervise's record of the downtime: $e $(cat "$tmp/sv.err")"
fi

# ---- (b) a damaged metrics.jsonl: a garbage middle line and a truncated last line -------------
cp -r "$FX" "$tmp/damaged"
python3 - "$tmp/damaged/metrics.jsonl" <<'PY'
import sys
p = sys.argv[1]
lines = open(p).read().split("\n")[:-1]
lines[6] = "{\"step\": 7, \"loss\": garbage"
open(p, "w").write("\n".join(lines)[:-25])
PY
if "$T" report "$tmp/damaged" --out "$tmp/damaged.html" >"$tmp/damaged.log" 2>&1 &&
    grep -q "^metrics.jsonl: skipped 2 damaged line(s): 7, 20$" "$tmp/damaged.log" &&
    grep -q "metrics.jsonl: skipped 2 damaged line(s): 7, 20" "$tmp/damaged.html"; then
    ok "damaged metrics.jsonl: a report, and both the command and the page say 'metrics.jsonl: skipped 2 damaged line(s): 7, 20'"
else
    bad "damaged metrics.jsonl: $(cat "$tmp/damaged.log")"
fi

# ---- (c) bad inputs: one line, exit 1 ----------------------------------------------------------
mkdir -p "$tmp/empty"
check_bad() { # what expected-text args...
    local what=$1 want=$2
    shift 2
    "$T" report "$@" >"$tmp/bad.out" 2>"$tmp/bad.err"
    local rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/bad.err")" -eq 1 ] && grep -q -- "$want" "$tmp/bad.err"; then
        ok "$what: $(cat "$tmp/bad.err")"
    else
        bad "$what: exit $rc, said: $(cat "$tmp/bad.err")"
    fi
}
check_bad "a missing folder" "'$tmp/nowhere' is not a run folder" "$tmp/nowhere"
check_bad "a folder without metrics.jsonl" "has no metrics.jsonl" "$tmp/empty"
check_bad "an unreadable cluster file" "nowhere.yaml" "$FX" --cluster "$tmp/nowhere.yaml"
printf 'groups:\n  - name: one\n    device: H100-80GB\n    nodes: 1\n    per_node: 1\n' >"$tmp/one.yaml"
check_bad "a cluster smaller than the run" "has 1 device(s), the run has 2 ranks" "$FX" --cluster "$tmp/one.yaml"
check_bad "--compare without provenance" "no provenance.json" "$FX" --compare "$tmp/empty"

# numbers out of bounds: a million ranks in a start line is refused in one line naming the file,
# line and field (not a page of a million rows: its size is capped here); a step past 2^31 is
# read whole (64-bit), a step past 2^53 refused like the ranks
cp -r "$FX" "$tmp/big"
sed -i '1s/"ranks": 2/"ranks": 1000000/' "$tmp/big/attempts.jsonl"
tail -1 "$tmp/big/metrics.jsonl" | sed 's/"step": 20,/"step": 2147483648,/' >>"$tmp/big/metrics.jsonl"
tail -1 "$tmp/big/metrics.jsonl" | sed 's/"step": 2147483648,/"step": 1e300,/' >>"$tmp/big/metrics.jsonl"
(
    ulimit -f 20480 # 20 MiB a file (a page grown by the numbers would be far past it)
    timeout 60 "$T" report "$tmp/big" --out "$tmp/big.html" >"$tmp/big.out" 2>"$tmp/big.err" &&
        timeout 60 "$T" report "$tmp/big" --json --out "$tmp/big.json" 2>/dev/null
)
rc=$?
if [ $rc -eq 0 ] && e=$(python3 - "$tmp/big.json" "$tmp/big.html" "$tmp/big.err" <<'PY'
import json, os, sys
j, page, err = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), open(sys.argv[3]).read().splitlines()
bad = []
want = ['trainer report: attempts.jsonl:1: "ranks" is 1000000, not a whole number in 0..4096 (the line is left out)',
        'trainer report: metrics.jsonl:22: "step" is 1.0000000000000001e+300, not a whole number in 1..9007199254740992 (the line is left out)']
for w in want:
    if err.count(w) != 1: bad.append(f"not said once: {w}")
if j["summary"]["steps"] != 2147483648: bad.append(f"steps {j['summary']['steps']}, not 2147483648")
if 'data-key="summary.steps" data-value="2147483648">2147483648<' not in page: bad.append("the page's steps are not 2147483648")
if j["summary"]["ranks"] != 2: bad.append(f"ranks {j['summary']['ranks']}")
size = os.path.getsize(sys.argv[2])
if size > 200000: bad.append(f"a page of {size} bytes")
print("; ".join(bad) if bad else f"{err[0]}; {err[1]}; steps 2147483648; a page of {size} bytes")
sys.exit(1 if bad else 0)
PY
); then
    ok "numbers out of bounds: $e"
else
    bad "numbers out of bounds: exit $rc ($( [ $rc -gt 128 ] && echo "killed by signal $((rc - 128))")) $e $(head -c 300 "$tmp/big.err")"
fi

# ---- (d) pages of 10, 100 and 1,000 steps, rendered in headless Chromium ---------------------
if ! command -v chromium >/dev/null; then
    echo "installing chromium (apt-get) to render the page"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >"$tmp/apt.log" 2>&1 ||
        { echo "SKIP chromium is not installed and apt-get could not install it: $(tail -1 "$tmp/apt.log")"; exit 77; }
fi
PC=tests/report/page_check.py
render() { # HTML DOM PNG: the DOM of a copy that measures itself once laid out, and a screenshot
    python3 "$PC" inject "$1" "$1.measure.html" &&
        timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,5200 \
            --dump-dom "file://$(realpath "$1.measure.html")" >"$2" 2>"$tmp/chromium.err" &&
        timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,5200 \
            --screenshot="$3" "file://$(realpath "$1")" >/dev/null 2>>"$tmp/chromium.err"
}
check_page() { # what RUN_DIR SCREENSHOT
    local what=$1 dir=$2 shot=$3 e
    if "$T" report "$dir" --json --out "$dir.json" && "$T" report "$dir" >/dev/null &&
        render "$dir/report.html" "$dir.dom" "$shot" && e=$(python3 "$PC" check "$dir.dom" "$dir.json" --layout); then
        ok "$what in Chromium: $e${shot:+ (screenshot: $shot)}"
    else
        bad "$what in Chromium: $e $(tail -2 "$tmp/chromium.err")"
    fi
}
cp -r "$FX" "$tmp/fixture"
check_page "the fixture's page" "$tmp/fixture" "$tmp/fixture.png"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
if ! command -v mpirun >/dev/null; then
    bad "no mpirun for the 2-rank run (apt-get install openmpi-bin)"
elif timeout 120 mpirun -np 2 "$T" run tests/recipes_good/dp_tiny.lua --steps 10 --out "$tmp/r10" \
    --peak-gflops 10 >"$tmp/r10.log" 2>&1; then
    check_page "10 steps, a real 2-rank run" "$tmp/r10" "$ART/report_10steps.png"
else
    bad "the 2-rank run failed: $(tail -3 "$tmp/r10.log")"
fi
if timeout 120 "$T" run tests/recipes_good/dp_tiny.lua --steps 100 --out "$tmp/r100" >"$tmp/r100.log" 2>&1; then
    check_page "100 steps, a real run" "$tmp/r100" "$ART/report_100steps.png"
else
    bad "the 100-step run failed: $(tail -3 "$tmp/r100.log")"
fi
python3 tests/report/synth_run.py "$tmp/r1000" 1000
check_page "1,000 steps, 8 ranks, 2 attempts (synth_run.py)" "$tmp/r1000" "$ART/report_1000steps.png"
exit $fail
