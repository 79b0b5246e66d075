#include "meshtrain/families/moe/hf_moe.h"

#include <iterator>
#include <sstream>
#include <stdexcept>

#include "meshtrain/model/expert_bias.h"

namespace meshtrain {

using nlohmann::json;

namespace {

// MixtralSparseMoeBlock's tensors: w1 is the gated (SiLU) projection, w3 the one it multiplies,
// w2 the way back (Mistral's naming, kept by transformers).
constexpr HfNameRule kMixtralNames[] = {
    {"h.{}.mlp.router.weight", "model.layers.{}.block_sparse_moe.gate.weight", HfTransform::Same},
    {"h.{}.mlp.experts.gate.weight", "model.layers.{}.block_sparse_moe.experts.{e}.w1.weight",
     HfTransform::PerExpert},
    {"h.{}.mlp.experts.up.weight", "model.layers.{}.block_sparse_moe.experts.{e}.w3.weight",
     HfTransform::PerExpert},
    {"h.{}.mlp.experts.down.weight", "model.layers.{}.block_sparse_moe.experts.{e}.w2.weight",
     HfTransform::PerExpert},
};

// Qwen3MoeSparseMoeBlock's: each expert a Qwen3MoeMLP.
constexpr HfNameRule kQwen3MoeNames[] = {
    {"h.{}.mlp.router.weight", "model.layers.{}.mlp.gate.weight", HfTransform::Same},
    {"h.{}.mlp.experts.gate.weight", "model.layers.{}.mlp.experts.{e}.gate_proj.weight",
     HfTransform::PerExpert},
    {"h.{}.mlp.experts.up.weight", "model.layers.{}.mlp.experts.{e}.up_proj.weight", HfTransform::PerExpert},
    {"h.{}.mlp.experts.down.weight", "model.layers.{}.mlp.experts.{e}.down_proj.weight",
     HfTransform::PerExpert},
};

int64_t moe_layers(const ModelSpec& m) { return m.layers - m.moe.first_dense_layers; }

}  // namespace

bool hf_moe_model_type(const std::string& model_type) {
  return model_type == "mixtral" || model_type == "qwen3_moe";
}

std::vector<HfNameRule> hf_qwen3_moe_name_rules() {
  return {std::begin(kQwen3MoeNames), std::end(kQwen3MoeNames)};
}

std::vector<HfTensor> hf_expert_bias_tensors(const ModelSpec& m, const char* hf_pattern) {
  const ExpertBias bias(m);
  std::vector<HfTensor> out;
  for (int layer : bias.layers()) {
    HfTensor t;
    t.meshtrain = bias.name_in_model(layer);  // a multi-token depth's block: mtp.<k>.block…
    t.meshtrain_shape = t.hf_shape = {bias.experts()};
    t.hf = hf_fill_name(hf_pattern, std::to_string(layer));
    t.state = true;
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<HfNameRule> hf_moe_name_rules(const ModelSpec& m) {
  if (m.feed_forward != FeedForwardKind::Moe) return {};
  if (m.qk_norm) return hf_qwen3_moe_name_rules();
  return {std::begin(kMixtralNames), std::end(kMixtralNames)};
}

double hf_moe_aux_loss(double router_aux_loss_coef, const ModelSpec& m) {
  return router_aux_loss_coef * static_cast<double>(m.moe.top_k) / static_cast<double>(moe_layers(m));
}

double hf_router_aux_loss_coef(const ModelSpec& m) {
  return m.moe.aux_loss * static_cast<double>(moe_layers(m)) / static_cast<double>(m.moe.top_k);
}

void hf_moe_read_config(const HfConfigReader& c, const std::string& model_type, ModelSpec& m) {
  const json& j = c.config();
  const bool mixtral = model_type == "mixtral";
  m.feed_forward = FeedForwardKind::Moe;
  // Qwen3-MoE's expert count is num_experts in transformers 4 and num_local_experts in
  // transformers 5 (whose attribute map still reads the old name): either is read, and where a
  // file has both they must agree.
  const bool legacy_qwen_count = !mixtral && j.contains("num_experts");
  const char* experts_key = legacy_qwen_count ? "num_experts" : "num_local_experts";
  m.moe.experts = c.deck_integer(experts_key, mixtral ? 8 : 128, "model.moe_experts");
  if (legacy_qwen_count && j.contains("num_local_experts") &&
      c.deck_integer("num_local_experts", m.moe.experts, "model.moe_experts") != m.moe.experts)
    c.refuse("num_local_experts", j["num_local_experts"],
             "transformers 5's name for num_experts = " + std::to_string(m.moe.experts) +
                 ", which this file also sets: accepted only the same count");
  m.moe.top_k = c.deck_integer("num_experts_per_tok", mixtral ? 2 : 8, "model.moe_top_k");
  if (m.moe.top_k > m.moe.experts)
    c.refuse("num_experts_per_tok", m.moe.top_k,
             std::string("each token chooses among ") + experts_key + " = " + std::to_string(m.moe.experts) +
                 " experts: accepted 1 to " + std::to_string(m.moe.experts));
  if (mixtral) {
    // Mixtral's intermediate_size is its experts' width; it has no dense feed-forward.
    m.moe.ffn_hidden_set = m.ffn_hidden();
    m.ffn_hidden_set = 0;
    m.moe.normalize_top_k = true;
  } else {
    m.moe.ffn_hidden_set = c.deck_integer("moe_intermediate_size", 768, "model.moe_ffn_hidden");
    m.moe.normalize_top_k = c.boolean("norm_topk_prob", false);
    if (const json step = json_value_or(j, "decoder_sparse_step", 1); step != json(1))
      c.refuse("decoder_sparse_step", step,
               "a mixture every decoder_sparse_step-th block; meshtrain's mixtures fill every block "
               "after the first moe_first_dense_layers: accepted 1");
    const json only = json_value_or(j, "mlp_only_layers", json::array());
    bool prefix = only.is_array();
    for (size_t i = 0; prefix && i < only.size(); ++i) prefix = only[i] == json(i);
    if (!prefix || static_cast<int64_t>(only.size()) >= m.layers)
      c.refuse("mlp_only_layers", only,
               "meshtrain's dense blocks are the first k (moe_first_dense_layers = k): accepted [] or "
               "[0, 1, ..., k-1] with k below num_hidden_layers = " +
                   std::to_string(m.layers));
    m.moe.first_dense_layers = static_cast<int>(only.size());
    if (const json shared = json_value_or(j, "shared_expert_intermediate_size", 0); shared != json(0))
      c.refuse("shared_expert_intermediate_size", shared,
               "Qwen3MoeForCausalLM has no shared expert, and its modules do not load one: accepted 0 "
               "or absent");
  }
  m.moe.aux_loss = hf_moe_aux_loss(c.number(j, "router_aux_loss_coef", 0.001, "", true), m);
  m.moe.z_loss = 0.0;  // neither has a z-loss
}

void hf_check_sliding_window(const HfConfigReader& c, int64_t seq_len, const std::string& deck) {
  if (json_value_or(c.config(), "model_type", "") != json("mixtral")) return;
  const json w = json_value_or(c.config(), "sliding_window", nullptr);
  if (w.is_null()) return;
  // A window beyond int64 is wider than any sequence: no window.
  if (w.is_number_unsigned() && !json_int64(w)) return;
  const std::optional<int64_t> window = json_int64(w);
  if (!window || *window < seq_len)
    c.refuse("sliding_window", w,
             "Mixtral then attends to the last sliding_window positions only, and meshtrain to the "
             "whole causal window: accepted null or an integer >= " +
                 deck + "'s model.seq_len = " + std::to_string(seq_len) +
                 (window && *window >= 1 ? "; set model.seq_len <= " + w.dump() + " to import it" : ""));
}

std::string hf_moe_architecture(const ModelSpec& m, const std::string& where) {
  const std::string hf = m.qk_norm ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM";
  auto refuse = [&](const std::string& key, const std::string& value, const std::string& why) {
    throw std::runtime_error(where + ": model." + key + " = " + value + ", which Hugging Face " + hf +
                             " cannot express (" + why +
                             "): export refuses rather than write a model that computes another function");
  };
  if (m.moe.shared_ffn_hidden > 0)
    refuse("moe_shared_ffn_hidden", std::to_string(m.moe.shared_ffn_hidden), "it has no shared expert");
  if (m.moe.router != RouterKind::Softmax)
    refuse("moe_router", "\"" + std::string(router_name(m.moe.router)) + "\"",
           "its router is a softmax, with no expert bias");
  if (m.moe.capacity_factor != 0) {
    std::ostringstream v;
    v << m.moe.capacity_factor;
    refuse("moe_capacity_factor", v.str(), "it is dropless: every token reaches its experts");
  }
  if (m.moe.route_scale != 1.0) {
    std::ostringstream v;
    v << m.moe.route_scale;
    refuse("moe_route_scale", v.str(), "its gates are not scaled");
  }
  if (!m.qk_norm && !m.moe.normalize_top_k)
    refuse("moe_normalize_top_k", "false",
           "it always renormalises the chosen gates; Qwen3MoeForCausalLM, model.qk_norm = true, need not");
  if (!m.qk_norm && m.moe.first_dense_layers > 0)
    refuse(
        "moe_first_dense_layers", std::to_string(m.moe.first_dense_layers),
        "every block of it is a mixture; Qwen3MoeForCausalLM, model.qk_norm = true, has dense first blocks");
  return hf;
}

void hf_moe_write_config(const ModelSpec& m, nlohmann::ordered_json& j) {
  const bool qwen = m.qk_norm;
  j["architectures"] = {qwen ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM"};
  j["model_type"] = qwen ? "qwen3_moe" : "mixtral";
  if (qwen) {
    j["num_experts"] = m.moe.experts;
    j["moe_intermediate_size"] = m.moe_ffn_hidden();
    j["norm_topk_prob"] = m.moe.normalize_top_k;
    j["decoder_sparse_step"] = 1;
    nlohmann::ordered_json dense = nlohmann::ordered_json::array();
    for (int i = 0; i < m.moe.first_dense_layers; ++i) dense.push_back(i);
    j["mlp_only_layers"] = dense;
  } else {
    j["intermediate_size"] = m.moe_ffn_hidden();  // the experts' width: Mixtral has no dense MLP
    j["num_local_experts"] = m.moe.experts;
    j["sliding_window"] = nullptr;
    j["router_jitter_noise"] = 0.0;
  }
  j["num_experts_per_tok"] = m.moe.top_k;
  j["router_aux_loss_coef"] = hf_router_aux_loss_coef(m);
  j["output_router_logits"] = false;
}

std::string hf_moe_config_key(const std::string& field, const ModelSpec& m) {
  const bool qwen = m.qk_norm;
  if (field == "feed_forward") return "model_type";
  if (field == "moe_experts") return qwen ? "num_experts" : "num_local_experts";
  if (field == "moe_top_k") return "num_experts_per_tok";
  if (field == "moe_ffn_hidden") return qwen ? "moe_intermediate_size" : "intermediate_size";
  if (field == "moe_normalize_top_k") return qwen ? "norm_topk_prob" : "model_type";
  if (field == "moe_first_dense_layers") return qwen ? "mlp_only_layers" : "model_type";
  if (field == "moe_shared_ffn_hidden") return "shared_expert_intermediate_size";
  if (field == "moe_aux_loss") return "router_aux_loss_coef";
  return "";
}

}  // namespace meshtrain
