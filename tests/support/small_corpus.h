#pragma once
// Test helper: a few hundred KB of word salad over a small vocabulary, with accents, written to
// a file: enough text for SentencePiece to train a vocabulary of a few hundred pieces.

#include <fstream>
#include <string>

namespace meshtrain::testing {

inline std::string small_corpus(int lines = 4000) {
  static const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
                                "café", "naïve", "data", "model", "train", "token", "piece",
                                "sentence", "alpha", "beta", "gamma", "delta", "2024", "42"};
  std::string text;
  uint64_t x = 88172645463325252ull;  // xorshift: the same text on every machine
  for (int i = 0; i < lines; ++i) {
    for (int w = 0; w < 10; ++w) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      text += std::string(w ? " " : "") + words[x % (sizeof words / sizeof *words)];
    }
    text += "\n";
  }
  return text;
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace meshtrain::testing
