#!/usr/bin/env bash
# Layouts across hosts: on a cluster in a box of 2 hosts x 4 slots whose links are shaped to
# 200 Mbit/s (tests/cluster/cluster.sh), mpirun runs the tiny GPT of tests/pp.sh over TCP
# between the hosts and shared memory inside them: dp 4 with ZeRO-2, dp 2 x tp 2 (tp inside
# the hosts), tp 2 x pp 2 (the pipeline across the hosts) and dp 2 x tp 2 x pp 2 on 8 ranks,
# each equal to the single process under tests/lib.sh's rule (losses, grad norms, final
# parameters). Each run's detected topology says 2 nodes, the ranks of every tp group are on
# one host and tp 2 x pp 2 has its stages on two (the per-rank table names each rank's host;
# the mesh puts tp innermost: world rank = (d * pp + p) * tp + t); the hosts' links carried
# the traffic between them. About 30 s.
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib.sh"
layout_setup "$(realpath "$1")" tests/recipes_good/pp
cluster_begin tl --hosts 2 --slots 4 --rate 200mbit
layout_launch=("$CL" run "$cname" --)

# the reference: one process, outside the cluster
layout_run gpt_one 1 gpt || exit 1

# every tp group on one host; with PP > 1, the PP stages of every pipeline on PP hosts
placement() { # name tp pp
    rank_hosts "$tmp/$1.log" | python3 -c '
import sys
tp, pp = int(sys.argv[1]), int(sys.argv[2])
host = dict(l.split() for l in sys.stdin)
n = len(host)
if n == 0 or sorted(map(int, host)) != list(range(n)):
    print("no per-rank table of %d ranks" % n); sys.exit(1)
groups = [sorted({host[str(g * tp + t)] for t in range(tp)}) for g in range(n // tp)]
split = [g for g in groups if len(g) > 1]
if split:
    print("a tp group spans hosts %s" % split[0]); sys.exit(1)
if pp > 1:  # world rank (d * pp + p) * tp + t: stage p of pipeline (d, t)
    for d in range(n // (tp * pp)):
        for t in range(tp):
            if len({host[str((d * pp + p) * tp + t)] for p in range(pp)}) != pp:
                print("pipeline (%d, %d) has two stages on one host" % (d, t)); sys.exit(1)
print("hosts by rank: " + " ".join(host[str(r)] for r in range(n)))
' "$2" "$3"
}

# name, ranks, tp, the pp whose stages must be on other hosts (1: not checked), flags
layouts=(
    "dp4_zero2 4 1 1 --dp 4 --zero 2"
    "dp2_tp2 4 2 1 --dp 2 --tp 2"
    "tp2_pp2 4 2 2 --tp 2 --pp 2 --micro-batch 2"
    "dp2_tp2_pp2 8 2 1 --dp 2 --tp 2 --pp 2 --micro-batch 2"
)
for l in "${layouts[@]}"; do
    set -- $l
    name=$1 np=$2 tp=$3 pp=$4
    shift 4
    # np/2 ranks on each host, in rank order (Open MPI's ppr mapping)
    OMPI_MCA_rmaps_base_mapping_policy=ppr:$((np / 2)):node layout_run "$name" "$np" gpt "$@" || continue
    if grep -q "detected: 2 nodes" "$tmp/$name.log"; then
        ok "$name: $(grep -o 'detected: 2 nodes ([^)]*) x [0-9]* ranks' "$tmp/$name.log")"
    else
        bad "$name: the run did not detect 2 nodes: $(grep -m1 '^plan:' "$tmp/$name.log")"
    fi
    if e=$(placement "$name" "$tp" "$pp"); then
        ok "$name: tp inside hosts$([ "$pp" -gt 1 ] && echo ", pp across them"): $e"
    else
        bad "$name: $e"
    fi
    if e=$(cmp_run "$tmp/$name" "$tmp/gpt_one"); then
        ok "$name: equal to one process: $e"
    else
        bad "$name: differs from one process: $e"
    fi
done

# the ranks of different hosts talked over the links (TCP), not through shared memory
for h in n0 n1; do
    b=$(ip -n "trc-$cname-$h" -s -j link show dev eth0 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])')
    if [ "${b:-0}" -gt 1000000 ]; then
        ok "$cname-$h sent $b bytes over its link"
    else
        bad "$cname-$h sent ${b:-no} bytes over its link: the hosts did not talk over TCP"
    fi
done

[ "$fail" -eq 0 ] && echo "cluster_layouts: all passed" || echo "cluster_layouts: FAILED"
exit "$fail"
