#pragma once
// Reading a Hugging Face model directory, as save_pretrained writes it, whatever the model:
// its JSON files (config.json, the tokenizer's) and its weights, one `model.safetensors` or the
// shards a `model.safetensors.index.json` names, for `meshtrain import` (app/import_command.cpp);
// what config.json and the tensors mean is the family's (families/*/hf_*.h, families/registry.h).
//
// The index comes from whoever published the model: every shard it names must lie inside the
// directory (a relative path without "..", not a symbolic link that leads out of it), as every
// reader of meshtrain opens only the files it was given (io/regular_file.h).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/families/hf/hf_config_reader.h"
#include "meshtrain/io/safetensors.h"

namespace meshtrain {

// The JSON object in `path`; throws std::runtime_error naming the file, saying what it is for
// (`what`: "config.json says what the tensors alone do not") when it is missing, not a regular
// file, not valid JSON or not an object.
nlohmann::json read_json_object(const std::string& path, const std::string& what);

// "" when `path` (a file named inside the HF directory `dir`) does not exist or ends inside `dir`
// once every symbolic link is followed; else where it leads ("nowhere" for a dangling link).
// A downloaded directory's links are the publisher's: none may lead meshtrain out of it.
std::string hf_link_outside(const std::string& dir, const std::string& path);

// The range the deck gives an integer key "section.key" (config/deck.h), for HfConfigReader
// (families/hf/hf_config_reader.h): what a config.json value becomes must be a value the deck takes.
DeckKeyRange deck_key_range(const std::string& deck_key);

struct HfStoredTensor {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

class HfWeights {
 public:
  // `dir`/model.safetensors when there is one (as transformers prefers it), else the shards of
  // `dir`/model.safetensors.index.json. Throws naming the file: neither present, an index whose
  // weight_map is not {tensor: file}, a shard outside `dir`, a tensor the index places in a
  // shard that lacks it, a tensor in a shard the index does not list, or a damaged safetensors
  // file (io/safetensors.h).
  static HfWeights open(const std::string& dir);

  // Every tensor by its stored name.
  const std::map<std::string, HfStoredTensor>& tensors() const { return tensors_; }
  // "DIR/model.safetensors" or "DIR/model.safetensors.index.json": what messages name.
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, HfStoredTensor> tensors_;
};

}  // namespace meshtrain
