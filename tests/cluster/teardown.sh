#!/usr/bin/env bash
# The cluster in a box (tests/cluster/cluster.sh) leaves the machine as it found it: a cluster
# of 2 hosts x 2 slots (and Slurm's daemons where Slurm is installed) runs a job across its
# hosts; the launcher and one host's processes are killed mid-job (the other host's orted and
# ranks are orphaned), a namespace of its name with a process in it is left as a crashed `up`
# would; `down` then leaves no namespace, link, process or file of the cluster's name. Bad
# input to the tool gets one line and exit status 2; shape, cut and mend set what they say.
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib.sh"
T=$(realpath "$1")
command -v mpirun >/dev/null || { echo "SKIP no mpirun (apt-get install openmpi-bin)"; exit 77; }
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
slurm=()
command -v slurmd >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null && slurm=(--slurm)
cluster_begin td --hosts 2 --slots 2 --rate 200mbit "${slurm[@]}"

refused() { # text args...: one line naming the problem, exit status 2
    local want=$1 out rc
    shift
    out=$("$CL" "$@" 2>&1)
    rc=$?
    if [ $rc -eq 2 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && grep -qF -- "$want" <<<"$out"; then
        ok "cluster.sh $*: refused: $out"
    else
        bad "cluster.sh $*: exit $rc: $out"
    fi
}
refused "bad rate 'fast'" shape "$cname" "$cname-n0" fast
refused "has no host 'nowhere'" cut "$cname" nowhere
refused "--hosts '0'" up "x$$" --hosts 0 --slots 1
refused "is up already" up "$cname" --hosts 1 --slots 1
refused "no cluster 'zz$$' is up" run "zz$$" -- true
refused "bad cluster name 'A-b'" down A-b

# shape sets tbf at both ends of a host's link (what it sends, what it receives); none
# removes it; cut and mend take the switch's end down and up
sh=trc-$cname-n1 sw=trc-$cname-sw
qdiscs() { tc -n "$sh" qdisc show dev eth0; tc -n "$sw" qdisc show dev n1; }
"$CL" shape "$cname" "$cname-n1" 50mbit >/dev/null
n50=$(qdiscs | grep -c "tbf .*rate 50Mbit")
"$CL" shape "$cname" "$cname-n1" none >/dev/null
n0=$(qdiscs | grep -c tbf)
"$CL" shape "$cname" "$cname-n1" 200mbit >/dev/null
n200=$(qdiscs | grep -c "tbf .*rate 200Mbit")
[ "$n50/$n0/$n200" = 2/0/2 ] && ok "shape: tbf at 50mbit at both ends, none, 200mbit again" ||
    bad "shape: tbf at 50mbit on $n50 ends, $n0 left by none, 200mbit on $n200: $(qdiscs)"
"$CL" cut "$cname" "$cname-n1" >/dev/null
cut=$(ip -n "$sw" -o link show dev n1 | grep -o "state [A-Z]*")
"$CL" mend "$cname" "$cname-n1" >/dev/null
mend=$(ip -n "$sw" -o link show dev n1 | grep -o "state [A-Z]*")
[ "$cut" = "state DOWN" ] && [ "$mend" != "state DOWN" ] && ok "cut: n1's link $cut; mend: $mend" ||
    bad "cut: n1's link '$cut'; mend: '$mend'"

# a job across the hosts, running (cluster.sh run execs: $job becomes mpirun)
"$CL" run "$cname" -- mpirun -np 4 "$T" run tests/recipes_good/dp_tiny.lua --set steps=100000 --out "$tmp/job" \
    --peak-gflops 10 >"$tmp/job.log" 2>&1 &
job=$!
disown "$job" # killed below: no "Killed" notice from this shell
for _ in $(seq 600); do grep -qs '"step"' "$tmp/job/metrics.jsonl" && break; sleep 0.1; done
if grep -qs '"step"' "$tmp/job/metrics.jsonl" && grep -q "detected: 2 nodes" "$tmp/job.log"; then
    ok "a job runs across the 2 hosts: $(grep -o 'detected: 2 nodes ([^)]*)' "$tmp/job.log")"
else
    bad "the job did not start training across 2 nodes within 60 s"; tail -5 "$tmp/job.log"
fi
nets=$(for n in /run/netns/trc-"$cname"-*; do echo "net:[$(stat -L -c %i "$n")]"; done)
# what of it runs, by namespace: the processes of the namespaces of the cluster
inside() {
    local p
    for p in /proc/[0-9]*; do
        grep -qxF "$(readlink "$p/ns/net" 2>/dev/null)" <<<"$nets" && echo "${p#/proc/} $(cat "$p/comm" 2>/dev/null)"
    done
}
before=$(inside)
# the launcher dies, and host n0 with it; a crashed `up` left a namespace with a process in it
[ "$(cat "/proc/$job/comm" 2>/dev/null)" = mpirun ] || bad "cluster.sh run did not become mpirun"
kill -9 "$job" 2>/dev/null
"$CL" kill "$cname" "$cname-n0" >/dev/null
ip netns add "trc-$cname-n9" && (exec nsenter --net="/run/netns/trc-$cname-n9" sleep 600 </dev/null >/dev/null 2>&1 &)
nets="$nets"$'\n'"net:[$(stat -L -c %i "/run/netns/trc-$cname-n9")]"
ok "killed mid-job: mpirun and $cname-n0; left running: $(inside | awk '{print $2}' | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')"
for _ in $(seq 100); do [ -e "/proc/$job" ] || break; sleep 0.1; done

"$CL" down "$cname" >"$tmp/down.log" 2>&1 || bad "down exited $?: $(cat "$tmp/down.log")"
left_ns=$(ip netns list | awk '{print $1}' | grep "^trc-$cname-")
left_proc=$(inside)
left_link=$(ip -o link | grep -F "$cname")
left_files=$(find /run /tmp /dev/shm /etc "${TMPDIR:-/tmp}" -maxdepth 2 -name "*$cname*" 2>/dev/null)
if [ -z "$left_ns$left_proc$left_link$left_files" ]; then
    ok "down: no namespace, process, link or file of $cname left ($(echo "$before" | wc -l) processes were running)"
else
    bad "down left: namespaces [$left_ns] processes [$left_proc] links [$left_link] files [$left_files]"
fi
out=$("$CL" down "$cname" 2>&1) && [ "$out" = "cluster $cname: nothing left to tear down" ] &&
    ok "down again: $out" || bad "down of a cluster already down: $out"
cname=""

[ "$fail" -eq 0 ] && echo "cluster_teardown: all passed" || echo "cluster_teardown: FAILED"
exit "$fail"
