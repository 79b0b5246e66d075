// `meshtrain export CHECKPOINT --format hf OUT/`: a checkpoint's model as a Hugging Face
// directory that transformers' AutoModelForCausalLM.from_pretrained(OUT) loads: GPT2LMHeadModel
// (OUT/model.safetensors and OUT/config.json), or LlamaForCausalLM / Qwen3ForCausalLM (also
// generation_config.json), or, for a mixture of experts,
// MixtralForCausalLM / Qwen3MoeForCausalLM (families/moe/hf_moe.h), or DeepseekV3ForCausalLM with its
// routers' e_score_correction_bias from the checkpoint's expert bias (F32 whatever --dtype: the
// family's HfFormat::state_tensors). The weights are one model.safetensors
// or, above --max-shard-size, shards and their index (app/hf_shards.h). Checkpoints are
// layout-free, so one rank reads the whole file (MPI_COMM_SELF) whatever layout wrote it, and
// every layout's checkpoint of the same weights exports the same bytes. The family the
// checkpoint records (families/registry.h) maps the tensors and writes config.json through its
// HfFormat (families/model_family.h). The tokenizer files are those --tokenizer names: a path
// recorded in the checkpoint is never opened (export_tokenizer below).

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/hf_directory.h"
#include "meshtrain/app/hf_shards.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// SIGINT or SIGTERM during an export: the handler notes it; the export stops before its next
// tensor, removes its staging directory (and OUT, where it made it) and exits 128 + the signal.
// Without it the signal's default action would leave the staging directory behind.
volatile std::sig_atomic_t interrupted_by = 0;
extern "C" void on_export_signal(int sig) { interrupted_by = sig; }

