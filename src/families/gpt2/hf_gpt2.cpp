#include "meshtrain/families/gpt2/hf_gpt2.h"

#include <cmath>
#include <iterator>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/families/registry.h"

namespace meshtrain {

namespace {

// GPT2LMHeadModel's tensors, in the order HF writes them: the rules with "{}" are applied block
// by block. A tied model has no lm_head.weight parameter, and HF then omits the tensor too.
constexpr HfNameRule kGpt2Names[] = {
    {"wte", "transformer.wte.weight", HfTransform::Same},
    {"wpe", "transformer.wpe.weight", HfTransform::Same},
    {"h.{}.ln_1.weight", "transformer.h.{}.ln_1.weight", HfTransform::Same},
    {"h.{}.ln_1.bias", "transformer.h.{}.ln_1.bias", HfTransform::Same},
    {"h.{}.attn.qkv.weight", "transformer.h.{}.attn.c_attn.weight", HfTransform::TransposedLinear},
    {"h.{}.attn.qkv.bias", "transformer.h.{}.attn.c_attn.bias", HfTransform::Flattened},
    {"h.{}.attn.proj.weight", "transformer.h.{}.attn.c_proj.weight", HfTransform::TransposedLinear},
    {"h.{}.attn.proj.bias", "transformer.h.{}.attn.c_proj.bias", HfTransform::Same},
    {"h.{}.ln_2.weight", "transformer.h.{}.ln_2.weight", HfTransform::Same},
    {"h.{}.ln_2.bias", "transformer.h.{}.ln_2.bias", HfTransform::Same},
    {"h.{}.mlp.fc.weight", "transformer.h.{}.mlp.c_fc.weight", HfTransform::TransposedLinear},
    {"h.{}.mlp.fc.bias", "transformer.h.{}.mlp.c_fc.bias", HfTransform::Same},
    {"h.{}.mlp.proj.weight", "transformer.h.{}.mlp.c_proj.weight", HfTransform::TransposedLinear},
    {"h.{}.mlp.proj.bias", "transformer.h.{}.mlp.c_proj.bias", HfTransform::Same},
    {"ln_f.weight", "transformer.ln_f.weight", HfTransform::Same},
    {"ln_f.bias", "transformer.ln_f.bias", HfTransform::Same},
    {"lm_head.weight", "lm_head.weight", HfTransform::Same},
};

}  // namespace

std::vector<HfTensor> hf_gpt2_tensors(const ModelSpec& m) {
  return hf_tensors(m, kGpt2Names, std::size(kGpt2Names), "GPT-2");
}

std::string hf_gpt2_config_json(const ModelSpec& m, const std::string& torch_dtype,
                                const std::string& tokenizer) {
  nlohmann::ordered_json j;
  j["model_type"] = "gpt2";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["vocab_size"] = m.vocab_size;
  j["n_positions"] = m.seq_len;
  j["n_ctx"] = m.seq_len;
  j["n_embd"] = m.d_model;
  j["n_layer"] = m.layers;
  j["n_head"] = m.heads;
  j["n_inner"] = m.ffn_hidden();
  // meshtrain's GELU is GPT-2's tanh approximation (backend/*/gelu), which HF calls gelu_new.
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  // meshtrain trains without dropout; a fine-tune in HF may set these again.
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = m.tie_embeddings;
  // The byte tokenizer has no begin/end-of-text token; null keeps HF from assuming GPT-2's
  // 50256, which would lie outside a 256-token vocabulary. GPT-2's BPE has <|endoftext|>.
  const bool gpt2_bpe = tokenizer.find("gpt2") != std::string::npos && m.vocab_size > 50256;
  j["bos_token_id"] = gpt2_bpe ? nlohmann::ordered_json(50256) : nlohmann::ordered_json(nullptr);
  j["eos_token_id"] = j["bos_token_id"];
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

using nlohmann::json;

namespace {

// Refuses a deck whose model is not the one a GPT-2 config.json describes (HfFormat::check_deck).
void check_gpt2_deck(const HfConfigReader& c, const ModelSpec&, int64_t, const ModelSpec& m,
                     const std::string& deck_path) {
  const std::string& path = c.path();
  const json& j = c.config();
  const std::string deck = deck_path + " (with its --set overrides)";
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
      hf_refuse(deck + ": model." + v.key + " = " + v.deck_value +
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
      hf_refuse(path + ": " + w.key + " = " + v.dump() + ", but " + deck + " has " +
                w.deck_key + " = " + w.deck_value.dump() + ": another model (set " +
                w.deck_key + " = " + v.dump() + " to import it)");
  }
  // What meshtrain computes that no deck key selects (checkpoint/model_signature.cpp).
  const json act = json_value_or(j, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    hf_refuse(path + ": activation_function = " + act.dump() +
              " (meshtrain computes GPT-2's "
              "tanh GELU: accepted \"gelu_new\" or \"gelu_pytorch_tanh\")");
  const json eps = json_value_or(j, "layer_norm_epsilon", 1e-5);
  if (!eps.is_number() || std::fabs(eps.get<double>() - 1e-5) > 1e-12)
    hf_refuse(path + ": layer_norm_epsilon = " + eps.dump() +
              " (meshtrain's LayerNorm uses 1e-05)");
  // null: GPT-2's 4 x n_embd (n_embd is the deck's d_model: checked above).
  json inner = json_value_or(j, "n_inner", nullptr);
  if (inner.is_null()) inner = 4 * m.d_model;
  if (inner != json(m.ffn_hidden()))
    hf_refuse(path + ": n_inner = " + json_value_or(j, "n_inner", nullptr).dump() +
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
      hf_refuse(path + ": " + f.key + " = " + v.dump() + " (meshtrain's attention computes " +
                f.key + " = " + (f.want ? "true" : "false") + ")");
  }
}

// A GPT2LMHeadModel config.json as a spec (transformers' defaults for absent keys), each size
// in the range of the deck key it becomes (refused naming config.json's key, never narrowed);
// the remaining keys are check_gpt2_deck's.
ModelSpec gpt2_read_config(const HfConfigReader& c, int64_t& max_positions) {
  const json& j = c.config();
  ModelSpec m = gpt2_spec(static_cast<int>(c.deck_integer("n_layer", 12, "model.layers")),
                          c.deck_integer("n_embd", 768, "model.d_model"), c.deck_integer("n_head", 12, "model.heads"),
                          c.deck_integer("n_positions", 1024, "model.seq_len"),
                          c.deck_integer("vocab_size", 50257, "model.vocab_size"));
  const json tie = json_value_or(j, "tie_word_embeddings", true);
  m.tie_embeddings = !tie.is_boolean() || tie.get<bool>();
  if (const int64_t inner = c.deck_integer("n_inner", 4 * m.d_model, "model.ffn_hidden"); inner != 4 * m.d_model)
    m.ffn_hidden_set = inner;
  max_positions = m.seq_len;  // learned positions: the deck trains at n_positions exactly
  return m;
}

// The model a checkpoint's @model attribute describes, refusing any setting GPT2LMHeadModel
// cannot express. Read from the settings themselves, not as a deck: a checkpoint written before
// a field existed lacks its key, and computed GPT-2's value (model/model_spec.h: spec_fields).
ModelSpec gpt2_recorded_model(const RecordedModel& r) {
  const std::string& path = r.path;
  const std::string& recorded = r.text;
  std::map<std::string, std::string> s = r.settings;
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
  return m;
}


// Older transformers saved the causal-mask buffers beside the weights.
bool gpt2_is_buffer(const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias");
}

// GPT2Model.save_pretrained (the original "gpt2" files) writes the transformer's tensors without
// the "transformer." prefix.
std::string gpt2_stored_name(const std::string& name) {
  if (name.rfind("transformer.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return name;
  return "transformer." + name;
}

std::string gpt2_architecture(const ModelSpec&, const std::string&) { return "GPT2LMHeadModel"; }

std::string gpt2_config_json(const ModelSpec& m, const HfExportOptions& o) {
  return hf_gpt2_config_json(m, o.torch_dtype, o.tokenizer);
}

}  // namespace

const HfFormat& hf_gpt2_format() {
  static const HfFormat format = {
      gpt2_read_config,
      check_gpt2_deck,
      hf_gpt2_tensors,
      "transformer.wte.weight",
      gpt2_stored_name,
      gpt2_is_buffer,
      gpt2_recorded_model,
      gpt2_architecture,
      gpt2_config_json,
      "wte, wpe, h.<i>.{ln_1,attn,ln_2,mlp}, ln_f and an untied lm_head.weight",
      nullptr,
      nullptr,
  };
  return format;
}

}  // namespace meshtrain
