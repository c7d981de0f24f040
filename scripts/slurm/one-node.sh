#!/bin/bash
# A one-node Slurm cluster on this host, from Debian's packages, for trying out
# scripts/slurm/hpcai500.sbatch (and tests/test_slurm.py) without a real cluster.
#
#   sudo scripts/slurm/one-node.sh          # install if needed, configure, start; idempotent
#   sudo scripts/slurm/one-node.sh status   # what runs, sinfo
#   sudo scripts/slurm/one-node.sh stop     # stop slurmd, slurmctld and munged (by their pid files)
#
# Then, from the repository (the venv made by `make venv`):
#   sbatch --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
#          scripts/slurm/hpcai500.sbatch my.dat
#
# The packages (Slurm 22.05, MUNGE, PMIx) come from install.sh beside this script. Root
# is needed (packages, /etc/slurm, the daemons). No systemd is assumed: the daemons
# are started directly, so this also works in a container. A slurm.conf this script
# did not write is never overwritten.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by hpcai500 scripts/slurm/one-node.sh"
STATE=/var/spool/slurmctld SPOOL=/var/spool/slurmd LOGS=/var/log/slurm
CTLD_PID=/run/slurmctld.pid SLURMD_PID=/run/slurmd.pid MUNGE_PID=/run/munge/munged.pid

die() { echo "one-node.sh: $*" >&2; exit 1; }
alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pid() {   # stop the daemon whose pid file is $1, by that pid only
    if alive "$1"; then
        local pid; pid=$(cat "$1")
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        echo "stopped $2 (pid $pid)"
    fi
    rm -f "$1"
}

install() { "$(dirname "$0")/install.sh"; }   # the packages, once

configure() {
    [[ -e $CONF ]] && ! grep -qxF "$MARK" "$CONF" && die "$CONF exists and was not written by this script; not touching it"
    local host node
    host=$(hostname -s)
    node=$(slurmd -C | head -1)          # NodeName=<host> CPUs=... RealMemory=... as slurmd sees them
    mkdir -p "$STATE" "$SPOOL" "$LOGS"
    cat > "$CONF.new" <<EOF
$MARK
ClusterName=hpcai500
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    if cmp -s "$CONF.new" "$CONF"; then rm "$CONF.new"; return 1; fi
    mv "$CONF.new" "$CONF"
    echo "wrote $CONF"
}

start() {
    install
    local changed=0
    configure && changed=1
    if ! alive "$MUNGE_PID"; then
        mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
        [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing (the munge package creates it)"
        runuser -u munge -- /usr/sbin/munged
        echo "started munged"
    fi
    if ((changed)); then        # a new slurm.conf: restart what runs with the old one
        stop_pid "$SLURMD_PID" slurmd
        stop_pid "$CTLD_PID" slurmctld
    fi
    alive "$CTLD_PID" || { slurmctld; echo "started slurmctld"; }
    alive "$SLURMD_PID" || { slurmd; echo "started slurmd"; }
    local host state
    host=$(hostname -s)
    for _ in $(seq 60); do
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
        case $state in
            idle*|mixed*|allocated*) sinfo; return 0 ;;
            down*|drain*) scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 1
    done
    sinfo || true
    die "node $host did not come up (state '${state:-none}'); see $LOGS/slurmctld.log and $LOGS/slurmd.log"
}

stop() {
    stop_pid "$SLURMD_PID" slurmd
    stop_pid "$CTLD_PID" slurmctld
    stop_pid "$MUNGE_PID" munged
}

status() {
    for d in "munged:$MUNGE_PID" "slurmctld:$CTLD_PID" "slurmd:$SLURMD_PID"; do
        alive "${d#*:}" && echo "${d%%:*} running (pid $(cat "${d#*:}"))" || echo "${d%%:*} not running"
    done
    sinfo 2>/dev/null || true
}

[[ $(id -u) -eq 0 ]] || die "run as root (packages, /etc/slurm, daemons)"
case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac
