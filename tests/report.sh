#!/usr/bin/env bash
# `trainer report`: (a) the committed fixture run folder (tests/report/run_2ranks: two ranks,
# two attempts, rank 1 failing) gives the figures this script computes itself from the records,
# the cost split among them (it sums to C, the downtime goes to the failed rank's host), with
# and without a cluster file, and --compare says what differs; (b) a damaged metrics.jsonl still
# gives a report naming the skipped lines; (c) bad inputs get one line and exit 1; (d) a real
# 2-rank run is reported and the page, rendered by headless Chromium, has every section, data
# points in every plot and the numbers of --json. The screenshot is left in the build folder.
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
eq("tokens", got["summary"]["tokens"], sum(m["tokens_per_s"] * m["step_s"] for m in steps.values()))
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

# ---- (d) a real 2-rank run, rendered in headless Chromium ---------------------------------------
page_check() { # DOM JSON: sections, data points, and every number shown equal to --json's
    python3 - "$1" "$2" <<'PY'
import json, sys
from html.parser import HTMLParser
dom, js = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
class P(HTMLParser):
    def __init__(s):
        super().__init__(); s.sections, s.series, s.cells, s.nodata, s.cur = [], {}, [], 0, None
    def handle_starttag(s, tag, a):
        a = dict(a)
        if tag == "section": s.sections.append(a.get("id"))
        if "data-series" in a: s.series[a["data-series"]] = (a["data-x"].split(), a["data-y"].split())
        if tag == "td" and "data-key" in a: s.cur = [a["data-key"], a.get("data-value"), ""]
        if tag == "p" and a.get("class") == "nodata": s.nodata += 1
    def handle_data(s, d):
        if s.cur: s.cur[2] += d
    def handle_endtag(s, tag):
        if tag == "td" and s.cur: s.cells.append(s.cur); s.cur = None
p = P(); p.feed(dom)
bad = []
want = ["summary", "loss", "throughput", "breakdown", "heatmap", "memory", "timeline", "plan", "provenance", "contribution"]
if [x for x in want if x not in p.sections]: bad.append(f"sections missing: {set(want) - set(p.sections)}")
def get(path):
    v = js
    for k in path.split("."):
        v = v[int(k)] if isinstance(v, list) else v[k]
    return v
# every plotted series equals --json's series (finite points only)
S = js["series"]
for name, (xk, yk) in {"loss": ("step", "loss"), "val_loss": ("step", "val_loss"), "loss_time": ("time_s", "loss"),
                       "tokens_per_s": ("time_s", "tokens_per_s"), "mfu": ("time_s", "mfu"),
                       "step_s": ("step", "step_s"), "predicted_step_s": ("step", "predicted_step_s"),
                       "memory_bytes": ("step", "memory_bytes")}.items():
    pts = [(x, y) for x, y in zip(S[xk], S[yk]) if x is not None and y is not None]
    if name not in p.series:
        if pts: bad.append(f"series {name} not plotted")
        continue
    got = list(zip(map(float, p.series[name][0]), map(float, p.series[name][1])))
    if not got: bad.append(f"series {name} has no points")
    if got != pts: bad.append(f"series {name}: page {got[:3]}... json {pts[:3]}...")
n = 0
for key, val, text in p.cells:
    try: j = get(key)
    except (KeyError, IndexError, TypeError): bad.append(f"cell {key}: not in --json"); continue
    n += 1
    if val is None:  # a text cell
        if str(j) != text.strip() and not (j == "" and text.strip() == "-"): bad.append(f"{key}: page '{text}' json '{j}'")
    elif val == "null":
        if j is not None: bad.append(f"{key}: page null, json {j}")
    elif isinstance(j, (int, float)) and not isinstance(j, bool):
        if float(val) != float(j) or (text.strip() != "%.6g" % j and text.strip() != str(j)): bad.append(f"{key}: page {val} '{text}', json {j}")
print("\n".join(bad) if bad else f"{len(p.sections)} sections, {len(p.series)} series with points, {n} numbers equal to --json's")
sys.exit(1 if bad else 0)
PY
}

if ! command -v chromium >/dev/null; then
    echo "installing chromium (apt-get) to render the page"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >"$tmp/apt.log" 2>&1 ||
        { echo "SKIP chromium is not installed and apt-get could not install it: $(tail -1 "$tmp/apt.log")"; exit 77; }
fi
render() { # HTML DOM PNG
    timeout 60 chromium --headless --no-sandbox --disable-gpu --dump-dom "file://$(realpath "$1")" >"$2" 2>"$tmp/chromium.err" &&
        timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,5200 \
            --screenshot="$3" "file://$(realpath "$1")" >/dev/null 2>>"$tmp/chromium.err"
}
"$T" report "$FX" --out "$tmp/fx.html" >/dev/null
if render "$tmp/fx.html" "$tmp/fx.dom" "$tmp/fx.png" && e=$(page_check "$tmp/fx.dom" "$tmp/fx.json"); then
    ok "fixture page in Chromium: $e"
else
    bad "fixture page in Chromium: $e $(tail -2 "$tmp/chromium.err")"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
if ! command -v mpirun >/dev/null; then
    bad "no mpirun for the 2-rank run (apt-get install openmpi-bin)"
elif timeout 120 mpirun -np 2 "$T" run tests/recipes_good/dp_tiny.lua --steps 12 --out "$tmp/real" \
    --peak-gflops 10 >"$tmp/real.log" 2>&1; then
    shot="$ART/report_2ranks.png"
    if "$T" report "$tmp/real" --json --out "$tmp/real.json" && "$T" report "$tmp/real" >/dev/null &&
        render "$tmp/real/report.html" "$tmp/real.dom" "$shot" && e=$(page_check "$tmp/real.dom" "$tmp/real.json"); then
        ok "a real 2-rank run's page in Chromium: $e (screenshot: $shot)"
    else
        bad "a real 2-rank run's page: $e $(tail -2 "$tmp/chromium.err")"
    fi
else
    bad "the 2-rank run failed: $(tail -3 "$tmp/real.log")"
fi
exit $fail
