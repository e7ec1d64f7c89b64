#!/usr/bin/env bash
# Private gradients on the wire, on a cluster in a box (tests/cluster/cluster.sh: 2 hosts of
# one rank, two organisations): tcpdump captures host n1's link at the switch while a dp 2 run
# of tests/recipes_good/dp_tiny.lua trains 2 steps, once plain and once with
# --private-gradients. Each rank writes its own gradient of the first bucket it sums, before
# any mask (TR_DUMP_LOCAL_GRAD); 400 of each rank's values (distinct, not patterns of one or two
# bytes) are looked for, as float32 bytes at any offset, in every TCP payload that crossed the
# link (Open MPI's ring all-reduce, which comm/mpi.c asks for: each of the 2 ranks sends the
# other one half of its own buffer, and gets that half's sum back; about half of each rank's
# values cross. A binomial tree, Open MPI's default, sent all of rank 1's and none of rank
# 0's.)
#  - plain: at least 3/8 of one rank's are there (about half; the test can fail: the capture
#    sees gradients);
#  - masked: at most 4 of each rank's 400. A random 4-byte pattern turns up in B random bytes
#    with probability about B / 2^32; of the ~33 MB captured, most are the start-up probes'
#    constant buffers, and the random part (the masked sums, about 1 MB) makes about 0.1 of
#    400 values turn up by chance (5 or more: under 1e-7);
#  - what rank 1 sent of that bucket (masked: its message as the trainer wrote it before the
#    sum, TR_DUMP_LOCAL_GRAD's .sent file; plain: its float32 gradient) is on the wire (at
#    least 6 of 20 64-byte pieces of it, evenly spaced, are in the payloads: the half the ring
#    sends holds 9-10 of them, a tree's whole buffer all 20), and its bytes look uniformly
#    random when masked and not when plain: a chi-square test of the counts of the 256 byte
#    values (255 degrees of freedom: mean 255, standard deviation 22.6) under 400, which
#    uniform bytes exceed with probability about 1e-10.
# What still crosses in the clear by design (the banner and README say so): each bucket's sum
# of magnitudes, the summed gradient in fixed point (the all-gather half of the sum: every
# rank receives it), the parameters. Needs root, iproute2, tcpdump and Open MPI (else exit
# 77). About 20 s.
#
# usage: tests/cluster/private_wire.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null || { echo "SKIP no mpirun"; exit 77; }
command -v tcpdump >/dev/null || { echo "SKIP no tcpdump (apt-get install tcpdump)"; exit 77; }
. "$here/../lib.sh"
. "$here/lib.sh"
tmp=$(mktemp -d)
cluster_begin pw --hosts 2 --slots 1 --rate 1gbit
name=$cname C=$CL D=$cdir
R=$(pwd)/tests/recipes_good/dp_tiny.lua

# capture KIND [flags...]: the run, with tcpdump on n1's port of the switch
capture() {
    local kind=$1
    shift
    ip netns exec "trc-$name-sw" tcpdump -i n1 -s 0 -U -w "$tmp/$kind.pcap" tcp \
        >"$tmp/$kind.tcpdump" 2>&1 &
    local td=$!
    sleep 1 # tcpdump is listening
    "$C" run "$name" -- mpirun -np 2 --hostfile "$D/hostfile" -x OMP_NUM_THREADS=1 \
        -x TR_DUMP_LOCAL_GRAD="$tmp/$kind.grad" "$T" run "$R" --set steps=2 --peak-gflops 10 \
        --out "$tmp/$kind" "$@" >"$tmp/$kind.log" 2>&1
    local rc=$?
    sleep 0.5
    kill -INT $td 2>/dev/null
    wait $td 2>/dev/null
    [ $rc = 0 ] || bad "$kind run exited $rc: $(grep -a 'trainer' "$tmp/$kind.log" | tail -1)"
    return $rc
}

# payloads.py: the TCP payloads of a capture, one bytes object (found and uniform use it)
cat >"$tmp/payloads.py" <<'PY'
import struct


def payloads(pcap):
    data = open(pcap, "rb").read()
    end = "<" if data[:4] == b"\xd4\xc3\xb2\xa1" else ">"
    link = struct.unpack(end + "I", data[20:24])[0]
    pay, at = bytearray(), 24
    while at + 16 <= len(data):
        caplen = struct.unpack(end + "I", data[at + 8:at + 12])[0]
        p = data[at + 16:at + 16 + caplen]
        at += 16 + caplen
        off = 14 if link == 1 else 16 if link == 113 else 0  # Ethernet, Linux cooked
        if len(p) < off + 20 or p[off] >> 4 != 4:
            continue
        t = off + (p[off] & 15) * 4
        if len(p) >= t + 20:
            pay += p[t + (p[t + 12] >> 4) * 4:]
    return bytes(pay)
