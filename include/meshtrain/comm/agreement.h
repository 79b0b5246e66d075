#pragma once
// Every rank reaches the same verdict. Work that can fail on some ranks only (a file missing on
// one node, memory exhausted on one GPU) runs inside agree(); if it failed anywhere, every rank
// throws the same error — the lowest failing rank's message, saying which rank it was — instead
// of the healthy ranks waiting forever in the next collective.

#include <functional>
#include <stdexcept>
#include <string>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

class AgreedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The lowest failing rank ran out of memory (std::bad_alloc): callers add their advice.
class AgreedOutOfMemory : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// Runs f(); collective over `group` whether or not f() throws.
void agree(Communicator& group, const std::function<void()>& f);

}  // namespace meshtrain
