#include "meshtrain/train/checkpointer.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <regex>
#include <stdexcept>
#include <thread>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/config_dump.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/train/fault_injection.h"
#include "meshtrain/train/trainer.h"
#include "background_worker.h"
#include "checkpoint_directory.h"
#include "checkpoint_entries.h"
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
  double need = 0;
  for (const Entry& e : entries) need += static_cast<double>(e.global.numel()) * kKinds * dtype_size(dt);
  const double avail = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
  if (avail >= need) return "";
  char buf[320];
  std::snprintf(buf, sizeof buf, "; the file system of checkpoint.dir has %.1f MB free, a checkpoint "
                "needs %.1f MB (free space, lower checkpoint.keep, or set checkpoint.dir to a larger "
                "file system; the previous checkpoints are kept)", avail / 1e6, need / 1e6);
  return buf;
}

}  // namespace

std::string describe_layout(const Config& c) {
  const ParallelOptions& p = c.parallel;
  return "dp=" + std::to_string(p.dp) + " tp=" + std::to_string(p.tp) + " pp=" + std::to_string(p.pp) +
         " zero=" + std::to_string(p.zero) + " schedule=" + std::string(schedule_name(p.schedule)) +
         " virtual_stages=" + std::to_string(p.virtual_stages) +
         " micro_batch=" + std::to_string(c.train.micro_batch);
}

// ---- paths ---------------------------------------------------------------------------------

