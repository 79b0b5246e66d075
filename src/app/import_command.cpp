// `meshtrain import --format hf DIR OUT.h5 [--deck DECK | --deck-out NEW.toml]`: a Hugging Face
// model directory (config.json and model.safetensors or a sharded index, as save_pretrained
// writes them) of GPT2LMHeadModel, LlamaForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM or
// Qwen3MoeForCausalLM as a meshtrain checkpoint at step 0 (checkpoint/checkpoint_import.h).
// With --deck, every difference between the directory and the deck's model — a config.json
// key, a tensor's name or shape — is refused before anything is written, naming the file, the
// key or tensor, its value and the deck's.
// Without it the deck is built from config.json (app/hf_llama.h: hf_deck_text), and --deck-out
// writes it for `meshtrain train`. One rank does the work; the tensor names are app/hf_gpt2.h,
// app/hf_llama.h and app/hf_moe.h, the directory app/hf_directory.h.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/hf_directory.h"
#include "meshtrain/app/hf_gpt2.h"
#include "meshtrain/app/hf_llama.h"
#include "meshtrain/app/hf_moe.h"
#include "meshtrain/app/hf_shards.h"
#include "meshtrain/app/import_outputs.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/checkpoint/checkpoint_import.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Names and values from config.json and the weights come from whoever published the model: each
// message is escaped whole (io/terminal_text.h), so that a NUL does not cut it short and an
// escape sequence or a bidirectional control is shown, not obeyed.
[[noreturn]] void refuse(const std::string& message) { throw std::runtime_error(terminal_safe(message)); }

// A deck built from config.json trains at most this many positions unless --set
// model.seq_len says otherwise: Llama 3.1's 131072 would ask for activations no fine-tune on a
// few GPUs holds, and 2048 is the context most fine-tuning recipes use.
constexpr int64_t kDefaultSeqLen = 2048;

// Refuses a GPT-2 config.json that describes another model than the deck's.
void check_gpt2_config(const std::string& path, const json& j, const Config& cfg) {
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
      refuse(deck + ": model." + v.key + " = " + v.deck_value +
             ", which a Hugging Face GPT-2 model cannot be (it has model." +
             v.key + " = " + v.gpt2_value + ")");
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
    const json v = json_value_or(j, w.key, w.fallback);
    if (v != w.deck_value)
      refuse(path + ": " + w.key + " = " + v.dump() + ", but " + deck + " has " +
             w.deck_key + " = " + w.deck_value.dump() + ": another model (set " +
             w.deck_key + " = " + v.dump() + " to import it)");
  }
  // What meshtrain computes that no deck key selects (checkpoint/model_signature.cpp).
  const json act = json_value_or(j, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    refuse(path + ": activation_function = " + act.dump() +
           " (meshtrain computes GPT-2's "
           "tanh GELU: accepted \"gelu_new\" or \"gelu_pytorch_tanh\")");
  const json eps = json_value_or(j, "layer_norm_epsilon", 1e-5);
  if (!eps.is_number() || std::fabs(eps.get<double>() - 1e-5) > 1e-12)
    refuse(path + ": layer_norm_epsilon = " + eps.dump() +
           " (meshtrain's LayerNorm uses 1e-05)");
  // null: GPT-2's 4 x n_embd (n_embd is the deck's d_model: checked above).
  json inner = json_value_or(j, "n_inner", nullptr);
  if (inner.is_null()) inner = 4 * m.d_model;
  if (inner != json(m.ffn_hidden()))
    refuse(path + ": n_inner = " + json_value_or(j, "n_inner", nullptr).dump() +
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
    const json v = json_value_or(j, f.key, f.want);
    if (v != json(f.want))
      refuse(path + ": " + f.key + " = " + v.dump() + " (meshtrain's attention computes " +
             f.key + " = " + (f.want ? "true" : "false") + ")");
  }
}

