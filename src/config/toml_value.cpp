#include "toml_value.h"

#include <charconv>
#include <cstdio>
#include <sstream>

#include "meshtrain/config/deck_error.h"

namespace meshtrain {

toml::table parse_toml(const std::string& text, const std::string& path) {
  try {
    toml::table root = toml::parse(text, path);
    refuse_nul_characters(root, [&](const toml::source_region& at, const std::string&) {
      return at.begin.line ? path + ":" + std::to_string(at.begin.line) : path;
    });
    return root;
  } catch (const toml::parse_error& e) {
    throw DeckError(path + ":" + std::to_string(e.source().begin.line) + ": not valid TOML: " +
                    std::string(e.description()));
  }
}

std::string escape_control(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", u);
      out += code;
    } else {
      out += ch;
    }
  }
  return out;
}

namespace {

void refuse_nul_in(const toml::node& n, const std::string& name,
                   const ValueOrigin& where) {
  const std::string accepted = " (expected text without NUL characters)";
  if (const auto* s = n.as_string()) {
    const std::string& v = s->get();
    if (v.find('\0') != std::string::npos)
      throw DeckError(where(n.source(), name) + ": " + name + " = \"" + escape_control(v) +
                      "\" holds a NUL character (\\u0000), which would cut it short at \"" +
                      escape_control(v.substr(0, v.find('\0'))) + "\"" + accepted);
  } else if (const auto* a = n.as_array()) {
    for (size_t i = 0; i < a->size(); ++i)
      refuse_nul_in(*a->get(i), name + "[" + std::to_string(i) + "]", where);
  } else if (const auto* t = n.as_table()) {
    for (auto&& [key, value] : *t) {
      const std::string k(key.str());
      const std::string full = name.empty() ? k : name + "." + k;
      if (k.find('\0') != std::string::npos)
        throw DeckError(where(key.source(), full) + ": the key \"" + escape_control(full) +
                        "\" holds a NUL character (\\u0000)" + accepted);
      refuse_nul_in(value, full, where);
    }
  }
}

}  // namespace

void refuse_nul_characters(const toml::table& root,
                           const ValueOrigin& where) {
  refuse_nul_in(root, "", where);
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
  if (auto s = n.as_string()) return '"' + escape_control(s->get()) + '"';
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
