#pragma once
// The save protocol of checkpoint/checkpointer.h as named phases. A SaveJob carries everything
// the phases after plan_save need, so that with a snapshot they no longer touch the live model
// state and can run on another thread (checkpoint.async) while training changes it:
//
//   plan_save         the file's name, this lineage's checkpoints, the datasets and attributes
//   reserve_snapshot, fill_snapshot (asynchronous saves) every dataset's elements copied to
//                     host memory
//   write_data        .tmp created, datasets written while a worker hashes them, checksums set
//   flush_and_verify  fsync while reading the data back against the checksums
//   publish           rename .tmp -> .h5, fsync the directory
// (pruning, the last phase, runs on the Checkpointer's own worker: checkpoint_policy.h.)
//
// Every phase is collective over the group it is given, and a failure anywhere is agreed. A
// synchronous save runs them on the world's communicator; an asynchronous one runs write_data
// onwards on a communicator of its own (MPI_THREAD_MULTIPLE), so that its collectives never
// interleave with training's. Private to src/checkpoint.

#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/config/config.h"
#include "meshtrain/config/fault_injection.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/parallel/model_state.h"
#include "checkpoint_buffers.h"
#include "checkpoint_entries.h"

namespace meshtrain {

class BackgroundWorker;

// MESHTRAIN_FAULT's checkpoint_kill and checkpoint_stall items (the test hook in
// checkpointer.h): world rank 0 raises SIGKILL when a kill matches, the named rank stalls when a
// stall does.
class KillHook {
 public:
  KillHook(std::vector<Fault> kills, int world_rank) : kills_(std::move(kills)), world_rank_(world_rank) {}
  void at(CheckpointPhase phase, int64_t step) const;

 private:
  std::vector<Fault> kills_;
  int world_rank_;
};

struct SaveJob {
  std::string dir, path, tmp;
  int64_t step = 0;
  DType dt = DType::F32;
  std::vector<Entry> entries;
  std::vector<BufferTensor> buffers;  // the stage's buffers, copied when planned
  CheckpointFile::Transfer how = CheckpointFile::Transfer::Collective;
  CheckpointInfo info;
  // World rank 0: this lineage's complete checkpoints, the one being written included.
  std::vector<std::pair<int64_t, std::string>> own;
  // Asynchronous saves: every dataset's elements on the host, (entry, kind) order. Empty for a
  // synchronous save, which reads the live state while writing.
  std::vector<HostElements> snapshot;
};

struct SaveTimes {
  double data_seconds = 0;
  double verify_seconds = 0;
};

// Collective over `world`: refuses (AgreedError) another lineage's checkpoint at this step.
// World rank 0 waits for `pruner` first. `lineage` must be set. The stage's buffers
// (PipelineStage::buffers) are saved beside the parameters.
SaveJob plan_save(const Config& config, ModelState& state, int64_t step,
                  const std::string& lineage, BackgroundWorker& pruner, Communicator& world);

// Sizes job.snapshot for every dataset's elements, reusing `buffers` (the previous snapshot's)
// where they fit: a fresh allocation's page faults cost several times the copy. Not
// collective. Throws std::bad_alloc when host memory runs out.
void reserve_snapshot(SaveJob& job, std::vector<HostElements> buffers);
// Copies every dataset's elements into the snapshot reserve_snapshot sized. from_any_thread:
// see copy_primary (the copy then runs beside training, which must not update the state
// before it ends: ModelState::set_update_fence).
void fill_snapshot(SaveJob& job, bool from_any_thread);
// A device's state: sizes job.snapshot as views of one block of `device`'s pinned host memory
// (reusing `buffers`' when the sizes match), then queues every dataset's copy there
// (Backend::snapshot_to_host); the elements are in place once device.wait_for_snapshot()
// returns, and the state must not be written before device.order_after_snapshot().
void snapshot_device_state(SaveJob& job, std::vector<HostElements> buffers, Backend& device);
// The backend of this rank's primary pieces, or null when it holds none.
Backend* primary_backend(const std::vector<Entry>& entries);

// write_data, flush_and_verify and publish, with the clean-up a failure needs: the .tmp is
// removed and the error (with a note on free space when the disk filled) agreed. Collective
// over `comm`, whose MPI communicator is `mpi_comm`.
SaveTimes write_and_publish(const SaveJob& job, Communicator& comm, MPI_Comm mpi_comm, const KillHook& kill);

// The last phase, on the Checkpointer's pruning worker (checkpoint_policy.cpp): deletes what
// checkpoint.keep drops among `own` (SaveJob::own; never the checkpoint of `step`, just
// written), then stale .tmp files of other steps. Not collective (world rank 0).
void prune_checkpoints(const Config& config, int64_t step, const std::vector<std::pair<int64_t, std::string>>& own,
                       const KillHook& kill);

}  // namespace meshtrain
