#pragma once
// A parameter server (asynchronous data parallelism, parallel.data_sync = "async"): one of the
// job's last parallel.servers ranks, outside the process grid. It holds its range of the
// replicas' flat state (parallel/server_channel.h) in the optimizer's precision: the master
// values and the AdamW moments. It sums the gradients pushed for each step, and once all of a
// step's shares are in, applies AdamW with the step's learning rate and the global gradient
// norm (summed over the servers, for clipping), making the next version; workers pull values of
// at least a given version. Server 0 also schedules the shares (parallel/share_scheduler.h) and
// sends the log's per-step records to replica 0.
//
// Why point to point rather than one-sided windows: a step is applied once all of its pieces
// have arrived, and a pull is answered once a version exists. With messages the server learns
// both by receiving; with windows it would need a second channel to learn when to look.

#include <mpi.h>

#include <functional>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/parallel/server_channel.h"

namespace meshtrain {

struct ServerOptions {
  int server = 0;      // index among the servers; world rank grid.world_size() + server
  GridShape grid;      // the workers'
  DType dtype = DType::F32;  // the optimizer's
  int staleness = 0;
  int64_t last_step = 0;           // train.steps
  std::vector<int64_t> fences;     // versions every replica needs whole (scheduler, server 0)
  AdamWHyper adamw;
  double grad_clip = 0;            // 0: off
  std::function<double(int64_t)> learning_rate;  // of a 0-based step
  double timeout = 600;
};

class ParameterServer {
 public:
  // `channel`: a duplicate of the world; `servers`: the servers among themselves.
  ParameterServer(MPI_Comm channel, MPI_Comm servers, Backend& host, const ServerOptions& options);
  ~ParameterServer();
  // Serves until worker 0 ends the run; returns the exit status it sent.
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain
