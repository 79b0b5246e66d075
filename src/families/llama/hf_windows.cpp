#include "meshtrain/families/llama/hf_windows.h"

#include <algorithm>
#include <climits>

namespace meshtrain {

using nlohmann::json;

namespace {

// The deck's canonical form (config/model_keys.cpp): one entry where all are equal, none where
// every layer is full.
std::vector<int64_t> canonical(std::vector<int64_t> pattern) {
  if (!pattern.empty() &&
      std::all_of(pattern.begin(), pattern.end(), [&](int64_t w) { return w == pattern[0]; }))
    pattern.resize(1);
  if (pattern == std::vector<int64_t>{0}) pattern.clear();
  return pattern;
}

// Every layer's window, the pattern repeated over the layers.
std::vector<int64_t> per_layer(const ModelSpec& m) {
  std::vector<int64_t> w;
  for (int l = 0; l < m.layers; ++l) w.push_back(m.window(l));
  return w;
}

// Qwen 3's explicit layer_types: one "full_attention" or "sliding_attention" per layer.
std::vector<int64_t> read_layer_types(const HfConfigReader& c, const json& types, int64_t window,
                                      int layers) {
  const std::string accepted = "an array of " + std::to_string(layers) +
                               " entries (num_hidden_layers), each \"full_attention\" or "
                               "\"sliding_attention\"";
  if (!types.is_array() || types.size() != static_cast<size_t>(layers))
    c.refuse("layer_types", types, accepted);
  std::vector<int64_t> pattern;
  for (const json& t : types) {
    if (t != "full_attention" && t != "sliding_attention") c.refuse("layer_types", types, accepted);
    pattern.push_back(t == "sliding_attention" ? window : 0);
  }
  return pattern;
}

}  // namespace

std::vector<int64_t> hf_read_windows(const HfConfigReader& c, const std::string& model_type,
                                     int layers) {
  const json& j = c.config();
  const bool qwen = model_type == "qwen3" || model_type == "qwen3_moe";
  if (model_type != "mistral" && !qwen) return {};
  // transformers: Qwen 3's sliding_window counts only with use_sliding_window; null is none.
  if (qwen && !c.boolean("use_sliding_window")) return {};
  if (json_value_or(j, "sliding_window", nullptr).is_null()) return {};
  const int64_t window = c.integer(j, "sliding_window", 0, 1, INT32_MAX);
  if (!qwen) return canonical({window});
  if (const json types = json_value_or(j, "layer_types", nullptr); !types.is_null())
    return canonical(read_layer_types(c, types, window, layers));
  // Qwen3Config's default max_window_layers is 28 (all layers full in a model of 28 or fewer).
  const int64_t full = std::min<int64_t>(c.integer(j, "max_window_layers", 28, 0, INT64_MAX), layers);
  std::vector<int64_t> pattern(static_cast<size_t>(layers), window);
  std::fill(pattern.begin(), pattern.begin() + full, 0);
  return canonical(pattern);
}

std::string hf_windows_unexpressible(const ModelSpec& m) {
  if (!m.windowed()) return "";
  const std::vector<int64_t> w = per_layer(m);
  const auto first = std::find_if(w.begin(), w.end(), [](int64_t x) { return x != 0; });
  const bool full_then_windowed =
      std::all_of(first, w.end(), [&](int64_t x) { return x == *first; });
  if (m.qk_norm)
    return full_then_windowed ? ""
                              : "Qwen 3 has full layers below max_window_layers and one "
                                "sliding_window above: a pattern of full layers, then windowed "
                                "ones of one window";
  if (m.feed_forward == FeedForwardKind::Moe)
    return "MixtralForCausalLM's sliding_window is imported as a bound on the context, not as "
           "windows";
  if (m.attention_window.size() != 1)
    return "MistralForCausalLM has one sliding_window for every layer";
  return "";
}

void hf_write_windows(const ModelSpec& m, nlohmann::ordered_json& j) {
  if (!m.qk_norm) {
    if (m.windowed()) j["sliding_window"] = m.attention_window.front();
    return;
  }
  const std::vector<int64_t> w = per_layer(m);
  const auto first = std::find_if(w.begin(), w.end(), [](int64_t x) { return x != 0; });
  j["use_sliding_window"] = m.windowed();
  j["sliding_window"] = m.windowed() ? nlohmann::ordered_json(*first) : nlohmann::ordered_json(nullptr);
  j["max_window_layers"] = m.windowed() ? static_cast<int64_t>(first - w.begin()) : m.layers;
  if (!m.windowed()) return;
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (int64_t x : w) types.push_back(x ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

}  // namespace meshtrain
