#pragma once
// What differs between the MPI implementations meshtrain is built with (Open MPI, MPICH), in one
// place, so that the layers above see one behaviour (cmake/MeshtrainMpi.cmake picks the flavour
// and refuses a mix of two). Not a general MPI wrapper: communicators live in mpi_communicator.h.
//
//   start-up      init_mpi: the flavour's tuning in the environment, then MPI_Init_thread asking
//                 for MPI_THREAD_MULTIPLE (the progress thread); both flavours provide it.
//   node names    not MPI_Get_processor_name, which is the full host name under MPICH and the
//                 name cut at its first dot under Open MPI: node.h names nodes the same way
//                 under both.
//   ending a job  abort_job: MPI_Abort on the world; Open MPI's mpiexec, MPICH's (Hydra) and
//                 srun --mpi=pmix with Open MPI return its error code as their exit status.
//                 srun --mpi=pmi2 with MPICH does not: Slurm kills every task of the step,
//                 the aborting one included, and srun exits with 137 (measured, Slurm 22.05);
//                 the diagnosis is printed before either. The stop handlers (SIGTERM, SIGUSR1)
//                 are reset first, so that Slurm's SIGTERM ends the task at once. _Exit should
//                 MPI_Abort ever return.
//   waiting       both advance non-blocking collectives only inside MPI calls: Work::wait polls
//                 MPI_Test and yields, the progress thread calls MPI_Iprobe. A blocking call
//                 inside MPI itself (HDF5's, ROMIO's) yields the core under Open MPI when the node
//                 is oversubscribed, and spins under MPICH (ch4), which makes runs with more
//                 ranks than cores far slower under MPICH; one rank per core is unaffected.

#include <string>

namespace meshtrain {

// "openmpi" or "mpich" (the mpi.h compiled against), "mpi" for any other.
const char* mpi_flavour();

// The library's version in one line ("Open MPI v4.1.4", "MPICH Version: 4.0.2"); needs MPI.
std::string mpi_library_version();

// Initialises MPI if nobody has (the flavour's environment first, a value the user set wins);
// returns the thread level provided.
int init_mpi(int* argc, char*** argv);

// Ends every rank of the job with `exit_status` (comm/job_abort.h says when).
[[noreturn]] void abort_job(int exit_status);

}  // namespace meshtrain
