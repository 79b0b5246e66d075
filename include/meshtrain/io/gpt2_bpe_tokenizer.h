#pragma once
// GPT-2's byte-level BPE (Radford et al. 2019; the published encoder.py): text is split into
// pre-tokens by GPT-2's regex (Unicode letter / number classes, via PCRE2 in UTF + UCP mode),
// each pre-token's bytes are mapped to printable characters (bytes_to_unicode), then pairs are
// merged lowest rank first. Any byte sequence is encodable; special tokens ("<|endoftext|>")
// are never produced from text (as tiktoken's encode_ordinary). Loading and saving the files
// is here too; telling a file's kind from its content is io/tokenizer.cpp.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/io/tokenizer.h"

namespace meshtrain {

// A tokenizer.json added token. Special ones (<|endoftext|>) are never found in text (as HF's
// encode with split_special_tokens, tiktoken's encode_ordinary); the others (Qwen 3's <think>)
// are, as HF's AddedVocabulary finds them: leftmost, then longest, before the BPE.
struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = true;
  bool single_word = false;  // only where no word character (regex \w) touches it on either side
  bool lstrip = false;       // takes the whitespace before it
  bool rstrip = false;       // takes the whitespace after it
  bool normalized = false;   // found in the normalized text (else in the text as given)
};

class TextNormalizer;

struct Gpt2BpeFiles {
  std::vector<std::pair<std::string, uint32_t>> vocab;  // token (byte-mapped form) -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  // Added tokens; those not in the vocabulary are decoded verbatim.
  std::vector<AddedToken> added;
  // The pre-tokenizer regex; empty: GPT-2's. A tokenizer.json whose pre-tokenizer is a Split by
  // regex followed by ByteLevel (LLaMA 3, Qwen 2) brings its own.
  std::string pattern;
  // ByteLevel's add_prefix_space: a space before a text (each piece between added tokens) that
  // does not start with one.
  bool add_prefix_space = false;
  // tokenizer.json model.ignore_merges (LLaMA 3): a pre-token that is itself in the
  // vocabulary is that token, whatever the merges would make of it.
  bool ignore_merges = false;
  // The token HF's post-processor puts before every encoded text (Llama 3's
  // <|begin_of_text|>: a TemplateProcessing whose single template is [that token, $A]); none for
  // GPT-2 and Qwen, whose post-processor adds nothing.
  std::optional<uint32_t> begin_of_text;
  // tokenizer.json's normalizer (Qwen 2's NFC), applied before everything else; none: null.
  std::shared_ptr<const TextNormalizer> normalizer;
};

// Builds the tokenizer. `where` names the source in DataErrors: a byte missing from the
// vocabulary, a merge whose parts or result are not tokens, two tokens with one id or one
// content, an id at or above twice the number of tokens (vocabulary and added tokens together:
// ids may leave gaps, not a gap that would take gigabytes to hold).
std::unique_ptr<Tokenizer> make_gpt2_bpe_tokenizer(const Gpt2BpeFiles& files,
                                                   const std::string& where);

// vocab.json + merges.txt (the openai/gpt-2 and Hugging Face "slow" files).
std::unique_ptr<Tokenizer> open_gpt2_bpe_files(const std::string& vocab_json,
                                               const std::string& merges_txt);
// A Hugging Face tokenizer.json whose model is BPE and whose pre-tokenizer is ByteLevel, or a
// Sequence of a Split by regex (behavior Isolated) and ByteLevel without its own regex (what
// save() writes too). Every field is applied as HF's tokenizers library applies it or refused
// by name (io/hf_tokenizer_json.cpp).
std::unique_ptr<Tokenizer> open_gpt2_bpe_json(const std::string& tokenizer_json);

// The GPT-2 byte -> character map (bytes_to_unicode): printable bytes map to themselves, the
// others to U+0100 upwards in byte order. Index = byte, value = code point.
std::vector<uint32_t> gpt2_byte_to_codepoint();

}  // namespace meshtrain
