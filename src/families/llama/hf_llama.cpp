#include "meshtrain/families/llama/hf_llama.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <utility>

#include "meshtrain/families/llama/hf_windows.h"
#include "meshtrain/families/moe/hf_moe.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

using nlohmann::json;

namespace {

// LlamaForCausalLM's and Qwen3ForCausalLM's tensors, in the order of their modules (the order
// save_pretrained shards them in). A model has either the fused qkv or q, k and v.
constexpr HfNameRule kLlamaNames[] = {
    {"wte", "model.embed_tokens.weight", HfTransform::Same},
    {"h.{}.attn.qkv.weight", "model.layers.{}.self_attn.q_proj.weight", HfTransform::ThirdQ},
    {"h.{}.attn.qkv.bias", "model.layers.{}.self_attn.q_proj.bias", HfTransform::ThirdQ},
    {"h.{}.attn.qkv.weight", "model.layers.{}.self_attn.k_proj.weight", HfTransform::ThirdK},
    {"h.{}.attn.qkv.bias", "model.layers.{}.self_attn.k_proj.bias", HfTransform::ThirdK},
    {"h.{}.attn.qkv.weight", "model.layers.{}.self_attn.v_proj.weight", HfTransform::ThirdV},
    {"h.{}.attn.qkv.bias", "model.layers.{}.self_attn.v_proj.bias", HfTransform::ThirdV},
    {"h.{}.attn.q.weight", "model.layers.{}.self_attn.q_proj.weight", HfTransform::Same},
    {"h.{}.attn.q.bias", "model.layers.{}.self_attn.q_proj.bias", HfTransform::Same},
    {"h.{}.attn.k.weight", "model.layers.{}.self_attn.k_proj.weight", HfTransform::Same},
    {"h.{}.attn.k.bias", "model.layers.{}.self_attn.k_proj.bias", HfTransform::Same},
    {"h.{}.attn.v.weight", "model.layers.{}.self_attn.v_proj.weight", HfTransform::Same},
    {"h.{}.attn.v.bias", "model.layers.{}.self_attn.v_proj.bias", HfTransform::Same},
    {"h.{}.attn.proj.weight", "model.layers.{}.self_attn.o_proj.weight", HfTransform::Same},
    {"h.{}.attn.proj.bias", "model.layers.{}.self_attn.o_proj.bias", HfTransform::Same},
    {"h.{}.attn.q_norm.weight", "model.layers.{}.self_attn.q_norm.weight", HfTransform::Same},
    {"h.{}.attn.k_norm.weight", "model.layers.{}.self_attn.k_norm.weight", HfTransform::Same},
    {"h.{}.mlp.gate.weight", "model.layers.{}.mlp.gate_proj.weight", HfTransform::Same},
    {"h.{}.mlp.gate.bias", "model.layers.{}.mlp.gate_proj.bias", HfTransform::Same},
    {"h.{}.mlp.up.weight", "model.layers.{}.mlp.up_proj.weight", HfTransform::Same},
    {"h.{}.mlp.up.bias", "model.layers.{}.mlp.up_proj.bias", HfTransform::Same},
    {"h.{}.mlp.down.weight", "model.layers.{}.mlp.down_proj.weight", HfTransform::Same},
    {"h.{}.mlp.down.bias", "model.layers.{}.mlp.down_proj.bias", HfTransform::Same},
    {"h.{}.ln_1.weight", "model.layers.{}.input_layernorm.weight", HfTransform::Same},
    {"h.{}.ln_2.weight", "model.layers.{}.post_attention_layernorm.weight", HfTransform::Same},
    {"ln_f.weight", "model.norm.weight", HfTransform::Same},
    {"lm_head.weight", "lm_head.weight", HfTransform::Same},
};

// (spec field, config.json key) for the messages that compare the two.
constexpr const char* kConfigKeys[][2] = {
    {"family", "model_type"},
    {"layers", "num_hidden_layers"},
    {"d_model", "hidden_size"},
    {"heads", "num_attention_heads"},
    {"vocab_size", "vocab_size"},
    {"tie_embeddings", "tie_word_embeddings"},
    {"norm_eps", "rms_norm_eps"},
    {"rope_theta", "rope_theta"},
    {"rope_scaling", "rope_scaling.rope_type"},
    {"rope_factor", "rope_scaling.factor"},
    {"rope_low_freq_factor", "rope_scaling.low_freq_factor"},
    {"rope_high_freq_factor", "rope_scaling.high_freq_factor"},
    {"rope_original_max_positions", "rope_scaling.original_max_position_embeddings"},
    {"rope_beta_fast", "rope_scaling.beta_fast"},
    {"rope_beta_slow", "rope_scaling.beta_slow"},
    {"rope_mscale", "rope_scaling.mscale"},
    {"rope_mscale_all_dim", "rope_scaling.mscale_all_dim"},
    {"rope_attention_factor", "rope_scaling.attention_factor"},
    {"rope_truncate", "rope_scaling.truncate"},
    {"activation", "hidden_act"},
    {"bias", "attention_bias"},
    {"qk_norm", "model_type"},
    {"kv_heads", "num_key_value_heads"},
    {"head_dim", "head_dim"},
    {"ffn_hidden", "intermediate_size"},
    {"mtp_layers", "num_nextn_predict_layers"},
    {"attention_window", "sliding_window"},
};

}  // namespace

