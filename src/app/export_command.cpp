// `meshtrain export CHECKPOINT --format hf OUT/`: a checkpoint's model as a Hugging Face
// GPT2LMHeadModel directory — OUT/model.safetensors and OUT/config.json — which transformers
// loads with GPT2LMHeadModel.from_pretrained(OUT). Checkpoints are layout-free, so one rank
// reads the whole file (MPI_COMM_SELF) whatever layout wrote it, and every layout's checkpoint
// of the same weights exports the same bytes. The tensor mapping is app/hf_gpt2.h.

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/hf_gpt2.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/safetensors.h"

namespace meshtrain {

namespace fs = std::filesystem;

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

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(tmp + ": cannot write");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path + ": cannot rename " + tmp + " over it: " + ec.message());
}

void export_hf(const ExportArgs& args) {
  std::error_code ec;
  if (fs::is_directory(args.checkpoint, ec))
    throw std::runtime_error(args.checkpoint + ": is a directory, not a checkpoint file (give a step_*.h5)");
  CheckpointFile file(args.checkpoint, MPI_COMM_SELF, CheckpointFile::Access::Read);
  const CheckpointInfo info = file.read_info();
  if (info.format_version != kCheckpointFormatVersion)
    throw std::runtime_error(args.checkpoint + ": format_version = " + std::to_string(info.format_version) +
                             " is not supported (this meshtrain " MESHTRAIN_VERSION " exports version " +
                             std::to_string(kCheckpointFormatVersion) + ")");
  std::string tokenizer;
  const ModelSpec m = model_of(args.checkpoint, info.model, tokenizer);
  const bool bf16 = args.dtype == "bf16";
  const SafeDType out_type = bf16 ? SafeDType::BF16 : SafeDType::F32;

  const std::vector<HfTensor> tensors = hf_gpt2_tensors(m);
  // Every /model dataset must map onto a GPT-2 tensor: anything more is a feature HF cannot hold.
  std::map<std::string, bool> mapped;
  for (const HfTensor& t : tensors) mapped["/model/" + t.meshtrain] = true;
  for (const std::string& name : file.dataset_names())
    if (name.rfind("/model/", 0) == 0 && !mapped.count(name))
      throw std::runtime_error(args.checkpoint + ": dataset " + name +
                               " has no counterpart in Hugging Face "
                               "GPT2LMHeadModel (export maps wte, wpe, h.<i>.{ln_1,attn,ln_2,mlp}, ln_f and "
                               "an untied lm_head.weight)");

  SafetensorsWriter writer;
  for (const HfTensor& t : tensors) {
    const std::string name = "/model/" + t.meshtrain;
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
    std::vector<float> v = read_verified(file, name, want);
    if (t.transpose) {
      const int64_t cols = t.meshtrain_shape.back(), rows = want.numel() / cols;
      std::vector<float> out(v.size());
      transpose_2d(v.data(), out.data(), rows, cols);
      v.swap(out);
    }
    std::vector<char> bytes;
    if (bf16) {
      const std::vector<uint16_t> h = f32_to_bf16(v.data(), v.size());
      bytes.assign(reinterpret_cast<const char*>(h.data()),
                   reinterpret_cast<const char*>(h.data() + h.size()));
    } else {
      bytes.assign(reinterpret_cast<const char*>(v.data()),
                   reinterpret_cast<const char*>(v.data() + v.size()));
    }
    writer.add(t.hf, out_type, t.hf_shape, std::move(bytes));
  }
  file.close();
  // "format": "pt" is what transformers expects of a PyTorch model's safetensors.
  writer.set_metadata({{"format", "pt"},
                       {"meshtrain_version", MESHTRAIN_VERSION},
                       {"meshtrain_checkpoint_version", info.meshtrain_version},
                       {"meshtrain_step", std::to_string(info.step)},
                       {"meshtrain_lineage", info.lineage},
                       {"meshtrain_tokenizer", tokenizer},
                       {"meshtrain_source", fs::path(args.checkpoint).filename().string()}});

  fs::create_directories(args.out, ec);
  if (!fs::is_directory(args.out, ec))
    throw std::runtime_error(args.out + ": cannot create the output directory" +
                             (ec ? ": " + ec.message() : ""));
  const std::string model_path = (fs::path(args.out) / "model.safetensors").string();
  writer.write(model_path);
  write_text((fs::path(args.out) / "config.json").string(),
             hf_gpt2_config_json(m, bf16 ? "bfloat16" : "float32", tokenizer));
  std::printf(
      "exported %s (step %lld, %d layers, d_model %lld, %lld heads, vocab %lld%s) to %s: "
      "model.safetensors (%zu tensors, %s), config.json (GPT2LMHeadModel)\n",
      args.checkpoint.c_str(), static_cast<long long>(info.step), m.layers, static_cast<long long>(m.d_model),
      static_cast<long long>(m.heads), static_cast<long long>(m.vocab_size),
      m.tie_embeddings ? ", tied" : ", untied", args.out.c_str(), tensors.size(), bf16 ? "bf16" : "fp32");
}

}  // namespace

int export_command(const ExportArgs& args) {
  return run_on_rank_zero([&] { export_hf(args); });
}

}  // namespace meshtrain
