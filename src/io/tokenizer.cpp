#include "meshtrain/io/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshtrain/io/byte_tokenizer.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/gpt2_bpe_tokenizer.h"
#include "meshtrain/io/sentencepiece_tokenizer.h"
#include "gpt2_bpe_reading.h"

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
  std::string signature() const override { return "byte"; }  // what checkpoints always held
  std::string file_suffix() const override { return ""; }
  void save(const std::string&) const override {}
  bool takes_any_bytes() const override { return true; }
};

constexpr const char* kAccepted =
    "expected \"bytes\", a SentencePiece model (*.model), a directory holding GPT-2's vocab.json "
    "and merges.txt, \"VOCAB.json,MERGES.txt\", or a Hugging Face tokenizer.json of a byte-level "
    "BPE";

std::string read_prefix(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

bool starts_like_json(const std::string& head) {
  for (char c : head) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    return c == '{';
  }
  return false;
}

bool is_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return true;  // let the tokenizer.json reader name the syntax error
  return j.is_object() && j.contains("model") && j["model"].is_object();
}

std::unique_ptr<Tokenizer> open_file(const std::string& path) {
  namespace fs = std::filesystem;
  // Before the first open, which would block on a FIFO with no writer.
  require_regular_file(path, "a tokenizer file", "a regular file: a SentencePiece .model, a vocab.json or a tokenizer.json");
  const std::string head = read_prefix(path, 4096);
  if (head.empty()) throw DataError(path, std::string("is empty or unreadable; ") + kAccepted);
  if (starts_like_json(head)) {
    check_json_file_size(path, "a tokenizer.json or vocab.json");  // before parsing it to look
    // A tokenizer.json has a "model" object; a vocab.json is a flat object of token -> id
    // whose merges sit beside it ("model" may well be one of its tokens: look at the value).
    if (is_tokenizer_json(path)) return open_gpt2_bpe_json(path);
    const fs::path merges = fs::path(path).parent_path() / "merges.txt";
    std::error_code ec;
    if (fs::is_regular_file(merges, ec)) return open_gpt2_bpe_files(path, merges.string());
    throw DataError(path, "looks like a vocab.json, but no merges.txt lies beside it; " +
                              std::string(kAccepted));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (auto t = sentencepiece_from_bytes(s.str())) return t;
  throw DataError(path, std::string("is not a tokenizer meshtrain can open; ") + kAccepted);
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& spec) {
  namespace fs = std::filesystem;
  if (spec == "bytes") return make_byte_tokenizer();
  std::error_code ec;
  const size_t comma = spec.find(',');
  if (comma != std::string::npos && !fs::exists(spec, ec))
    return open_gpt2_bpe_files(spec.substr(0, comma), spec.substr(comma + 1));
  if (fs::is_directory(spec, ec)) {
    const fs::path dir(spec);
    if (fs::is_regular_file(dir / "vocab.json", ec) && fs::is_regular_file(dir / "merges.txt", ec))
      return open_gpt2_bpe_files((dir / "vocab.json").string(), (dir / "merges.txt").string());
    if (fs::is_regular_file(dir / "tokenizer.json", ec))
      return open_gpt2_bpe_json((dir / "tokenizer.json").string());
    if (fs::is_regular_file(dir / "tokenizer.model", ec))
      return open_sentencepiece((dir / "tokenizer.model").string());
    throw DataError(spec, "is a directory without vocab.json + merges.txt, tokenizer.json or "
                          "tokenizer.model; " + std::string(kAccepted));
  }
  if (!fs::exists(spec, ec))
    throw DataError(spec, std::string("no such file; ") + kAccepted);
  return open_file(spec);
}

}  // namespace meshtrain
