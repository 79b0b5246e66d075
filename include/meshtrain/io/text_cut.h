#pragma once
// Where `prepare` may cut text into pieces that are tokenized apart (chunks for the worker
// threads, the train/validation split) without changing the tokens: at a boundary that no
// pre-token crosses. Not a tokenizer; the rule is written for GPT-2's pre-tokenizer and holds
// for SentencePiece's whitespace handling too.

#include <cstddef>
#include <string_view>

namespace meshtrain {

enum class CutRule {
  Anywhere,      // the byte tokenizer: every byte is its own token
  TextBoundary,  // subword tokenizers: see last_cut()
};

// The largest position p in [min_pos, text.size()) where `text` may be cut before text[p]. For
// TextBoundary, in order of preference: just after a '\n' that has printable ASCII on both
// sides ("word\n|Word"); else before a single space between printable ASCII ("a| b"). With
// GPT-2's regex (' ?\p{L}+', '\s+(?!\S)', ...) neither boundary lies inside a pre-token, so
// the pieces tokenize to what the whole would. When neither exists (a very long line without
// spaces), the start of a UTF-8 character, which may split a word. Anywhere (and nothing
// found at all): text.size().
size_t last_cut(std::string_view text, CutRule rule, size_t min_pos);

}  // namespace meshtrain
