#include "meshtrain/train/checkpointer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/train/trainer.h"
#include "background_worker.h"
#include "checkpoint_entries.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Which deck keys decide a dataset's shape or existence, as a hint in refusals.
std::string shape_keys(const Shape& file, const Shape& want, const GptConfig& m) {
  std::set<std::string> keys;
  for (int k = 0; k < std::min(file.rank(), want.rank()); ++k) {
    if (file[k] == want[k]) continue;
    const int64_t w = want[k];
    if (w == m.vocab_size) keys.insert("model.vocab_size");
    if (w == m.seq_len) keys.insert("model.seq_len");
    if (w == m.d_model || w == 3 * m.d_model || w == 4 * m.d_model) keys.insert("model.d_model");
  }
  if (keys.empty()) return "model.d_model, model.vocab_size and model.seq_len";
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "" : " and ") + k;
  return out;
}

std::string existence_keys(const std::string& dataset) {
  if (dataset.find("/h.") != std::string::npos) return "model.layers";
  if (dataset.find("lm_head") != std::string::npos) return "model.tie_embeddings";
  return "the [model] section";
}

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

template <class From, class To>
void convert(const void* src, void* dst, int64_t n) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<To>(s[i]);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// checkpoint.io = "auto": independent transfers when every rank's pieces are long runs (ZeRO
// shards, whole tensors), where MPI-IO's aggregation only adds copies and a synchronisation per
// tensor; collective when some rank holds short strided runs (tensor-parallel column slices),
// which aggregation turns into large requests. Collective.
constexpr double kIndependentMinRunBytes = 256 << 10;

CheckpointFile::Transfer transfer_mode(CheckpointIo io, const std::vector<Entry>& entries,
                                       bool primary_only, DType dt, Communicator& world) {
  if (io == CheckpointIo::Collective) return CheckpointFile::Transfer::Collective;
  if (io == CheckpointIo::Independent) return CheckpointFile::Transfer::Independent;
  int64_t elements = 0, runs = 0;
  for (const Entry& e : entries)
    for_each_run(e.global, e.boxes(primary_only), [&](int64_t, int64_t n) {
      elements += n;
      ++runs;
    });
  const double mine = runs ? static_cast<double>(elements) * dtype_size(dt) / static_cast<double>(runs)
                           : kIndependentMinRunBytes;  // nothing to move: no objection
  return world.all_reduce_scalar(mine, ReduceOp::Min) >= kIndependentMinRunBytes
             ? CheckpointFile::Transfer::Independent
             : CheckpointFile::Transfer::Collective;
}

// Runs `transfer` on this rank: a collective transfer under one agreement each (a rank whose
// transfer failed must not leave the others inside the next collective); an independent one
// alone, keeping the first error in `error` for one agreement after the last, and skipping the
// rest once one failed. Returns whether it ran and succeeded here.
template <class F>
bool run_transfer(CheckpointFile::Transfer how, Communicator& world, std::string& error, F&& transfer) {
  if (how == CheckpointFile::Transfer::Collective) {
    agree(world, transfer);
    return true;
  }
  if (!error.empty()) return false;
  try {
    transfer();
    return true;
  } catch (const std::exception& e) {
    error = e.what();
    return false;
  }
}

// Where this rank's elements of one dataset are read to: straight into the model's memory
// when they are one piece in host memory stored in the run's precision (the common case: no
// copy), else a staging buffer that is applied once the checksums passed.
struct Landing {
  bool direct = false;
  DType type = DType::F32;     // as stored
  std::vector<char> staging;   // !direct
  char* data = nullptr;
};

