#include "meshtrain/families/deepseek_v3/hf_deepseek_v3.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <stdexcept>

#include "meshtrain/families/llama/hf_llama.h"
#include "meshtrain/families/moe/hf_moe.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

using nlohmann::json;

namespace {

// DeepseekV3ForCausalLM's tensors, in the order of its modules. A model has q_a, q_a_norm and
// q_b (q_lora_rank > 0) or q.
constexpr HfNameRule kDeepseekV3Names[] = {
    {"wte", "model.embed_tokens.weight", HfTransform::Same},
    {"h.{}.attn.q_a.weight", "model.layers.{}.self_attn.q_a_proj.weight", HfTransform::Same},
    {"h.{}.attn.q_a_norm.weight", "model.layers.{}.self_attn.q_a_layernorm.weight", HfTransform::Same},
    {"h.{}.attn.q_b.weight", "model.layers.{}.self_attn.q_b_proj.weight", HfTransform::Same},
    {"h.{}.attn.q.weight", "model.layers.{}.self_attn.q_proj.weight", HfTransform::Same},
    {"h.{}.attn.kv_a.weight", "model.layers.{}.self_attn.kv_a_proj_with_mqa.weight", HfTransform::Same},
    {"h.{}.attn.kv_a_norm.weight", "model.layers.{}.self_attn.kv_a_layernorm.weight", HfTransform::Same},
    {"h.{}.attn.kv_b.weight", "model.layers.{}.self_attn.kv_b_proj.weight", HfTransform::Same},
    {"h.{}.attn.proj.weight", "model.layers.{}.self_attn.o_proj.weight", HfTransform::Same},
    {"h.{}.mlp.gate.weight", "model.layers.{}.mlp.gate_proj.weight", HfTransform::Same},
    {"h.{}.mlp.up.weight", "model.layers.{}.mlp.up_proj.weight", HfTransform::Same},
    {"h.{}.mlp.down.weight", "model.layers.{}.mlp.down_proj.weight", HfTransform::Same},
    {"h.{}.mlp.shared.gate.weight", "model.layers.{}.mlp.shared_experts.gate_proj.weight", HfTransform::Same},
    {"h.{}.mlp.shared.up.weight", "model.layers.{}.mlp.shared_experts.up_proj.weight", HfTransform::Same},
    {"h.{}.mlp.shared.down.weight", "model.layers.{}.mlp.shared_experts.down_proj.weight", HfTransform::Same},
    {"h.{}.ln_1.weight", "model.layers.{}.input_layernorm.weight", HfTransform::Same},
    {"h.{}.ln_2.weight", "model.layers.{}.post_attention_layernorm.weight", HfTransform::Same},
    {"ln_f.weight", "model.norm.weight", HfTransform::Same},
    {"lm_head.weight", "lm_head.weight", HfTransform::Same},
};

// Refuses config.json's `key` unless it is `accepted` (absent: transformers' default, accepted).
void require_value(const HfConfigReader& c, const char* key, const json& accepted, const std::string& why) {
  const json value = json_value_or(c.config(), key, accepted);
  if (value != accepted) c.refuse(key, value, "meshtrain accepts " + accepted.dump() + ": " + why);
}

void refuse_unsupported(const HfConfigReader& c) {
  require_value(c, "scoring_func", "sigmoid", "DeepSeek-V3's sigmoid router");
  require_value(c, "topk_method", "noaux_tc", "DeepSeek-V3's group-limited choice with the balancing bias");
  require_value(c, "moe_layer_freq", 1, "every block after the first_k_dense_replace is a mixture");
  require_value(c, "hidden_act", "silu", "SwiGLU");
  require_value(c, "attention_bias", false, "the latent attention's projections are bias-free");
  const json interleave = json_value_or(c.config(), "rope_interleave", true);
  if (!interleave.is_boolean()) c.refuse("rope_interleave", interleave, "expected true or false");
}

}  // namespace

