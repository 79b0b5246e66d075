#include "json_fields.h"

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

namespace {
constexpr size_t kShort = 80;

// Depth-limited, so that neither a deeply nested value (recursion) nor a large one (the whole
// vocabulary) is written out in full.
void append_short(std::string& out, const nlohmann::json& v, int depth) {
  const bool array = v.is_array();
  if (!array && !v.is_object()) {
    out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return;
  }
  if (v.empty() || depth >= 3) {
    out += v.empty() ? (array ? "[]" : "{}") : (array ? "[...]" : "{...}");
    return;
  }
  out += array ? "[" : "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += ", ";
    first = false;
    if (out.size() > kShort) {
      out += "...";
      break;
    }
    if (!array) out += nlohmann::json(it.key()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ": ";
    append_short(out, *it, depth + 1);
  }
  out += array ? "]" : "}";
}
}  // namespace

std::string short_json(const nlohmann::json& value) {
  std::string text;
  append_short(text, value, 0);
  if (text.size() > kShort) {
    size_t cut = kShort - 8;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text = text.substr(0, cut) + " ...";
  }
  return terminal_safe(text);
}

JsonFields::JsonFields(const nlohmann::json& object, std::string file, std::string path)
    : object_(object), file_(std::move(file)), path_(std::move(path)) {
  if (!object.is_object())
    throw DataError(file_, (path_.empty() ? std::string("the file") : path_) + " is " +
                               short_json(object) + ", expected a JSON object");
}

std::string JsonFields::path_of(const std::string& key) const {
  return path_.empty() ? terminal_safe(key) : path_ + "." + terminal_safe(key);
}

const nlohmann::json* JsonFields::optional(const std::string& key) {
  asked_.insert(key);
  const auto it = object_.find(key);
  return it == object_.end() || it->is_null() ? nullptr : &*it;
}

const nlohmann::json& JsonFields::required(const std::string& key, const std::string& expected) {
  const nlohmann::json* value = optional(key);
  if (value == nullptr)
    throw DataError(file_, path_of(key) + " is missing; expected " + expected);
  return *value;
}

std::optional<std::string> JsonFields::string(const std::string& key) {
  const nlohmann::json* value = optional(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) fail(key, *value, "is not a string");
  return value->get<std::string>();
}

std::optional<bool> JsonFields::boolean(const std::string& key) {
  const nlohmann::json* value = optional(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) fail(key, *value, "is not true or false");
  return value->get<bool>();
}

std::optional<uint64_t> JsonFields::integer(const std::string& key, uint64_t bound,
                                            const std::string& bound_why) {
  const nlohmann::json* value = optional(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number_unsigned() || value->get<uint64_t>() >= bound)
    fail(key, *value, "is out of range; expected an integer from 0 below " +
                          std::to_string(bound) + " (" + bound_why + ")");
  return value->get<uint64_t>();
}

void JsonFields::refuse_unknown(const std::string& accepted) const {
  for (const auto& [key, value] : object_.items())
    if (!asked_.count(key))
      throw DataError(file_, path_of(key) + " = " + short_json(value) +
                                 " is not a field meshtrain applies (" + accepted + ")");
}

void JsonFields::fail(const std::string& key, const nlohmann::json& value,
                      const std::string& problem) const {
  throw DataError(file_, path_of(key) + " = " + short_json(value) + " " + problem);
}

}  // namespace meshtrain
