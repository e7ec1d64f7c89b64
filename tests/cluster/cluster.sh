#!/usr/bin/env bash
# A cluster in a box: hosts made of Linux network namespaces on this one machine, for the
# tests, the benchmarks and anyone who wants to try a multi-server layout without servers.
#
#   cluster.sh up NAME --hosts N --slots K [--rate RATE] [--slurm]
#       N hosts NAME-n0 .. NAME-n{N-1} of K slots each, and a head NAME-head to launch from
#       (mpirun, srun and slurmctld run there; it holds no slots). Each is a network namespace
#       trc-NAME-HOST whose processes see their own host name (a UTS namespace each) and its
#       own address in a /24 of 10.213.0.0/16 (the first one no other cluster holds); every
#       host's veth ends on a bridge in the namespace trc-NAME-sw. Nothing is routed to this
#       machine's own network: the addresses exist only inside these namespaces. Each host's
#       link is shaped both ways by tc tbf to RATE (tc units: 200mbit, 1gbit; default 1gbit;
#       `none`: unshaped); the head's is not. Ranks on one host share memory (Open MPI's vader),
#       ranks on two talk TCP over the links. With --slurm also munged and slurmctld on the head
#       and one slurmd per host (NodeName = the host's name, CPUs = K), so `srun -N 2
#       --mpi=pmix` works across the hosts.
#       The folder $TR_CLUSTER_ROOT/NAME (default /run/trcluster/NAME) holds: hostfile (Open
#       MPI's, `NAME-nI slots=K`), agent (the rsh agent that starts orted in a host), env (the
#       variables `run` sets: OMPI_MCA_* naming the agent, the hostfile and the subnet, and with
#       --slurm SLURM_CONF), mpirun.args (the same as mpirun options), hosts (name, address,
#       rate), slurm/ (its configuration, state and logs).
#   cluster.sh run NAME [--on HOST] -- COMMAND...
#       runs COMMAND on the head (or on HOST) with the env file's variables, as that host:
#       `cluster.sh run demo -- mpirun -np 4 build/trainer run ...` (the hostfile is mpirun's
#       default there), `... -- srun -N 2 -n 4 --mpi=pmix ...`, `... -- build/trainer supervise
#       --hostfile "$D/hostfile" -- mpirun -np 4 --hostfile "$D/hostfile" ...`. Its exit status
#       is COMMAND's; signals reach COMMAND itself (it replaces this script).
#   cluster.sh shape NAME HOST RATE   changes HOST's link rate (both ways); `none` unshapes it
#   cluster.sh cores NAME HOST LIST   the ranks mpirun starts on HOST from then on run on these
#       cores only (taskset's list: 0, 0-1, 0,2; `all` lifts it): a host slower than the others
#   cluster.sh cut NAME HOST          takes HOST's link down (the cable pulled at the switch)
#   cluster.sh mend NAME HOST         brings it up again
#   cluster.sh kill NAME HOST         kills every process of HOST (the host dies)
#   cluster.sh down NAME              kills every process in the cluster's namespaces (mpirun,
#       orted, ranks, Slurm's daemons), deletes the namespaces (and with them every link and
#       the bridge) and removes its files: the machine as it was. It needs only NAME, so it
#       also cleans up after a crash or a half-made `up`; a cluster with nothing left is fine.
#   cluster.sh dir NAME               prints the cluster's folder
#   cluster.sh list                   the clusters up, and leftovers of any half torn down
# Needs root, iproute2 (ip, tc), util-linux (unshare, flock); Open MPI for mpirun; slurmd,
# slurmctld, slurm-client and munge for --slurm. Bad input gets one line and exit status 2;
# a failed step one line and 1.
set -u
me="cluster.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${TR_CLUSTER_ROOT:-/run/trcluster}
slurm_ports=(6817 6818) # slurmctld, slurmd: fixed, every cluster has addresses of its own

die() { echo "$me: $*" >&2; exit 1; }  # a step that failed
bad() { echo "$me: $*" >&2; exit 2; }  # bad input: a flag, a name, a rate

