#pragma once
// A tokenizer as the rest of meshtrain sees it: text to token ids and back, and the size of the
// vocabulary it produces. `prepare` encodes with one, `sample` and `train.sample_every` decode
// with the one the run names (data.tokenizer). The kinds are implemented in their own files;
// this file is the interface and the one place that opens a tokenizer from its name.

#include <cstdint>
#include <memory>
#include <optional>
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
  // Safe to call from many threads at once. Text that breaks the input rule (see
  // takes_any_bytes) may be std::invalid_argument; `prepare` checks the rule first and names
  // the file and offset.
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  // Ids at or above vocab_size() are std::out_of_range naming the first one. Pieces that are
  // not whole UTF-8 on their own (a byte token) come out as the bytes they stand for.
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;

  // What a checkpoint records as model.tokenizer: "byte" for the byte tokenizer (the string
  // checkpoints have always held), else "<kind>:<vocab_size>". Never a path: a tokenizer file
  // that moved must not stop a resume.
  virtual std::string signature() const { return kind() + ":" + std::to_string(vocab_size()); }
  // The suffix of the self-contained file save() writes, which open_tokenizer() reads back:
  // ".model" (SentencePiece), ".json" (GPT-2 BPE); "" when there is nothing to save (bytes).
  virtual std::string file_suffix() const = 0;
  virtual void save(const std::string& path) const = 0;
  // The input rule: the byte tokenizer takes any bytes; the subword tokenizers take UTF-8 text
  // without NUL bytes (anything else is a DataError naming the file and the byte offset).
  virtual bool takes_any_bytes() const { return false; }
  // Whether text cut where io/text_cut.h's last_cut() says, and encoded piece by piece, gives
  // what encoding it whole does. Not so where the tokenizer looks at a text's ends (a
  // tokenizer.json normalizer that strips or prepends, ByteLevel's add_prefix_space) or at
  // matches that may span a cut (Replace): `prepare` then takes such text only as whole
  // documents (JSON Lines).
  virtual bool encodes_pieces_alike() const { return true; }
  // The token a prompt starts with, as Hugging Face's tokenizer adds it (Llama 3's
  // <|begin_of_text|>); none where the tokenizer adds none.
  virtual std::optional<uint32_t> begin_of_text() const { return std::nullopt; }
  // Whether decode takes the id: a model's vocabulary may be padded past its tokenizer's (GPT-2's
  // 50257 to 50304, Qwen 3's 151669 to 151936), and a tokenizer.json may leave ids unused.
  virtual bool has_token(uint32_t id) const { return id < vocab_size(); }
  // The token that ends a document in packed training data (data.document_mask): GPT-2's and
  // Qwen's "<|endoftext|>", Llama 3's "<|end_of_text|>", a SentencePiece model's end-of-sentence
  // piece; none for the byte tokenizer.
  virtual std::optional<uint32_t> end_of_text() const { return std::nullopt; }
};

// The byte-level tokenizer of io/byte_tokenizer.h behind this interface.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Opens the tokenizer `spec` names, as data.tokenizer and --tokenizer take it: "bytes"; a
// SentencePiece model (*.model); a GPT-2 byte-level BPE as a directory holding vocab.json and
// merges.txt, as "VOCAB.json,MERGES.txt", or as a Hugging Face tokenizer.json. Files are told
// apart by their content, not their names. Throws DataError naming the path and what would be
// accepted.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& spec);

}  // namespace meshtrain
