#!/usr/bin/env bash
# A single-node Slurm on this machine, for the tests of jobs/ and for trying the job scripts:
#
#   scripts/slurm-local.sh start DIR   # writes DIR/slurm.conf, starts munged, slurmctld, slurmd
#   scripts/slurm-local.sh stop DIR    # stops every daemon that `start` started
#   export SLURM_CONF=DIR/slurm.conf   # then sbatch, srun, squeue, scancel talk to it
#
# Loopback only, no cgroups (proctrack/linuxproc, task/none), MpiDefault=pmix, and
# SlurmdParameters=config_overrides so the node may declare more CPUs than it has (ranks
# oversubscribe the cores, as in tests). Needs root (daemons) and the Debian packages slurm-wlm
# and munge.
set -euo pipefail
cmd=${1:?usage: slurm-local.sh start|stop DIR}
dir=${2:?usage: slurm-local.sh start|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [[ -f $pidfile ]] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
}

if [[ $cmd == stop ]]; then
  stop
  exit 0
fi
[[ $cmd == start ]] || { echo "usage: slurm-local.sh start|stop DIR" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "slurm-local.sh: the daemons need root" >&2; exit 1; }
stop  # a previous harness in this directory

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
host=$(hostname -s)
cpus=${SLURM_LOCAL_CPUS:-16}
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"

# A private munged (its own socket and key), so an existing munge service is left alone. It runs
# as root (--force): the directory may be private to root (a test's mkdtemp).
key="$dir/munge/munge.key"
[[ -f $key ]] || dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
chmod 700 "$dir/munge"; chmod 400 "$key"
socket="$dir/munge/munge.socket"
/usr/sbin/munged --key-file="$key" --socket="$socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed" --force
cp "$dir/munge/munged.pid" "$dir/munged.pid"

cat > "$dir/slurm.conf" <<CONF
ClusterName=meshtrain-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
/usr/sbin/slurmctld -f "$SLURM_CONF"
/usr/sbin/slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
  if sinfo -h -o %T 2>/dev/null | grep -q idle; then
    echo "slurm-local: up (SLURM_CONF=$SLURM_CONF)"
    exit 0
  fi
  sleep 0.1
done
echo "slurm-local: the node did not come up; logs in $dir" >&2
tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