check_name() {
    [[ $1 =~ ^[a-z][a-z0-9]{0,11}$ ]] ||
        bad "bad cluster name '$1': a letter, then up to 11 letters or digits"
}
ns() { echo "trc-$1-$2"; } # NAME SHORT (head, sw, n0, ...): the namespace
dir_of() { echo "$root/$1"; }
# the namespaces of NAME that exist (also those of a half-made or crashed cluster)
namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^trc-$1-" || true; }

need_root() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces): run it as root"
    local c
    for c in ip tc unshare flock; do
        command -v "$c" >/dev/null || die "needs '$c' (apt-get install iproute2 util-linux)"
    done
}

# a host's short name (head, n0 ...) from its host name NAME-head, NAME-n0 ...; bad input if
# the cluster has no such host
short_of() { # NAME HOST
    local s=${2#"$1"-}
    if [ "$s" = "$2" ] || [ -z "$(awk -v h="$2" '$1 == h' "$(dir_of "$1")/hosts")" ]; then
        bad "cluster $1 has no host '$2' (hosts: $(awk '{printf "%s ", $1}' "$(dir_of "$1")/hosts"))"
    fi
    echo "$s"
}

# run COMMAND in namespace NS as host H (a UTS namespace of its own named H). nsenter, not
# `ip netns exec`: that remounts /sys, hiding the cgroup mounts slurmd needs. No name
# resolves to a cluster's address (nothing of /etc is touched): the agent maps host names to
# namespaces, and Slurm's nodes are given their addresses
on() { # NS H COMMAND...
    local n=$1 h=$2
    shift 2
    exec nsenter --net="/run/netns/$n" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

need_up() { # NAME: the cluster's folder exists, and its namespaces
    check_name "$1"
    [ -f "$(dir_of "$1")/hosts" ] && [ -n "$(namespaces "$1")" ] ||
        bad "no cluster '$1' is up (cluster.sh up $1 --hosts N --slots K)"
}

# tc's rates: a number and bit, kbit, mbit, gbit (the bits a second); prints the bits a second
rate_bits() {
    [[ $1 =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] || return 1
    local m=1
    case ${BASH_REMATCH[2]} in kbit) m=1000 ;; mbit) m=1000000 ;; gbit) m=1000000000 ;; esac
    echo $((10#${BASH_REMATCH[1]} * m))
}
check_rate() {
    [ "$1" = none ] || rate_bits "$1" >/dev/null ||
        bad "bad rate '$1': a whole number and bit, kbit, mbit or gbit (tc's units), or none"
}

# shape one host's link both ways: its own end (what it sends) and the switch's end (what it
# receives). tbf's bucket holds 25 us at the rate, 4 KiB at least (a few 1500-byte frames):
# a real NIC sends every frame at its line rate, and so does this link. A larger bucket is
# not: with 2 ms of it (the first version), a 64 KiB message after a pause of a few ms
# crossed a 1 Gbit/s link in 0.03 ms instead of 0.5 ms, so a layout of small messages (tensor
# parallelism between hosts) ran 1.5x faster than any 1 Gbit/s network would carry it. With
# 4 KiB, messages of 16 KiB to 4 MiB cross at 0.93-1.07x the rate, with or without pauses, and
# with both cores busy (2026-12-04). A change installs a fresh tbf: `tc qdisc replace` of a tbf
# by a tbf changes it in place and keeps its queue, and a packet queued under a larger
# bucket (veth passes 64 KiB GSO packets, which tbf splits only on entry) can then never
# leave the smaller one: the link stalls for good, which ended a slowed run once in ~20 here
# ("lost communication with a remote daemon"). The fresh one drops what was queued, as a
# link that changes does; TCP sends it again.
shape_link() { # NAME SHORT RATE
    local n s r b
    n=$(ns "$1" "$2") s=$(ns "$1" sw) r=$3
    tc -n "$n" qdisc del dev eth0 root 2>/dev/null
    tc -n "$s" qdisc del dev "$2" root 2>/dev/null
    [ "$r" = none ] && return 0
    b=$(($(rate_bits "$r") / 8 / 40000))
    [ "$b" -lt 4096 ] && b=4096
    tc -n "$n" qdisc add dev eth0 root tbf rate "$r" burst "$b" latency 100ms &&
        tc -n "$s" qdisc add dev "$2" root tbf rate "$r" burst "$b" latency 100ms
}

# ---- up ------------------------------------------------------------------------------------
cmd_up() {
    local name="" hosts="" slots="" rate=1gbit slurm=0
    while [ $# -gt 0 ]; do
        case $1 in
        --hosts) hosts=${2-} && shift ;;
        --slots) slots=${2-} && shift ;;
        --rate) rate=${2-} && shift ;;
        --slurm) slurm=1 ;;
        -*) bad "up: unknown option '$1' (--hosts N --slots K [--rate RATE] [--slurm])" ;;
        *) [ -z "$name" ] || bad "up: one cluster name, not '$name' and '$1'"; name=$1 ;;
        esac
        shift
    done
    [ -n "$name" ] || bad "up: no cluster name (cluster.sh up NAME --hosts N --slots K)"
    check_name "$name"
    [[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 64 ] ||
        bad "up: --hosts '$hosts': a whole number of hosts from 1 to 64"
    [[ $slots =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] && [ "$slots" -le 64 ] ||
        bad "up: --slots '$slots': a whole number of slots per host from 1 to 64"
    check_rate "$rate"
    need_root
    if [ "$slurm" = 1 ]; then
        local c
        for c in slurmctld slurmd munged munge sinfo; do
            command -v "$c" >/dev/null ||
                die "up: --slurm needs '$c' (apt-get install slurmd slurmctld slurm-client munge)"
        done
    fi
    local d
    d=$(dir_of "$name")
    exec 9</run
    flock -w 60 9 || die "up: another cluster.sh holds the lock on /run for over 60 s"
    [ -e "$d" ] || [ -n "$(namespaces "$name")" ] &&
        bad "up: cluster '$name' is up already, or left over (cluster.sh down $name first)"
    # from here on a failure tears down what was made
    mkdir -p "$d" || die "up: cannot make the folder $d"
    trap 'echo "$me: up $name failed; tearing down what was made" >&2; cmd_down "$name" >/dev/null' EXIT
    trap 'exit 1' INT TERM HUP
    local k net
    for k in $(seq 0 255); do
        grep -qsx "10.213.$k.0/24" "$root"/*/subnet || break
    done
    net=10.213.$k
    echo "$net.0/24" >"$d/subnet"
    local sw i s addr names=(head)
    for i in $(seq 0 $((hosts - 1))); do names+=("n$i"); done
    sw=$(ns "$name" sw)
    ip netns add "$sw" && ip -n "$sw" link add name br type bridge && ip -n "$sw" link set dev br up ||
        die "up: cannot make the switch namespace $sw"
    : >"$d/hosts"
    for s in "${names[@]}"; do
        if [ "$s" = head ]; then addr=$net.254; else addr=$net.$((${s#n} + 1)); fi
        make_host "$name" "$s" "$addr" || die "up: cannot make host $name-$s (namespace $(ns "$name" "$s"))"
        local r=none
        [ "$s" = head ] || r=$rate
        shape_link "$name" "$s" "$r" || die "up: cannot shape $name-$s's link to $r (tc tbf)"
        echo "$name-$s $addr $r" >>"$d/hosts"
    done
    exec 9<&- # the daemons below must not hold the lock
    write_files "$name" "$hosts" "$slots"
    [ "$slurm" = 1 ] && { start_slurm "$name" "$hosts" "$slots" || die "up: Slurm did not start (logs in $d/slurm/log)"; }
    trap - EXIT INT TERM HUP
    echo "cluster $name: $hosts host(s) x $slots slot(s) on $net.0/24, links $rate$([ "$slurm" = 1 ] && echo ", Slurm")"
    awk '{print "  " $1 "  " $2 "  " ($3 == "none" ? "unshaped" : $3)}' "$d/hosts"
    echo "  folder $d; run jobs with: $here/cluster.sh run $name -- mpirun -np $((hosts * slots)) COMMAND"
}

make_host() { # NAME SHORT ADDR: the namespace, its veth to the bridge, the address
    local n s
    n=$(ns "$1" "$2") s=$(ns "$1" sw)
    ip netns add "$n" &&
        ip -n "$s" link add name "$2" type veth peer name eth0 netns "$n" &&
        ip -n "$s" link set dev "$2" master br &&
        ip -n "$s" link set dev "$2" up &&
        ip -n "$n" link set dev lo up &&
        ip -n "$n" addr add "$3/24" dev eth0 &&
        ip -n "$n" link set dev eth0 up
}

write_files() { # NAME HOSTS SLOTS
    local name=$1 d sub h
    d=$(dir_of "$name") sub=$(cat "$(dir_of "$name")/subnet")
    awk -v k="$3" '$1 !~ /-head$/ {print $1, "slots=" k}' "$d/hosts" >"$d/hostfile"
    {
        echo "#!/bin/sh"
        echo "# Open MPI's rsh agent for cluster $name: AGENT [-options] HOST COMMAND... runs"
        echo "# COMMAND (its words joined, as ssh does) on HOST: in its namespace, as that host"
        echo 'while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done'
        echo 'case ${1-} in'
        while read -r h _; do echo "$h) n=$(ns "$name" "${h#"$name"-}") ;;"; done <"$d/hosts"
        echo "*) echo \"$me: cluster $name has no host '\${1-}'\" >&2; exit 255 ;;"
        echo 'esac'
        echo 'h=$1; shift'
        echo "c=\$(cat \"$d/cores.\$h\" 2>/dev/null)"
        echo 'set -- nsenter --net="/run/netns/$n" unshare --uts sh -c '"'"'hostname "$0" && exec sh -c "$*"'"'"' "$h" "$@"'
        echo 'if [ -n "$c" ]; then exec taskset -c "$c" "$@"; else exec "$@"; fi'
    } >"$d/agent"
    chmod 755 "$d/agent"
    mkdir -p "$d/tmp"
    {
        echo "# the variables of a job on cluster $name (cluster.sh run sets them)"
        echo "export OMPI_MCA_plm_rsh_agent=$d/agent"
        echo "export OMPI_MCA_orte_default_hostfile=$d/hostfile"
        echo "export OMPI_MCA_oob_tcp_if_include=$sub"
        echo "export OMPI_MCA_btl_tcp_if_include=$sub"
        echo "export OMPI_MCA_btl=self,vader,tcp"
        # every host's daemon binds its own ranks, but the hosts share this machine's cores:
        # a job of one rank a host (np <= 2, where Open MPI binds to a core) had each on core
        # 0, so 2 ranks ran on one core and a 1 MiB all-reduce between them moved 55 MB/s at
        # 1 Gbit/s against 90 unbound (2026-12-06). `cores` narrows a host's ranks instead
        echo "export OMPI_MCA_hwloc_base_binding_policy=none"
        echo "export OMPI_MCA_orte_tmpdir_base=$d/tmp"
        # a host whose link is cut: its daemon's idle connection is found dead 8-10 s later
        # (the next probe within 2 s, then 4 unanswered 2 s apart; Open MPI's defaults, 300 +
        # 9 x 20 s, kept mpirun waiting for it), so mpirun ends the job itself; but only after
        # ranks with --timeout 5 have timed out (5 s and a 0.5 s census) and named the host:
        # at 2 + 3 x 1 s (3-5 s) mpirun came first and, in one CI run, killed them before
        echo "export OMPI_MCA_oob_tcp_keepalive_time=2 OMPI_MCA_oob_tcp_keepalive_intvl=2"
        echo "export OMPI_MCA_oob_tcp_keepalive_probes=4"
        echo "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
        echo "export TR_CLUSTER_DIR=$d"
    } >"$d/env"
    echo "--hostfile $d/hostfile --mca plm_rsh_agent $d/agent --mca oob_tcp_if_include $sub" \
        "--mca btl_tcp_if_include $sub --mca btl self,vader,tcp --mca orte_tmpdir_base $d/tmp" \
        "--mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 2" \
        "--mca oob_tcp_keepalive_probes 4" \
        >"$d/mpirun.args"
}

# munged and slurmctld on the head, one slurmd per host: daemons that outlive `up`, found by
# `down` in the namespaces
start_slurm() { # NAME HOSTS SLOTS
    local name=$1 d head haddr i nodes=()
    d=$(dir_of "$name") head=$(ns "$name" head)
    haddr=$(awk '$1 ~ /-head$/ {print $2}' "$d/hosts")
    . "$here/../slurm_lib.sh"
    for i in $(seq 0 $(($2 - 1))); do nodes+=("$name-n$i $(awk -v h="$name-n$i" '$1 == h {print $2}' "$d/hosts") $3"); done
    slurm_files "$d/slurm" "$name" "$name-head" "$haddr" "${slurm_ports[@]}" "${nodes[@]}" || return 1
    echo "export SLURM_CONF=$d/slurm/slurm.conf" >>"$d/env"
    export SLURM_CONF=$d/slurm/slurm.conf
    cd / || return 1 # the daemons hold no one's folder
    slurm_munged "$d/slurm" setsid nsenter --net="/run/netns/$head" || return 1
    (on "$head" "$name-head" slurmctld -D -i </dev/null >>"$d/slurm/log/slurmctld.out" 2>&1 &)
    for i in $(seq 0 $(($2 - 1))); do
        (on "$(ns "$name" "n$i")" "$name-n$i" slurmd -D -N "$name-n$i" </dev/null \
            >>"$d/slurm/log/slurmd.$name-n$i.out" 2>&1 &)
    done
    (on "$head" "$name-head" bash -c ". '$here/../slurm_lib.sh'; slurm_wait_idle $2") || {
        slurm_logs "$d/slurm" >&2
        return 1
    }
}

# ---- down ----------------------------------------------------------------------------------
cmd_down() { # NAME
    local name=$1 n p left found="" d pids
    d=$(dir_of "$name")
    # every process in the namespaces (but this one, when run on the cluster): asked to stop,
    # then (after 2 s) killed
    for sig in TERM KILL; do
        pids=""
        for n in $(namespaces "$name"); do pids+=" $(ip netns pids "$n" 2>/dev/null | grep -vx "$$" | tr '\n' ' ')"; done
        [ -n "${pids// /}" ] || break
        found=1
        kill -"$sig" $pids 2>/dev/null
        for _ in $(seq 20); do
            left=""
            for p in $pids; do kill -0 "$p" 2>/dev/null && left=1; done
            [ -z "$left" ] && break
            sleep 0.1
        done
    done
    exec 9</run
    flock -w 60 9
    for n in $(namespaces "$name"); do ip netns del "$n" || echo "$me: down: cannot delete namespace $n" >&2; found=1; done
    # (the first version of this tool wrote /etc/netns/trc-NAME-*/hosts)
    for n in /etc/netns/trc-"$name"-*; do [ -e "$n" ] && rm -rf "$n" && found=1; done
    [ -d /etc/netns ] && rmdir --ignore-fail-on-non-empty /etc/netns
    [ -e "$d" ] && rm -rf "$d" && found=1
    [ -d "$root" ] && rmdir --ignore-fail-on-non-empty "$root"
    # what `ip netns add` made of /run/netns, once no namespace is left in it
    if [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
        while mountpoint -q /run/netns; do umount /run/netns || break; done
        rmdir /run/netns 2>/dev/null
    fi
    exec 9<&-
    # Open MPI's shared-memory segments of killed ranks are named after their host
    for p in /dev/shm/*."$name"-n[0-9]*; do [ -e "$p" ] && rm -f "$p" && found=1; done
    if [ -n "$found" ]; then echo "cluster $name: down"; else echo "cluster $name: nothing left to tear down"; fi
    [ -z "$(namespaces "$name")" ] && ! [ -e "$d" ]
}

# ---- the rest ------------------------------------------------------------------------------
cmd_run() { # NAME [--on HOST] -- COMMAND...
    local name=$1 host="" s
    shift
    need_root
    need_up "$name"
    if [ "${1-}" = --on ]; then host=${2-} && shift 2; fi
    [ "${1-}" = -- ] && shift
    [ $# -gt 0 ] || bad "run: no command (cluster.sh run $name [--on HOST] -- COMMAND...)"
    [ -n "$host" ] || host=$name-head
    s=$(short_of "$name" "$host") || exit 2
    set -a
    . "$(dir_of "$name")/env"
    set +a
    on "$(ns "$name" "$s")" "$host" "$@"
}

cmd_host() { # shape|cut|mend|kill|cores NAME HOST [RATE|LIST]
    local what=$1 name=${2-} host=${3-} s
    [ -n "$name" ] && [ -n "$host" ] ||
        bad "$what: cluster.sh $what NAME HOST$([ "$what" = shape ] && echo " RATE")$([ "$what" = cores ] && echo " LIST")"
    need_root
    need_up "$name"
    s=$(short_of "$name" "$host") || exit 2
    case $what in
    shape)
        [ -n "${4-}" ] || bad "shape: no rate (cluster.sh shape NAME HOST RATE)"
        check_rate "$4"
        shape_link "$name" "$s" "$4" || die "shape: tc could not shape $host's link to $4"
        local d
        d=$(dir_of "$name")
        awk -v h="$host" -v r="$4" '$1 == h {$3 = r} {print}' "$d/hosts" >"$d/hosts.new" && mv "$d/hosts.new" "$d/hosts"
        echo "cluster $name: $host's link at $4" ;;
    cut | mend)
        local state=down
        [ "$what" = mend ] && state=up
        ip -n "$(ns "$name" sw)" link set dev "$s" "$state" || die "$what: cannot set $host's link $state"
        echo "cluster $name: $host's link $state" ;;
    cores)
        local d
        d=$(dir_of "$name")
        [ -n "${4-}" ] || bad "cores: no list (cluster.sh cores NAME HOST LIST)"
        if [ "$4" = all ]; then
            rm -f "$d/cores.$host"
        else
            [[ $4 =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] && taskset -c "$4" true 2>/dev/null ||
                bad "cores: '$4' is not a list of this machine's cores (0, 0-1, 0,2)"
            echo "$4" >"$d/cores.$host"
        fi
        echo "cluster $name: $host runs on cores $4" ;;
    kill)
        local pids
        pids=$(ip netns pids "$(ns "$name" "$s")" | tr '\n' ' ')
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        echo "cluster $name: killed $host's processes (${pids:-none})" ;;
    esac
}

cmd_list() {
    local d n
    for d in "$root"/*/; do
        [ -f "$d/hosts" ] || continue
        n=$(basename "$d")
        echo "$n: $(cat "$d/subnet"), hosts $(awk '!/-head /{printf "%s(%s) ", $1, $3}' "$d/hosts")"
    done
    ip netns list 2>/dev/null | awk '{print $1}' | grep '^trc-' | sed 's/^trc-\([^-]*\)-.*/\1/' | sort -u |
        while read -r n; do [ -f "$root/$n/hosts" ] || echo "$n: left over (cluster.sh down $n)"; done
}

cmd=${1-}
[ $# -gt 0 ] && shift
case $cmd in
up) cmd_up "$@" ;;
down)
    [ $# -eq 1 ] || bad "down: cluster.sh down NAME"
    check_name "$1"
    need_root
    cmd_down "$1" || die "down: something of cluster $1 is left (cluster.sh list)" ;;
run)
    [ $# -ge 1 ] || bad "run: cluster.sh run NAME [--on HOST] -- COMMAND..."
    cmd_run "$@" ;;
shape | cut | mend | kill | cores) cmd_host "$cmd" "$@" ;;
dir) [ $# -eq 1 ] || bad "dir: cluster.sh dir NAME"; need_up "$1"; dir_of "$1" ;;
list) cmd_list ;;
-h | --help | help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
*) bad "unknown command '${cmd}' (up, run, shape, cut, mend, kill, down, dir, list; --help)" ;;
esac
