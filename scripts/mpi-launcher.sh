# Sourced by scripts/run-local.sh and scripts/run-local-bench.sh: sets `mpiexec` to the launcher
# of the MPI that "$bin" links (`make MPI=mpich` builds against MPICH), and the Open MPI variables
# a local run needs. MESHTRAIN_MPIEXEC overrides the choice.
#
# ldd's output is captured whole before it is matched: `ldd | grep -q` under `set -o pipefail`
# fails whenever grep exits on its match while ldd is still writing (SIGPIPE), and the MPICH
# binary was then started by Open MPI's mpiexec as N singletons of one rank each (seen in CI on a
# loaded machine; 28 of 300 tries here with the cores busy).
mpiexec=${MESHTRAIN_MPIEXEC:-mpiexec}
if [[ -z ${MESHTRAIN_MPIEXEC:-} ]]; then
  linked=$(ldd "$bin" 2>/dev/null || true)
  if [[ $linked == *libmpich.so* ]]; then
    mpiexec=mpiexec.mpich
  fi
fi
# Open MPI: allow root (containers, CI), ranks outnumbering cores, and no binding (each rank
# places its own threads). MPICH ignores these variables and needs none of them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
