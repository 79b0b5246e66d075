// `meshtrain export CHECKPOINT --format hf OUT/`: a checkpoint's model as a Hugging Face
// directory that transformers' AutoModelForCausalLM.from_pretrained(OUT) loads: GPT2LMHeadModel
// (OUT/model.safetensors and OUT/config.json), or LlamaForCausalLM / Qwen3ForCausalLM (also
// generation_config.json and the run's tokenizer files), or, for a mixture of experts,
// MixtralForCausalLM / Qwen3MoeForCausalLM (app/hf_moe.h). The weights are one model.safetensors
// or, above --max-shard-size, shards and their index (app/hf_shards.h). Checkpoints are
// layout-free, so one rank reads the whole file (MPI_COMM_SELF) whatever layout wrote it, and
// every layout's checkpoint of the same weights exports the same bytes. The tensor mappings
// are app/hf_gpt2.h and app/hf_llama.h.

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/hf_directory.h"
#include "meshtrain/app/hf_gpt2.h"
#include "meshtrain/app/hf_llama.h"
#include "meshtrain/app/hf_shards.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/io/safetensors.h"

namespace meshtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The model a checkpoint's @model attribute describes, refusing any setting GPT2LMHeadModel
// cannot express. `tokenizer` receives the recorded tokenizer (provenance only).
ModelSpec model_of(const std::string& path, const std::string& recorded, std::string& tokenizer) {
  std::map<std::string, std::string> s;
  std::istringstream lines(recorded);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) s[line.substr(0, eq)] = line.substr(eq + 3);
  }
  const char* shape_keys[] = {"layers", "d_model", "heads", "seq_len", "vocab_size", "tie_embeddings"};
  ModelSpec m;
  for (const char* k : shape_keys)
    if (!s.count(k))
      throw std::runtime_error(path + ": the 'model' attribute does not record model." + std::string(k) +
                               " (not a complete meshtrain checkpoint)");
  try {
    m.layers = std::stoi(s["layers"]);
    m.d_model = std::stoll(s["d_model"]);
    m.heads = std::stoll(s["heads"]);
    m.seq_len = std::stoll(s["seq_len"]);
    m.vocab_size = std::stoll(s["vocab_size"]);
  } catch (const std::exception&) {
    throw std::runtime_error(path + ": the 'model' attribute is malformed:\n" + recorded);
  }
  // The file may come from anyone: sizes the deck would refuse are refused here too.
  if (m.layers < 1 || m.d_model < 1 || m.heads < 1 || m.seq_len < 1 || m.vocab_size < 2)
    throw std::runtime_error(path + ": the 'model' attribute is malformed (a size below 1):\n" +
                             recorded);
  if (s["tie_embeddings"] != "true" && s["tie_embeddings"] != "false")
    throw std::runtime_error(path + ": the 'model' attribute has tie_embeddings = " + s["tie_embeddings"] +
                             " (expected true or false)");
  m.tie_embeddings = s["tie_embeddings"] == "true";
  try {
    // GPT-2's inner width is n_inner; its heads split n_embd (no head_dim of its own).
    if (s.count("ffn_hidden")) m.ffn_hidden_set = std::stoll(s["ffn_hidden"]);
    if (s.count("kv_heads") && s["kv_heads"] != s["heads"])
      throw std::runtime_error(
          path + ": model.kv_heads = " + s["kv_heads"] + " with " + s["heads"] + " heads is "
          "grouped-query attention, which Hugging Face GPT2LMHeadModel cannot express (export "
          "refuses rather than write another model)");
    if (s.count("head_dim") && std::stoll(s["head_dim"]) * m.heads != m.d_model)
      throw std::runtime_error(
          path + ": model.head_dim = " + s["head_dim"] + " with " + s["heads"] +
          " heads is not d_model = " + s["d_model"] + " split over the heads: Hugging Face "
          "GPT2LMHeadModel cannot express it (export refuses rather than write another model)");
  } catch (const std::invalid_argument&) {
    throw std::runtime_error(path + ": the 'model' attribute is malformed:\n" + recorded);
  } catch (const std::out_of_range&) {
    throw std::runtime_error(path + ": the 'model' attribute is malformed:\n" + recorded);
  }
  // What HF GPT-2 computes besides the shapes: GPT-2's value of every other field of the spec
  // (model/model_spec.h) and LayerNorm's eps, and nothing else; its MLP width is n_inner.
  std::map<std::string, std::string> gpt2 = {{"layernorm_eps", "1e-05"}};
  for (const SpecField& f : spec_fields(m)) gpt2[f.key] = f.key == "ffn_hidden" ? f.value : f.gpt2_value;
  for (const auto& [key, value] : s) {
    bool known = key == "tokenizer";
    for (const char* k : shape_keys) known = known || key == k;
    if (known) continue;
    const auto f = gpt2.find(key);
    if (f == gpt2.end() || f->second != value)
      throw std::runtime_error(
          path + ": model." + key + " = " + value +
          " is a setting Hugging Face GPT2LMHeadModel cannot express (it computes " +
          (f == gpt2.end() ? "no such setting" : "model." + key + " = " + f->second) +
          "): export refuses rather than write a model that computes another function");
  }
  tokenizer = s.count("tokenizer") ? s["tokenizer"] : "";
  if (tokenizer.size() >= 2 && tokenizer.front() == '"' && tokenizer.back() == '"')
    tokenizer = tokenizer.substr(1, tokenizer.size() - 2);
  return m;
}

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
  } else {  // an fp64 run's checkpoint: rounded to float32, as HF holds it
    const double* d = reinterpret_cast<const double*>(raw.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(d[i]);
  }
  return out;
}


