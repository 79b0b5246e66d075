// `meshtrain import --format hf DIR OUT.h5 [--deck DECK | --deck-out NEW.toml]`: a Hugging Face
// model directory (config.json and model.safetensors or a sharded index, as save_pretrained
// writes them) of GPT2LMHeadModel, LlamaForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM,
// Qwen3MoeForCausalLM or DeepseekV3ForCausalLM as a meshtrain checkpoint at step 0
// (checkpoint/checkpoint_import.h), with the model's state where the format stores it
// (DeepSeek-V3's e_score_correction_bias as the expert bias: HfFormat::state_tensors); FP8
// block-scaled weights (quantization_config "fp8") are dequantized (families/hf/hf_fp8.h).
// With --deck, every difference between the directory and the deck's model — a config.json
// key, a tensor's name or shape — is refused before anything is written, naming the file, the
// key or tensor, its value and the deck's.
// Without it the deck is built from config.json (families/hf/hf_deck.h), and --deck-out writes it
// for `meshtrain train`. One rank does the work. The family is the one config.json's
// architectures name (families/registry.h), whose HfFormat reads config.json and names the
// tensors; the directory is app/hf_directory.h.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/hf_directory.h"
#include "meshtrain/app/import_outputs.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/checkpoint/checkpoint_import.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/families/hf/hf_deck.h"
#include "meshtrain/families/hf/hf_fp8.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/model/expert_bias.h"

namespace meshtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Names and values from config.json and the weights come from whoever published the model: each
// message is escaped whole (families/hf/hf_config_reader.h).
[[noreturn]] void refuse(const std::string& message) { hf_refuse(message); }

// `text` with each "section.key=value" override set in its section (added where absent), so
// that a deck written for the user holds what the import used.
std::string with_overrides(std::string text, const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides) {
    const size_t eq = o.find('='), dot = o.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq) continue;  // parse_deck refuses it
    const std::string section = o.substr(0, dot), key = o.substr(dot + 1, eq - dot - 1);
    const std::string line = key + " = " + o.substr(eq + 1);
    std::istringstream in(text);
    std::string out, l, current;
    bool done = false;
    auto close_section = [&] {
      if (current == section && !done) {
        out += line + "\n";
        done = true;
      }
    };
    while (std::getline(in, l)) {
      if (!l.empty() && l[0] == '[') {
        close_section();
        current = l.substr(1, l.find(']') - 1);
      } else if (current == section && !done && l.rfind(key + " =", 0) == 0) {
        l = line;
        done = true;
      }
      out += l + "\n";
    }
    close_section();
    if (!done) out += "\n[" + section + "]\n" + line + "\n";
    text = out;
  }
  return text;
}

// Refuses a tensor with an element that is not finite, naming the file it came from (the shard),
// the tensor and the first such element: `train` would refuse the checkpoint at its first load,
// and a fine-tune from it would diverge at its first step.
void refuse_non_finite(const std::string& file, const SafetensorsEntry& e, const std::vector<float>& v) {
  const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
  if (bad == v.end()) return;
  // The element's index in the tensor's shape, row-major, as well as flat.
  std::string at;
  for (size_t rest = static_cast<size_t>(bad - v.begin()), k = e.shape.size(); k-- > 0;) {
    const size_t d = static_cast<size_t>(e.shape[k]);
    at = std::to_string(rest % d) + (at.empty() ? "" : ", ") + at;
    rest /= d;
  }
  refuse(file + ": tensor " + e.name + " holds " + (std::isnan(*bad) ? "NaN" : *bad > 0 ? "inf" : "-inf") +
         " at element " + std::to_string(bad - v.begin()) + " (index [" + at + "] of shape " + e.shape_string() +
         "); meshtrain imports finite weights only, as `train` loads them (a model saved after it diverged, "
         "or a damaged download?)");
}

