#pragma once
// A tokenizer as the rest of meshtrain sees it: text to token ids and back, and the size of the
// vocabulary it produces. `prepare` encodes with one, `sample` and `train.sample_every` decode
// with the one the run names (data.tokenizer). The kinds are implemented in their own files;
// this file is the interface and the one place that opens a tokenizer from its name.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "bytes", "sentencepiece" or "gpt2-bpe": what `inspect` and the logs print.
  virtual std::string kind() const = 0;
  // Every id encode() returns is below this; a model needs model.vocab_size >= it.
  virtual uint32_t vocab_size() const = 0;
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  // Ids at or above vocab_size() are std::out_of_range naming the first one. Pieces that are
  // not whole UTF-8 on their own (a byte token) come out as the bytes they stand for.
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
};

// The byte-level tokenizer of io/byte_tokenizer.h behind this interface.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Opens the tokenizer `spec` names, as data.tokenizer and --tokenizer take it: "bytes", or the
// path of a tokenizer file. Throws DataError naming the path and what would be accepted.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& spec);

}  // namespace meshtrain
