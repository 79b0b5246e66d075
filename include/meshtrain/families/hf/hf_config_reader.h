#pragma once
// Reading a Hugging Face config.json as every family's mapping does (families/*/hf_*.cpp): its
// keys with transformers' defaults for absent (or null) ones, each refused with one message that
// names the file, the key, its value and what meshtrain accepts. Not the directory around it
// (app/hf_directory.h opens the files and the weights).
//
// A size becomes a deck key ("model.layers"), and a value the deck would refuse is refused here,
// blamed on config.json. The deck's ranges are config/'s, which sits above families/: whoever
// reads a config.json hands the reader the lookup (app/hf_directory.h: deck_key_range).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace meshtrain {

// A config.json value, or `fallback` (transformers' default) where the key is absent or null.
nlohmann::json json_value_or(const nlohmann::json& j, const char* key, nlohmann::json fallback);

// `v` as a 64-bit integer; nullopt when it is not an integer, or one beyond int64 (JSON's
// 2^64 - 1 is an integer too, which a plain get<int64_t>() would wrap to -1).
std::optional<int64_t> json_int64(const nlohmann::json& v);

// Throws std::runtime_error with `message` escaped whole (io/terminal_text.h): names and values
// from config.json and the weights come from whoever published the model, so that a NUL does
// not cut the message short and an escape sequence or a bidirectional control is shown, not obeyed.
[[noreturn]] void hf_refuse(const std::string& message);

// The integers a deck key accepts, from min to max.
struct DeckKeyRange {
  int64_t min = 0, max = 0;
};
// The range of a deck key named "section.key"; throws std::invalid_argument for a key that is no
// integer key of the deck.
using DeckKeyRangeOf = DeckKeyRange (*)(const std::string& deck_key);

class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& config, std::string path, DeckKeyRangeOf range_of)
      : j_(config), path_(std::move(path)), range_of_(range_of) {}
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
  // accepts, so that a value the deck would refuse is blamed on config.json.
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
  DeckKeyRangeOf range_of_;
};

}  // namespace meshtrain
