// The Hugging Face DeepseekV3ForCausalLM mapping (families/deepseek_v3/hf_deepseek_v3.h):
// config.json read into the latent attention and noaux_tc mixture fields (q_lora_rank null,
// rope_interleave, YaRN both ways), refused by key where meshtrain computes something else,
// written back and read again to the same spec; the tensor names with their rotary rows.

#include "meshtrain/families/deepseek_v3/hf_deepseek_v3.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/app/hf_directory.h"
#include "meshtrain/families/deepseek_v3/deepseek_v3_family.h"
#include "meshtrain/families/registry.h"

namespace meshtrain {
namespace {

using nlohmann::json;

json tiny_config() {
  return json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 8,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "n_shared_experts": 2, "n_routed_experts": 8, "routed_scaling_factor": 1.5,
    "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 4, "v_head_dim": 6,
    "qk_nope_head_dim": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3,
    "first_k_dense_replace": 1, "norm_topk_prob": true, "hidden_act": "silu",
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
    "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false})");
}

ModelSpec spec_of(const json& j) {
  int64_t max_positions = 0;
  return hf_deepseek_v3_spec(HfConfigReader(j, "config.json", deck_key_range), max_positions);
}

// Every field of `m` as (key, value): what a deck or a checkpoint records of it.
std::vector<std::pair<std::string, std::string>> fields_of(const ModelSpec& m) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const SpecField& f : spec_fields(m)) out.emplace_back(f.key, f.value);
  return out;
}

