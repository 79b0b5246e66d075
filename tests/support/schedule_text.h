#pragma once
// Schedules written as action text in tests, one list per rank: {{"0F0", "0B0"}, {...}}.

#include <initializer_list>

#include "meshtrain/parallel/schedule.h"

namespace meshtrain::testing {

inline Schedule parse_schedule(std::initializer_list<std::initializer_list<const char*>> ranks) {
  Schedule s;
  for (const auto& list : ranks) {
    s.emplace_back();
    for (const char* text : list) s.back().push_back(Action::parse(text));
  }
  return s;
}

}  // namespace meshtrain::testing
