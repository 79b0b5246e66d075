// The [model] keys of the deck's schema (deck_schema.h): the architecture, model/model_spec.h;
// model.family's choices and defaults are the registry's (families/registry.h).

#include "deck_keys.h"
#include "meshtrain/config/config.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

using namespace deck_keys;

namespace {

// model.family's help: each registered family's summary of its defaults.
std::string family_help() {
  std::string s = "The model family, whose defaults the keys below override: ";
  for (const ModelFamily* f : model_registry()) s += std::string(f == model_registry().front() ? "" : "; ") + f->summary;
  return s + ".";
}

// YaRN's coefficients (HF rope_scaling's keys of the same names, model/model_spec.h: RopeSpec):
// finite numbers > 0 (above_zero) or >= 0, 0 standing for an absent key.
struct YarnKey {
  const char* key;
  const char* default_text;
  bool above_zero;
  double RopeSpec::*field;
  const char* doc;
};
constexpr YarnKey kYarnKeys[] = {
    {"rope_beta_fast", "32.0", true, &RopeSpec::beta_fast,
     "YaRN: pairs turning more often than this over the original context keep their frequency "
     "(HF beta_fast; must exceed rope_beta_slow)."},
    {"rope_beta_slow", "1.0", true, &RopeSpec::beta_slow,
     "YaRN: pairs turning less often than this are divided by rope_factor (HF beta_slow)."},
    {"rope_mscale", "0.0", false, &RopeSpec::mscale,
     "YaRN: HF mscale, the numerator's coefficient of the attention factor with "
     "rope_mscale_all_dim (0: absent)."},
    {"rope_mscale_all_dim", "0.0", false, &RopeSpec::mscale_all_dim,
     "YaRN: HF mscale_all_dim, the attention factor's denominator's coefficient, and DeepSeek's "
     "softmax factor (0: absent)."},
    {"rope_attention_factor", "0.0", false, &RopeSpec::attention_factor,
     "YaRN: the factor on cos and sin (HF attention_factor; 0: derived, 0.1 ln(rope_factor) + 1 "
     "without the mscales)."},
};

// Group-limited routing's two keys (model/moe_routing.h), both defaulting to 1: no groups.
struct GroupKey {
  const char* key;
  int64_t MoeSpec::*field;
  const char* doc;
};
constexpr GroupKey kGroupKeys[] = {
    {"moe_groups", &MoeSpec::groups,
     "Group-limited routing (DeepSeek-V3's noaux_tc; HF n_group): the experts in this many groups "
     "of consecutive indices, each scored by the sum of its two best scores plus biases; a token "
     "chooses its moe_top_k among the experts of the moe_top_groups best groups only. 1: no "
     "groups. Above 1 only with moe_router = \"sigmoid\" (V3: 8 groups of 32)."},
    {"moe_top_groups", &MoeSpec::top_groups,
     "The groups a token's experts may come from (HF topk_group; V3: 4 of 8); at most moe_groups, "
     "and enough for moe_top_k experts."},
};

// model.attention_window: an integer (every block) or an array (a pattern over the blocks),
// each a window from 0 (full attention) to 2^31 - 1, stored canonical (model_spec.h): a pattern
// of equal entries as one, none where every entry is 0.
std::string apply_attention_window(const toml::node& n, Config& c) {
  constexpr int64_t kLargest = INT32_MAX;
  std::vector<int64_t> pattern;
  if (n.is_integer()) {
    pattern.push_back(n.as_integer()->get());
  } else if (const toml::array* a = n.as_array()) {
    for (const toml::node& e : *a) {
      if (!e.is_integer()) return "holds " + toml_type_of(e);
      pattern.push_back(e.as_integer()->get());
    }
    if (pattern.empty()) return "is empty";
  } else {
    return "is " + toml_type_of(n);
  }
  for (int64_t w : pattern)
    if (w < 0 || w > kLargest) return "holds a window outside 0 to " + std::to_string(kLargest);
  if (std::all_of(pattern.begin(), pattern.end(), [&](int64_t w) { return w == pattern[0]; }))
    pattern.resize(1);
  if (pattern == std::vector<int64_t>{0}) pattern.clear();
  c.model.attention_window = pattern;
  return "";
}

}  // namespace

