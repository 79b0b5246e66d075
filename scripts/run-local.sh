#!/usr/bin/env bash
# Runs meshtrain on this machine's local MPI ranks: scripts/run-local.sh RANKS DECK [ARGS...]
# More ranks than cores is fine (oversubscription); each rank then gets its share of the cores
# as kernel threads. On a cluster, use the Slurm jobs in jobs/ instead.
set -euo pipefail
ranks=${1:?usage: scripts/run-local.sh RANKS DECK [ARGS...]}
deck=${2:?usage: scripts/run-local.sh RANKS DECK [ARGS...]}
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${MESHTRAIN_BIN:-$here/build/meshtrain}

# The launcher of the MPI the binary links (`make MPI=mpich` builds against MPICH).
mpiexec=${MESHTRAIN_MPIEXEC:-mpiexec}
if [[ -z ${MESHTRAIN_MPIEXEC:-} ]] && ldd "$bin" 2>/dev/null | grep -q 'libmpich\.so'; then
  mpiexec=mpiexec.mpich
fi
# Open MPI: allow root (containers, CI), ranks outnumbering cores, and no binding (each rank
# places its own threads). MPICH ignores these variables and needs none of them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
exec "$mpiexec" -n "$ranks" "$bin" train "$deck" "$@"
