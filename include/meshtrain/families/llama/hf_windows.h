#pragma once
// Sliding-window attention (model.attention_window, model/model_spec.h) in the Hugging Face
// configs of the Llama family: Mistral's `sliding_window` (every layer; MistralForCausalLM) and
// Qwen 3's `use_sliding_window` / `sliding_window` / `max_window_layers` (layers from
// max_window_layers on take the window, as transformers' Qwen3Config derives its layer_types),
// or its explicit `layer_types`. Mixtral's sliding_window keeps its own rule (families/moe/
// hf_moe.h: the deck trains no longer than the window). Both windows mean t - W < s <= t
// (transformers' masking_utils: sliding_window_overlay).

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/families/hf/hf_config_reader.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// The window pattern a config.json of `model_type` ("mistral", "qwen3", "qwen3_moe"; others
// have none) gives `layers` layers, canonical as the deck keeps it (empty: none). Refuses a
// window that is not a positive integer, a max_window_layers outside 0 .. layers and
// layer_types that are not one of "full_attention" / "sliding_attention" per layer.
std::vector<int64_t> hf_read_windows(const HfConfigReader& config, const std::string& model_type,
                                     int layers);

// Whether `m`'s windows have a Hugging Face form: none; the same window in every layer
// (Mistral, Qwen 3 with max_window_layers 0); Qwen 3's full layers then windowed ones (model.
// qk_norm). "" when they do, else why not (export's refusal).
std::string hf_windows_unexpressible(const ModelSpec& m);

// config.json's window keys for `m` (which hf_windows_unexpressible accepted): Qwen 3's three
// (and layer_types), or Mistral's sliding_window.
void hf_write_windows(const ModelSpec& m, nlohmann::ordered_json& config);

}  // namespace meshtrain
