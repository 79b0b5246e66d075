#!/usr/bin/env bash
# Runs a multi-rank benchmark suite on local ranks: scripts/run-local-bench.sh RANKS SUITE [ARGS]
set -euo pipefail
ranks=${1:?usage: run-local-bench.sh RANKS SUITE [ARGS...]}
suite=${2:?usage: run-local-bench.sh RANKS SUITE [ARGS...]}
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${MESHTRAIN_BIN:-$here/build/meshtrain}
# shellcheck source=scripts/mpi-launcher.sh
source "$here/scripts/mpi-launcher.sh"
exec "$mpiexec" -n "$ranks" "$bin" bench --suite "$suite" "$@"
