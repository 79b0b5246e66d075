#include "save_protocol.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <thread>

#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/blocking_watchdog.h"
#include "meshtrain/config/config_dump.h"
#include "background_worker.h"
#include "checkpoint_directory.h"
#include "checkpoint_transfer.h"
#include "model_signature.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw std::runtime_error(path + ": cannot open to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error(path + ": fsync failed: " + std::strerror(err));
}

// Starts the device write-back of a file while it is still being written, so that the fsync
// at the end finds most pages already on their way (the kernel alone would wait for
// dirty_background_ratio, gigabytes, and a checkpoint would pay its whole flush after the
// write). Best effort: where sync_file_range is not supported, the fsync does it all.
class EarlyWriteback {
 public:
  explicit EarlyWriteback(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY)) {}
  ~EarlyWriteback() {
    if (fd_ >= 0) ::close(fd_);
  }
  EarlyWriteback(const EarlyWriteback&) = delete;
  EarlyWriteback& operator=(const EarlyWriteback&) = delete;

  // Call after writing `bytes`; every kStride bytes, starts write-back of the whole file's
  // dirty pages without waiting for it.
  void wrote(size_t bytes) {
    pending_ += bytes;
    if (fd_ < 0 || pending_ < kStride) return;
    pending_ = 0;
    if (::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }

 private:
  static constexpr size_t kStride = size_t{16} << 20;
  int fd_;
  size_t pending_ = 0;
};

// After a failed write: a hint when the file system holding `dir` has less room than the
// checkpoint needs (the usual cause; MPI-IO does not pass on the reason), else "".
std::string space_note(const std::string& dir, const std::vector<Entry>& entries, DType dt) {
  struct statvfs st{};
  if (::statvfs(dir.c_str(), &st) != 0) return "";
  double need = static_cast<double>(CheckpointFile::kMetadataBlockBytes);
  for (const Entry& e : entries) need += static_cast<double>(e.global.numel()) * kKinds * dtype_size(dt);
  const double avail = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
  if (avail >= need) return "";
  char buf[320];
  std::snprintf(buf, sizeof buf, "; the file system of checkpoint.dir has %.1f MB free, a checkpoint "
                "needs %.1f MB (free space, lower checkpoint.keep, or set checkpoint.dir to a larger "
                "file system; the previous checkpoints are kept)", avail / 1e6, need / 1e6);
  return buf;
}

// The data of dataset (entry i, kind): the snapshot's, or read from the live state now.
class ElementSource {
 public:
  explicit ElementSource(const SaveJob& job) : job_(job) {}
  const char* get(size_t i, int kind) {
    if (!job_.snapshot.empty()) return job_.snapshot[i * kKinds + static_cast<size_t>(kind)].data;
    held_.push_back(primary_on_host(job_.entries[i], kind, job_.dt));
    held_bytes_ += held_.back().copy.size();
    return held_.back().data;
  }
  // Copies the hashing worker may still read: bound them (the worker is waited for first).
  bool over_budget() const { return held_bytes_ > (size_t{256} << 20); }
  void release() {
    held_.clear();
    held_bytes_ = 0;
  }

 private:
  const SaveJob& job_;
  std::deque<HostElements> held_;
  size_t held_bytes_ = 0;
};

