#include "meshtrain/app/run_setup.h"

#include <mpi.h>

#include "meshtrain/config/deck.h"
#include "meshtrain/config/layout_check.h"

namespace meshtrain {

Config load_config(const std::string& deck, const std::vector<std::string>& overrides,
                   Communicator& world) {
  std::string text, error;
  if (world.rank() == 0) {
    try {
      text = read_deck_file(deck);
    } catch (const DeckError& e) {
      error = e.what();
    }
  }
  world.broadcast_bytes(error, 0);
  if (!error.empty()) throw DeckError(error);
  world.broadcast_bytes(text, 0);
  Config config = parse_deck(deck, text, overrides);
  check_layout(config, world.size());
  return config;
}

int local_ranks() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

}  // namespace meshtrain
