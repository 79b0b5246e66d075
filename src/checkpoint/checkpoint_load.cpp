// Checkpointer::load (checkpoint/checkpointer.h): structure and model checks first, then every
// rank's pieces read and hashed, verified, and applied.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/blocking_watchdog.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/terminal_text.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "background_worker.h"
#include "checkpoint_buffers.h"
#include "checkpoint_entries.h"
#include "checkpoint_transfer.h"
#include "model_signature.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// Which deck keys decide a dataset's shape or existence, as a hint in refusals.
std::string shape_keys(const Shape& file, const Shape& want, const ModelSpec& m) {
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

// The tensor a dataset stores: /model/<name>, /optim/<name>/<moment>, /buffers/<name>.
std::string tensor_of(const std::string& dataset) {
  for (const char* group : {"/model/", "/buffers/"})
    if (dataset.rfind(group, 0) == 0) return dataset.substr(std::char_traits<char>::length(group));
  const std::string optim = "/optim/";
  if (dataset.rfind(optim, 0) == 0) {
    const size_t moment = dataset.rfind('/');
    return dataset.substr(optim.size(), moment > optim.size() ? moment - optim.size() : std::string::npos);
  }
  return dataset;
}

// Which deck keys decide whether a dataset exists, as a hint in refusals: the model's answer
// for the tensor it stores (PipelineStage::setting_deciding).
std::string existence_keys(const std::string& dataset, const PipelineStage& stage) {
  return stage.setting_deciding(tensor_of(dataset));
}

template <class From, class To>
void convert(const void* src, void* dst, int64_t n) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<To>(s[i]);
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
          if (how != CheckpointFile::Transfer::Collective) return file.read(name, e.boxes(false), l.data, l.type, how);
          const CollectiveRegion region(world, "collective read of dataset " + name + " from " + file.path());
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

// The first element of `n` at `v` that is not finite (or, with `non_negative`, below zero), or -1.
template <class T>
int64_t first_bad(const T* v, int64_t n, bool non_negative) {
  for (int64_t j = 0; j < n; ++j)
    if (!std::isfinite(v[j]) || (non_negative && v[j] < 0)) return j;
  return -1;
}

// Refuses values a healthy run never saves: a parameter or AdamW moment that is not finite, a
// second moment (a running mean of squares) below zero. Checksums only say that the values are
// the ones written; a file written so (or crafted) would otherwise load, and the first step would
// report it as divergence and advise a lower learning rate. Each rank checks what it read.
void check_values(const std::string& path, const std::vector<Entry>& entries, const std::vector<Landing>& landings) {
  for (size_t i = 0; i < entries.size(); ++i)
    for (int kind = 0; kind < kKinds; ++kind) {
      const Entry& e = entries[i];
      const Landing& l = landings[i * kKinds + static_cast<size_t>(kind)];
      const bool non_negative = kind == 2;
      const size_t size = dtype_size(l.type);
      size_t off = 0;
      int64_t bad_index = -1;
      double bad_value = 0;
      for (const Piece& p : e.pieces) {
        int64_t packed = 0;
        for_each_run(e.global, p.boxes, [&](int64_t first, int64_t n) {
          const char* run = l.data + off + static_cast<size_t>(packed) * size;
          packed += n;
          if (bad_index >= 0) return;
          const int64_t j = l.type == DType::F64 ? first_bad(reinterpret_cast<const double*>(run), n, non_negative)
                                                 : first_bad(reinterpret_cast<const float*>(run), n, non_negative);
          if (j < 0) return;
          bad_index = first + j;
          bad_value = l.type == DType::F64 ? reinterpret_cast<const double*>(run)[j]
                                           : reinterpret_cast<const float*>(run)[j];
        });
        off += static_cast<size_t>(p.owned.count) * size;
        if (bad_index >= 0) break;
      }
      if (bad_index < 0) continue;
      char value[32];
      std::snprintf(value, sizeof value, "%g", bad_value);
      const char* rule = kind == 0   ? "a parameter is finite"
                         : kind == 1 ? "AdamW's first moment is finite"
                                     : "AdamW's second moment, a running mean of squared gradients, is finite and >= 0";
      throw CheckpointFileError(path + ": dataset " + dataset_name(e.name, kind) + " holds " + value +
                                " at element " + std::to_string(bad_index) + " (row-major, of " +
                                e.global.to_string() + "), but " + rule +
                                ": the file was not written by a healthy run (its checksums match what was "
                                "stored); resume from another checkpoint");
    }
}

// Refuses (CheckpointFileError) a file that does not hold exactly the deck's model: every
// dataset of `entries` and `buffers` present with its global shape and a checksum, and no other.
void check_datasets(CheckpointFile& file, const std::string& path, const std::vector<Entry>& entries,
                    const std::vector<BufferTensor>& buffers, const ModelSpec& m, const PipelineStage& stage) {
  // One walk over the file's names (has_dataset per name walks the path again each time).
  const std::vector<std::string> names = file.dataset_names();
  const std::set<std::string> present(names.begin(), names.end());
  std::set<std::string> expected;
  auto expect = [&](const std::string& name, const std::string& what, const Shape& global) {
    expected.insert(name);
    if (!present.count(name))
      throw CheckpointFileError(path + ": dataset " + name + " is missing, but the deck's model has " +
                                what + " " + global.to_string() + " (check " + existence_keys(name, stage) +
                                " against the file's 'config' attribute: meshtrain inspect)");
    const Shape s = file.shape(name);
    if (s != global)
      throw CheckpointFileError(path + ": dataset " + name + " has shape " + s.to_string() +
                                " but the deck's model needs " + global.to_string() + " (check " +
                                shape_keys(s, global, m) + " against the file's 'config' attribute: meshtrain inspect)");
    if (!file.checksum(name))
      throw CheckpointFileError(path + ": dataset " + name +
                                " has no checksum attribute (not a complete meshtrain checkpoint)");
  };
  for (const Entry& e : entries)
    for (int kind = 0; kind < kKinds; ++kind) expect(dataset_name(e.name, kind), "parameter " + e.name, e.global);
  for (const BufferTensor& b : buffers) expect(buffer_dataset(b.name), b.what + " " + b.name, b.global);
  for (const std::string& name : names)
    if (!expected.count(name))
      throw CheckpointFileError(path + ": dataset " + terminal_safe(name) + " is not part of the deck's model (check " +
                                existence_keys(name, stage) + " against the file's 'config' attribute: meshtrain inspect)");
}

// Copies what was read into a staging buffer (Landing::direct false) into the model, converting
// where the file's precision is not the run's `dt`.
void apply_staged(const std::vector<Entry>& entries, const std::vector<Landing>& landings, DType dt) {
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
}

}  // namespace

