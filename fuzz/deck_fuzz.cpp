// Fuzzes the deck reader: any text either parses into a Config or is refused with DeckError.
// The first line, when it starts with "#set ", is taken as `--set` overrides (separated by ';'),
// so the override path is fuzzed too.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/deck.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  if (text.rfind("#set ", 0) == 0) {
    const size_t eol = text.find('\n');
    const std::string line = text.substr(5, eol == std::string::npos ? std::string::npos : eol - 5);
    size_t begin = 0;
    while (begin <= line.size()) {
      const size_t end = std::min(line.find(';', begin), line.size());
      overrides.push_back(line.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  try {
    (void)meshtrain::parse_deck("fuzz.toml", text, overrides);
  } catch (const meshtrain::DeckError&) {
  }
  return 0;
}