std::string refusal(const json& j) {
  try {
    spec_of(j);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(HfDeepseekV3, ReadsTheConfig) {
  const ModelSpec m = spec_of(tiny_config());
  EXPECT_EQ(m.family, "deepseek_v3");
  EXPECT_EQ(m.layers, 3);
  EXPECT_EQ(m.d_model, 32);
  EXPECT_EQ(m.heads, 4);
  EXPECT_EQ(m.ffn_hidden(), 48);
  EXPECT_TRUE(m.latent_attention());
  EXPECT_EQ(m.latent, (LatentSpec{24, 16, 8, 4, 6}));
  EXPECT_EQ(m.feed_forward, FeedForwardKind::Moe);
  EXPECT_EQ(m.moe.router, RouterKind::Sigmoid);
  EXPECT_EQ(m.moe.experts, 8);
  EXPECT_EQ(m.moe.top_k, 3);
  EXPECT_EQ(m.moe_ffn_hidden(), 8);
  EXPECT_EQ(m.moe.shared_ffn_hidden, 16);  // two shared experts of moe_intermediate_size
  EXPECT_EQ(m.moe.route_scale, 1.5);
  EXPECT_EQ(m.moe.groups, 4);
  EXPECT_EQ(m.moe.top_groups, 2);
  EXPECT_EQ(m.moe.first_dense_layers, 1);
  EXPECT_EQ(m.norm.eps, 1e-6);
  EXPECT_EQ(m.rope.theta, 1e4);
  EXPECT_FALSE(m.tie_embeddings);
}

TEST(HfDeepseekV3, NullQLoraRankIsTheDirectQueryProjection) {
  json j = tiny_config();
  j["q_lora_rank"] = nullptr;
  EXPECT_EQ(spec_of(j).latent.q_lora_rank, 0);
}

TEST(HfDeepseekV3, ConfigRoundTrips) {
  for (const bool q_lora : {true, false})
    for (const char* where : {"", "rope_scaling", "rope_parameters"}) {
      json j = tiny_config();
      if (!q_lora) j["q_lora_rank"] = nullptr;
      if (!q_lora) j["num_nextn_predict_layers"] = 1;  // and one multi-token prediction depth
      const json yarn = {{"rope_type", "yarn"}, {"factor", 40.0}, {"original_max_position_embeddings", 128},
                         {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
      if (std::string(where) == "rope_scaling") j["rope_scaling"] = yarn;
      if (std::string(where) == "rope_parameters") {
        j.erase("rope_scaling");
        j.erase("rope_theta");
        j["rope_parameters"] = yarn;
        j["rope_parameters"]["rope_theta"] = 10000.0;
      }
      const ModelSpec m = spec_of(j);
      EXPECT_EQ(m.rope.scaling, *where ? RopeScalingKind::Yarn : RopeScalingKind::None) << where;
      const json written = json::parse(hf_deepseek_v3_config_json(m, HfExportOptions{"float32", "bytes", -1, -1}));
      EXPECT_EQ(written["rope_interleave"], true);
      EXPECT_EQ(written["topk_method"], "noaux_tc");
      EXPECT_EQ(written["scoring_func"], "sigmoid");
      EXPECT_EQ(written["num_nextn_predict_layers"], q_lora ? 0 : 1);
      EXPECT_EQ(written["q_lora_rank"].is_null(), !q_lora);
      ModelSpec back = spec_of(written);
      back.seq_len = m.seq_len;  // written as max_position_embeddings: the trained context
      EXPECT_EQ(fields_of(back), fields_of(m)) << where << " q_lora " << q_lora;
    }
}

TEST(HfDeepseekV3, RefusesByKeyWhatItDoesNotCompute) {
  const std::map<std::string, json> refused = {
      {"scoring_func", "softmax"},   {"topk_method", "greedy"}, {"moe_layer_freq", 2},
      {"hidden_act", "gelu"},        {"attention_bias", true},  {"num_key_value_heads", 2},
  };
  for (const auto& [key, value] : refused) {
    json j = tiny_config();
    j[key] = value;
    const std::string why = refusal(j);
    EXPECT_NE(why.find("config.json: " + key + " = " + value.dump()), std::string::npos) << why;
    EXPECT_NE(why.find("meshtrain accepts"), std::string::npos) << why;
  }
  json j = tiny_config();
  j["rope_interleave"] = "yes";
  EXPECT_NE(refusal(j).find("config.json: rope_interleave = \"yes\" (expected true or false)"), std::string::npos)
      << refusal(j);
}

// Import reads the rotary rows as config.json says they are stored: interleaved pairs where
// rope_interleave is true or absent (DeepSeek's own checkpoints), halves where it is false.
TEST(HfDeepseekV3, ImportSeesRopeInterleave) {
  const HfFormat& format = hf_deepseek_v3_format();
  ASSERT_NE(format.stored_tensors, nullptr);
  const std::string q_b = "model.layers.0.self_attn.q_b_proj.weight", kv_a = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight";
  for (const json& interleave : {json(), json(true), json(false)}) {
    json j = tiny_config();
    if (!interleave.is_null()) j["rope_interleave"] = interleave;
    const ModelSpec m = spec_of(j);
    std::map<std::string, HfTensor> by_hf;
    for (const HfTensor& t : format.stored_tensors(HfConfigReader(j, "config.json", deck_key_range), m))
      by_hf[t.hf] = t;
    const int64_t width = interleave == false ? 0 : 4;
    EXPECT_EQ(by_hf.at(q_b).rope_rows.width, width) << interleave;
    EXPECT_EQ(by_hf.at(kv_a).rope_rows.width, width) << interleave;
    EXPECT_EQ(by_hf.size(), hf_deepseek_v3_tensors(m).size());
  }
}

TEST(HfDeepseekV3, NamesEveryTensorWithItsRotaryRows) {
  const ModelSpec m = spec_of(tiny_config());
  std::map<std::string, HfTensor> by_hf;
  for (const HfTensor& t : hf_deepseek_v3_tensors(m)) by_hf[t.hf] = t;
  const std::string a = "model.layers.0.self_attn.", moe = "model.layers.1.mlp.";
  for (const char* name : {"q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
                           "kv_b_proj", "o_proj"})
    EXPECT_TRUE(by_hf.count(a + name + ".weight")) << name;
  EXPECT_FALSE(by_hf.count(a + "q_proj.weight"));
  EXPECT_TRUE(by_hf.count("model.layers.0.mlp.gate_proj.weight"));  // the dense first block
  EXPECT_FALSE(by_hf.count("model.layers.0.mlp.gate.weight"));
  EXPECT_TRUE(by_hf.count(moe + "gate.weight"));
  EXPECT_TRUE(by_hf.count(moe + "experts.7.down_proj.weight"));
  EXPECT_TRUE(by_hf.count(moe + "shared_experts.up_proj.weight"));
  EXPECT_EQ(by_hf[moe + "shared_experts.up_proj.weight"].hf_shape, (std::vector<int64_t>{16, 32}));
  const HfRopeRows q = by_hf[a + "q_b_proj.weight"].rope_rows, kv = by_hf[a + "kv_a_proj_with_mqa.weight"].rope_rows;
  EXPECT_EQ(q.block, 12);
  EXPECT_EQ(q.offset, 8);
  EXPECT_EQ(q.width, 4);
  EXPECT_EQ(kv.block, 20);
  EXPECT_EQ(kv.offset, 16);
  EXPECT_EQ(kv.width, 4);
  EXPECT_EQ(by_hf[a + "kv_b_proj.weight"].rope_rows.width, 0);

  json j = tiny_config();
  j["q_lora_rank"] = nullptr;
  std::map<std::string, HfTensor> direct;
  for (const HfTensor& t : hf_deepseek_v3_tensors(spec_of(j))) direct[t.hf] = t;
  EXPECT_FALSE(direct.count(a + "q_a_proj.weight"));
  EXPECT_EQ(direct[a + "q_proj.weight"].rope_rows.offset, 8);
}

// The routers' e_score_correction_bias is meshtrain's expert bias: one state tensor of E values
// for each mixture block (none for the dense first block), F32 on HF's side whatever the weights.
TEST(HfDeepseekV3, RoutersBiasIsTheExpertBiasState) {
  const ModelSpec m = spec_of(tiny_config());
  const std::vector<HfTensor> state = hf_deepseek_v3_format().state_tensors(m);
  ASSERT_EQ(state.size(), 2u);
  for (size_t i = 0; i < state.size(); ++i) {
    const std::string block = std::to_string(i + 1);
    EXPECT_EQ(state[i].hf, "model.layers." + block + ".mlp.gate.e_score_correction_bias");
    EXPECT_EQ(state[i].meshtrain, "h." + block + ".mlp.router.expert_bias");
    EXPECT_EQ(state[i].hf_shape, (std::vector<int64_t>{8}));
    EXPECT_EQ(state[i].meshtrain_shape, (std::vector<int64_t>{8}));
    EXPECT_TRUE(state[i].state);
  }
  for (const HfTensor& t : hf_deepseek_v3_tensors(m)) EXPECT_FALSE(t.state) << t.hf;
  // The softmax-routed families store no such state.
  for (const ModelFamily* f : model_registry()) {
    if (std::string(f->name) == "deepseek_v3") continue;
    EXPECT_EQ(f->hf->state_tensors, nullptr) << f->name;
  }
}

// Multi-token prediction depth k at layer index num_hidden_layers + k, as DeepSeek's checkpoints
// hold it: its own tensors, its block's under the main blocks' names (a mixture, with its rotary
// rows), and copies of the embedding and head, which export writes and import does not read.
TEST(HfDeepseekV3, MultiTokenPredictionAtTheLayerAfterTheLast) {
  json j = tiny_config();
  j["num_nextn_predict_layers"] = 1;
  const ModelSpec m = spec_of(j);
  EXPECT_EQ(m.mtp_layers, 1);
  std::map<std::string, HfTensor> by_hf;
  for (const HfTensor& t : hf_deepseek_v3_tensors(m)) by_hf[t.hf] = t;
  const std::pair<const char*, const char*> names[] = {
      {"model.layers.3.enorm.weight", "mtp.0.enorm.weight"},
      {"model.layers.3.hnorm.weight", "mtp.0.hnorm.weight"},
      {"model.layers.3.eh_proj.weight", "mtp.0.eh_proj.weight"},
      {"model.layers.3.shared_head.norm.weight", "mtp.0.norm.weight"},
      {"model.layers.3.embed_tokens.weight", "wte"},
      {"model.layers.3.shared_head.head.weight", "lm_head.weight"},
      {"model.layers.3.input_layernorm.weight", "mtp.0.block.ln_1.weight"},
      {"model.layers.3.self_attn.kv_b_proj.weight", "mtp.0.block.attn.kv_b.weight"},
      {"model.layers.3.mlp.gate.weight", "mtp.0.block.mlp.router.weight"},
      {"model.layers.3.mlp.experts.7.down_proj.weight", "mtp.0.block.mlp.experts.down.weight"},
      {"model.layers.3.mlp.shared_experts.up_proj.weight", "mtp.0.block.mlp.shared.up.weight"}};
  for (const auto& [hf, mine] : names) {
    ASSERT_TRUE(by_hf.count(hf)) << hf;
    EXPECT_EQ(by_hf[hf].meshtrain, mine) << hf;
  }
  EXPECT_EQ(by_hf["model.layers.3.eh_proj.weight"].hf_shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(by_hf["model.layers.3.self_attn.q_b_proj.weight"].rope_rows.width, 4);
  EXPECT_FALSE(by_hf.count("model.layers.4.enorm.weight"));
  const HfFormat& format = hf_deepseek_v3_format();
  std::set<std::string> read;
  for (const HfTensor& t : format.stored_tensors(HfConfigReader(j, "config.json", deck_key_range), m)) read.insert(t.hf);
  EXPECT_EQ(read.size(), by_hf.size() - 2);
  for (const char* copy : {"model.layers.3.embed_tokens.weight", "model.layers.3.shared_head.head.weight"}) {
    EXPECT_FALSE(read.count(copy)) << copy;
    EXPECT_TRUE(format.is_buffer(copy)) << copy;
  }
  EXPECT_FALSE(format.is_buffer("model.embed_tokens.weight"));
  // The depth's mixture routes by its own balancing bias, stored where DeepSeek keeps a layer's.
  const std::vector<HfTensor> state = format.state_tensors(m);
  ASSERT_EQ(state.size(), 3u);
  EXPECT_EQ(state[2].hf, "model.layers.3.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(state[2].meshtrain, "mtp.0.block.mlp.router.expert_bias");
}

TEST(HfDeepseekV3, FamilyDefaultsArePublishedDeepseekV3) {
  const ModelSpec d = family_defaults("deepseek_v3", ModelSpec{});
  EXPECT_TRUE(d.latent_attention());
  EXPECT_EQ(d.latent, (LatentSpec{1536, 512, 128, 64, 128}));
  EXPECT_EQ(d.moe.router, RouterKind::Sigmoid);
  EXPECT_EQ(d.moe.route_scale, 2.5);
  EXPECT_EQ(d.moe.groups, 8);
  EXPECT_EQ(d.moe.top_groups, 4);
  EXPECT_EQ(d.moe.top_k, 8);
  EXPECT_EQ(d.moe.first_dense_layers, 3);
  EXPECT_EQ(d.norm.eps, 1e-6);
  EXPECT_EQ(d.rope.theta, 1e4);
  EXPECT_FALSE(d.tie_embeddings);
}

}  // namespace
}  // namespace meshtrain
