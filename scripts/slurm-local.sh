#!/usr/bin/env bash
# A Slurm cluster on this one machine, for the tests of jobs/ and for trying the job scripts on a
# workstation:
#
#   scripts/slurm-local.sh start DIR [--nodes N]  # writes DIR/slurm.conf, starts munged,
#                                                 # slurmctld and one slurmd per node
#   export SLURM_CONF=DIR/slurm.conf              # then sbatch, srun, squeue, scancel talk to it
#   sbatch --nodes=4 --ntasks-per-node=2 jobs/multi-node.sbatch input/default.toml
#   scripts/slurm-local.sh stop DIR               # stops every daemon that `start` started
#
# One node (the default) is this host under its own name. With --nodes N > 1 the cluster emulates
# N nodes n1 ... nN: one slurmd per node, all on this host (`slurmd -N n1`, each node its own
# NodeName, NodeHostname = this host and its own Port). Each emulated node has its own spool,
# pid file, log and TmpFS (the PMIx plugin keeps its per-step directories there; shared, they
# collide), and a TaskProlog sets two Open MPI parameters for every task: no shared-memory
# transport (OMPI_MCA_btl=self,tcp; ranks of different emulated nodes share a hostname, so
# vader's segment names collide and ranks crash in mca_btl_vader_poll_handle_frag), and waiting
# ranks yield their core (OMPI_MCA_mpi_yield_when_idle=1; under srun Open MPI cannot tell that
# the nodes' ranks share this host's cores, and busy-polling ranks starve the others: a
# collective checkpoint write took 90 s instead of 15 on 8 ranks and 2 cores). DIR/mpi.conf
# chooses the PMIx plugin's ring fence (see below). Every task sees its node's name in
# SLURMD_NODENAME, which is what meshtrain takes as the node (its hostname is the same on all).
# Jobs start with `srun --mpi=pmix` as on a real cluster.
#
# Loopback only, no cgroups (proctrack/linuxproc, task/none), MpiDefault=pmix, and
# SlurmdParameters=config_overrides so a node may declare more CPUs than it has (ranks
# oversubscribe the cores, as in tests; SLURM_LOCAL_CPUS per node, 16 by default). Needs root
# (daemons) and the Debian packages slurm-wlm and munge.
set -euo pipefail
usage="usage: slurm-local.sh start DIR [--nodes N] | stop DIR"
cmd=${1:?$usage}
dir=${2:?$usage}
shift 2
nodes=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) nodes=${2:?$usage}; shift 2 ;;
    --nodes=*) nodes=${1#--nodes=}; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[[ $nodes =~ ^[1-9][0-9]*$ ]] || { echo "slurm-local.sh: --nodes $nodes: expected a count >= 1" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# Every pid file `start` wrote: each slurmd's (slurmd.pid or slurmd-<node>.pid), slurmctld's and
# munged's, in that order (munged last: the others authenticate through it while stopping).
stop() {
  local pidfile pid
  for pidfile in "$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [[ -f $pidfile ]] || continue
    pid=$(cat "$pidfile")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
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
[[ $cmd == start ]] || { echo "$usage" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "slurm-local.sh: the daemons need root" >&2; exit 1; }
stop  # a previous harness in this directory
rm -f "$dir/mpi.conf" "$dir/task-prolog.sh"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
host=$(hostname -s)
cpus=${SLURM_LOCAL_CPUS:-16}
mkdir -p "$dir/state" "$dir/munge"

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

if [[ $nodes -eq 1 ]]; then
  names=("$host")
  per_node=""
  node_lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus Port=$(free_port) State=UNKNOWN"
  mkdir -p "$dir/spool" "$dir/tmp"
  daemon_files="SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/slurmd.log
TmpFS=$dir/tmp"
else
  names=()
  node_lines=""
  for i in $(seq "$nodes"); do
    names+=("n$i")
    node_lines+="NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$cpus State=UNKNOWN"$'\n'
    mkdir -p "$dir/spool/n$i" "$dir/tmp/n$i"
  done
  # %n is the node's name: each slurmd its own directories and files.
  daemon_files="SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/slurmd-%n.log
TmpFS=$dir/tmp/%n"
  # Lines "export NAME=value" a TaskProlog prints become the task's environment.
  cat > "$dir/task-prolog.sh" <<'PROLOG'
#!/bin/sh
# Emulated nodes share one host: no shared-memory transport between Open MPI ranks (their
# segments would collide), and ranks that wait yield the host's cores to the others.
echo "export OMPI_MCA_btl=self,tcp"
echo "export OMPI_MCA_mpi_yield_when_idle=1"
PROLOG
  chmod 755 "$dir/task-prolog.sh"
  per_node="TaskProlog=$dir/task-prolog.sh"
  # The PMIx plugin's fences let an emulated node's ranks leave MPI_Init before every other
  # node's ranks got there: their first message then reaches a rank whose Open MPI has not
  # registered its receive handlers yet, which crashes (SIGSEGV in mca_btl_tcp calling the null
  # handler of tag 65; a core dump shows it inside MPI_Init, in opal_progress). Measured on
  # 4 nodes x 2 tasks: the default "mixed" fence about 1 job in 6 on a busy host, "tree" 3 in 28
  # (and 1 in 40 with PMIxDirectConn=false), "ring" 0 in 54.
  printf 'PMIxCollFence=ring\n' > "$dir/mpi.conf"
fi

cat > "$dir/slurm.conf" <<CONF
ClusterName=meshtrain-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
$daemon_files
$per_node
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
$node_lines
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
/usr/sbin/slurmctld -f "$SLURM_CONF"
for name in "${names[@]}"; do
  /usr/sbin/slurmd -f "$SLURM_CONF" -N "$name"
done
for _ in $(seq 200); do
  if [[ $(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l) -eq $nodes ]]; then
    echo "slurm-local: up, $nodes node(s) ${names[*]} (SLURM_CONF=$SLURM_CONF)"
    exit 0
  fi
  sleep 0.1
done
echo "slurm-local: the nodes did not come up; logs in $dir" >&2
sinfo -N >&2 || true
tail -5 "$dir"/slurmctld.log "$dir"/slurmd*.log >&2 || true
stop
exit 1
