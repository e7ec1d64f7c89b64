#!/usr/bin/env bash
# Topology across hosts: on a cluster in a box of 2 hosts x 2 slots, `trainer plan --json`
# under mpirun (the job plans for itself) names both hosts with their ranks, measures the
# links inside a host and between hosts, and reads the link between hosts within 30% of the
# rate tc shapes it to (200 Mbit/s, then 50 Mbit/s: the figure follows the link), and the ring
# through all 4 ranks (their all-reduce's bus bandwidth) not above it by more than that. The plan
# keeps tensor parallelism inside a host. The two hosts are namespaces of one machine (one
# kernel): each is said to hold half the machine's cores, as its 2 ranks get of them beside
# the other host's 2, and the description says why. A bandwidth bound is a measurement on a machine
# that other tests load: each rate is measured up to 3 times before a miss counts. Then, with
# TR_SPEED_GROUPS=1, the hosts' groups follow the sgemm figures the detection line shows;
# without it the same hosts are one group, and the line shows the figures, with how to split
# them, exactly where the rule would split them. ~25 s.
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib.sh"
T=$(realpath "$1")
R=$(realpath tests/recipes_good/pp_gpt.lua)
export OMP_NUM_THREADS=1
fail=0
tmp=$(mktemp -d)
cluster_begin tt --hosts 2 --slots 2 --rate 200mbit

# check RATE_BYTES_PER_S: the job's cluster object, its p2p rate between hosts within 30%
check() {
    "$CL" run "$cname" -- mpirun -np 4 "$T" plan "$R" --json >"$tmp/plan.json" 2>"$tmp/plan.err" ||
        { echo "trainer plan under mpirun failed: $(tail -2 "$tmp/plan.err")"; return 2; }
    python3 - "$tmp/plan.json" "$cname" "$1" "$(nproc)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
name, rate, cores = sys.argv[2], float(sys.argv[3]), max(1, int(sys.argv[4]) * 2 // 4)
c, plan = d["cluster"], d["plan"]
nodes = [(n["host"], n["ranks"]) for n in c["nodes"]]
want = [(name + "-n0", [0, 1]), (name + "-n1", [2, 3])]
intra, inter = c["links"]["intra"], c["links"]["inter"]
got, ring = inter.get("p2p_bw", 0), inter.get("ring_bw", 0)
print("hosts %s; inter p2p %.1f MB/s (shaped %.1f), all-reduce bus %.1f MB/s, ring through all "
      "4 %.1f MB/s, latency %.2g s; intra %.0f MB/s; plan dp %d x tp %d x pp %d" % (nodes,
      got / 1e6, rate / 1e6, inter["bw"] / 1e6, ring / 1e6, inter["latency"], intra["bw"] / 1e6,
      plan["dp"], plan["tp"], plan["pp"]))
if nodes != want: sys.exit(2)
if intra["origin"] != "measured" or inter["origin"] != "measured": sys.exit(2)
if plan["tp"] > 2: sys.exit(2)   # tp inside a host of 2 ranks
shared = "CPU, %d core%s," % (cores, "" if cores == 1 else "s")
if shared not in c["source"] or "nodes on one machine share its cores" not in c["source"]:
    print("the hosts share one machine's cores, but the cluster says: %s" % c["source"])
    sys.exit(2)
if [g["pool"] for g in c["groups"]] != [4]:  # a waiting rank's core goes to any of the 4
    print("the hosts' ranks float over one machine's cores, but the pool is %s" % c["groups"])
    sys.exit(2)
if not ring > 0: sys.exit(2)  # nodes of 2 ranks: the ring through every rank is timed
# a ring's bus bandwidth is what each link between hosts carries each way: not above its rate
sys.exit(0 if abs(got / rate - 1) <= 0.3 and ring <= 1.3 * rate else 1)
PY
}
for rate in 200 50; do
    if [ $rate != 200 ]; then
        "$CL" shape "$cname" "$cname-n0" ${rate}mbit >/dev/null &&
            "$CL" shape "$cname" "$cname-n1" ${rate}mbit >/dev/null || { bad "shape to $rate"; break; }
    fi
    for try in 1 2 3; do
        e=$(check $((rate * 1000000 / 8)))
        rc=$?
        [ $rc -eq 1 ] || break
    done
    case $rc in
    0) ok "links shaped to $rate Mbit/s (measurement $try): $e" ;;
    1) bad "links shaped to $rate Mbit/s: the measured rate is off by more than 30%, 3 times: $e" ;;
    *) bad "links shaped to $rate Mbit/s: $e" ;;
    esac
