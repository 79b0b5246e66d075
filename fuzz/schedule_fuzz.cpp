// Fuzzes Action::parse: any text either parses or throws std::invalid_argument, and what parses
// prints back to text that parses to the same action.

#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "meshtrain/parallel/schedule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  meshtrain::Action a;
  try {
    a = meshtrain::Action::parse(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  if (!(meshtrain::Action::parse(a.to_string()) == a)) __builtin_trap();
  return 0;
}