void add_model_keys(std::vector<KeySpec>& k) {
    // [model]
    k.push_back(int_key("model", "layers", 4, 1, 100000, "Transformer blocks.",
                        [](Config& c) -> auto& { return c.model.layers; }));
    k.push_back(int_key("model", "d_model", 128, 1, 1 << 20, "Channels (embedding width).",
                        [](Config& c) -> auto& { return c.model.d_model; }));
    k.push_back(int_key("model", "heads", 4, 1, 1 << 16, "Attention heads; divides d_model.",
                        [](Config& c) -> auto& { return c.model.heads; }));
    k.push_back(int_key("model", "seq_len", 128, 1, 1 << 20,
                        "Sequence length T (also the number of learned positions).",
                        [](Config& c) -> auto& { return c.model.seq_len; }));
    k.push_back(int_key("model", "vocab_size", 256, 2, 1 << 30,
                        "Vocabulary; every token of the data must be below it.",
                        [](Config& c) -> auto& { return c.model.vocab_size; }));
    k.push_back(bool_key("model", "tie_embeddings", true,
                         "LM head shares the token embedding (the family's default; GPT-2: true).",
                         [](Config& c, bool v) { c.model.tie_embeddings = v; }));
    // The architecture's variants (model/model_spec.h): model.family sets them all, and each
    // key below overrides one. Applied first, whatever its place in the deck (deck.cpp).
    k.push_back(choice_key("model", "family", "gpt2", model_families(), family_help(),
                           [](Config& c, const std::string& v) {
                             c.model = family_defaults(v, c.model);
                           }));
    k.push_back(choice_key("model", "norm", "layernorm",
                           {norm_name(NormKind::Layer), norm_name(NormKind::Rms)},
                           "The normalisation before attention, before the feed-forward and "
                           "before the head: \"layernorm\" (with a bias) or \"rmsnorm\" (Llama, "
                           "Qwen; no bias, computed in fp32 whatever the precision).",
                           [](Config& c, const std::string& v) { parse_norm(v, c.model.norm.kind); }));
    k.push_back(float_key("model", "norm_eps", "1e-5", 0.0, true,
                          "The norm's epsilon (HF layer_norm_epsilon / rms_norm_eps); LayerNorm's "
                          "kernels take 1e-5 only.",
                          [](Config& c, double v) { c.model.norm.eps = v; }));
    k.push_back(choice_key("model", "positions", "learned",
                           {position_name(PositionKind::Learned), position_name(PositionKind::Rotary)},
                           "How token positions enter: \"learned\", a (seq_len, d_model) table "
                           "added to the token embedding; \"rotary\", queries and keys rotated "
                           "by position (HF's rotate-half layout, rope_* keys; Llama, Qwen).",
                           [](Config& c, const std::string& v) { parse_position(v, c.model.positions); }));
    k.push_back(float_key("model", "rope_theta", "10000.0", 0.0, true,
                          "Rotary base (HF rope_theta; Llama 3: 500000).",
                          [](Config& c, double v) { c.model.rope.theta = v; }));
    k.push_back(choice_key("model", "rope_scaling", "none",
                           {rope_scaling_name(RopeScalingKind::None),
                            rope_scaling_name(RopeScalingKind::Llama3),
                            rope_scaling_name(RopeScalingKind::Yarn)},
                           "Rotary frequency scaling (HF rope_scaling.rope_type): \"llama3\" "
                           "stretches long wavelengths by rope_factor (Llama 3.1, 3.2); \"yarn\" "
                           "divides slow pairs' frequencies by rope_factor between rope_beta_fast "
                           "and rope_beta_slow turns and scales cos and sin (Qwen 3, DeepSeek-V3).",
                           [](Config& c, const std::string& v) {
                             parse_rope_scaling(v, c.model.rope.scaling);
                           }));
    k.push_back(float_key("model", "rope_factor", "8.0", 0.0, true,
                          "Llama 3 and YaRN scaling: how far long wavelengths stretch (Llama 3.1: 8, "
                          "3.2: 32; YaRN: the context's stretch, >= 1).",
                          [](Config& c, double v) { c.model.rope.factor = v; }));
    k.push_back(float_key("model", "rope_low_freq_factor", "1.0", 0.0, true,
                          "Llama 3 scaling: wavelengths beyond original / this are stretched.",
                          [](Config& c, double v) { c.model.rope.low_freq_factor = v; }));
    k.push_back(float_key("model", "rope_high_freq_factor", "4.0", 0.0, true,
                          "Llama 3 scaling: wavelengths below original / this are kept.",
                          [](Config& c, double v) { c.model.rope.high_freq_factor = v; }));
    k.push_back(int_key("model", "rope_original_max_positions", 8192, 1, 1 << 30,
                        "Llama 3 and YaRN scaling: the context it was trained at (HF "
                        "original_max_position_embeddings).",
                        [](Config& c) -> auto& { return c.model.rope.original_max_positions; }));
    for (const YarnKey& y : kYarnKeys)
      k.push_back(float_key("model", y.key, y.default_text, 0.0, y.above_zero, y.doc,
                            [field = y.field](Config& c, double v) { c.model.rope.*field = v; }));
    k.push_back(bool_key("model", "rope_truncate", true,
                         "YaRN: the ramp's ends rounded to whole pairs (HF truncate).",
                         [](Config& c, bool v) { c.model.rope.truncate = v; }));
    k.push_back(choice_key("model", "activation", "gelu_tanh",
                           {activation_name(ActivationKind::GeluTanh),
                            activation_name(ActivationKind::SwiGlu)},
                           "The feed-forward's activation: \"gelu_tanh\", GELU's tanh "
                           "approximation (HF \"gelu_new\") between two linears; \"swiglu\", "
                           "down(silu(gate(x)) * up(x)) (Llama, Qwen: HF \"silu\").",
                           [](Config& c, const std::string& v) {
                             parse_activation(v, c.model.activation);
                           }));
    k.push_back(choice_key("model", "feed_forward", "dense",
                           {feed_forward_name(FeedForwardKind::Dense), feed_forward_name(FeedForwardKind::Moe)},
                           "The feed-forward sub-layer of each block: \"dense\", one MLP; \"moe\", "
                           "a mixture of SwiGLU experts (the moe_* keys; docs/mixtures-of-experts.md).",
                           [](Config& c, const std::string& v) {
                             parse_feed_forward(v, c.model.feed_forward);
                           }));
    k.push_back(bool_key("model", "bias", true,
                         "Every linear layer adds a bias (the family's default; GPT-2: true).",
                         [](Config& c, bool v) { c.model.linear_bias = v; }));
    k.push_back(bool_key("model", "qk_norm", false,
                         "RMSNorm of each query and key head (weights of head_dim, eps norm_eps) "
                         "before the rotation: Qwen 3's q_norm and k_norm.",
                         [](Config& c, bool v) { c.model.qk_norm = v; }));
    k.push_back(int_key("model", "kv_heads", "heads", 1, 65536,
                        "Key/value heads (HF num_key_value_heads); divides heads. Below heads: "
                        "grouped-query attention, each key/value head shared by heads / kv_heads "
                        "query heads (1: multi-query).",
                        [](Config& c) -> auto& { return c.model.kv_heads_set; }));
    k.push_back(int_key("model", "head_dim", "d_model / heads", 1, 65536,
                        "Channels per attention head (HF head_dim); attention runs at heads x "
                        "head_dim channels, projected from and back to d_model.",
                        [](Config& c) -> auto& { return c.model.head_dim_set; }));
    k.push_back(int_key("model", "ffn_hidden", "4 x d_model", 1, 1 << 24,
                        "Width of the feed-forward's hidden layer (HF intermediate_size / n_inner).",
                        [](Config& c) -> auto& { return c.model.ffn_hidden_set; }));
    // The mixture of experts (feed_forward = "moe"; model/moe_layer.h).
    k.push_back(int_key("model", "moe_experts", 8, 1, 1 << 16,
                        "Experts of each mixture-of-experts layer (HF num_local_experts / num_experts).",
                        [](Config& c) -> auto& { return c.model.moe.experts; }));
    k.push_back(int_key("model", "moe_top_k", 2, 1, 1 << 16,
                        "Experts each token goes through (HF num_experts_per_tok); at most moe_experts.",
                        [](Config& c) -> auto& { return c.model.moe.top_k; }));
    k.push_back(int_key("model", "moe_ffn_hidden", "ffn_hidden", 1, 1 << 24,
                        "Width of each expert's hidden layer (HF moe_intermediate_size).",
                        [](Config& c) -> auto& { return c.model.moe.ffn_hidden_set; }));
    k.push_back(int_key("model", "moe_shared_ffn_hidden", 0, 0, 1 << 24,
                        "Width of a shared SwiGLU expert every token passes, added to the routed "
                        "experts' output (DeepSeek's n_shared_experts x moe_intermediate_size); 0: none.",
                        [](Config& c) -> auto& { return c.model.moe.shared_ffn_hidden; }));
    k.push_back(bool_key("model", "moe_normalize_top_k", true,
                         "Renormalise each token's gates over its chosen experts so that they sum to "
                         "1 (Mixtral always; Qwen3-MoE's norm_topk_prob); false: the softmax "
                         "probabilities themselves.",
                         [](Config& c, bool v) { c.model.moe.normalize_top_k = v; }));
    // Both coefficients are fractions of the language-model loss in practice (Switch: 0.01,
    // ST-MoE's z-loss: 0.001); past 1 the router's loss outweighs the model's.
    k.push_back(bounded_float_key("model", "moe_aux_loss", "0.01", 0.0, 1.0,
                                  "Coefficient of the Switch load-balancing loss, alpha E sum_e f_e P_e "
                                  "over each micro-batch (f_e: share of the routed slots, P_e: mean "
                                  "probability); balanced routing gives alpha. 0: off.",
                                  [](Config& c, double v) { c.model.moe.aux_loss = v; }));
    k.push_back(bounded_float_key("model", "moe_z_loss", "0.0", 0.0, 1.0,
                                  "Coefficient of the router z-loss (ST-MoE), the mean over tokens of "
                                  "logsumexp(router logits)^2. 0: off.",
                                  [](Config& c, double v) { c.model.moe.z_loss = v; }));
    k.push_back(int_key("model", "moe_first_dense_layers", 0, 0, 100000,
                        "The first blocks keep the dense feed-forward (DeepSeek-V3's "
                        "first_k_dense_replace); below model.layers.",
                        [](Config& c) -> auto& { return c.model.moe.first_dense_layers; }));
    k.push_back(choice_key("model", "moe_router", "softmax",
                           {router_name(RouterKind::Softmax), router_name(RouterKind::Sigmoid)},
                           "How the router scores the experts: \"softmax\" over the logits, the "
                           "top_k chosen by score (Mixtral, Qwen3-MoE); \"sigmoid\", each logit's "
                           "sigmoid, the top_k chosen by score plus a per-expert bias that only "
                           "chooses (no gradient) and moves by moe_bias_update_rate toward balance "
                           "after every step, from the loads of the whole job (DeepSeek-V3's "
                           "auxiliary-loss-free balancing; the bias is saved in checkpoints). "
                           "Either way the gates are the chosen scores (normalised over them with "
                           "moe_normalize_top_k) times moe_route_scale.",
                           [](Config& c, const std::string& v) { parse_router(v, c.model.moe.router); }));
    k.push_back(float_key("model", "moe_route_scale", "1.0", 0.0, true,
                          "Factor of every gate (DeepSeek's routed_scaling_factor; V3: 2.5).",
                          [](Config& c, double v) { c.model.moe.route_scale = v; }));
    k.push_back(float_key("model", "moe_bias_update_rate", "0.001", 0.0, false,
                          "The sigmoid router's bias step gamma: after every optimizer step each "
                          "expert's bias moves by +gamma if its load over the step was below the "
                          "mean, -gamma if above (DeepSeek-V3: 0.001, then 0 near the end). 0: "
                          "the bias stays as it is. Only with moe_router = \"sigmoid\"; not part of "
                          "the checkpoint's model, so a resume may change it.",
                          [](Config& c, double v) { c.model.moe.bias_update_rate = v; }));
    for (const GroupKey& g : kGroupKeys)
      k.push_back(int_key("model", g.key, 1, 1, 1 << 16, g.doc,
                          [field = g.field](Config& c) -> auto& { return c.model.moe.*field; }));
    k.push_back(float_key("model", "moe_capacity_factor", "0.0", 0.0, false,
                          "0: dropless, every choice computed (exact, the same on every layout). "
                          "Else each expert takes at most ceil(factor x tokens x top_k / "
                          "moe_experts) tokens of a micro-batch on a rank (the tokens the rank "
                          "routes); beyond that the choices with the lowest gates are dropped "
                          "(Megatron's \"probs\" policy; ties: the later token), contributing "
                          "nothing, and the kept gates are not renormalised. Which tokens drop "
                          "depends on how the tokens are split over ranks, so the result is not "
                          "layout-invariant. From 1 / moe_top_k (a slot per token) to below "
                          "moe_experts / moe_top_k (at or above it nothing can drop); the step "
                          "line and metrics.jsonl (expert_dropped) count the dropped choices.",
                          [](Config& c, double v) { c.model.moe.capacity_factor = v; }));
    // Multi-head latent attention (attention = "latent"; model/latent_attention.h), under HF
    // DeepseekV3Config's names.
    k.push_back(choice_key("model", "attention", "standard",
                           {attention_name(AttentionKind::Standard), attention_name(AttentionKind::Latent)},
                           "The attention sub-layer of each block: \"standard\", heads x head_dim "
                           "queries, keys and values projected from the input (GPT-2, Llama, "
                           "grouped-query with kv_heads); \"latent\", DeepSeek-V2/V3's multi-head "
                           "latent attention: keys and values expanded per head from one compressed "
                           "latent (kv_lora_rank), queries through an optional low-rank path "
                           "(q_lora_rank), and a rotary part (qk_rope_head_dim) whose key is shared "
                           "by all heads. Latent needs positions = \"rotary\", bias = false, no "
                           "qk_norm and kv_heads = heads.",
                           [](Config& c, const std::string& v) { parse_attention(v, c.model.attention); }));
    k.push_back(int_key("model", "q_lora_rank", 0, 0, 1 << 24,
                        "Latent attention: rank of the queries' low-rank path (an RMSNorm between "
                        "its two projections); 0: queries straight from the input (HF null).",
                        [](Config& c) -> auto& { return c.model.latent.q_lora_rank; }));
    k.push_back(int_key("model", "kv_lora_rank", 512, 1, 1 << 24,
                        "Latent attention: width of the compressed key/value latent (RMSNorm'd, "
                        "then expanded per head into keys' no-position part and values).",
                        [](Config& c) -> auto& { return c.model.latent.kv_lora_rank; }));
    k.push_back(int_key("model", "qk_nope_head_dim", 128, 1, 65536,
                        "Latent attention: channels of each query and key head without rotary "
                        "positions.",
                        [](Config& c) -> auto& { return c.model.latent.qk_nope_dim; }));
    k.push_back(int_key("model", "qk_rope_head_dim", 64, 2, 65536,
                        "Latent attention: rotary channels at the end of each query head, and of "
                        "the one rotary key head all heads share; even.",
                        [](Config& c) -> auto& { return c.model.latent.qk_rope_dim; }));
    k.push_back(int_key("model", "v_head_dim", 128, 1, 65536,
                        "Latent attention: channels of each value head (the attention's output "
                        "is heads x v_head_dim, projected back to d_model).",
                        [](Config& c) -> auto& { return c.model.latent.v_head_dim; }));
    // Multi-token prediction (model/mtp_module.h), under DeepSeek-V3's names where it has one.
    const std::string mtp_layers_doc =
        "Multi-token prediction depths (HF num_nextn_predict_layers; DeepSeek-V3: 1), each "
        "predicting one token further with the shared head from the last depth's state and the "
        "next token (docs/mixtures-of-experts.md). Training only: the loss, eval and sample leave "
        "them out (metrics.jsonl: mtp_loss).";
    k.push_back(int_key("model", "mtp_layers", 0, 0, 16, mtp_layers_doc,
                        [](Config& c) -> auto& { return c.model.mtp_layers; }));
    k.push_back({"model", "attention_window", "integer or array of integers", "0",
                 "0 to 2147483647, or an array of them (a pattern over the blocks)",
                 "Sliding-window attention: query t sees keys t - W < s <= t (HF sliding_window). "
                 "An integer is every block's window (Mistral: 4096); an array is a pattern "
                 "repeated over the blocks, block l's window entry l % length (Gemma 3: [1024, "
                 "1024, 1024, 1024, 1024, 0], every sixth block global). 0: full attention. "
                 "Standard attention on the CPU backend, parallel.cp = 1 "
                 "(docs/parallelism-and-schedules.md).",
                 apply_attention_window});
    // A fraction of the language-model loss in practice (DeepSeek-V3: 0.3, then 0.1).
    k.push_back(bounded_float_key("model", "mtp_loss_weight", "0.3", 0.0, 1.0,
                                  "Weight lambda of the multi-token prediction losses: the "
                                  "objective adds lambda / mtp_layers times each depth's mean "
                                  "cross-entropy (DeepSeek-V3: 0.3 for the first 10T tokens, then "
                                  "0.1). Only with mtp_layers > 0; a resume may change it.",
                                  [](Config& c, double v) { c.model.mtp_loss_weight = v; }));
}

}  // namespace meshtrain
