#!/usr/bin/env bash
# A host whose link slows mid-run: on a cluster in a box of 3 hosts x 1 slot with links shaped
# to 1 Gbit/s, a 3-rank data-parallel run of a tiny GPT (80 steps); after step 10 the link
# of host n1 is shaped to a twentieth (50 Mbit/s, both ways). The ledger's link watch
# (trainer/report/links.h) sees the step's communication grow, times the links between the
# hosts, and names n1 (rank 1) on stdout and in ledger.jsonl; from then on the waiting is
# charged to rank 1, which ranks.json shows as the rank the others waited for most. The run
# finishes. The watch needs about 8 slowed steps (a median over 5, then 4 in a row) and the
# communication at least twice its best. Why a twentieth: the box's 1 Gbit/s links carry
# 30-50 MB/s, bound by the cores that run them, not 125, so a tenth (100 Mbit/s) slowed this
# run's communication only 2.8-3.6x on idle cores, and 2.06-2.24x with both cores busy (the
# busy cores lengthen its best): the project's CI, beside the fuzz build's two compilers, once
# ended with no alarm although the link was slowed at step 13. At 50 Mbit/s it is 3.1-4.1x
# with two or three busy loops beside it (2026-12-07). With two hosts the slow end of their
# one link cannot be told (tests/test_cluster checks that rule on its own); three are the
# fewest that name one. About 20 s.
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib.sh"
T=$(realpath "$1")
export OMP_NUM_THREADS=1
fail=0
tmp=$(mktemp -d)
sed -e "s|\"../../data/|\"$PWD/data/|" -e 's|batch_tokens = 256|batch_tokens = 384|' \
    -e 's|log_every = 5|log_every = 1|' -e 's|parallel { tp = 1, pp = 1,|parallel { dp = 3, tp = 1, pp = 1,|' \
    tests/recipes_good/dp_tiny.lua >"$tmp/r.lua"
grep -q "dp = 3" "$tmp/r.lua" && grep -q "batch_tokens = 384" "$tmp/r.lua" ||
    { echo "FAIL the test's recipe from dp_tiny.lua"; exit 1; }
cluster_begin ts --hosts 3 --slots 1 --rate 1gbit

# slow n1's link to 50 Mbit/s once the run has logged step 10
(
    for _ in $(seq 600); do
        n=$(grep -c '"step"' "$tmp/out/metrics.jsonl" 2>/dev/null)
        [ "${n:-0}" -ge 10 ] && break
        sleep 0.1
    done
    "$CL" shape "$cname" "$cname-n1" 50mbit >"$tmp/shape.log" 2>&1
    echo " (slowed at step $(grep -c '"step"' "$tmp/out/metrics.jsonl" 2>/dev/null) of 80)" >>"$tmp/shape.log"
) &
shaper=$!
"$CL" run "$cname" -- mpirun -np 3 "$T" run "$tmp/r.lua" --set steps=80 --timeout 60 \
    --out "$tmp/out" >"$tmp/run.log" 2>&1
rc=$?
wait $shaper
[ $rc -eq 0 ] && ok "the run across 3 hosts finished while n1's link was slowed" ||
    bad "the run failed (exit $rc): $(tail -3 "$tmp/run.log")"
line=$(grep -a "^slow link: \|^slow network: " "$tmp/run.log" | head -1)
case "$line" in
"slow link: host $cname-n1 (rank 1) "*) ok "the alarm names the host: $line" ;;
*) bad "no alarm naming $cname-n1: ${line:-none}; $(cat "$tmp/shape.log")" ;;
esac
python3 - "$tmp/out" "$cname-n1" <<'PY' && ok "ledger.jsonl and ranks.json charge the waiting to it" || bad "the ledger's record of it"
import json, sys
out, host = sys.argv[1], sys.argv[2]
ev = [json.loads(l) for l in open(out + "/ledger.jsonl")]
slow = [e for e in ev if e.get("kind") == "slow_link"]
print("     event:", slow[0] if slow else None)
if len(slow) != 1 or slow[0]["host"] != host or slow[0]["ranks"] != [1]:
    sys.exit(1)
if not slow[0]["host_bytes_s"] < 0.5 * slow[0]["others_bytes_s"]:
    sys.exit(1)
total = [e for e in ev if e.get("kind") == "total"][-1]
on = total["waited_on_s"]
ranks = json.load(open(out + "/ranks.json"))
waited = [r["waited_for_others_s"] for r in ranks]
print("     waited on each rank: %s s; each rank waited for others: %s s" % (on, waited))
sys.exit(0 if on[1] > 0 and on[1] == max(on) and min(waited[0], waited[2]) > 0 else 1)
PY
exit $fail
