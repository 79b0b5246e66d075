#pragma once
// A worker's side of asynchronous data parallelism (parallel/parameter_server.h): asking server 0
// for the replica's next share, pushing the share's gradient to the servers, and keeping the
// replica's parameters at one version no older than the share allows.
//
// Pulls overlap with compute: after each install a pull for any newer version is posted, and the
// next share takes its result when every rank of the replica has the same version (a replica
// never computes on a mix of versions); it waits only when its version is older than the
// staleness bound allows. Every rank of a replica calls the methods at the same points (they
// agree over the replica); a divergence the servers report makes every worker throw RunDiverged
// together, after one all-reduce over the workers.

#include <mpi.h>

#include <memory>
#include <vector>

#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/config.h"
#include "meshtrain/parallel/model_state.h"
#include "meshtrain/parallel/parameter_server.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/parallel/server_channel.h"

namespace meshtrain {

// Versions at which every replica needs the same state: evaluations, checkpoints, text samples
// and the last step (after `first_step`, up to train.steps).
std::vector<int64_t> async_fences(const Config& config, int64_t first_step);
// What parameter server `server` needs of the deck: the optimizer, the schedule, the fences.
ServerOptions server_options(const Config& config, int server);

class ParameterClient {
 public:
  // Collective over the workers (grid.world()). `channel`: the world's duplicate the servers
  // listen on; servers are world ranks grid.world_size() .. + parallel.servers - 1.
  ParameterClient(const Config& config, ProcessGrid& grid, ModelState& state, MPI_Comm channel);
  ~ParameterClient();

  // Collective over the workers: replica 0 hands the servers its state (values, moments) as
  // version `version`; every replica installs it as its own.
  void upload(int64_t version);
  // The replica's next work: its leader reports the last share and asks server 0, the replica
  // learns the answer. Logged steps arrive on replica 0's leader only.
  Assignment next(const ShareReport& report, std::vector<LoggedStep>& logged);
  // Parameters of one version >= min_version on every rank of the replica.
  void ensure_version(int64_t min_version);
  // Values and moments of `version` (a fence: the servers are there), for a checkpoint.
  void pull_state(int64_t version);
  // Sends the gradient of the share just computed (ModelState's, this replica's only).
  void push(const Assignment& share);
  int64_t version() const { return installed_; }
  // Sum over the ranks of the replica.
  double replica_sum(double value);
  // Worker 0: the run is over, with this exit status (the servers end with it).
  static void shutdown(MPI_Comm channel, int first_server, int servers, int status, double timeout);

 private:
  struct Pull;
  std::string server_name(int k) const;  // "parameter server K (rank R)"
  void post_pull(size_t piece, int64_t min_version);
  void start_pull(int64_t min_version);
  bool pull_ready();
  int64_t coherent_version();
  // The completed pull's values into the model.
  void install();
  [[noreturn]] void diverged_everywhere(int64_t step);

  const Config& cfg_;
  ProcessGrid& grid_;
  ModelState& state_;
  MPI_Comm channel_;
  std::unique_ptr<MpiCommunicator> replica_;
  std::unique_ptr<ServerLayout> layout_;
  std::vector<ServerPiece> pieces_;
  int first_server_ = 0;
  int64_t elem_ = 0;
  int64_t installed_ = 0;
  std::unique_ptr<Pull> pull_;
  std::vector<std::vector<char>> sends_;
  std::vector<MPI_Request> send_requests_;
  std::vector<char> flat_;
  double timeout_ = 600;
};

}  // namespace meshtrain
