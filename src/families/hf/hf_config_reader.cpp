#include "meshtrain/families/hf/hf_config_reader.h"

#include <stdexcept>

#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

using nlohmann::json;

std::optional<int64_t> json_int64(const json& v) {
  // JSON's non-negative integers are unsigned: one above INT64_MAX would wrap in get<int64_t>().
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) return std::nullopt;
  return v.get<int64_t>();
}

json json_value_or(const json& j, const char* key, json fallback) {
  return j.contains(key) && !j[key].is_null() ? j[key] : fallback;
}

void hf_refuse(const std::string& message) { throw std::runtime_error(terminal_safe(message)); }

void HfConfigReader::refuse(const std::string& key, const json& value, const std::string& accepted) const {
  hf_refuse(path_ + ": " + key + " = " + value.dump() + " (" + accepted + ")");
}

int64_t HfConfigReader::integer(const json& obj, const char* key, int64_t fallback, int64_t min, int64_t max,
                                const std::string& prefix, const std::string& field) const {
  const json v = json_value_or(obj, key, fallback);
  const std::optional<int64_t> n = json_int64(v);
  if (!n || *n < min || *n > max)
    refuse(prefix + key, v,
           "expected an integer " + (max == INT64_MAX ? ">= " + std::to_string(min)
                                    : "from " + std::to_string(min) + " to " + std::to_string(max)) +
               (field.empty() ? "" : ", what meshtrain's " + field + " accepts"));
  return v.get<int64_t>();
}

int64_t HfConfigReader::deck_integer(const json& obj, const char* key, int64_t fallback, const std::string& deck_key,
                                     const std::string& prefix) const {
  const DeckKeyRange range = range_of_(deck_key);
  return integer(obj, key, fallback, range.min, range.max, prefix, deck_key);
}

double HfConfigReader::number(const json& obj, const char* key, double fallback, const std::string& prefix,
                              bool zero_allowed) const {
  const json v = json_value_or(obj, key, fallback);
  if (!v.is_number() || !(v.get<double>() > 0 || (zero_allowed && v.get<double>() == 0)))
    refuse(prefix + key, v, zero_allowed ? "expected a number >= 0" : "expected a number > 0");
  return v.get<double>();
}

bool HfConfigReader::boolean(const char* key, bool fallback) const {
  const json v = json_value_or(j_, key, fallback);
  if (!v.is_boolean()) refuse(key, v, "expected true or false");
  return v.get<bool>();
}

}  // namespace meshtrain
