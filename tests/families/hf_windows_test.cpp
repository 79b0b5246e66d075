// Sliding windows in the Llama family's config.json (families/llama/hf_windows.h): Mistral's
// sliding_window on every layer, Qwen 3's use_sliding_window / sliding_window /
// max_window_layers (layers from max_window_layers on) and its explicit layer_types, read into
// model.attention_window, refused where malformed, and written back so that the config reads
// back as the same model; and export's refusal of a pattern no class expresses.

#include "meshtrain/families/llama/hf_windows.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llama_spec_reading.h"

namespace meshtrain {
namespace {

using nlohmann::json;

json config(const char* model_type) {
  return json::parse(std::string(R"({"model_type": ")") + model_type + R"(", "vocab_size": 64,
    "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": false, "rope_theta": 10000.0})");
}

TEST(HfWindows, MistralSlidingWindowIsEveryLayersWindow) {
  json j = config("mistral");
  j["sliding_window"] = 8;
  const ModelSpec m = spec_of(j);
  EXPECT_EQ(m.family, "llama");
  EXPECT_EQ(m.attention_window, (std::vector<int64_t>{8}));
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(spec_of(j).attention_window.empty());
  // Llama has no window: its config's key (if any) is not Mistral's.
  json llama = config("llama");
  llama["sliding_window"] = 8;
  EXPECT_TRUE(spec_of(llama).attention_window.empty());
}

TEST(HfWindows, Qwen3WindowsLayersFromMaxWindowLayersOn) {
  json j = config("qwen3");
  j["sliding_window"] = 8;
  j["max_window_layers"] = 2;
  EXPECT_TRUE(spec_of(j).attention_window.empty()) << "use_sliding_window is false";
  j["use_sliding_window"] = true;
  EXPECT_EQ(spec_of(j).attention_window, (std::vector<int64_t>{0, 0, 8, 8}));
  j["max_window_layers"] = 0;
  EXPECT_EQ(spec_of(j).attention_window, (std::vector<int64_t>{8}));
  j["max_window_layers"] = 4;
  EXPECT_TRUE(spec_of(j).attention_window.empty());
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(spec_of(j).attention_window, (std::vector<int64_t>{8, 0, 8, 0}));
}

TEST(HfWindows, RefusesMalformedWindowsByName) {
  json j = config("qwen3");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 0;
  EXPECT_NE(refusal(j).find("config.json: sliding_window = 0 (expected an integer from 1 to "
                            "2147483647"),
            std::string::npos)
      << refusal(j);
  j["sliding_window"] = 8;
  j["max_window_layers"] = -1;
  EXPECT_NE(refusal(j).find("config.json: max_window_layers = -1 (expected an integer >= 0"),
            std::string::npos)
      << refusal(j);
  j["max_window_layers"] = 5;  // beyond the layers: every layer full, as transformers has it
  EXPECT_TRUE(spec_of(j).attention_window.empty());
  j["max_window_layers"] = 2;
  j["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
  EXPECT_NE(refusal(j).find("config.json: layer_types = [\"sliding_attention\",\"chunked_attention\""),
            std::string::npos)
      << refusal(j);
  EXPECT_NE(refusal(j).find("each \"full_attention\" or \"sliding_attention\""), std::string::npos);
  j["layer_types"] = {"sliding_attention"};
  EXPECT_NE(refusal(j).find("an array of 4 entries (num_hidden_layers)"), std::string::npos);
}

TEST(HfWindows, ConfigJsonReadsBackAsTheSameWindows) {
  json mistral = config("mistral");
  mistral["sliding_window"] = 8;
  const ModelSpec m = spec_of(mistral);
  EXPECT_EQ(hf_llama_architecture(m, "ck.h5"), "MistralForCausalLM");
  const json out = json::parse(hf_llama_config_json(m, "bfloat16", 1, 2));
  EXPECT_EQ(out["architectures"], json::array({"MistralForCausalLM"}));
  EXPECT_EQ(out["sliding_window"], 8);
  EXPECT_EQ(spec_of(out), m);

  json qwen = config("qwen3");
  qwen["use_sliding_window"] = true;
  qwen["sliding_window"] = 8;
  qwen["max_window_layers"] = 1;
  const ModelSpec q = spec_of(qwen);
  const json back = json::parse(hf_llama_config_json(q, "bfloat16", 1, 2));
  EXPECT_EQ(back["use_sliding_window"], true);
  EXPECT_EQ(back["max_window_layers"], 1);
  EXPECT_EQ(back["layer_types"][0], "full_attention");
  EXPECT_EQ(spec_of(back), q);
}

TEST(HfWindows, ExportRefusesPatternsNoClassExpresses) {
  json mistral = config("mistral");
  mistral["sliding_window"] = 8;
  ModelSpec m = spec_of(mistral);
  m.attention_window = {8, 0};  // Mistral has one window for every layer
  try {
    hf_llama_architecture(m, "ck.h5");
    ADD_FAILURE() << "exported";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ck.h5: model.attention_window = [8, 0], which Hugging "
                                         "Face MistralForCausalLM (MistralForCausalLM has one "
                                         "sliding_window for every layer) cannot express"),
              std::string::npos)
        << e.what();
  }
  json qwen = config("qwen3");
  ModelSpec q = spec_of(qwen);
  q.attention_window = {8, 0};  // windowed, then full: Qwen 3's windows are above the full layers
  EXPECT_NE(hf_windows_unexpressible(q), "");
  q.attention_window = {0, 0, 8, 8};
  EXPECT_EQ(hf_windows_unexpressible(q), "");
}

}  // namespace
}  // namespace meshtrain