ModelSpec hf_deepseek_v3_spec(const HfConfigReader& c, int64_t& max_positions) {
  const json& j = c.config();
  refuse_unsupported(c);
  ModelSpec m;
  m.layers = static_cast<int>(c.deck_integer("num_hidden_layers", 61, "model.layers"));
  m.d_model = c.deck_integer("hidden_size", 7168, "model.d_model");
  m.heads = c.deck_integer("num_attention_heads", 128, "model.heads");
  m.vocab_size = c.deck_integer("vocab_size", 129280, "model.vocab_size");
  ModelSpec spec = family_defaults("deepseek_v3", m);
  const int64_t kv_heads = c.deck_integer("num_key_value_heads", spec.heads, "model.kv_heads");
  if (kv_heads != spec.heads)
    c.refuse("num_key_value_heads", kv_heads, "meshtrain accepts num_attention_heads = " +
             std::to_string(spec.heads) + ": latent attention expands keys and values per head");
  max_positions = c.deck_integer("max_position_embeddings", 4096, "model.seq_len");
  spec.seq_len = std::min<int64_t>(max_positions, 2048);
  spec.norm.eps = c.number(j, "rms_norm_eps", 1e-6);
  spec.tie_embeddings = c.boolean("tie_word_embeddings", false);
  spec.ffn_hidden_set = c.deck_integer("intermediate_size", 18432, "model.ffn_hidden");
  // null: queries straight from the block's input (DeepSeek-V2-Lite); absent: transformers' 1536.
  const bool direct_query = j.contains("q_lora_rank") && j["q_lora_rank"].is_null();
  spec.latent.q_lora_rank = direct_query ? 0 : c.deck_integer("q_lora_rank", 1536, "model.q_lora_rank");
  spec.latent.kv_lora_rank = c.deck_integer("kv_lora_rank", 512, "model.kv_lora_rank");
  spec.latent.qk_nope_dim = c.deck_integer("qk_nope_head_dim", 128, "model.qk_nope_head_dim");
  spec.latent.qk_rope_dim = c.deck_integer("qk_rope_head_dim", 64, "model.qk_rope_head_dim");
  spec.latent.v_head_dim = c.deck_integer("v_head_dim", 128, "model.v_head_dim");
  hf_read_rope(c, 10000.0, max_positions, spec.rope);
  spec.moe.experts = c.deck_integer("n_routed_experts", 256, "model.moe_experts");
  spec.moe.top_k = c.deck_integer("num_experts_per_tok", 8, "model.moe_top_k");
  spec.moe.ffn_hidden_set = c.deck_integer("moe_intermediate_size", 2048, "model.moe_ffn_hidden");
  spec.moe.shared_ffn_hidden = c.deck_integer("n_shared_experts", 1, "model.moe_shared_ffn_hidden") * spec.moe_ffn_hidden();
  spec.moe.route_scale = c.number(j, "routed_scaling_factor", 2.5);
  spec.moe.groups = c.deck_integer("n_group", 8, "model.moe_groups");
  spec.moe.top_groups = c.deck_integer("topk_group", 4, "model.moe_top_groups");
  spec.moe.normalize_top_k = c.boolean("norm_topk_prob", true);
  spec.moe.first_dense_layers =
      static_cast<int>(c.deck_integer("first_k_dense_replace", 3, "model.moe_first_dense_layers"));
  // Absent: none (transformers' default of 1 describes layers DeepseekV3ForCausalLM never saves).
  spec.mtp_layers = static_cast<int>(c.deck_integer("num_nextn_predict_layers", 0, "model.mtp_layers"));
  return spec;
}

