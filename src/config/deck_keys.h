#pragma once
// The builders of deck keys (deck_schema.h's KeySpec): one per kind of value, each checking the
// type and range and storing into Config. Shared by the schema's files (deck_schema.cpp, the
// [model] keys in model_keys.cpp).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "deck_schema.h"
#include "toml_value.h"

namespace meshtrain::deck_keys {

// ---- key builders --------------------------------------------------------------------------

// The largest value a field of type T holds, as an int64_t (uint64_t's beyond INT64_MAX is out
// of TOML's reach anyway).
template <class T>
constexpr int64_t largest_of() {
  if constexpr (std::numeric_limits<T>::max() > static_cast<uint64_t>(INT64_MAX)) return INT64_MAX;
  else return static_cast<int64_t>(std::numeric_limits<T>::max());
}

// "integer >= lo" when only TOML's own 64 bits bound the key, else "integer from lo to hi".
inline std::string integer_range(int64_t lo, int64_t hi) {
  if (hi == INT64_MAX) return "integer >= " + std::to_string(lo);
  return "integer from " + std::to_string(lo) + " to " + std::to_string(hi);
}

// An integer key stored in the field `field(config)` returns. The key's range is capped by the
// field's type, so a value is refused rather than narrowed (train.steps = 2^32 + 1 once trained
// one step): no key can accept what its field cannot hold.
// `default_text`: the default as the reference shows it ("heads" for one derived from others).
template <class Field>
KeySpec int_key(std::string sec, std::string key, std::string default_text, int64_t lo, int64_t hi,
                std::string doc, Field field) {
  using T = std::remove_reference_t<decltype(field(std::declval<Config&>()))>;
  hi = std::min(hi, largest_of<T>());
  KeySpec spec{sec, key, "integer", std::move(default_text), integer_range(lo, hi), std::move(doc),
               [=](const toml::node& n, Config& c) -> std::string {
                 if (!n.is_integer()) return "is " + toml_type_of(n);
                 const int64_t v = n.as_integer()->get();
                 if (v < lo || v > hi) return "is out of range";
                 field(c) = static_cast<T>(v);
                 return "";
               }};
  spec.min = lo;
  spec.max = hi;
  return spec;
}

template <class Field>
KeySpec int_key(std::string sec, std::string key, int64_t def, int64_t lo, int64_t hi,
                std::string doc, Field field) {
  return int_key(std::move(sec), std::move(key), std::to_string(def), lo, hi, std::move(doc),
                 field);
}

// A TOML number as a double: "" and `v` set, or why not ("is a string", "is not a finite number").
// inf passes any lower bound (train.eps = inf made every update zero); NaN passes nothing.
inline std::string finite_number(const toml::node& n, double& v) {
  if (n.is_floating_point()) v = n.as_floating_point()->get();
  else if (n.is_integer()) v = static_cast<double>(n.as_integer()->get());
  else return "is " + toml_type_of(n);
  return std::isfinite(v) ? "" : "is not a finite number";
}

// A ratio against a median that is either off (0) or above 1 (at or below 1 it would fire on
// about half of what it watches), below `hi`.
template <class Set>
KeySpec ratio_key(std::string sec, std::string key, std::string def, double hi, std::string doc,
                  Set set) {
  return {sec, key, "float", def, "0 (off) or a number > 1", std::move(doc),
          [=](const toml::node& n, Config& c) -> std::string {
            double v;
            if (std::string why = finite_number(n, v); !why.empty()) return why;
            if (!(v == 0.0 || (v > 1.0 && v < hi))) return "is out of range";
            set(c, v);
            return "";
          }};
}

template <class Set>
KeySpec float_key(std::string sec, std::string key, std::string def, double lo, bool lo_open,
                  std::string doc, Set set) {
  std::ostringstream acc;
  acc << "finite number " << (lo_open ? "> " : ">= ") << lo;
  return {sec, key, "float", def, acc.str(), std::move(doc),
          [=](const toml::node& n, Config& c) -> std::string {
            double v;
            if (std::string why = finite_number(n, v); !why.empty()) return why;
            if (lo_open ? v <= lo : v < lo) return "is out of range";
            set(c, v);
            return "";
          }};
}

// A coefficient with a sensible ceiling: accepted from lo to hi inclusive. A value far past it
// (model.moe_aux_loss = 1e300) is finite, so float_key let it through, and training then
// diverged with advice about train.lr that did not name the key at fault.
template <class Set>
KeySpec bounded_float_key(std::string sec, std::string key, std::string def, double lo, double hi,
                          std::string doc, Set set) {
  std::ostringstream acc;
  acc << "finite number from " << lo << " to " << hi;
  return {sec, key, "float", def, acc.str(), std::move(doc),
          [=](const toml::node& n, Config& c) -> std::string {
            double v;
            if (std::string why = finite_number(n, v); !why.empty()) return why;
            if (v < lo || v > hi) return "is out of range";
            set(c, v);
            return "";
          }};
}

template <class Set>
KeySpec bool_key(std::string sec, std::string key, bool def, std::string doc, Set set) {
  return {sec, key, "boolean", def ? "true" : "false", "true or false", std::move(doc),
          [=](const toml::node& n, Config& c) -> std::string {
            if (!n.is_boolean()) return "is " + toml_type_of(n);
            set(c, n.as_boolean()->get());
            return "";
          }};
}

template <class Set>
KeySpec choice_key(std::string sec, std::string key, std::string def,
                   std::vector<std::string> choices, std::string doc, Set set) {
  std::string accepted = "one of";
  for (size_t i = 0; i < choices.size(); ++i) accepted += (i ? ", \"" : " \"") + choices[i] + "\"";
  return {sec, key, "string", "\"" + def + "\"", accepted, std::move(doc),
          [=](const toml::node& n, Config& c) -> std::string {
            if (!n.is_string()) return "is " + toml_type_of(n);
            const std::string v = n.as_string()->get();
            if (std::find(choices.begin(), choices.end(), v) == choices.end())
              return "is not a known value";
            set(c, v);
            return "";
          }};
}

// An integer key that also takes "auto" (left to the strategy advisor): `is_auto(config)` is
// the flag, `field(config)` the value, `placeholder` until the advisor settles it. The range is
// capped by the field's type, as int_key's.
template <class Field, class AutoFlag>
KeySpec int_or_auto_key(std::string sec, std::string key, std::string def, int64_t lo, int64_t hi,
                        std::string doc, Field field, AutoFlag is_auto, int64_t placeholder) {
  using T = std::remove_reference_t<decltype(field(std::declval<Config&>()))>;
  hi = std::min(hi, largest_of<T>());
  return {sec, key, "integer or \"auto\"", def, integer_range(lo, hi) + ", or \"auto\"",
          std::move(doc),
          [=](const toml::node& n, Config& c) -> std::string {
            if (auto s = n.as_string()) {
              if (s->get() != "auto") return "is not a known value";
              is_auto(c) = true;
              field(c) = static_cast<T>(placeholder);
              return "";
            }
            if (!n.is_integer()) return "is " + toml_type_of(n);
            const int64_t v = n.as_integer()->get();
            if (v < lo || v > hi) return "is out of range";
            is_auto(c) = false;
            field(c) = static_cast<T>(v);
            return "";
          }};
}

template <class Set>
KeySpec string_key(std::string sec, std::string key, std::string def, std::string accepted,
                   std::string doc, std::function<bool(const std::string&)> valid, Set set) {
  return {sec, key, "string", def, accepted, std::move(doc),
          [=](const toml::node& n, Config& c) -> std::string {
            if (!n.is_string()) return "is " + toml_type_of(n);
            const std::string v = n.as_string()->get();
            if (!valid(v)) return "is not valid";
            set(c, v);
            return "";
          }};
}

inline bool nonempty(const std::string& s) { return !s.empty(); }


}  // namespace meshtrain::deck_keys
