#pragma once
// This launch, as config/launch_shape.h describes one: measured by calibrate into the machine
// profile, and at `train` start-up compared with the profile's (a prediction holds for the
// launch it was calibrated under).

#include <string>

#include "meshtrain/config/launch_shape.h"

namespace meshtrain {

// Whether this rank's MPI library sleeps ("yield") or polls ("spin") while it waits: Open MPI's
// mpi_yield_when_idle as the library resolved it (read through the MPI tool interface, so the
// value Open MPI turns on by itself for an oversubscribed node counts), "spin" for other
// libraries (MPICH and its derivatives poll by default), "" when Open MPI does not say.
std::string mpi_idle_ranks();

// Collective over the node: this launch with `threads` threads per rank: the node's ranks and
// usable cores (cpu_binding.h), this rank's bound cores, and mpi_idle_ranks().
LaunchShape current_launch(int threads);

}  // namespace meshtrain