// Refuses a deck whose model is not the one a Llama / Qwen 3 config.json describes.
void check_llama_config(const std::string& path, const ModelSpec& hf, int64_t max_positions, const Config& cfg) {
  const ModelSpec& m = cfg.model;
  const std::string deck = cfg.deck_path + " (with its --set overrides)";
  std::vector<SpecField> fields = {
      {"family", "\"" + m.family + "\"", "\"" + hf.family + "\""},
      {"layers", std::to_string(m.layers), std::to_string(hf.layers)},
      {"d_model", std::to_string(m.d_model), std::to_string(hf.d_model)},
      {"heads", std::to_string(m.heads), std::to_string(hf.heads)},
      {"vocab_size", std::to_string(m.vocab_size), std::to_string(hf.vocab_size)},
      {"tie_embeddings", m.tie_embeddings ? "true" : "false", hf.tie_embeddings ? "true" : "false"},
  };
  // SpecField here: (key, the deck's value, config.json's value), both in TOML notation.
  const std::vector<SpecField> mine = spec_fields(m), theirs = spec_fields(hf);
  const bool scaled = hf.rope.scaling != RopeScalingKind::None;
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string& key = mine[i].key;
    // Llama 3's scaling factors mean nothing without its scaling; the dense feed-forward's width
    // nothing in a mixture without dense blocks (Mixtral's intermediate_size is its experts').
    const bool unused =
        (!scaled && key.rfind("rope_", 0) == 0 && key != "rope_theta" && key != "rope_scaling") ||
        (key == "ffn_hidden" && hf.feed_forward == FeedForwardKind::Moe &&
         m.feed_forward == FeedForwardKind::Moe && hf.moe.first_dense_layers == 0 &&
         m.moe.first_dense_layers == 0);
    // The balancing losses' coefficients are the fine-tune's choice: they change training, not
    // the function the weights compute.
    const bool training_only = key == "moe_aux_loss" || key == "moe_z_loss";
    // A dense model's moe_* fields mean nothing (a mixture on one side only differs in
    // feed_forward, compared before them).
    const bool dense_only = key.rfind("moe_", 0) == 0 && hf.feed_forward == FeedForwardKind::Dense;
    if (key != "family" && !unused && !training_only && !dense_only)
      fields.push_back({key, mine[i].value, theirs[i].value});
  }
  for (const SpecField& f : fields)
    if (f.value != f.gpt2_value)
      refuse(path + ": " + hf_llama_config_key(f.key, hf) + " gives model." + f.key +
             " = " + f.gpt2_value + ", but " + deck + " has model." + f.key + " = " +
             f.value + ": another model (set model." + f.key + " = " + f.gpt2_value +
             " to import it)");
  if (m.seq_len > max_positions)
    refuse(path + ": max_position_embeddings = " + std::to_string(max_positions) + ", but " +
           deck + " has model.seq_len = " + std::to_string(m.seq_len) +
           ", longer than the model was made for (set model.seq_len <= " +
           std::to_string(max_positions) + ")");
}

// A GPT2LMHeadModel config.json as a spec (transformers' defaults for absent keys), each size
// in the range of the deck key it becomes (refused naming config.json's key, never narrowed);
// the remaining keys are check_gpt2_config's.
ModelSpec gpt2_spec_of(const json& j, const std::string& path) {
  const HfConfigReader c(j, path);
  ModelSpec m = gpt2_spec(static_cast<int>(c.deck_integer("n_layer", 12, "model.layers")),
                          c.deck_integer("n_embd", 768, "model.d_model"), c.deck_integer("n_head", 12, "model.heads"),
                          c.deck_integer("n_positions", 1024, "model.seq_len"),
                          c.deck_integer("vocab_size", 50257, "model.vocab_size"));
  const json tie = json_value_or(j, "tie_word_embeddings", true);
  m.tie_embeddings = !tie.is_boolean() || tie.get<bool>();
  if (const int64_t inner = c.deck_integer("n_inner", 4 * m.d_model, "model.ffn_hidden"); inner != 4 * m.d_model)
    m.ffn_hidden_set = inner;
  return m;
}

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

