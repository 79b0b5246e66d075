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

# shellcheck source=scripts/mpi-launcher.sh
source "$here/scripts/mpi-launcher.sh"
exec "$mpiexec" -n "$ranks" "$bin" train "$deck" "$@"
