#pragma once
// The error every bad input ends in: a message that names the file (and line, where known),
// the key, the value and what would be accepted. One rank prints it; every rank exits non-zero.

#include <stdexcept>
#include <string>

namespace meshtrain {

class DeckError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace meshtrain
