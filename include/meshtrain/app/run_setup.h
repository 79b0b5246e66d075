#pragma once
// What every command that runs a deck on the MPI world does first (train, eval): read the deck
// on rank 0 and hand its text to every rank, parse it there with the --set overrides and check
// the layout against the world size; and count the ranks sharing this node (for threads).

#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/config/config.h"

namespace meshtrain {

// Collective. Every rank parses the same bytes, so every rank reaches the same verdict (a
// DeckError) even where only one node sees the file.
Config load_config(const std::string& deck, const std::vector<std::string>& overrides,
                   Communicator& world);

// Ranks of MPI_COMM_WORLD on this node (collective).
int local_ranks();

}  // namespace meshtrain
