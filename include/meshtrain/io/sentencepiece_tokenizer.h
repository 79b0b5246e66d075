#pragma once
// SentencePiece (Kudo & Richardson 2018) behind the Tokenizer interface: loading a .model file
// (the LLaMA-family format) and training a BPE or unigram model on the user's text. The model
// is kept as its serialized proto, so save() writes back exactly what was loaded or trained.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/io/tokenizer.h"

namespace meshtrain {

// Throws DataError naming the path when the file is not a SentencePiece model.
std::unique_ptr<Tokenizer> open_sentencepiece(const std::string& path);
// Null when `bytes` is not a serialized SentencePiece model (how open_tokenizer tells).
std::unique_ptr<Tokenizer> sentencepiece_from_bytes(const std::string& bytes);

enum class SubwordModel { Bpe, Unigram };

// Trains a model of exactly `vocab_size` pieces on the lines of `inputs`, with `threads`
// threads. Memory is bounded: at most kMaxTrainingSentences lines (a uniform sample when the
// text holds more) are loaded. Byte fallback is on, so any UTF-8 text encodes without <unk>.
// Lines must keep the UTF-8 rule (io/utf8_text.h); a vocabulary the text cannot fill, or one
// too small for its characters, is a DataError naming the inputs and the size that would work.
std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& inputs,
                                               SubwordModel model, uint32_t vocab_size,
                                               int threads);
inline constexpr int64_t kMaxTrainingSentences = 1000000;

}  // namespace meshtrain
