#include "meshtrain/families/registry.h"

#include <stdexcept>

#include "meshtrain/families/deepseek_v3/deepseek_v3_family.h"
#include "meshtrain/families/gpt2/gpt2_family.h"
#include "meshtrain/families/llama/llama_family.h"
#include "meshtrain/families/qwen3/qwen3_family.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

using nlohmann::json;

const std::vector<const ModelFamily*>& model_registry() {
  // One line per family (docs/architecture.md, "Adding a model family").
  static const std::vector<const ModelFamily*> registry = {
      &gpt2_family(),
      &llama_family(),
      &qwen3_family(),
      &deepseek_v3_family(),
  };
  return registry;
}

const std::vector<std::string>& model_families() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ModelFamily* f : model_registry()) out.push_back(f->name);
    return out;
  }();
  return names;
}

const ModelFamily& model_family(const std::string& name) {
  for (const ModelFamily* f : model_registry())
    if (name == f->name) return *f;
  throw std::invalid_argument("unknown model family '" + name + "'");
}

ModelSpec family_defaults(const std::string& family, const ModelSpec& sizes) {
  const ModelFamily& f = model_family(family);
  // ModelSpec's own defaults (GPT-2's) of the given sizes, then the family's over them.
  ModelSpec spec = gpt2_spec(sizes.layers, sizes.d_model, sizes.heads, sizes.seq_len, sizes.vocab_size);
  f.apply_defaults(spec);
  spec.family = f.name;
  return spec;
}

namespace {

// "GPT2LMHeadModel (model_type \"gpt2\"), ... and Qwen3MoeForCausalLM (\"qwen3_moe\")".
std::string known_architectures() {
  std::vector<std::string> all;
  for (const ModelFamily* f : model_registry())
    for (const HfArchitecture& a : f->hf_architectures)
      all.push_back(std::string(a.name) + " (" + (all.empty() ? "model_type " : "") + json(a.model_type).dump() + ")");
  std::string s;
  for (size_t i = 0; i < all.size(); ++i) s += (i == 0 ? "" : i + 1 == all.size() ? " and " : ", ") + all[i];
  return s;
}

const ModelFamily* family_with(const std::string& value, bool by_model_type) {
  for (const ModelFamily* f : model_registry())
    for (const HfArchitecture& a : f->hf_architectures)
      if (value == (by_model_type ? a.model_type : a.name)) return f;
  return nullptr;
}

}  // namespace

const ModelFamily& hf_family_of(const json& config, const std::string& path) {
  const json architectures = config.contains("architectures") ? config["architectures"] : json();
  if (architectures.is_array())
    for (const json& a : architectures)
      if (a.is_string())
        if (const ModelFamily* f = family_with(a.get<std::string>(), false)) return *f;
  const json type = config.contains("model_type") && !config["model_type"].is_null() ? config["model_type"]
                                                                                       : json("(absent)");
  if (type.is_string())
    if (const ModelFamily* f = family_with(type.get<std::string>(), true)) return *f;
  // Both values come from whoever published the model: escaped whole.
  throw std::runtime_error(terminal_safe(
      path + ": " + (architectures.is_null() ? "" : "architectures = " + architectures.dump() + ", ") +
      "model_type = " + type.dump() + " (meshtrain imports " + known_architectures() + ")"));
}

}  // namespace meshtrain
