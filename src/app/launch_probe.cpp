#include "meshtrain/app/launch_probe.h"

#include <mpi.h>

#include <cstdint>
#include <string>

#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/comm/node.h"

namespace meshtrain {

namespace {

bool is_open_mpi() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  return std::string(version, static_cast<size_t>(length)).find("Open MPI") != std::string::npos;
}

}  // namespace

std::string mpi_idle_ranks() {
  if (!is_open_mpi()) return "spin";
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return "";
  std::string out;
  int index = 0;
  if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    // A bool variable is an MPI_INT; the buffer is wider so that no type can overrun it.
    int64_t value[4] = {};
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      if (count == 1 && MPI_T_cvar_read(handle, value) == MPI_SUCCESS) out = value[0] != 0 ? "yield" : "spin";
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return out;
}

LaunchShape current_launch(int threads) {
  LaunchShape l;
  // As calibrate counts them (bench_calibrate.cpp), so that equal launches compare equal.
  MPI_Comm node = split_by_node(MPI_COMM_WORLD);
  MPI_Comm_size(node, &l.ranks_per_node);
  l.cores_per_node = node_usable_cores(node);
  MPI_Comm_free(&node);
  l.threads_per_rank = threads;
  l.cores_per_rank = static_cast<int>(probe_rank_cpus().bound.size());
  l.idle_ranks = mpi_idle_ranks();
  return l;
}

}  // namespace meshtrain