// The stored tensor `t` of `weights` as fp32: an F8_E4M3 weight dequantized with its block scale
// (families/hf/hf_fp8.h, `fp8`: config.json's quantization_config), any other widened.
std::vector<float> stored_values(const HfWeights& weights, const HfStoredTensor& t,
                                 const std::optional<HfFp8Blocks>& fp8, const std::string& config_path) {
  if (t.entry->dtype != SafeDType::F8_E4M3) return t.file->read_f32(*t.entry);
  const auto scale = weights.tensors().find(hf_fp8_scale_name(t.entry->name));
  const bool found = scale != weights.tensors().end();
  return read_hf_fp8_weight(*t.file, *t.entry, found ? scale->second.file : nullptr,
                            found ? scale->second.entry : nullptr, fp8, config_path);
}

// What an import reads: the parameters in meshtrain's layout, the model's state (the stage's
// buffers by name: HfTensor::state) and how many stored tensors were used.
struct ImportedTensors {
  std::map<std::string, std::vector<float>> parameters;
  std::map<std::string, std::vector<double>> state;
  size_t count = 0;
};

// Refuses a stored tensor whose shape is not `t`'s.
void check_stored_shape(const HfStoredTensor& stored, const HfTensor& t, const std::string& model) {
  const SafetensorsEntry& e = *stored.entry;
  if (e.shape == t.hf_shape) return;
  SafetensorsEntry want;
  want.shape = t.hf_shape;
  refuse(stored.file->path() + ": tensor " + e.name + " has shape " + e.shape_string() + ", but " + model +
         " needs " + want.shape_string());
}

// The state tensor `t` as stored: F32 (DeepSeek's checkpoints, transformers' save of a buffer it
// keeps in fp32), BF16 or F16 (a model cast whole before saving; transformers widens them as
// here, exactly), finite. An F8_E4M3 one has no scale: a bias is never quantized.
std::vector<double> read_state(const HfStoredTensor& stored, const HfTensor& t, const std::string& model) {
  check_stored_shape(stored, t, model);
  const SafetensorsEntry& e = *stored.entry;
  if (e.dtype == SafeDType::F8_E4M3)
    refuse(stored.file->path() + ": tensor " + e.name + " is stored as F8_E4M3, but it is the router's balancing "
           "bias, model state that " + model + " keeps in fp64 (accepted: F32, as DeepSeek-V3 stores it, or BF16 "
           "or F16; FP8 checkpoints quantize weights only)");
  const std::vector<float> hf = stored.file->read_f32(e);
  refuse_non_finite(stored.file->path(), e, hf);
  return std::vector<double>(hf.begin(), hf.end());
}

// `name` with the block index of its first ".<digits>." as "{}" (model.layers.{}.mlp.gate...),
// the index in `block`; `name` itself where it has none.
std::string block_pattern(const std::string& name, int64_t& block) {
  block = -1;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
    const size_t end = name.find('.', dot + 1);
    if (end == std::string::npos || end == dot + 1 || end - dot > 10) continue;
    const std::string digits = name.substr(dot + 1, end - dot - 1);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    block = std::stoll(digits);
    return name.substr(0, dot + 1) + "{}" + name.substr(end);
  }
  return name;
}

// Refuses a stored tensor `name` that names state of a block whose model has none there (a
// router's bias on a dense block), before the general refusal of an unknown tensor.
void refuse_state_of_stateless_block(const HfStoredTensor& stored, const std::vector<HfTensor>& state,
                                     const ModelSpec& m, const std::string& model) {
  int64_t block = -1, unused = -1;
  const std::string pattern = block_pattern(stored.entry->name, block);
  if (block < 0 || block >= m.layers || m.moe_layer(static_cast<int>(block))) return;
  for (const HfTensor& t : state)
    if (block_pattern(t.hf, unused) == pattern)
      refuse(stored.file->path() + ": tensor " + stored.entry->name + " " + stored.entry->shape_string() +
             " is a router's balancing bias, but block " + std::to_string(block) + " of " + model +
             " is dense (model.moe_first_dense_layers = " + std::to_string(m.moe.first_dense_layers) +
             ", config.json's first_k_dense_replace): it has no router (check first_k_dense_replace against "
             "the blocks whose mlp.gate the file holds)");
}

