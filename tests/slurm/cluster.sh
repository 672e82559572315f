#!/usr/bin/env bash
# A throw-away single-node SLURM cluster on this machine, for the live tests.
#
#   tests/slurm/cluster.sh install      # apt-get install slurm-wlm munge (if missing; root)
#   tests/slurm/cluster.sh start DIR    # write DIR/slurm.conf, start munged, slurmctld, slurmd
#   tests/slurm/cluster.sh stop DIR     # stop the daemons started by `start DIR`
#
# After `start`, client commands (sbatch, squeue, srun) need SLURM_CONF=DIR/slurm.conf;
# `start` prints that line. Everything the cluster writes (state, spool, logs) stays in
# DIR; nothing under /etc is changed except the munge key that the munge package creates.
#
# The node is this machine with its real CPUs and memory and two stand-in GPUs (gres
# gpu:2 on /dev/null), so that the profile's GPU requests (--gpus=1) are scheduled and
# allocated as on a GPU cluster (CUDA_VISIBLE_DEVICES is set); the jobs compute on the
# CPU. Partitions (EnforcePartLimits=ALL: a request over a limit is refused at sbatch):
# `short` (default, MaxTime $SHORT_MINUTES min) runs the test workflow; `long48`
# (MaxTime 48 h, DOWN: accepts jobs, starts none) adds a never-started 32-CPU, 4-GPU node
# for the check that every job of config/config.yaml is accepted (tests/test_slurm.py). No cgroups, no accounting database: job status comes from squeue (MinJobAge keeps
# finished jobs visible long enough). Jobs are killed 10 s after their time limit's
# SIGTERM (OverTimeLimit=0, KillWait=10).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

