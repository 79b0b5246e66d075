#pragma once
// What every command that runs a deck on the MPI world does first (train, eval): read the deck
// on rank 0 and hand its text to every rank, parse it there with the --set overrides, check the
// layout against the world size, settle the device (CPU, or one GPU per rank with NCCL or
// MPI-staged communication), and build the backend and the process grid. Every rank reaches
// the same verdict on every error.

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/backend/backend.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/comm/job_abort.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/config.h"
#include "meshtrain/io/directory_lock.h"
#include "meshtrain/parallel/process_grid.h"

namespace meshtrain {

// Collective. Every rank parses the same bytes, so every rank reaches the same verdict (a
// DeckError) even where only one node sees the file.
Config load_config(const std::string& deck, const std::vector<std::string>& overrides,
                   Communicator& world);

// Ranks of MPI_COMM_WORLD on this node, and this rank's index among them (collective; the node
// as comm/node.h defines it).
int local_ranks();
int local_rank();
// Every node-local rank's `mine` (any length), indexed by node rank (collective). Carries the
// UUIDs of the GPUs the ranks will use (they, not device counts, say whether ranks share a GPU)
// and the cores each rank is bound to (cpu_binding.h).
std::vector<std::string> gather_over_node(const std::string& mine);

// Collective over the node: the kernel threads of this rank exactly as `train` chooses them
// (cpu_binding.h choose_threads: `configured` when > 0, else OMP_NUM_THREADS, else this rank's
// share of the cores its node's ranks are bound to), with that division of the node's cores.
// Whatever measures the machine for the time model (bench --suite calibrate, a profile measured
// at start-up) takes these, so that its rates are the rates training will get.
struct TrainingThreads {
  ThreadChoice choice;
  NodeCpuShare share;
  int node_ranks = 1;
};
TrainingThreads training_threads(int configured);

struct RunSetup {
  // train's exclusive hold on run.dir and checkpoint.dir (world rank 0; io/directory_lock.h).
  // First: released after everything else that writes there is gone.
  std::vector<std::unique_ptr<DirectoryLock>> locks;
  Config config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<FlightRecorder> recorder;  // outlives the grid's communicators that record
  ScopedAbortHook explain_at_abort;          // names the rank that went quiet (setup_run)
  std::unique_ptr<ProcessGrid> grid;  // null on a parameter server
  // parallel.data_sync = "async": a duplicate of the world for workers and servers, and (on
  // servers) the servers among themselves.
  MPI_Comm server_channel = MPI_COMM_NULL;
  MPI_Comm servers = MPI_COMM_NULL;
  bool is_server() const { return servers != MPI_COMM_NULL; }
};

// Whether a run keeps a flight recorder of its communication (train does; short commands not,
// so that they leave a failed training run's records alone). A run that records owns its run
// directory: it locks run.dir and checkpoint.dir first, before it writes anything there.
enum class Flight { Off, Record };

// Collective over MPI_COMM_WORLD: the process grid of `config`'s layout with the communicators
// its device needs (MPI on the CPU; NCCL or MPI through host buffers for a CUDA backend), each
// recording its operations in `recorder` when there is one.
// The grid over `world`: the job's world, or its workers when parameter servers take the last
// ranks.
std::unique_ptr<ProcessGrid> make_grid(const Config& config, Backend& backend,
                                       FlightRecorder* recorder = nullptr,
                                       MPI_Comm world = MPI_COMM_WORLD);

// Collective: load_config, then (Flight::Record) the locks on run.dir and checkpoint.dir, which
// refuse a second job there before it writes anything, then device resolution (agreed over the world: nodes may differ),
// the backend of this rank, the flight recorder (<run.dir>/flight/rank_N.rec) when asked for
// and run.flight_records > 0, and the grid with communicators for that device. On the CPU, threads
// per rank from run.threads, OMP_NUM_THREADS or the rank's share of its node's cores. Prints the
// device choice on rank 0, and a warning when the ranks' CPU binding leaves cores of a node idle.
RunSetup setup_run(const std::string& deck, const std::vector<std::string>& overrides,
                   MpiCommunicator& world, Flight flight = Flight::Off);

// Once start-up can no longer be refused (train calls it from Trainer::on_started; a parameter
// server before it serves), on each rank, no collective: the flight records
// replace the previous run's in <run.dir>/flight (FlightRecorder::publish), and rank 0 removes
// the records of ranks this job does not have. Until then a refused start leaves them alone.
void publish_flight_records(RunSetup& run, Communicator& world);

}  // namespace meshtrain