// Reads every tensor of `tensors` and `state` (the family's `format` for `m`) from `weights`
// into meshtrain's layout, refusing a missing tensor, another shape, or a stored tensor the
// model has no place for. Block scales are read with their weights, before the names are mapped.
ImportedTensors read_tensors(const HfWeights& weights, const HfFormat& format, const std::vector<HfTensor>& tensors,
                             const std::vector<HfTensor>& state, const ModelSpec& m, const std::string& model,
                             const std::optional<HfFp8Blocks>& fp8, const std::string& config_path) {
  std::map<std::string, HfStoredTensor> stored;
  for (const auto& [name, t] : weights.tensors()) {
    if (const std::optional<std::string> weight = hf_fp8_weight_of_scale(name)) {
      const auto it = weights.tensors().find(*weight);
      check_hf_fp8_scale_has_weight(t.file->path(), *t.entry,
                                    it == weights.tensors().end() ? nullptr : it->second.entry);
      continue;
    }
    if (!format.is_buffer(name)) stored[format.stored_name(name)] = t;
  }
  auto find = [&](const HfTensor& t) {
    const auto it = stored.find(t.hf);
    if (it == stored.end())
      refuse(weights.source() + ": tensor " + t.hf + " is missing, but " + model + " has it" +
             (t.hf == "lm_head.weight"
                  ? " (an untied head: for a tied model set model.tie_embeddings = true)"
              : t.meshtrain.rfind("mtp.", 0) == 0
                  ? " (a multi-token prediction layer, which transformers' save_pretrained leaves "
                    "out: set model.mtp_layers = 0 to import the main model alone)"
                  : ""));
    return it->second;
  };
  ImportedTensors out;
  std::set<std::string> used;
  for (const HfTensor& t : tensors) {
    const HfStoredTensor s = find(t);
    check_stored_shape(s, t, model);
    used.insert(t.hf);
    const std::vector<float> hf = stored_values(weights, s, fp8, config_path);
    refuse_non_finite(s.file->path(), *s.entry, hf);
    from_hf_layout(t, hf, out.parameters[t.meshtrain]);
  }
  for (const HfTensor& t : state) {
    out.state[t.meshtrain] = read_state(find(t), t, model);
    used.insert(t.hf);
  }
  for (const auto& [name, t] : stored) {
    if (used.count(name)) continue;
    // Some savers keep the tied head beside the embedding: the same values, nothing new.
    if (name == "lm_head.weight" && m.tie_embeddings) {
      const std::vector<float> head = stored_values(weights, t, fp8, config_path);
      const std::vector<float>& wte = out.parameters.at("wte");
      if (head.size() == wte.size() && std::memcmp(head.data(), wte.data(), wte.size() * sizeof(float)) == 0)
        continue;
      refuse(t.file->path() + ": tensor lm_head.weight differs from " + format.embedding + ", but " +
             model + " ties them (set model.tie_embeddings = false to import an untied head)");
    }
    refuse_state_of_stateless_block(t, state, m, model);
    refuse(t.file->path() + ": tensor " + t.entry->name + " " + t.entry->shape_string() +
           " is not part of " + model +
           " (check model.layers and model.tie_embeddings against config.json)");
  }
  out.count = used.size();
  return out;
}

// The deck the import is for: the user's --deck, or one built from `hf` (config.json's model,
// read from `config_path`) with the --set overrides in it, whose text `deck_text` receives.
Config import_deck(const ImportArgs& args, const ModelSpec& hf, const std::string& config_path,
                   std::string& deck_text) {
  if (!args.deck.empty()) return parse_deck(args.deck, read_deck_file(args.deck), args.overrides);
  std::error_code ec;
  const fs::path tok = fs::path(args.dir) / "tokenizer.json";
  // The deck names the file for every later run to open: it must be the directory's own.
  if (const std::string target = hf_link_outside(args.dir, tok.string()); !target.empty())
    throw std::runtime_error(tok.string() + ": is a symbolic link leading to " + target + ", outside " +
                             args.dir + " (the deck built from it would name that file as data.tokenizer; "
                             "meshtrain reads no file outside the directory: copy the file into it, e.g. "
                             "download with --local-dir, or give --deck)");
  const std::string tokenizer = fs::is_regular_file(tok, ec) ? fs::absolute(tok).string() : "bytes";
  deck_text = with_overrides(hf_deck_text(hf, tokenizer, args.dir), args.overrides);
  // Named after config.json, where what it refuses came from: the --deck-out file does not
  // exist yet (and is not written when the deck is refused).
  return parse_deck(config_path + " (the deck built from it" +
                        (args.deck_out.empty() ? std::string() : " for --deck-out " + args.deck_out) + ")",
                    deck_text);
}