// Reads every piece this rank holds of every dataset of `entries` (entry-major, then kind),
// and returns the checksum parts of the primary pieces summed over the world. A worker hashes
// each dataset while the next is read. Collective.
std::vector<uint64_t> read_owned(CheckpointFile& file, Communicator& world,
                                 const std::vector<Entry>& entries, DType run_type,
                                 CheckpointFile::Transfer how, std::vector<Landing>& landings) {
  landings.assign(entries.size() * kKinds, {});
  std::vector<uint64_t> sums(entries.size() * kKinds, 0);
  {
    BackgroundWorker hasher;
    std::string read_error;
    for (size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      for (int kind = 0; kind < kKinds; ++kind) {
        Landing& l = landings[i * kKinds + static_cast<size_t>(kind)];
        const bool read = run_transfer(how, world, read_error, [&] {
          const std::string name = dataset_name(e.name, kind);
          l.type = file.dtype(name);
          l.direct = e.pieces.size() == 1 && l.type == run_type &&
                     piece_tensor(e.pieces[0].owned, kind).device() == Device::Cpu;
          if (l.direct) {
            l.data = static_cast<char*>(piece_tensor(e.pieces[0].owned, kind).raw());
          } else {
            l.staging.resize(static_cast<size_t>(e.count(false)) * dtype_size(l.type));
            l.data = l.staging.data();
          }
          file.read(name, e.boxes(false), l.data, l.type, how);
        });
        if (!read) continue;
        hasher.post([&e, &sum = sums[i * kKinds + static_cast<size_t>(kind)], data = l.data, type = l.type] {
          size_t off = 0;
          for (const Piece& p : e.pieces) {
            if (p.owned.primary) sum += checksum_part(data + off, type, e.global, p.boxes);
            off += static_cast<size_t>(p.owned.count) * dtype_size(type);
          }
        });
      }
    }
    agree(world, [&] {
      hasher.wait();
      if (!read_error.empty()) throw std::runtime_error(read_error);
    });
  }
  return sum_over(world, sums);
}

