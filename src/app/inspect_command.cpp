// `meshtrain inspect PATH`: what a checkpoint holds — step, lineage, layout, the model and the
// effective configuration it was trained with (the deck with its --set overrides), every dataset
// with its shape, type and size — and whether each dataset's data still matches its checksum.
// One rank reads the whole file; exit status 1 on any problem (a directory or unreadable file,
// unsupported version, a missing moment, a missing or mismatching checksum, a parameter the
// recorded model has missing or of another shape, or one it does not have; the router's expert
// bias missing, of another shape or type; a value that is not finite, a second moment below 0;
// any other dataset; no @model or @lineage): what training's load refuses, inspect reports.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <vector>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/docs_page.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/terminal_text.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/model/expert_bias.h"
#include "meshtrain/model/parameter_table.h"

namespace meshtrain {

namespace {

size_t count_lines(const std::string& text) {
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

// The run and model `text` (a deck, or the effective configuration) describes.
std::string config_summary(const std::string& text) {
  char size[64];
  std::snprintf(size, sizeof size, " (%zu lines, %zu bytes)", count_lines(text), text.size());
  try {
    const Config c = parse_deck("<checkpoint config>", text);
    const ModelSpec& m = c.model;
    char buf[256];
    std::snprintf(buf, sizeof buf, "run %s; model %d layers, d_model %ld, %ld heads, seq_len %ld, "
                  "vocab %ld%s, %.2fM parameters; precision %s",
                  terminal_safe(c.run.name).c_str(), m.layers, static_cast<long>(m.d_model), static_cast<long>(m.heads),
                  static_cast<long>(m.seq_len), static_cast<long>(m.vocab_size),
                  m.tie_embeddings ? " (tied)" : "", static_cast<double>(m.parameter_count()) / 1e6,
                  std::string(dtype_name(c.train.precision)).c_str());
    return buf;
  } catch (const std::exception& e) {
    return "does not parse: " + terminal_safe(e.what()) + size;
  }
}

// What inspect says when given a directory: which checkpoints there are to inspect.
std::string directory_error(const std::string& path) {
  const auto all = Checkpointer::complete_checkpoints(path);
  std::string msg = path + ": is a directory, not a checkpoint file";
  if (all.empty()) return msg + " (it holds no complete step_*.h5: give the path of a checkpoint file)";
  return msg + " (inspect one of the " + std::to_string(all.size()) + " checkpoint(s) it holds, e.g. "
         "the newest: " + all.back().second + ")";
}

// Row-major slices of `shape` of at most `budget` elements each (one element at least): whole
// trailing dimensions where they fit, the dimension before them cut into runs.
std::vector<Box> slices(const Shape& shape, int64_t budget) {
  int k = shape.rank() - 1;  // the dimension that is cut
  int64_t inner = 1;         // elements of one index of dimension k
  while (k > 0 && inner * shape[k] <= budget) inner *= shape[k--];
  const int64_t run = std::max<int64_t>(1, budget / inner);
  std::vector<Box> out;
  if (shape.numel() == 0) return out;
  Box b;
  for (int j = 0; j < shape.rank(); ++j) b.count[j] = j < k ? 1 : shape[j];
  while (true) {
    for (int64_t at = 0; at < shape[k]; at += run) {
      b.start[k] = at;
      b.count[k] = std::min(run, shape[k] - at);
      out.push_back(b);
    }
    int j = k - 1;  // the next index of the dimensions before k, odometer-wise
    while (j >= 0 && ++b.start[j] == shape[j]) b.start[j--] = 0;
    if (j < 0) return out;
  }
}

// What training's load requires of a dataset's values (checkpoint/checkpoint_load.cpp's
// check_values): parameters and moments finite, the second moment also >= 0; null for datasets it
// does not check value by value (the expert bias: compare_buffers).
const char* value_rule(const std::string& name, bool& non_negative) {
  non_negative = false;
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (name.rfind("/model/", 0) == 0) return "a parameter is finite";
  if (name.rfind("/optim/", 0) != 0) return nullptr;
  if (ends_with("/exp_avg")) return "AdamW's first moment is finite";
  non_negative = ends_with("/exp_avg_sq");
  return non_negative ? "AdamW's second moment, a running mean of squared gradients, is finite and >= 0" : nullptr;
}

template <typename T>
int64_t first_bad(const T* v, int64_t n, bool non_negative) {
  for (int64_t j = 0; j < n; ++j)
    if (!std::isfinite(v[j]) || (non_negative && v[j] < 0)) return j;
  return -1;
}

// The first value of a dataset that training's load would refuse: its row-major index (-1: none).
struct BadValue {
  int64_t index = -1;
  double value = 0;
};

// The checksum of `name` as stored, read a slice at a time: the memory inspect takes is bounded
// whatever the dataset declares (the file's own size bounds it too: CheckpointFile refuses a
// dataset that declares more than it stores). Where `rule` is given, `bad` receives the first
// value that breaks it.
uint64_t stored_sum(CheckpointFile& file, const std::string& name, const Shape& shape, DType type,
                    const char* rule, bool non_negative, BadValue& bad) {
  constexpr int64_t kSliceBytes = int64_t{64} << 20;
  uint64_t sum = 0;
  std::vector<char> data;
  for (const Box& b : slices(shape, kSliceBytes / static_cast<int64_t>(dtype_size(type)))) {
    const int64_t n = b.numel(shape.rank());
    data.resize(static_cast<size_t>(n) * dtype_size(type));
    file.read(name, {b}, data.data(), type);
    sum += checksum_part(data.data(), type, shape, {b});
    if (!rule || bad.index >= 0) continue;
    const int64_t j = type == DType::F64 ? first_bad(reinterpret_cast<const double*>(data.data()), n, non_negative)
                                         : first_bad(reinterpret_cast<const float*>(data.data()), n, non_negative);
    if (j < 0) continue;
    // A slice is one row-major run (slices() cuts one dimension, whole dimensions after it).
    int64_t start = 0;
    for (int k = 0; k < shape.rank(); ++k) start = start * shape[k] + b.start[k];
    bad.index = start + j;
    bad.value = type == DType::F64 ? reinterpret_cast<const double*>(data.data())[j]
                                   : reinterpret_cast<const float*>(data.data())[j];
  }
  return sum;
}

// The sigmoid router's expert bias of the recorded model against /buffers, as training's load
// checks it (checkpoint/checkpoint_buffers.h): each tensor present, of shape (E), stored float64
// and finite. `expected` receives their names. Returns the problems found.
int compare_buffers(CheckpointFile& file, const ModelSpec& model, std::set<std::string>& expected) {
  int problems = 0;
  const ExpertBias bias(model);
  for (int layer : bias.layers()) {
    const std::string name = "/buffers/" + bias.name_in_model(layer);
    const Shape want{bias.experts()};
    expected.insert(name);
    if (!file.has_dataset(name)) {
      std::printf("problem: %s is missing, but the recorded model has the router's expert bias %s %s\n",
                  name.c_str(), bias.name_in_model(layer).c_str(), want.to_string().c_str());
      ++problems;
      continue;
    }
    if (file.shape(name) != want) {
      std::printf("problem: %s has shape %s, but the recorded model's router has %s experts\n", name.c_str(),
                  file.shape(name).to_string().c_str(), want.to_string().c_str());
      ++problems;
      continue;
    }
    if (file.dtype(name) != DType::F64) {
      std::printf("problem: %s is float32, but the router's expert bias is stored float64\n", name.c_str());
      ++problems;
      continue;
    }
    std::vector<double> values(static_cast<size_t>(want.numel()));
    Box all;
    all.count[0] = want[0];
    file.read(name, {all}, values.data(), DType::F64);
    for (size_t j = 0; j < values.size(); ++j)
      if (!std::isfinite(values[j])) {
        std::printf("problem: %s holds %s at element %zu, but the router's expert bias is finite\n",
                    name.c_str(), std::to_string(values[j]).c_str(), j);
        ++problems;
        break;
      }
  }
  return problems;
}

// The datasets against the model the checkpoint records (its effective configuration, else its
// deck), as training's load checks them: every parameter of its table (a parameter missing or of
// another shape is damage that every checksum can miss), the expert bias, and nothing else.
// Returns the problems found.
int compare_with_model(CheckpointFile& file, const CheckpointInfo& info) {
  ModelSpec model;
  std::vector<ParamEntry> table;
  try {
    const std::string& recorded = info.config.empty() ? info.deck : info.config;
    model = parse_deck("<checkpoint config>", recorded).model;
    table = parameter_table(model);
  } catch (const std::exception&) {
    return 0;  // the config line already says that it does not parse
  }
  int problems = 0;
  std::set<std::string> parameters, expected;
  for (const ParamEntry& e : table) {
    const std::string name = "/model/" + e.name;
    parameters.insert(name);
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) expected.insert("/optim/" + e.name + "/" + moment);
    if (!file.has_dataset(name)) {
      std::printf("problem: %s is missing, but the recorded model has the parameter %s %s\n", name.c_str(),
                  e.name.c_str(), e.shape.to_string().c_str());
      ++problems;
    } else if (file.shape(name) != e.shape) {
      std::printf("problem: %s has shape %s, but the recorded model's %s is %s\n", name.c_str(),
                  file.shape(name).to_string().c_str(), e.name.c_str(), e.shape.to_string().c_str());
      ++problems;
    }
  }
  problems += compare_buffers(file, model, expected);
  const std::vector<std::string> names = file.dataset_names();
  const std::set<std::string> present(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name.rfind("/model/", 0) == 0) {
      if (!parameters.count(name)) {
        std::printf("problem: %s is not a parameter of the recorded model\n", terminal_safe(name).c_str());
        ++problems;
      }
      continue;
    }
    if (expected.count(name)) continue;
    // The moments of a /model dataset that is not a parameter: that dataset's line says it.
    const size_t slash = name.rfind('/');
    const std::string owner = name.rfind("/optim/", 0) == 0 ? "/model/" + name.substr(7, slash - 7) : "";
    if (!owner.empty() && present.count(owner) && !parameters.count(owner)) continue;
    std::printf("problem: %s is not part of the recorded model\n", terminal_safe(name).c_str());
    ++problems;
  }
  return problems;
}

// Every dataset's line (shape, type, size, checksum) and the problems of each alone: a checksum
// missing or mismatching, a value training's load refuses, a parameter without both moments.
// Adds the parameters' elements to `parameters`; returns the problems found.
int check_datasets(CheckpointFile& file, int64_t& parameters) {
  int problems = 0;
  const std::vector<std::string> names = file.dataset_names();
  std::printf("# %-44s %-16s %-8s %12s  %s\n", "dataset", "shape", "dtype", "bytes", "checksum");
  for (const std::string& name : names) {
    const Shape shape = file.shape(name);
    const DType type = file.dtype(name);
    if (name.rfind("/model/", 0) == 0) parameters += shape.numel();
    bool non_negative = false;
    const char* rule = value_rule(name, non_negative);
    BadValue bad;
    const uint64_t sum = stored_sum(file, name, shape, type, rule, non_negative, bad);
    const std::optional<uint64_t> stored = file.checksum(name);
    const char* verdict = !stored ? "MISSING" : *stored == sum ? "checksum OK" : "MISMATCH";
    if (!stored || *stored != sum) ++problems;
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(type);
    std::printf("  %-44s %-16s %-8s %12zu  %s\n", terminal_safe(name).c_str(), shape.to_string().c_str(),
                type == DType::F32 ? "float32" : "float64", bytes, verdict);
    if (bad.index >= 0) {
      std::printf("problem: %s holds %g at element %lld (row-major, of %s), but %s\n", terminal_safe(name).c_str(),
                  bad.value, static_cast<long long>(bad.index), shape.to_string().c_str(), rule);
      ++problems;
    }
    // Every parameter carries both AdamW moments of its shape.
    const std::string prefix = "/model/";
    if (name.rfind(prefix, 0) == 0) {
      for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
        const std::string m = "/optim/" + name.substr(prefix.size()) + "/" + moment;
        if (!file.has_dataset(m) || file.shape(m) != shape) {
          std::printf("problem: %s is missing or not of shape %s\n", terminal_safe(m).c_str(),
                      shape.to_string().c_str());
          ++problems;
        }
      }
    }
  }
  return problems;
}

