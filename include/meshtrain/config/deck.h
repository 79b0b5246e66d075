#pragma once
// Reading an input deck: TOML text + `--set section.key=value` overrides -> Config.
// Refuses unknown sections and keys (with the nearest known key as a hint), wrong types and
// out-of-range values, each with "file:line: section.key = value: problem (accepted)".
// Checks that need the world size (the layout) are in layout_check.h.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/config/deck_error.h"

namespace meshtrain {

// Reads the file; throws DeckError naming it if it cannot be read.
std::string read_deck_file(const std::string& path);

// Parses deck text (path is used in messages) and applies overrides ("model.layers=8").
Config parse_deck(const std::string& path, const std::string& text,
                  const std::vector<std::string>& overrides = {});

// The values the integer deck key `section`.`key` accepts (model.layers: 1 to 100000, capped by
// what its Config field holds), for readers of other files that fill the same field (import's
// config.json): one range per key, the schema's. Throws std::invalid_argument for a key that is
// not an integer key.
struct IntegerRange {
  int64_t min, max;
};
IntegerRange deck_integer_range(const std::string& section, const std::string& key);

// The deck reference as Markdown: one table per section (key, type, default, accepted, meaning).
std::string deck_reference_markdown();

}  // namespace meshtrain
