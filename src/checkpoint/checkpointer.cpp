// The Checkpointer's front (checkpoint/checkpointer.h): a run's lineage and resume point, and
// saves — synchronous, or handed to a thread of their own with a snapshot. The phases of a
// save are in save_protocol.h, the policy in checkpoint_policy.cpp, loading in
// checkpoint_load.cpp.

#include "meshtrain/checkpoint/checkpointer.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/blocking_watchdog.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/fault_injection.h"
#include "meshtrain/tensor/memory.h"
#include "background_worker.h"
#include "checkpoint_directory.h"
#include "checkpoint_transfer.h"
#include "save_protocol.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// Linux keeps a nice value per thread (setpriority on a thread id), and threads this one starts
// (the hashing worker, the write-back) inherit it. Raising one's own nice value needs no
// privilege; were it refused, the write would only run at the training's priority.
void lower_this_thread(int nice) {
  if (nice > 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice);
}

}  // namespace

// A save running in the background: its job (holding the snapshot), and what it ended with.
struct Checkpointer::Pending {
  SaveJob job;
  double stall_seconds = 0;
  std::atomic<bool> done{false};
  CheckpointStats stats;
  std::exception_ptr error;
  // A snapshot copied on the thread, beside the next step's forward and backward: the state
  // whose update waits for it (through its fence), whether the copy has ended, and how long
  // the update waited.
  ModelState* state = nullptr;
  std::mutex copy_mutex;
  std::condition_variable copy_ended;
  bool copied = false;
  double update_wait_seconds = 0;
  std::thread thread;  // last: joined before the rest is destroyed

