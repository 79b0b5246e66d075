// The family registry (families/registry.h): every family found by its name and by each Hugging
// Face class it registers, each class written back by its export (architectures and model_type
// in config.json), and a class no family registers refused with the list of those that are.

#include "meshtrain/families/registry.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace meshtrain {
namespace {

using nlohmann::json;

ModelSpec sizes() { return gpt2_spec(2, 32, 4, 16, 64); }

std::string refusal(const json& config) {
  try {
    hf_family_of(config, "dir/config.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(FamilyRegistry, EveryFamilyIsFoundByItsName) {
  ASSERT_EQ(model_families().size(), model_registry().size());
  std::set<std::string> names;
  for (const ModelFamily* f : model_registry()) {
    EXPECT_EQ(&model_family(f->name), f);
    EXPECT_TRUE(names.insert(f->name).second) << f->name << " registered twice";
    const ModelSpec spec = family_defaults(f->name, sizes());
    EXPECT_EQ(spec.family, f->name);
    EXPECT_EQ(spec.layers, 2);
    EXPECT_EQ(spec.d_model, 32);
    EXPECT_EQ(spec.vocab_size, 64);
    EXPECT_NE(std::string(f->summary).find("\"" + std::string(f->name) + "\""), std::string::npos);
  }
  EXPECT_EQ(model_families(), (std::vector<std::string>{"gpt2", "llama", "qwen3", "deepseek_v3"}));
  EXPECT_THROW(model_family("mistral"), std::invalid_argument);
  EXPECT_THROW(family_defaults("", sizes()), std::invalid_argument);
}

TEST(FamilyRegistry, EveryArchitectureRoundTripsThroughItsFamily) {
  std::set<std::string> classes;
  for (const ModelFamily* f : model_registry()) {
    ASSERT_NE(f->hf, nullptr) << f->name;
    ASSERT_FALSE(f->hf_architectures.empty()) << f->name;
    for (const HfArchitecture& a : f->hf_architectures) {
      EXPECT_TRUE(classes.insert(a.name).second) << a.name << " registered by two families";
      // Read: by the class, and by model_type alone (a config.json without architectures).
      EXPECT_EQ(&hf_family_of(json{{"architectures", {a.name}}, {"model_type", a.model_type}}, "c"), f);
      EXPECT_EQ(&hf_family_of(json{{"model_type", a.model_type}}, "c"), f) << a.model_type;
      EXPECT_EQ(&hf_family_of(json{{"architectures", {"SomethingElse", a.name}}}, "c"), f) << a.name;
      // Written: the family's model with that feed-forward exports as that class.
      ModelSpec m = family_defaults(f->name, sizes());
      m.feed_forward = a.feed_forward;
      m.kv_heads_set = 2;
      m.ffn_hidden_set = 48;
      if (std::string(f->name) == "gpt2") m.kv_heads_set = 0;
      // MistralForCausalLM is the llama family's model with a sliding window on every layer.
      if (std::string(a.model_type) == "mistral") m.attention_window = {8};
      EXPECT_EQ(f->hf->architecture(m, "ck.h5"), a.name);
      const json config = json::parse(f->hf->config_json(m, HfExportOptions{"float32", "bytes", -1, -1}));
      EXPECT_EQ(config["architectures"], json::array({a.name}));
      EXPECT_EQ(config["model_type"], a.model_type);
      EXPECT_EQ(&hf_family_of(config, "out/config.json"), f);
      EXPECT_FALSE(f->hf->tensors(m).empty());
    }
  }
}

TEST(FamilyRegistry, UnknownArchitectureIsRefusedWithTheKnownOnes) {
  const std::string why = refusal({{"architectures", {"GemmaForCausalLM"}}, {"model_type", "gemma"}});
  EXPECT_NE(why.find("dir/config.json: architectures = [\"GemmaForCausalLM\"], model_type = \"gemma\""),
            std::string::npos)
      << why;
  for (const ModelFamily* f : model_registry())
    for (const HfArchitecture& a : f->hf_architectures) {
      EXPECT_NE(why.find(a.name), std::string::npos) << why;
      EXPECT_NE(why.find("\"" + std::string(a.model_type) + "\""), std::string::npos) << why;
    }
  // Without architectures: model_type alone, named as today's message named it.
  EXPECT_NE(refusal({{"model_type", "gemma"}}).find("dir/config.json: model_type = \"gemma\" (meshtrain imports"),
            std::string::npos);
  EXPECT_NE(refusal(json::object()).find("model_type = \"(absent)\""), std::string::npos);
  // What a stranger wrote is shown, not obeyed.
  const std::string escaped = refusal({{"architectures", {"X\x1b[31m"}}});
  EXPECT_EQ(escaped.find('\x1b'), std::string::npos) << escaped;
}

}  // namespace
}  // namespace meshtrain
