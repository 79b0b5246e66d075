#pragma once
// Where Hugging Face's AddedVocabulary finds added tokens in a text (tokenizers'
// added_vocabulary.rs, find_matches; private to src/io: the GPT-2 BPE tokenizer's). One finder
// holds the tokens of one pass: HF looks for the tokens with normalized = false in the text as
// given, then for those with normalized = true in each normalized piece between them.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "meshtrain/io/gpt2_bpe_tokenizer.h"

namespace meshtrain {

class AddedTokenFinder {
 public:
  // The tokens among `tokens` whose `normalized` flag is `normalized`.
  AddedTokenFinder(const std::vector<AddedToken>& tokens, bool normalized);

  struct Piece {
    std::string_view text;
    std::optional<uint32_t> id;  // an added token's; none: text to tokenize
  };
  // `text` cut into the added tokens found and the text between them (no empty pieces). Matches
  // are leftmost, then longest, and do not overlap; a special token found is left as text (HF's
  // split_special_tokens) but what it covers is not searched again, as in HF.
  std::vector<Piece> split(std::string_view text) const;
  // Whether split() can find anything (some token of this pass is not special).
  bool finds_any() const { return finds_any_; }

 private:
  const AddedToken* longest_at(std::string_view text, size_t at) const;

  std::vector<AddedToken> by_first_byte_[256];  // longest first
  bool finds_any_ = false;
};

}  // namespace meshtrain
