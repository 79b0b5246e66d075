#include "meshtrain/model/model_spec.h"

#include <map>
#include <mutex>
#include <charconv>
#include <utility>

#include "meshtrain/model/model_costs.h"
#include "meshtrain/model/parameter_table.h"

namespace meshtrain {

int64_t ModelSpec::parameter_count() const {
  // The strategy advisor asks once per layout (tens of thousands at scale, from several threads),
  // and the table names every tensor of every layer: the count is remembered per architecture.
  static std::mutex mutex;
  static std::map<ModelSpec, int64_t> counted;
  const ModelSpec& key = *this;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = counted.find(key); it != counted.end()) return it->second;
  }
  const int64_t n = total_numel(parameter_table(*this));
  std::lock_guard<std::mutex> lock(mutex);
  counted.emplace(key, n);
  return n;
}

double ModelSpec::active_parameter_count() const {
  const ModelCostSheet& sheet = model_cost_sheet(*this);
  double n = 0;
  auto add = [&](const CostSheet& s) {
    for (const ParameterCost& p : s.parameters)
      if (!p.shared) n += p.active_share * static_cast<double>(p.numel);
  };
  add(sheet.embedding);
  for (const CostSheet& b : sheet.blocks) add(b);
  add(sheet.head);
  return n;
}

double ModelSpec::flops_per_token() const {
  return model_cost_sheet(*this).flops_per_token(static_cast<double>(seq_len));
}

}  // namespace meshtrain

