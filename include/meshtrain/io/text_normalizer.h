#pragma once
// A Hugging Face tokenizer.json "normalizer", applied as the tokenizers library applies it
// (tokenizers/src/normalizers): NFC, NFD, NFKC, NFKD (ICU), Lowercase (each character's full
// lowercase mapping, Rust's char::to_lowercase: no context, so a final capital sigma is 'σ'),
// Strip (Unicode White_Space at either end), Replace (a string or a regex, every
// non-overlapping match from the left, the content taken literally), Prepend (only to non-empty
// text) and Sequence of these. Any other type (BertNormalizer, StripAccents, Precompiled, Nmt,
// ByteLevel) is refused by name. Not the tokenizer: io/gpt2_bpe_tokenizer.cpp applies it first.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace meshtrain {

class TextNormalizer {
 public:
  // Reads `spec` (the value of tokenizer.json's "normalizer"; not null). DataError naming
  // `file`, the JSON path below `json_path` ("normalizer.normalizers[1].type"), the value and
  // what is accepted, for a type meshtrain does not apply or a field of the wrong type.
  TextNormalizer(const nlohmann::json& spec, const std::string& file,
                 const std::string& json_path = "normalizer");
  ~TextNormalizer();
  TextNormalizer(const TextNormalizer&) = delete;
  TextNormalizer& operator=(const TextNormalizer&) = delete;

  // `text` must be UTF-8 (the tokenizer checks first). Safe to call from many threads at once.
  std::string apply(std::string_view text) const;
  // Whether a step looks at the text as a whole (Strip, Prepend: its ends; Replace: a match
  // may span the places where `prepare` cuts a text file into pieces). The Unicode forms and
  // Lowercase map one character at a time and keep ASCII, so pieces normalize as the whole.
  bool needs_whole_text() const { return needs_whole_text_; }
  // The spec as read, for save().
  const std::string& json_text() const { return json_text_; }

  struct Step;

 private:
  std::vector<std::unique_ptr<Step>> steps_;  // a Sequence, flattened
  bool needs_whole_text_ = false;
  std::string json_text_;
};

}  // namespace meshtrain
