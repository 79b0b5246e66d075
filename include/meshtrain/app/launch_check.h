#pragma once
// Every rank of a job must run the same meshtrain build on the same deck with the same --set
// overrides. Rank 0 reads the deck and hands its text to everyone, but the overrides, the deck's
// name and the binary are each rank's own: an MPMD launch ("mpiexec -n 4 meshtrain ... : -n 4
// meshtrain ... --set x=y") or a stale build on one node would otherwise train divergent
// replicas with exit 0, or die deep inside a collective whose shapes differ.

#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

// Collective over `world`. Throws AgreedError on every rank when any rank differs from rank 0,
// naming the first such rank and the first thing that differs (the build, the deck name, or
// the first differing --set override).
void check_same_launch(Communicator& world, const std::string& deck,
                       const std::vector<std::string>& overrides);

}  // namespace meshtrain
