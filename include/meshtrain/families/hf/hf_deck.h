#pragma once
// The deck `meshtrain import --format hf` builds for a Hugging Face model of any family
// (app/import_command.cpp), from the spec the family's HfFormat read from config.json.

#include <string>

#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// A deck whose [model] is `m` (its family, the sizes, every field that differs from the
// family's defaults), training on the built-in corpus with fine-tuning's learning rates, the
// tokenizer `tokenizer` ("bytes" or a path); `source` names the model in its comments.
std::string hf_deck_text(const ModelSpec& m, const std::string& tokenizer, const std::string& source);

}  // namespace meshtrain
