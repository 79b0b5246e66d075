// The Hugging Face Llama / Qwen 3 mapping and the shard writer: every parameter of the model's
// table under transformers' names (the fused qkv as three tensors), config.json read in both
// rope forms and refused where meshtrain computes something else, the config written back, and
// shards filled as save_pretrained fills them.

#include "meshtrain/families/llama/hf_llama.h"
#include "meshtrain/app/hf_shards.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "meshtrain/model/parameter_table.h"
#include "llama_spec_reading.h"

namespace meshtrain {
namespace {

using nlohmann::json;

json llama_config() {
  return json::parse(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": true, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
}

TEST(HfLlama, ReadsLlama3ConfigWithRopeScaling) {
  int64_t max_positions = 0;
  const ModelSpec m = read_spec(llama_config(), 32, max_positions);
  EXPECT_EQ(max_positions, 4096);
  EXPECT_EQ(m.family, "llama");
  EXPECT_EQ(m.kv_heads(), 2);
  EXPECT_EQ(m.head_dim(), 4);
  EXPECT_EQ(m.ffn_hidden(), 24);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_FALSE(m.linear_bias);
  EXPECT_EQ(m.rope.scaling, RopeScalingKind::Llama3);
  EXPECT_EQ(m.rope.factor, 32.0);
  EXPECT_EQ(m.rope.original_max_positions, 8192);
  EXPECT_EQ(m.rope.theta, 500000.0);
  EXPECT_EQ(m.norm.eps, 1e-5);
}

TEST(HfLlama, ReadsTheRopeParametersFormAndQwen3Defaults) {
  json j = llama_config();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["model_type"] = "qwen3";
  j["head_dim"] = 8;  // not hidden_size / heads
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  const ModelSpec m = spec_of(j);
  EXPECT_EQ(m.family, "qwen3");
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.head_dim(), 8);
  EXPECT_EQ(m.rope.theta, 1e6);
  EXPECT_EQ(m.rope.scaling, RopeScalingKind::None);
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 5e5}, {"factor", 8.0},
                          {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(spec_of(j).rope.scaling, RopeScalingKind::Llama3);
  EXPECT_EQ(spec_of(j).rope.theta, 5e5);
}

TEST(HfLlama, RefusesWhatMeshtrainDoesNotCompute) {
  json j = llama_config();
  j["rope_scaling"]["rope_type"] = "dynamic";
  EXPECT_NE(refusal(j).find("config.json: rope_scaling.rope_type = \"dynamic\""), std::string::npos) << refusal(j);
  j = llama_config();
  j["rope_scaling"].erase("factor");
  EXPECT_NE(refusal(j).find("rope_scaling.factor is missing"), std::string::npos) << refusal(j);
  j = llama_config();
  j["attention_bias"] = true;  // without mlp_bias: q/k/v/o only
  EXPECT_NE(refusal(j).find("mlp_bias = false (with attention_bias = true"), std::string::npos) << refusal(j);
  j["mlp_bias"] = true;
  EXPECT_TRUE(spec_of(j).linear_bias);
  j = llama_config();
  j["model_type"] = "gemma";
  EXPECT_NE(refusal(j).find("model_type = \"gemma\""), std::string::npos);
  j = llama_config();
  j["num_attention_heads"] = "4";
  EXPECT_NE(refusal(j).find("num_attention_heads = \"4\" (expected an integer from 1 to 65536"), std::string::npos);
}

TEST(HfLlama, MapsEveryParameterOnceAndTheFusedQkvAsThreeTensors) {
  for (const bool gqa : {true, false}) {
    json j = llama_config();
    j["num_key_value_heads"] = gqa ? 2 : 4;
    j["tie_word_embeddings"] = !gqa;
    const ModelSpec m = spec_of(j);
    std::set<std::string> params;
    for (const ParamEntry& e : parameter_table(m)) params.insert(e.name);
    std::map<std::string, std::vector<int64_t>> hf;
    std::set<std::string> covered;
    for (const HfTensor& t : hf_llama_tensors(m)) {
      EXPECT_TRUE(hf.emplace(t.hf, t.hf_shape).second) << t.hf << " twice";
      covered.insert(t.meshtrain);
    }
    EXPECT_EQ(covered, params);
    EXPECT_EQ(hf.at("model.embed_tokens.weight"), (std::vector<int64_t>{64, 16}));
    EXPECT_EQ(hf.at("model.layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{16, 16}));
    EXPECT_EQ(hf.at("model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{gqa ? 8 : 16, 16}));
    EXPECT_EQ(hf.at("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{16, 24}));
    EXPECT_EQ(hf.count("lm_head.weight"), gqa ? 1u : 0u);  // untied with GQA, tied without
    EXPECT_EQ(params.count("h.0.attn.qkv.weight"), gqa ? 0u : 1u);
  }
}

TEST(HfLlama, SlicesAndRestoresTheFusedQkv) {
  HfTensor k;
  k.meshtrain_shape = {3, 2, 2};
  k.hf_shape = {2, 2};
  k.parts = 3;
  k.part = 1;
  const std::vector<float> qkv = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(to_hf_layout(k, qkv), (std::vector<float>{4, 5, 6, 7}));
  std::vector<float> back;
  for (int part = 0; part < 3; ++part) {
    k.part = part;
    from_hf_layout(k, to_hf_layout(k, qkv), back);
  }
  EXPECT_EQ(back, qkv);
}

TEST(HfLlama, ConfigJsonReadsBackAsTheSameModel) {
  json j = llama_config();
  const ModelSpec m = spec_of(j);
  const json out = json::parse(hf_llama_config_json(m, "bfloat16", 1, 2));
  EXPECT_EQ(out["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(out["bos_token_id"], 1);
  EXPECT_EQ(out["max_position_embeddings"], 32);
  EXPECT_EQ(spec_of(out), m);
  EXPECT_TRUE(json::parse(hf_llama_config_json(m, "float32", -1, -1))["eos_token_id"].is_null());
  ModelSpec gelu = m;
  gelu.activation = ActivationKind::GeluTanh;
  EXPECT_THROW(hf_llama_architecture(gelu, "ck.h5"), std::runtime_error);
}

// Qwen 3 and Llama with rope_type "yarn", in rope_scaling and in transformers 5's
// rope_parameters: every key read, transformers' defaults where absent, written back.
TEST(HfLlama, ReadsAndWritesYarnInBothRopeForms) {
  json j = llama_config();
  j["model_type"] = "qwen3";
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}};
  ModelSpec m = spec_of(j);
  EXPECT_EQ(m.rope.scaling, RopeScalingKind::Yarn);
  EXPECT_EQ(m.rope.factor, 4.0);
  EXPECT_EQ(m.rope.original_max_positions, 1024);
  EXPECT_EQ(m.rope.beta_fast, 32.0);
  EXPECT_EQ(m.rope.beta_slow, 1.0);
  EXPECT_EQ(m.rope.mscale, 0.0);
  EXPECT_EQ(m.rope.attention_factor, 0.0);
  EXPECT_TRUE(m.rope.truncate);
  json out = json::parse(hf_llama_config_json(m, "float32", -1, -1));
  EXPECT_EQ(out["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "yarn");
  EXPECT_FALSE(out["rope_scaling"].contains("mscale"));  // absent stays absent
  EXPECT_EQ(spec_of(out), m);

  // transformers 5's form, every optional key given (DeepSeek-style mscales), on Llama.
  j = llama_config();
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40.0},
                          {"original_max_position_embeddings", 4096}, {"beta_fast", 16.0},
                          {"beta_slow", 2.0}, {"mscale", 0.707}, {"mscale_all_dim", 1.0},
                          {"attention_factor", 1.5}, {"truncate", false}};
  m = spec_of(j);
  EXPECT_EQ(m.family, "llama");
  EXPECT_EQ(m.rope.scaling, RopeScalingKind::Yarn);
  EXPECT_EQ(m.rope.mscale, 0.707);
  EXPECT_FALSE(m.rope.truncate);
  // Written back key for key (rope_theta beside it, as for every rope type).
  out = json::parse(hf_llama_config_json(m, "float32", -1, -1));
  json written = j["rope_parameters"];
  written.erase("rope_theta");
  EXPECT_EQ(out["rope_scaling"], written);
  EXPECT_EQ(out["rope_theta"], 10000.0);
  EXPECT_EQ(spec_of(out), m);

  // As transformers standardises: a top-level original_max_position_embeddings first, else
  // max_position_embeddings; a null factor is max_position_embeddings / original.
  j = llama_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", nullptr}};
  j["max_position_embeddings"] = 4096;
  m = spec_of(j);
  EXPECT_EQ(m.rope.original_max_positions, 4096);
  EXPECT_EQ(m.rope.factor, 1.0);
  j["original_max_position_embeddings"] = 1024;
  j["rope_scaling"]["original_max_position_embeddings"] = 2048;
  m = spec_of(j);
  EXPECT_EQ(m.rope.original_max_positions, 1024);
  EXPECT_EQ(m.rope.factor, 4.0);
}

TEST(HfLlama, RefusesYarnSettingsByName) {
  const auto refused = [](const json& rope, const std::string& words) {
    json j = llama_config();
    j["rope_scaling"] = rope;
    EXPECT_NE(refusal(j).find(words), std::string::npos) << refusal(j);
  };
  const json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}};
  json bad = yarn;
  bad["factor"] = 0.5;
  refused(bad, "config.json: rope_scaling.factor = 0.5 (YaRN stretches the context by a factor >= 1");
  bad = yarn;
  bad["beta_fast"] = 1.0;
  refused(bad, "config.json: rope_scaling.beta_fast = 1.0 (a number of turns above beta_slow = 1.0)");
  bad = yarn;
  bad["mscale"] = -1;
  refused(bad, "rope_scaling.mscale = -1 (expected a number >= 0)");
  bad = yarn;
  bad["truncate"] = "no";
  refused(bad, "rope_scaling.truncate = \"no\" (expected true or false)");
  bad = yarn;
  bad["original_max_position_embeddings"] = 0;
  refused(bad, "rope_scaling.original_max_position_embeddings = 0");
  for (const char* other : {"linear", "dynamic", "longrope"}) {
    bad = yarn;
    bad["rope_type"] = other;
    refused(bad, std::string("rope_scaling.rope_type = \"") + other + "\" (meshtrain computes rotary");
  }
}

TEST(HfShards, ParsesSizesAsTransformersDoes) {
  EXPECT_EQ(parse_shard_size("5GB"), 5000000000ull);
  EXPECT_EQ(parse_shard_size("500MB"), 500000000ull);
  EXPECT_EQ(parse_shard_size("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_shard_size("1234"), 1234ull);
  for (const char* bad : {"", "GB", "0", "5 GB", "5gb", "-1", "1.5GB"}) EXPECT_EQ(parse_shard_size(bad), 0u) << bad;
}

TEST(HfShards, FillsShardsInOrderAndWritesTheIndex) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "meshtrain_hf_shards_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // 40, 40, 100 (alone: above the limit), 8 bytes with a limit of 80.
  const std::vector<HfWeightSpec> tensors = {{"a", SafeDType::F32, {10}}, {"b", SafeDType::F32, {10}},
                                             {"c", SafeDType::F32, {25}}, {"d", SafeDType::F32, {2}}};
  auto bytes = [&](size_t i) { return std::vector<char>(tensors[i].bytes(), static_cast<char>(i)); };
  const auto files = write_hf_weights(dir.string(), tensors, bytes, {{"format", "pt"}}, 80);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  std::ifstream in(dir / "model.safetensors.index.json");
  const json index = json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], 188);
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00003-of-00003.safetensors");
  const SafetensorsFile third = SafetensorsFile::open((dir / "model-00003-of-00003.safetensors").string());
  ASSERT_EQ(third.tensors().size(), 1u);
  EXPECT_EQ(third.read_raw(third.tensors()[0]), std::vector<char>(8, 3));
  // Everything in one shard: model.safetensors alone, as HF writes it.
  EXPECT_EQ(write_hf_weights(dir.string(), tensors, bytes, {}, 1000), std::vector<std::string>{"model.safetensors"});
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain
