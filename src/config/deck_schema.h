#pragma once
// The deck's schema: one entry per key, with its type, default, what it accepts, its meaning, and
// how it is stored into Config (parse_deck applies it; `meshtrain keys` prints it as the
// deck reference, docs/deck-reference.md). Private to src/config.

#include <toml++/toml.h>

#include <functional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct KeySpec {
  std::string section, key;
  std::string type;         // as the reference shows it: "integer", "float", "string", ...
  std::string default_text;
  std::string accepted;     // "integer >= 1", "one of \"gpipe\", \"1f1b\", \"interleaved\""
  std::string doc;
  // Stores the node into the config; returns a problem description, or "" when valid.
  std::function<std::string(const toml::node&, Config&)> apply;
  // An integer key's accepted range (int_key sets it; `accepted` says it in words); 0, 0 for
  // other keys.
  int64_t min = 0, max = 0;
};

// Every key, in reference order.
const std::vector<KeySpec>& schema();
// The [model] section's keys (model_keys.cpp), appended to `keys` in reference order.
void add_model_keys(std::vector<KeySpec>& keys);
// The [data] keys (data_keys.cpp).
void add_data_keys(std::vector<KeySpec>& keys);
// train.optimizer and Muon's [train] keys (optimizer_keys.cpp).
void add_optimizer_keys(std::vector<KeySpec>& keys);
// The sections of schema(), in order of first appearance.
std::vector<std::string> section_names();
// The value as toml++ prints it (the messages the bad-input catalogue holds deck errors to).
std::string repr(const toml::node& n);

}  // namespace meshtrain