  void end_copy() {
    {
      const std::lock_guard<std::mutex> lock(copy_mutex);
      copied = true;
    }
    copy_ended.notify_all();
  }
  void wait_for_copy() {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(copy_mutex);
    copy_ended.wait(lock, [this] { return copied; });
    update_wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Joins the thread and takes the fence off the state (it would outlive this).
  void join() {
    thread.join();
    if (state) state->set_update_fence(nullptr);
  }
};

Checkpointer::Checkpointer(const Config& config, ProcessGrid& grid)
    : cfg_(config), grid_(grid), pruner_(std::make_unique<BackgroundWorker>()) {
  comm_ = grid.mpi_world();
  if (comm_ == MPI_COMM_NULL)
    throw std::logic_error("Checkpointer: a planned grid has no MPI world (MPI-IO writes the file)");
  std::vector<Fault> kills;  // the test hook, see the header
  for (const Fault& f : requested_faults())
    if (f.kind == Fault::Kind::CheckpointKill || f.kind == Fault::Kind::CheckpointStall) kills.push_back(f);
  kill_ = std::make_unique<KillHook>(std::move(kills), grid.world_rank());
  if (cfg_.checkpoint.async) {
    // The background writes' own communicator: their collectives (MPI-IO's among them) never
    // match training's, whatever the two threads do at the same time.
    MPI_Comm dup = MPI_COMM_NULL;
    {
      const BlockingRegion region("duplicating the world for the background checkpoint writes (MPI_Comm_dup)");
      MPI_Comm_dup(comm_, &dup);
    }
    writer_comm_ = std::make_unique<MpiCommunicator>(dup, "checkpoint writer",
                                                     std::chrono::duration<double>(cfg_.run.comm_timeout));
    writer_comm_->set_patient(true);
  }
}

Checkpointer::~Checkpointer() {
  try {
    if (pending_) {
      pending_->join();
      if (pending_->error) std::rethrow_exception(pending_->error);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: warning: the checkpoint written in the background failed: %s\n", e.what());
  }
  pending_.reset();
  if (snapshot_memory_) snapshot_memory_->on_release(MemoryCategory::CheckpointSnapshot, snapshot_bytes_);
  try {
    pruner_->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: warning: %s\n", e.what());
  }
}

void Checkpointer::count_snapshot(MemoryTracker& memory, size_t bytes) {
  if (snapshot_memory_ == &memory && snapshot_bytes_ == bytes) return;
  if (snapshot_memory_) snapshot_memory_->on_release(MemoryCategory::CheckpointSnapshot, snapshot_bytes_);
  memory.on_allocate(MemoryCategory::CheckpointSnapshot, bytes);
  snapshot_memory_ = &memory;
  snapshot_bytes_ = bytes;
}

void Checkpointer::finish_pruning() {
  wait_for_save();
  Communicator& world = grid_.world();
  agree(world, [&] {
    if (world.rank() == 0) pruner_->wait();
  });
}

// ---- resume --------------------------------------------------------------------------------

std::string Checkpointer::resume_path() {
  wait_for_save();
  Communicator& world = grid_.world();
  std::string path;
  agree(world, [&] {
    if (world.rank() != 0) return;
    pruner_->wait();
    path = choose_resume();
  });
  world.broadcast_bytes(path, 0);
  return path;
}

std::string Checkpointer::begin_run() {
  wait_for_save();
  Communicator& world = grid_.world();
  check_directory_writable(cfg_, world);
  std::string path, lineage;
  agree(world, [&] {
    if (world.rank() != 0) return;
    pruner_->wait();
    refuse_occupied_names(cfg_);
    path = choose_resume();
    const std::vector<StoredCheckpoint> stored = scan_checkpoints(cfg_.checkpoint.dir);
    const std::string& r = cfg_.checkpoint.resume;
    if (path.empty()) {  // afresh: everything there is another run's
      lineage = new_lineage_id();
      refuse_other_lineages(cfg_, stored, lineage,
                            r == "none" ? "starts afresh (checkpoint.resume = \"none\")" : "starts afresh",
                            "set checkpoint.dir to another directory for the new run, or "
                            "checkpoint.resume = \"auto\" (or the path of one of them) to continue "
                            "that run");
      return;
    }
    // Continuing a checkpoint: its lineage, when it can be read (else load() says why not).
    lineage = read_lineage(0, path).lineage;
    if (lineage.empty()) return;
    if (r == "auto")
      refuse_other_lineages(cfg_, stored, lineage,
                            "would continue the newest, " + fs::path(path).filename().string() +
                                " (lineage " + lineage + "), with checkpoint.resume = \"auto\"",
                            "move the other run's checkpoints elsewhere, or set checkpoint.resume to "
                            "the checkpoint to continue and checkpoint.dir to a directory of its own");
    else
      refuse_other_lineages(cfg_, stored, lineage,
                            "continues lineage " + lineage + " from " + path + " (checkpoint.resume)",
                            "set checkpoint.dir to a directory of this lineage (or a new one)");
  });
  world.broadcast_bytes(path, 0);
  world.broadcast_bytes(lineage, 0);
  lineage_ = lineage;
  return path;
}

// ---- save ----------------------------------------------------------------------------------

void Checkpointer::settle_lineage() {
  if (!lineage_.empty()) return;  // saved before begin_run() or load(): a run of its own
  Communicator& world = grid_.world();
  if (world.rank() == 0) lineage_ = new_lineage_id();
  world.broadcast_bytes(lineage_, 0);
}

size_t Checkpointer::snapshot_bytes(ModelState& state) { return primary_state_bytes(state); }

CheckpointStats Checkpointer::summarize(const SaveJob& job, double seconds, double data, double verify,
                                        Communicator& comm) const {
  CheckpointStats stats;
  stats.path = job.path;
  stats.step = job.step;
  std::error_code ec;
  const double size = comm.rank() == 0 ? static_cast<double>(fs::file_size(job.path, ec)) : 0.0;
  stats.bytes = static_cast<int64_t>(comm.all_reduce_scalar(size, ReduceOp::Max));
  stats.seconds = comm.all_reduce_scalar(seconds, ReduceOp::Max);
  stats.data_seconds = comm.all_reduce_scalar(data, ReduceOp::Max);
  stats.verify_seconds = comm.all_reduce_scalar(verify, ReduceOp::Max);
  stats.independent = job.how == CheckpointFile::Transfer::Independent;
  return stats;
}

CheckpointStats Checkpointer::save(ModelState& state, int64_t step, const std::string& data_blend) {
  const auto t0 = std::chrono::steady_clock::now();
  wait_for_save();
  settle_lineage();
  Communicator& world = grid_.world();
  SaveJob job = plan_save(cfg_, state, step, lineage_, *pruner_, world);
  job.info.data_blend = data_blend;
  const SaveTimes times = write_and_publish(job, world, comm_, *kill_);
  // Deleting old checkpoints (as long to unlink as they were to write, on some file systems)
  // is not needed for this one to be safe: it runs in the background, and the next save,
  // resume or load waits for it first and reports its failure.
  if (world.rank() == 0)
    pruner_->post([this, step, own = job.own] { prune_checkpoints(cfg_, step, own, *kill_); });
  CheckpointStats stats = summarize(job, seconds_since(t0), times.data_seconds, times.verify_seconds, world);
  stats.stall_seconds = stats.seconds;
  return stats;
}

CheckpointStats Checkpointer::start_save(ModelState& state, int64_t step, MemoryTracker& memory,
                                         const std::string& data_blend) {
  if (!writer_comm_)
    throw std::logic_error("Checkpointer::start_save needs checkpoint.async (its communicator is made then)");
  const auto t0 = std::chrono::steady_clock::now();
  wait_for_save();
  settle_lineage();
  Communicator& world = grid_.world();
  auto pending = std::make_unique<Pending>();
  pending->job = plan_save(cfg_, state, step, lineage_, *pruner_, world);
  pending->job.info.data_blend = data_blend;
  const size_t bytes = snapshot_bytes(state);
  count_snapshot(memory, bytes);
  // The copy goes on while the next step's forward and backward (which read the state, never
  // write it) run, and the optimizer step waits for it: where the state lives in host memory
  // the copy runs on the save's thread and the update waits on the host; on a device its copy
  // engine copies into pinned host memory and the update waits on the device.
  const bool copy_behind = primary_in_host_memory(pending->job.entries);
  Backend* const device = copy_behind ? nullptr : primary_backend(pending->job.entries);
  try {
    agree(world, [&] {
      if (device) snapshot_device_state(pending->job, std::move(snapshot_buffers_), *device);
      else reserve_snapshot(pending->job, std::move(snapshot_buffers_));
    });
  } catch (const AgreedOutOfMemory& e) {
    throw AgreedOutOfMemory(std::string(e.what()) + " while copying the state for an asynchronous checkpoint "
                            "(checkpoint.async needs host memory for one copy of each rank's parameters "
                            "and moments: set checkpoint.async = false, or use more ranks)");
  }
  pending->stall_seconds = world.all_reduce_scalar(seconds_since(t0), ReduceOp::Max);

  Pending* p = pending.get();
  if (!copy_behind) p->end_copy();
  const bool rank0 = world.rank() == 0;
  p->thread = std::thread([this, p, rank0, t0, copy_behind, device] {
    try {
      if (device) device->wait_for_snapshot();  // first: nothing may free the buffers before
      if (copy_behind) {
        struct EndCopy {
          Pending* p;
          ~EndCopy() { p->end_copy(); }  // whatever happens: the update must not wait forever
        } end{p};
        fill_snapshot(p->job, true);
      }
      lower_this_thread(cfg_.checkpoint.async_nice);
      const SaveTimes times = write_and_publish(p->job, *writer_comm_, writer_comm_->comm(), *kill_);
      if (rank0) pruner_->post([this, step = p->job.step, own = p->job.own] { prune_checkpoints(cfg_, step, own, *kill_); });
      p->stats = summarize(p->job, seconds_since(t0), times.data_seconds, times.verify_seconds, *writer_comm_);
    } catch (...) {
      p->error = std::current_exception();
    }
    p->done.store(true, std::memory_order_release);
  });
  pending_ = std::move(pending);
  if (copy_behind) {  // once the save is pending_, which takes the fence off when it goes
    p->state = &state;
    state.set_update_fence([p] { p->wait_for_copy(); });
  } else if (device) {
    p->state = &state;
    state.set_update_fence([device] { device->order_after_snapshot(); });
  }

  CheckpointStats started;
  started.path = pending_->job.path;
  started.step = step;
  started.asynchronous = true;
  started.stall_seconds = pending_->stall_seconds;
  started.bytes = static_cast<int64_t>(world.all_reduce_scalar(static_cast<double>(bytes), ReduceOp::Sum));
  return started;
}

CheckpointStats Checkpointer::collect() {
  pending_->join();
  snapshot_buffers_ = std::move(pending_->job.snapshot);
  CheckpointStats stats = pending_->stats;
  stats.asynchronous = true;
  // Training's whole wait: the start, and the update that waited for the copy (the slowest
  // rank's, as every rank then waits for it in the step's collectives).
  stats.stall_seconds = pending_->stall_seconds +
                        grid_.world().all_reduce_scalar(pending_->update_wait_seconds, ReduceOp::Max);
  const std::exception_ptr error = pending_->error;
  pending_.reset();
  // The writes agreed on their verdict among themselves; agreeing again here also covers an
  // error outside an agreement (a timeout) and names the lowest failing rank everywhere.
  agree(grid_.world(), [&] {
    if (error) std::rethrow_exception(error);
  });
  return stats;
}

std::optional<CheckpointStats> Checkpointer::poll() {
  if (!pending_) return std::nullopt;
  const bool mine = pending_->done.load(std::memory_order_acquire);
  if (grid_.world().all_reduce_scalar(mine ? 1.0 : 0.0, ReduceOp::Min) < 1.0) return std::nullopt;
  return collect();
}

std::optional<CheckpointStats> Checkpointer::wait_for_save() {
  if (!pending_) return std::nullopt;
  return collect();
}

}  // namespace meshtrain