// The Llama / Qwen 3 model a checkpoint's @model attribute records, read as a deck's [model]
// would be (the same ranges and checks: the file may come from anyone).
ModelSpec llama_model_of(const std::string& path, const std::string& recorded) {
  std::string text = "[model]\n";
  for (const auto& [key, value] : recorded_model_settings(recorded))
    if (key != "tokenizer" && key != "layernorm_eps") text += key + " = " + value + "\n";
  try {
    return parse_deck(path + " (its 'model' attribute)", text).model;
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(e.what()) + "\n(" + path + ": the 'model' attribute is malformed)");
  }
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

// The run's tokenizer, as its deck named it (data.tokenizer in the checkpoint's @config): the
// files to copy (a tokenizer.json and, beside it, tokenizer_config.json and
// special_tokens_map.json) and the bos/eos ids tokenizer_config.json names (-1: none).
struct RunTokenizer {
  std::vector<std::pair<std::string, std::string>> files;  // (source, name in OUT)
  int64_t bos = -1, eos = -1;
  std::string note;  // why nothing was copied, for the summary
};

RunTokenizer run_tokenizer(const std::string& config_text) {
  RunTokenizer t;
  std::string spec;
  try {
    const toml::table config = toml::parse(config_text);
    spec = config["data"]["tokenizer"].value_or(std::string());
  } catch (const std::exception&) {
    t.note = "the checkpoint's @config does not parse: no tokenizer copied";
    return t;
  }
  std::error_code ec;
  if (spec.empty() || spec == "bytes" || fs::path(spec).extension() != ".json" || !fs::is_regular_file(spec, ec)) {
    t.note = spec == "bytes" || spec.empty() ? "the run used the byte tokenizer: no tokenizer files"
                                             : "data.tokenizer = \"" + spec + "\" is not a tokenizer.json here: not copied";
    return t;
  }
  json tok;
  try {
    tok = read_json_object(spec, "the run's tokenizer");
  } catch (const std::exception& e) {
    t.note = std::string(e.what()) + ": not copied";
    return t;
  }
  t.files.push_back({spec, "tokenizer.json"});
  const fs::path dir = fs::path(spec).parent_path();
  json tok_config;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
    if (fs::is_regular_file(dir / name, ec)) {
      t.files.push_back({(dir / name).string(), name});
      if (std::string(name) == "tokenizer_config.json") {
        try {
          tok_config = read_json_object((dir / name).string(), "the tokenizer's settings");
        } catch (const std::exception&) {
        }
      }
    }
  // A token's id: tokenizer.json's added tokens, then its vocabulary.
  auto id_of = [&](const char* key) -> int64_t {
    json v = json_value_or(tok_config, key, nullptr);
    if (v.is_object()) v = json_value_or(v, "content", nullptr);
    if (!v.is_string()) return -1;
    for (const json& a : json_value_or(tok, "added_tokens", json::array()))
      if (a.is_object() && a.value("content", "") == v.get<std::string>() && a.contains("id") &&
          a["id"].is_number_integer())
        return a["id"].get<int64_t>();
    const json vocab = tok.contains("model") ? json_value_or(tok["model"], "vocab", json::object()) : json::object();
    const json id = vocab.is_object() ? json_value_or(vocab, v.get<std::string>().c_str(), nullptr) : json();
    return id.is_number_integer() ? id.get<int64_t>() : -1;
  };
  t.bos = id_of("bos_token");
  t.eos = id_of("eos_token");
  return t;
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
  const SafeDType out_type = bf16 ? SafeDType::BF16 : SafeDType::F32;
  const std::string torch_dtype = bf16 ? "bfloat16" : "float32";
  // Checkpoints written before model.family existed are GPT-2.
  const auto settings = recorded_model_settings(info.model);
  const bool gpt2 = !settings.count("family") || settings.at("family") == "\"gpt2\"";
  std::string tokenizer, architecture = "GPT2LMHeadModel";
  ModelSpec m;
  std::vector<HfTensor> tensors;
  std::vector<std::pair<std::string, std::string>> texts;  // (file name, content)
  RunTokenizer run_tok;
  if (gpt2) {
    m = model_of(args.checkpoint, info.model, tokenizer);
    tensors = hf_gpt2_tensors(m);
    texts.push_back({"config.json", hf_gpt2_config_json(m, torch_dtype, tokenizer)});
  } else {
    m = llama_model_of(args.checkpoint, info.model);
    architecture = hf_llama_architecture(m, args.checkpoint);
    tensors = hf_llama_tensors(m);
    tokenizer = settings.count("tokenizer") ? settings.at("tokenizer") : "";
    if (tokenizer.size() >= 2 && tokenizer.front() == '"') tokenizer = tokenizer.substr(1, tokenizer.size() - 2);
    run_tok = run_tokenizer(info.config);
    texts.push_back({"config.json", hf_llama_config_json(m, torch_dtype, run_tok.bos, run_tok.eos)});
  }
  texts.push_back({"generation_config.json", generation_config_json(texts.back().second)});
  // Every /model dataset must map onto an HF tensor: anything more is a feature HF cannot hold.
  std::map<std::string, bool> mapped;
  for (const HfTensor& t : tensors) mapped["/model/" + t.meshtrain] = true;
  for (const std::string& name : file.dataset_names())
    if (name.rfind("/model/", 0) == 0 && !mapped.count(name))
      throw std::runtime_error(args.checkpoint + ": dataset " + name + " has no counterpart in Hugging Face " +
                               architecture + " (export maps " +
                               (gpt2 ? "wte, wpe, h.<i>.{ln_1,attn,ln_2,mlp}, ln_f and an untied lm_head.weight"
                                     : "wte, h.<i>.{ln_1,attn,ln_2,mlp}, ln_f and an untied lm_head.weight, "
                                       "a mixture's h.<i>.mlp.{router,experts}") +
                               ")");

  std::vector<HfWeightSpec> specs;
  for (const HfTensor& t : tensors) specs.push_back({t.hf, out_type, t.hf_shape});
  // The fused qkv is three HF tensors in a row, a stack of experts E: read once, sliced.
  std::string cached_name;
  std::vector<float> cached;
  auto bytes_of = [&](size_t i) {
    const HfTensor& t = tensors[i];
    const std::string name = "/model/" + t.meshtrain;
    if (name != cached_name) {
      Shape want;
      if (t.meshtrain_shape.size() == 1)
        want = Shape{t.meshtrain_shape[0]};
      else if (t.meshtrain_shape.size() == 2)
        want = Shape{t.meshtrain_shape[0], t.meshtrain_shape[1]};
      else
        want = Shape{t.meshtrain_shape[0], t.meshtrain_shape[1], t.meshtrain_shape[2]};
      if (!file.has_dataset(name))
        throw std::runtime_error(args.checkpoint + ": dataset " + name +
                                 " is missing, but its 'model' attribute "
                                 "describes a model that has it (damaged checkpoint)");
      if (file.shape(name) != want)
        throw std::runtime_error(args.checkpoint + ": dataset " + name + " has shape " +
                                 file.shape(name).to_string() + ", but its 'model' attribute needs " +
                                 want.to_string() + " (damaged checkpoint)");
      cached = read_verified(file, name, want);
      cached_name = name;
    }
    const std::vector<float> v = to_hf_layout(t, cached);
    std::vector<char> out;
    if (bf16) {
      const std::vector<uint16_t> h = f32_to_bf16(v.data(), v.size());
      out.assign(reinterpret_cast<const char*>(h.data()), reinterpret_cast<const char*>(h.data() + h.size()));
    } else {
      out.assign(reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(v.data() + v.size()));
    }
    return out;
  };
  // "format": "pt" is what transformers expects of a PyTorch model's safetensors.
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"meshtrain_version", MESHTRAIN_VERSION},
      {"meshtrain_checkpoint_version", info.meshtrain_version},
      {"meshtrain_step", std::to_string(info.step)},
      {"meshtrain_lineage", info.lineage},
      {"meshtrain_tokenizer", tokenizer},
      {"meshtrain_source", fs::path(args.checkpoint).filename().string()}};

  const bool existed = fs::exists(args.out, ec);
  fs::create_directories(args.out, ec);
  if (!fs::is_directory(args.out, ec))
    throw std::runtime_error(args.out + ": cannot create the output directory" + (ec ? ": " + ec.message() : ""));
  // Everything is written beside OUT's files first, then moved in: a failure leaves OUT as it was.
  const std::string staging = make_staging_directory(args.out);
  std::vector<std::string> weight_files;
  try {
    weight_files = write_hf_weights(staging, specs, bytes_of, metadata, max_shard);
    for (const auto& [name, text] : texts) write_text_file((fs::path(staging) / name).string(), text);
    for (const auto& [source, name] : run_tok.files) {
      fs::copy_file(source, fs::path(staging) / name, fs::copy_options::overwrite_existing, ec);
      if (ec) throw std::runtime_error(source + ": cannot copy into the export: " + ec.message());
    }
  } catch (...) {
    fs::remove_all(staging, ec);
    if (!existed) fs::remove(args.out, ec);  // only if empty: a directory this export made
    throw;
  }
  file.close();
  publish_staged(staging, args.out);
  std::string written;
  for (const std::string& f : weight_files) written += (written.empty() ? "" : ", ") + f;
  if (gpt2) {
    std::printf(
        "exported %s (step %lld, %d layers, d_model %lld, %lld heads, vocab %lld%s) to %s: "
        "%s (%zu tensors, %s), config.json (GPT2LMHeadModel)\n",
        args.checkpoint.c_str(), static_cast<long long>(info.step), m.layers, static_cast<long long>(m.d_model),
        static_cast<long long>(m.heads), static_cast<long long>(m.vocab_size),
        m.tie_embeddings ? ", tied" : ", untied", args.out.c_str(), written.c_str(), tensors.size(),
        bf16 ? "bf16" : "fp32");
    return;
  }
  std::string copied;
  for (const auto& f : run_tok.files) copied += ", " + f.second;
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
      tensors.size(), bf16 ? "bf16" : "fp32", architecture.c_str(), copied.c_str(),
      run_tok.note.empty() ? "" : ("\nnote: " + run_tok.note).c_str());
}

}  // namespace

int export_command(const ExportArgs& args) {
  return run_on_rank_zero([&] { export_hf(args); });
}

}  // namespace meshtrain
