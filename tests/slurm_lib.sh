# Sourced by what runs a private Slurm cluster: tests/slurm.sh (one node on this machine) and
# tests/cluster/cluster.sh (one slurmd per host of a cluster in a box). Everything lives in
# one folder: slurm.conf, mpi.conf, the munge key and socket, state, spool, logs.
#
#   slurm_files DIR NAME CTL_HOST CTL_ADDR CTL_PORT D_PORT NODE...
#                      writes DIR/slurm.conf (cluster NAME, slurmctld on CTL_HOST at CTL_ADDR)
#                      and DIR/mpi.conf; each NODE is "name addr cpus", all in one partition
#   slurm_munged DIR [LAUNCHER...]
#                      starts munged (LAUNCHER munged ...: e.g. entering a namespace) in the
#                      background with DIR's key and socket: its pid in slurm_pid; returns 1
#                      when it does not answer within 10 s
#   slurm_wait_idle N  waits (30 s at most) for N idle nodes; returns 1 otherwise
#   slurm_logs DIR     the tail of every log, for a failure's report

slurm_files() {
    local d=$1 name=$2 chost=$3 caddr=$4 cport=$5 dport=$6 n names=()
    shift 6
    mkdir -p "$d/state" "$d/spool" "$d/log" "$d/pmix" "$d/tmpfs" "$d/munge" || return 1
    chmod 755 "$d" # munged wants its socket's folder searchable
    head -c 1024 /dev/urandom >"$d/munge/munge.key" && chmod 600 "$d/munge/munge.key" || return 1
    cat >"$d/slurm.conf" <<EOF
ClusterName=$name
SlurmctldHost=$chost($caddr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$cport
SlurmdPort=$dport
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.sock
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
TmpFS=$d/tmpfs
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
EOF
    for n in "$@"; do
        set -- $n
        echo "NodeName=$1 NodeAddr=$2 CPUs=$3 State=UNKNOWN" >>"$d/slurm.conf"
        names+=("$1")
    done
    local IFS=,
    echo "PartitionName=debug Nodes=${names[*]} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4" \
        >>"$d/slurm.conf"
    # read from the folder of slurm.conf: keeps the PMIx client's scratch folders in DIR
    echo "PMIxCliTmpDirBase=$d/pmix" >"$d/mpi.conf"
}

slurm_munged() {
    local d=$1
    shift
    "$@" munged -F --force --key-file="$d/munge/munge.key" --socket="$d/munge/munge.sock" \
        --pid-file="$d/munge/munged.pid" --seed-file="$d/munge/seed" \
        --log-file="$d/log/munged.log" </dev/null >>"$d/log/munged.out" 2>&1 &
    slurm_pid=$!
    for _ in $(seq 50); do munge -S "$d/munge/munge.sock" -n >/dev/null 2>&1 && return 0; sleep 0.2; done
    return 1
}

slurm_wait_idle() {
    local n=$1 idle=""
    for _ in $(seq 60); do
        idle=$(timeout 5 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
        [ "$idle" -ge "$n" ] && return 0
        sleep 0.5
    done
    return 1
}

slurm_logs() { local f; for f in "$1"/log/*.log; do echo "--- $f"; tail -8 "$f"; done; }
