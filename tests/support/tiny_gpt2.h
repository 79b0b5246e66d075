#pragma once
// Test helper: a GPT-2 byte-level BPE vocabulary small enough to reason about by hand: the 256
// byte tokens (ids 0..255 in byte order, as GPT-2's own vocabulary starts) and a few merges.

#include <string>

#include "meshtrain/io/gpt2_bpe_tokenizer.h"

namespace meshtrain::testing {

// The byte-mapped form of `text` (GPT-2's bytes_to_unicode applied to each byte).
inline std::string gpt2_mapped(const std::string& text) {
  static const std::vector<uint32_t> cps = gpt2_byte_to_codepoint();
  std::string out;
  for (unsigned char b : text) {
    const uint32_t cp = cps[b];
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// Merges, by rank: h e, l l, he ll, hell o, " " w, " w" o, " wo" r, " wor" l, " worl" d.
// Ids 256 upwards in that order; "<|endoftext|>" last.
inline Gpt2BpeFiles tiny_gpt2_files() {
  Gpt2BpeFiles f;
  for (int b = 0; b < 256; ++b)
    f.vocab.emplace_back(gpt2_mapped(std::string(1, static_cast<char>(b))), b);
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"},
      {" w", "o"}, {" wo", "r"}, {" wor", "l"}, {" worl", "d"}};
  uint32_t id = 256;
  for (const auto& [a, b] : merges) {
    f.merges.emplace_back(gpt2_mapped(a), gpt2_mapped(b));
    f.vocab.emplace_back(gpt2_mapped(a + b), id++);
  }
  f.vocab.emplace_back("<|endoftext|>", id);
  return f;
}

}  // namespace meshtrain::testing