std::string Checkpointer::file_name(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

std::vector<std::pair<int64_t, std::string>> Checkpointer::complete_checkpoints(const std::string& dir) {
  static const std::regex pattern("step_([0-9]+)\\.h5");
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, m, pattern) && it->is_regular_file())
      out.emplace_back(std::stoll(m[1].str()), dir + "/" + name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- construction, fault hook ---------------------------------------------------------------

Checkpointer::Checkpointer(const Config& config, ProcessGrid& grid)
    : cfg_(config), grid_(grid), pruner_(std::make_unique<BackgroundWorker>()) {
  comm_ = grid.mpi_world();
  if (comm_ == MPI_COMM_NULL)
    throw std::logic_error("Checkpointer: a planned grid has no MPI world (MPI-IO writes the file)");
  // Test hook, see the header.
  for (const Fault& f : requested_faults())
    if (f.kind == Fault::Kind::CheckpointKill) kills_.push_back(f);
}

Checkpointer::~Checkpointer() {
  try {
    pruner_->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: warning: %s\n", e.what());
  }
}

void Checkpointer::finish_pruning() {
  Communicator& world = grid_.world();
  agree(world, [&] {
    if (world.rank() == 0) pruner_->wait();
  });
}

void Checkpointer::fault(CheckpointPhase phase, int64_t step) const {
  if (grid_.world_rank() != 0) return;
  for (const Fault& kill : kills_) {
    if (kill.phase != phase || (kill.step >= 0 && kill.step != step)) continue;
    std::fprintf(stderr, "meshtrain: MESHTRAIN_FAULT: rank 0 kills itself in checkpoint phase '%s' at step %lld\n",
                 std::string(checkpoint_phase_name(phase)).c_str(), static_cast<long long>(step));
    std::fflush(stdout);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

// ---- resume --------------------------------------------------------------------------------

std::string Checkpointer::choose_resume() const {
  const std::string& r = cfg_.checkpoint.resume;
  if (r == "none") return "";
  if (r == "auto") {
    const auto all = complete_checkpoints(cfg_.checkpoint.dir);
    return all.empty() ? "" : all.back().second;
  }
  std::error_code ec;
  if (!fs::is_regular_file(r, ec))
    throw DeckError(cfg_.deck_path + ": checkpoint.resume = \"" + r + "\": no such checkpoint "
                    "file (give the path of a step_*.h5, \"auto\" or \"none\")");
  return r;
}

std::string Checkpointer::resume_path() {
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
  Communicator& world = grid_.world();
  check_directory_writable(cfg_, world);
  std::string path, lineage;
  agree(world, [&] {
    if (world.rank() != 0) return;
    pruner_->wait();
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

CheckpointStats Checkpointer::save(Trainer& trainer) {
  const auto t0 = std::chrono::steady_clock::now();
  Communicator& world = grid_.world();
  const int64_t step = trainer.step();
  const std::string& dir = cfg_.checkpoint.dir;
  const std::string path = dir + "/" + file_name(step);
  const std::string tmp = path + ".tmp";
  const DType dt = trainer.state().state_dtype();
  if (lineage_.empty()) {  // saved before begin_run() or load(): a run of its own
    if (world.rank() == 0) lineage_ = new_lineage_id();
    world.broadcast_bytes(lineage_, 0);
  }

  // Rank 0: this lineage's checkpoints (for pruning); another lineage's at this step is refused.
  std::vector<std::pair<int64_t, std::string>> own;
  agree(world, [&] {
    if (world.rank() != 0) return;
    pruner_->wait();
    std::error_code ec;
    if (!fs::create_directories(dir, ec) && ec)
      throw std::runtime_error(dir + ": cannot create the checkpoint directory (checkpoint.dir): " +
                               ec.message());
    for (const StoredCheckpoint& s : scan_checkpoints(dir)) {
      if (s.lineage == lineage_) {
        if (s.path != path) own.emplace_back(s.step, s.path);
        continue;
      }
      if (s.path == path)
        throw std::runtime_error(path + ": a checkpoint of another run (lineage " +
                                 (s.lineage.empty() ? "unknown, " + s.problem : s.lineage) +
                                 ") is in the way of this run's (lineage " + lineage_ + ") step " +
                                 std::to_string(step) + "; a run never overwrites checkpoints it did "
                                 "not write (set checkpoint.dir to another directory, or move it away)");
    }
  });
  const std::vector<Entry> entries = plan_entries(trainer.state(), world);
  const CheckpointFile::Transfer how = transfer_mode(cfg_.checkpoint.io, entries, true, dt, world);
  CheckpointInfo info;
  info.step = step;
  info.optimizer_steps = trainer.state().steps_taken();
  info.seed = cfg_.run.seed;
  info.deck = cfg_.deck_text;
  for (const std::string& o : cfg_.overrides) info.overrides += o + "\n";
  info.config = dump_config(cfg_);
  info.model = model_signature(cfg_.model, tokenizer_signature(cfg_.data.tokenizer));
  info.lineage = lineage_;
  info.layout = describe_layout(cfg_);
  info.world_size = grid_.world_size();
  info.meshtrain_version = MESHTRAIN_VERSION;
  info.created = utc_timestamp();
  world.broadcast_bytes(info.created, 0);  // attributes must be identical on every rank

  double data_seconds = 0, verify_seconds = 0;
  std::string disk_note;  // how full the file system was when a write failed
  try {
    std::vector<uint64_t> sums(entries.size() * kKinds, 0);
    const auto data_start = std::chrono::steady_clock::now();
    {
      std::unique_ptr<CheckpointFile> file;
      agree(world, [&] { file = std::make_unique<CheckpointFile>(tmp, comm_, CheckpointFile::Access::Create); });
      // A failed write (disk full) leaves HDF5 unable to close the file the ordinary way.
      try {
        agree(world, [&] {
          file->write_info(info);
          for (const Entry& e : entries)
            for (int kind = 0; kind < kKinds; ++kind) file->create_dataset(dataset_name(e.name, kind), e.global, dt);
        });
        // A full disk fails here, on every rank alike, not inside a collective write.
        agree(world, [&] {
          if (world.rank() == 0) file->reserve_space();
        });
        // The worker hashes each dataset while MPI-IO writes it (both only read the data).
        std::deque<HostElements> held;  // copies the worker may still read
        size_t held_bytes = 0;
        std::string hash_error, write_error;
        BackgroundWorker hasher;
        EarlyWriteback writeback(tmp);
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i == entries.size() / 2) fault(CheckpointPhase::Data, step);
          const Entry& e = entries[i];
          const std::vector<Box> boxes = e.boxes(true);
          for (int kind = 0; kind < kKinds; ++kind) {
            held.push_back(primary_on_host(e, kind, dt));
            const char* data = held.back().data;
            held_bytes += held.back().copy.size();
            hasher.post([&e, &sum = sums[i * kKinds + static_cast<size_t>(kind)], data, boxes, dt] {
              sum = checksum_part(data, dt, e.global, boxes);
            });
            run_transfer(how, world, write_error, [&] { file->write(dataset_name(e.name, kind), boxes, data, dt, how); });
            writeback.wrote(static_cast<size_t>(e.count(true)) * dtype_size(dt));
            if (held_bytes > (size_t{256} << 20)) {  // bound the copies kept for the worker
              // Not agreed here: ranks hold different amounts, so they wait at different points.
              try {
                hasher.wait();
              } catch (const std::exception& err) {
                if (hash_error.empty()) hash_error = err.what();
              }
              held.clear();
              held_bytes = 0;
            }
          }
        }
        agree(world, [&] {
          hasher.wait();
          if (!write_error.empty()) throw std::runtime_error(write_error);
          if (!hash_error.empty()) throw std::runtime_error(hash_error);
        });
        sums = sum_over(world, sums);
        agree(world, [&] {
          for (size_t i = 0; i < entries.size(); ++i)
            for (int kind = 0; kind < kKinds; ++kind)
              file->set_checksum(dataset_name(entries[i].name, kind), sums[i * kKinds + static_cast<size_t>(kind)]);
          file->close();
        });
      } catch (const AgreedError&) {
        disk_note = space_note(dir, entries, dt);
        file->discard();
        throw;
      }
    }
    data_seconds = seconds_since(data_start);
    const auto verify_start = std::chrono::steady_clock::now();
    // Flush to disk (every rank: on a shared file system each node flushes what it wrote) while
    // the verification reads the data back through the page cache: both finish before the
    // rename, and the flush mostly waits for the device.
    std::string flush_error;
    {
      std::jthread flusher([&] {
        try {
          fsync_path(tmp, O_RDONLY);
        } catch (const std::exception& e) {
          flush_error = e.what();
        }
      });
      // Verify: each rank hashes its elements as stored, in place (io/checkpoint_file.h); the
      // sums must equal the checksums just written.
      std::unique_ptr<CheckpointFile> file;
      agree(world, [&] { file = std::make_unique<CheckpointFile>(tmp, comm_, CheckpointFile::Access::Read); });
      std::vector<uint64_t> read_sums(entries.size() * kKinds, 0);
      agree(world, [&] {
        for (size_t i = 0; i < entries.size(); ++i)
          for (int kind = 0; kind < kKinds; ++kind)
            read_sums[i * kKinds + static_cast<size_t>(kind)] =
                file->stored_checksum(dataset_name(entries[i].name, kind), entries[i].boxes(true));
      });
      read_sums = sum_over(world, read_sums);
      agree(world, [&] {
        check_sums(*file, entries, read_sums, &sums);
        file->close();
      });
    }
    agree(world, [&] {
      if (!flush_error.empty()) throw std::runtime_error(flush_error);
    });
    verify_seconds = seconds_since(verify_start);
  } catch (const AgreedError& e) {
    if (world.rank() == 0) {
      std::error_code ec;
      fs::remove(tmp, ec);
    }
    if (disk_note.empty()) throw;
    throw AgreedError(e.what() + disk_note);
  }

  fault(CheckpointPhase::Rename, step);
  agree(world, [&] {
    if (world.rank() != 0) return;
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) throw std::runtime_error(tmp + ": cannot rename to " + path + ": " + ec.message());
    fsync_path(dir, O_RDONLY | O_DIRECTORY);
  });
  // Deleting old checkpoints (as long to unlink as they were to write, on some file systems)
  // is not needed for this one to be safe: it runs in the background, and the next save,
  // resume or load waits for it first and reports its failure.
  if (world.rank() == 0) {
    own.emplace_back(step, path);
    std::sort(own.begin(), own.end());
    pruner_->post([this, step, own] { prune(step, own); });
  }

  CheckpointStats stats;
  stats.path = path;
  stats.step = step;
  std::error_code ec;
  const double size = world.rank() == 0 ? static_cast<double>(fs::file_size(path, ec)) : 0.0;
  stats.bytes = static_cast<int64_t>(world.all_reduce_scalar(size, ReduceOp::Max));
  stats.seconds = world.all_reduce_scalar(seconds_since(t0), ReduceOp::Max);
  stats.data_seconds = world.all_reduce_scalar(data_seconds, ReduceOp::Max);
  stats.verify_seconds = world.all_reduce_scalar(verify_seconds, ReduceOp::Max);
  stats.independent = how == CheckpointFile::Transfer::Independent;
  return stats;
}

void Checkpointer::prune(int64_t step, const std::vector<std::pair<int64_t, std::string>>& all) {
  const size_t keep = static_cast<size_t>(std::max(1, cfg_.checkpoint.keep));
  bool deleted = false;
  for (size_t i = 0; i + keep < all.size(); ++i) {
    if (all[i].first == step) continue;  // never the one just written
    std::error_code ec;
    fs::remove(all[i].second, ec);
    if (ec)
      throw std::runtime_error(all[i].second + ": cannot delete an old checkpoint (checkpoint.keep = " +
                               std::to_string(cfg_.checkpoint.keep) + "): " + ec.message());
    if (!deleted) fault(CheckpointPhase::Prune, step);
    deleted = true;
  }
  // .tmp files of other steps are left by a job that died while writing; nothing reads them.
  static const std::regex stale("step_([0-9]+)\\.h5\\.tmp");
  std::error_code ec;
  for (fs::directory_iterator it(cfg_.checkpoint.dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, m, stale) && std::stoll(m[1].str()) != step) {
      std::error_code rm;
      fs::remove(it->path(), rm);
    }
  }
  if (!deleted) fault(CheckpointPhase::Prune, step);
}

}  // namespace meshtrain