namespace meshtrain {

namespace {

template <class Kind>
struct Named {
  Kind kind;
  const char* name;
};

// One table per variant: the name a deck and a checkpoint use for it (HF's where it has one).
constexpr Named<NormKind> kNorms[] = {{NormKind::Layer, "layernorm"}, {NormKind::Rms, "rmsnorm"}};
constexpr Named<PositionKind> kPositions[] = {{PositionKind::Learned, "learned"},
                                               {PositionKind::Rotary, "rotary"}};
constexpr Named<RopeScalingKind> kRopeScalings[] = {{RopeScalingKind::None, "none"},
                                                    {RopeScalingKind::Llama3, "llama3"},
                                                    {RopeScalingKind::Yarn, "yarn"}};
constexpr Named<ActivationKind> kActivations[] = {{ActivationKind::GeluTanh, "gelu_tanh"},
                                                   {ActivationKind::SwiGlu, "swiglu"}};
constexpr Named<FeedForwardKind> kFeedForwards[] = {{FeedForwardKind::Dense, "dense"},
                                                    {FeedForwardKind::Moe, "moe"}};
constexpr Named<AttentionKind> kAttentions[] = {{AttentionKind::Standard, "standard"},
                                                  {AttentionKind::Latent, "latent"}};
constexpr Named<RouterKind> kRouters[] = {{RouterKind::Softmax, "softmax"}, {RouterKind::Sigmoid, "sigmoid"}};

template <class Kind, size_t N>
const char* name_of(const Named<Kind> (&table)[N], Kind k) {
  for (const auto& e : table)
    if (e.kind == k) return e.name;
  return "?";
}

template <class Kind, size_t N>
bool parse_name(const Named<Kind> (&table)[N], const std::string& s, Kind& out) {
  for (const auto& e : table)
    if (s == e.name) {
      out = e.kind;
      return true;
    }
  return false;
}

}  // namespace

namespace {

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// Shortest text that reads back as the same double, always a TOML float ("1e-05", "10000.0").
std::string toml_float(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::vector<std::pair<const char*, std::string>> moe_field_values(const ModelSpec& model) {
  const MoeSpec& m = model.moe;
  return {
      {"moe_experts", std::to_string(m.experts)},
      {"moe_top_k", std::to_string(m.top_k)},
      {"moe_ffn_hidden", std::to_string(model.moe_ffn_hidden())},
      {"moe_shared_ffn_hidden", std::to_string(m.shared_ffn_hidden)},
      {"moe_normalize_top_k", m.normalize_top_k ? "true" : "false"},
      {"moe_aux_loss", toml_float(m.aux_loss)},
      {"moe_z_loss", toml_float(m.z_loss)},
      {"moe_first_dense_layers", std::to_string(m.first_dense_layers)},
      {"moe_router", quoted(router_name(m.router))},
      {"moe_route_scale", toml_float(m.route_scale)},
      {"moe_bias_update_rate", toml_float(m.bias_update_rate)},
      {"moe_capacity_factor", toml_float(m.capacity_factor)},
      {"moe_groups", std::to_string(m.groups)},
      {"moe_top_groups", std::to_string(m.top_groups)},
  };
}

std::vector<std::pair<const char*, std::string>> field_values(const ModelSpec& m) {
  std::vector<std::pair<const char*, std::string>> fields = {
      {"family", quoted(m.family)},
      {"norm", quoted(norm_name(m.norm.kind))},
      {"norm_eps", toml_float(m.norm.eps)},
      {"positions", quoted(position_name(m.positions))},
      {"rope_theta", toml_float(m.rope.theta)},
      {"rope_scaling", quoted(rope_scaling_name(m.rope.scaling))},
      {"rope_factor", toml_float(m.rope.factor)},
      {"rope_low_freq_factor", toml_float(m.rope.low_freq_factor)},
      {"rope_high_freq_factor", toml_float(m.rope.high_freq_factor)},
      {"rope_original_max_positions", std::to_string(m.rope.original_max_positions)},
      {"rope_beta_fast", toml_float(m.rope.beta_fast)},
      {"rope_beta_slow", toml_float(m.rope.beta_slow)},
      {"rope_mscale", toml_float(m.rope.mscale)},
      {"rope_mscale_all_dim", toml_float(m.rope.mscale_all_dim)},
      {"rope_attention_factor", toml_float(m.rope.attention_factor)},
      {"rope_truncate", m.rope.truncate ? "true" : "false"},
      {"activation", quoted(activation_name(m.activation))},
      {"feed_forward", quoted(feed_forward_name(m.feed_forward))},
      {"bias", m.linear_bias ? "true" : "false"},
      {"qk_norm", m.qk_norm ? "true" : "false"},
      {"kv_heads", std::to_string(m.kv_heads())},
      {"head_dim", std::to_string(m.head_dim())},
      {"ffn_hidden", std::to_string(m.ffn_hidden())},
  };
  for (auto& f : moe_field_values(m)) fields.push_back(std::move(f));
  // Latent attention's sizes under HF DeepseekV3Config's names.
  fields.push_back({"attention", quoted(attention_name(m.attention))});
  fields.push_back({"q_lora_rank", std::to_string(m.latent.q_lora_rank)});
  fields.push_back({"kv_lora_rank", std::to_string(m.latent.kv_lora_rank)});
  fields.push_back({"qk_nope_head_dim", std::to_string(m.latent.qk_nope_dim)});
  fields.push_back({"qk_rope_head_dim", std::to_string(m.latent.qk_rope_dim)});
  fields.push_back({"v_head_dim", std::to_string(m.latent.v_head_dim)});
  fields.push_back({"mtp_layers", std::to_string(m.mtp_layers)});
  fields.push_back({"mtp_loss_weight", toml_float(m.mtp_loss_weight)});
  fields.push_back({"attention_window", attention_window_text(m.attention_window)});
  return fields;
}

}  // namespace

std::vector<SpecField> spec_fields(const ModelSpec& m) {
  const auto mine = field_values(m);
  const auto gpt2 = field_values(gpt2_spec(m.layers, m.d_model, m.heads, m.seq_len, m.vocab_size));
  std::vector<SpecField> out;
  for (size_t i = 0; i < mine.size(); ++i) out.push_back({mine[i].first, mine[i].second, gpt2[i].second});
  return out;
}

ModelSpec gpt2_spec(int layers, int64_t d_model, int64_t heads, int64_t seq_len, int64_t vocab_size) {
  // ModelSpec's own defaults are GPT-2's (families/gpt2/): what a checkpoint written before a
  // field existed computed.
  // (The nested specs named too, to their own defaults: -Wmissing-field-initializers.)
  return ModelSpec{.layers = layers, .d_model = d_model, .heads = heads, .seq_len = seq_len,
                   .vocab_size = vocab_size, .norm = {}, .rope = {}, .moe = {}, .latent = {}};
}

std::string attention_window_text(const std::vector<int64_t>& pattern) {
  if (pattern.empty()) return "0";
  if (pattern.size() == 1) return std::to_string(pattern.front());
  std::string s = "[";
  for (size_t i = 0; i < pattern.size(); ++i) s += (i ? ", " : "") + std::to_string(pattern[i]);
  return s + "]";
}

const char* norm_name(NormKind k) { return name_of(kNorms, k); }
const char* position_name(PositionKind k) { return name_of(kPositions, k); }
const char* activation_name(ActivationKind k) { return name_of(kActivations, k); }
const char* feed_forward_name(FeedForwardKind k) { return name_of(kFeedForwards, k); }
const char* router_name(RouterKind k) { return name_of(kRouters, k); }
bool parse_router(const std::string& s, RouterKind& out) { return parse_name(kRouters, s, out); }
const char* attention_name(AttentionKind k) { return name_of(kAttentions, k); }
bool parse_attention(const std::string& s, AttentionKind& out) { return parse_name(kAttentions, s, out); }
bool parse_norm(const std::string& s, NormKind& out) { return parse_name(kNorms, s, out); }
bool parse_position(const std::string& s, PositionKind& out) { return parse_name(kPositions, s, out); }
const char* rope_scaling_name(RopeScalingKind k) { return name_of(kRopeScalings, k); }
bool parse_rope_scaling(const std::string& s, RopeScalingKind& out) {
  return parse_name(kRopeScalings, s, out);
}
bool parse_activation(const std::string& s, ActivationKind& out) { return parse_name(kActivations, s, out); }
bool parse_feed_forward(const std::string& s, FeedForwardKind& out) { return parse_name(kFeedForwards, s, out); }

}  // namespace meshtrain
