#include "meshtrain/train/document_starts.h"

#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/tokenizer.h"

namespace meshtrain {

void document_starts(const int32_t* tokens, int64_t T, int32_t end_of_text, int32_t* starts) {
  int32_t start = 0;
  for (int64_t i = 0; i < T; ++i) {
    starts[i] = start;
    if (tokens[i] == end_of_text) start = static_cast<int32_t>(i + 1);
  }
}

int32_t document_end_token(const std::string& deck_path, const std::string& spec) {
  const std::unique_ptr<Tokenizer> tokenizer =
      spec == "bytes" ? make_byte_tokenizer() : open_tokenizer(spec);
  const std::optional<uint32_t> eot = tokenizer->end_of_text();
  if (!eot)
    throw DeckError(deck_path + ": data.document_mask = true needs an end-of-text token to cut "
                    "packed sequences into documents, but data.tokenizer = \"" + spec + "\" (" +
                    tokenizer->kind() + ") has none (use a tokenizer that has one: GPT-2's, "
                    "Llama 3's or Qwen's tokenizer.json, a SentencePiece model with an "
                    "end-of-sentence piece; or set data.document_mask = false)");
  return static_cast<int32_t>(*eot);
}

}  // namespace meshtrain