# SLURM's default ports, written into slurm.conf; start() waits until they are free.
SLURMCTLD_PORT=6817
SLURMD_PORT=6818
# MaxTime (minutes) of the partition `short`: cluster.max_job_minutes of
# config/slurm_test.yaml (tests/test_slurm.py checks that they agree).
SHORT_MINUTES=6
# The stand-in production GPU node of the partition long48: CPUs, memory (MB).
BIG_CPUS=32
BIG_MEM_MB=256000

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    if ((${#missing[@]})); then
        [[ $(id -u) == 0 ]] || die "run as root to install ${missing[*]}"
        echo "installing slurm-wlm munge (missing: ${missing[*]})"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
    fi
}

start_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        install -d -o munge -g munge -m 0700 /etc/munge
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return # a munged is already running (the machine's own, or ours from before)
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$1/munged.ours" # stop it again with the cluster
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.2
    done
    die "munged did not start"
}

write_config() {
    local dir=$1 node cpus mem
    node=$(hostname -s)
    # The node's real CPUs and memory, as slurmd itself measures them.
    cpus=$(slurmd -C | sed -n 's/.* CPUs=\([0-9]*\).*/\1/p')
    mem=$(slurmd -C | sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p')
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm/cluster.sh: a single-node test cluster on $node.
ClusterName=dpsinkhorn
# Configless: slurmd fetches this file from slurmctld and caches it under
# /run/slurm/conf, where client commands look when SLURM_CONF is unset (as it is for
# the srun that the slurm executor runs inside each job).
SlurmctldParameters=enable_configless
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
GresTypes=gpu
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Finished jobs stay in squeue for 2 h: the slurm executor polls at most every 3 min, and
# tests/test_slurm.py reads every job of the workflow (scontrol) once it has finished, which
# on a loaded 2-core machine took over 17 min (jobs older than MinJobAge are forgotten).
MinJobAge=7200
# Time limits: SIGTERM at the limit, SIGKILL 10 s later.
OverTimeLimit=0
KillWait=10
# A requeued job (preemption) may start again after cred_expire + 1 s (default 121 s).
AuthInfo=cred_expire=30
InactiveLimit=0
ReturnToService=2
# A job that asks for more than its partition allows (time, CPUs, memory, GPUs) is
# refused at submission, not left pending forever.
EnforcePartLimits=ALL
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
# A GPU node of the size a production cluster has. It never runs anything (no slurmd;
# State=FUTURE: slurmctld does not wait for it), but counts for what long48 can accept.
NodeName=gpunode NodeAddr=127.0.0.2 CPUs=$BIG_CPUS RealMemory=$BIG_MEM_MB Gres=gpu:4 State=FUTURE
# short: the test workflow's jobs (config/slurm_test.yaml asks for at most $SHORT_MINUTES min).
PartitionName=short Nodes=$node Default=YES MaxTime=$SHORT_MINUTES State=UP
# long48: a 48 h partition for the acceptance check of config/config.yaml's jobs; DOWN,
# so its jobs are accepted (or refused) at submission but never start.
PartitionName=long48 Nodes=$node,gpunode MaxTime=2-00:00:00 State=DOWN
EOF
    # Two stand-in GPU device files (SLURM wants character devices: /dev/null will do).
    mkdir -p "$dir/dev"
    ln -sfn /dev/null "$dir/dev/gpu0"
    ln -sfn /dev/null "$dir/dev/gpu1"
    cat >"$dir/gres.conf" <<EOF
AutoDetect=off
NodeName=$node Name=gpu File=$dir/dev/gpu[0-1]
EOF
    echo "# No cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none)." \
        >"$dir/cgroup.conf"
}

start() {
    local dir=$1
    [[ $(id -u) == 0 ]] || die "the test cluster runs as root"
    # Client commands without SLURM_CONF (the srun inside each job) would read this file
    # instead of our configless cache, and talk to another cluster.
    [[ ! -e /etc/slurm/slurm.conf ]] || die "/etc/slurm/slurm.conf exists: not a bare machine"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    stop "$dir" 2>/dev/null || true
    write_config "$dir"
    start_munge "$dir"
    export SLURM_CONF=$dir/slurm.conf
    # A cluster stopped a moment ago (a previous run) may still hold slurmctld's and slurmd's
    # ports: our slurmctld would fail to bind, and scontrol would answer from the old one.
    local port
    for port in $SLURMCTLD_PORT $SLURMD_PORT; do
        for _ in $(seq 120); do
            listening "$port" || break
            sleep 0.5
        done
        ! listening "$port" || die "port $port is in use (another slurmctld or slurmd?)"
    done
    slurmctld -c -f "$SLURM_CONF"
    local up=""
    for _ in $(seq 60); do # slurmd fetches its configuration from slurmctld
        # (ours: its pid file names a live process)
        if [[ -s $dir/slurmctld.pid ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
            scontrol ping 2>/dev/null | grep -q UP && up=1 && break
        fi
        sleep 0.5
    done
    if [[ -z $up ]]; then
        tail -n 20 "$dir/log/slurmctld.log" >&2 || true
        die "slurmctld did not start"
    fi
    slurmd --conf-server 127.0.0.1
    local state=""
    for _ in $(seq 120); do
        state=$(sinfo -h -p short -n "$(hostname -s)" -o %t 2>/dev/null || true)
        [[ $state == idle ]] && break
        [[ $state == *inval* || $state == *drain* ]] && break
        sleep 0.5
    done
    if [[ $state != idle ]]; then
        scontrol show node >&2 || true
        tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
        die "node not idle (state: '${state:-none}')"
    fi
    echo "SLURM_CONF=$SLURM_CONF"
}

stop_pidfile() {
    local pidfile=$1 pid
    [[ -s $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
}

# Whether something listens on 127.0.0.1:PORT (bash's /dev/tcp: a connect).
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

stop() {
    local dir=$1
    [[ -d $dir ]] || return 0
    dir=$(cd "$dir" && pwd)
    # Cancel what is left, so that no job step outlives the cluster.
    # (slurmstepd runs a job's processes and outlives slurmd: wait until they are gone.)
    if [[ -s $dir/slurmctld.pid ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
        export SLURM_CONF=$dir/slurm.conf
        scancel --user root 2>/dev/null || true
        for _ in $(seq 60); do
            [[ -z $(squeue -h -t RUNNING,COMPLETING,SUSPENDED -o %i 2>/dev/null) ]] && break
            sleep 0.5
        done
    fi
    stop_pidfile "$dir/slurmd.pid"
    stop_pidfile "$dir/slurmctld.pid"
    if [[ -e $dir/munged.ours ]]; then
        stop_pidfile /run/munge/munged.pid
        rm -f "$dir/munged.ours"
    fi
    # slurmd's configless cache link (see slurm.conf), if it points into DIR.
    if [[ -L /run/slurm/conf && $(readlink -f /run/slurm/conf) == "$dir"/* ]]; then
        rm -f /run/slurm/conf
    fi
}

case ${1:-} in
install) install_packages ;;
start) start "${2:?DIR}" ;;
stop) stop "${2:?DIR}" ;;
*) die "usage: $0 install | start DIR | stop DIR" ;;
esac