CheckpointStats Checkpointer::load(ModelState& state, const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  wait_for_save();
  Communicator& world = grid_.world();
  const DType dt = state.state_dtype();
  const ModelSpec& m = cfg_.model;
  const std::vector<Entry> entries = plan_entries(state, world);
  std::vector<BufferTensor> buffers = buffers_of(state.stage());  // their names and shapes

  std::unique_ptr<CheckpointFile> file;
  agree(world, [&] {
    if (world.rank() == 0) pruner_->wait();
    const CollectiveRegion region(world, "opening " + path);
    file = std::make_unique<CheckpointFile>(path, comm_, CheckpointFile::Access::Read);
  });
  CheckpointInfo info;
  std::vector<SettingChange> extension;
  agree(world, [&] {
    info = file->read_info();
    if (info.format_version != kCheckpointFormatVersion)
      throw CheckpointFileError(path + ": format_version = " + std::to_string(info.format_version) +
                                " is not supported (this meshtrain " MESHTRAIN_VERSION " reads version " +
                                std::to_string(kCheckpointFormatVersion) +
                                (info.format_version == 1 ? "; version 1 does not record the model's "
                                 "settings, such as model.heads, that loading must check" : "") + ")");
    if (info.model.empty() || info.lineage.empty())
      throw CheckpointFileError(path + ": has no attribute '" + (info.model.empty() ? "model" : "lineage") +
                                "' (not a complete meshtrain checkpoint)");
    extension = check_model_signature(path, info.model, m, cfg_.deck_path, info.meshtrain_version,
                                      tokenizer_signature(cfg_.data.tokenizer));
    check_optimizer_signature(path, info.optimizer, info.optimizer_steps, cfg_.train.optimizer,
                              cfg_.deck_path);
  });
  // The file must hold exactly the deck's model: every dataset, each with the global shape and
  // a checksum. These refusals come before any data is read: the trainer is left as it was.
  agree(world, [&] { check_datasets(*file, path, entries, buffers, m, state.stage()); });

  // No read-ahead advice (POSIX_FADV_WILLNEED) before or during the reads: the OS's own
  // read-ahead of sequential reads does better: the advice allocates the page cache for its
  // span before returning, and the reads then wait for its requests, whether every span is
  // advised before the checks or 32 MB ahead of the reads from a thread of its own (measured
  // with bench --suite checkpoint: docs/benchmarks.md, 2026-11-27).
  const auto data_start = std::chrono::steady_clock::now();
  std::vector<Landing> landings;
  const CheckpointFile::Transfer how = transfer_mode(cfg_.checkpoint.io, entries, TransferDirection::Load, dt, world);
  const std::vector<uint64_t> sums = read_owned(*file, world, entries, dt, how, landings);
  const double data_seconds = seconds_since(data_start);
  // A mismatch is found after the data was read (mostly straight into the model): the
  // refusal then leaves the trainer's state undefined, and the run must stop.
  if (!buffers.empty())
    agree(world, [&] {
      const CollectiveRegion region(world, "reading the model's buffers from " + path);
      read_buffers(*file, buffers, how);
    });
  agree(world, [&] {
    check_sums(*file, entries, sums, nullptr);
    const CollectiveRegion region(world, "closing " + path);
    file->close();
  });
  agree(world, [&] { check_values(path, entries, landings); });

  // Verified: apply what was staged, converting where the file's precision is not the run's.
  apply_staged(entries, landings, dt);
  apply_buffers(buffers, state.stage());
  state.set_steps_taken(info.optimizer_steps);
  state.sync_after_load();
  lineage_ = info.lineage;  // saves from here on continue the loaded run

  CheckpointStats stats;
  stats.path = path;
  stats.step = info.step;
  stats.data_blend = info.data_blend;
  for (const SettingChange& c : extension)
    stats.context_extension += (stats.context_extension.empty() ? "" : ", ") + ("model." + c.key) + " " +
                               c.from + " -> " + c.to;
  std::error_code ec;
  const double size = world.rank() == 0 ? static_cast<double>(fs::file_size(path, ec)) : 0.0;
  stats.bytes = static_cast<int64_t>(world.all_reduce_scalar(size, ReduceOp::Max));
  stats.seconds = world.all_reduce_scalar(seconds_since(t0), ReduceOp::Max);
  stats.data_seconds = world.all_reduce_scalar(data_seconds, ReduceOp::Max);
  stats.independent = how == CheckpointFile::Transfer::Independent;
  return stats;
}

}  // namespace meshtrain