// Returns the number of problems found.
int inspect_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw std::runtime_error(directory_error(path));
  CheckpointFile file(path, MPI_COMM_SELF, CheckpointFile::Access::Read);
  const CheckpointInfo info = file.read_info();
  const auto bytes = std::filesystem::file_size(path, ec);
  std::printf("checkpoint %s (%.1f MB)\n", path.c_str(), static_cast<double>(bytes) / 1e6);
  std::printf("format_version %d, written by meshtrain %s at %s\n", info.format_version,
              terminal_safe(info.meshtrain_version).c_str(), terminal_safe(info.created).c_str());
  std::printf("step %lld (optimizer steps %lld), seed %llu\n", static_cast<long long>(info.step),
              static_cast<long long>(info.optimizer_steps), static_cast<unsigned long long>(info.seed));
  std::printf("lineage %s\n", info.lineage.empty() ? "(none recorded)" : info.lineage.c_str());
  std::printf("layout %s (%d ranks)\n", terminal_safe(info.layout).c_str(), info.world_size);
  // The effective configuration is what the run trained; version 1 files only have the deck.
  if (!info.config.empty()) {
    std::printf("config: %s\n", config_summary(info.config).c_str());
  } else {
    std::printf("config: not recorded (format_version %d); the deck without its --set overrides: %s\n",
                info.format_version, info.deck.empty() ? "(empty)" : config_summary(info.deck).c_str());
  }
  std::printf("deck: %zu lines, %zu bytes%s\n", count_lines(info.deck), info.deck.size(),
              info.deck.empty() ? " (the run's Config was built in code)" : "");
  std::string overrides;
  for (size_t at = 0; at < info.overrides.size();) {
    const size_t end = std::min(info.overrides.find('\n', at), info.overrides.size());
    overrides += " --set " + terminal_safe(info.overrides.substr(at, end - at));
    at = end + 1;
  }
  std::printf("overrides:%s\n", overrides.empty() ? " none" : overrides.c_str());
  if (!info.model.empty()) {
    std::printf("model settings (checked on load):");
    for (size_t at = 0; at < info.model.size();) {
      const size_t end = std::min(info.model.find('\n', at), info.model.size());
      std::printf("%s %s", at ? "," : "", terminal_safe(info.model.substr(at, end - at)).c_str());
      at = end + 1;
    }
    std::printf("\n");
  }
  if (!info.config.empty()) {
    std::printf("effective configuration (the deck, its overrides and defaults, as the run used them):\n");
    for (size_t at = 0; at < info.config.size();) {
      const size_t end = std::min(info.config.find('\n', at), info.config.size());
      if (end > at) std::printf("  %s\n", terminal_safe(info.config.substr(at, end - at)).c_str());
      at = end + 1;
    }
  }
  int problems = 0;
  if (info.format_version != kCheckpointFormatVersion) {
    std::printf("problem: format_version %d is not supported (this meshtrain reads version %d)\n",
                info.format_version, kCheckpointFormatVersion);
    ++problems;
  }
  // As training's load refuses them: without the model's settings nothing checks the deck.
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"model", &info.model},
                                   {"lineage", &info.lineage}})
    if (value->empty()) {
      std::printf("problem: no attribute '%s' (not a complete meshtrain checkpoint)\n", key);
      ++problems;
    }

  int64_t parameters = 0;
  const size_t datasets = file.dataset_names().size();
  problems += check_datasets(file, parameters);
  problems += compare_with_model(file, info);
  std::printf("%zu datasets, %.3fM parameters: %s\n", datasets, static_cast<double>(parameters) / 1e6,
              problems == 0 ? "all checksums OK" : (std::to_string(problems) + " problem(s)").c_str());
  return problems;
}

}  // namespace

int inspect_command(const InspectArgs& args) {
  MpiSession mpi;
  int status = kExitOk;
  if (mpi.rank() == 0) {
    try {
      status = inspect_file(args.path) == 0 ? kExitOk : kExitInput;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshtrain inspect: error: %s\n", terminal_safe(e.what()).c_str());
      std::fputs(docs_pointer_line("docs/checkpoints.md").c_str(), stderr);
      status = kExitInput;
    }
    std::fflush(stdout);
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

}  // namespace meshtrain
