#include "meshtrain/io/tokenizer.h"

#include "meshtrain/io/byte_tokenizer.h"
#include "meshtrain/io/data_error.h"

namespace meshtrain {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  uint32_t vocab_size() const override { return kByteVocabSize; }
  std::vector<uint32_t> encode(std::string_view text) const override {
    return tokenize_bytes(text);
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    return detokenize_bytes(ids);
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& spec) {
  if (spec == "bytes") return make_byte_tokenizer();
  throw DataError(spec, "is not a tokenizer meshtrain can open (expected \"bytes\")");
}

}  // namespace meshtrain