class ExportInterrupted : public std::runtime_error {
 public:
  ExportInterrupted(int sig, const std::string& out)
      : std::runtime_error(std::string("export interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                           ": " + out + " is as it was (the export's staging directory was removed)"),
        signal_(sig) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// Handlers for SIGINT and SIGTERM while it lives; the previous ones back afterwards.
class InterruptGuard {
 public:
  InterruptGuard() {
    struct sigaction action {};
    action.sa_handler = on_export_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a signal must not turn a write into an error
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~InterruptGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  // Throws ExportInterrupted once a signal came.
  static void check(const std::string& out) {
    if (interrupted_by != 0) throw ExportInterrupted(interrupted_by, out);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Dataset `name` of `file` as float32, its checksum verified on the stored values.
std::vector<float> read_verified(CheckpointFile& file, const std::string& name, const Shape& shape) {
  const DType stored = file.dtype(name);
  Box all;
  for (int k = 0; k < shape.rank(); ++k) all.count[k] = shape[k];
  std::vector<char> raw(static_cast<size_t>(shape.numel()) * dtype_size(stored));
  file.read(name, {all}, raw.data(), stored);
  const std::optional<uint64_t> sum = file.checksum(name);
  if (!sum || *sum != checksum_part(raw.data(), stored, shape, {all}))
    throw std::runtime_error(file.path() + ": dataset " + name +
                             (sum ? " does not match its checksum (damaged)" : " has no checksum attribute"));
  std::vector<float> out(static_cast<size_t>(shape.numel()));
  if (stored == DType::F32) {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {  // an fp64 run's parameters, or state (always fp64): rounded to float32, as HF holds it
    const double* d = reinterpret_cast<const double*>(raw.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(d[i]);
  }
  return out;
}


// generation_config.json, as save_pretrained writes it beside config.json (GenerationConfig reads
// it): config.json's begin- and end-of-text ids, where the tokenizer has them.
std::string generation_config_json(const std::string& config_json) {
  const auto config = nlohmann::ordered_json::parse(config_json);
  nlohmann::ordered_json gen;
  for (const char* key : {"bos_token_id", "eos_token_id"})
    if (config.contains(key) && !config[key].is_null()) gen[key] = config[key];
  gen["_from_model_config"] = true;
  return gen.dump(2) + "\n";
}

// The tokenizer files to write beside the model: the tokenizer.json the user named with
// --tokenizer and, from beside it, its tokenizer_config.json and special_tokens_map.json (their
// bytes, read here), and the bos/eos ids tokenizer_config.json names (-1: none). A checkpoint's
// @config records the run's data.tokenizer, a path: it comes from whoever wrote the file, so
// export never opens it (it could name any file of the machine, which the export would publish).
struct ExportTokenizer {
  std::vector<std::pair<std::string, std::string>> files;  // (name in OUT, content)
  int64_t bos = -1, eos = -1;
  std::string note;  // why nothing was written, for the summary
};

// What the checkpoint's @config says the run used, for the note (never opened).
std::string recorded_tokenizer(const std::string& config_text) {
  try {
    const toml::table config = toml::parse(config_text);
    return config["data"]["tokenizer"].value_or(std::string());
  } catch (const std::exception&) {
    return "";
  }
}

ExportTokenizer export_tokenizer(const std::string& named, const std::string& config_text) {
  ExportTokenizer t;
  if (named.empty()) {
    const std::string recorded = recorded_tokenizer(config_text);
    if (!recorded.empty() && recorded != "bytes")
      t.note = "no tokenizer files written: the checkpoint records data.tokenizer = \"" + terminal_safe(recorded) +
               "\", a path export does not open (a checkpoint may come from anyone); give "
               "--tokenizer PATH/tokenizer.json to write the run's tokenizer";
    return t;
  }
  const json tok = read_json_object(named, "--tokenizer: a Hugging Face tokenizer.json");
  if (!tok.contains("model") || !tok["model"].is_object())
    throw std::runtime_error(named + ": has no \"model\" object, so it is not a Hugging Face tokenizer.json "
                             "(--tokenizer names the run's tokenizer.json, as data.tokenizer did)");
  std::string text;
  if (const std::string problem = read_regular_file(named, text); !problem.empty())
    throw std::runtime_error(named + ": " + problem + " (--tokenizer)");
  t.files.push_back({"tokenizer.json", text});
  const fs::path dir = fs::path(named).parent_path();
  json tok_config;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const std::string path = (dir / name).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    if (const std::string problem = read_regular_file(path, text); !problem.empty())
      throw std::runtime_error(path + ": " + problem + " (beside --tokenizer " + named +
                               ", written into the export with it; remove it or name another tokenizer.json)");
    t.files.push_back({name, text});
    if (std::string(name) == "tokenizer_config.json") {
      try {
        tok_config = json::parse(text);
      } catch (const json::exception&) {
      }
    }
  }
  // A token's id: tokenizer.json's added tokens, then its vocabulary.
  auto id_of = [&](const char* key) -> int64_t {
    json v = tok_config.is_object() ? json_value_or(tok_config, key, nullptr) : json();
    if (v.is_object()) v = json_value_or(v, "content", nullptr);
    if (!v.is_string()) return -1;
    for (const json& a : json_value_or(tok, "added_tokens", json::array()))
      if (a.is_object() && a.value("content", "") == v.get<std::string>() && a.contains("id") &&
          a["id"].is_number_integer())
        return a["id"].get<int64_t>();
    const json vocab = json_value_or(tok["model"], "vocab", json::object());
    const json id = vocab.is_object() ? json_value_or(vocab, v.get<std::string>().c_str(), nullptr) : json();
    return id.is_number_integer() ? id.get<int64_t>() : -1;
  };
  t.bos = id_of("bos_token");
  t.eos = id_of("eos_token");
  return t;
}

// The checkpoint's model as export reads it: its family's (families/registry.h), the one a
// checkpoint written before model.family existed records implicitly (GPT-2).
const ModelFamily& recorded_family(const std::string& path, const std::map<std::string, std::string>& settings) {
  const auto family = settings.find("family");
  if (family == settings.end()) return model_family("gpt2");
  std::string known;
  for (const ModelFamily* f : model_registry()) {
    if (family->second == "\"" + std::string(f->name) + "\"") return *f;
    known += std::string(known.empty() ? "" : ", ") + "\"" + f->name + "\"";
  }
  throw std::runtime_error(terminal_safe(path + ": the 'model' attribute records family = " + family->second +
                                         " (this meshtrain exports the families " + known + ")"));
}

// `value` without the quotes of a recorded TOML string.
std::string unquoted(const std::string& value) {
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') return value.substr(1, value.size() - 2);
  return value;
}

// What an export writes, decided before OUT is touched: the model, the HF class it becomes,
// its tensors and the text files beside them.
struct ExportPlan {
  ModelSpec model;
  std::string architecture;
  const HfFormat* format = nullptr;
  std::vector<HfTensor> tensors;
  std::string tokenizer;                                   // recorded (provenance only)
  std::vector<std::pair<std::string, std::string>> texts;  // (file name, content)
};

ExportPlan plan_export(const std::string& path, const CheckpointInfo& info, const std::string& torch_dtype,
                       const ExportTokenizer& run_tok) {
  RecordedModel recorded;
  recorded.path = path;
  recorded.text = info.model;
  recorded.settings = recorded_model_settings(info.model);
  // The settings as a deck's [model] (config/'s reader: the same ranges and checks as a deck's,
  // as the file may come from anyone).
  recorded.read_as_deck = [&recorded] {
    std::string text = "[model]\n";
    for (const auto& [key, value] : recorded.settings)
      if (key != "tokenizer" && key != "layernorm_eps") text += key + " = " + value + "\n";
    return parse_deck(recorded.path + " (its 'model' attribute)", text).model;
  };
  ExportPlan plan;
  plan.format = recorded_family(path, recorded.settings).hf;
  plan.model = plan.format->recorded_model(recorded);
  plan.architecture = plan.format->architecture(plan.model, path);
  plan.tensors = plan.format->tensors(plan.model);
  if (plan.format->state_tensors)
    for (HfTensor& t : plan.format->state_tensors(plan.model)) plan.tensors.push_back(std::move(t));
  const auto tok = recorded.settings.find("tokenizer");
  plan.tokenizer = tok == recorded.settings.end() ? "" : unquoted(tok->second);
  const HfExportOptions options{torch_dtype, plan.tokenizer, run_tok.bos, run_tok.eos};
  plan.texts.push_back({"config.json", plan.format->config_json(plan.model, options)});
  plan.texts.push_back({"generation_config.json", generation_config_json(plan.texts.back().second)});
  return plan;
}

// The dataset a checkpoint holds `t` in: a parameter's under /model/, state under /buffers/.
std::string dataset_of(const HfTensor& t) { return (t.state ? "/buffers/" : "/model/") + t.meshtrain; }

// Every /model and /buffers dataset must map onto an HF tensor: anything more is a feature (or
// state, which the model would lose) HF cannot hold.
void check_every_dataset_mapped(CheckpointFile& file, const std::string& path, const ExportPlan& plan) {
  std::map<std::string, bool> mapped;
  for (const HfTensor& t : plan.tensors) mapped[dataset_of(t)] = true;
  for (const std::string& name : file.dataset_names())
    if ((name.rfind("/model/", 0) == 0 || name.rfind("/buffers/", 0) == 0) && !mapped.count(name))
      throw std::runtime_error(path + ": dataset " + name + " has no counterpart in Hugging Face " +
                               plan.architecture + " (export maps " + plan.format->exported_parameters + ")");
}

// The bytes of each HF tensor, read from the checkpoint tensor by tensor. The fused qkv is three
// HF tensors in a row, a stack of experts E: each checkpoint dataset is read once and sliced.
class HfTensorBytes {
 public:
  HfTensorBytes(CheckpointFile& file, const ExportArgs& args, const std::vector<HfTensor>& tensors, bool bf16)
      : file_(file), args_(args), tensors_(tensors), bf16_(bf16) {}

  std::vector<char> operator()(size_t i) {
    InterruptGuard::check(args_.out);
    const HfTensor& t = tensors_[i];
    const std::string name = dataset_of(t);
    if (name != cached_name_) {
      cached_ = read_dataset(name, t.meshtrain_shape);
      cached_name_ = name;
    }
    const std::vector<float> v = to_hf_layout(t, cached_);
    std::vector<char> out;
    if (bf16_ && !t.state) {
      const std::vector<uint16_t> h = f32_to_bf16(v.data(), v.size());
      out.assign(reinterpret_cast<const char*>(h.data()), reinterpret_cast<const char*>(h.data() + h.size()));
    } else {
      out.assign(reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(v.data() + v.size()));
    }
    return out;
  }

 private:
  std::vector<float> read_dataset(const std::string& name, const std::vector<int64_t>& dims) {
    Shape want;
    if (dims.size() == 1)
      want = Shape{dims[0]};
    else if (dims.size() == 2)
      want = Shape{dims[0], dims[1]};
    else
      want = Shape{dims[0], dims[1], dims[2]};
    if (!file_.has_dataset(name))
      throw std::runtime_error(args_.checkpoint + ": dataset " + name +
                               " is missing, but its 'model' attribute "
                               "describes a model that has it (damaged checkpoint)");
    if (file_.shape(name) != want)
      throw std::runtime_error(args_.checkpoint + ": dataset " + name + " has shape " +
                               file_.shape(name).to_string() + ", but its 'model' attribute needs " +
                               want.to_string() + " (damaged checkpoint)");
    return read_verified(file_, name, want);
  }

  CheckpointFile& file_;
  const ExportArgs& args_;
  const std::vector<HfTensor>& tensors_;
  bool bf16_;
  std::string cached_name_;
  std::vector<float> cached_;
};

// Writes the weights and the text files into a staging directory beside OUT's files and moves
// them in: a failure or a signal leaves OUT as it was. Returns the weight files' names.
std::vector<std::string> write_export(const ExportArgs& args, CheckpointFile& file, const ExportPlan& plan,
                                      const ExportTokenizer& run_tok, const std::vector<HfWeightSpec>& specs,
                                      HfTensorBytes& bytes_of, const std::map<std::string, std::string>& metadata,
                                      uint64_t max_shard) {
  const InterruptGuard interrupt_guard;
  std::error_code ec;
  const bool existed = fs::exists(args.out, ec);
  fs::create_directories(args.out, ec);
  if (!fs::is_directory(args.out, ec))
    throw std::runtime_error(args.out + ": cannot create the output directory" + (ec ? ": " + ec.message() : ""));
  const std::string staging = make_staging_directory(args.out);
  std::vector<std::string> weight_files;
  try {
    weight_files = write_hf_weights(staging, specs, std::ref(bytes_of), metadata, max_shard);
    for (const auto& [name, text] : plan.texts) write_text_file((fs::path(staging) / name).string(), text);
    for (const auto& [name, content] : run_tok.files) write_text_file((fs::path(staging) / name).string(), content);
    InterruptGuard::check(args.out);
  } catch (...) {
    fs::remove_all(staging, ec);
    if (!existed) fs::remove(args.out, ec);  // only if empty: a directory this export made
    throw;
  }
  file.close();
  publish_staged(staging, args.out);
  return weight_files;
}

void print_summary(const ExportArgs& args, const CheckpointInfo& info, const ExportPlan& plan,
                   const std::vector<std::string>& weight_files, const ExportTokenizer& run_tok, bool bf16) {
  const ModelSpec& m = plan.model;
  std::string written;
  for (const std::string& f : weight_files) written += (written.empty() ? "" : ", ") + f;
  std::string copied;
  for (const auto& f : run_tok.files) copied += ", " + f.first;
  const std::string experts = m.feed_forward == FeedForwardKind::Moe
                                  ? ", " + std::to_string(m.moe.experts) + " experts (top " +
                                        std::to_string(m.moe.top_k) + ")"
                                  : "";
  std::printf(
      "exported %s (step %lld, %d layers, d_model %lld, %lld heads, %lld kv heads, vocab %lld%s%s) to %s: "
      "%s (%zu tensors, %s), config.json (%s), generation_config.json%s%s\n",
      args.checkpoint.c_str(), static_cast<long long>(info.step), m.layers, static_cast<long long>(m.d_model),
      static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads()), static_cast<long long>(m.vocab_size),
      m.tie_embeddings ? ", tied" : ", untied", experts.c_str(), args.out.c_str(), written.c_str(),
      plan.tensors.size(), bf16 ? "bf16" : "fp32", plan.architecture.c_str(), copied.c_str(),
      run_tok.note.empty() ? "" : ("\nnote: " + run_tok.note).c_str());
}

void export_hf(const ExportArgs& args) {
  std::error_code ec;
  if (fs::is_directory(args.checkpoint, ec))
    throw std::runtime_error(args.checkpoint + ": is a directory, not a checkpoint file (give a step_*.h5)");
  const uint64_t max_shard = parse_shard_size(args.max_shard_size);
  if (max_shard == 0)
    throw std::runtime_error("--max-shard-size " + args.max_shard_size +
                             ": not a size (accepted: bytes, or a number with KB, MB, GB, KiB, MiB or GiB, e.g. 5GB)");
  CheckpointFile file(args.checkpoint, MPI_COMM_SELF, CheckpointFile::Access::Read);
  const CheckpointInfo info = file.read_info();
  if (info.format_version != kCheckpointFormatVersion)
    throw std::runtime_error(args.checkpoint + ": format_version = " + std::to_string(info.format_version) +
                             " is not supported (this meshtrain " MESHTRAIN_VERSION " exports version " +
                             std::to_string(kCheckpointFormatVersion) + ")");
  const bool bf16 = args.dtype == "bf16";
  // Read (and refused) before OUT is touched.
  const ExportTokenizer run_tok = export_tokenizer(args.tokenizer, info.config);
  const ExportPlan plan = plan_export(args.checkpoint, info, bf16 ? "bfloat16" : "float32", run_tok);
  check_every_dataset_mapped(file, args.checkpoint, plan);

  std::vector<HfWeightSpec> specs;
  for (const HfTensor& t : plan.tensors)
    specs.push_back({t.hf, bf16 && !t.state ? SafeDType::BF16 : SafeDType::F32, t.hf_shape});
  HfTensorBytes bytes_of(file, args, plan.tensors, bf16);
  // "format": "pt" is what transformers expects of a PyTorch model's safetensors.
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"meshtrain_version", MESHTRAIN_VERSION},
      {"meshtrain_checkpoint_version", info.meshtrain_version},
      {"meshtrain_step", std::to_string(info.step)},
      {"meshtrain_lineage", info.lineage},
      {"meshtrain_tokenizer", plan.tokenizer},
      {"meshtrain_source", fs::path(args.checkpoint).filename().string()}};
  const std::vector<std::string> weight_files =
      write_export(args, file, plan, run_tok, specs, bytes_of, metadata, max_shard);
  print_summary(args, info, plan, weight_files, run_tok, bf16);
}

}  // namespace

int export_command(const ExportArgs& args) {
  int signal = 0;
  const int status = run_on_rank_zero([&] {
    try {
      export_hf(args);
    } catch (const ExportInterrupted& e) {
      signal = e.signal();
      throw;
    }
  });
  return signal != 0 ? 128 + signal : status;  // as a shell reports a process the signal ended
}

}  // namespace meshtrain
