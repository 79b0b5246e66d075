#include "meshtrain/app/hf_llama.h"

#include <cctype>
#include <filesystem>
#include <iterator>
#include <stdexcept>

#include "meshtrain/app/hf_directory.h"

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
    {"activation", "hidden_act"},
    {"bias", "attention_bias"},
    {"qk_norm", "model_type"},
    {"kv_heads", "num_key_value_heads"},
    {"head_dim", "head_dim"},
    {"ffn_hidden", "intermediate_size"},
};

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::vector<HfTensor> hf_llama_tensors(const ModelSpec& m) {
  return hf_tensors(m, kLlamaNames, std::size(kLlamaNames), m.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
}

std::string hf_llama_config_key(const std::string& field) {
  for (const auto& k : kConfigKeys)
    if (field == k[0]) return k[1];
  return field;
}

ModelSpec hf_llama_spec(const json& j, const std::string& path, int64_t seq_len, int64_t& max_positions) {
  const json type = json_value_or(j, "model_type", "(absent)");
  if (type != "llama" && type != "qwen3")
    throw std::runtime_error(path + ": model_type = " + type.dump() +
                             " (meshtrain imports \"gpt2\", \"llama\" and \"qwen3\")");
  const bool qwen = type == "qwen3";
  const std::string family = type.get<std::string>();
  auto refuse = [&](const std::string& key, const json& v, const std::string& accepted) {
    throw std::runtime_error(path + ": " + key + " = " + v.dump() + " (" + accepted + ")");
  };
  auto integer = [&](const json& obj, const char* key, int64_t fallback, int64_t min,
                     const std::string& prefix = "") {
    const json v = json_value_or(obj, key, fallback);
    if (!v.is_number_integer() || v.get<int64_t>() < min)
      refuse(prefix + key, v, "expected an integer >= " + std::to_string(min));
    return v.get<int64_t>();
  };
  auto number = [&](const json& obj, const char* key, double fallback, const std::string& prefix = "") {
    const json v = json_value_or(obj, key, fallback);
    if (!v.is_number() || !(v.get<double>() > 0)) refuse(prefix + key, v, "expected a number > 0");
    return v.get<double>();
  };
  auto boolean = [&](const char* key) {
    const json v = json_value_or(j, key, false);
    if (!v.is_boolean()) refuse(key, v, "expected true or false");
    return v.get<bool>();
  };
  ModelSpec sizes;
  sizes.layers = static_cast<int>(integer(j, "num_hidden_layers", 32, 1));
  sizes.d_model = integer(j, "hidden_size", 4096, 1);
  sizes.heads = integer(j, "num_attention_heads", 32, 1);
  sizes.vocab_size = integer(j, "vocab_size", qwen ? 151936 : 32000, 2);
  sizes.seq_len = seq_len;
  ModelSpec m = family_defaults(family, sizes);
  // 0 stands for "derived" in the spec: kept where the config says the derived value.
  if (const int64_t kv = integer(j, "num_key_value_heads", m.heads, 1); kv != m.heads) m.kv_heads_set = kv;
  const int64_t head_dim = integer(j, "head_dim", qwen ? 128 : m.d_model / m.heads, 1);
  if (head_dim != m.d_model / m.heads || m.d_model % m.heads != 0) m.head_dim_set = head_dim;
  if (const int64_t f = integer(j, "intermediate_size", qwen ? 22016 : 11008, 1); f != 4 * m.d_model)
    m.ffn_hidden_set = f;
  m.norm.eps = number(j, "rms_norm_eps", 1e-6);
  m.tie_embeddings = boolean("tie_word_embeddings");
  max_positions = integer(j, "max_position_embeddings", qwen ? 32768 : 2048, 1);
  const json act = json_value_or(j, "hidden_act", "silu");
  if (act != "silu") refuse("hidden_act", act, "meshtrain's SwiGLU gates with SiLU: accepted \"silu\"");

  // Biases: meshtrain's model.bias is a bias on every linear layer. Llama's attention_bias
  // covers q, k, v and o, mlp_bias gate, up and down; Qwen 3's MLP has none.
  const bool attention_bias = boolean("attention_bias"), mlp_bias = qwen ? false : boolean("mlp_bias");
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
  if (qwen && json_value_or(j, "use_sliding_window", false) != json(false))
    refuse("use_sliding_window", j["use_sliding_window"],
           "meshtrain attends over the whole causal window: accepted false");

  // Rotary: rope_theta and rope_scaling (transformers < 4.56), or both inside rope_parameters.
  const bool newer = j.contains("rope_parameters") && j["rope_parameters"].is_object();
  const json rope = newer ? j["rope_parameters"] : json_value_or(j, "rope_scaling", json::object());
  const std::string where = newer ? "rope_parameters." : "rope_scaling.";
  if (!rope.is_object()) refuse("rope_scaling", rope, "expected null or an object with rope_type");
  m.rope.theta = newer && rope.contains("rope_theta") ? number(rope, "rope_theta", 10000.0, where)
                                                      : number(j, "rope_theta", 10000.0);
  const json rope_type = json_value_or(rope, "rope_type", json_value_or(rope, "type", "default"));
  if (rope_type == "llama3") {
    m.rope.scaling = RopeScalingKind::Llama3;
    for (const char* key : {"factor", "original_max_position_embeddings"})
      if (!rope.contains(key))
        throw std::runtime_error(path + ": " + where + key + " is missing (rope_type \"llama3\" needs "
                                 "factor, low_freq_factor, high_freq_factor and "
                                 "original_max_position_embeddings)");
    m.rope.factor = number(rope, "factor", 8.0, where);
    m.rope.low_freq_factor = number(rope, "low_freq_factor", 1.0, where);
    m.rope.high_freq_factor = number(rope, "high_freq_factor", 4.0, where);
    m.rope.original_max_positions = integer(rope, "original_max_position_embeddings", 8192, 1, where);
  } else if (rope_type != "default") {
    refuse(where + "rope_type", rope_type,
           "meshtrain computes rotary positions without scaling (\"default\") or with Llama 3's "
           "(\"llama3\"); \"linear\", \"dynamic\", \"yarn\" and the others are not implemented");
  }
  return m;
}

std::string hf_llama_architecture(const ModelSpec& m, const std::string& where) {
  auto refuse = [&](const std::string& key, const std::string& value, const std::string& hf) {
    throw std::runtime_error(where + ": model." + key + " = " + value + ", which Hugging Face " + hf +
                             " cannot express: export refuses rather than write a model that "
                             "computes another function");
  };
  const std::string hf = m.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  if (m.norm.kind != NormKind::Rms) refuse("norm", norm_name(m.norm.kind), hf + " (RMSNorm)");
  if (m.positions != PositionKind::Rotary)
    refuse("positions", position_name(m.positions), hf + " (rotary positions)");
  if (m.activation != ActivationKind::SwiGlu)
    refuse("activation", activation_name(m.activation), hf + " (SwiGLU)");
  if (m.feed_forward != FeedForwardKind::Dense)
    refuse("feed_forward", feed_forward_name(m.feed_forward), hf + " (a dense MLP)");
  if (m.qk_norm && m.linear_bias)
    refuse("bias", "true", hf + " (its MLP has no bias; with model.qk_norm = true this is Qwen 3)");
  return hf;
}

std::string hf_llama_config_json(const ModelSpec& m, const std::string& torch_dtype, int64_t bos,
                                 int64_t eos) {
  const bool qwen = m.qk_norm;
  nlohmann::ordered_json j;
  j["architectures"] = {qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen ? "qwen3" : "llama";
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
  if (m.rope.scaling == RopeScalingKind::Llama3)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", m.rope.factor},
                         {"low_freq_factor", m.rope.low_freq_factor},
                         {"high_freq_factor", m.rope.high_freq_factor},
                         {"original_max_position_embeddings", m.rope.original_max_positions}};
  else
    j["rope_scaling"] = nullptr;
  j["attention_bias"] = m.linear_bias;
  j["attention_dropout"] = 0.0;  // meshtrain trains without dropout
  if (qwen) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = m.layers;
  } else {
    j["mlp_bias"] = m.linear_bias;
    j["pretraining_tp"] = 1;
  }
  j["bos_token_id"] = bos >= 0 ? nlohmann::ordered_json(bos) : nlohmann::ordered_json(nullptr);
  j["eos_token_id"] = eos >= 0 ? nlohmann::ordered_json(eos) : nlohmann::ordered_json(nullptr);
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

std::string hf_deck_text(const ModelSpec& m, const std::string& tokenizer, const std::string& source) {
  std::string name = std::filesystem::path(source).filename().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '-';
  std::string s =
      "# The Hugging Face model in " + source + ", as `meshtrain import --format hf --deck-out`\n"
      "# wrote it: [model] reproduces its config.json (the family's defaults are left out; see\n"
      "# `meshtrain keys`). It trains on the built-in corpus: for your own text, set data.train and\n"
      "# data.val to shards of `meshtrain prepare --tokenizer " + tokenizer + "`.\n"
      "# Fine-tune from the imported checkpoint: meshtrain train <this deck> --set "
      "checkpoint.resume='\"<OUT.h5>\"'\n\n"
      "[run]\nname = " + toml_string(name.empty() ? "hf" : name) + "\n\n"
      "[model]\n"
      "family = " + toml_string(m.family) + "\n"
      "layers = " + std::to_string(m.layers) + "\n"
      "d_model = " + std::to_string(m.d_model) + "\n"
      "heads = " + std::to_string(m.heads) + "\n"
      "seq_len = " + std::to_string(m.seq_len) + "\n"
      "vocab_size = " + std::to_string(m.vocab_size) + "\n"
      "tie_embeddings = " + (m.tie_embeddings ? "true" : "false") + "\n";
  const std::vector<SpecField> mine = spec_fields(m), family = spec_fields(family_defaults(m.family, m));
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i].key != "family" && mine[i].value != family[i].value) s += mine[i].key + " = " + mine[i].value + "\n";
  s += "\n[data]\ntrain = \"synthetic\"\nval = \"synthetic\"\ntokenizer = " + toml_string(tokenizer) +
       "\n\n"
       "# A fine-tune's learning rates: the weights already know their language.\n"
       "[train]\nlr = 3e-5\nmin_lr = 3e-6\nwarmup_steps = 20\n";
  return s;
}

}  // namespace meshtrain
