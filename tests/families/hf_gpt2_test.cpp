// The Hugging Face GPT-2 mapping: every parameter of the model's table, once, under
// transformers' names, shapes and order (tied and untied), the QKV weight's columns in c_attn's
// order ([q | k | v], heads contiguous), and the config.json keys transformers reads.

#include "meshtrain/families/gpt2/hf_gpt2.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "meshtrain/model/parameter_table.h"

namespace meshtrain {
namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ModelSpec small(bool tied) {
  ModelSpec m;
  m.layers = 3;
  m.d_model = 8;
  m.heads = 2;
  m.seq_len = 5;
  m.vocab_size = 11;
  m.tie_embeddings = tied;
  return m;
}

TEST(HfGpt2, MapsEveryParameterOfTheTableOnceInHfOrder) {
  for (bool tied : {true, false}) {
    const ModelSpec m = small(tied);
    const std::vector<ParamEntry> table = parameter_table(m);
    const auto tensors = hf_gpt2_tensors(m);
    ASSERT_EQ(tensors.size(), table.size()) << "tied " << tied;
    std::set<std::string> names;
    int64_t total = 0;
    for (const HfTensor& t : tensors) {
      const auto e = std::find_if(table.begin(), table.end(),
                                  [&](const ParamEntry& p) { return p.name == t.meshtrain; });
      ASSERT_NE(e, table.end()) << t.meshtrain;
      EXPECT_TRUE(names.insert(t.meshtrain).second) << t.meshtrain << " twice";
      EXPECT_EQ(numel(t.meshtrain_shape), e->numel()) << t.meshtrain;
      EXPECT_EQ(numel(t.hf_shape), e->numel()) << t.meshtrain;
      total += numel(t.hf_shape);
    }
    EXPECT_EQ(total, m.parameter_count());
  }
  // transformers' GPT2LMHeadModel order, names and shapes for one block (C = 8, V = 11, T = 5).
  ModelSpec one = small(false);
  one.layers = 1;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"transformer.wte.weight", {11, 8}},        {"transformer.wpe.weight", {5, 8}},
      {"transformer.h.0.ln_1.weight", {8}},       {"transformer.h.0.ln_1.bias", {8}},
      {"transformer.h.0.attn.c_attn.weight", {8, 24}}, {"transformer.h.0.attn.c_attn.bias", {24}},
      {"transformer.h.0.attn.c_proj.weight", {8, 8}},  {"transformer.h.0.attn.c_proj.bias", {8}},
      {"transformer.h.0.ln_2.weight", {8}},       {"transformer.h.0.ln_2.bias", {8}},
      {"transformer.h.0.mlp.c_fc.weight", {8, 32}},    {"transformer.h.0.mlp.c_fc.bias", {32}},
      {"transformer.h.0.mlp.c_proj.weight", {32, 8}},  {"transformer.h.0.mlp.c_proj.bias", {8}},
      {"transformer.ln_f.weight", {8}},           {"transformer.ln_f.bias", {8}},
      {"lm_head.weight", {11, 8}},
  };
  const auto got = hf_gpt2_tensors(one);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].hf, want[i].first) << i;
    EXPECT_EQ(got[i].hf_shape, want[i].second) << want[i].first;
    EXPECT_EQ(got[i].transpose, got[i].hf.find("_proj.weight") != std::string::npos ||
                                    got[i].hf.find("c_attn.weight") != std::string::npos ||
                                    got[i].hf.find("c_fc.weight") != std::string::npos)
        << want[i].first;
  }
  EXPECT_EQ(got[2].meshtrain, "h.0.ln_1.weight");
  EXPECT_EQ(got[4].meshtrain, "h.0.attn.qkv.weight");
  EXPECT_EQ(got[4].meshtrain_shape, (std::vector<int64_t>{3, 8, 8}));
}

TEST(HfGpt2, QkvColumnsAreQueryKeyValueWithHeadsContiguous) {
  const ModelSpec m = small(true);
  const int64_t C = m.d_model, HS = m.head_dim();
  const auto tensors = hf_gpt2_tensors(m);
  const HfTensor& qkv = *std::find_if(tensors.begin(), tensors.end(),
                                      [](const HfTensor& t) { return t.meshtrain == "h.1.attn.qkv.weight"; });
  EXPECT_EQ(qkv.hf, "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(qkv.hf_shape, (std::vector<int64_t>{C, 3 * C}));
  ASSERT_TRUE(qkv.transpose);
  // meshtrain (which, out, in): value encodes (which, head, d, in).
  std::vector<float> w(3 * C * C), out(w.size());
  for (int64_t k = 0; k < 3; ++k)
    for (int64_t o = 0; o < C; ++o)
      for (int64_t i = 0; i < C; ++i)
        w[(k * C + o) * C + i] = static_cast<float>(1000 * k + 100 * (o / HS) + 10 * (o % HS) + i);
  transpose_2d(w.data(), out.data(), 3 * C, C);
  // HF Conv1D: y[j] = sum_i x[i] W[i][j]; column j = k C + h HS + d (GPT2Attention.split_heads).
  for (int64_t i = 0; i < C; ++i)
    for (int64_t j = 0; j < 3 * C; ++j) {
      const int64_t k = j / C, h = (j % C) / HS, d = j % HS;
      ASSERT_EQ(out[i * 3 * C + j], static_cast<float>(1000 * k + 100 * h + 10 * d + i)) << i << " " << j;
    }
}

TEST(HfGpt2, ConfigJsonDescribesGpt2LMHeadModel) {
  const ModelSpec m = small(false);
  const nlohmann::json j = nlohmann::json::parse(hf_gpt2_config_json(m, "bfloat16"));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_layer"], 3);
  EXPECT_EQ(j["n_embd"], 8);
  EXPECT_EQ(j["n_head"], 2);
  EXPECT_EQ(j["n_positions"], 5);
  EXPECT_EQ(j["vocab_size"], 11);
  EXPECT_EQ(j["n_inner"], 32);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) EXPECT_EQ(j[p], 0.0) << p;
  EXPECT_TRUE(j["bos_token_id"].is_null());
  EXPECT_TRUE(j["eos_token_id"].is_null());
  ModelSpec gpt2 = small(true);
  gpt2.vocab_size = 50257;
  const nlohmann::json k = nlohmann::json::parse(hf_gpt2_config_json(gpt2, "float32", "gpt2-bpe"));
  EXPECT_EQ(k["bos_token_id"], 50256);
  EXPECT_EQ(k["eos_token_id"], 50256);
}

}  // namespace
}  // namespace meshtrain