// Creates the .tmp, writes every dataset (hashed by a worker as MPI-IO writes it) and the
// checksums, and closes it. Returns the sums written.
std::vector<uint64_t> write_data(const SaveJob& job, Communicator& comm, MPI_Comm mpi_comm, const KillHook& kill) {
  const std::vector<Entry>& entries = job.entries;
  std::vector<uint64_t> sums(entries.size() * kKinds, 0);
  std::unique_ptr<CheckpointFile> file;
  agree(comm, [&] {
    const CollectiveRegion region(comm, "creating " + job.tmp);
    file = std::make_unique<CheckpointFile>(job.tmp, mpi_comm, CheckpointFile::Access::Create);
  });
  // A failed write (disk full) leaves HDF5 unable to close the file the ordinary way.
  try {
    agree(comm, [&] {
      const CollectiveRegion region(comm, "creating the datasets of " + job.tmp);
      file->write_info(job.info);
      for (const Entry& e : entries)
        for (int kind = 0; kind < kKinds; ++kind) file->create_dataset(dataset_name(e.name, kind), e.global, job.dt);
      create_buffer_datasets(*file, job.buffers);
    });
    // A full disk fails here, on every rank alike, not inside a collective write.
    agree(comm, [&] {
      if (comm.rank() == 0) file->reserve_space();
    });
    std::string hash_error, write_error;
    ElementSource source(job);
    BackgroundWorker hasher;
    EarlyWriteback writeback(job.tmp);
    const DType dt = job.dt;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i == entries.size() / 2) kill.at(CheckpointPhase::Data, job.step);
      const Entry& e = entries[i];
      const std::vector<Box> boxes = e.boxes(true);
      for (int kind = 0; kind < kKinds; ++kind) {
        const char* data = source.get(i, kind);
        hasher.post([&e, &sum = sums[i * kKinds + static_cast<size_t>(kind)], data, boxes, dt] {
          sum = checksum_part(data, dt, e.global, boxes);
        });
        run_transfer(job.how, comm, write_error, [&] {
          const std::string name = dataset_name(e.name, kind);
          if (job.how != CheckpointFile::Transfer::Collective)
            return file->write(name, boxes, data, dt, job.how);
          const CollectiveRegion region(comm, "collective write of dataset " + name + " into " + job.tmp);
          file->write(name, boxes, data, dt, job.how);
        });
        writeback.wrote(static_cast<size_t>(e.count(true)) * dtype_size(dt));
        if (source.over_budget()) {
          // Not agreed here: ranks hold different amounts, so they wait at different points.
          try {
            hasher.wait();
          } catch (const std::exception& err) {
            if (hash_error.empty()) hash_error = err.what();
          }
          source.release();
        }
      }
    }
    agree(comm, [&] {
      hasher.wait();
      if (!write_error.empty()) throw std::runtime_error(write_error);
      if (!hash_error.empty()) throw std::runtime_error(hash_error);
    });
    sums = sum_over(comm, sums);
    // The buffers' checksums follow the parameters' in `sums` (flush_and_verify reads them there).
    std::vector<uint64_t> buffer_sums;
    if (!job.buffers.empty()) {
      agree(comm, [&] {
        const CollectiveRegion region(comm, "writing the model's buffers into " + job.tmp);
        buffer_sums = write_buffers(*file, job.buffers, comm, job.how);
      });
      buffer_sums = sum_over(comm, buffer_sums);
    }
    agree(comm, [&] {
      const CollectiveRegion region(comm, "writing the checksums into and closing " + job.tmp);
      for (size_t i = 0; i < entries.size(); ++i)
        for (int kind = 0; kind < kKinds; ++kind)
          file->set_checksum(dataset_name(entries[i].name, kind), sums[i * kKinds + static_cast<size_t>(kind)]);
      set_buffer_checksums(*file, job.buffers, buffer_sums);
      file->close();
    });
    sums.insert(sums.end(), buffer_sums.begin(), buffer_sums.end());
  } catch (const AgreedError&) {
    file->discard();
    throw;
  }
  return sums;
}

// Flushes the .tmp to disk (every rank: on a shared file system each node flushes what it
// wrote) while the verification reads it back through the page cache: both finish before the
// rename, and the flush mostly waits for the device. Each rank hashes its elements as stored,
// in place; the sums must equal the checksums written.
void flush_and_verify(const SaveJob& job, const std::vector<uint64_t>& sums, Communicator& comm, MPI_Comm mpi_comm) {
  const std::vector<Entry>& entries = job.entries;
  std::string flush_error;
  {
    std::jthread flusher([&] {
      try {
        fsync_path(job.tmp, O_RDONLY);
      } catch (const std::exception& e) {
        flush_error = e.what();
      }
    });
    std::unique_ptr<CheckpointFile> file;
    agree(comm, [&] {
      const CollectiveRegion region(comm, "opening " + job.tmp + " to verify it");
      file = std::make_unique<CheckpointFile>(job.tmp, mpi_comm, CheckpointFile::Access::Read);
    });
    // The parameters' checksums, then the buffers' (as write_data returned them).
    const size_t params = entries.size() * kKinds;
    std::vector<uint64_t> read_sums(params + job.buffers.size(), 0);
    agree(comm, [&] {
      for (size_t i = 0; i < entries.size(); ++i)
        for (int kind = 0; kind < kKinds; ++kind)
          read_sums[i * kKinds + static_cast<size_t>(kind)] =
              file->stored_checksum(dataset_name(entries[i].name, kind), entries[i].boxes(true));
      stored_buffer_parts(*file, job.buffers, comm.rank() == 0, read_sums.data() + params);
    });
    read_sums = sum_over(comm, read_sums);
    agree(comm, [&] {
      check_sums(*file, entries, read_sums, &sums);
      check_buffer_sums(*file, job.buffers, read_sums.data() + params, sums.data() + params);
      const CollectiveRegion region(comm, "closing " + job.tmp + " after verifying it");
      file->close();
    });
  }
  agree(comm, [&] {
    if (!flush_error.empty()) throw std::runtime_error(flush_error);
  });
}

// Rank 0 renames the verified .tmp to its final name and makes the rename durable.
void publish(const SaveJob& job, Communicator& comm, const KillHook& kill) {
  kill.at(CheckpointPhase::Rename, job.step);
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    std::error_code ec;
    fs::rename(job.tmp, job.path, ec);
    if (ec) throw std::runtime_error(job.tmp + ": cannot rename to " + job.path + ": " + ec.message());
    fsync_path(job.dir, O_RDONLY | O_DIRECTORY);
  });
}

}  // namespace

void KillHook::at(CheckpointPhase phase, int64_t step) const {
  for (const Fault& kill : kills_) {
    if (kill.phase != phase || (kill.step >= 0 && kill.step != step)) continue;
    if (kill.kind == Fault::Kind::CheckpointStall) {
      if (kill.rank != world_rank_) continue;
      std::fprintf(stderr, "meshtrain: MESHTRAIN_FAULT: rank %d stalls in checkpoint phase '%s' at step %lld\n",
                   world_rank_, std::string(checkpoint_phase_name(phase)).c_str(), static_cast<long long>(step));
      std::fflush(stderr);
      for (;;) ::pause();  // no progress, no communication, until the job is ended
    }
    if (world_rank_ != 0) continue;
    std::fprintf(stderr, "meshtrain: MESHTRAIN_FAULT: rank 0 kills itself in checkpoint phase '%s' at step %lld\n",
                 std::string(checkpoint_phase_name(phase)).c_str(), static_cast<long long>(step));
    std::fflush(stdout);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

SaveJob plan_save(const Config& cfg, ModelState& state, int64_t step,
                  const std::string& lineage, BackgroundWorker& pruner, Communicator& world) {
  SaveJob job;
  job.dir = cfg.checkpoint.dir;
  job.path = job.dir + "/" + Checkpointer::file_name(step);
  job.tmp = job.path + ".tmp";
  job.step = step;
  job.dt = state.state_dtype();
  // Rank 0: this lineage's checkpoints (for pruning); another lineage's at this step is refused.
  agree(world, [&] {
    if (world.rank() != 0) return;
    pruner.wait();
    std::error_code ec;
    if (!fs::create_directories(job.dir, ec) && ec)
      throw std::runtime_error(job.dir + ": cannot create the checkpoint directory (checkpoint.dir): " +
                               ec.message());
    for (const StoredCheckpoint& s : scan_checkpoints(job.dir)) {
      if (s.lineage == lineage) {
        if (s.path != job.path) job.own.emplace_back(s.step, s.path);
        continue;
      }
      if (s.path == job.path)
        throw std::runtime_error(job.path + ": a checkpoint of another run (lineage " +
                                 (s.lineage.empty() ? "unknown, " + s.problem : s.lineage) +
                                 ") is in the way of this run's (lineage " + lineage + ") step " +
                                 std::to_string(step) + "; a run never overwrites checkpoints it did "
                                 "not write (set checkpoint.dir to another directory, or move it away)");
    }
    // Made since start-up: refused before anything is written, not at the rename.
    refuse_occupied_name(job.path);
    refuse_occupied_name(job.tmp);
    job.own.emplace_back(step, job.path);
    std::sort(job.own.begin(), job.own.end());
  });
  job.entries = plan_entries(state, world);
  job.buffers = buffers_of(state.stage());
  job.how = transfer_mode(cfg.checkpoint.io, job.entries, TransferDirection::Save, job.dt, world);
  CheckpointInfo& info = job.info;
  info.step = step;
  info.optimizer_steps = state.steps_taken();
  info.seed = cfg.run.seed;
  info.deck = cfg.deck_text;
  for (const std::string& o : cfg.overrides) info.overrides += o + "\n";
  info.config = dump_config(cfg);
  info.model = model_signature(cfg.model, tokenizer_signature(cfg.data.tokenizer));
  info.lineage = lineage;
  info.layout = describe_layout(cfg);
  info.world_size = world.size();
  info.meshtrain_version = MESHTRAIN_VERSION;
  info.created = utc_timestamp();
  info.optimizer = optimizer_signature(cfg.train.optimizer);
  world.broadcast_bytes(info.created, 0);  // attributes must be identical on every rank
  return job;
}

void reserve_snapshot(SaveJob& job, std::vector<HostElements> buffers) {
  buffers.resize(job.entries.size() * kKinds);
  for (size_t i = 0; i < job.entries.size(); ++i)
    for (int kind = 0; kind < kKinds; ++kind) {
      HostElements& h = buffers[i * kKinds + static_cast<size_t>(kind)];
      size_for_primary(job.entries[i], job.dt, h.copy);
      h.data = h.copy.data();
    }
  job.snapshot = std::move(buffers);
}

void fill_snapshot(SaveJob& job, bool from_any_thread) {
  for (size_t i = 0; i < job.entries.size(); ++i)
    for (int kind = 0; kind < kKinds; ++kind)
      copy_primary(job.entries[i], kind, job.dt, job.snapshot[i * kKinds + static_cast<size_t>(kind)].copy,
                   from_any_thread);
}

void snapshot_device_state(SaveJob& job, std::vector<HostElements> buffers, Backend& device) {
  const size_t n = job.entries.size() * kKinds;
  buffers.resize(n);
  bool reuse = true;
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t count = job.entries[i / kKinds].count(true);
    reuse = reuse && buffers[i].pinned.numel() == count && buffers[i].pinned.dtype() == job.dt;
    total += count;
  }
  if (!reuse) {
    // One block: pinned allocations are slow and few are better; its views keep it alive.
    const Tensor block = device.empty_host({std::max<int64_t>(total, 1)}, job.dt,
                                           MemoryCategory::CheckpointSnapshot);
    int64_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t count = job.entries[i / kKinds].count(true);
      buffers[i].copy.clear();
      buffers[i].pinned = block.view(at, {count});
      at += count;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    HostElements& h = buffers[i];
    h.data = static_cast<const char*>(h.pinned.raw());
    int64_t at = 0;
    for (const Piece& p : job.entries[i / kKinds].pieces) {
      if (!p.owned.primary) continue;
      Tensor into = h.pinned.view(at, {p.owned.count});
      device.snapshot_to_host(into, piece_tensor(p.owned, static_cast<int>(i % kKinds)));
      at += p.owned.count;
    }
  }
  job.snapshot = std::move(buffers);
}

Backend* primary_backend(const std::vector<Entry>& entries) {
  for (const Entry& e : entries)
    for (const Piece& p : e.pieces)
      if (p.owned.primary) return p.owned.backend;
  return nullptr;
}

SaveTimes write_and_publish(const SaveJob& job, Communicator& comm, MPI_Comm mpi_comm, const KillHook& kill) {
  SaveTimes times;
  try {
    const auto data_start = std::chrono::steady_clock::now();
    std::vector<uint64_t> sums;
    try {
      sums = write_data(job, comm, mpi_comm, kill);
    } catch (const AgreedError& e) {
      const std::string note = space_note(job.dir, job.entries, job.dt);
      if (note.empty()) throw;
      throw AgreedError(e.what() + note);
    }
    times.data_seconds = seconds_since(data_start);
    const auto verify_start = std::chrono::steady_clock::now();
    flush_and_verify(job, sums, comm, mpi_comm);
    times.verify_seconds = seconds_since(verify_start);
  } catch (const AgreedError&) {
    if (comm.rank() == 0) {
      std::error_code ec;
      fs::remove(job.tmp, ec);
    }
    throw;
  }
  publish(job, comm, kill);
  return times;
}

}  // namespace meshtrain