namespace {

// Multi-token prediction depth k (model/mtp_module.h) as DeepSeek's checkpoints hold it, at layer
// index num_hidden_layers + k: its norms and projection, its block under the main blocks' names,
// and copies of the shared embedding and head (embed_tokens, shared_head.head), which meshtrain
// shares with the main model and so writes but never reads (deepseek_v3_is_buffer). `text` owns
// the names the rules point to.
void add_mtp_rules(const ModelSpec& m, std::vector<HfNameRule>& rules, std::deque<std::string>& text) {
  const std::vector<HfNameRule> block(rules.begin(), rules.end());
  const auto rule = [&](std::string meshtrain, std::string hf, HfTransform how) {
    text.push_back(std::move(meshtrain));
    const char* mine = text.back().c_str();
    text.push_back(std::move(hf));
    rules.push_back({mine, text.back().c_str(), how});
  };
  for (int k = 0; k < m.mtp_layers; ++k) {
    const std::string mtp = "mtp." + std::to_string(k) + ".", hf = "model.layers." + std::to_string(m.layers + k) + ".";
    rule(mtp + "enorm.weight", hf + "enorm.weight", HfTransform::Same);
    rule(mtp + "hnorm.weight", hf + "hnorm.weight", HfTransform::Same);
    rule(mtp + "eh_proj.weight", hf + "eh_proj.weight", HfTransform::Same);
    rule("wte", hf + "embed_tokens.weight", HfTransform::Same);
    for (const HfNameRule& r : block) {
      const std::string name = r.meshtrain;
      if (name.rfind("h.{}.", 0) != 0) continue;
      std::string theirs = r.hf;
      theirs.replace(theirs.find("model.layers.{}."), 16, hf);
      rule(mtp + "block." + name.substr(5), theirs, r.how);
    }
    rule(mtp + "norm.weight", hf + "shared_head.norm.weight", HfTransform::Same);
    rule(m.tie_embeddings ? "wte" : "lm_head.weight", hf + "shared_head.head.weight", HfTransform::Same);
  }
}

bool is_mtp_copy(const std::string& hf_name) {
  const auto ends = [&](const std::string& tail) {
    return hf_name.size() > tail.size() && hf_name.compare(hf_name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return hf_name.rfind("model.layers.", 0) == 0 && (ends(".embed_tokens.weight") || ends(".shared_head.head.weight"));
}

}  // namespace

std::vector<HfTensor> hf_deepseek_v3_tensors(const ModelSpec& m) {
  std::vector<HfNameRule> rules(std::begin(kDeepseekV3Names), std::end(kDeepseekV3Names));
  const std::vector<HfNameRule> moe = hf_qwen3_moe_name_rules();
  const auto at = std::find_if(rules.begin(), rules.end(), [](const HfNameRule& r) {
    return std::string(r.meshtrain) == "h.{}.mlp.shared.gate.weight";
  });
  rules.insert(at, moe.begin(), moe.end());
  std::deque<std::string> mtp_names;
  add_mtp_rules(m, rules, mtp_names);
  std::vector<HfTensor> tensors = hf_tensors(m, rules.data(), rules.size(), "DeepseekV3ForCausalLM");
  // Each query head's rotary part follows its no-position part; the latent's rotary key
  // (one head for all) follows the kv_lora_rank latent.
  const LatentSpec& l = m.latent;
  const HfRopeRows query = {l.qk_head_dim(), l.qk_nope_dim, l.qk_rope_dim};
  set_hf_rope_rows(tensors, "self_attn.q_b_proj.weight", query);
  set_hf_rope_rows(tensors, "self_attn.q_proj.weight", query);
  set_hf_rope_rows(tensors, "self_attn.kv_a_proj_with_mqa.weight",
                   {l.kv_lora_rank + l.qk_rope_dim, l.kv_lora_rank, l.qk_rope_dim});
  return tensors;
}

namespace {

std::string deepseek_v3_architecture(const ModelSpec& m, const std::string& where) {
  auto refuse = [&](const std::string& field, const std::string& value, const std::string& accepted) {
    throw std::runtime_error(terminal_safe(where + ": model." + field + " = " + value +
                                           ": DeepseekV3ForCausalLM has " + accepted));
  };
  if (!m.latent_attention()) refuse("attention", "\"standard\"", "latent attention only");
  if (m.feed_forward != FeedForwardKind::Moe) refuse("feed_forward", "\"dense\"", "a mixture of experts");
  if (m.moe.router != RouterKind::Sigmoid)
    refuse("moe_router", "\"" + std::string(router_name(m.moe.router)) + "\"", "the sigmoid router only");
  if (m.norm.kind != NormKind::Rms) refuse("norm", "LayerNorm", "RMSNorm only");
  if (m.activation != ActivationKind::SwiGlu) refuse("activation", "not SwiGLU", "SwiGLU only");
  if (m.linear_bias) refuse("bias", "true", "no biases");
  if (m.moe.shared_ffn_hidden % m.moe_ffn_hidden() != 0)
    refuse("moe_shared_ffn_hidden", std::to_string(m.moe.shared_ffn_hidden),
           "n_shared_experts experts of moe_intermediate_size = " + std::to_string(m.moe_ffn_hidden()));
  return "DeepseekV3ForCausalLM";
}

// DeepSeek's own checkpoints (rope_interleave true or absent) store the rotary rows in pairs;
// a model saved with rope_interleave false stores them in halves already, as meshtrain does.
// The copies of the embedding and head in the multi-token layers are not read: meshtrain shares
// the main ones.
std::vector<HfTensor> deepseek_v3_stored_tensors(const HfConfigReader& c, const ModelSpec& m) {
  std::vector<HfTensor> tensors = hf_deepseek_v3_tensors(m);
  std::erase_if(tensors, [](const HfTensor& t) { return is_mtp_copy(t.hf); });
  if (json_value_or(c.config(), "rope_interleave", true) == false)
    for (HfTensor& t : tensors) t.rope_rows = {};
  return tensors;
}

bool deepseek_v3_is_buffer(const std::string& name) {
  return hf_llama_format().is_buffer(name) || is_mtp_copy(name);
}

ModelSpec deepseek_v3_read_config(const HfConfigReader& c, int64_t& max_positions) {
  return hf_deepseek_v3_spec(c, max_positions);
}

// The router's balancing bias (DeepseekV3TopkRouter's buffer) is meshtrain's expert bias.
std::vector<HfTensor> deepseek_v3_state_tensors(const ModelSpec& m) {
  return hf_expert_bias_tensors(m, "model.layers.{}.mlp.gate.e_score_correction_bias");
}

}  // namespace

std::string hf_deepseek_v3_config_json(const ModelSpec& m, const HfExportOptions& o) {
  const LatentSpec& l = m.latent;
  nlohmann::ordered_json j;
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  j["model_type"] = "deepseek_v3";
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.ffn_hidden();
  j["moe_intermediate_size"] = m.moe_ffn_hidden();
  j["num_hidden_layers"] = m.layers;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.heads;
  j["n_shared_experts"] = m.moe.shared_ffn_hidden / m.moe_ffn_hidden();
  j["n_routed_experts"] = m.moe.experts;
  j["routed_scaling_factor"] = m.moe.route_scale;
  j["kv_lora_rank"] = l.kv_lora_rank;
  j["q_lora_rank"] = l.q_lora_rank > 0 ? nlohmann::ordered_json(l.q_lora_rank) : nlohmann::ordered_json(nullptr);
  j["qk_rope_head_dim"] = l.qk_rope_dim;
  j["v_head_dim"] = l.v_head_dim;
  j["qk_nope_head_dim"] = l.qk_nope_dim;
  j["n_group"] = m.moe.groups;
  j["topk_group"] = m.moe.top_groups;
  j["num_experts_per_tok"] = m.moe.top_k;
  j["first_k_dense_replace"] = m.moe.first_dense_layers;
  j["norm_topk_prob"] = m.moe.normalize_top_k;
  j["topk_method"] = "noaux_tc";
  j["scoring_func"] = "sigmoid";
  j["moe_layer_freq"] = 1;
  j["num_nextn_predict_layers"] = m.mtp_layers;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.seq_len;
  j["initializer_range"] = 0.02;
  j["rms_norm_eps"] = m.norm.eps;
  j["use_cache"] = true;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["rope_theta"] = m.rope.theta;
  j["rope_scaling"] = hf_rope_scaling_json(m.rope);
  j["rope_interleave"] = true;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = o.bos >= 0 ? nlohmann::ordered_json(o.bos) : nlohmann::ordered_json(nullptr);
  j["eos_token_id"] = o.eos >= 0 ? nlohmann::ordered_json(o.eos) : nlohmann::ordered_json(nullptr);
  j["torch_dtype"] = o.torch_dtype;
  return j.dump(2) + "\n";
}

const HfFormat& hf_deepseek_v3_format() {
  // The stored names, old rotary buffers and a checkpoint's recorded model are read as Llama's.
  const HfFormat& llama = hf_llama_format();
  static const HfFormat format = {
      deepseek_v3_read_config,
      hf_check_llama_deck,
      hf_deepseek_v3_tensors,
      "model.embed_tokens.weight",
      llama.stored_name,
      deepseek_v3_is_buffer,
      llama.recorded_model,
      deepseek_v3_architecture,
      hf_deepseek_v3_config_json,
      "wte, h.<i>.{ln_1,attn.{q_a,q_a_norm,q_b,q,kv_a,kv_a_norm,kv_b,proj},ln_2,mlp}, ln_f, an untied "
      "lm_head.weight, mtp.<k>.{enorm,hnorm,eh_proj,block,norm}, and the buffers "
      "h.<i>.mlp.router.expert_bias",
      deepseek_v3_stored_tensors,
      deepseek_v3_state_tensors,
  };
  return format;
}

}  // namespace meshtrain
