#include "meshtrain/io/byte_tokenizer.h"

#include <stdexcept>

namespace meshtrain {

std::vector<uint32_t> tokenize_bytes(std::string_view text) {
  std::vector<uint32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string detokenize_bytes(const std::vector<uint32_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= kByteVocabSize) {
      throw std::out_of_range("detokenize_bytes: token " + std::to_string(tokens[i]) +
                              " at position " + std::to_string(i) +
                              " is not a byte (vocabulary 256)");
    }
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

}  // namespace meshtrain