// Compares the checksums of the data as read with the file's attributes (and, after a write,
// with what was written). Throws naming the first bad dataset.
void check_sums(const CheckpointFile& file, const std::vector<Entry>& entries,
                const std::vector<uint64_t>& sums, const std::vector<uint64_t>* written) {
  for (size_t i = 0; i < entries.size(); ++i)
    for (int kind = 0; kind < kKinds; ++kind) {
      const size_t j = i * kKinds + static_cast<size_t>(kind);
      const std::string name = dataset_name(entries[i].name, kind);
      const std::optional<uint64_t> stored = file.checksum(name);
      if (!stored)
        throw CheckpointFileError(file.path() + ": dataset " + name +
                                  " has no checksum attribute (not a complete meshtrain checkpoint)");
      if (*stored != sums[j] || (written && (*written)[j] != sums[j]))
        throw CheckpointFileError(file.path() + ": dataset " + name + ": checksum MISMATCH: the data "
                                  "read back sums to " + hex(sums[j]) + ", the file's checksum "
                                  "attribute says " + hex(*stored) +
                                  " (the file is damaged; use an older checkpoint)");
    }
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
  const char* env = std::getenv("MESHTRAIN_FAULT");
  const std::string fault = env ? env : "";
  const std::string prefix = "checkpoint_kill:";
  if (fault.rfind(prefix, 0) != 0) return;
  std::string phase = fault.substr(prefix.size());
  if (const size_t at = phase.find('@'); at != std::string::npos) {
    fault_step_ = std::atoll(phase.c_str() + at + 1);
    phase.resize(at);
  }
  if (phase == "data") fault_phase_ = FaultPhase::Data;
  else if (phase == "rename") fault_phase_ = FaultPhase::Rename;
  else if (phase == "prune") fault_phase_ = FaultPhase::Prune;
  else throw DeckError("MESHTRAIN_FAULT=" + fault + ": unknown phase '" + phase +
                       "' (expected checkpoint_kill:data, :rename or :prune, optionally @<step>)");
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

void Checkpointer::fault(FaultPhase phase, int64_t step) const {
  if (phase != fault_phase_ || (fault_step_ >= 0 && fault_step_ != step) || grid_.world_rank() != 0)
    return;
  const char* names[] = {"none", "data", "rename", "prune"};
  std::fprintf(stderr, "meshtrain: MESHTRAIN_FAULT: rank 0 kills itself in checkpoint phase '%s' at step %lld\n",
               names[static_cast<int>(phase)], static_cast<long long>(step));
  std::fflush(stdout);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

// ---- resume --------------------------------------------------------------------------------

std::string Checkpointer::resume_path() {
  Communicator& world = grid_.world();
  std::string path;
  agree(world, [&] {
    if (world.rank() != 0) return;
    pruner_->wait();
    const std::string& r = cfg_.checkpoint.resume;
    if (r == "none") return;
    if (r == "auto") {
      const auto all = complete_checkpoints(cfg_.checkpoint.dir);
      if (!all.empty()) path = all.back().second;
      return;
    }
    std::error_code ec;
    if (!fs::is_regular_file(r, ec))
      throw DeckError(cfg_.deck_path + ": checkpoint.resume = \"" + r + "\": no such checkpoint "
                      "file (give the path of a step_*.h5, \"auto\" or \"none\")");
    path = r;
  });
  world.broadcast_bytes(path, 0);
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

  agree(world, [&] {
    if (world.rank() != 0) return;
    pruner_->wait();
    std::error_code ec;
    if (!fs::create_directories(dir, ec) && ec)
      throw std::runtime_error(dir + ": cannot create the checkpoint directory (checkpoint.dir): " +
                               ec.message());
  });
  const std::vector<Entry> entries = plan_entries(trainer.state(), world);
  const CheckpointFile::Transfer how = transfer_mode(cfg_.checkpoint.io, entries, true, dt, world);
  CheckpointInfo info;
  info.step = step;
  info.optimizer_steps = trainer.state().steps_taken();
  info.seed = cfg_.run.seed;
  info.deck = cfg_.deck_text;
  info.layout = describe_layout(cfg_);
  info.world_size = grid_.world_size();
  info.meshtrain_version = MESHTRAIN_VERSION;
  info.created = utc_timestamp();
  world.broadcast_bytes(info.created, 0);  // attributes must be identical on every rank

  double data_seconds = 0, verify_seconds = 0;
  try {
    std::vector<uint64_t> sums(entries.size() * kKinds, 0);
    const auto data_start = std::chrono::steady_clock::now();
    {
      std::unique_ptr<CheckpointFile> file;
      agree(world, [&] { file = std::make_unique<CheckpointFile>(tmp, comm_, CheckpointFile::Access::Create); });
      agree(world, [&] {
        file->write_info(info);
        for (const Entry& e : entries)
          for (int kind = 0; kind < kKinds; ++kind) file->create_dataset(dataset_name(e.name, kind), e.global, dt);
      });
      // The worker hashes each dataset while MPI-IO writes it (both only read the data).
      std::deque<HostElements> held;  // copies the worker may still read
      size_t held_bytes = 0;
      std::string hash_error, write_error;
      BackgroundWorker hasher;
      EarlyWriteback writeback(tmp);
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i == entries.size() / 2) fault(FaultPhase::Data, step);
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
  } catch (const AgreedError&) {
    if (world.rank() == 0) {
      std::error_code ec;
      fs::remove(tmp, ec);
    }
    throw;
  }

  fault(FaultPhase::Rename, step);
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
  if (world.rank() == 0) pruner_->post([this, step] { prune(step); });

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

void Checkpointer::prune(int64_t step) {
  const auto all = complete_checkpoints(cfg_.checkpoint.dir);  // oldest first
  const size_t keep = static_cast<size_t>(std::max(1, cfg_.checkpoint.keep));
  bool deleted = false;
  for (size_t i = 0; i + keep < all.size(); ++i) {
    if (all[i].first == step) continue;  // never the one just written
    std::error_code ec;
    fs::remove(all[i].second, ec);
    if (ec)
      throw std::runtime_error(all[i].second + ": cannot delete an old checkpoint (checkpoint.keep = " +
                               std::to_string(cfg_.checkpoint.keep) + "): " + ec.message());
    if (!deleted) fault(FaultPhase::Prune, step);
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
  if (!deleted) fault(FaultPhase::Prune, step);
}

// ---- load ----------------------------------------------------------------------------------

CheckpointStats Checkpointer::load(Trainer& trainer, const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  Communicator& world = grid_.world();
  const DType dt = trainer.state().state_dtype();
  const GptConfig& m = cfg_.model;
  const std::vector<Entry> entries = plan_entries(trainer.state(), world);

  std::unique_ptr<CheckpointFile> file;
  agree(world, [&] {
    if (world.rank() == 0) pruner_->wait();
    file = std::make_unique<CheckpointFile>(path, comm_, CheckpointFile::Access::Read);
  });
  CheckpointInfo info;
  agree(world, [&] {
    info = file->read_info();
    if (info.format_version != kCheckpointFormatVersion)
      throw CheckpointFileError(path + ": format_version = " + std::to_string(info.format_version) +
                                " is not supported (this meshtrain " MESHTRAIN_VERSION " reads version " +
                                std::to_string(kCheckpointFormatVersion) + ")");
    if (info.step < 0 || info.optimizer_steps < 0)
      throw CheckpointFileError(path + ": step = " + std::to_string(info.step) + ", optimizer_steps = " +
                                std::to_string(info.optimizer_steps) + " (expected >= 0)");
  });
  // The file must hold exactly the deck's model: every dataset, each with the global shape and
  // a checksum. These refusals come before any data is read: the trainer is left as it was.
  agree(world, [&] {
    std::set<std::string> expected;
    for (const Entry& e : entries)
      for (int kind = 0; kind < kKinds; ++kind) {
        const std::string name = dataset_name(e.name, kind);
        expected.insert(name);
        if (!file->has_dataset(name))
          throw CheckpointFileError(path + ": dataset " + name + " is missing, but the deck's model has "
                                    "parameter " + e.name + " " + e.global.to_string() + " (check " +
                                    existence_keys(name) + " against the deck in the file's 'deck' attribute)");
        const Shape s = file->shape(name);
        if (s != e.global)
          throw CheckpointFileError(path + ": dataset " + name + " has shape " + s.to_string() +
                                    " but the deck's model needs " + e.global.to_string() + " (check " +
                                    shape_keys(s, e.global, m) + " against the deck in the file's 'deck' attribute)");
        if (!file->checksum(name))
          throw CheckpointFileError(path + ": dataset " + name +
                                    " has no checksum attribute (not a complete meshtrain checkpoint)");
      }
    for (const std::string& name : file->dataset_names())
      if (!expected.count(name))
        throw CheckpointFileError(path + ": dataset " + name + " is not part of the deck's model (check " +
                                  existence_keys(name) + " against the deck in the file's 'deck' attribute)");
  });

  const auto data_start = std::chrono::steady_clock::now();
  for (const Entry& e : entries)
    for (int kind = 0; kind < kKinds; ++kind) file->prefetch(dataset_name(e.name, kind), e.boxes(false));
  std::vector<Landing> landings;
  const CheckpointFile::Transfer how = transfer_mode(cfg_.checkpoint.io, entries, false, dt, world);
  const std::vector<uint64_t> sums = read_owned(*file, world, entries, dt, how, landings);
  const double data_seconds = seconds_since(data_start);
  // A mismatch is found after the data was read (mostly straight into the model): the
  // refusal then leaves the trainer's state undefined, and the run must stop.
  agree(world, [&] {
    check_sums(*file, entries, sums, nullptr);
    file->close();
  });

  // Verified: apply what was staged, converting where the file's precision is not the run's.
  std::vector<char> converted;
  for (size_t i = 0; i < entries.size(); ++i)
    for (int kind = 0; kind < kKinds; ++kind) {
      const Landing& l = landings[i * kKinds + static_cast<size_t>(kind)];
      if (l.direct) continue;
      size_t off = 0;
      for (const Piece& p : entries[i].pieces) {
        const char* src = l.data + off;
        off += static_cast<size_t>(p.owned.count) * dtype_size(l.type);
        if (l.type != dt) {
          converted.resize(static_cast<size_t>(p.owned.count) * dtype_size(dt));
          if (l.type == DType::F64) convert<double, float>(src, converted.data(), p.owned.count);
          else convert<float, double>(src, converted.data(), p.owned.count);
          src = converted.data();
        }
        Tensor t = piece_tensor(p.owned, kind);
        p.owned.backend->copy_from_host(t, src);
      }
    }
  trainer.state().set_steps_taken(info.optimizer_steps);
  trainer.state().sync_after_load();
  trainer.set_step(static_cast<int>(info.step));

  CheckpointStats stats;
  stats.path = path;
  stats.step = info.step;
  std::error_code ec;
  const double size = world.rank() == 0 ? static_cast<double>(fs::file_size(path, ec)) : 0.0;
  stats.bytes = static_cast<int64_t>(world.all_reduce_scalar(size, ReduceOp::Max));
  stats.seconds = world.all_reduce_scalar(seconds_since(t0), ReduceOp::Max);
  stats.data_seconds = world.all_reduce_scalar(data_seconds, ReduceOp::Max);
  stats.independent = how == CheckpointFile::Transfer::Independent;
  return stats;
}

}  // namespace meshtrain
