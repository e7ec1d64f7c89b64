#!/usr/bin/env bash
# The planner against real runs: every layout of a few recipes, run here, its predicted step
# time and memory beside the measured ones, the rank correlation, and where the planner's own
# choice falls among the layouts measured.
#
# Configurations (the third argument, comma-separated; default host:2,host:4,box:1gbit,
# box:100mbit):
#   host:N     N ranks on this machine (shared memory);
#   box:RATE   a cluster in a box of 2 hosts x 2 ranks (tests/cluster/cluster.sh: network
#              namespaces, shared memory inside a host, TCP between them) whose links tc
#              shapes to RATE; needs root (skipped, said, without it).
# Recipes: bench/pp_gpt.lua (narrow and deep: 8 blocks of width 256), bench/tp_gpt.lua
# (wide: 2 blocks of width 768) and pp_gpt_capped, pp_gpt under --memory-mib (95 MiB a process
# on 2 ranks, 75 on 4: it must split to fit, dp alone at ZeRO-0 does not at any micro-batch)
# on one host; on the box bench/cluster.sh's model (tp_gpt.lua
# with 4 blocks of width 256 and 4096 tokens a step: megabytes of gradients and activations a
# step) and bench/pp_gpt.lua.
# Layouts: every mesh dp x tp x pp of the world with ZeRO 0-3 where dp > 1, the rest (micro-
# batch, schedule, recompute, sequence parallelism) left to the planner as a user would; then
# each mesh's variants, the planner's other decisions (its ZeRO left to it): micro-batches of
# 1, 2 and 4 sequences, recompute selective and full, and with a pipeline every schedule and
# 1f1b at as many micro-batches as stages (PVR_VARIANTS=0: the meshes alone); then parallel
# "auto", the planner's own choice. A layout the resolver refuses is said, not run.
# Each layout runs `reps` times, the repetitions in separate passes over all layouts (so that
# a change in the machine's load falls on all of them); a run's figure is the median step
# after two of warm-up, a layout's the fastest of its runs, and its spread (slowest / fastest
# run) is the noise of that layout; the table's noise is the median spread. A run that takes
# longer than `limit` seconds is stopped and counts as that slow.
# Predicted: each run's own prediction (its planner's, as `plan vs run` shows a user; the
# median of a layout's runs: each run measures the machine again at its start, and its
# prediction moves with that); beside it one `trainer plan --json --alternatives 64` on the
# same ranks, which prices every layout it keeps with the same measured figures: the layout
# the run resolved (its micro-batch, schedule, recompute) where it is among the plan's
# alternatives (one variant per mesh, ZeRO stage and schedule), else "-".
# Printed for each configuration and recipe: layout | M x mb (the micro-batches a step and
# their size, as the fastest run resolved them) | predicted | one plan | measured | spread |
# measured / predicted | memory predicted and measured (the fullest rank); then Spearman's rank
# correlation of predicted and measured step times over every layout, and over the meshes'
# ZeRO stages alone; beside each the runs' own (each pass's measured times against the next
# pass's: the most a prediction can reach at this noise); the one plan's over the layouts it
# priced; of the pairs of layouts measured further apart than either's spread, how many the
# prediction orders the same way; then the planner's choice: its layout, its
# measured step against the fastest layout's, its place among them, and whether it is within
# 10% of the fastest or within the noise. Figures, not pass/fail; ratios within one run of
# this script (the machine is shared). Then the tie's band against these runs: for bands of
# 0, 2, 5 (the planner's) and 10%, the simplest layout (the planner's order) whose runs'
# prediction is within the band of the best one, and its measured step against the fastest.
# The choice against the fastest, again (PVR_DUEL=N, default 4; 0: none): then the
# layouts measured within 15% of the fastest (at most 4) and the choice run N more passes,
# interleaved, and each one's median over all its runs, with its slowest and fastest run: the
# choice is within 10% of the fastest by the medians, or within the noise where its runs and
# the fastest one's overlap (say how far apart their medians are either way). One table's
# fastest of two runs can take one layout's lucky run: this is the verdict to quote.
# Stability (PVR_PLANS=N): then N `trainer plan`s of each recipe on the same ranks, one after
# another, and the layouts they chose, each with how often and its measured step against the
# fastest layout's where it was run; with PVR_REF=an earlier trainer binary, its N plans too,
# interleaved with this one's, beside them; and N more of this trainer with the plan memory
# (trainer/plan_memory.c) in a folder of their own, empty at the first: the layouts kept.
# Every other plan and run of the bench plans from scratch (TR_PLAN_MEMORY=off), as the
# planner's choice is what it measures. reps 0 runs no layout: the plans' choices alone.
#
# Usage: [PVR_RECIPES=pp_gpt,...] [PVR_VARIANTS=0] [PVR_DUEL=N] [PVR_PLANS=N [PVR_REF=binary]]
#        bench/plan_vs_run.sh [steps] [reps] [configs] [limit]
#   (defaults 5 2 host:2,host:4,box:1gbit,box:100mbit 90; needs build/trainer with MPI,
#    mpirun; the box needs root and iproute2. About 25 minutes for host:2,host:4, 15 for
#    the box's pp_gpt alone with PVR_VARIANTS=0.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps="${1:-5}"
reps="${2:-2}"
configs="${3:-host:2,host:4,box:1gbit,box:100mbit}"
limit="${4:-90}"
T=$(realpath "${TRAINER:-build/trainer}")
[[ $steps =~ ^[0-9]+$ ]] && [ "$steps" -ge 3 ] || { echo "bench: steps '$steps': 3 or more (2 are warm-up)"; exit 2; }
[[ $reps =~ ^[0-9]+$ ]] || { echo "bench: reps '$reps': 0 (the plans' choices alone) or more"; exit 2; }
plans="${PVR_PLANS:-0}"
duel="${PVR_DUEL:-4}"
[[ $duel =~ ^[0-9]+$ ]] || { echo "bench: PVR_DUEL '$duel': a count of passes (0: none)"; exit 2; }
[[ $plans =~ ^[0-9]+$ ]] || { echo "bench: PVR_PLANS '$plans': a count of plans"; exit 2; }
[ "$reps" -ge 1 ] || [ "$plans" -ge 1 ] || { echo "bench: reps 0 needs PVR_PLANS=N"; exit 2; }
REF=""
if [ -n "${PVR_REF:-}" ]; then
    REF=$(realpath "$PVR_REF") && [ -x "$REF" ] || { echo "bench: PVR_REF '$PVR_REF' is not a trainer"; exit 1; }
