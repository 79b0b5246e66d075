#include "meshtrain/io/prepare.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "meshtrain/io/byte_tokenizer.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/synthetic_corpus.h"
#include "meshtrain/io/token_shard.h"

namespace meshtrain {

namespace {

void check_fraction(double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw std::invalid_argument("prepare: val_fraction = " + std::to_string(val_fraction) +
                                " must lie in [0, 1) (e.g. 0.1; 0: no validation shard)");
  }
}

// The prefix names files, not a directory: "data/" would write "data/_train.bin".
void check_out_prefix(const std::string& out_prefix) {
  std::error_code ec;
  if (out_prefix.empty() || out_prefix.back() == '/' ||
      std::filesystem::is_directory(out_prefix, ec)) {
    throw std::invalid_argument("prepare: --out " + out_prefix +
                                " is a directory; --out takes a file prefix (e.g. --out "
                                "data/mytext writes data/mytext_train.bin and "
                                "data/mytext_val.bin)");
  }
}

std::string read_file(const std::string& path) {
  // A directory opens as a stream on Linux and then fails to read: say what it is instead.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw DataError(path, "is a directory, not a text file (give the files in it, e.g. " +
                              (std::filesystem::path(path) / "*.txt").string() + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, std::string("cannot open text file: ") + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw DataError(path, "error while reading text file");
  if (text.empty()) throw DataError(path, "text file is empty; nothing to tokenize");
  return text;
}

// Appends the head of `text` to train and its last val_fraction to val (rounded to a whole
// token).
void split_into(std::string_view text, double val_fraction, std::vector<uint32_t>& train,
                std::vector<uint32_t>& val) {
  const size_t n_val =
      static_cast<size_t>(std::llround(static_cast<double>(text.size()) * val_fraction));
  const std::vector<uint32_t> tokens = tokenize_bytes(text);
  const size_t n_train = tokens.size() - n_val;
  train.insert(train.end(), tokens.begin(), tokens.begin() + n_train);
  val.insert(val.end(), tokens.begin() + n_train, tokens.end());
}

enum class WithValidation { No, Yes };

PrepareResult write_pair(const std::string& out_prefix, const std::vector<uint32_t>& train,
                         const std::vector<uint32_t>& val, WithValidation with_val) {
  const std::filesystem::path dir = std::filesystem::path(out_prefix).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw DataError(dir.string(), "cannot create output directory: " + ec.message());
  }
  PrepareResult r;
  r.train_path = out_prefix + "_train.bin";
  write_token_shard(r.train_path, train, kByteVocabSize);
  r.train_tokens = static_cast<int64_t>(train.size());
  if (with_val == WithValidation::Yes) {
    r.val_path = out_prefix + "_val.bin";
    write_token_shard(r.val_path, val, kByteVocabSize);
    r.val_tokens = static_cast<int64_t>(val.size());
  }
  return r;
}

}  // namespace

PrepareResult prepare_text_files(const std::vector<std::string>& inputs,
                                 const std::string& out_prefix, double val_fraction) {
  check_fraction(val_fraction);
  check_out_prefix(out_prefix);
  if (inputs.empty()) throw std::invalid_argument("prepare: no input text files given");
  std::vector<uint32_t> train, val;
  for (const std::string& path : inputs) split_into(read_file(path), val_fraction, train, val);
  return write_pair(out_prefix, train, val, val_fraction > 0 ? WithValidation::Yes : WithValidation::No);
}

PrepareResult prepare_synthetic(uint64_t seed, size_t bytes, const std::string& out_prefix,
                                double val_fraction) {
  check_fraction(val_fraction);
  check_out_prefix(out_prefix);
  std::vector<uint32_t> train, val;
  split_into(synthetic_text(seed, bytes), val_fraction, train, val);
  return write_pair(out_prefix, train, val, val_fraction > 0 ? WithValidation::Yes : WithValidation::No);
}

}  // namespace meshtrain