// Reads every tensor of `tensors` from `weights` into meshtrain's layout, refusing a missing
// tensor, another shape, or a stored tensor the model has no place for.
std::map<std::string, std::vector<float>> read_tensors(
    const HfWeights& weights, const std::vector<HfTensor>& tensors, const ModelSpec& m, const std::string& model,
    const std::string& embedding, const std::function<std::string(const std::string&)>& canonical,
    const std::function<bool(const std::string&)>& is_buffer, size_t& count) {
  std::map<std::string, HfStoredTensor> stored;
  for (const auto& [name, t] : weights.tensors())
    if (!is_buffer(name)) stored[canonical(name)] = t;
  std::map<std::string, std::vector<float>> values;
  std::set<std::string> used;
  for (const HfTensor& t : tensors) {
    const auto it = stored.find(t.hf);
    if (it == stored.end())
      refuse(weights.source() + ": tensor " + t.hf + " is missing, but " + model + " has it" +
             (t.hf == "lm_head.weight"
                  ? " (an untied head: for a tied model set model.tie_embeddings = true)"
                  : ""));
    const SafetensorsEntry& e = *it->second.entry;
    if (e.shape != t.hf_shape) {
      SafetensorsEntry want;
      want.shape = t.hf_shape;
      refuse(it->second.file->path() + ": tensor " + e.name + " has shape " + e.shape_string() +
             ", but " + model + " needs " + want.shape_string());
    }
    used.insert(t.hf);
    const std::vector<float> stored_values = it->second.file->read_f32(e);
    refuse_non_finite(it->second.file->path(), e, stored_values);
    from_hf_layout(t, stored_values, values[t.meshtrain]);
  }
  for (const auto& [name, t] : stored) {
    if (used.count(name)) continue;
    // Some savers keep the tied head beside the embedding: the same values, nothing new.
    if (name == "lm_head.weight" && m.tie_embeddings) {
      const std::vector<float> head = t.file->read_f32(*t.entry);
      const std::vector<float>& wte = values.at("wte");
      if (head.size() == wte.size() && std::memcmp(head.data(), wte.data(), wte.size() * sizeof(float)) == 0)
        continue;
      refuse(t.file->path() + ": tensor lm_head.weight differs from " + embedding + ", but " +
             model + " ties them (set model.tie_embeddings = false to import an untied head)");
    }
    refuse(t.file->path() + ": tensor " + t.entry->name + " " + t.entry->shape_string() +
           " is not part of " + model +
           " (check model.layers and model.tie_embeddings against config.json)");
  }
  count = used.size();
  return values;
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
  const json type = json_value_or(j, "model_type", "(absent)");
  const bool gpt2 = type == "gpt2";
  ModelSpec hf;
  int64_t max_positions = 0;
  if (gpt2) {
    hf = gpt2_spec_of(j, config_path);
  } else {
    hf = hf_llama_spec(j, config_path, 0, max_positions);
    hf.seq_len = std::min(max_positions, kDefaultSeqLen);
    // Mixtral attends within its sliding window: the deck built for it trains no longer.
    if (const std::optional<int64_t> w = json_int64(json_value_or(j, "sliding_window", nullptr));
        type == "mixtral" && w)
      hf.seq_len = std::max<int64_t>(1, std::min(hf.seq_len, *w));
  }
  // The deck: the user's, or one built from config.json (with the --set overrides in it).
  Config cfg;
  std::string deck_text;
  if (!args.deck.empty()) {
    cfg = parse_deck(args.deck, read_deck_file(args.deck), args.overrides);
  } else {
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
    cfg = parse_deck(config_path + " (the deck built from it" +
                         (args.deck_out.empty() ? std::string() : " for --deck-out " + args.deck_out) + ")",
                     deck_text);
  }
  if (gpt2) {
    check_gpt2_config(config_path, j, cfg);
  } else {
    check_llama_config(config_path, hf, max_positions, cfg);
    hf_check_sliding_window(HfConfigReader(j, config_path), cfg.model.seq_len, cfg.deck_path);
  }
  const ModelSpec& m = cfg.model;
  const HfWeights weights = HfWeights::open(args.dir);

  const std::string model =
      "the deck's model (" + cfg.deck_path + ": model.layers = " + std::to_string(m.layers) +
      ", d_model = " + std::to_string(m.d_model) + ", seq_len = " + std::to_string(m.seq_len) +
      ", vocab_size = " + std::to_string(m.vocab_size) +
      ", tie_embeddings = " + (m.tie_embeddings ? "true" : "false") + ")";
  size_t count = 0;
  std::map<std::string, std::vector<float>> values;
  if (gpt2) {
    // GPT2Model.save_pretrained (the original "gpt2" files) writes the transformer's tensors
    // without the "transformer." prefix, and older transformers saved the causal-mask buffers.
    auto canonical = [](const std::string& name) {
      if (name.rfind("transformer.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return name;
      return "transformer." + name;
    };
    auto is_mask_buffer = [](const std::string& name) {
      auto ends = [&](const std::string& s) {
        return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
      };
      return ends(".attn.bias") || ends(".attn.masked_bias");
    };
    values = read_tensors(weights, hf_gpt2_tensors(m), m, model, "transformer.wte.weight", canonical,
                          is_mask_buffer, count);
  } else {
    // Older transformers saved each layer's rotary inverse frequencies: a constant of rope_theta.
    auto is_rotary_buffer = [](const std::string& name) {
      return name.find(".rotary_emb.inv_freq") != std::string::npos;
    };
    values = read_tensors(weights, hf_llama_tensors(m), m, model, "model.embed_tokens.weight",
                          [](const std::string& n) { return n; }, is_rotary_buffer, count);
  }
  outputs.write(deck_text, [&] { write_imported_checkpoint(args.out, cfg, values, args.force); });
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