done

# the split by speed (TR_SPEED_GROUPS=1): the detection line shows each host's sgemm rate and
# its probe's noise, and the groups are what topology.h's rule makes of those figures (a new
# group at 1.5x apart and more than 1 + twice the larger noise; a case within 3% of either
# bound is not judged, the line's figures being rounded). Host n0's ranks run on core 0, n1's
# on core 1 beside two busy loops (about half n0's speed), so that the hosts differ: whether
# they split depends on the machine's load; what is checked is that the split agrees with the
# figures.
"$CL" cores "$cname" "$cname-n0" 0 >/dev/null && "$CL" cores "$cname" "$cname-n1" 1 >/dev/null ||
    bad "cores for n0 and n1"
busy=
for _ in 1 2; do
    taskset -c 1 sh -c 'while :; do :; done' &
    busy="$busy $!"
done
trap 'kill $busy 2>/dev/null; cluster_end' EXIT # the loops are outside the cluster's namespaces
"$CL" run "$cname" -- mpirun -np 4 --bind-to none -x TR_SPEED_GROUPS=1 "$T" plan "$R" --json \
    >"$tmp/speed.json" 2>"$tmp/speed.err"
"$CL" run "$cname" -- mpirun -np 4 --bind-to none "$T" plan "$R" --json \
    >"$tmp/unsplit.json" 2>"$tmp/unsplit.err"
kill $busy
trap cluster_end EXIT
split_rule() { python3 - "$1" "$2" <<'PY'
import json, re, sys
try:
    c = json.load(open(sys.argv[1]))["cluster"]
except (OSError, ValueError) as x:
    print("no plan: %s" % x); sys.exit(1)
if sys.argv[2] == "off": # one group; the figures and the hint only where they would split
    m = re.search(r"sgemm by node ([^:;]*)(: 2 speeds, each group planned at its slowest node's \(TR_SPEED_GROUPS=1 plans each speed at its own\))?$", c["source"])
    if len(c["groups"]) != 1 or ("sgemm" in c["source"]) != bool(m and m.group(2)):
        print("without TR_SPEED_GROUPS: %d group(s), %s" % (len(c["groups"]), c["source"])); sys.exit(1)
    if not m:
        print("without TR_SPEED_GROUPS: no figures shown, one group"); sys.exit(0)
else:
    m = re.search(r"sgemm by node ([^;]*)", c["source"])
figs = re.findall(r"([0-9.]+) GFLOP/s \+-([0-9]+)%", m.group(1)) if m else []
if len(figs) != 2:
    print("the line does not show both hosts' sgemm figures: %s" % c["source"]); sys.exit(1)
(a, na), (b, nb) = [(float(v), float(n) / 100) for v, n in figs]
apart, bar = max(a, b) / min(a, b), 1 + 2 * max(na, nb)
groups = len(c["groups"]) if sys.argv[2] == "on" else 2 # off: shown only where it would split
say = "%s; %d group(s): %.2fx apart, the bar %.2fx" % (m.group(0), groups, apart, bar)
close = abs(apart / 1.5 - 1) < 0.03 or abs(apart / bar - 1) < 0.03
want = 2 if apart >= 1.5 and apart > bar else 1
print(say + (" (too close to judge)" if close else ""))
sys.exit(0 if close or groups == want else 1)
PY
}
e=$(split_rule "$tmp/speed.json" on) && ok "the split by speed follows the figures it shows: $e" ||
    bad "the split by speed: $e"
# without TR_SPEED_GROUPS, the same hosts: one group; the figures, and how to split, where the
# rule would split them
e=$(split_rule "$tmp/unsplit.json" off) &&
    ok "without TR_SPEED_GROUPS one group, the figures shown where they would split: $e" ||
    bad "the split by speed off: $e"
# n0 on core 0, n1 on core 1: each host's ranks lend a core only to each other (a pool of 2)
python3 - "$tmp/unsplit.json" <<'PY' && ok "hosts on cores apart: pools of their own 2 ranks" ||
import json, sys
c = json.load(open(sys.argv[1]))["cluster"]
pools, said = [g["pool"] for g in c["groups"]], "share its memory (their cores apart)" in c["source"]
print("pools %s; %s" % (pools, c["source"]))
sys.exit(0 if pools and all(p == 2 for p in pools) and said else 1)
PY
    bad "hosts on cores apart: not pools of their own ranks"
grep -q '"source"' "$tmp/plan.json" || bad "no plan on equal hosts"
exit $fail