fi
[[ $limit =~ ^[0-9]+$ ]] && [ "$limit" -ge 10 ] || { echo "bench: limit '$limit': 10 seconds or more"; exit 2; }
[ -x "$T" ] || { echo "bench: no trainer at $T (build it, or set TRAINER)"; exit 1; }
command -v mpirun >/dev/null || { echo "bench: needs mpirun (apt-get install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export TR_PLAN_MEMORY=off # each plan from scratch: the planner is what is measured
tmp=$(mktemp -d)
CL=$PWD/tests/cluster/cluster.sh
boxes=()
cleanup() {
    for b in "${boxes[@]}"; do "$CL" down "$b" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

for conf in ${configs//,/ }; do
    case $conf in
    host:[0-9]*) prefix=() ;;
    box:*)
        rate=${conf#box:}
        if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
            echo "== $conf: skipped (a cluster in a box needs root and iproute2)"
            continue
        fi
        name=bpv$$${#boxes[@]}
        boxes+=("$name")
        "$CL" up "$name" --hosts 2 --slots 2 --rate "$rate" >"$tmp/up.log" 2>&1 ||
            { echo "== $conf: cluster.sh up failed: $(tail -2 "$tmp/up.log")"; continue; }
        prefix=("$CL" run "$name" --) ;;
    *) echo "bench: configuration '$conf': host:N or box:RATE"; exit 2 ;;
    esac
    python3 - "$T" "$steps" "$reps" "$tmp" "$conf" "$limit" "$plans" "$REF" "${prefix[@]}" <<'PY'
import json, os, re, statistics, subprocess, sys, tempfile

T, steps, reps, tmp, conf, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    sys.argv[4], sys.argv[5], int(sys.argv[6])
plans, ref = int(sys.argv[7]), sys.argv[8]
prefix = sys.argv[9:]
box = conf.startswith("box:")
world = 4 if box else int(conf.split(":")[1])
cores = os.cpu_count() or 1
# (name, the recipe and its knobs): the box's first is bench/cluster.sh's model
CLUSTER_GPT = ("cluster_gpt", ["bench/tp_gpt.lua", "--set", "width=256", "--set", "heads=4",
                               "--set", "layers=4", "--set", "batch_tokens=4096"])
PP_GPT, TP_GPT = ("pp_gpt", ["bench/pp_gpt.lua"]), ("tp_gpt", ["bench/tp_gpt.lua"])
# one that must split to fit: pp_gpt given less memory per process than dp alone at ZeRO-0
# holds before any activation (weights, gradients and AdamW state: 97.7 MiB), so that no
# micro-batch makes it fit
CAP_MIB = {2: 95, 4: 75}
CAPPED = ("pp_gpt_capped", ["bench/pp_gpt.lua", "--memory-mib", str(CAP_MIB.get(world, 0))])
recipes = [CLUSTER_GPT, PP_GPT] if box else [PP_GPT, TP_GPT] + ([CAPPED] if world in CAP_MIB
                                                              else [])
if os.environ.get("PVR_RECIPES"):  # only these (names, comma-separated)
    recipes = [x for x in recipes if x[0] in os.environ["PVR_RECIPES"].split(",")]
VARIANTS = os.environ.get("PVR_VARIANTS", "1") != "0"
DUEL = int(os.environ.get("PVR_DUEL", "4"))
DUEL_BAND, DUEL_MAX = 0.15, 4  # the layouts run again: within 15% of the fastest, at most 4


def layouts():  # (label, flags, key): every mesh with ZeRO 0-3 where dp > 1, then each
    # mesh's variants (micro-batch, recompute, schedule: what the planner also chooses, its
    # ZeRO left to it), then the planner's own choice; key: the mesh and ZeRO, or None
    meshes = [(world // (tp * pp), tp, pp) for tp in (1, 2, 4) for pp in (1, 2, 4)
              if world % (tp * pp) == 0]
    for dp, tp, pp in meshes:
        for zero in ((0, 1, 2, 3) if dp > 1 else (0,)):
            yield ("dp %d x tp %d x pp %d, ZeRO-%d" % (dp, tp, pp, zero),
                   ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero", str(zero)],
                   (dp, tp, pp, zero))
    if VARIANTS:
        for dp, tp, pp in meshes:
            mesh = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp)]
            name = "dp %d x tp %d x pp %d, " % (dp, tp, pp)
            if pp == 1:
                for b in (1, 2, 4):
                    yield name + "micro-batch %d" % b, mesh + ["--micro-batch", str(b)], "v"
            else:
                for sch in ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"):
                    yield name + sch, mesh + ["--schedule", sch], "v"
                yield name + "1f1b, M %d" % pp, mesh + ["--schedule", "1f1b", "--microbatches",
                                                        str(pp)], "v"
            for rc in ("selective", "full"):
                yield name + "recompute " + rc, mesh + ["--set", "train.recompute=" + rc], "v"
    yield "auto", [], None


def recompute(text):
    """The recipe's recompute, or the most of its levels per pipeline rank (as the plan's
    JSON names a layout's)."""
    m = re.search(r'\brecompute = (?:"([a-z]+)"|\{([^}]*)\})', text)
    if m.group(1):
        return m.group(1)
    levels = re.findall(r'"([a-z]+)"', m.group(2))
    return max(levels, key=("none", "selective", "full").index)


def resolved(out):
    """The layout a run resolved, as its OUT/recipe.lua says, keyed like planned()'s."""
    text = open(out + "/recipe.lua").read()
    num = lambda k: int(re.search(r"\b%s = (\d+)" % k, text).group(1))
    word = lambda k: re.search(r'\b%s = "([a-z0-9-]+)"' % k, text).group(1)
    pipe = num("pp") > 1  # else no schedule: "auto" in the recipe
    return (num("dp"), num("tp"), num("pp"), num("zero"), word("schedule") if pipe else None,
            num("virtual_stages") if pipe else None, num("micro_batch"), recompute(text),
            re.search(r"\bsequence_parallel = (true|false)", text).group(1) == "true")


def run(recipe, flags, name):
    """(predicted s, measured s, predicted bytes, measured bytes, plan line, layout) or a
    string: why there is none."""
    out = os.path.join(tmp, name)
    cmd = prefix + ["env", "OMP_NUM_THREADS=%d" % max(1, cores // world), "timeout", str(limit),
                    "mpirun", "-np", str(world), T, "run"] + recipe + ["--set", "steps=%d" % steps,
                    "--out", out, "--overwrite", "--timeout", str(limit)] + flags
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode == 124:
        return "stopped after %d s" % limit
    if r.returncode:
        # ours: the first line that is not mpirun's banner (its lines of dashes and text)
        lines = [l for l in r.stdout.splitlines() if l.strip() and not l.startswith("---")]
        why = [l for l in lines if l.startswith(("trainer", "rank ")) or ".lua:" in l] or lines
        return "refused: " + (why[0][:110] if why else "exit %d" % r.returncode)
    rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
    rows = [x for x in rows if "step" in x][2:]
    plan = [l[6:] for l in r.stdout.splitlines() if l.startswith("plan: dp")]
    if not rows:
        return "no steps after the warm-up"
    med = lambda k: statistics.median(x[k] for x in rows)
    return (med("predicted_step_s"), med("step_s"), rows[-1]["predicted_memory_bytes"],
            rows[-1]["memory_bytes"], plan[0].split(" (chosen")[0] if plan else "",
            resolved(out))


def plan_json(recipe, binary=T, n=64, memory="off"):
    """One `trainer plan --json` of recipe on the same ranks (the plan memory in folder
    `memory`, or off), or None."""
    cmd = prefix + ["env", "OMP_NUM_THREADS=%d" % max(1, cores // world),
                    "TR_PLAN_MEMORY=" + memory, "mpirun", "-np", str(world), binary,
                    "plan"] + recipe + ["--json", "--alternatives", str(n)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return None


def key_of(p):
    """A plan's layout in the JSON, keyed like resolved()'s."""
    pipe = p["pp"] > 1
    return (p["dp"], p["tp"], p["pp"], p["zero"], p["schedule"] if pipe else None,
            p["virtual_stages"] if pipe else None, p["micro_batch"], p["recompute"],
            p["sequence_parallel"])


def named(k):
    dp, tp, pp, zero, sch, v, mb, rc, sp = k
    return "dp %d x tp %d x pp %d%s, micro-batch %d, ZeRO-%d, recompute %s%s" % (
        dp, tp, pp, ", %s" % sch + (" x %d" % v if v and v > 1 else "") if sch else "", mb,
        zero, rc, ", sp" if sp else "")


def planned(recipe):
    """layout key (resolved()) -> (predicted s, predicted bytes): one `trainer plan --json`
    on the same ranks, so that every layout is priced with the same measured figures (each
    run measures the machine again at its start, and its own prediction moves with that)."""
    d = plan_json(recipe)
    if not d:
        return {}, {}
    got = {}
    for p in [d["plan"]] + d["alternatives"]:
        q = p["predicted"]
        if q["memory_bytes"] <= q["memory_capacity"]:
            got[key_of(p)] = (q["step_s"], q["memory_bytes"])
    return got, d.get("tie", {})


def stability(recipe, table):
    """PVR_PLANS plans of recipe (and as many of PVR_REF's, interleaved): the layouts chosen,
    how often, and each one's measured step against the fastest layout's where it ran."""
    runs = {k[5]: k[1] for l, k in table.items() if l != "auto" and len(k) > 5}
    fastest = min(runs.values()) if runs else None
    memory = tempfile.mkdtemp(dir=tmp)
    who = [("this trainer", T, "off")] + ([("PVR_REF " + ref, ref, "off")] if ref else []) + \
        [("this trainer with the plan memory", T, memory)]
    chosen = {w: {} for w, _, _ in who}
    for _ in range(plans):
        for w, binary, mem in who:
            d = plan_json(recipe, binary, 1, mem)
            k = key_of(d["plan"]) if d else "no plan"
            chosen[w][k] = chosen[w].get(k, 0) + 1
    print("the choices of %d `trainer plan`s, one after another:" % plans)
    for w, _, _ in who:
        worst = None
        print("  %s: %d different" % (w, len(chosen[w])))
        for k, n in sorted(chosen[w].items(), key=lambda kn: -kn[1]):
            m = runs.get(k) if isinstance(k, tuple) else None
            if m and fastest:
                worst = max(worst or 0, m / fastest - 1)
            print("    %2d x %s%s" % (n, named(k) if isinstance(k, tuple) else k,
                                      ": measured %.4fs, %+.1f%% of the fastest" %
                                      (m, 100 * (m / fastest - 1)) if m and fastest else
                                      (" (not run)" if runs else "")))
        if runs:
            print("    the slowest choice measured: %s" % ("%+.1f%% of the fastest layout" %
                  (100 * worst) if worst is not None else "none of them was run"))


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else float("nan")


SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
RECOMPUTE = ("none", "selective", "full")


def simpler_key(k):
    """tr_plan_simpler's order (parallel/plan.c) as far as a resolved layout (resolved())
    says: model-parallel ranks, tp, ZeRO, sequence parallelism, recompute, virtual stages,
    schedule, dp, micro-batch (the micro-batch count and the stages' cuts are not in it)."""
    dp, tp, pp, zero, sch, v, mb, rc, sp = k
    return (tp * pp, tp, zero, sp, RECOMPUTE.index(rc), v or 1,
            SCHEDULES.index(sch) if sch else 0, dp, mb)


def tie_bands(table, planner_band):
    """The tie's band (parallel/plan.c PL_TIE; the planner's, planner_band, from its --json)
    against these runs: for bands of 0-10%, the
    simplest layout predicted within that band of the best prediction (each layout's runs'
    own), and its measured step against the fastest layout's. The noise half of the tie is
    left out: it is each start-up's own."""
    rows = [(t[0], t[1], t[5]) for l, t in table.items()
            if l != "auto" and t[0] == t[0] and len(t) > 5]
    if len(rows) < 2:
        return
    lo_p, lo_m = min(r[0] for r in rows), min(r[1] for r in rows)
    out = []
    for band in sorted({0.0, 0.02, 0.05, 0.10, round(planner_band, 4)}):
        c = min((r for r in rows if r[0] <= lo_p * (1 + band)), key=lambda r: simpler_key(r[2]))
        out.append("%.0f%%%s %+.1f%% (%s)" % (100 * band, " (the planner's)" if band ==
                                              round(planner_band, 4) else "",
                                              100 * (c[1] / lo_m - 1), named(c[2])))
    print("the tie's band against these runs (the simplest layout predicted within it of the "
          "best, measured against the fastest):\n  " + "\n  ".join(out))


def duel(recipe, rname, table, runs):
    """The choice and the layouts nearest the fastest, DUEL passes more, interleaved: each
    one's median over all its runs and its range; the verdict by the medians."""
    flags = {l: f for l, f, _ in layouts()}
    near = sorted((t[1], l) for l, t in table.items() if l != "auto")
    cands = [l for m, l in near if m <= near[0][0] * (1 + DUEL_BAND)][:DUEL_MAX] + ["auto"]
    for rep in range(DUEL):
        for l in cands:
            name = "%s_%s_d%d" % (rname, l.replace(" ", "").replace(",", ""), rep)
            runs[l].append(run(recipe, flags[l], name))
    got = {}
    for l in cands:
        ok = [g[1] for g in runs[l] if isinstance(g, tuple)]
        if ok:
            got[l] = (statistics.median(ok), min(ok), max(ok), len(ok))
    others = [l for l in got if l != "auto"]
    if "auto" not in got or not others:
        print("the choice again: no runs to compare")
        return
    best = min(others, key=lambda l: got[l][0])
    chose = sorted({named(g[5]) for g in runs["auto"] if isinstance(g, tuple) and len(g) > 5})
    print("the choice again: %d pass%s more of the %d layouts within %.0f%% of the fastest and "
          "of the choice, interleaved (median over all runs, fastest and slowest run):" %
          (DUEL, "" if DUEL == 1 else "es", len(others), 100 * DUEL_BAND))
    for l in others + ["auto"]:
        m, lo, hi, n = got[l]
        print("  %-40s median %.4fs over %d runs (%.4f-%.4f, %.2fx)%s" %
              ("the choice (parallel \"auto\")" if l == "auto" else l, m, n, lo, hi, hi / lo,
               ": %+.1f%% of the fastest median" % (100 * (m / got[best][0] - 1))))
    print("  the choice's runs resolved: %s" % "; ".join(chose))
    a, b = got["auto"], got[best]
    gap = a[0] / b[0] - 1
    verdict = "within 10%" if gap <= 0.10 else \
        "within the noise (its runs and the fastest's overlap)" if a[1] <= b[2] else \
        "NOT within 10% or the noise"
    print("  the choice against the fastest by the medians: %+.1f%% (%s; the fastest %s)" %
          (100 * gap, verdict, best))


mib = lambda b: b / 2**20
for rname, recipe in recipes:
    if reps == 0:
        print("\n== %s, %s (%d ranks)" % (conf, " ".join(recipe), world))
        stability(recipe, {})
        continue
    runs = {}  # label -> [results]
    for rep in range(reps):  # interleaved: every layout once, then again
        for label, flags, _ in layouts():
            name = "%s_%s_%d" % (rname, label.replace(" ", "").replace(",", ""), rep)
            runs.setdefault(label, []).append(run(recipe, flags, name))
    price, tie = planned(recipe)
    print("\n== %s, %s (%d ranks), %d steps a run, the fastest of %d runs; predicted by one "
          "`trainer plan` (ties within %.0f%%, or what the probes' %.0f%% (compute) and "
          "%.0f%% (links) could reorder)" %
          (conf, " ".join(recipe), world, steps, reps, 100 * tie.get("band", 0),
           100 * tie.get("reorder", 0), 100 * tie.get("link_reorder", 0)))
    print("%-40s %6s %10s %9s %10s %7s %7s %10s %10s" % ("layout", "M x mb", "predicted",
          "one plan", "measured", "spread", "meas/pred", "mem pred", "mem meas"))
    pred, meas, spreads, table, passes, spread_of, mesh, one = [], [], [], {}, [], [], [], []
    for label, _, key in layouts():
        got = runs[label]
        ok = [g for g in got if isinstance(g, tuple)]
        stopped = [g for g in got if isinstance(g, str) and g.startswith("stopped")]
        if not ok and not stopped:
            print("%-40s %s" % (label, got[0]))
            continue
        if ok:
            best = min(ok, key=lambda g: g[1])
            best = (statistics.median(g[0] for g in ok),) + best[1:]
            spread = max(g[1] for g in ok) / best[1] if len(ok) > 1 else float("nan")
            if len(ok) > 1:
                spreads.append(spread)
        else:  # every run stopped: as slow as the limit, with no prediction of its own
            best, spread = (float("nan"), float(limit), 0, 0, ""), float("nan")
        p = price.get(best[5]) if len(best) > 5 else None  # one plan's price of that layout
        table[label] = best
        if label == "auto":
            continue
        # the micro-batches a step and their size, as the run resolved them (its plan line)
        mm = re.search(r"(\d+) micro-batch(?:es)? of (\d+)", best[4])
        if ok:
            print("%-40s %6s %9.4fs %8s %9.4fs %7s %7.2f %9.1fM %9.1fM" %
                  (label, "%sx%s" % mm.groups() if mm else "-", best[0],
                   "%.4fs" % p[0] if p else "-", best[1],
                   "%.2f" % spread if spread == spread else "-",
                   best[1] / best[0] if best[0] == best[0] else 0,
                   mib(best[2]), mib(best[3])))
        else:  # "-" for what a stopped run did not say
            print("%-40s %6s %10s %8s %9.4fs %7s %7s %10s %10s  (stopped)" %
                  (label, "-", "-", "-", best[1], "-", "-", "-", "-"))
        if best[0] == best[0]:
            pred.append(best[0])
            meas.append(best[1])
            passes.append([g[1] if isinstance(g, tuple) else float("nan") for g in got])
            spread_of.append(spread)
            mesh.append(isinstance(key, tuple))
            one.append(p[0] if p else float("nan"))
    noise = statistics.median(spreads) if spreads else float("nan")
    # the ceiling at this noise: the measurements' own rank correlation, each pass against
    # the next (a prediction cannot rank the layouts better than the runs rank themselves)
    groups = [("every layout", list(range(len(pred))))]
    if VARIANTS:
        groups.append(("the meshes' ZeRO stages alone", [i for i in range(len(pred)) if mesh[i]]))
    for what, idx in groups:
        if len(idx) < 3:
            continue
        own = []
        for k in range(reps - 1):
            a = [passes[i][k] for i in idx]
            b = [passes[i][k + 1] for i in idx]
            keep = [j for j in range(len(a)) if a[j] == a[j] and b[j] == b[j]]
            if len(keep) > 2:
                own.append(spearman([a[j] for j in keep], [b[j] for j in keep]))
        print("Spearman's rank correlation of predicted and measured, %s: %.3f over %d "
              "layouts%s" % (what, spearman([pred[i] for i in idx], [meas[i] for i in idx]),
                             len(idx), "; the runs' own, each pass against the next: %s (the "
                             "most a prediction can reach at this noise)" %
                             ", ".join("%.3f" % x for x in own) if own else ""))
    idx = [i for i in range(len(one)) if one[i] == one[i]]
    if len(idx) > 2:
        print("Spearman's rank correlation of one plan's prices and measured, where it priced the "
              "layout: %.3f over %d layouts" % (spearman([one[i] for i in idx],
                                                         [meas[i] for i in idx]), len(idx)))
    print("the noise (median spread of a layout's runs): %s" %
          ("%.2fx" % noise if noise == noise else "- (no layout has two runs that finished)"))
    # the pairs the runs tell apart: measured further apart than either layout's spread
    apart = right = 0
    for i in range(len(meas)):
        for j in range(i + 1, len(meas)):
            lo, hi = sorted((meas[i], meas[j]))
            noise_ij = max(x for x in (spread_of[i], spread_of[j], 1.0) if x == x)
            if hi / lo <= noise_ij:
                continue
            apart += 1
            right += (pred[i] - pred[j]) * (meas[i] - meas[j]) > 0
    if apart:
        print("pairs of layouts measured further apart than their runs' spread: %d of %d; the "
              "prediction orders %d of them the same way (%.0f%%)" %
              (apart, len(meas) * (len(meas) - 1) // 2, right, 100.0 * right / apart))
    mem = [abs(t[2] / t[3] - 1) for l, t in table.items() if l != "auto" and t[2] > 0 and t[3] > 0]
    if mem:
        print("memory: predicted against measured, the largest error %.2f%% over %d layouts" %
              (100 * max(mem), len(mem)))
    auto = table.get("auto")
    fastest = min(((l, t) for l, t in table.items() if l != "auto"), key=lambda lt: lt[1][1],
                  default=None)
    if auto and not auto[4]:  # its runs stopped: no layout resolved, nothing to compare
        print("the planner's choice (parallel \"auto\"): every run stopped after %d s" % limit)
        auto = None
    if auto and fastest:
        place = 1 + sum(1 for l, t in table.items() if l != "auto" and t[1] < auto[1])
        gap = auto[1] / fastest[1][1] - 1
        verdict = "within 10%" if gap <= 0.10 else \
            "within the noise" if gap <= noise - 1 else "NOT within 10% or the noise"
        print("the planner's choice (parallel \"auto\"): %s\n  measured %.4fs, predicted by its run %.4fs; the fastest layout "
              "%s measured %.4fs: %+.1f%% (%s), place %d of %d" %
              (auto[4], auto[1], auto[0], fastest[0], fastest[1][1], 100 * gap, verdict, place,
               len(table) - 1))
    tie_bands(table, tie.get("band", 0))
    if DUEL and auto and fastest:
        duel(recipe, rname, table, runs)
    if plans:
        stability(recipe, table)
PY
done
