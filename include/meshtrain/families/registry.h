#pragma once
// The model families meshtrain builds, each one record (families/model_family.h) registered here
// (src/families/registry.cpp: one line per family). The deck's model.family, import's
// config.json and export's checkpoint find their family through these functions and nowhere else.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/families/model_family.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// Every family, in the order the reference lists them.
const std::vector<const ModelFamily*>& model_registry();
// Their names (model.family's choices).
const std::vector<std::string>& model_families();
// The family named `name`; throws std::invalid_argument for a name not in model_families().
const ModelFamily& model_family(const std::string& name);
// The family's defaults for every field but the sizes (layers, d_model, heads, seq_len,
// vocab_size), which a deck gives; `sizes` supplies them. Throws as model_family.
ModelSpec family_defaults(const std::string& family, const ModelSpec& sizes);

// The family of the Hugging Face model `config` (config.json, read from `path`) describes: the
// first entry of its `architectures` a family registers, else (a config.json without a known
// class, such as a base model's) its `model_type`. Throws std::runtime_error naming the file,
// both keys, their values and every class meshtrain imports.
const ModelFamily& hf_family_of(const nlohmann::json& config, const std::string& path);

}  // namespace meshtrain
