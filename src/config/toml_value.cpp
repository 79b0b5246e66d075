#include "toml_value.h"

#include <charconv>
#include <sstream>

#include "meshtrain/config/deck_error.h"

namespace meshtrain {

toml::table parse_toml(const std::string& text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw DeckError(path + ":" + std::to_string(e.source().begin.line) + ": not valid TOML: " +
                    std::string(e.description()));
  }
}

std::string toml_type_of(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

std::string exact_number(double v) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, result.ptr);
}

std::string toml_repr(const toml::node& n) {
  if (auto s = n.as_string()) return '"' + s->get() + '"';
  if (auto f = n.as_floating_point()) return exact_number(f->get());
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto a = n.as_array()) {
    std::string out = "[";
    for (size_t k = 0; k < a->size(); ++k) out += (k ? ", " : "") + toml_repr(*a->get(k));
    return out + "]";
  }
  if (n.is_table()) return "{...}";
  std::ostringstream os;
  n.visit([&](auto&& v) { os << v; });
  return os.str();
}

}  // namespace meshtrain