PY

# found KIND RANK: "FOUND SEARCHED BYTES" of the rank's gradient values in the payloads
found() {
    PYTHONPATH="$tmp" python3 - "$tmp/$1.pcap" "$tmp/$1.grad.$2" <<'PY'
import struct, sys
from payloads import payloads
pcap, grad = sys.argv[1:]
pay = payloads(pcap)
g = open(grad, "rb").read()  # one rank's
vals = sorted({g[i:i + 4] for i in range(0, len(g) - 3, 4)})
# values whose pattern is not a run of one byte and not tiny integers' (real gradients)
vals = [v for v in vals if len(set(v)) > 2 and abs(struct.unpack("<f", v)[0]) > 1e-30]
step = max(1, len(vals) // 400)
pick = vals[::step][:400]
print(sum(1 for v in pick if bytes(v) in pay), len(pick), len(pay))
PY
}

# uniform KIND FILE: "PIECES_FOUND CHI2 BYTES" of FILE's bytes (what rank 1 sent)
uniform() {
    PYTHONPATH="$tmp" python3 - "$tmp/$1.pcap" "$2" <<'PY'
import sys
from payloads import payloads
pcap, sent = sys.argv[1:]
pay = payloads(pcap)
m = open(sent, "rb").read()
pieces = [m[i:i + 64] for i in range(0, len(m) - 64, max(64, len(m) // 20))][:20]
found = sum(1 for x in pieces if bytes(x) in pay)
count = [0] * 256
for b in m:
    count[b] += 1
e = len(m) / 256
print(found, "%.0f" % sum((c - e) ** 2 / e for c in count), len(m))
PY
}

capture plain || exit 1
capture masked --private-gradients || exit 1
grep -q "masked between 2 hosts" "$tmp/masked.log" || bad "the masked run does not say it masks between 2 hosts"
best=0
for r in 0 1; do
    read -r fp np bp <<<"$(found plain $r)"
    echo "     plain: rank $r: ${fp:-?} of ${np:-?} of its gradient values in the $bp payload bytes"
    [ "${np:-0}" -ge 100 ] && [ "$fp" -ge $((np * 3 / 8)) ] && best=1
    read -r fm nm bm <<<"$(found masked $r)"
    if [ "${nm:-0}" -ge 100 ] && [ "$fm" -le 4 ]; then
        ok "masked: $fm of $nm of rank $r's gradient values in the $bm payload bytes that crossed n1's link"
    else
        bad "masked: ${fm:-?} of ${nm:-?} of rank $r's gradient values appear on the wire"
    fi
done
[ $best = 1 ] && ok "plain: one rank's gradient values are on the wire (the capture can see them)" ||
    bad "plain: no rank's gradient values found: the capture does not see the sums"
read -r pf pc pb <<<"$(uniform plain "$tmp/plain.grad.1")"
read -r mf mc mb <<<"$(uniform masked "$tmp/masked.grad.sent.1")"
echo "     rank 1's message: plain ${pb:-?} bytes, ${pf:-?} of 20 pieces on the wire, chi-square ${pc:-?};" \
    "masked ${mb:-?} bytes, ${mf:-?} of 20 on the wire, chi-square ${mc:-?}"
[ "${mf:-0}" -ge 6 ] && [ "${mc:-999999}" -lt 400 ] &&
    ok "masked: rank 1's message crossed the link and its bytes look uniform (chi-square $mc < 400)" ||
    bad "masked: rank 1's message: ${mf:-?} of 20 pieces on the wire, chi-square ${mc:-?}"
[ "${pf:-0}" -ge 6 ] && [ "${pc:-0}" -ge 400 ] &&
    ok "plain: rank 1's gradient crossed the link and its bytes do not look uniform (chi-square $pc)" ||
    bad "plain: rank 1's gradient: ${pf:-?} of 20 pieces on the wire, chi-square ${pc:-?} (the test could not fail)"

[ $fail = 0 ] && echo "PASS cluster_private_wire" || echo "FAIL cluster_private_wire"
exit $fail
