#pragma once
// Reading one JSON object of a file someone else made (private to src/io: the tokenizer.json
// reader's). Every field is asked for by name with the type it must have, and the keys nobody
// asked for are refused by name at the end: a field the reader does not apply never passes
// silently. Errors are DataErrors "<file>: <path>.<key> = <value> <problem>; expected <what>",
// the value shortened and made safe for a terminal.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>

namespace meshtrain {

// `value` as JSON text, at most about 80 characters (a vocabulary can be megabytes), with
// control characters escaped (io/terminal_text.h).
std::string short_json(const nlohmann::json& value);

class JsonFields {
 public:
  // DataError unless `object` is a JSON object; `path` is where it sits ("model").
  JsonFields(const nlohmann::json& object, std::string file, std::string path);

  // "<path>.<key>" ("model.dropout"); the key alone at the top level (path "").
  std::string path_of(const std::string& key) const;
  // The field, or nullptr where it is absent or null (the library's default then applies).
  const nlohmann::json* optional(const std::string& key);
  // The field, which must be present.
  const nlohmann::json& required(const std::string& key, const std::string& expected);
  std::optional<std::string> string(const std::string& key);
  std::optional<bool> boolean(const std::string& key);
  // A non-negative integer below `bound` (stated in the message as `bound_why`).
  std::optional<uint64_t> integer(const std::string& key, uint64_t bound, const std::string& bound_why);

  // Refuses the first key no one asked for: "<path>.<key> is not a field meshtrain applies".
  void refuse_unknown(const std::string& accepted) const;
  [[noreturn]] void fail(const std::string& key, const nlohmann::json& value,
                         const std::string& problem) const;

 private:
  const nlohmann::json& object_;
  std::string file_, path_;
  std::set<std::string> asked_;
};

}  // namespace meshtrain