void import_hf(const ImportArgs& args) {
  std::error_code ec;
  if (!fs::is_directory(args.dir, ec))
    refuse(args.dir +
           ": not a directory (give the directory holding config.json and "
           "model.safetensors or model.safetensors.index.json, as `meshtrain export "
           "--format hf` or save_pretrained writes it)");
  // Before anything is read: a refused output costs nothing (app/import_outputs.h). The inputs
  // besides the directory's files: the deck.
  ImportOutputs outputs(args, {args.deck});
  const std::string config_path = (fs::path(args.dir) / "config.json").string();
  const json j = read_json_object(config_path,
                                  "a Hugging Face model directory holds config.json beside its weights; it "
                                  "says what the tensors alone do not, e.g. the number of heads");
  // The family config.json's architectures name reads the rest (families/registry.h).
  const HfFormat& format = *hf_family_of(j, config_path).hf;
  const HfConfigReader config(j, config_path, deck_key_range);
  // Any other quantization is refused before the model is read.
  const std::optional<HfFp8Blocks> fp8 = hf_fp8_quantization(config);
  int64_t max_positions = 0;
  const ModelSpec hf = format.read_config(config, max_positions);
  std::string deck_text;
  const Config cfg = import_deck(args, hf, config_path, deck_text);
  format.check_deck(config, hf, max_positions, cfg.model, cfg.deck_path);
  const ModelSpec& m = cfg.model;
  const HfWeights weights = HfWeights::open(args.dir);

  const std::string model =
      "the deck's model (" + cfg.deck_path + ": model.layers = " + std::to_string(m.layers) +
      ", d_model = " + std::to_string(m.d_model) + ", seq_len = " + std::to_string(m.seq_len) +
      ", vocab_size = " + std::to_string(m.vocab_size) +
      ", tie_embeddings = " + (m.tie_embeddings ? "true" : "false") + ")";
  const std::vector<HfTensor> tensors = format.stored_tensors ? format.stored_tensors(config, m) : format.tensors(m);
  const std::vector<HfTensor> state = format.state_tensors ? format.state_tensors(m) : std::vector<HfTensor>{};
  const ImportedTensors read = read_tensors(weights, format, tensors, state, m, model, fp8, config_path);
  // The model's state as a run starts it (zeros), and the stored values where the format has them.
  ExpertBias bias(m);
  std::vector<StageBuffer> buffers = bias.buffers();
  size_t placed = 0;
  for (StageBuffer& b : buffers)
    if (const auto it = read.state.find(b.name); it != read.state.end()) {
      *b.values = it->second;
      ++placed;
    }
  if (placed != read.state.size())
    throw std::logic_error("import: the family's state tensors name buffers the model does not have");
  outputs.write(deck_text,
                [&] { write_imported_checkpoint(args.out, cfg, read.parameters, buffers, args.force); });
  const size_t count = read.count;
  const std::string deck = !args.deck.empty() ? args.deck : args.deck_out;
  std::printf("imported %s (%zu tensors) for %s into %s at step 0\n", args.dir.c_str(), count,
              (deck.empty() ? cfg.deck_path : deck).c_str(), args.out.c_str());
  if (!deck.empty())
    std::printf("fine-tune it: meshtrain train %s --set checkpoint.resume='\"%s\"'\n", deck.c_str(),
                args.out.c_str());
  else
    std::printf("to fine-tune it, import again with --deck-out NEW.toml: the deck it was built for\n");
}

}  // namespace

int import_command(const ImportArgs& args) {
  return run_on_rank_zero([&] { import_hf(args); });
}

}  // namespace meshtrain
