// write_imported_checkpoint (checkpoint/checkpoint_import.h): the Checkpointer's format, written by
// one rank from whole tensors.

#include "meshtrain/checkpoint/checkpoint_import.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "meshtrain/config/config_dump.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/model/parameter_table.h"
#include "checkpoint_buffers.h"
#include "checkpoint_directory.h"
#include "checkpoint_entries.h"
#include "model_signature.h"

namespace meshtrain {

namespace fs = std::filesystem;

std::map<std::string, std::vector<int64_t>> checkpoint_parameters(const ModelSpec& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const ParamEntry& e : parameter_table(m)) {
    std::vector<int64_t>& dims = out[e.name];
    for (int k = 0; k < e.shape.rank(); ++k) dims.push_back(e.shape[k]);
  }
  return out;
}

namespace {

Shape to_shape(const std::vector<int64_t>& d) {
  switch (d.size()) {
    case 1:
      return Shape{d[0]};
    case 2:
      return Shape{d[0], d[1]};
    case 3:
      return Shape{d[0], d[1], d[2]};
    default:
      throw std::logic_error("checkpoint import: a parameter of rank " + std::to_string(d.size()));
  }
}

Box whole(const Shape& s) {
  Box b;
  for (int k = 0; k < s.rank(); ++k) b.count[k] = s[k];
  return b;
}

}  // namespace

void check_import_destination(const std::string& path, bool replace) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (fs::is_directory(status))
    throw std::runtime_error(path + ": is a directory; meshtrain import writes a checkpoint file (e.g. " +
                             (fs::path(path) / "step_00000000.h5").string() + ")");
  if (fs::exists(status) && !replace)
    throw std::runtime_error(path + ": already exists; meshtrain import writes a new file and never over "
                             "another (give a path that does not exist, or --force to replace it)");
  if (fs::exists(status) && !fs::is_regular_file(status))
    throw std::runtime_error(path + ": exists and is not a regular file; --force replaces only a file");
  // The file is written under <path>.tmp first (a failure leaves nothing at `path`); one there
  // already is someone's: an interrupted import's, or a run's checkpoint being written now.
  if (fs::exists(fs::symlink_status(path + ".tmp", ec)))
    throw std::runtime_error(path + ".tmp: already exists, and meshtrain import writes " + path +
                             " under that name first (left by an interrupted import, or a run is writing "
                             "it now): delete it if nothing is writing it");
  const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  std::string others;
  // `path` itself among them too: --force replaces a file, never a run's checkpoint.
  for (const StoredCheckpoint& s : scan_checkpoints(dir.string())) {
    others += (others.empty() ? "" : ", ") + fs::path(s.path).filename().string() + " (" +
              (s.lineage.empty() ? "lineage unknown: " + s.problem : "lineage " + s.lineage) + ")";
  }
  if (!others.empty())
    throw std::runtime_error(dir.string() + " holds checkpoints of another run (" + others + "); an import "
                             "starts a run of its own, and a checkpoint of it there would stop that run "
                             "from resuming (a checkpoint.dir holds one run's checkpoints): write "
                             + fs::path(path).filename().string() + " into a directory of its own (or delete "
                             "those checkpoints yourself if they are no longer wanted)");
}

void write_imported_checkpoint(const std::string& path, const Config& config,
                               const std::map<std::string, std::vector<float>>& values,
                               const std::vector<StageBuffer>& buffers, bool replace) {
  check_import_destination(path, replace);
  const auto params = checkpoint_parameters(config.model);
  for (const auto& [name, shape] : params) {
    const auto it = values.find(name);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (it == values.end() || static_cast<int64_t>(it->second.size()) != n)
      throw std::logic_error("checkpoint import: no values, or not " + std::to_string(n) + ", for " + name);
  }
  if (values.size() != params.size())
    throw std::logic_error("checkpoint import: values beyond the model's parameters");

  // The optimizer's precision: fp64 runs keep float64 state, every other run float32 (bf16
  // runs hold fp32 master weights).
  const DType dt = config.train.precision == DType::F64 ? DType::F64 : DType::F32;
  CheckpointInfo info;
  info.step = 0;
  info.optimizer_steps = 0;
  info.seed = config.run.seed;
  info.deck = config.deck_text;
  for (const std::string& o : config.overrides) info.overrides += o + "\n";
  info.config = dump_config(config);
  // The deck's tokenizer, as a run records it: a fine-tune resuming this file with the same deck
  // must find the tokenizer it names, not the byte tokenizer.
  info.model = model_signature(config.model, tokenizer_signature(config.data.tokenizer));
  info.lineage = new_lineage_id();  // a run of its own: continued by the run that resumes it
  info.layout = "import (one rank; the deck's layout: " + describe_layout(config) + ")";
  info.world_size = 1;
  info.meshtrain_version = MESHTRAIN_VERSION;
  info.created = utc_timestamp();
  info.optimizer = optimizer_signature(config.train.optimizer);

  const std::string tmp = path + ".tmp";
  try {
    CheckpointFile file(tmp, MPI_COMM_SELF, CheckpointFile::Access::Create);
    file.write_info(info);
    for (const auto& [name, dims] : params)
      for (int kind = 0; kind < kKinds; ++kind)
        file.create_dataset(dataset_name(name, kind), to_shape(dims), dt);
    for (const StageBuffer& b : buffers) file.create_dataset(buffer_dataset(b.name), b.shape, DType::F64);
    file.reserve_space();
    std::vector<char> buf;
    for (const auto& [name, dims] : params) {
      const Shape shape = to_shape(dims);
      const std::vector<float>& v = values.at(name);
      buf.assign(v.size() * dtype_size(dt), 0);  // the moments: zero
      for (int kind = 0; kind < kKinds; ++kind) {
        if (kind == 0) {
          if (dt == DType::F32) {
            std::memcpy(buf.data(), v.data(), buf.size());
          } else {
            double* d = reinterpret_cast<double*>(buf.data());
            for (size_t i = 0; i < v.size(); ++i) d[i] = v[i];
          }
        } else if (kind == 1) {
          std::fill(buf.begin(), buf.end(), 0);
        }
        const std::string ds = dataset_name(name, kind);
        file.write(ds, {whole(shape)}, buf.data(), dt);
        file.set_checksum(ds, checksum_part(buf.data(), dt, shape, {whole(shape)}));
      }
    }
    for (const StageBuffer& b : buffers) {
      if (static_cast<int64_t>(b.values->size()) != b.shape.numel())
        throw std::logic_error("checkpoint import: not " + std::to_string(b.shape.numel()) + " values for " + b.name);
      file.write(buffer_dataset(b.name), {whole(b.shape)}, b.values->data(), DType::F64);
      file.set_checksum(buffer_dataset(b.name), checksum_part(b.values->data(), DType::F64, b.shape, {whole(b.shape)}));
    }
    file.close();
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw std::runtime_error(e.what());
  }
  std::error_code ec;
  if (replace) {
    fs::rename(tmp, path, ec);
  } else {
    const int error = rename_without_replacing(tmp, path);
    if (error == EEXIST) {
      fs::remove(tmp, ec);
      throw std::runtime_error(path + ": already exists (it appeared while the import was written); "
                               "meshtrain import never writes over another file (--force replaces it)");
    }
    if (error != 0) ec = std::error_code(error, std::generic_category());
  }
  if (ec) {
    fs::remove(tmp, ec);
    throw std::runtime_error(tmp + ": cannot rename to " + path + ": " + ec.message());
  }
}

}  // namespace meshtrain
