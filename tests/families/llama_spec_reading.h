#pragma once
// How the Llama-format tests (hf_llama_test.cpp, hf_moe_test.cpp) read a config.json: as the
// llama and qwen3 families' HfFormat does, each size in its deck key's range.

#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/app/hf_directory.h"
#include "meshtrain/families/llama/hf_llama.h"

namespace meshtrain {

inline ModelSpec read_spec(const nlohmann::json& j, int64_t seq_len, int64_t& max_positions) {
  return hf_llama_spec(HfConfigReader(j, "config.json", deck_key_range), seq_len, max_positions);
}

// The spec of `j` for a 32-position deck.
inline ModelSpec spec_of(const nlohmann::json& j) {
  int64_t max_positions = 0;
  return read_spec(j, 32, max_positions);
}

// Why `j` is refused; "" when it is read.
inline std::string refusal(const nlohmann::json& j) {
  try {
    spec_of(j);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace meshtrain
