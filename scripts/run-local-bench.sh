#!/usr/bin/env bash
# Runs a multi-rank benchmark suite on local ranks: scripts/run-local-bench.sh RANKS SUITE [ARGS]
set -euo pipefail
ranks=${1:?usage: run-local-bench.sh RANKS SUITE [ARGS...]}
suite=${2:?usage: run-local-bench.sh RANKS SUITE [ARGS...]}
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${MESHTRAIN_BIN:-$here/build/meshtrain}
# The launcher of the MPI the binary links (`make MPI=mpich` builds against MPICH).
mpiexec=${MESHTRAIN_MPIEXEC:-mpiexec}
if [[ -z ${MESHTRAIN_MPIEXEC:-} ]] && ldd "$bin" 2>/dev/null | grep -q 'libmpich\.so'; then
  mpiexec=mpiexec.mpich
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
exec "$mpiexec" -n "$ranks" "$bin" bench --suite "$suite" "$@"
