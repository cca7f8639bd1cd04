#!/usr/bin/env bash
# A Slurm on localhost for the test suite (Debian's slurm-wlm + munge), run as root.
#
# Idempotent: when a controller already answers and the nodes are up it returns at once.
# Otherwise it installs the packages if missing (apt-get), writes a munge key and a
# slurm.conf for this machine, and starts munged, slurmctld and two slurmd as daemons
# (no systemd). The two slurmd are two Slurm nodes on this one host (musubi1, musubi2:
# NodeHostname this machine, their own ports), so multi-node jobs run for real; each
# claims the machine's CPUs (at least 4 slots, so small jobs run side by side) and
# half of 90 % of its memory.
# State lives under /var/spool/musubi-slurm; logs under /var/log/musubi-slurm.
# Exit 0 when Slurm takes jobs; non-zero with one line on stderr when it cannot.
set -euo pipefail

STATE=/var/spool/musubi-slurm
LOGS=/var/log/musubi-slurm
CONF=/etc/slurm/slurm.conf
say() { echo "start_slurm: $*" >&2; }
# Alive per its pid file (a minimal Debian has no pgrep).
running() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

NODES="musubi1 musubi2"
node_up() {
    scontrol ping 2>/dev/null | grep -q "is UP" || return 1
    local st
    for n in $NODES; do
        st=$(sinfo -h -n "$n" -o %t 2>/dev/null | head -n1)
        [[ "$st" == idle* || "$st" == mix* || "$st" == alloc* ]] || return 1
    done
}

if command -v scontrol >/dev/null 2>&1 && node_up; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    say "must run as root to install and start Slurm (it is not running here)"; exit 3
fi
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
        || ! command -v munged >/dev/null 2>&1 || ! command -v sbatch >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || { say "no apt-get: install slurm-wlm and munge by hand"; exit 3; }
    export DEBIAN_FRONTEND=noninteractive
    # Package scripts must not try to start services (there is no init system in CI).
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
        || { rm -f /usr/sbin/policy-rc.d; say "apt-get install slurm-wlm munge failed"; exit 3; }
    rm -f /usr/sbin/policy-rc.d
fi

mkdir -p "$STATE/ctld" "$LOGS" /etc/slurm /run/munge /var/lib/munge /var/log/munge /etc/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
if ! running /run/munge/munged.pid; then
    runuser -u munge -- /usr/sbin/munged
fi

host=$(hostname -s)
cpus=$(nproc)
slots=$(( cpus < 4 ? 4 : cpus ))
mem_mib=$(awk '/MemTotal/ {print int($2 / 1024 * 0.45)}' /proc/meminfo)
cat > "$CONF" <<EOF
# Written by musubi's tests/slurm/start_slurm.sh: one node, this machine.
ClusterName=musubi
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d-%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/none
# Every job end is written here (the tests read it: there is no accounting database for sacct).
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.txt
MpiDefault=none
ReturnToService=2
# Keep ended jobs visible to scontrol for 30 min (there is no accounting database).
MinJobAge=1800
KillWait=2
# Each node claims $slots CPU slots on this machine's $cpus cores: small CPU test jobs run side by side.
SlurmdParameters=config_overrides
NodeName=musubi1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17011 CPUs=$slots RealMemory=$mem_mib State=UNKNOWN
NodeName=musubi2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17012 CPUs=$slots RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=musubi1,musubi2 Default=YES MaxTime=INFINITE State=UP
EOF

if ! running "$STATE/slurmctld.pid"; then
    /usr/sbin/slurmctld -c >>"$LOGS/start.log" 2>&1 || true
fi
for n in $NODES; do
    mkdir -p "$STATE/d-$n"
    if ! running "$STATE/slurmd-$n.pid"; then
        /usr/sbin/slurmd -N "$n" >>"$LOGS/start.log" 2>&1 || true
    fi
done
for _ in $(seq 1 60); do
    if node_up; then
        exit 0
    fi
    # A node left DOWN by an earlier run comes back once the daemons answer.
    for n in $NODES; do scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true; done
    sleep 0.5
done
say "Slurm did not come up within 30 s; see $LOGS/slurmctld.log and $LOGS/slurmd-musubi1.log"
exit 4