std::vector<HfTensor> hf_llama_tensors(const ModelSpec& m) {
  // A mixture's router and experts go where the dense MLP's tensors are (its dense first
  // blocks keep those): among the block rules, which are applied block by block as one group.
  std::vector<HfNameRule> rules(std::begin(kLlamaNames), std::end(kLlamaNames));
  const std::vector<HfNameRule> moe = hf_moe_name_rules(m);
  const auto at = std::find_if(rules.begin(), rules.end(), [](const HfNameRule& r) {
    return std::string(r.meshtrain) == "h.{}.ln_1.weight";
  });
  rules.insert(at, moe.begin(), moe.end());
  const std::string dense = m.windowed() ? "MistralForCausalLM" : "LlamaForCausalLM";
  const std::string model_class = m.feed_forward == FeedForwardKind::Moe
                                      ? (m.qk_norm ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM")
                                      : (m.qk_norm ? "Qwen3ForCausalLM" : dense);
  return hf_tensors(m, rules.data(), rules.size(), model_class);
}

std::string hf_llama_config_key(const std::string& field, const ModelSpec& hf) {
  if (const std::string moe = hf_moe_config_key(field, hf); !moe.empty()) return moe;
  for (const auto& k : kConfigKeys)
    if (field == k[0]) return k[1];
  return field;
}

namespace {

// transformers' defaults for the keys a config.json may leave out, per model_type.
struct HfDefaults {
  int64_t layers, d_model, heads, kv_heads;  // kv_heads 0: heads
  int64_t vocab, head_dim, ffn_hidden;       // head_dim 0: hidden_size / heads
  double norm_eps, rope_theta;
  int64_t max_positions;
};

HfDefaults hf_defaults(const std::string& type) {
  if (type == "qwen3") return {32, 4096, 32, 0, 151936, 128, 22016, 1e-6, 10000.0, 32768};
  if (type == "mixtral") return {32, 4096, 32, 8, 32000, 0, 14336, 1e-5, 1e6, 131072};
  if (type == "mistral") return {32, 4096, 32, 8, 32000, 0, 14336, 1e-6, 10000.0, 32768};
  if (type == "qwen3_moe") return {24, 2048, 32, 4, 151936, 0, 6144, 1e-6, 10000.0, 32768};
  return {32, 4096, 32, 0, 32000, 0, 11008, 1e-6, 10000.0, 2048};
}

}  // namespace

namespace {

// YaRN's keys (rope_type "yarn"), as transformers reads them (modeling_rope_utils.py:
// standardize_rope_params, _compute_yarn_parameters): original_max_position_embeddings from the
// top level first, then the scaling's, then max_position_embeddings; a null factor is
// max_position_embeddings / original; beta_fast, beta_slow, mscale, mscale_all_dim,
// attention_factor and truncate optional.
void read_yarn(const HfConfigReader& c, const nlohmann::json& rope, const std::string& where,
               int64_t max_positions, RopeSpec& rope_spec) {
  const json& j = c.config();
  const char* const deck_key = "model.rope_original_max_positions";
  const bool top_level = !json_value_or(j, "original_max_position_embeddings", nullptr).is_null();
  rope_spec.original_max_positions =
      top_level ? c.deck_integer(j, "original_max_position_embeddings", max_positions, deck_key)
                : c.deck_integer(rope, "original_max_position_embeddings", max_positions, deck_key, where);
  rope_spec.factor = c.number(rope, "factor",
                              static_cast<double>(max_positions) /
                                  static_cast<double>(rope_spec.original_max_positions),
                              where);
  if (rope_spec.factor < 1)
    c.refuse(where + "factor", rope_spec.factor,
             "YaRN stretches the context by a factor >= 1, as transformers requires");
  rope_spec.beta_fast = c.number(rope, "beta_fast", 32.0, where);
  rope_spec.beta_slow = c.number(rope, "beta_slow", 1.0, where);
  if (rope_spec.beta_fast <= rope_spec.beta_slow)
    c.refuse(where + "beta_fast", rope_spec.beta_fast,
             "a number of turns above beta_slow = " + json(rope_spec.beta_slow).dump());
  rope_spec.mscale = c.number(rope, "mscale", 0.0, where, true);
  rope_spec.mscale_all_dim = c.number(rope, "mscale_all_dim", 0.0, where, true);
  // Absent or null: derived (0 in the spec); a given value is the factor itself.
  if (!json_value_or(rope, "attention_factor", nullptr).is_null())
    rope_spec.attention_factor = c.number(rope, "attention_factor", 1.0, where);
  const json truncate = json_value_or(rope, "truncate", true);
  if (!truncate.is_boolean()) c.refuse(where + "truncate", truncate, "expected true or false");
  rope_spec.truncate = truncate.get<bool>();
}

}  // namespace

// Rotary: rope_theta and rope_scaling (transformers < 4.56), or both inside rope_parameters;
// `default_theta` is the model_type's default.

void hf_read_rope(const HfConfigReader& c, double default_theta, int64_t max_positions, RopeSpec& rope_spec) {
  const json& j = c.config();
  const std::string& path = c.path();
  auto number = [&](const json& obj, const char* key, double fallback, const std::string& prefix = "") {
    return c.number(obj, key, fallback, prefix);
  };
  const bool newer = j.contains("rope_parameters") && j["rope_parameters"].is_object();
  const json rope = newer ? j["rope_parameters"] : json_value_or(j, "rope_scaling", json::object());
  const std::string where = newer ? "rope_parameters." : "rope_scaling.";
  if (!rope.is_object()) c.refuse("rope_scaling", rope, "expected null or an object with rope_type");
  rope_spec.theta = newer && rope.contains("rope_theta") ? number(rope, "rope_theta", 10000.0, where)
                                                         : number(j, "rope_theta", default_theta);
  const json rope_type = json_value_or(rope, "rope_type", json_value_or(rope, "type", "default"));
  if (rope_type == "llama3") {
    rope_spec.scaling = RopeScalingKind::Llama3;
    for (const char* key : {"factor", "original_max_position_embeddings"})
      if (!rope.contains(key))
        throw std::runtime_error(path + ": " + where + key + " is missing (rope_type \"llama3\" needs "
                                 "factor, low_freq_factor, high_freq_factor and "
                                 "original_max_position_embeddings)");
    rope_spec.factor = number(rope, "factor", 8.0, where);
    rope_spec.low_freq_factor = number(rope, "low_freq_factor", 1.0, where);
    rope_spec.high_freq_factor = number(rope, "high_freq_factor", 4.0, where);
    rope_spec.original_max_positions =
        c.deck_integer(rope, "original_max_position_embeddings", 8192, "model.rope_original_max_positions", where);
  } else if (rope_type == "yarn") {
    rope_spec.scaling = RopeScalingKind::Yarn;
    read_yarn(c, rope, where, max_positions, rope_spec);
  } else if (rope_type != "default") {
    c.refuse(where + "rope_type", rope_type,
             "meshtrain computes rotary positions without scaling (\"default\"), with Llama 3's "
             "(\"llama3\") or with YaRN's (\"yarn\"); \"linear\", \"dynamic\", \"longrope\" and the "
             "others are not implemented");
  }
}

ModelSpec hf_llama_spec(const HfConfigReader& c, int64_t seq_len, int64_t& max_positions) {
  const json& j = c.config();
  const std::string& path = c.path();
  const json type = json_value_or(j, "model_type", "(absent)");
  if (type != "llama" && type != "mistral" && type != "qwen3" &&
      !(type.is_string() && hf_moe_model_type(type.get<std::string>())))
    throw std::runtime_error(terminal_safe(path + ": model_type = " + type.dump()) +
                             " (meshtrain imports \"gpt2\", \"llama\", \"mistral\", \"qwen3\", "
                             "\"mixtral\" and \"qwen3_moe\")");
  const std::string model_type = type.get<std::string>();
  const bool qwen = model_type == "qwen3" || model_type == "qwen3_moe";
  const std::string family = qwen ? "qwen3" : "llama";
  const HfDefaults d = hf_defaults(model_type);
  auto refuse = [&](const std::string& key, const json& v, const std::string& accepted) {
    c.refuse(key, v, accepted);
  };
  // Each integer in the range of the deck key it becomes: refused here, naming config.json's
  // key, rather than narrowed or refused later in the deck built from it.
  auto integer = [&](const char* key, int64_t fallback, const char* deck_key) {
    return c.deck_integer(key, fallback, deck_key);
  };
  auto number = [&](const json& obj, const char* key, double fallback, const std::string& prefix = "") {
    return c.number(obj, key, fallback, prefix);
  };
  auto boolean = [&](const char* key) { return c.boolean(key); };
  ModelSpec sizes;
  sizes.layers = static_cast<int>(integer("num_hidden_layers", d.layers, "model.layers"));
  sizes.d_model = integer("hidden_size", d.d_model, "model.d_model");
  sizes.heads = integer("num_attention_heads", d.heads, "model.heads");
  sizes.vocab_size = integer("vocab_size", d.vocab, "model.vocab_size");
  sizes.seq_len = seq_len;
  ModelSpec m = family_defaults(family, sizes);
  // 0 stands for "derived" in the spec: kept where the config says the derived value.
  if (const int64_t kv = integer("num_key_value_heads", d.kv_heads ? d.kv_heads : m.heads, "model.kv_heads");
      kv != m.heads)
    m.kv_heads_set = kv;
  const int64_t head_dim = integer("head_dim", d.head_dim ? d.head_dim : m.d_model / m.heads, "model.head_dim");
  if (head_dim != m.d_model / m.heads || m.d_model % m.heads != 0) m.head_dim_set = head_dim;
  if (const int64_t f = integer("intermediate_size", d.ffn_hidden, "model.ffn_hidden"); f != 4 * m.d_model)
    m.ffn_hidden_set = f;
  m.norm.eps = number(j, "rms_norm_eps", d.norm_eps);
  m.tie_embeddings = boolean("tie_word_embeddings");
  // Only compared with model.seq_len (and capping the deck's): any positive 64-bit integer.
  max_positions = c.integer(j, "max_position_embeddings", d.max_positions, 1, INT64_MAX);
  const json act = json_value_or(j, "hidden_act", "silu");
  if (act != "silu") refuse("hidden_act", act, "meshtrain's SwiGLU gates with SiLU: accepted \"silu\"");
  if (hf_moe_model_type(model_type)) hf_moe_read_config(c, model_type, m);

  // Biases: meshtrain's model.bias is a bias on every linear layer. Llama's attention_bias
  // covers q, k, v and o, mlp_bias gate, up and down; Qwen 3's MLP has none.
  const bool mixtral = model_type == "mixtral";
  // Mixtral has neither key: no linear layer of it has a bias.
  const bool attention_bias = !mixtral && boolean("attention_bias"),
             mlp_bias = !qwen && !mixtral && boolean("mlp_bias");
  if (qwen && attention_bias)
    refuse("attention_bias", true,
           "Qwen 3 then has biases on q, k, v and o but not in its MLP, and meshtrain's model.bias "
           "puts one on every linear layer: not representable, accepted false");
  if (attention_bias != mlp_bias)
    refuse(attention_bias ? "mlp_bias" : "attention_bias", false,
           std::string("with ") + (attention_bias ? "attention_bias" : "mlp_bias") +
               " = true: meshtrain's model.bias puts a bias on every linear layer or on none, "
               "so the two must be equal");
  m.linear_bias = attention_bias;
  m.attention_window = hf_read_windows(c, model_type, m.layers);

  hf_read_rope(c, d.rope_theta, max_positions, m.rope);
  return m;
}

std::string hf_llama_architecture(const ModelSpec& m, const std::string& where) {
  auto refuse = [&](const std::string& key, const std::string& value, const std::string& hf) {
    throw std::runtime_error(where + ": model." + key + " = " + value + ", which Hugging Face " + hf +
                             " cannot express: export refuses rather than write a model that "
                             "computes another function");
  };
  const std::string hf = m.qk_norm ? "Qwen3ForCausalLM" : m.windowed() ? "MistralForCausalLM" : "LlamaForCausalLM";
  if (const std::string why = hf_windows_unexpressible(m); !why.empty())
    refuse("attention_window", attention_window_text(m.attention_window), hf + " (" + why + ")");
  if (m.windowed() && !m.qk_norm && m.linear_bias)
    refuse("bias", "true", hf + " (no biases)");
  if (m.norm.kind != NormKind::Rms) refuse("norm", norm_name(m.norm.kind), hf + " (RMSNorm)");
  if (m.positions != PositionKind::Rotary)
    refuse("positions", position_name(m.positions), hf + " (rotary positions)");
  if (m.activation != ActivationKind::SwiGlu)
    refuse("activation", activation_name(m.activation), hf + " (SwiGLU)");
  if (m.qk_norm && m.linear_bias)
    refuse("bias", "true", hf + " (its MLP has no bias; with model.qk_norm = true this is Qwen 3)");
  if (m.mtp_layers > 0)
    refuse("mtp_layers", std::to_string(m.mtp_layers),
           hf + " (no multi-token prediction layers: the deepseek_v3 family's DeepseekV3ForCausalLM "
           "holds them)");
  if (m.feed_forward == FeedForwardKind::Moe) {
    if (m.linear_bias) refuse("bias", "true", "MixtralForCausalLM or Qwen3MoeForCausalLM (no biases)");
    return hf_moe_architecture(m, where);
  }
  return hf;
}

// config.json's rope_scaling: null, Llama 3's keys, or YaRN's (the optional ones only where they
// differ from what transformers assumes without them).
nlohmann::ordered_json hf_rope_scaling_json(const RopeSpec& rope) {
  nlohmann::ordered_json s;
  switch (rope.scaling) {
    case RopeScalingKind::None:
      return nullptr;
    case RopeScalingKind::Llama3:
      s = {{"rope_type", "llama3"},
           {"factor", rope.factor},
           {"low_freq_factor", rope.low_freq_factor},
           {"high_freq_factor", rope.high_freq_factor},
           {"original_max_position_embeddings", rope.original_max_positions}};
      return s;
    case RopeScalingKind::Yarn:
      s["rope_type"] = "yarn";
      s["factor"] = rope.factor;
      s["original_max_position_embeddings"] = rope.original_max_positions;
      s["beta_fast"] = rope.beta_fast;
      s["beta_slow"] = rope.beta_slow;
      // 0 stands for an absent key (transformers tests these for truth).
      for (const auto& [key, value] : {std::pair{"mscale", rope.mscale},
                                       std::pair{"mscale_all_dim", rope.mscale_all_dim},
                                       std::pair{"attention_factor", rope.attention_factor}})
        if (value != 0) s[key] = value;
      if (!rope.truncate) s["truncate"] = false;
      return s;
  }
  return nullptr;
}

std::string hf_llama_config_json(const ModelSpec& m, const std::string& torch_dtype, int64_t bos,
                                 int64_t eos) {
  const bool qwen = m.qk_norm, mistral = !qwen && m.windowed();
  nlohmann::ordered_json j;
  j["architectures"] = {qwen ? "Qwen3ForCausalLM" : mistral ? "MistralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen ? "qwen3" : mistral ? "mistral" : "llama";
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.ffn_hidden();
  j["num_hidden_layers"] = m.layers;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.kv_heads();
  j["head_dim"] = m.head_dim();
  j["hidden_act"] = "silu";
  // The context the model was trained at; an import of a longer one says so in its deck.
  j["max_position_embeddings"] = m.seq_len;
  j["initializer_range"] = 0.02;
  j["rms_norm_eps"] = m.norm.eps;
  j["use_cache"] = true;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["rope_theta"] = m.rope.theta;
  j["rope_scaling"] = hf_rope_scaling_json(m.rope);
  j["attention_bias"] = m.linear_bias;
  j["attention_dropout"] = 0.0;  // meshtrain trains without dropout
  if (qwen || mistral) {
    hf_write_windows(m, j);
  } else if (m.feed_forward == FeedForwardKind::Dense) {
    j["mlp_bias"] = m.linear_bias;
    j["pretraining_tp"] = 1;
  }
  if (m.feed_forward == FeedForwardKind::Moe) hf_moe_write_config(m, j);
  j["bos_token_id"] = bos >= 0 ? nlohmann::ordered_json(bos) : nlohmann::ordered_json(nullptr);
  j["eos_token_id"] = eos >= 0 ? nlohmann::ordered_json(eos) : nlohmann::ordered_json(nullptr);
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

namespace {

// Whether the spec field `key` changes the rotary angles under `scaling` (every field that is
// not a rope_* one does).
bool rope_field_used(const std::string& key, RopeScalingKind scaling) {
  if (key.rfind("rope_", 0) != 0 || key == "rope_theta" || key == "rope_scaling") return true;
  const bool shared = key == "rope_factor" || key == "rope_original_max_positions";
  const bool llama3_only = key == "rope_low_freq_factor" || key == "rope_high_freq_factor";
  switch (scaling) {
    case RopeScalingKind::None:
      return false;
    case RopeScalingKind::Llama3:
      return shared || llama3_only;
    case RopeScalingKind::Yarn:
      return !llama3_only;
  }
  return true;
}

}  // namespace

void hf_check_llama_deck(const HfConfigReader& c, const ModelSpec& hf, int64_t max_positions, const ModelSpec& m,
                      const std::string& deck_path) {
  const std::string& path = c.path();
  const std::string deck = deck_path + " (with its --set overrides)";
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
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string& key = mine[i].key;
    // A scaling's settings mean nothing without that scaling; the dense feed-forward's width
    // nothing in a mixture without dense blocks (Mixtral's intermediate_size is its experts').
    const bool unused =
        !rope_field_used(key, hf.rope.scaling) ||
        (key == "ffn_hidden" && hf.feed_forward == FeedForwardKind::Moe &&
         m.feed_forward == FeedForwardKind::Moe && hf.moe.first_dense_layers == 0 &&
         m.moe.first_dense_layers == 0);
    // The balancing losses' coefficients are the fine-tune's choice: they change training, not
    // the function the weights compute.
    const bool training_only = key == "moe_aux_loss" || key == "moe_z_loss" || key == "mtp_loss_weight";
    // A dense model's moe_* fields mean nothing (a mixture on one side only differs in
    // feed_forward, compared before them).
    const bool dense_only = key.rfind("moe_", 0) == 0 && hf.feed_forward == FeedForwardKind::Dense;
    // Fewer multi-token prediction depths than the directory holds: the main model is the same
    // (the deck leaves the others out, and import does not read them).
    const bool fewer_depths = key == "mtp_layers" && m.mtp_layers < hf.mtp_layers;
    if (key != "family" && !unused && !training_only && !dense_only && !fewer_depths)
      fields.push_back({key, mine[i].value, theirs[i].value});
  }
  for (const SpecField& f : fields)
    if (f.value != f.gpt2_value)
      hf_refuse(path + ": " + hf_llama_config_key(f.key, hf) + " gives model." + f.key +
                " = " + f.gpt2_value + ", but " + deck + " has model." + f.key + " = " +
                f.value + ": another model (set model." + f.key + " = " + f.gpt2_value +
                " to import it)");
  if (m.seq_len > max_positions)
    hf_refuse(path + ": max_position_embeddings = " + std::to_string(max_positions) + ", but " +
              deck + " has model.seq_len = " + std::to_string(m.seq_len) +
              ", longer than the model was made for (set model.seq_len <= " +
              std::to_string(max_positions) + ")");
  hf_check_sliding_window(c, m.seq_len, deck_path);
}

namespace {

// A deck built from config.json trains at most this many positions unless --set
// model.seq_len says otherwise: Llama 3.1's 131072 would ask for activations no fine-tune on a
// few GPUs holds, and 2048 is the context most fine-tuning recipes use.
constexpr int64_t kDefaultSeqLen = 2048;

ModelSpec llama_read_config(const HfConfigReader& c, int64_t& max_positions) {
  ModelSpec hf = hf_llama_spec(c, 0, max_positions);
  hf.seq_len = std::min(max_positions, kDefaultSeqLen);
  // Mixtral attends within its sliding window: the deck built for it trains no longer.
  if (const std::optional<int64_t> w = json_int64(json_value_or(c.config(), "sliding_window", nullptr));
      json_value_or(c.config(), "model_type", "") == "mixtral" && w)
    hf.seq_len = std::max<int64_t>(1, std::min(hf.seq_len, *w));
  return hf;
}

// Older transformers saved each layer's rotary inverse frequencies: a constant of rope_theta.
bool llama_is_buffer(const std::string& name) { return name.find(".rotary_emb.inv_freq") != std::string::npos; }

std::string llama_stored_name(const std::string& name) { return name; }

// The checkpoint's model read as a deck's [model] would be (the same ranges and checks: the file
// may come from anyone); hf_llama_architecture then refuses what the classes cannot express.
ModelSpec llama_recorded_model(const RecordedModel& r) {
  try {
    return r.read_as_deck();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(e.what()) + "\n(" + r.path + ": the 'model' attribute is malformed)");
  }
}

std::string llama_config_json(const ModelSpec& m, const HfExportOptions& o) {
  return hf_llama_config_json(m, o.torch_dtype, o.bos, o.eos);
}

}  // namespace

const HfFormat& hf_llama_format() {
  static const HfFormat format = {
      llama_read_config,
      hf_check_llama_deck,
      hf_llama_tensors,
      "model.embed_tokens.weight",
      llama_stored_name,
      llama_is_buffer,
      llama_recorded_model,
      hf_llama_architecture,
      llama_config_json,
      "wte, h.<i>.{ln_1,attn,ln_2,mlp}, ln_f and an untied lm_head.weight, a mixture's h.<i>.mlp.{router,experts}",
      nullptr,
      nullptr,  // no state: Mixtral's and Qwen3-MoE's routers are softmax
  };
  return format;
}

}  // namespace meshtrain
