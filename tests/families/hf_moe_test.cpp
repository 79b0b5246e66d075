// The Hugging Face Mixtral / Qwen3-MoE mapping: every expert of the stacked tensors under
// transformers' per-expert names (and its values as that expert's slice, both ways), config.json
// read into the moe fields and refused where meshtrain computes something else, and written back.

#include "meshtrain/families/moe/hf_moe.h"
#include "meshtrain/families/hf/hf_deck.h"
#include "meshtrain/families/llama/hf_llama.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "llama_spec_reading.h"

namespace meshtrain {
namespace {

using nlohmann::json;

json mixtral_config() {
  return json::parse(R"({"model_type": "mixtral", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "num_local_experts": 4, "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.02, "sliding_window": null})");
}

json qwen3_moe_config() {
  return json::parse(R"({"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 40, "moe_intermediate_size": 8, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_experts": 6,
    "num_experts_per_tok": 3, "norm_topk_prob": false, "decoder_sparse_step": 1,
    "mlp_only_layers": [0], "tie_word_embeddings": true})");
}

TEST(HfMoe, ReadsMixtral) {
  const ModelSpec m = spec_of(mixtral_config());
  EXPECT_EQ(m.family, "llama");
  EXPECT_EQ(m.feed_forward, FeedForwardKind::Moe);
  EXPECT_EQ(m.moe.experts, 4);
  EXPECT_EQ(m.moe.top_k, 2);
  EXPECT_EQ(m.moe_ffn_hidden(), 24);  // Mixtral's intermediate_size is its experts' width
  EXPECT_TRUE(m.moe.normalize_top_k);
  EXPECT_EQ(m.moe.first_dense_layers, 0);
  EXPECT_EQ(m.kv_heads(), 2);
  EXPECT_EQ(m.rope.theta, 1e6);
  EXPECT_FALSE(m.linear_bias);
  // HF: one loss over both layers counting 2 choices a token; meshtrain: one a layer.
  EXPECT_DOUBLE_EQ(m.moe.aux_loss, 0.02 * 2 / 2);
  EXPECT_DOUBLE_EQ(hf_router_aux_loss_coef(m), 0.02);
}

TEST(HfMoe, ReadsQwen3MoeWithDenseFirstBlock) {
  const ModelSpec m = spec_of(qwen3_moe_config());
  EXPECT_EQ(m.family, "qwen3");
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.feed_forward, FeedForwardKind::Moe);
  EXPECT_EQ(m.moe.experts, 6);
  EXPECT_EQ(m.moe.top_k, 3);
  EXPECT_EQ(m.moe_ffn_hidden(), 8);
  EXPECT_EQ(m.ffn_hidden(), 40);  // the dense first block's
  EXPECT_FALSE(m.moe.normalize_top_k);
  EXPECT_EQ(m.moe.first_dense_layers, 1);
  EXPECT_FALSE(m.moe_layer(0));
  EXPECT_TRUE(m.moe_layer(1));
  EXPECT_TRUE(m.tie_embeddings);
  // transformers' default coefficient, 3 choices a token, 2 mixture layers.
  EXPECT_DOUBLE_EQ(m.moe.aux_loss, 0.001 * 3 / 2);
}

TEST(HfMoe, RefusesWhatMeshtrainCannotCompute) {
  json j = qwen3_moe_config();
  j["decoder_sparse_step"] = 2;
  EXPECT_NE(refusal(j).find("config.json: decoder_sparse_step = 2 ("), std::string::npos) << refusal(j);
  j = qwen3_moe_config();
  j["mlp_only_layers"] = {1};
  EXPECT_NE(refusal(j).find("config.json: mlp_only_layers = [1] (meshtrain's dense blocks are the first k"),
            std::string::npos)
      << refusal(j);
  j["mlp_only_layers"] = {0, 1, 2};  // every block dense: no mixture left
  EXPECT_NE(refusal(j).find("mlp_only_layers = [0,1,2]"), std::string::npos) << refusal(j);
  j = qwen3_moe_config();
  j["shared_expert_intermediate_size"] = 64;
  EXPECT_NE(refusal(j).find("shared_expert_intermediate_size = 64"), std::string::npos) << refusal(j);
  j = qwen3_moe_config();
  j["num_experts_per_tok"] = 7;
  EXPECT_NE(refusal(j).find("num_experts_per_tok = 7 (each token chooses among num_experts = 6 experts"),
            std::string::npos)
      << refusal(j);
  j = mixtral_config();
  j["num_local_experts"] = 0;
  EXPECT_NE(refusal(j).find("num_local_experts = 0 (expected an integer from 1 to 65536, what meshtrain's "
                            "model.moe_experts accepts)"),
            std::string::npos)
      << refusal(j);
  j = mixtral_config();
  j["router_aux_loss_coef"] = -1;
  EXPECT_NE(refusal(j).find("router_aux_loss_coef = -1 (expected a number >= 0)"), std::string::npos);
  j = mixtral_config();
  j["model_type"] = "deepseek_v3";
  EXPECT_NE(refusal(j).find("\"mixtral\" and \"qwen3_moe\""), std::string::npos) << refusal(j);
}

