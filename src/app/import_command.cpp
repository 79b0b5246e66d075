// `meshtrain import --format hf DIR --deck DECK OUT.h5`: a Hugging Face GPT-2 directory
// (model.safetensors and config.json, as GPT2LMHeadModel.save_pretrained writes them) as a
// meshtrain checkpoint at step 0 (train/checkpoint_import.h), for the deck's model. Every
// difference between the two — a config.json key, a tensor's name, shape or dtype — is refused
// before anything is written, naming the file, the key or tensor, its value and what the deck
// accepts. One rank does the work; the tensor mapping is app/hf_gpt2.h.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/hf_gpt2.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/checkpoint/checkpoint_import.h"

namespace meshtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A config.json value, or transformers' GPT2Config default where the key is absent.
json value_or(const json& j, const char* key, json fallback) {
  return j.contains(key) && !j[key].is_null() ? j[key] : fallback;
}

// Refuses a config.json that describes another model than the deck's.
void check_config(const std::string& path, const Config& cfg) {
  const std::string what =
      " (a Hugging Face GPT-2 directory holds config.json beside model.safetensors; it says what the "
      "tensors alone do not, e.g. n_head)";
  std::string text;
  if (const std::string problem = read_regular_file(path, text); !problem.empty())
    throw std::runtime_error(path + ": " + (problem.rfind("cannot open", 0) == 0 ? "cannot read" : problem +
                             "; expected a JSON file") + what);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw std::runtime_error(path + ": not a JSON object");
  const ModelSpec& m = cfg.model;
  const std::string deck = cfg.deck_path + " (with its --set overrides)";
  // The deck's model must be one GPT-2 can be: its variants are GPT-2's.
  const ModelSpec gpt2 = family_defaults("gpt2", m);
  const struct {
    const char* key;
    std::string deck_value, gpt2_value;
  } variants[] = {
      {"family", m.family, gpt2.family},
      {"norm", norm_name(m.norm.kind), norm_name(gpt2.norm.kind)},
      {"positions", position_name(m.positions), position_name(gpt2.positions)},
      {"activation", activation_name(m.activation), activation_name(gpt2.activation)},
      {"feed_forward", feed_forward_name(m.feed_forward), feed_forward_name(gpt2.feed_forward)},
      {"bias", m.linear_bias ? "true" : "false", "true"},
      {"head_dim", std::to_string(m.head_dim()), std::to_string(gpt2.head_dim())},
      {"kv_heads", std::to_string(m.kv_heads()), std::to_string(gpt2.kv_heads())},
  };
  for (const auto& v : variants)
    if (v.deck_value != v.gpt2_value)
      throw std::runtime_error(deck + ": model." + v.key + " = " + v.deck_value +
                               ", which a Hugging Face GPT-2 model cannot be (it has model." +
                               v.key + " = " + v.gpt2_value + ")");
  const std::string type =
      value_or(j, "model_type", "").is_string() ? value_or(j, "model_type", "").get<std::string>() : "";
  if (type != "gpt2")
    throw std::runtime_error(path + ": model_type = " + value_or(j, "model_type", "(absent)").dump() +
                             " (meshtrain imports GPT-2: model_type \"gpt2\")");
  // (config.json key, transformers' default, deck key, the deck's value)
  struct Want {
    const char* key;
    json fallback;
    const char* deck_key;
    json deck_value;
  };
  const Want wants[] = {
      {"n_layer", 12, "model.layers", m.layers},
      {"n_embd", 768, "model.d_model", m.d_model},
      {"n_head", 12, "model.heads", m.heads},
      {"n_positions", 1024, "model.seq_len", m.seq_len},
      {"vocab_size", 50257, "model.vocab_size", m.vocab_size},
      {"tie_word_embeddings", true, "model.tie_embeddings", m.tie_embeddings},
  };
  for (const Want& w : wants) {
    const json v = value_or(j, w.key, w.fallback);
    if (v != w.deck_value)
      throw std::runtime_error(path + ": " + w.key + " = " + v.dump() + ", but " + deck + " has " +
                               w.deck_key + " = " + w.deck_value.dump() + ": another model (set " +
                               w.deck_key + " = " + v.dump() + " to import it)");
  }
  // What meshtrain computes that no deck key selects (checkpoint/model_signature.cpp).
  const json act = value_or(j, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw std::runtime_error(path + ": activation_function = " + act.dump() +
                             " (meshtrain computes GPT-2's "
                             "tanh GELU: accepted \"gelu_new\" or \"gelu_pytorch_tanh\")");
  const json eps = value_or(j, "layer_norm_epsilon", 1e-5);
  if (!eps.is_number() || std::fabs(eps.get<double>() - 1e-5) > 1e-12)
    throw std::runtime_error(path + ": layer_norm_epsilon = " + eps.dump() +
                             " (meshtrain's LayerNorm uses 1e-05)");
  // null: GPT-2's 4 x n_embd (n_embd is the deck's d_model: checked above).
  json inner = value_or(j, "n_inner", nullptr);
  if (inner.is_null()) inner = 4 * m.d_model;
  if (inner != json(m.ffn_hidden()))
    throw std::runtime_error(path + ": n_inner = " + value_or(j, "n_inner", nullptr).dump() +
                             " (an MLP " + inner.dump() + " wide), but " + deck +
                             " has model.ffn_hidden = " + std::to_string(m.ffn_hidden()) +
                             ": another model (set model.ffn_hidden = " + inner.dump() +
                             " to import it)");
  const struct {
    const char* key;
    bool want;
  } flags[] = {{"scale_attn_weights", true},
               {"scale_attn_by_inverse_layer_idx", false},
               {"add_cross_attention", false}};
  for (const auto& f : flags) {
    const json v = value_or(j, f.key, f.want);
    if (v != json(f.want))
      throw std::runtime_error(path + ": " + f.key + " = " + v.dump() + " (meshtrain's attention computes " +
                               f.key + " = " + (f.want ? "true" : "false") + ")");
  }
}

// HF's name for a stored tensor: GPT2Model.save_pretrained (the original "gpt2" files) writes
// the transformer's tensors without the "transformer." prefix.
std::string canonical(const std::string& name) {
  if (name.rfind("transformer.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return name;
  return "transformer." + name;
}

// The causal-mask buffers older transformers saved with the weights: constants, not parameters.
bool is_mask_buffer(const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias");
}

void import_hf(const ImportArgs& args) {
  const Config cfg = parse_deck(args.deck, read_deck_file(args.deck), args.overrides);
  const ModelSpec& m = cfg.model;
  const std::string st_path = (fs::path(args.dir) / "model.safetensors").string();
  std::error_code ec;
  if (!fs::is_directory(args.dir, ec))
    throw std::runtime_error(args.dir +
                             ": not a directory (give the directory holding model.safetensors and "
                             "config.json, as `meshtrain export --format hf` or save_pretrained writes it)");
  // Before any tensor is read: a refused destination costs nothing.
  check_import_destination(args.out, args.force);
  check_config((fs::path(args.dir) / "config.json").string(), cfg);
  const SafetensorsFile st = SafetensorsFile::open(st_path);

  const std::string model =
      "the deck's model (" + cfg.deck_path + ": model.layers = " + std::to_string(m.layers) +
      ", d_model = " + std::to_string(m.d_model) + ", seq_len = " + std::to_string(m.seq_len) +
      ", vocab_size = " + std::to_string(m.vocab_size) +
      ", tie_embeddings = " + (m.tie_embeddings ? "true" : "false") + ")";
  std::map<std::string, const SafetensorsEntry*> stored;
  for (const SafetensorsEntry& e : st.tensors())
    if (!is_mask_buffer(e.name)) stored[canonical(e.name)] = &e;
  std::map<std::string, std::vector<float>> values;
  std::set<std::string> used;
  for (const HfTensor& t : hf_gpt2_tensors(m)) {
    const auto it = stored.find(t.hf);
    if (it == stored.end())
      throw std::runtime_error(st_path + ": tensor " + t.hf + " is missing, but " + model + " has it" +
                               (t.hf == "lm_head.weight"
                                    ? " (an untied head: for a tied model set model.tie_embeddings = true)"
                                    : ""));
    const SafetensorsEntry& e = *it->second;
    if (e.shape != t.hf_shape) {
      SafetensorsEntry want;
      want.shape = t.hf_shape;
      throw std::runtime_error(st_path + ": tensor " + e.name + " has shape " + e.shape_string() + ", but " +
                               model + " needs " + want.shape_string());
    }
    used.insert(t.hf);
    std::vector<float> v = st.read_f32(e);
    if (t.transpose) {  // HF (in, out) -> meshtrain (out, in)
      std::vector<float> out(v.size());
      transpose_2d(v.data(), out.data(), t.hf_shape[0], t.hf_shape[1]);
      v.swap(out);
    }
    values[t.meshtrain] = std::move(v);
  }
  for (const auto& [name, e] : stored) {
    if (used.count(name)) continue;
    // Some savers keep the tied head beside the embedding: the same values, nothing new.
    if (name == "lm_head.weight" && m.tie_embeddings) {
      const std::vector<float> head = st.read_f32(*e);
      const std::vector<float>& wte = values.at("wte");
      if (head.size() == wte.size() && std::memcmp(head.data(), wte.data(), wte.size() * sizeof(float)) == 0)
        continue;
      throw std::runtime_error(st_path + ": tensor lm_head.weight differs from transformer.wte.weight, but " +
                               model +
                               " ties them (set model.tie_embeddings = false to import an untied head)");
    }
    throw std::runtime_error(st_path + ": tensor " + e->name + " " + e->shape_string() + " is not part of " +
                             model + " (check model.layers and model.tie_embeddings against config.json)");
  }
  // Often <checkpoint.dir>/step_00000000.h5 of a run not started yet (README): make its directory.
  if (const fs::path parent = fs::path(args.out).parent_path(); !parent.empty())
    fs::create_directories(parent, ec);
  write_imported_checkpoint(args.out, cfg, values, args.force);
  std::printf(
      "imported %s (%zu tensors) for %s into %s at step 0\n"
      "fine-tune it: meshtrain train %s --set checkpoint.resume='\"%s\"'\n",
      args.dir.c_str(), used.size(), cfg.deck_path.c_str(), args.out.c_str(), args.deck.c_str(),
      args.out.c_str());
}

}  // namespace

int import_command(const ImportArgs& args) {
  return run_on_rank_zero([&] { import_hf(args); });
}

}  // namespace meshtrain
