#include "meshtrain/io/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/utf8_text.h"

// Not in the installed headers, exported by libsentencepiece: its INFO lines (hundreds per
// training) would bury prepare's own output.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

namespace meshtrain {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
      : sp_(std::move(sp)) {}

  std::string kind() const override { return "sentencepiece"; }
  uint32_t vocab_size() const override { return static_cast<uint32_t>(sp_->GetPieceSize()); }
  std::string file_suffix() const override { return ".model"; }
  std::optional<uint32_t> end_of_text() const override {
    const int eos = sp_->eos_id();  // -1: the model has none
    if (eos < 0) return std::nullopt;
    return static_cast<uint32_t>(eos);
  }

  // SentencePieceProcessor::Encode is const and keeps no state between calls: callable from
  // many threads at once.
  // Line by line: SentencePiece models text as sentences (it trains on lines, and its
  // normalizer folds a newline into a space), and its encoder slows down on MiB-long inputs.
  std::vector<uint32_t> encode(std::string_view text) const override {
    std::vector<uint32_t> out;
    std::vector<int> ids;
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      end = end == std::string_view::npos ? text.size() : end + 1;
      const auto status = sp_->Encode(absl::string_view(text.data() + at, end - at), &ids);
      if (!status.ok()) throw std::runtime_error("sentencepiece: encode: " + status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
      at = end;
    }
    return out;
  }

  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= vocab_size())
        throw std::out_of_range("sentencepiece: token " + std::to_string(ids[i]) +
                                " at position " + std::to_string(i) +
                                " is not in the vocabulary (size " +
                                std::to_string(vocab_size()) + ")");
      v.push_back(static_cast<int>(ids[i]));
    }
    std::string out;
    const auto status = sp_->Decode(v, &out);
    if (!status.ok()) throw std::runtime_error("sentencepiece: decode: " + status.ToString());
    return out;
  }

  void save(const std::string& path) const override {
    const std::string bytes = sp_->serialized_model_proto();
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw DataError(path, "cannot write the tokenizer file");
  }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

std::string list_inputs(const std::vector<std::string>& inputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size() && i < 3; ++i) s += (i ? ", " : "") + inputs[i];
  if (inputs.size() > 3) s += " and " + std::to_string(inputs.size() - 3) + " more";
  return s;
}

// The training lines, file after file. A line that breaks the UTF-8 rule ends the iteration
// with the DataError kept for the caller (SentencePiece's status has no room for it).
class LineReader final : public sentencepiece::SentenceIterator {
 public:
  explicit LineReader(const std::vector<std::string>& inputs) : inputs_(inputs) { Next(); }
  bool done() const override { return done_; }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    if (error_) return sentencepiece::util::Status(sentencepiece::util::StatusCode::kInvalidArgument,
                                                   "input text refused");
    return sentencepiece::util::Status();
  }
  void Next() override {
    while (!done_) {
      if (in_.is_open() && std::getline(in_, line_)) {
        const size_t bad = first_non_text_byte(line_);
        if (bad < line_.size()) {
          error_ = std::make_exception_ptr(DataError(
              inputs_[file_ - 1], describe_non_text_byte(line_, bad) + " at byte offset " +
                                      std::to_string(offset_ + bad) +
                                      ": subword tokenizers take UTF-8 text without NUL bytes "
                                      "(--tokenizer bytes takes any bytes)"));
          done_ = true;
          return;
        }
        offset_ += line_.size() + 1;
        return;
      }
      if (in_.is_open()) in_.close();
      if (file_ == inputs_.size()) {
        done_ = true;
        return;
      }
      in_.open(inputs_[file_++], std::ios::binary);
      offset_ = 0;
      if (!in_) {
        error_ = std::make_exception_ptr(DataError(inputs_[file_ - 1], "cannot open text file"));
        done_ = true;
      }
    }
  }
  std::exception_ptr error() const { return error_; }

 private:
  const std::vector<std::string>& inputs_;
  size_t file_ = 0;
  uint64_t offset_ = 0;
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

std::unique_ptr<Tokenizer> sentencepiece_from_bytes(const std::string& bytes) {
  sentencepiece::logging::SetMinLogLevel(1);
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  if (!sp->LoadFromSerializedProto(bytes).ok() || sp->GetPieceSize() <= 0) return nullptr;
  return std::make_unique<SentencePieceTokenizer>(std::move(sp));
}

std::unique_ptr<Tokenizer> open_sentencepiece(const std::string& path) {
  std::string bytes;
  if (const std::string problem = read_regular_file(path, bytes); !problem.empty())
    throw DataError(path, problem + "; expected a SentencePiece model (a serialized ModelProto, *.model)");
  auto t = sentencepiece_from_bytes(bytes);
  if (!t) throw DataError(path, "is not a SentencePiece model (a serialized ModelProto, *.model)");
  return t;
}

std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& inputs,
                                               SubwordModel model, uint32_t vocab_size,
                                               int threads) {
  sentencepiece::logging::SetMinLogLevel(1);
  const std::string kind = model == SubwordModel::Bpe ? "bpe" : "unigram";
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", kind},
      {"vocab_size", std::to_string(vocab_size)},
      {"input_sentence_size", std::to_string(kMaxTrainingSentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"split_digits", "true"},
      {"model_prefix", ""},
  };
  LineReader lines(inputs);
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &proto);
  if (lines.error()) std::rethrow_exception(lines.error());
  if (!status.ok())
    throw DataError(list_inputs(inputs),
                    "cannot train a " + kind + " tokenizer of " + std::to_string(vocab_size) +
                        " pieces: " + status.error_message() +
                        " (a vocabulary needs at least 256 byte pieces + 3 specials + the "
                        "characters of the text, and no more pieces than the text holds: give "
                        "more text or another size, e.g. " + kind + ":8000)");
  auto t = sentencepiece_from_bytes(proto);
  if (!t) throw std::logic_error("sentencepiece: a model it trained does not load");
  return t;
}

}  // namespace meshtrain
