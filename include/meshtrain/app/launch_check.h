#pragma once
// Every rank of a job must run the same meshtrain build on the same deck with the same --set
// overrides. Rank 0 reads the deck and hands its text to everyone, but the overrides, the deck's
// name and the binary are each rank's own: an MPMD launch ("mpiexec -n 4 meshtrain ... : -n 4
// meshtrain ... --set x=y") or a stale build on one node would otherwise train divergent
// replicas with exit 0, or die deep inside a collective whose shapes differ.

#include <string>
#include <vector>

#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/comm/communicator.h"

namespace meshtrain {

// Collective over `world`. Throws AgreedError on every rank when any rank differs from rank 0,
// naming the first such rank and the first thing that differs (the build, the deck name, or
// the first differing --set override).
void check_same_launch(Communicator& world, const std::string& deck,
                       const std::vector<std::string>& overrides);

// A launcher of another MPI than the one this binary links starts every process as a singleton:
// N copies of a one-rank job, each refusing the deck's layout with "does not match the 1 ranks"
// (or, with dp = "auto", N independent runs writing the same files). Where this process is alone
// in MPI_COMM_WORLD but its launcher says it started more (Open MPI's OMPI_COMM_WORLD_SIZE,
// Hydra's PMI_SIZE, srun's SLURM_STEP_NUM_TASKS), returns the message that says so and how to
// launch instead; otherwise "". `mpi_library` is mpi_library_version()'s line.
std::string foreign_launcher_problem(int world_size, Launcher launcher, const EnvLookup& env,
                                     const std::string& mpi_library);

// This process, in a world of `world_size` ranks: throws AgreedError with
// foreign_launcher_problem's message. Needs no collective (a singleton is its whole job), so every
// process of the launch stops with the same message.
void check_launcher_world(int world_size);

}  // namespace meshtrain