TEST(HfMoe, SlidingWindowAtLeastTheContext) {
  json j = mixtral_config();
  const HfConfigReader none(j, "config.json", deck_key_range);
  EXPECT_NO_THROW(hf_check_sliding_window(none, 4096, "deck.toml"));
  j["sliding_window"] = 4096;
  const HfConfigReader wide(j, "config.json", deck_key_range);
  EXPECT_NO_THROW(hf_check_sliding_window(wide, 4096, "deck.toml"));
  try {
    hf_check_sliding_window(wide, 8192, "deck.toml");
    FAIL() << "a window shorter than seq_len was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: sliding_window = 4096 (Mixtral then attends"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("deck.toml's model.seq_len = 8192; set model.seq_len <= 4096"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfMoe, EveryExpertUnderItsOwnName) {
  for (const json& config : {mixtral_config(), qwen3_moe_config()}) {
    const ModelSpec m = spec_of(config);
    std::map<std::string, HfTensor> by_hf;
    for (const HfTensor& t : hf_llama_tensors(m)) by_hf[t.hf] = t;
    const bool qwen = m.qk_norm;
    const std::string block = qwen ? "model.layers.1.mlp." : "model.layers.1.block_sparse_moe.";
    const int64_t E = m.moe.experts, F = m.moe_ffn_hidden(), C = m.d_model;
    ASSERT_TRUE(by_hf.count(block + "gate.weight"));
    EXPECT_EQ(by_hf[block + "gate.weight"].meshtrain, "h.1.mlp.router.weight");
    EXPECT_EQ(by_hf[block + "gate.weight"].hf_shape, (std::vector<int64_t>{E, C}));
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = block + "experts." + std::to_string(e) + ".";
      const std::string gate = p + (qwen ? "gate_proj" : "w1") + ".weight",
                        up = p + (qwen ? "up_proj" : "w3") + ".weight",
                        down = p + (qwen ? "down_proj" : "w2") + ".weight";
      ASSERT_TRUE(by_hf.count(gate) && by_hf.count(up) && by_hf.count(down)) << gate;
      EXPECT_EQ(by_hf[gate].meshtrain, "h.1.mlp.experts.gate.weight");
      EXPECT_EQ(by_hf[up].meshtrain, "h.1.mlp.experts.up.weight");
      EXPECT_EQ(by_hf[down].meshtrain, "h.1.mlp.experts.down.weight");
      EXPECT_EQ(by_hf[gate].hf_shape, (std::vector<int64_t>{F, C}));
      EXPECT_EQ(by_hf[down].hf_shape, (std::vector<int64_t>{C, F}));
      EXPECT_EQ(by_hf[down].part, e);
      EXPECT_EQ(by_hf[down].parts, E);
    }
    // Qwen3-MoE's dense first block keeps the dense names; Mixtral has none.
    EXPECT_EQ(by_hf.count("model.layers.0.mlp.gate_proj.weight"), qwen ? 1u : 0u);
    EXPECT_EQ(by_hf.count("model.layers.0.mlp.experts.0.gate_proj.weight"), 0u);
  }
}

TEST(HfMoe, ExpertSlicesBothWays) {
  const ModelSpec m = spec_of(mixtral_config());
  const int64_t E = m.moe.experts, F = m.moe_ffn_hidden(), C = m.d_model;
  std::vector<float> stacked(static_cast<size_t>(E * C * F));
  std::iota(stacked.begin(), stacked.end(), 0.0f);
  std::vector<float> back;
  for (const HfTensor& t : hf_llama_tensors(m)) {
    if (t.meshtrain != "h.0.mlp.experts.down.weight") continue;
    const std::vector<float> hf = to_hf_layout(t, stacked);
    ASSERT_EQ(hf.size(), static_cast<size_t>(C * F));
    EXPECT_EQ(hf[0], static_cast<float>(t.part * C * F));  // expert e's first element
    from_hf_layout(t, hf, back);
  }
  EXPECT_EQ(back, stacked);
}

TEST(HfMoe, ArchitectureAndConfigBack) {
  ModelSpec mixtral = spec_of(mixtral_config());
  mixtral.seq_len = 32;
  EXPECT_EQ(hf_llama_architecture(mixtral, "ck.h5"), "MixtralForCausalLM");
  const json out = json::parse(hf_llama_config_json(mixtral, "float32", -1, -1));
  EXPECT_EQ(out["architectures"], json({"MixtralForCausalLM"}));
  EXPECT_EQ(out["model_type"], "mixtral");
  EXPECT_EQ(out["intermediate_size"], 24);
  EXPECT_EQ(out["num_local_experts"], 4);
  EXPECT_EQ(out["num_experts_per_tok"], 2);
  EXPECT_TRUE(out["sliding_window"].is_null());
  EXPECT_FALSE(out.contains("mlp_bias"));
  EXPECT_DOUBLE_EQ(out["router_aux_loss_coef"].get<double>(), 0.02);
  // Read back, it is the same model.
  int64_t max_positions = 0;
  EXPECT_EQ(spec_fields(read_spec(out, 32, max_positions)).size(),
            spec_fields(mixtral).size());

  ModelSpec qwen = spec_of(qwen3_moe_config());
  qwen.seq_len = 32;
  EXPECT_EQ(hf_llama_architecture(qwen, "ck.h5"), "Qwen3MoeForCausalLM");
  const json q = json::parse(hf_llama_config_json(qwen, "bfloat16", -1, -1));
  EXPECT_EQ(q["model_type"], "qwen3_moe");
  EXPECT_EQ(q["intermediate_size"], 40);
  EXPECT_EQ(q["moe_intermediate_size"], 8);
  EXPECT_EQ(q["num_experts"], 6);
  EXPECT_EQ(q["norm_topk_prob"], false);
  EXPECT_EQ(q["mlp_only_layers"], json({0}));
  EXPECT_EQ(q["decoder_sparse_step"], 1);
  const ModelSpec again = read_spec(q, 32, max_positions);
  EXPECT_EQ(again.moe.first_dense_layers, 1);
  EXPECT_EQ(again.moe_ffn_hidden(), 8);
  EXPECT_EQ(again.ffn_hidden(), 40);

  // What neither expresses.
  auto refused = [](ModelSpec m, const std::string& needle) {
    try {
      hf_llama_architecture(m, "ck.h5");
    } catch (const std::runtime_error& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  ModelSpec shared = qwen;
  shared.moe.shared_ffn_hidden = 16;
  EXPECT_TRUE(
      refused(shared, "ck.h5: model.moe_shared_ffn_hidden = 16, which Hugging Face Qwen3MoeForCausalLM"));
  ModelSpec unnormalised = mixtral;
  unnormalised.moe.normalize_top_k = false;
  EXPECT_TRUE(
      refused(unnormalised, "model.moe_normalize_top_k = false, which Hugging Face MixtralForCausalLM"));
  ModelSpec dense_first = mixtral;
  dense_first.moe.first_dense_layers = 1;
  EXPECT_TRUE(refused(dense_first, "model.moe_first_dense_layers = 1"));
  ModelSpec biased = mixtral;
  biased.linear_bias = true;
  EXPECT_TRUE(refused(biased, "model.bias = true"));
  // DeepSeek-V3's router, a gate scale and a capacity: neither computes them.
  ModelSpec sigmoid = mixtral;
  sigmoid.moe.router = RouterKind::Sigmoid;
  EXPECT_TRUE(refused(sigmoid, "model.moe_router = \"sigmoid\", which Hugging Face MixtralForCausalLM"));
  ModelSpec scaled = qwen;
  scaled.moe.route_scale = 2.5;
  EXPECT_TRUE(refused(scaled, "model.moe_route_scale = 2.5, which Hugging Face Qwen3MoeForCausalLM"));
  ModelSpec capped = mixtral;
  capped.moe.capacity_factor = 1.25;
  EXPECT_TRUE(refused(capped, "model.moe_capacity_factor = 1.25"));
}

TEST(HfMoe, DeckHoldsTheMixture) {
  const ModelSpec qwen = [] {
    ModelSpec m = spec_of(qwen3_moe_config());
    m.seq_len = 32;
    return m;
  }();
  const std::string deck = hf_deck_text(qwen, "bytes", "/models/Qwen3-MoE");
  for (const char* line :
       {"feed_forward = \"moe\"\n", "moe_experts = 6\n", "moe_top_k = 3\n", "moe_ffn_hidden = 8\n",
        "ffn_hidden = 40\n", "moe_normalize_top_k = false\n", "moe_first_dense_layers = 1\n"})
    EXPECT_NE(deck.find(line), std::string::npos) << line << " in\n" << deck;
  // A dense model's deck names no mixture key: they mean nothing to it.
  json dense_config = qwen3_moe_config();
  dense_config["model_type"] = "qwen3";
  ModelSpec dense = spec_of(dense_config);
  dense.seq_len = 32;
  const std::string dense_deck = hf_deck_text(dense, "bytes", "/models/Qwen3");
  EXPECT_EQ(dense_deck.find("moe_"), std::string::npos) << dense_deck;
  EXPECT_EQ(dense_deck.find("feed_forward"), std::string::npos) << dense_deck;
  EXPECT_NE(dense_deck.find("ffn_hidden = 40\n"), std::string::npos) << dense_deck;
}

}  // namespace
}  // namespace meshtrain
