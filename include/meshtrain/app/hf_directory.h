#pragma once
// Reading a Hugging Face model directory, as save_pretrained writes it, whatever the model:
// its JSON files (config.json, the tokenizer's) and its weights, one `model.safetensors` or the
// shards a `model.safetensors.index.json` names. Shared by the GPT-2 and Llama/Qwen imports
// (app/import_command.cpp); the tensor names are the families' (app/hf_gpt2.h, app/hf_llama.h).
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

// A config.json value, or `fallback` (transformers' default) where the key is absent or null.
nlohmann::json json_value_or(const nlohmann::json& j, const char* key, nlohmann::json fallback);

// `v` as a 64-bit integer; nullopt when it is not an integer, or one beyond int64 (JSON's
// 2^64 - 1 is an integer too, which a plain get<int64_t>() would wrap to -1).
std::optional<int64_t> json_int64(const nlohmann::json& v);

// config.json's keys read with transformers' defaults for absent (or null) ones, each refused
// with one message naming the file, the key, its value and what meshtrain accepts. Shared by
// every family's config reader (app/hf_llama.cpp, app/hf_moe.cpp).
class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& config, std::string path) : j_(config), path_(std::move(path)) {}
  const nlohmann::json& config() const { return j_; }
  const std::string& path() const { return path_; }
  // Throws "<path>: <key> = <value> (<accepted>)".
  [[noreturn]] void refuse(const std::string& key, const nlohmann::json& value,
                           const std::string& accepted) const;
  // An integer from min to max of `obj` (config.json itself, or a nested object named by
  // `prefix`): anything else is refused, never narrowed (num_hidden_layers = 2^32 + 2 is not 2).
  int64_t integer(const nlohmann::json& obj, const char* key, int64_t fallback, int64_t min, int64_t max,
                  const std::string& prefix = "", const std::string& field = "") const;
  // An integer that becomes the deck key `deck_key` ("model.layers"): the range that key
  // accepts (config/deck.h), so that a value the deck would refuse is blamed on config.json.
  int64_t deck_integer(const nlohmann::json& obj, const char* key, int64_t fallback, const std::string& deck_key,
                       const std::string& prefix = "") const;
  int64_t deck_integer(const char* key, int64_t fallback, const std::string& deck_key) const {
    return deck_integer(j_, key, fallback, deck_key);
  }
  // A number > 0, or >= 0 where `zero_allowed`.
  double number(const nlohmann::json& obj, const char* key, double fallback, const std::string& prefix = "",
                bool zero_allowed = false) const;
  bool boolean(const char* key, bool fallback = false) const;

 private:
  const nlohmann::json& j_;
  std::string path_;
};

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
