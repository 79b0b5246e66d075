#pragma once
// Document masking (data.document_mask = true): where each token's document starts in a packed
// training sequence, the data Backend::attention_forward takes to attend block-causally (a
// token sees only the earlier tokens of its own document, as Llama 3 was trained: arXiv
// 2407.21783 section 3.2).
//
// Documents are separated by the tokenizer's end-of-text token, which belongs to the document
// it ends (Hugging Face's convention for packed rows: the token after it starts a new one). So
// the start of position i is one past the last end-of-text token before i, or 0.
//
// Positions are not restarted: a token keeps its position in the packed sequence (Hugging
// Face's default position_ids, arange, when none are given). With rotary positions attention
// within a document depends only on position differences, so this equals restarting at each
// document up to rounding; with learned positions (GPT-2) a document that does not open its
// sequence sees wpe rows past 0, as GPT-2 itself saw text that did not open its window.

#include <cstdint>
#include <optional>
#include <string>

namespace meshtrain {

class Tokenizer;

// starts[i] for the T input tokens of one sequence, each the position in that sequence (0 ..
// T - 1) where its document starts.
void document_starts(const int32_t* tokens, int64_t T, int32_t end_of_text, int32_t* starts);

// The end-of-text token id of data.tokenizer = `spec` for data.document_mask, opening the
// tokenizer; a DeckError naming the deck, the key and the tokenizer when it has none (the byte
// tokenizer never has one).
int32_t document_end_token(const std::string& deck_path, const std::string& spec);

}  // namespace meshtrain
