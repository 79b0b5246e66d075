#include <cstdio>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

// Rank 0 reads the deck and hands its text to every rank, so all ranks parse the same bytes
// (and reach the same verdict) even where only one node sees the file.
Config load_config(const TrainArgs& args, MpiCommunicator& world) {
  std::string text, error;
  if (world.rank() == 0) {
    try {
      text = read_deck_file(args.deck);
    } catch (const DeckError& e) {
      error = e.what();
    }
  }
  world.broadcast_bytes(error, 0);
  if (!error.empty()) throw DeckError(error);
  world.broadcast_bytes(text, 0);
  Config config = parse_deck(args.deck, text, args.overrides);
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

}  // namespace

int train_command(const TrainArgs& args) {
  MpiSession mpi;
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const Config config = load_config(args, world);
    CpuBackend backend(choose_threads(config.run.threads, local_ranks()));
    ProcessGrid grid(MPI_COMM_WORLD, config.grid_shape(), config.run.comm_timeout);
    if (grid.tensor_group_spans_nodes() && grid.world_rank() == 0)
      std::fprintf(stderr, "meshtrain: warning: tensor-parallel groups span nodes (tp = %d, "
                   "%d rank(s) per node): every layer's all-reduce crosses the network; use "
                   "tp <= ranks per node, or order \"tp-...\"\n",
                   config.parallel.tp, grid.local_size());
    Trainer trainer(config, grid, backend);
    trainer.run();
    return kExitOk;
  });
}

}  // namespace meshtrain
